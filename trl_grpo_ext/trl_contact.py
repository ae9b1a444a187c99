"""The one place where trl_grpo_ext touches TRL's and transformers' private API, and the check that it still fits.

TRL's `GRPOTrainer` has no public extension points for what this package changes, so some of its private methods
are overridden and some private attributes are read. All of that happens here and nowhere else in the package:

- `TRLContact`, the base of `trl_grpo_ext.GRPOTrainer`, is the only class that overrides a private method
  (`PRIVATE_METHODS`). Each override forwards to a public hook of the same name without the underscore and with a
  `hook_` prefix (`_compute_loss` -> `hook_compute_loss`). The features (policy groups, entropy and gradient
  regularization, fast generation, exact resume) override the hooks and call `super()`; the chain ends here, in
  TRL's method.
- The functions below (`metrics`, `micro_step`, `output_dir`, `grad_norm`, `save_checkpoint`, `stop_memory_tracking`,
  `repeat_sampler_fields`, `GRPOLoopState`, ...) are the only readers and writers of private attributes.
- `check_contact_surface()` runs when this module is imported: every private method must exist with the parameters
  it was written against, every private attribute must still be set where it was, every transformers internal of
  `TRANSFORMERS_INTERNALS` must exist, and no hook name may collide with a name TRL has. A mismatch raises
  `TRLCompatibilityError` naming the method or attribute and the supported versions, so an upgrade fails at import
  instead of silently changing training. Versions outside `SUPPORTED` whose surface still matches only log a warning.

Written against trl 1.16.0 and transformers 5.24.0 (`WRITTEN_AGAINST`); the test suite also runs against the oldest
versions `SUPPORTED` allows (`.ci/run`).
"""

import inspect
import logging
from importlib.metadata import version
from pathlib import Path

import torch
import transformers
from packaging.specifiers import SpecifierSet
from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer
from trl.trainer.utils import RepeatSampler

logger = logging.getLogger(__name__)

WRITTEN_AGAINST = {"trl": "1.16.0", "transformers": "5.24.0"}
# The ranges pyproject.toml allows and CI tests (the newest and the oldest release of each; README.md says why
# transformers starts at 5.18).
SUPPORTED = {"trl": ">=1.16,<1.17", "transformers": ">=5.18,<6"}


class TRLCompatibilityError(ImportError):
    """The installed TRL or transformers differs from what trl_grpo_ext overrides or reads; the message names the
    method or attribute, the installed versions and the supported ones."""


# The keyword arguments of TRL's `_get_per_token_logps_and_entropies` that carry a batch's multimodal fields, passed
# by name when trl_grpo_ext computes log-probabilities itself (`entropy.feature.EntropyReg._window_logps`).
FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
                "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")  # fmt: skip
# name -> (owner and the version it was written against, leading parameters (self first), parameters needed by name)
PRIVATE_METHODS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "_generate_and_score_completions": ("trl 1.16.0 GRPOTrainer", ("self", "inputs"), ()),
    "_calculate_rewards": (
        "trl 1.16.0 GRPOTrainer",
        ("self", "inputs", "prompts", "completions", "completion_ids_list"),
        (),
    ),
    "_get_per_token_logps_and_entropies": (
        "trl 1.16.0 GRPOTrainer",
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep"),
        ("compute_entropy", *FORWARD_KEYS),
    ),
    "_compute_loss": ("trl 1.16.0 GRPOTrainer", ("self", "model", "inputs"), ()),
    "_generate_single_turn": ("trl 1.16.0 GRPOTrainer", ("self", "prompt_ids"), ()),
    "_get_train_sampler": ("trl 1.16.0 GRPOTrainer", ("self", "dataset"), ()),
    "_save_checkpoint": ("trl 1.16.0 GRPOTrainer", ("self", "model", "trial"), ()),
    "_load_optimizer_and_scheduler": ("trl 1.16.0 GRPOTrainer", ("self", "checkpoint"), ()),
    "_load_rng_state": ("transformers 5.24.0 Trainer", ("self", "checkpoint"), ()),
    "_clip_grad_norm": ("transformers 5.24.0 Trainer", ("self", "model"), ()),
    # called, not overridden
    "_get_grad_norm": ("transformers 5.24.0 Trainer", ("self", "model"), ()),
    "_get_output_dir": ("transformers 5.24.0 Trainer", ("self", "trial"), ()),
}
# instance attributes read or written, and the class whose source sets them (trl 1.16.0 GRPOTrainer, transformers
# 5.24.0 Trainer: `ATTRIBUTE_OWNERS`)
PRIVATE_ATTRIBUTES: dict[str, type] = {
    "_step": TRLGRPOTrainer,  # micro-steps since the start: which buffered batch a micro-step trains on
    "_buffered_inputs": TRLGRPOTrainer,  # the generation batch split into `steps_per_generation` micro-batches
    "_metrics": TRLGRPOTrainer,  # {"train"|"eval": {name: [values since the last log]}}
    "_tr_loss": transformers.Trainer,  # running loss since the last log (a 0-d tensor)
    "_globalstep_last_logged": transformers.Trainer,
    "_memory_tracker": transformers.Trainer,  # memory metrics of a `train()` call, started where it starts
}
ATTRIBUTE_OWNERS = {TRLGRPOTrainer: "trl 1.16.0 GRPOTrainer", transformers.Trainer: "transformers 5.24.0 Trainer"}
# transformers internals that the opt-in fast generation (`trl_grpo_ext.generation`) uses, each written against
# transformers 5.24.0 (and present from 5.18): `compile_config_all_devices`, `compiles_in_one_graph` and
# `drop_repeated_input_grad_hooks` below.
TRANSFORMERS_INTERNALS = (
    "CompileConfig._compile_all_devices",  # compile the decode step off CUDA
    "PreTrainedModel._can_compile_fullgraph",  # whether a model class compiles in one graph
    "PreTrainedModel.enable_input_require_grads registers make_inputs_require_grads",  # the hook found by name
)
REPEAT_SAMPLER_FIELDS = ("generator", "seed", "num_samples", "shuffle")


