"""The trainer wiring of adaptive gradient regularization: `GradReg`, the feature the trainer calls at the points of a
step that `composition.STEP` lists for it; it calls the modes of `GRPOConfig.grad_reg` (`modes`) where transformers
clips the gradients. The formulas are in `clipping` and `adaptive_kl`, the state in `state`.

Where it acts: transformers calls `_clip_grad_norm(model)` once per optimizer step, after the gradients are summed
over micro-batches and synchronized across processes, before `optimizer.step()`; the learning-rate scheduler steps
after it. There, in order: AGC (unit-wise, in place), the total gradient norm, the non-finite guard, then clipping to
min(ZClip's bound, `max_grad_norm`) (`modes` module docstring). Every process sees the same synchronized norm, so
every process takes the same decisions and keeps the same state. The adaptive KL coefficient is measured in TRL's
loss and updated at the end of each accumulation window, for the next optimizer step.
"""

import logging
import math
import os

import torch
from accelerate.utils import DistributedType, broadcast_object_list
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..feature_api import Feature, loss_scaler
from ..resume import checkpoint_problem
from ..trl_contact import (
    check_deepspeed_engine,
    deepspeed_clip,
    deepspeed_guard_problem,
    deepspeed_skipped_steps,
    grad_norm,
    log_total,
    metrics,
    output_dir,
    save_checkpoint,
    set_deepspeed_clip,
    skip_optimizer_step,
)
from .adaptive_kl import AdaptiveKL, per_token_kl
from .config import UNGUARDED
from .modes import GRAD_REG_MODES
from .state import GradRegState

logger = logging.getLogger(__name__)


class NonFiniteGradientError(RuntimeError):
    """`grad_reg_max_skips` optimizer steps in a row had a NaN or infinite gradient norm (a checkpoint was saved), or
    DeepSpeed took a step with one (nothing saved: the weights are no longer finite)."""


