"""Prompt skipping: generate only where there is something to learn. A prompt whose recent generation groups were
uninformative (every completion got the same reward, so every advantage is zero) is skipped before generation with a
probability that grows with its streak, adapted online towards a target share of uninformative generation groups (after
GRESO, Zheng et al. 2025, arXiv:2506.02177); with policy groups, a prompt never generated for is predicted from its
group, and a group never informative is skipped on its whole evidence. A skipped prompt is not replaced, and TRL's loss
is normalized as if its completions were there with zero advantage. Off unless `GRPOConfig.prompt_skip` is set.

* `config`: the settings (`PromptSkipFields`, `GRPOConfig`'s `prompt_skip*` fields), their ranges and the rules
  between them and with TRL's (`PROMPT_SKIP_CONFIG`).
* `history`: `PromptHistory`, a few bytes per prompt: when it was last generated for, its streak of uninformative
  visits, the reward they all got and their completion length.
* `skipping`: the keep probability of a prompt, the online adaptation of its base, the first-visit and
  failing-group predictions from the policy group, and the generation batch's layout after skipping (pure functions).
* `normalizer`: what TRL's loss needs, per loss type, to count the skipped completions (pure functions).
* `state`: `PromptSkipState`, the history, the adapted base, the uniform prompt order and the totals, identical on
  every process, checkpointed.
* `feature`: the trainer wiring (`PromptSkip`): the skipped prompts taken out of the drawn batch, the loss's
  correction, (with `prompt_skip_refill`) the filter the batch is drawn through, the observations and the metrics.
"""
