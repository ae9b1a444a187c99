"""Policy-group statistics, weights and sampling (pure functions on tensors) and `PolicyGroupState`, which holds them.

Shapes: K policy groups, P prompts in a generation batch (over all processes), G = `num_generations` completions per
prompt, N = P*G completions. A policy group is a set of prompts (task, source, difficulty or cluster); it is not a
generation group (the G completions of one prompt).

Formulas:
    - weight update, `progress` rule (the design's α_i ← α_i·(1 + η·ΔR_i)): ΔR_i = (R_i(t) − R_i(t−w)) − mean_j of
      the same, R the EMA reward of a group, w the update window; then clip to [w_min, w_max] and renormalise to
      mean 1 over groups (`normalize_weights`).
    - `deficit` rule: α_i ← α_i·(1 + η·(R̄ − R_i)), R̄ the mean EMA reward over groups.
    - `learnability` rule (the default): α_i = (d_i + 0.05)·s_i, renormalised as above. d_i = 1 − (R_i − R_min) /
      (R_max − R_min), the group's reward deficit over the range of group rewards (1 for the lowest, 0 for the highest;
      1 for every group while they are all equal). s_i = 0.2 for a group that looks like noise: warm (two progress
      half-lives of completions seen), its learning progress z-score since its start below 2 (`progress_z`: absolute
      learning progress, Portelas et al. 2020, arXiv:1910.07224), yet more than half of its prompts still give GRPO a
      signal (completions that disagree), which is what a coin-flip reward does and a learnable group at 0% or
      100% does not; else s_i = 1. A group at 0% success that starts to move keeps its full deficit weight.
    - `learnability` sampling (the default): group i is drawn in proportion to n_i·α_i·h_i, n_i its number of
      prompts (TRL's uniform draw) and h_i = f_i / (f_i + 0.05) its informative share (`informative_share`), f_i
      the Laplace-smoothed share of its prompts whose completions did not all get the same reward (DAPO,
      arXiv:2503.14476, §3.2 dynamic sampling), mixed with the floor (`sampling_probabilities`).
    - uncertainty of a group: p(1−p) for binary rewards with success rate p (the variance of a Bernoulli reward, which
      is what GRPO's advantage needs to be non-zero, DAPO arXiv:2503.14476 §3.2 "dynamic sampling"), p smoothed by
      Laplace's rule of succession over the completions seen; else the mean within-prompt reward std.
    - `policy_group` baseline: A = (r − mean_G r) / (std + 1e-4), mean and std over the completions of the same
      policy group in the batch, the group-level analogue of GRPO's eq. 3 (DeepSeekMath arXiv:2402.03300).
"""

import torch

EPS = 1e-4  # as TRL's advantage scaling


def prompt_statistics(rewards: torch.Tensor, num_generations: int) -> dict[str, torch.Tensor]:
    """Per-prompt mean, std and "all completions got the same reward" of rewards (N,) laid out prompt by prompt.

    NaN rewards (every reward function returned None) are left out; a prompt with none valid has NaN mean.
    Returns tensors of shape (P,).
    """
    grouped = rewards.view(-1, num_generations)  # (P, G)
    valid = ~torch.isnan(grouped)
    count = valid.sum(1)
    filled = torch.where(valid, grouped, torch.zeros_like(grouped))
    mean = filled.sum(1) / count.clamp(min=1)
    var = (torch.where(valid, (grouped - mean[:, None]) ** 2, torch.zeros_like(grouped))).sum(1)
    std = (var / (count - 1).clamp(min=1)).sqrt()  # unbiased, as TRL's nanstd
    mean = torch.where(count > 0, mean, torch.full_like(mean, float("nan")))
    return {"mean": mean, "std": std, "zero_std": std < 1e-8, "valid": count > 0}


def group_means(values: torch.Tensor, group_ids: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of `values` (M,) per group id (M,) in [0, K), NaNs left out: returns (means (K,), counts (K,))."""
    valid = ~torch.isnan(values)
    ids, kept = group_ids[valid], values[valid].double()
    counts = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, ids, torch.ones_like(kept))
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, ids, kept)
    return sums / counts.clamp(min=1), counts


def ema_update(old: torch.Tensor, new: torch.Tensor, seen: torch.Tensor, has_value: torch.Tensor, decay: float):
    """EMA of per-group values (K,): groups `seen` in this batch move toward `new`; a group's first value is taken
    as is. Returns the updated EMA (K,)."""
    blended = torch.where(has_value, decay * old + (1 - decay) * new, new)
    return torch.where(seen, blended, old)


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


def progress_weights(weights, reward_change, eta: float, w_min: float, w_max: float, active) -> torch.Tensor:
    """The `progress` rule: α_i ← α_i·(1 + η·ΔR_i) with ΔR_i = change_i − mean change over active groups, then
    `normalize_weights`. All tensors (K,)."""
    delta = reward_change - reward_change[active].mean()
    return normalize_weights(weights * (1 + eta * delta), w_min, w_max, active)


def deficit_weights(weights, reward, eta: float, w_min: float, w_max: float, active) -> torch.Tensor:
    """The `deficit` rule: α_i ← α_i·(1 + η·(R̄ − R_i)), R̄ the mean over active groups, then `normalize_weights`."""
    return normalize_weights(weights * (1 + eta * (reward[active].mean() - reward)), w_min, w_max, active)


def ema_share(counts: torch.Tensor, has_value: torch.Tensor, halflife: float) -> torch.Tensor:
    """The share k (K,) a batch takes in an EMA over completions: a batch holding m completions of group i moves
    its EMA by k = 1 − 2^(−m/halflife); a group's first batch sets it (k = 1); a group not in the batch keeps it
    (k = 0)."""
    share = torch.where(has_value, 1 - torch.pow(0.5, counts / halflife), torch.ones_like(counts))
    return torch.where(counts > 0, share, torch.zeros_like(counts))


def progress_z(recent, start, variance, recent_moment, start_count) -> torch.Tensor:
    """Learning progress as a z-score, (K,): |recent − start| over the standard deviation that difference would have
    if the group's reward had not changed, √(v·(Σw² + 1/n)) for i.i.d. rewards of variance v (K,), Σw² (K,) of the
    recent EMA's completion weights and n (K,) completions in the start mean (the overlap of the two, early on, is
    left out, which only lowers z). Absolute learning progress, Portelas et al. 2020, arXiv:1910.07224, §4, measured
    since the group's start and in units of its own noise: a noise group's z stays of order 1, a learnt one's grows."""
    spread = recent_moment + 1 / start_count.clamp(min=1)
    return (recent - start).abs() / (variance * spread).sqrt()