def _versions() -> str:
    installed = ", ".join(f"{name} {version(name)}" for name in SUPPORTED)
    supported = ", ".join(f"{name}{spec}" for name, spec in SUPPORTED.items())
    return f"installed: {installed}; supported: {supported}"


def hook_name(method: str) -> str:
    """The public hook a private method forwards to: `_compute_loss` -> `hook_compute_loss`."""
    return "hook_" + method.lstrip("_")


def check_contact_surface(
    trainer_class: type = TRLGRPOTrainer,
    sampler_class: type = RepeatSampler,
    compile_config_class: type | None = None,
    model_class: type = transformers.PreTrainedModel,
) -> None:
    """Check that TRL's trainer still has every private method and attribute this package relies on, and
    transformers every internal in `TRANSFORMERS_INTERNALS`.

    Args:
        trainer_class: the class to check (TRL's `GRPOTrainer`; a test passes a changed subclass).
        sampler_class: TRL's `RepeatSampler`, whose fields `EpochSeededSampler` reseeds.
        compile_config_class: transformers' `CompileConfig` (None: the installed one).
        model_class: transformers' `PreTrainedModel`.

    Raises:
        TRLCompatibilityError: a method is missing or its leading parameters differ, a needed keyword parameter is
            gone, a private attribute is no longer set by the class that set it, a sampler field is missing, a
            transformers internal is gone, or a hook name is taken by TRL. The message names it, the version it
            was written against and the supported versions.
    """
    problems = []
    for name, (owner, leading, named) in PRIVATE_METHODS.items():
        method = getattr(trainer_class, name, None)
        if not callable(method):
            problems.append(f"{owner}.{name} is gone")
            continue
        parameters = list(inspect.signature(method).parameters)
        if tuple(parameters[: len(leading)]) != leading or any(p not in parameters for p in named):
            problems.append(f"{owner}.{name}{tuple(parameters)} no longer starts with {leading} (and has {named})")
        if name in TRLContact.__dict__ and hasattr(trainer_class, hook_name(name)):
            problems.append(f"TRL now has {hook_name(name)}, the name of this package's hook for {name}")
    sources = {}
    for attribute, owner in PRIVATE_ATTRIBUTES.items():
        owner = trainer_class if owner is TRLGRPOTrainer else owner
        if owner not in sources:  # the source files of the class and its TRL/transformers bases
            files = {
                inspect.getsourcefile(c) for c in owner.__mro__ if c.__module__.startswith(("trl.", "transformers."))
            }
            sources[owner] = "".join(Path(f).read_text() for f in sorted(files))
        if f"self.{attribute} =" not in sources[owner]:
            written = ATTRIBUTE_OWNERS.get(PRIVATE_ATTRIBUTES[attribute], "")
            problems.append(f"{owner.__name__} no longer sets self.{attribute} (written against {written})")
    sampler = sampler_class(range(2), mini_repeat_count=1, seed=0)
    problems += [f"RepeatSampler has no field {f!r}" for f in REPEAT_SAMPLER_FIELDS if not hasattr(sampler, f)]
    problems += _missing_transformers_internals(compile_config_class, model_class)
    if problems:
        raise TRLCompatibilityError(
            "trl_grpo_ext does not fit this TRL/transformers (" + _versions() + "): " + "; ".join(problems)
        )
    for name, spec in SUPPORTED.items():
        if version(name) not in SpecifierSet(spec):
            logger.warning("trl_grpo_ext is tested with %s%s, not %s %s", name, spec, name, version(name))


