"""The entropy bonus and the entropy-shaped advantage (pure functions on tensors).

Shapes: B completions on this process, T completion tokens. Entropy is that of the full next-token distribution, in
nats per token (TRL's `entropy_from_logits`), never the negative log-probability of the sampled token.
"""

import torch


def completion_entropy(entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean token entropy of each completion, (B, T) x (B, T) -> (B,) nats; 0 for a completion with no tokens."""
    mask = mask.to(entropies.dtype)
    return (entropies * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def entropy_bonus(entropies: torch.Tensor, mask: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Σ_bt c_b·H_bt·m_bt / Σ_bt m_bt: the mean token entropy weighted by each completion's coefficient `coef` (B,).

    With one coefficient for all completions this is TRL's entropy bonus (`entropy_coef` times the mean token
    entropy), the term subtracted from the loss; with one coefficient per policy group each group is pushed alone.
    Returns a scalar that keeps the gradient of `entropies` (B, T).
    """
    mask = mask.to(entropies.dtype)
    return (coef[:, None].to(entropies.dtype) * entropies * mask).sum() / mask.sum().clamp(min=1.0)


def entropy_advantages(advantages: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor, *, tau: float,
                       scored: torch.Tensor | None = None, kappa: float = 2.0):  # fmt: skip
    """A + min(τ·H_i, |A|/κ), H_i the completion's mean token entropy, detached: the entropy-based advantage of Cheng
    et al. 2025 ("Reasoning with Exploration: An Entropy Perspective", arXiv:2506.14758, eq. 5: ψ(H) =
    min(α·H^detach, |A|/κ), κ > 1), with the completion's mean entropy where the paper takes each token's.

    The clip keeps the shift below |A|/κ: it never flips an advantage's sign (κ ≥ 1) and is exactly 0 where A is 0,
    so a generation group whose completions all got the same reward (advantage 0 in GRPO) stays without signal
    instead of raising the likelihood of its completions in proportion to their entropy. `advantages` is (B,) or
    (B, T) (then |A| per token); returns the same shape. `scored` (B,) bool: completions some reward function scored;
    the others keep their advantage as it is (TRL sets it to exactly 0 so that they do not move the policy). A
    completion without tokens in `mask` (masked as truncated) gets no shift either.
    """
    bonus = tau * completion_entropy(entropies.detach(), mask)  # (B,)
    if scored is not None:
        bonus = torch.where(scored, bonus, torch.zeros_like(bonus))
    bonus = (bonus if advantages.dim() == 1 else bonus[:, None]).to(advantages.dtype)
    return advantages + torch.minimum(bonus, advantages.abs() / kappa)
