"""Adaptive gradient regularization wired into the Trainer's hooks: a mixin of `trl_grpo_ext.GRPOTrainer` (each
override calls `super()`). The formulas and state are in `grad_reg`; the settings are `GRPOConfig.grad_reg` and the
fields after it.

Where it acts: transformers calls `_clip_grad_norm(model)` once per optimizer step, after the gradients are summed
over micro-batches and synchronized across processes, before `optimizer.step()`; the learning-rate scheduler steps
after it. There, in order: AGC (unit-wise, in place), the total gradient norm, the non-finite guard, then clipping to
min(ZClip's bound, `max_grad_norm`). Every process sees the same synchronized norm, so every process takes the same
decisions and keeps the same state. The adaptive KL coefficient is measured in `_compute_loss` and updated at the end
of each accumulation window, for the next optimizer step.
"""

import logging
import math
import os

import torch
from accelerate.utils import DistributedType, broadcast_object_list
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .grad_reg import AdaptiveKL, GradRegState, ZClip, adaptive_clip_, agc_applies, per_token_kl
from .resume import checkpoint_problem
from .trl_contact import grad_norm, log_total, metrics, output_dir, save_checkpoint

logger = logging.getLogger(__name__)


class NonFiniteGradientError(RuntimeError):
    """`grad_reg_max_skips` optimizer steps in a row had a NaN or infinite gradient norm; a checkpoint was saved."""


