"""Dynamic policy grouping: prompts fall into policy groups (task, data source, difficulty, or k-means clusters), each
with statistics and a weight that shape the advantages and which prompts are generated for; groups are refined,
merged and split as training goes, optionally through the stages warm-up, competition and fusion.

A *policy group* is a set of prompts; it is not GRPO's *generation group* (the `num_generations` completions of one
prompt). Settings: `GRPOConfig.policy_group_*`, `advantage_baseline`; off unless a group source is set.

* `config`: the settings (`PolicyGroupFields`, `GRPOConfig`'s fields for grouping and its stages), their ranges and
  the rules between them (`POLICY_GROUP_CONFIG`); `policy_grouping_requested`, `stages_requested`.
* `assignment`: prompts to groups at the start (column, function, k-means over TF-IDF or embedding features).
* `regrouping`: refining into sub-clusters, planning and applying merges and splits.
* `statistics`: per-prompt and per-group reward statistics, moving averages, learning progress.
* `weights`: the weight rules (`learnability`, `progress`, `deficit`).
* `sampling`: which groups a generation batch draws its prompts from.
* `advantages`: the `policy_group` baseline and the loss weights applied to the advantages.
* `stages`: the training stages (warm-up, competition, fusion) and when a run moves from one to the next.
* `state`: `PolicyGroupState`, all of the above for one run, identical on every process, checkpointed.
* `feature`: the trainer wiring (`PolicyGroups`), which announces each regroup to the other features.
"""
