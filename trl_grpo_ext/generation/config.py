"""The settings of fast generation: the fields `GRPOConfig` adds for it (`FastGenerationFields`, each documented in
its docstring), their ranges and the rules between them and TRL's (`FAST_GENERATION_CONFIG`, composed into
`GRPOConfig` by `trl_grpo_ext.config`)."""

from dataclasses import dataclass, field

from ..field_checks import ConfigPart, Range
from ..launch_engine import sharding_engine

GENERATION_LORA_MERGE = ("none", "inplace", "copy")


def generation_levers(args) -> list[str]:
    """The fast-generation settings a config turns on, as `name=value` (empty: TRL's own generation)."""
    levers = ["generation_compile=True"] if args.generation_compile else []
    if args.generation_lora_merge != "none":
        levers.append(f"generation_lora_merge={args.generation_lora_merge!r}")
    return levers


@dataclass
class FastGenerationFields:
    r"""
    > Parameters that control fast generation

    TRL's own generation (`model.generate`, no vLLM, no continuous batching) made faster; every setting is off by
    default. `trl_grpo_ext.generation` says how each one acts and what it costs.

    generation_compile (`bool`, *optional*, defaults to `False`):
        Generate with a static KV cache of `generation_max_prompt_length + max_completion_length` tokens and a
        compiled decode step (`torch.compile` through transformers' `CompileConfig`: inductor, with CUDA graphs
        on a GPU) instead of TRL's dynamic cache with compilation disabled. The first generation compiles (about
        25 s for a 2-layer model on 2 CPU cores); later ones reuse the graph.
        transformers does not compile bitsandbytes 4-bit models: with 4-bit weights, also set
        `generation_lora_merge="copy"`.
    generation_max_prompt_length (`int`, *optional*):
        Prompt tokens the static cache of `generation_compile` holds (unused without it). Unset: the longest
        prompt of the first generation batch, rounded up to a multiple of 64. A longer prompt later grows the
        cache, which compiles the decode step once more.
    generation_lora_merge (`str`, *optional*, defaults to `"none"`):
        How a LoRA policy generates. `none`: through PEFT's adapter layers (TRL's path). `inplace`: the
        adapters are merged into the base weights for the generation, and the base weights are then restored
        bit for bit from a copy in host memory (no GPU memory; one host-to-device copy of the adapted weights
        per generation). `copy`: a separate generation model whose adapted linear layers hold W + ΔW in the
        compute dtype (for QLoRA, the dequantized base), sharing every other tensor with the policy and refreshed
        once per optimizer step (GPU memory: one compute-dtype copy of the adapted layers). Needs a PEFT LoRA
        model.
    generation_fallback (`bool`, *optional*, defaults to `True`):
        With `generation_compile` or `generation_lora_merge` on: when the fast path fails (its setup, the short
        probe generation at the start of training, or any later generation: no C compiler for Triton, Triton
        missing, a card too old, out of memory, a torch.compile error), warn once with the cause and the setting to
        change, put TRL's generation settings and the base weights back as they were, and go on with TRL's
        generation (the same completions as stock TRL from then on). `False`: raise the error instead.
    """

    generation_compile: bool = field(
        default=False,
        metadata={
            "help": "Generate with a static KV cache and a torch.compile'd decode step (CUDA graphs on a GPU) instead "
            "of TRL's dynamic cache. 4-bit weights need generation_lora_merge=copy."
        },
    )
    generation_max_prompt_length: int | None = field(
        default=None,
        metadata={
            "help": "Prompt tokens the static cache of generation_compile holds (cache = this + "
            "max_completion_length). Unset: the first batch's longest prompt rounded up to 64."
        },
    )
    generation_lora_merge: str = field(
        default="none",
        metadata={
            "help": "How a LoRA policy generates: none (PEFT's adapter layers), inplace (adapters merged into the "
            "base weights, restored bit for bit from host memory), copy (a separate merged generation model; for "
            "QLoRA the dequantized base).",
            "choices": list(GENERATION_LORA_MERGE),
        },
    )
    generation_fallback: bool = field(
        default=True,
        metadata={
            "help": "When fast generation fails (setup, the probe at the start of training, a later generation), "
            "warn once and go on with TRL's generation; False raises the error instead."
        },
    )


def check_generation_fields(args) -> None:
    """Rules between fast-generation fields and TRL's (each field of ours alone is checked by its declaration)."""
    levers = generation_levers(args)
    if not levers:
        return
    others = {"use_vllm": args.use_vllm}
    others["use_transformers_continuous_batching"] = args.use_transformers_continuous_batching
    for other, on in others.items():
        if on:
            raise ValueError(
                f"{', '.join(levers)} act on TRL's model.generate path; {other}=True generates another way: "
                f"turn off one or the other"
            )
    if args.generation_compile and args.max_completion_length is None:
        raise ValueError(
            "generation_compile=True sizes its static cache by max_completion_length, which must then be set, got None"
        )
    if args.generation_compile and args.cache_implementation not in (None, "static"):
        raise ValueError(
            f"generation_compile=True uses a static cache: cache_implementation must be unset or 'static', got "
            f"{args.cache_implementation!r}"
        )
    owned = ("cache_implementation", "max_cache_len", "disable_compile", "compile_config")
    clashes = sorted(set(args.generation_kwargs or {}) & set(owned)) if args.generation_compile else []
    if clashes:
        raise ValueError(
            f"generation_compile=True sets the cache and compilation of generation itself: remove {clashes} from "
            f"generation_kwargs (got {args.generation_kwargs!r})"
        )


def check_generation_engine(args) -> None:
    """Fast generation refused under an engine that shards the weights over processes (FSDP, DeepSpeed ZeRO-3), from
    what is known before the model loads (`sharding_engine`). Reads nothing while every lever is off.

    `GRPOConfig.__post_init__` runs it before TrainingArguments' own, which builds the DeepSpeed plugin from the same
    settings (and needs deepspeed installed to do so); the trainer refuses the same again from the prepared
    accelerator (`FastGenerationFeature.build`).

    Raises:
        ValueError: one line naming the levers that are on, the engine and the setting it comes from.
    """
    levers = generation_levers(args)
    if not levers:
        return
    engine = sharding_engine(args)
    if engine is not None:
        off = ["--generation_compile false"] if args.generation_compile else []
        off += ["--generation_lora_merge none"] if args.generation_lora_merge != "none" else []
        raise ValueError(
            f"{', '.join(levers)}: the weights are sharded over processes ({engine}), so no process holds a whole "
            f"layer to merge or compile; use DDP or ZeRO-1/2, or turn fast generation off ({' '.join(off)})"
        )


FAST_GENERATION_CONFIG = ConfigPart(
    FastGenerationFields,
    ranges={"generation_max_prompt_length": Range(1)},
    checks=(check_generation_fields, check_generation_engine),
)
