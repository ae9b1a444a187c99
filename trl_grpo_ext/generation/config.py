"""The settings of fast generation: the fields `GRPOConfig` adds for it (`FastGenerationFields`, each documented in
its docstring), their ranges and the rules between them and TRL's (`FAST_GENERATION_CONFIG`, composed into
`GRPOConfig` by `trl_grpo_ext.config`)."""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..field_checks import ConfigPart, Range

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
        25 s for a 2-layer model on 2 CPU cores; not yet timed on a GPU); later ones reuse the graph.
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


def sharding_engine(args) -> str | None:
    """The engine that will shard the model's weights over processes, with the setting it comes from ("FSDP, from
    accelerate launch's ACCELERATE_USE_FSDP"), or None (one process, DDP, DeepSpeed ZeRO-0/1/2).

    Read as accelerate and transformers read them, before either builds a plugin:
        - `args.fsdp` (TrainingArguments': any value turns FSDP on), or `ACCELERATE_USE_FSDP=true` (or 1, yes, on:
          accelerate's `parse_flag_from_env` and transformers' `strtobool` read those as true too), which
          `accelerate launch` sets for a `distributed_type: FSDP` config (`accelerate.utils.launch`'s
          `prepare_multi_gpu_env`).
        - `args.deepspeed` (a dict or a JSON file): its `zero_optimization.stage`; else, with
          `ACCELERATE_USE_DEEPSPEED=true` (`prepare_deepspeed_cmd_env`, for a `distributed_type: DEEPSPEED` config),
          the stage of the JSON in `ACCELERATE_DEEPSPEED_CONFIG_FILE`, or `ACCELERATE_DEEPSPEED_ZERO_STAGE`. A
          stage "auto" is the environment's stage, 2 when unset (accelerate's `DeepSpeedPlugin`); a missing one is
          DeepSpeed's 0.
    A DeepSpeed config that is not a dict or a readable file (transformers also takes base64) is left to the trainer.
    """
    environ = os.environ
    if args.fsdp:
        return "FSDP, from the fsdp argument"
    if _on(environ.get("ACCELERATE_USE_FSDP")):
        return "FSDP, from accelerate launch's ACCELERATE_USE_FSDP"
    launch_stage = environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    file = environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")  # "none": accelerate's unset
    if args.deepspeed:
        where = "the deepspeed config" + (f" {args.deepspeed}" if isinstance(args.deepspeed, str) else "")
        stage = _zero_stage(args.deepspeed, launch_stage)
    elif not _on(environ.get("ACCELERATE_USE_DEEPSPEED")):
        return None
    elif file != "none":
        where, stage = f"accelerate launch's ACCELERATE_DEEPSPEED_CONFIG_FILE {file}", _zero_stage(file, launch_stage)
    else:
        where, stage = f"accelerate launch's ACCELERATE_DEEPSPEED_ZERO_STAGE={launch_stage}", launch_stage
    return f"DeepSpeed ZeRO-3, from {where}" if stage == "3" else None


def _on(value: str | None) -> bool:
    """An environment flag as accelerate (`str_to_bool`) and transformers (`strtobool`) read it: 1, true, yes, y, on
    or t, in any case, is on."""
    return value is not None and value.strip().lower() in ("1", "true", "yes", "y", "on", "t")


def _zero_stage(config: dict | str, launch_stage: str) -> str | None:
    """The ZeRO stage of a DeepSpeed config (a dict or a JSON file's path), "auto" read as `launch_stage`; None when
    the config cannot be read here."""
    if isinstance(config, str):
        try:
            config = json.loads(Path(config).read_text())
        except (OSError, ValueError):
            return None
    if not isinstance(config, dict):
        return None
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    return launch_stage if stage == "auto" else str(stage)


FAST_GENERATION_CONFIG = ConfigPart(
    FastGenerationFields,
    ranges={"generation_max_prompt_length": Range(1)},
    checks=(check_generation_fields, check_generation_engine),
)
