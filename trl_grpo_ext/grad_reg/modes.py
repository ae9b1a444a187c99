"""The modes of `GRPOConfig.grad_reg`, one class each, registered by name in `GRAD_REG_MODES`.

The config reads the registry for the names `grad_reg` accepts, its `--help` text and its docstring entry, and calls
every mode's `check` when it is built. `feature.GradReg` builds one object per mode the config names; where
transformers clips the gradients (once per optimizer step, after they are summed over micro-batches and synchronized
across processes) it calls them in this order, modes in registry order:

    1. `rescale_gradients`: change the gradients in place before their total norm is taken (AGC);
    2. the total gradient norm, and the non-finite guard (any mode turns it on: a step with a NaN or infinite norm is
       skipped);
    3. `clip_bound`: the bound the total norm is clipped to, below `max_grad_norm` (ZClip).

Under DeepSpeed, which clips inside its own step, `deepspeed_bound` gives the bound before the step and
`observe_norm` sees the norm after it.
"""

import math

from accelerate.utils import DistributedType

from ..feature_api import Registry
from ..launch_engine import deepspeed_launch, fsdp_source
from .clipping import ZClip, adaptive_clip_, agc_applies

GRAD_REG_MODES = Registry("grad_reg")


class GradRegMode:
    """One mode of `grad_reg`. Subclasses override what the mode does (module docstring); the defaults do nothing.

    Attributes:
        name: the registered name (set by `GRAD_REG_MODES.register`).
        summary: one line for `--help` and the config docstring: what the mode does and its source.
    """

    name: str = ""
    summary: str = ""

    def __init__(self, feature):
        self.feature = feature  # `feature.GradReg`: the trainer (`feature.trainer`) and metrics
        self.args = feature.trainer.args

    @classmethod
    def check(cls, args) -> None:
        """Config-time rules of this mode's fields (`cls.name in args.grad_reg` says whether it is on).

        Raises:
            ValueError: naming the fields and their values.
        """

    def rescale_gradients(self, model) -> dict[str, float] | None:
        """Change the gradients of `model` in place. Returns None if the mode does not change them, else the metrics
        to log for the step (logged once the step is known to be finite); the total norm is then recomputed."""
        return None

    def clip_bound(self, norm: float) -> float | None:
        """The bound to clip the finite total gradient `norm` to (None: `max_grad_norm` alone)."""
        return None

    def deepspeed_bound(self) -> float | None:
        """DeepSpeed: the bound for its next step, before the norm is known, or None if the mode has none (the
        feature sets DeepSpeed's bound only when a mode gives one; `math.inf`: `max_grad_norm` alone)."""
        return None

    def observe_norm(self, norm: float) -> None:
        """DeepSpeed: the finite total norm of the step DeepSpeed took."""


@GRAD_REG_MODES.register("zclip")
class ZClipMode(GradRegMode):
    """ZClip (Kumar et al. 2025, arXiv:2504.02507): clip the total gradient norm where its z-score against a moving
    mean and variance exceeds `zclip_z_threshold` (`clipping.ZClip`); logs `grad_reg/z`."""

    summary = (
        "z-score clipping of the total gradient norm against its moving mean and variance (Kumar et al. 2025, "
        "arXiv:2504.02507)"
    )

    def __init__(self, feature):
        super().__init__(feature)
        self.zclip = ZClip(self.args.zclip_alpha, self.args.zclip_z_threshold, self.args.zclip_warmup_steps)

    def clip_bound(self, norm: float) -> float | None:
        clip, z = self.zclip.step(norm)
        if z is not None:
            self.feature.log("grad_reg/z", z)
        return clip

    def deepspeed_bound(self) -> float:
        spike = self.zclip.spike_threshold()  # None while warming up: max_grad_norm alone
        return math.inf if spike is None else spike

    def observe_norm(self, norm: float) -> None:
        z = self.zclip.step(norm)[1]
        if z is not None:
            self.feature.log("grad_reg/z", z)


@GRAD_REG_MODES.register("agc")
class AGCMode(GradRegMode):
    """Unit-wise adaptive gradient clipping (Brock et al. 2021, arXiv:2102.06171, eq. 3): each unit's gradient norm
    is kept at most `agc_clip`·max(‖W_unit‖, `agc_eps`) (`clipping.adaptive_clip_`); logs `grad_reg/agc_clipped_frac`.

    Raises:
        ValueError: under DeepSpeed or FSDP (at config time from the launch, `launch_engine`; at build from the
            prepared accelerator), which keep each parameter's gradient in partitions, so no process holds
            the whole rows AGC compares.
    """

    summary = (
        "unit-wise adaptive gradient clipping, each unit's gradient norm against its weight's (Brock et al. 2021, "
        "arXiv:2102.06171)"
    )

    @classmethod
    def check(cls, args) -> None:
        if cls.name not in args.grad_reg:
            return
        fsdp, deepspeed = fsdp_source(args), deepspeed_launch(args)
        if fsdp is not None or deepspeed is not None:
            engine = f"FSDP, from {fsdp}" if fsdp is not None else f"DeepSpeed, from {deepspeed.where}"
            raise ValueError(
                f"grad_reg={args.grad_reg}: 'agc' clips each row of each weight by its own norm, which needs whole "
                f"gradients on every process; {engine} keeps them in partitions. Use 'zclip' there."
            )

    def __init__(self, feature):
        super().__init__(feature)
        accelerator = feature.trainer.accelerator
        if accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):  # set another way
            raise ValueError(
                f"grad_reg={self.args.grad_reg}: 'agc' clips each row of each weight by its own norm, which needs "
                f"whole gradients on every process; {accelerator.distributed_type.value} keeps them in partitions. "
                "Use 'zclip' there."
            )

    def rescale_gradients(self, model) -> dict[str, float]:
        self.feature.trainer.accelerator.unscale_gradients()  # fp16 loss scaling: compare true gradients
        params = [p for name, p in model.named_parameters() if p.grad is not None and agc_applies(name)]
        clipped, units = adaptive_clip_(params, self.args.agc_clip, self.args.agc_eps)
        return {"grad_reg/agc_clipped_frac": clipped / max(units, 1)}


@GRAD_REG_MODES.register("skip_nonfinite")
class SkipNonFinite(GradRegMode):
    """Only the non-finite guard, which every mode turns on: an optimizer step whose total gradient norm is NaN or
    infinite is skipped (`feature.GradReg`)."""

    summary = (
        "skip optimizer steps whose gradient norm is NaN or infinite (parameters and optimizer state unchanged; any "
        "grad_reg mode does this)"
    )


def check_config(args) -> None:
    """The config-time rules of `grad_reg` and `kl_target` (called by `GRPOConfig.__post_init__`, after each
    field's own check).

    Raises:
        ValueError: `grad_reg` without `max_grad_norm > 0`, `kl_target` without `beta > 0`, or what a mode's `check`
            refuses; each names the fields and their values.
    """
    if args.grad_reg and not (args.max_grad_norm is not None and args.max_grad_norm > 0):
        raise ValueError(
            f"grad_reg={args.grad_reg} works where the Trainer clips gradients: it needs max_grad_norm > 0, got "
            f"{args.max_grad_norm}"
        )
    if args.kl_target is not None and not args.beta > 0:
        raise ValueError(
            f"kl_target ({args.kl_target}) adapts beta multiplicatively: it needs beta > 0 at the start, got "
            f"{args.beta} (TRL computes the reference log-probabilities only when beta != 0)"
        )
    for mode in GRAD_REG_MODES.values():
        mode.check(args)