class TRLContact(TRLGRPOTrainer):
    """TRL's `GRPOTrainer` with each private method this package extends forwarded to a public hook.

    `_x(...)` calls `self.hook_x(...)`; `hook_x` here calls TRL's `_x`. Features override `hook_x` and call `super()`.
    `hook_get_per_token_logps_and_entropies` receives every argument by name (`compute_entropy` included, however
    TRL passed it).
    """

    _tag_names = [*TRLGRPOTrainer._tag_names, "trl-grpo-ext"]

    def _generate_and_score_completions(self, inputs):
        return self.hook_generate_and_score_completions(inputs)

    def hook_generate_and_score_completions(self, inputs):
        return super()._generate_and_score_completions(inputs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return self.hook_calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def hook_calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        bound = _LOGPS_SIGNATURE.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments["self"]
        return self.hook_get_per_token_logps_and_entropies(**arguments)

    def hook_get_per_token_logps_and_entropies(self, **kwargs):
        return super()._get_per_token_logps_and_entropies(**kwargs)

    def _compute_loss(self, model, inputs):
        return self.hook_compute_loss(model, inputs)

    def hook_compute_loss(self, model, inputs):
        return super()._compute_loss(model, inputs)

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        return self.hook_generate_single_turn(prompt_ids, *args, **kwargs)

    def hook_generate_single_turn(self, prompt_ids, *args, **kwargs):
        return super()._generate_single_turn(prompt_ids, *args, **kwargs)

    def _get_train_sampler(self, dataset=None):
        return self.hook_get_train_sampler(dataset)

    def hook_get_train_sampler(self, dataset=None):
        return super()._get_train_sampler(dataset)

    def _save_checkpoint(self, model, trial):
        return self.hook_save_checkpoint(model, trial)

    def hook_save_checkpoint(self, model, trial):
        return super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        return self.hook_load_optimizer_and_scheduler(checkpoint)

    def hook_load_optimizer_and_scheduler(self, checkpoint):
        return super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint):
        return self.hook_load_rng_state(checkpoint)

    def hook_load_rng_state(self, checkpoint):
        return super()._load_rng_state(checkpoint)

    def _clip_grad_norm(self, model):
        return self.hook_clip_grad_norm(model)

    def hook_clip_grad_norm(self, model):
        return super()._clip_grad_norm(model)


_LOGPS_SIGNATURE = inspect.signature(TRLGRPOTrainer._get_per_token_logps_and_entropies)


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


class GRPOLoopState:
    """The training loop's state that TRL and transformers do not checkpoint: the micro-step counter `_step`, the
    buffered generations reused for `steps_per_generation * num_iterations` micro-steps, and what was gathered since
    the last log (with `logging_steps > 1`): TRL's metrics and transformers' running loss.

    Restored tensors go to the trainer's device (`accelerator.device`) with their saved dtypes: the state file is read
    onto the CPU, and the buffered batch is fed to the model as it is.
    """

    def __init__(self, trainer: TRLGRPOTrainer):
        self.trainer = trainer

    def state_dict(self) -> dict:
        trainer = self.trainer
        return {
            "step": trainer._step,
            "buffered_inputs": trainer._buffered_inputs,
            "pending_metrics": {key: list(values) for key, values in trainer._metrics["train"].items()},
            "pending_loss": trainer._tr_loss.item(),
            "last_logged_step": trainer._globalstep_last_logged,
        }

    def load_state_dict(self, state: dict) -> None:
        trainer = self.trainer
        trainer._step = state["step"]
        trainer._buffered_inputs = to_device(state["buffered_inputs"], trainer.accelerator.device)
        trainer._metrics["train"].clear()
        trainer._metrics["train"].update(state["pending_metrics"])
        # transformers resets its running loss after this runs: `restore_pending_loss` puts it back.
        trainer._trl_grpo_ext_pending_loss = (state["pending_loss"], state["last_logged_step"])

    @staticmethod
    def restore_pending_loss(trainer: transformers.Trainer) -> None:
        """Add the running loss of a resumed checkpoint back; call once transformers has reset it (in
        `_load_rng_state`, where the resumed run rejoins the uninterrupted one)."""
        pending = getattr(trainer, "_trl_grpo_ext_pending_loss", None)
        if pending is not None:
            trainer._tr_loss += pending[0]
            trainer._globalstep_last_logged = pending[1]
            trainer._trl_grpo_ext_pending_loss = None


