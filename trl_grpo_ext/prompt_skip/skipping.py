"""The keep probability of a prompt before generation, and the online adaptation of its base (pure functions).

After GRESO (Zheng et al. 2025, arXiv:2506.02177, Sec. 4, "probabilistic pre-rollout filtering"): a prompt whose
last z visits were all uninformative is kept (generated for) with probability p^z, p the base keep probability; a
prompt with an informative last visit, or never seen, is always kept. p is adapted once per generation batch by a
fixed step towards a target share of uninformative generation groups: lowered (more skipping) while the observed
share is above the target, raised while below. A floor on the keep probability makes every skipped prompt come back
now and then, as it may have become informative again.

Solved and failing prompts are told apart by the reward all their completions got: a prompt is *solved* when that
reward is the best one seen in the run, else *failing*. A failing prompt may still be learnable (at the start most
completions of a hard but learnable prompt fail together), so its first `grace` uninformative visits do not count:
it is skipped on the streak z − grace. Ours, not GRESO's: GRESO treats both alike.
"""

import torch


def keep_probability(streak: torch.Tensor, base: float, floor: float) -> torch.Tensor:
    """max(base^z, floor) for streaks `streak` (any shape, integer): 1 for z = 0."""
    return torch.clamp(torch.pow(torch.as_tensor(base, dtype=torch.float64), streak.double()), min=floor).where(
        streak > 0, torch.ones((), dtype=torch.float64)
    )


def skip_streak(streak: torch.Tensor, value: torch.Tensor, best: float, grace: int, tol: float = 1e-6):
    """The streak the keep probability uses, (any shape, int64): `streak` for solved prompts (`value`, the reward
    of their last uninformative visit, within `tol` of `best`, the best reward seen), max(streak − `grace`, 0) for
    failing ones (a NaN value, no uninformative visit, is failing)."""
    streak = streak.long()
    solved = value.double() >= best - tol
    return torch.where(solved, streak, (streak - grace).clamp(min=0))


def adapt_base(base: float, observed: float, target: float, step: float, low: float, high: float = 1.0) -> float:
    """The base keep probability after a generation batch whose share of uninformative generation groups was
    `observed` (NaN: nothing was measured, no change): base − step if above `target`, base + step if below, within
    [`low`, `high`]."""
    if observed != observed:
        return base
    if observed > target:
        base -= step
    elif observed < target:
        base += step
    return min(max(base, low), high)
