"""Which policy groups a generation batch draws its prompts from (pure functions on tensors). Shapes: K groups.

Formulas:
    - `learnability` sampling (the default): group i is drawn in proportion to n_i·α_i·h_i, n_i its number of
      prompts (TRL's uniform draw) and h_i = f_i / (f_i + 0.05) its informative share (`informative_share`), f_i
      the Laplace-smoothed share of its prompts whose completions did not all get the same reward (DAPO,
      arXiv:2503.14476, §3.2 dynamic sampling), mixed with the floor (`sampling_probabilities`).
    - uncertainty of a group: p(1−p) for binary rewards with success rate p (the variance of a Bernoulli reward, which
      is what GRPO's advantage needs to be non-zero, DAPO arXiv:2503.14476 §3.2 "dynamic sampling"), p smoothed by
      Laplace's rule of succession over the completions seen; else the mean within-prompt reward std.
"""

import torch


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