class GradRegHooks:
    """Trainer hook overrides for adaptive gradient regularization. They act only when `self.grad_reg_state` (set by
    `_init_grad_reg`) is a `GradRegState`; otherwise every override is a plain call to the parent's method.

    Non-finite guard: a step whose total gradient norm is NaN or Inf gets every `.grad` set to None, so torch's
    optimizers and bitsandbytes' 8-bit ones leave both the parameters and their state (moments, step counts) as they
    were. The learning-rate schedule still advances by one step, and the step still counts in `global_step` (under
    fp16 loss scaling, torch's GradScaler also skips such a step, and then the schedule does not advance).

    DeepSpeed (written against DeepSpeed 0.19 ZeRO-1/2, not run here): DeepSpeed clips and steps inside `backward`,
    before `_clip_grad_norm` runs, at its optimizer's `clip_grad`, and skips non-finite steps itself. So before each
    step `clip_grad` is set to min(μ + z_thr·σ, `max_grad_norm`) (the norm where ZClip's z reaches z_thr: the same
    decision rule, with the bound itself as the clip target, since the norm is not known before the step), and ZClip
    and the skip counters are updated afterwards from the norm DeepSpeed reports. AGC is refused there.
    """

    grad_reg_state: GradRegState | None = None
    _grad_reg_capture = False  # the next log-probability computation is the policy's, inside the loss
    _grad_reg_logps = None  # (B, T) the policy's log-probabilities of the last loss computation, detached
    _kl_window = None  # (3,) [sum of per-token KL, valid tokens, completions] over the accumulation window

    def _init_grad_reg(self) -> None:
        """Called at the end of `GRPOTrainer.__init__`.

        Raises:
            ValueError: `agc` under DeepSpeed or FSDP, which keep each parameter's gradient in partitions, so no
                process holds the whole rows AGC compares.
        """
        args = self.args
        if not args.grad_reg and args.kl_target is None:
            return
        sharded = (DistributedType.DEEPSPEED, DistributedType.FSDP)
        if "agc" in args.grad_reg and self.accelerator.distributed_type in sharded:
            raise ValueError(
                f"grad_reg={args.grad_reg}: 'agc' clips each row of each weight by its own norm, which needs whole "
                f"gradients on every process; {self.accelerator.distributed_type.value} keeps them in partitions. "
                "Use 'zclip' and 'skip_nonfinite' there."
            )
        zclip = None
        if "zclip" in args.grad_reg:
            zclip = ZClip(args.zclip_alpha, args.zclip_z_threshold, args.zclip_warmup_steps)
        kl = AdaptiveKL(args.beta, args.kl_target, args.kl_horizon) if args.kl_target is not None else None
        self.grad_reg_state = GradRegState(zclip, kl)

    def hook_clip_grad_norm(self, model):
        state = self.grad_reg_state
        if state is None or not self.args.grad_reg:
            return super().hook_clip_grad_norm(model)
        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            return self._deepspeed_grad_reg(model)
        args = self.args
        units = None
        if "agc" in args.grad_reg:
            self.accelerator.unscale_gradients()  # fp16 loss scaling: AGC compares true gradients with the weights
            params = [p for name, p in model.named_parameters() if p.grad is not None and agc_applies(name)]
            units = adaptive_clip_(params, args.agc_clip, args.agc_eps)
            # gradients are whole and synchronized here (AGC is refused under DeepSpeed and FSDP)
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        else:
            norm = grad_norm(self, model)  # () the total norm over all processes, not clipped (unscaled first)
        value = float(norm)  # the same on every process
        if not math.isfinite(value):
            for p in model.parameters():
                p.grad = None
            self._count_skip(model, value)
            return norm
        state.consecutive_skips = 0
        bound, z = args.max_grad_norm, None
        if state.zclip is not None:
            clip, z = state.zclip.step(value)
            if clip is not None:
                bound = min(clip, args.max_grad_norm)
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), bound, norm)
        self._log_grad_reg(value, bound, z, units)
        return norm

    def _log_grad_reg(self, norm: float, bound: float, z: float | None, units: tuple[int, int] | None) -> None:
        train_metrics = metrics(self, "train")
        train_metrics["grad_reg/threshold"].append(bound)
        train_metrics["grad_reg/clipped"].append(float(norm > bound))
        if z is not None:
            train_metrics["grad_reg/z"].append(z)
        log_total(self, "train", "grad_reg/skipped_steps", float(self.grad_reg_state.skipped))
        if units is not None:
            train_metrics["grad_reg/agc_clipped_frac"].append(units[0] / max(units[1], 1))

    def _count_skip(self, model, norm: float) -> None:
        """Count a skipped step; after `grad_reg_max_skips` in a row, save a checkpoint and stop.

        That checkpoint is written mid-step (the weights are the last good ones, but the GRPO loop's micro-step counter
        and buffered generations are those of the failing step): it is for inspecting the run or restarting it with
        other settings, not for an exact resume.

        Raises:
            NonFiniteGradientError: the `grad_reg_max_skips`-th skipped step in a row.
        """
        state, args, step = self.grad_reg_state, self.args, self.state.global_step
        state.skipped += 1
        state.consecutive_skips += 1
        log_total(self, "train", "grad_reg/skipped_steps", float(state.skipped))
        logger.warning(
            "grad_reg: gradient norm %s at step %d: optimizer step skipped (%d in a row, %d in all)",
            norm, step, state.consecutive_skips, state.skipped,
        )  # fmt: skip
        if state.consecutive_skips < args.grad_reg_max_skips:
            return
        state.consecutive_skips = 0  # a run resumed from the checkpoint gets a fresh allowance
        checkpoint = os.path.join(output_dir(self), f"{PREFIX_CHECKPOINT_DIR}-{step}")
        complete = [os.path.isdir(checkpoint) and checkpoint_problem(checkpoint) is None]
        broadcast_object_list(complete)  # the main process's view, so that every process saves or none does
        if not complete[0]:
            save_checkpoint(self, model)
        raise NonFiniteGradientError(
            f"grad_reg: {args.grad_reg_max_skips} optimizer steps in a row (grad_reg_max_skips="
            f"{args.grad_reg_max_skips}) had a non-finite gradient norm, the last one at global step {step} "
            f"(norm {norm}); the weights of the last good step are in {checkpoint}"
        )

    def _deepspeed_grad_reg(self, model):
        """DeepSpeed ZeRO-1/2: the step is taken already (see the class docstring); update the state from its norm."""
        norm = super().hook_clip_grad_norm(model)  # DeepSpeed's norm of the step it took
        applied = self.deepspeed.optimizer.clip_grad
        if norm is None or not math.isfinite(float(norm)):
            self._count_skip(model, float("nan") if norm is None else float(norm))
            return norm
        state = self.grad_reg_state
        state.consecutive_skips = 0
        z = state.zclip.step(float(norm))[1] if state.zclip is not None else None
        self._log_grad_reg(float(norm), applied, z, None)
        return norm

    def training_step(self, model, *args, **kwargs):
        state = self.grad_reg_state
        deepspeed = self.accelerator.distributed_type == DistributedType.DEEPSPEED
        if state is not None and state.zclip is not None and deepspeed:
            spike = state.zclip.spike_threshold()
            bound = self.args.max_grad_norm if spike is None else min(spike, self.args.max_grad_norm)
            self.deepspeed.optimizer.clip_grad = bound  # DeepSpeed clips at it in the backward that steps
        return super().training_step(model, *args, **kwargs)

    def hook_get_per_token_logps_and_entropies(self, **kwargs):
        result = super().hook_get_per_token_logps_and_entropies(**kwargs)
        if self._grad_reg_capture:
            self._grad_reg_capture = False
            self._grad_reg_logps = result[0].detach()
        return result

    def hook_compute_loss(self, model, inputs):
        state = self.grad_reg_state
        if state is None or state.kl is None or not self.model.training:
            return super().hook_compute_loss(model, inputs)
        self.beta = state.kl.beta  # this optimizer step's β (also right after a resume); TRL's loss reads it
        self._grad_reg_capture, self._grad_reg_logps = True, None  # TRL's loss first computes the policy's
        try:
            loss = super().hook_compute_loss(model, inputs)
        finally:
            logps, self._grad_reg_capture, self._grad_reg_logps = self._grad_reg_logps, False, None
        self._observe_kl(inputs, logps)
        return loss

    def _observe_kl(self, inputs: dict, logps: torch.Tensor) -> None:
        """Add this micro-batch's KL to the window; at the window's end, update β from the mean over all processes."""
        mask = inputs["completion_mask"]  # (B, T)
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mask = mask.float()
        kl = per_token_kl(logps, inputs["ref_per_token_logps"])  # (B, T) nats
        kl = torch.where(mask > 0, kl, 0.0)  # padding may hold anything, even inf
        stats = torch.stack([kl.sum(), mask.sum(), torch.tensor(float(mask.size(0)), device=mask.device)])
        self._kl_window = stats if self._kl_window is None else self._kl_window + stats
        if not self.accelerator.sync_gradients:
            return
        kl_sum, tokens, completions = self.accelerator.reduce(self._kl_window, reduction="sum").tolist()
        self._kl_window = None
        kl_state = self.grad_reg_state.kl
        metrics(self, "train")["kl_coef"].append(kl_state.beta)  # the β this step's loss used
        self.beta = kl_state.update(kl_sum / max(tokens, 1.0), round(completions))
