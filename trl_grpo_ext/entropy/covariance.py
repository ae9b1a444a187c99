"""Clip-Cov and KL-Cov (Cui et al. 2025, arXiv:2505.22617): the per-token covariance of log-probability and advantage,
the tokens each method picks by it, and KL-Cov's penalty (pure functions on tensors).

Shapes: B completions on this process, T completion tokens.
"""

import math

import torch


def token_covariance(logps: torch.Tensor, advantages: torch.Tensor, means: tuple[float, float]) -> torch.Tensor:
    """Per-token covariance term (log π_t − mean log π)·(A_t − mean A), (B, T) from `logps` (B, T) and `advantages`
    (B,) or (B, T), detached; `means` = (mean log-probability, mean advantage) over all valid tokens of all processes.

    Cui et al. 2025, arXiv:2505.22617 (entropy dynamics): the entropy change of a policy-gradient step follows the
    covariance of log-probability and advantage, and these are its per-token terms, centred as in the reference
    implementation (PRIME-RL/Entropy-Mechanism-of-RL, verl's `compute_policy_loss_clip_cov`).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    return (logps.detach() - means[0]) * (advantages.detach() - means[1])


def clip_cov_draw(
    cov: torch.Tensor, candidates: torch.Tensor, count: int, bounds: tuple[float, float], generator: torch.Generator
) -> torch.Tensor:
    """Clip-Cov's draw (arXiv:2505.22617, Clip-Cov): `count` tokens (fewer if fewer qualify) drawn at random among the
    `candidates` (B, T) bool whose covariance `cov` (B, T) lies strictly inside `bounds` = (ω_low, ω_high). Returns a
    (B, T) bool mask; the draw uses `generator` (CPU) and depends only on the flattened order of the tokens."""
    inside = candidates & (cov > bounds[0]) & (cov < bounds[1])
    chosen = torch.zeros_like(inside)
    index = inside.flatten().nonzero().flatten().cpu()
    if len(index) and count > 0:
        pick = index[torch.randperm(len(index), generator=generator)[:count]]
        chosen.view(-1)[pick.to(chosen.device)] = True
    return chosen


def kl_cov_top(cov: torch.Tensor, mask: torch.Tensor, count: int) -> torch.Tensor:
    """KL-Cov's tokens (arXiv:2505.22617, KL-Cov): the `count` valid tokens (at most all of them) with the largest
    covariance `cov` (B, T) among `mask` (B, T). Returns a (B, T) bool mask."""
    valid = mask.bool()
    count = min(count, int(valid.sum()))
    chosen = torch.zeros_like(valid)
    if count > 0:
        scores = torch.where(valid, cov, torch.full_like(cov, -math.inf)).flatten()
        chosen.view(-1)[scores.topk(count).indices] = True
    return chosen


def window_token_count(ratio: float, before: int, tokens: int) -> int:
    """How many of `tokens` completion tokens Clip-Cov or KL-Cov pick when `before` tokens of the same optimizer step
    came earlier, so that the picks over the step add up to max(int(ratio·n), 1) of its n tokens, however the step is
    split into micro-batches: with the cumulative count t(c) = max(int(ratio·c), 1) for c > 0 and t(0) = 0, this is
    t(before + tokens) − t(before) (a telescoping sum; exact rounding over the window).

    arXiv:2505.22617 (Clip-Cov, KL-Cov) picks `ratio` of the tokens of the batch its loss is computed on; here that
    batch is the optimizer step's. E.g. ratio 0.0002 and 4,096 tokens a step: t(4096) = 1 token, also when the step
    is two micro-batches of 2,048 (t(2048) = 1, then t(4096) − t(2048) = 0), where max(int(ratio·n), 1) per
    micro-batch would pick 2.
    """

    def total(c: int) -> int:
        return max(int(ratio * c), 1) if c > 0 else 0

    return total(before + tokens) - total(before)


def kl_cov_penalty(logps: torch.Tensor, old_logps: torch.Tensor, chosen: torch.Tensor, mask: torch.Tensor, coef):
    """β·Σ_chosen |log π − log π_old| / Σ mask: KL-Cov's penalty as a token mean over the valid tokens
    (arXiv:2505.22617, KL-Cov, with the reference implementation's token-mean aggregation). Scalar with the gradient
    of `logps` (B, T).

    The gradient is zero while the policy has not moved since generation (log π = log π_old), so the penalty acts
    from the second pass over a generation batch on (`num_iterations > 1`, or `steps_per_generation` >
    `gradient_accumulation_steps`), as in the paper's PPO mini-batches.
    """
    penalty = (logps - old_logps).abs() * chosen.to(logps.dtype)
    return coef * penalty.sum() / mask.sum().clamp(min=1.0)
