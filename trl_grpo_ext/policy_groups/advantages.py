"""How policy groups shape the advantages (pure functions on tensors): the `policy_group` baseline and the loss
weights. Shapes: K policy groups, N completions of a generation batch (over all processes).

Formulas:
    - `policy_group` baseline: A = (r − mean_G r) / (std + 1e-4), mean and std over the completions of the same
      policy group in the batch, the group-level analogue of GRPO's eq. 3 (DeepSeekMath arXiv:2402.03300).
    - loss weighting: each completion's advantage times its group's weight, normalised to mean 1 over the batch.
"""

import torch

from .statistics import group_means

EPS = 1e-4  # as TRL's advantage scaling


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
