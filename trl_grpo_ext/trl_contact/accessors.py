"""The readers and writers of TRL's and transformers' private trainer attributes and methods (the only ones in the
package): TRL's metrics, the loss mask, the micro-step counter, the buffered generation batch, the checkpoint folder,
the gradient norm, writing a checkpoint, the memory tracker, the fields of TRL's `RepeatSampler`, whether an error
came from the training loop."""

import traceback

import torch
import transformers
from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer

from .surface import FORWARD_KEYS


def metrics(trainer: TRLGRPOTrainer, mode: str) -> dict[str, list]:
    """TRL's metrics since the last log for `mode` ("train" or "eval"): name -> values, averaged at logging."""
    return trainer._metrics[mode]


def log_total(trainer: TRLGRPOTrainer, mode: str, name: str, value: float) -> None:
    """Log `name` as its value at the last step: a running total (a count since the start) or a state (the training
    stage). TRL logs the mean of each metric's values since the last log; the newest value is kept as the only one,
    so with `logging_steps > 1` the logged value is the one at the last step, not the mean since the last log (0.5
    for a total that went from 0 to 1)."""
    metrics(trainer, mode)[name][:] = [value]


def loss_mask(batch: dict) -> torch.Tensor:
    """(B, T) the completion tokens of TRL's batch that its loss counts: `completion_mask`, times `tool_mask` when
    there is one. It is the mask of TRL's `entropy` metric and entropy bonus; with `mask_truncated_completions` a
    truncated completion has no token in it (TRL zeroes both masks)."""
    return batch["completion_mask"] if "tool_mask" not in batch else batch["completion_mask"] * batch["tool_mask"]


def high_entropy_mask(trainer: TRLGRPOTrainer, entropies: torch.Tensor, batch: dict) -> torch.Tensor | None:
    """(B, T) bool: the tokens of `batch` TRL's policy loss keeps under `top_entropy_quantile` < 1 (arXiv:2506.01939:
    those at or above the quantile of the token entropies `entropies` (B, T) over every process: TRL's
    `get_high_entropy_mask`, a collective all processes must call), None at 1 (TRL keeps every token)."""
    quantile = trainer.top_entropy_quantile
    if quantile >= 1.0:
        return None
    return trainer.get_high_entropy_mask(entropies, loss_mask(batch), 1 - quantile)


def micro_step(trainer: TRLGRPOTrainer) -> int:
    """TRL's count of training micro-steps (forward-backward passes) since the start, checkpointed by us."""
    return trainer._step


def buffered_inputs(trainer: TRLGRPOTrainer) -> list[dict]:
    """TRL's current generation batch, split into `steps_per_generation` micro-batches (dicts of tensors); micro-step
    `t` trains on item `t % steps_per_generation`."""
    return trainer._buffered_inputs


def output_dir(trainer: transformers.Trainer, trial=None) -> str:
    """The folder checkpoints go to (transformers' `_get_output_dir`)."""
    return trainer._get_output_dir(trial=trial)


def grad_norm(trainer: transformers.Trainer, model: torch.nn.Module) -> torch.Tensor:
    """() the total gradient norm over all processes, before clipping (transformers' `_get_grad_norm`)."""
    return trainer._get_grad_norm(model)


def per_token_logps_and_entropies(trainer: TRLGRPOTrainer, model, batch: dict, compute_entropy: bool) -> tuple:
    """TRL's per-token log-probabilities (B, T) and entropies (B, T) or None of a training `batch`'s completions (its
    `prompt_ids`/`completion_ids` and masks, and the multimodal `FORWARD_KEYS` it holds), through our hooks."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return trainer._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, batch["completion_ids"].size(1), compute_entropy=compute_entropy,
        **{key: batch.get(key) for key in FORWARD_KEYS},
    )  # fmt: skip


def save_checkpoint(trainer: transformers.Trainer, model: torch.nn.Module) -> None:
    """Write a checkpoint now, as the training loop does at `save_steps`."""
    trainer._save_checkpoint(model, trial=None)


def skip_optimizer_step(trainer: transformers.Trainer, skipped: bool) -> None:
    """Tell accelerate whether this optimizer step is skipped (`AcceleratedOptimizer._is_overflow`, which its
    `step_was_skipped` reads; only its GradScaler path sets it otherwise), as its loss scaler and DeepSpeed do for a
    step they skip: transformers then leaves the learning-rate scheduler where it is (`optimizer_step_was_skipped`)."""
    trainer.optimizer._is_overflow = skipped


def save_model_files(save_model, folder: str) -> None:
    """transformers' `Trainer.save_model` (`save_model`: the bound method, e.g. `super().save_model`) into `folder` as
    its own checkpoints call it (`_internal_call=True`): without pushing to the Hub from inside it."""
    save_model(folder, _internal_call=True)


def stop_memory_tracking(trainer: transformers.Trainer, metrics: dict) -> None:
    """End the memory tracking `Trainer.train` started and add its metrics to `metrics` (a no-op unless
    `skip_memory_metrics=False`); for a `train()` call that returns before transformers' own end of training."""
    trainer._memory_tracker.stop_and_update_metrics(metrics)


def repeat_sampler_fields(sampler) -> tuple[torch.Generator | None, int | None, int, bool]:
    """(generator, seed, num_samples, shuffle) of TRL's `RepeatSampler` (checked at import)."""
    return sampler.generator if sampler.shuffle else None, sampler.seed, sampler.num_samples, sampler.shuffle


def to_device(value, device: torch.device):
    """`value` (tensors in nested dicts, lists and tuples) with every tensor moved to `device`, dtypes kept."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_device(item, device) for item in value)
    return value


def raised_in_training_loop(error: BaseException) -> bool:
    """Whether `error` was raised inside transformers' training loop (`Trainer._inner_training_loop` is on its
    traceback): after the model, data and optimizer were set up, while steps run (a reward function, a training step,
    a callback, a checkpoint). The checks `Trainer.train` makes before it (a resume path) are not in it."""
    loop = transformers.Trainer._inner_training_loop.__code__
    return any(frame.f_code is loop for frame, _ in traceback.walk_tb(error.__traceback__))