# The `learnability` rule's constants, chosen on the task family of benchmarks/policy_groups_learning.py (issue #11).
PROGRESS_Z = 2.0  # a learning-progress z-score below this is "no progress"
NOISE_SCALE = 0.2  # s_i of a group that looks like noise
NOISE_INFORMATIVE = 0.5  # ... and has more than this share of prompts whose completions disagree
DEFICIT_FLOOR = 0.05  # added to the deficit, so the best group keeps a weight


def learnability_weights(reward, noise_like, w_min: float, w_max: float, active) -> torch.Tensor:
    """The `learnability` rule, α_i = (d_i + 0.05)·s_i (see the module docstring), clipped to [w_min, w_max] and
    renormalised to mean 1 over the `active` groups. `reward` (K,) EMA rewards, `noise_like` (K,) bool. Memoryless:
    the weights follow the current rewards, not the previous weights. Returns (K,)."""
    low, high = reward[active].min(), reward[active].max()
    deficit = 1 - (reward - low) / (high - low) if high - low > 1e-9 else torch.ones_like(reward)
    alpha = (deficit + DEFICIT_FLOOR) * torch.where(noise_like, NOISE_SCALE, 1.0)
    return normalize_weights(alpha, w_min, w_max, active)


def group_uncertainty(success_rate, reward_std, binary: bool, completions_seen=None) -> torch.Tensor:
    """p(1−p) of the success rate for binary rewards, else the mean within-prompt reward std. Shape (K,).

    With `completions_seen` (K,), p is Laplace's rule of succession, (p·n + 1) / (n + 2) with n completions seen,
    so that a group seen a few times with no success yet keeps some uncertainty instead of none (a group that is
    learnable but not learnt yet would otherwise never be drawn).
    """
    if not binary:
        return reward_std
    if completions_seen is not None:
        success_rate = (success_rate * completions_seen + 1) / (completions_seen + 2)
    return success_rate * (1 - success_rate)


def informative_share(zero_std_frac: torch.Tensor, prompts_seen: torch.Tensor, half: float = 0.05) -> torch.Tensor:
    """h = f / (f + `half`), f the share of a group's prompts whose completions did not all get the same reward
    (Laplace-smoothed over the prompts seen, so an unseen group has f = 1/2): near 1 for any group that gives GRPO a
    signal, near 0 for one whose prompts are all solved or all failed (their advantages are zero; DAPO,
    arXiv:2503.14476, §3.2 dynamic sampling). Shape (K,)."""
    f = ((1 - zero_std_frac) * prompts_seen + 1) / (prompts_seen + 2)
    return f / (f + half)


def sampling_probabilities(weights, uncertainty, floor: float, available) -> torch.Tensor:
    """Probability (K,) of drawing each policy group: the mixture (1 − floor)·q + floor/K_a over the K_a groups that
    have prompts, q ∝ weights × uncertainty (pass ones for `weighted`); so every such group gets at least
    floor / K_a, a group without prompts 0, and the probabilities sum to 1."""
    k = int(available.sum())
    score = torch.where(available, (weights * uncertainty).clamp(min=0), torch.zeros_like(weights))
    q = score / score.sum() if score.sum() > 0 else available.double() / k
    return torch.where(available, (1 - floor) * q + floor / k, torch.zeros_like(q))


def policy_group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, num_groups: int, scale: str):
    """Advantages (N,) against the policy group's batch mean: (r − mean_G r) / (std + 1e-4) with the reward std over
    the same policy group (`scale="group"`), the reward std over the whole batch as TRL's `scale_rewards="batch"`
    (`"batch"`), or none (`"none"`). NaN rewards give 0."""
    mean, counts = group_means(rewards, group_ids, num_groups)
    centred = rewards.double() - mean[group_ids]
    if scale == "group":
        var, _ = group_means(centred**2, group_ids, num_groups)
        std = (var * counts / (counts - 1).clamp(min=1)).sqrt()[group_ids]
    elif scale == "batch":
        valid = rewards[~torch.isnan(rewards)].double()
        std = valid.std() if len(valid) > 1 else torch.tensor(0.0, dtype=torch.float64)
    else:
        std = None
    advantages = centred if std is None else centred / (std + EPS)
    return torch.nan_to_num(advantages, nan=0.0).to(rewards.dtype)


def loss_weights(group_weights: torch.Tensor, group_ids: torch.Tensor, used: torch.Tensor | None = None):
    """Each completion's group weight (N,), rescaled to mean 1 over the completions the loss uses, `used` (N,) bool
    (all if None; TRL's loss leaves out unscored completions, whose advantage is 0, and those masked as truncated),
    so the loss scale is unchanged. With no completion used the weights are the group weights as they are."""
    w = group_weights[group_ids]
    if used is not None:
        return w / w[used].mean() if used.any() else w
    return w / w.mean()
