"""Per-group statistics of the gathered generation batches (pure functions on tensors): per-prompt reward mean and
std, group means, exponential moving averages, and the learning-progress z-score.

Shapes: K policy groups, P prompts in a generation batch (over all processes), G = `num_generations` completions per
prompt, N = P*G completions.
"""

import torch


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
