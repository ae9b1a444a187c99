"""The contact surface and its import-time check: what of TRL's and transformers' private API this package uses
(`PRIVATE_METHODS`, `PRIVATE_ATTRIBUTES`, `TRANSFORMERS_INTERNALS`, `REPEAT_SAMPLER_FIELDS`), the versions it was
written against (`WRITTEN_AGAINST`) and tested with (`SUPPORTED`), and `check_contact_surface`, which the package runs
when it is imported.

A mismatch raises `TRLCompatibilityError` naming the method or attribute and the supported versions, so an upgrade
fails at import instead of silently changing training. Versions outside `SUPPORTED` whose surface still matches only
log a warning (on the logger `trl_grpo_ext.trl_contact`).
"""

import inspect
import logging
from importlib.metadata import version
from pathlib import Path

import transformers
from packaging.specifiers import SpecifierSet
from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer
from trl.trainer.utils import RepeatSampler

from .generation_internals import _GRAD_HOOK
from .hooks import TRLContact, hook_name
from .vllm_internals import missing_vllm_internals

logger = logging.getLogger(__package__)  # "trl_grpo_ext.trl_contact", the logger's name before the split

WRITTEN_AGAINST = {"trl": "1.16.0", "transformers": "5.24.0"}
# The ranges pyproject.toml allows and CI tests (the newest and the oldest release of each; docs/layout.md says why
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
    "save_model": ("transformers 5.24.0 Trainer", ("self", "output_dir", "_internal_call"), ()),  # its private flag
    # looked for on a traceback (`accessors.raised_in_training_loop`)
    "_inner_training_loop": ("transformers 5.24.0 Trainer", ("self", "batch_size"), ()),
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
# `drop_repeated_input_grad_hooks` in `generation_internals`.
TRANSFORMERS_INTERNALS = (
    "CompileConfig._compile_all_devices",  # compile the decode step off CUDA
    "PreTrainedModel._can_compile_fullgraph",  # whether a model class compiles in one graph
    "PreTrainedModel.enable_input_require_grads registers make_inputs_require_grads",  # the hook found by name
    "GenerationConfig._get_default_generation_params",  # the defaults the GSM8K evaluation sets explicitly
)
# torch internals fast generation reads (`generation_internals.compile_counters`), written against torch 2.13
TORCH_INTERNALS = (
    "torch._dynamo.utils.counters",  # dynamo's and inductor's running counts: recompile-limit hits, CUDA-graph skips
)
# accelerate internals the non-finite guard writes (`accessors.skip_optimizer_step`), written against accelerate 1.13
ACCELERATE_INTERNALS = (
    "AcceleratedOptimizer._is_overflow, read by its step_was_skipped",  # a skipped step leaves the LR schedule
)
REPEAT_SAMPLER_FIELDS = ("generator", "seed", "num_samples", "shuffle")


def _versions() -> str:
    installed = ", ".join(f"{name} {version(name)}" for name in SUPPORTED)
    supported = ", ".join(f"{name}{spec}" for name, spec in SUPPORTED.items())
    return f"installed: {installed}; supported: {supported}"


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
            transformers or torch internal is gone, TRL's colocated vLLM no longer builds, syncs or generates as
            `vllm_internals.VLLM_INTERNALS` says, or a hook name is taken by TRL. The message names it, the
            version it was written against and the supported versions.
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
    problems += _missing_torch_internals()
    problems += _missing_accelerate_internals()
    problems += missing_vllm_internals(trainer_class)
    if problems:
        raise TRLCompatibilityError(
            "trl_grpo_ext does not fit this TRL/transformers (" + _versions() + "): " + "; ".join(problems)
        )
    for name, spec in SUPPORTED.items():
        if version(name) not in SpecifierSet(spec):
            logger.warning("trl_grpo_ext is tested with %s%s, not %s %s", name, spec, name, version(name))


def _missing_transformers_internals(compile_config_class: type | None, model_class: type) -> list[str]:
    """The entries of `TRANSFORMERS_INTERNALS` that `compile_config_class` / `model_class` lack, as problems."""
    if compile_config_class is None:
        from transformers.generation.configuration_utils import CompileConfig as compile_config_class
    found = (
        "_compile_all_devices" in vars(compile_config_class),
        hasattr(model_class, "_can_compile_fullgraph"),
        f"def {_GRAD_HOOK}(" in inspect.getsource(model_class.enable_input_require_grads),
        callable(getattr(transformers.GenerationConfig, "_get_default_generation_params", None)),
    )
    return [f"transformers {name} is gone (written against 5.24.0)" for name, ok in zip(TRANSFORMERS_INTERNALS, found,
                                                                                   strict=True) if not ok]  # fmt: skip


def _missing_accelerate_internals() -> list[str]:
    """The entries of `ACCELERATE_INTERNALS` this accelerate lacks, as problems."""
    from accelerate.optimizer import AcceleratedOptimizer

    reads = "self._is_overflow" in inspect.getsource(AcceleratedOptimizer.step_was_skipped.fget)
    return [] if reads else [f"accelerate {ACCELERATE_INTERNALS[0]} is gone (written against 1.13)"]


def _missing_torch_internals() -> list[str]:
    """The entries of `TORCH_INTERNALS` this torch lacks, as problems."""
    from torch._dynamo import utils

    counters = getattr(utils, "counters", None)
    if isinstance(counters, dict) and isinstance(counters["inductor"], dict):
        return []
    return ["torch._dynamo.utils.counters is gone or no longer a mapping of counts (written against torch 2.13)"]
