"""Policy-group weights (pure functions on tensors): the `learnability`, `progress` and `deficit` rules and their
normalisation. Shapes: K policy groups.

Formulas:
    - `progress` rule (the design's α_i ← α_i·(1 + η·ΔR_i)): ΔR_i = (R_i(t) − R_i(t−w)) − mean_j of the same, R the
      EMA reward of a group, w the update window; then clip to [w_min, w_max] and renormalise to mean 1 over groups
      (`normalize_weights`).
    - `deficit` rule: α_i ← α_i·(1 + η·(R̄ − R_i)), R̄ the mean EMA reward over groups.
    - `learnability` rule (the default): α_i = (d_i + 0.05)·s_i, renormalised as above. d_i = 1 − (R_i − R_min) /
      (R_max − R_min), the group's reward deficit over the range of group rewards (1 for the lowest, 0 for the highest;
      1 for every group while they are all equal). s_i = 0.2 for a group that looks like noise: warm (two progress
      half-lives of completions seen), its learning progress z-score since its start below 2
      (`statistics.progress_z`: absolute learning progress, Portelas et al. 2020, arXiv:1910.07224), yet more than
      half of its prompts still give GRPO a signal (completions that disagree), which is what a coin-flip reward does
      and a learnable group at 0% or 100% does not; else s_i = 1. A group at 0% success that starts to move keeps its
      full deficit weight.
      With `policy_group_deficit_z` = z > 0 the range is floored by the noise of the rewards it is measured from:
      d_i = 1 − (R_i − R_min) / max(R_max − R_min, z·SE), SE = √(SE_max² + SE_min²) the standard error of the
      difference of the highest and the lowest group's recent reward (the standard error of a difference of two
      independent means), each SE² = v·Σw² for an EMA with completion weights w of rewards of variance v. Groups
      within noise of each other then get weights near 1 alike, and a weight moves only as far as the groups'
      difference, against its standard error, supports, not across the whole 0-to-1 deficit range with the noise
      of groups alike in reward (the floor's origin: issue #31).
"""

import torch


def normalize_weights(weights: torch.Tensor, w_min: float, w_max: float, active: torch.Tensor) -> torch.Tensor:
    """Weights (K,) clipped to [w_min, w_max] and rescaled to mean 1 over `active` groups (inactive ones get 0).

    Clipping and rescaling alternate until both hold (a few rounds; w_min <= 1 <= w_max makes this converge).
    """
    w = torch.where(active, weights, torch.zeros_like(weights))
    for _ in range(50):
        w = torch.where(active, w.clamp(w_min, w_max), w)
        w = w * active.sum() / w.sum()
        if bool(((w[active] >= w_min - 1e-9) & (w[active] <= w_max + 1e-9)).all()):
            break
    return w


def progress_weights(weights, reward_change, *, eta: float, w_min: float, w_max: float, active) -> torch.Tensor:
    """The `progress` rule: α_i ← α_i·(1 + η·ΔR_i) with ΔR_i = change_i − mean change over active groups, then
    `normalize_weights`. All tensors (K,)."""
    delta = reward_change - reward_change[active].mean()
    return normalize_weights(weights * (1 + eta * delta), w_min, w_max, active)


def deficit_weights(weights, reward, *, eta: float, w_min: float, w_max: float, active) -> torch.Tensor:
    """The `deficit` rule: α_i ← α_i·(1 + η·(R̄ − R_i)), R̄ the mean over active groups, then `normalize_weights`."""
    return normalize_weights(weights * (1 + eta * (reward[active].mean() - reward)), w_min, w_max, active)


# The `learnability` rule's constants, chosen on the task family of benchmarks/policy_groups/policy_groups_learning.py
# (issue #11).
PROGRESS_Z = 2.0  # a learning-progress z-score below this is "no progress"


NOISE_SCALE = 0.2  # s_i of a group that looks like noise


NOISE_INFORMATIVE = 0.5  # ... and has more than this share of prompts whose completions disagree


DEFICIT_FLOOR = 0.05  # added to the deficit, so the best group keeps a weight


def learnability_weights(reward, noise_like, *, w_min: float, w_max: float, active, spread_floor=0.0) -> torch.Tensor:
    """The `learnability` rule, α_i = (d_i + 0.05)·s_i (see the module docstring), clipped to [w_min, w_max] and
    renormalised to mean 1 over the `active` groups. `reward` (K,) EMA rewards, `noise_like` (K,) bool. Memoryless:
    the weights follow the current rewards, not the previous weights. Returns (K,).

    `spread_floor` (reward units, `policy_group_deficit_z` × the standard error of R_max − R_min): the deficit is
    d_i = 1 − (R_i − R_min) / max(R_max − R_min, floor), so groups whose rewards differ by less than the noise get
    deficits near 1 alike (weights near equal) instead of the full 0-to-1 swing that noise would flip from step to
    step; a spread well above the floor gives the rule unchanged."""
    low, high = reward[active].min(), reward[active].max()
    spread = torch.clamp(high - low, min=spread_floor)
    deficit = 1 - (reward - low) / spread if spread > 1e-9 else torch.ones_like(reward)
    alpha = (deficit + DEFICIT_FLOOR) * torch.where(noise_like, NOISE_SCALE, 1.0)
    return normalize_weights(alpha, w_min, w_max, active)


def smooth_weights(previous: torch.Tensor, new: torch.Tensor, share: float) -> torch.Tensor:
    """(1 − λ)·`previous` + λ·`new` (K,), λ = `share` (`policy_group_weight_smoothing`): an exponential moving
    average of a rule's weights; `new` itself (the same tensor) at λ = 1. Both have mean 1 over the groups, so the
    average does too, up to the groups that became active or inactive (the caller renormalises)."""
    return new if share >= 1.0 else (1.0 - share) * previous + share * new