class GradReg(Feature):
    """Adaptive gradient regularization in the trainer: one object per mode of `grad_reg` (`self.modes`, registry
    order) where transformers clips the gradients, the non-finite guard, and the adaptive KL coefficient. Built when
    `grad_reg` names a mode or `kl_target` is set.

    Non-finite guard: a step whose total gradient norm is NaN or Inf gets every `.grad` set to None, so torch's
    optimizers and bitsandbytes' 8-bit ones leave both the parameters and their state (moments, step counts) as they
    were. The learning-rate schedule still advances by one step, and the step still counts in `global_step`.

    fp16 loss scaling (`feature_api.loss_scaler`): an overflow while the loss scale is at least 1 is the scaler's
    calibration, not divergence: torch's GradScaler skips that optimizer step itself (the schedule does not advance)
    and halves its scale. Such a step is counted in `grad_reg/scaler_overflows`, not as a skipped step, never toward
    `grad_reg_max_skips`, and leaves ZClip's statistics alone. Once the scale is below 1 the gradients overflow
    unscaled: such a step counts as a skipped step like any other.

    DeepSpeed (ZeRO-1/2/3, run on DeepSpeed 0.19.8 in the real-engine tests): DeepSpeed clips and steps inside
    `backward`, before `_clip_grad_norm` runs, at its optimizer's `clip_grad`, and skips a step whose gradient is not
    finite itself (DeepSpeed >= 0.19.8 with its overflow check on, which `config.check_deepspeed` requires). So
    before each step `clip_grad` is set to min(μ + z_thr·σ, `max_grad_norm`) (the norm where ZClip's z reaches z_thr:
    the same decision rule, with the bound itself as the clip target, since the norm is not known before the step).
    After it, whether the step was skipped is read off the engine (its `skipped_steps` went up), not off the norm it
    reports, which some releases report finite for a NaN step; a skip is counted as above, and ZClip learns from the
    norm of a step taken. A non-finite norm on a step the engine took means the weights are no longer finite: the
    run stops at once with `NonFiniteGradientError`, saving nothing. Refused at the first step, from the config
    DeepSpeed parsed (`trl_contact.deepspeed_guard_problem`), where the engine would not skip such a step or would
    count its fp16 loss-scale overflows as skips: ZeRO-0, fp16, `compute_grad_norm` off, bf16 without its overflow
    check (ZeRO-1/2). AGC is refused there.

    Raises:
        ValueError: what a mode refuses when built (`agc` under DeepSpeed or FSDP).
    """

    name = "grad_reg"
    exposes = "grad_reg_state"
    writes = ("trainer.beta", "deepspeed clip_grad")

    def __init__(self, trainer):
        super().__init__(trainer)
        args = trainer.args
        self.modes = [mode(self) for name, mode in GRAD_REG_MODES.items() if name in args.grad_reg]
        zclip = next((mode.zclip for mode in self.modes if mode.name == "zclip"), None)
        kl = AdaptiveKL(args.beta, args.kl_target, args.kl_horizon) if args.kl_target is not None else None
        self._state = GradRegState(zclip, kl)
        self._logps = None  # (B, T) the policy's log-probabilities of the loss being computed, detached
        self._kl_window = None  # (3,) [sum of per-token KL, valid tokens, completions] over the accumulation window
        self._engine_skipped = None  # DeepSpeed: the engine's skipped steps before the step of this window

    @classmethod
    def build(cls, trainer) -> "GradReg | None":
        args = trainer.args
        return cls(trainer) if args.grad_reg or args.kl_target is not None else None

    def state(self) -> GradRegState:
        return self._state

    def log(self, name: str, value: float) -> None:
        """Append `value` to the training metric `name`, logged by TRL."""
        metrics(self.trainer, "train")[name].append(value)

    # -- gradients

    def _deepspeed(self) -> bool:
        return self.trainer.accelerator.distributed_type == DistributedType.DEEPSPEED

    def training_step(self, model) -> None:
        if not self.modes or not self._deepspeed():  # kl_target alone: DeepSpeed steps as it does
            return
        engine = self.trainer.deepspeed
        if self._engine_skipped is None:  # the first step: the engine as DeepSpeed parsed its config
            check_deepspeed_engine(engine)
            problem = deepspeed_guard_problem(engine)
            if problem is not None:
                raise ValueError(f"grad_reg={self.trainer.args.grad_reg} under DeepSpeed: {UNGUARDED[problem]}; drop "
                                 "grad_reg or change that DeepSpeed setting")  # fmt: skip
        self._engine_skipped = deepspeed_skipped_steps(engine)  # the step comes in this window's last backward
        bounds = [bound for bound in (mode.deepspeed_bound() for mode in self.modes) if bound is not None]
        if bounds:  # DeepSpeed clips at it in the backward that steps
            set_deepspeed_clip(engine, min([*bounds, self.trainer.args.max_grad_norm]))

    def clip_gradients(self, model, clip):
        if not self.modes:  # kl_target alone: transformers clips as it does
            return clip(model)
        if self._deepspeed():
            return self._deepspeed_step(model, clip)
        trainer, args, state = self.trainer, self.trainer.args, self._state
        logged = {}
        for mode in self.modes:
            changed = mode.rescale_gradients(model)
            if changed is not None:
                logged.update(changed)
        if logged:  # gradients are whole and synchronized here (AGC is refused under DeepSpeed and FSDP)
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        else:
            norm = grad_norm(trainer, model)  # () the total norm over all processes, not clipped (unscaled first)
        value = float(norm)  # the same on every process
        scaler = loss_scaler(trainer)
        scale = None if scaler is None else float(scaler.get_scale())  # the scale of this step's backward
        if not math.isfinite(value) and scale is not None and scale >= 1:  # the scaler's: it skips the step itself
            state.scaler_overflows += 1
            log_total(trainer, "train", "grad_reg/scaler_overflows", float(state.scaler_overflows))
            log_total(trainer, "train", "grad_reg/skipped_steps", float(state.skipped))
            return norm
        if not math.isfinite(value):
            for p in model.parameters():
                p.grad = None
            if scaler is None:  # the schedule waits for the step, as under a loss scaler or DeepSpeed
                skip_optimizer_step(trainer, True)
            self._count_skip(model, value)
            return norm
        if scaler is None:
            skip_optimizer_step(trainer, False)
        state.consecutive_skips = 0
        bound = args.max_grad_norm
        for mode in self.modes:
            clip_at = mode.clip_bound(value)
            if clip_at is not None:
                bound = min(clip_at, bound)
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), bound, norm)
        self._log_step(value, bound, logged)
        return norm

    def _log_step(self, norm: float, bound: float, logged: dict[str, float]) -> None:
        self.log("grad_reg/threshold", bound)
        self.log("grad_reg/clipped", float(norm > bound))
        log_total(self.trainer, "train", "grad_reg/skipped_steps", float(self._state.skipped))
        if loss_scaler(self.trainer) is not None:
            log_total(self.trainer, "train", "grad_reg/scaler_overflows", float(self._state.scaler_overflows))
        for name, value in logged.items():
            self.log(name, value)

    def _count_skip(self, model, norm: float) -> None:
        """Count a skipped step; after `grad_reg_max_skips` in a row, save a checkpoint and stop.

        That checkpoint is written mid-step (the weights are the last good ones, but the GRPO loop's micro-step counter
        and buffered generations are those of the failing step): it is for inspecting the run or restarting it with
        other settings, not for an exact resume.

        Raises:
            NonFiniteGradientError: the `grad_reg_max_skips`-th skipped step in a row.
        """
        trainer = self.trainer
        state, args, step = self._state, trainer.args, trainer.state.global_step
        state.skipped += 1
        state.consecutive_skips += 1
        log_total(trainer, "train", "grad_reg/skipped_steps", float(state.skipped))
        # step + 1: the step being taken, numbered as it is logged (`global_step` counts the steps done)
        logger.warning(
            "grad_reg: gradient norm %s at step %d: optimizer step skipped (%d in a row, %d in all)",
            norm, step + 1, state.consecutive_skips, state.skipped,
        )  # fmt: skip
        if state.consecutive_skips < args.grad_reg_max_skips:
            return
        state.consecutive_skips = 0  # a run resumed from the checkpoint gets a fresh allowance
        checkpoint = os.path.join(output_dir(trainer), f"{PREFIX_CHECKPOINT_DIR}-{step}")
        complete = [os.path.isdir(checkpoint) and checkpoint_problem(checkpoint) is None]
        broadcast_object_list(complete)  # the main process's view, so that every process saves or none does
        if not complete[0]:
            save_checkpoint(trainer, model)
        raise NonFiniteGradientError(
            f"grad_reg: {args.grad_reg_max_skips} optimizer steps in a row (grad_reg_max_skips="
            f"{args.grad_reg_max_skips}) had a non-finite gradient norm, the last one at step {step + 1} "
            f"(norm {norm}); the weights of the last good step are in {checkpoint}"
        )

    def _deepspeed_step(self, model, clip):
        """DeepSpeed: the step is taken or skipped already (see the class docstring); update the state from it.

        Raises:
            NonFiniteGradientError: the engine took a step whose gradient norm is not finite, or the
                `grad_reg_max_skips`-th skipped step in a row (`_count_skip`).
        """
        norm = clip(model)  # DeepSpeed's norm of this step's gradients
        engine = self.trainer.deepspeed
        value = float("nan") if norm is None else float(norm)
        if deepspeed_skipped_steps(engine) > self._engine_skipped:
            self._count_skip(model, value)
            return norm
        if not math.isfinite(value):
            raise NonFiniteGradientError(
                f"grad_reg: DeepSpeed took optimizer step {self.trainer.state.global_step + 1} with a gradient norm "
                f"of {value} instead of skipping it, so the weights are no longer finite; no checkpoint was saved. "
                "DeepSpeed skips such steps from 0.19.8 on, with its overflow check on (bf16.check_grad_overflow)"
            )
        self._state.consecutive_skips = 0
        for mode in self.modes:
            mode.observe_norm(value)
        self._log_step(value, deepspeed_clip(engine), {})
        return norm

    # -- loss: the adaptive KL coefficient

    def loss_start(self, model, inputs: dict, batch: dict) -> None:
        kl = self._state.kl
        if kl is not None and self.trainer.model.training:
            self.trainer.beta = kl.beta  # this optimizer step's β (also right after a resume); TRL's loss reads it
        self._logps = None

    def policy_logps(self, batch: dict, logps: torch.Tensor, entropies: torch.Tensor | None) -> torch.Tensor:
        if self._state.kl is not None and self.trainer.model.training:
            self._logps = logps.detach()
        return logps

    def loss_end(self, batch: dict, loss: torch.Tensor) -> torch.Tensor:
        logps, self._logps = self._logps, None
        if logps is not None:
            self._observe_kl(batch, logps)
        return loss

    def _observe_kl(self, inputs: dict, logps: torch.Tensor) -> None:
        """Add this micro-batch's KL to the window; at the window's end, update β from the mean over all processes."""
        trainer = self.trainer
        mask = inputs["completion_mask"]  # (B, T)
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mask = mask.float()
        kl = per_token_kl(logps, inputs["ref_per_token_logps"])  # (B, T) nats
        kl = torch.where(mask > 0, kl, 0.0)  # padding may hold anything, even inf
        stats = torch.stack([kl.sum(), mask.sum(), torch.tensor(float(mask.size(0)), device=mask.device)])
        self._kl_window = stats if self._kl_window is None else self._kl_window + stats
        if not trainer.accelerator.sync_gradients:
            return
        kl_sum, tokens, completions = trainer.accelerator.reduce(self._kl_window, reduction="sum").tolist()
        self._kl_window = None
        kl_state = self._state.kl
        self.log("kl_coef", kl_state.beta)  # the β this step's loss used
        trainer.beta = kl_state.update(kl_sum / max(tokens, 1.0), round(completions))
