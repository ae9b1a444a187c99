"""Dynamic policy grouping: prompts fall into policy groups (task, data source, difficulty, or k-means clusters); each
group gets a learnability score from what its completions showed, and a generation batch draws its prompts in
proportion to their group's score; groups can be merged and split as training goes, optionally through the stages
warm-up, competition and fusion.

A *policy group* is a set of prompts; it is not GRPO's *generation group* (the `num_generations` completions of one
prompt). Settings: `GRPOConfig.policy_group_*`; off unless a group source is set.

* `config`: the settings (`PolicyGroupFields`, `GRPOConfig`'s fields for grouping and its stages), their ranges and
  the rules between them (`POLICY_GROUP_CONFIG`); `policy_grouping_requested`, `stages_requested`.
* `assignment`: prompts to groups at the start (column, function, k-means over TF-IDF or embedding features).
* `score`: the learnability score, the draw it gives, the loss weights.
* `regrouping`: planning and applying merges and splits.
* `stages`: the training stages (warm-up, competition, fusion) and when a run moves from one to the next.
* `state`: `PolicyGroupState`, the statistics, the draw and the stages of one run, identical on every process,
  checkpointed.
* `feature`: the trainer wiring (`PolicyGroups`), which announces each regroup to the other features.
"""
