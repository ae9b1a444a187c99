"""The one place where trl_grpo_ext touches TRL's and transformers' private API, and the check that it still fits.

TRL's `GRPOTrainer` has no public extension points for what this package changes, so some of its private methods
are overridden and some private attributes are read. All of that happens in this package and nowhere else in
trl_grpo_ext; its modules split it by role:

    `surface`                 what is touched (`PRIVATE_METHODS`, `PRIVATE_ATTRIBUTES`, `TRANSFORMERS_INTERNALS`,
                              `ACCELERATE_INTERNALS`, `REPEAT_SAMPLER_FIELDS`), the versions (`WRITTEN_AGAINST`,
                              `SUPPORTED`) and `check_contact_surface`, the check run when this package is imported
    `hooks`                   `TRLContact`, the base of `trl_grpo_ext.GRPOTrainer` and the only class that overrides a
                              private method: each override forwards to a public hook of the same name without the
                              underscore and with a `hook_` prefix (`_compute_loss` -> `hook_compute_loss`,
                              `hook_name`). The features (policy groups, entropy and gradient regularization, fast
                              generation, exact resume) override the hooks and call `super()`; the chain ends there,
                              in TRL's method.
    `accessors`               the only readers and writers of private attributes (`metrics`, `log_total`, `loss_mask`,
                              `micro_step`, `buffered_inputs`, `output_dir`, `grad_norm`, `save_checkpoint`,
                              `save_model_files`, `skip_optimizer_step`, `stop_memory_tracking`,
                              `repeat_sampler_fields`, `raised_in_training_loop`, ...)
    `loop_state`              `GRPOLoopState`, the training loop's state that TRL and transformers do not checkpoint
    `generation_internals`    what fast generation uses of transformers' internals (`compile_config_all_devices`,
                              `compiles_in_one_graph`, `generate_cache_argument`, `drop_repeated_input_grad_hooks`,
                              `generation_defaults`) and reads of torch's (`compile_counters`: recompile-limit hits,
                              CUDA-graph skips)
    `deepspeed_internals`     what gradient regularization reads and writes of a DeepSpeed engine (its skipped
                              steps, its clip threshold), checked when the trainer first meets an engine
    `vllm_internals`          what adapter-only LoRA sync uses of TRL's colocated vLLM (the engine's arguments, the
                              sync and the generate call of its `VLLMGeneration`, `VLLM_INTERNALS`) and vLLM's
                              allowed LoRA ranks (`engine_arguments`, `adapter_generation`, `vllm_lora_ranks`)

`check_contact_surface()` runs when this package is imported: every private method must exist with the parameters
it was written against, every private attribute must still be set where it was, every transformers internal of
`TRANSFORMERS_INTERNALS` and torch internal of `TORCH_INTERNALS` must exist, TRL's vLLM source must hold
`VLLM_INTERNALS`, and no hook name may collide with a name
TRL has. A mismatch raises
`TRLCompatibilityError` naming the method or attribute and the supported versions, so an upgrade fails at import
instead of silently changing training. Versions outside `SUPPORTED` whose surface still matches only log a warning.

Every public name of the modules is importable from here (`from trl_grpo_ext.trl_contact import metrics`), as when
this was one module. Written against trl 1.16.0 and transformers 5.24.0 (`WRITTEN_AGAINST`); the test suite also
runs against the oldest versions `SUPPORTED` allows (`.ci/run`).
"""

from .accessors import (
    buffered_inputs,
    grad_norm,
    high_entropy_mask,
    log_total,
    loss_mask,
    metrics,
    micro_step,
    output_dir,
    per_token_logps_and_entropies,
    raised_in_training_loop,
    repeat_sampler_fields,
    save_checkpoint,
    save_model_files,
    skip_optimizer_step,
    stop_memory_tracking,
    to_device,
)
from .deepspeed_internals import (
    DEEPSPEED_ATTRIBUTES,
    check_deepspeed_engine,
    deepspeed_clip,
    deepspeed_guard_problem,
    deepspeed_skipped_steps,
    set_deepspeed_clip,
)
from .generation_internals import (
    compile_config_all_devices,
    compile_counters,
    compiles_in_one_graph,
    drop_repeated_input_grad_hooks,
    generate_cache_argument,
    generation_defaults,
)
from .hooks import TRLContact, hook_name
from .loop_state import GRPOLoopState
from .surface import (
    ACCELERATE_INTERNALS,
    ATTRIBUTE_OWNERS,
    FORWARD_KEYS,
    PRIVATE_ATTRIBUTES,
    PRIVATE_METHODS,
    REPEAT_SAMPLER_FIELDS,
    SUPPORTED,
    TORCH_INTERNALS,
    TRANSFORMERS_INTERNALS,
    WRITTEN_AGAINST,
    TRLCompatibilityError,
    check_contact_surface,
)
from .vllm_internals import (
    VLLM_INTERNALS,
    LoRAEngine,
    adapter_generation,
    engine_arguments,
    missing_vllm_internals,
    vllm_lora_ranks,
)

__all__ = [
    "ACCELERATE_INTERNALS",
    "ATTRIBUTE_OWNERS",
    "DEEPSPEED_ATTRIBUTES",
    "FORWARD_KEYS",
    "PRIVATE_ATTRIBUTES",
    "PRIVATE_METHODS",
    "REPEAT_SAMPLER_FIELDS",
    "SUPPORTED",
    "TORCH_INTERNALS",
    "TRANSFORMERS_INTERNALS",
    "VLLM_INTERNALS",
    "WRITTEN_AGAINST",
    "GRPOLoopState",
    "LoRAEngine",
    "TRLCompatibilityError",
    "TRLContact",
    "adapter_generation",
    "buffered_inputs",
    "check_contact_surface",
    "check_deepspeed_engine",
    "compile_config_all_devices",
    "compile_counters",
    "compiles_in_one_graph",
    "deepspeed_clip",
    "deepspeed_guard_problem",
    "deepspeed_skipped_steps",
    "drop_repeated_input_grad_hooks",
    "engine_arguments",
    "generate_cache_argument",
    "generation_defaults",
    "grad_norm",
    "high_entropy_mask",
    "hook_name",
    "log_total",
    "loss_mask",
    "metrics",
    "micro_step",
    "missing_vllm_internals",
    "output_dir",
    "per_token_logps_and_entropies",
    "raised_in_training_loop",
    "repeat_sampler_fields",
    "save_checkpoint",
    "save_model_files",
    "skip_optimizer_step",
    "set_deepspeed_clip",
    "stop_memory_tracking",
    "to_device",
    "vllm_lora_ranks",
]

check_contact_surface()