def _missing_transformers_internals(compile_config_class: type | None, model_class: type) -> list[str]:
    """The entries of `TRANSFORMERS_INTERNALS` that `compile_config_class` / `model_class` lack, as problems."""
    if compile_config_class is None:
        from transformers.generation.configuration_utils import CompileConfig as compile_config_class
    found = (
        "_compile_all_devices" in vars(compile_config_class),
        hasattr(model_class, "_can_compile_fullgraph"),
        f"def {_GRAD_HOOK}(" in inspect.getsource(model_class.enable_input_require_grads),
    )
    return [f"transformers {name} is gone (written against 5.24.0)" for name, ok in zip(TRANSFORMERS_INTERNALS, found,
                                                                                   strict=True) if not ok]  # fmt: skip


def compile_config_all_devices():
    """transformers' `CompileConfig` for a compiled decode step off CUDA (`_compile_all_devices`, private).

    Raises:
        RuntimeError: this transformers' `CompileConfig` lacks `_compile_all_devices`.
    """
    from transformers.generation.configuration_utils import CompileConfig

    if "_compile_all_devices" not in vars(CompileConfig):
        raise RuntimeError(
            "generation_compile on a non-CUDA device relies on transformers' CompileConfig._compile_all_devices, "
            "which this transformers version does not have: use a CUDA device or turn generation_compile off"
        )
    config = CompileConfig(mode="default")  # "reduce-overhead" adds CUDA graphs, which exist on CUDA only
    config._compile_all_devices = True
    return config


def compiles_in_one_graph(model_class: type) -> bool:
    """transformers' private flag `_can_compile_fullgraph` of a model class (whether its tests compile the forward
    in one graph; its presence is checked at import, `TRANSFORMERS_INTERNALS`)."""
    return model_class._can_compile_fullgraph


def generate_cache_argument(model: torch.nn.Module) -> str:
    """The keyword under which `model.generate` takes a cache of the caller's: `cache` from transformers 5.2x,
    `past_key_values` before (`generate` accepts the old name only with a deprecation warning). Read from the cache
    parameter of the model's `forward`, else (a `forward` that takes `**kwargs`) from transformers'
    `prepare_inputs_for_generation`. `model` is a transformers model (for a PEFT model, its base model).

    Raises:
        ValueError: neither names a cache parameter (the message names the model class).
    """
    from transformers.generation.utils import GenerationMixin

    for function in (type(model).forward, GenerationMixin.prepare_inputs_for_generation):
        parameters = inspect.signature(function).parameters
        for name in ("cache", "past_key_values"):
            if name in parameters:
                return name
    raise ValueError(
        f"generation_compile=True hands generate a static cache, but {type(model).__name__}.forward takes no cache "
        "argument (neither 'cache' nor 'past_key_values'): set generation_compile=False for this model"
    )


_GRAD_HOOK = "make_inputs_require_grads"  # transformers' PreTrainedModel.enable_input_require_grads


def drop_repeated_input_grad_hooks(model: torch.nn.Module) -> int:
    """Remove all but the newest of transformers' `make_inputs_require_grads` forward hooks on the input embeddings;
    return how many were removed.

    transformers 5 registers that hook (it sets requires_grad on the embeddings' output) each time gradient
    checkpointing is enabled, and removes none when it is disabled on a model that is not a transformers-integrated
    PEFT model. TRL 1.16 disables and re-enables checkpointing around every generation and every no-grad
    log-probability pass, so stock training gains two identical hooks per step, and each is called on every forward,
    decoded tokens included. For a compiled decode step the growing hook count is also a guard that fails at every
    step: without this, the decode step recompiles once per step, until torch gives up and runs it uncompiled. The
    hooks are idempotent, so keeping one changes no value.
    """
    embeddings = model.get_input_embeddings()
    hook_ids = [key for key, fn in embeddings._forward_hooks.items() if getattr(fn, "__name__", "") == _GRAD_HOOK]
    for key in hook_ids[:-1]:
        for hooks in (embeddings._forward_hooks, embeddings._forward_hooks_with_kwargs,
                      embeddings._forward_hooks_always_called):  # fmt: skip
            hooks.pop(key, None)
    return max(len(hook_ids) - 1, 0)


check_contact_surface()
