"""The transformers and torch internals the opt-in fast generation (`trl_grpo_ext.generation`) and the GSM8K
evaluation use.

transformers', each written against transformers 5.24.0 (and present from 5.18) and checked at import
(`surface.TRANSFORMERS_INTERNALS`): the compile config off CUDA, the full-graph flag of a model class, the cache
keyword of `generate`, the repeated input-grad hooks of gradient checkpointing, and the defaults of every generation
setting.

torch's (`TORCH_INTERNALS` in `surface`, checked at import): dynamo's counters, where torch records that a compiled
function hit its recompile limit or ran without its CUDA graph. Neither is an error, and neither has a public API in
torch 2.13: the counters are how torch's own tests and `torch._dynamo.utils` report them."""

import inspect

import torch


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


def generation_defaults() -> dict:
    """transformers' default of every generation setting it fills in when neither the call nor the model's
    `generation_config.json` sets it (`GenerationConfig._get_default_generation_params`, private): name -> value.
    The GSM8K evaluation sets each of them explicitly (`gsm8k.eval_generation.decoding_settings`)."""
    from transformers import GenerationConfig

    return GenerationConfig._get_default_generation_params()


_RECOMPILE_LIMIT = "Dynamo recompile limit exceeded"  # the start of dynamo's graph-break message for a limit hit


def compile_counters() -> tuple[int, int]:
    """(recompile-limit hits, CUDA-graph skips) in this process so far: the `unimplemented` entries of
    `torch._dynamo.utils.counters` whose message is a recompile-limit hit (one per function given up on), and
    `counters["inductor"]["cudagraph_skips"]` (one per skipped graph; `torch._inductor.cudagraph_utils`)."""
    from torch._dynamo.utils import counters

    hits = sum(n for message, n in counters["unimplemented"].items() if message.startswith(_RECOMPILE_LIMIT))
    return hits, counters["inductor"]["cudagraph_skips"]
