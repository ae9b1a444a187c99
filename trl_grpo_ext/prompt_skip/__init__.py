"""Prompt skipping: generate only where there is something to learn. A prompt whose recent generation groups were
uninformative (every completion got the same reward, so every advantage is zero) is skipped before generation with a
probability that grows with its streak, adapted online towards a target share of uninformative generation groups
(after GRESO, Zheng et al. 2025, arXiv:2506.02177). Off unless `GRPOConfig.prompt_skip` is set.

* `history`: `PromptHistory`, a few bytes per prompt: when it was last generated for, its streak of uninformative
  visits, the reward they all got and their completion length.
* `skipping`: the keep probability of a prompt and the online adaptation of its base (pure functions).
* `state`: `PromptSkipState`, the history, the adapted base, the uniform prompt order and the totals, identical on
  every process, checkpointed.
* `feature`: the trainer wiring (`PromptSkip`): the filter the generation batch is drawn through (also inside each
  policy group's draw), the draw without policy groups, the observations and the metrics.
"""
