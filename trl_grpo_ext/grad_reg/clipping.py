"""Clipping the gradient: ZClip on the total gradient norm (Kumar et al. 2025, arXiv:2504.02507) and unit-wise
adaptive gradient clipping, AGC (Brock et al. 2021, arXiv:2102.06171). Small pure functions and ZClip's state, whose
`state_dict()` / `load_state_dict()` hold plain Python numbers, so a resumed run continues exactly.
"""

import math
from collections.abc import Iterable

import torch

# PEFT (0.21) initializes these LoRA factors to zero: `lora_B` of linear/conv layers (weight and bias) and
# `lora_embedding_A` of embedding layers. AGC's bound λ·max(‖W_i‖, ε) is then λ·ε for every unit, so AGC would hold
# their gradients at a near-constant tiny norm and distort their early updates: they are left to the global clip.
AGC_EXEMPT = ("lora_B", "lora_embedding_A")


class ZClip:
    """Adaptive clipping of the total gradient norm by z-score (Kumar et al. 2025, arXiv:2504.02507, Algorithm 1),
    as the reference implementation (github.com/bluorion-com/ZClip) does in its `zscore` mode with
    `clip_option="adaptive_scaling"`.

    The first `warmup_steps` norms only fill a buffer; the last of them sets μ (their mean) and σ² (their population
    variance). After that, for each total norm g (unitless, the L2 norm of all gradients):

        z = (g − μ) / (σ + eps)
        clip value c = μ + z_thr·σ / (z / z_thr) = μ + z_thr²·σ / z,  only when z > z_thr
        μ ← α·μ + (1 − α)·g',  σ² ← α·σ² + (1 − α)·(g' − μ)²  (the new μ),  g' = c if clipped else g

    The caller clips to min(c, max_grad_norm) (ZClip's "effective clip"); `max_grad_norm` stays the upper bound.
    """

    def __init__(self, alpha: float, z_threshold: float, warmup_steps: int, eps: float = 1e-6):
        self.alpha, self.z_threshold, self.warmup_steps, self.eps = alpha, z_threshold, warmup_steps, eps
        self.buffer: list[float] = []
        self.mean: float | None = None
        self.var: float | None = None

    @property
    def warmed_up(self) -> bool:
        return self.mean is not None

    def step(self, norm: float) -> tuple[float | None, float | None]:
        """Observe one optimizer step's total gradient norm (finite, before clipping).

        Returns:
            `(clip value or None, z or None)`: the clip value when z > z_thr, else None; z is None during warm-up.
        """
        if not self.warmed_up:
            self.buffer.append(float(norm))
            if len(self.buffer) >= self.warmup_steps:
                self.mean = sum(self.buffer) / len(self.buffer)
                self.var = sum((x - self.mean) ** 2 for x in self.buffer) / len(self.buffer)
                self.buffer = []
            return None, None
        std = math.sqrt(self.var)
        z = (norm - self.mean) / (std + self.eps)
        clip = self.mean + (self.z_threshold * std) / (z / self.z_threshold) if z > self.z_threshold else None
        value = clip if clip is not None else float(norm)
        self.mean = self.alpha * self.mean + (1 - self.alpha) * value
        self.var = self.alpha * self.var + (1 - self.alpha) * (value - self.mean) ** 2
        return clip, z

    def spike_threshold(self) -> float | None:
        """μ + z_thr·σ, the norm above which the next step counts as a spike (z > z_thr); None during warm-up."""
        return None if not self.warmed_up else self.mean + self.z_threshold * math.sqrt(self.var)

    def state_dict(self) -> dict:
        return {"buffer": list(self.buffer), "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: dict) -> None:
        self.buffer, self.mean, self.var = list(state["buffer"]), state["mean"], state["var"]


def unitwise_norm(x: torch.Tensor) -> torch.Tensor:
    """AGC's unit-wise L2 norm (Brock et al. 2021, arXiv:2102.06171, Sec. 4): the whole tensor for a vector or scalar,
    else one norm per output unit (row), over every dimension but the first.

    Returns:
        float32 (float64 for a float64 `x`), shape () for `x.ndim <= 1`, else `(x.shape[0], 1, ..., 1)` (keepdim,
        broadcasts against `x`).
    """
    dtype = torch.promote_types(x.dtype, torch.float32)  # at least float32; a float64 model's in float64
    if x.ndim <= 1:
        return torch.linalg.vector_norm(x, dtype=dtype)
    return torch.linalg.vector_norm(x, dim=tuple(range(1, x.ndim)), keepdim=True, dtype=dtype)


@torch.no_grad()
def adaptive_clip_(params: Iterable[torch.Tensor], clip: float, eps: float) -> tuple[int, int]:
    """Unit-wise adaptive gradient clipping, in place (Brock et al. 2021, arXiv:2102.06171, eq. 3):

        G_i ← λ·(max(‖W_i‖, ε) / ‖G_i‖)·G_i   where ‖G_i‖ / max(‖W_i‖, ε) > λ

    for every unit i (row; see `unitwise_norm`) of every parameter W with a gradient G. Parameters whose `.grad` is
    None are skipped. The caller leaves out parameters that must not be clipped this way (`AGC_EXEMPT`).

    Args:
        params: parameters (leaf tensors with `.grad`).
        clip: λ > 0, the largest allowed ratio of gradient norm to weight norm per unit.
        eps: ε > 0, the smallest weight norm used in the bound (zero-initialized units still get λ·ε).

    Returns:
        `(units clipped, units seen)`.
    """
    counts = []  # per parameter, on its device: summed once at the end (one host sync per step, not per parameter)
    total = 0
    for p in params:
        if p.grad is None:
            continue
        grad = p.grad
        max_norm = unitwise_norm(p.detach()).clamp(min=eps) * clip
        grad_norm = unitwise_norm(grad)
        over = grad_norm > max_norm
        scale = torch.where(over, max_norm / grad_norm.clamp(min=1e-6), torch.ones_like(grad_norm))
        grad.mul_(scale.to(grad.dtype))
        counts.append(over.sum())
        total += over.numel()
    clipped = int(torch.stack([c.to(counts[0].device) for c in counts]).sum().item()) if counts else 0
    return clipped, total


def agc_applies(name: str) -> bool:
    """Whether AGC clips the parameter called `name` (False for the zero-initialized LoRA factors, `AGC_EXEMPT`)."""
    return not any(part in name for part in AGC_EXEMPT)
