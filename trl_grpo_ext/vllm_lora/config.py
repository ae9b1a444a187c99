"""The setting of adapter-only LoRA sync to vLLM (`VLLMLoRAFields`) and its rules against TRL's vLLM settings
(`VLLM_LORA_CONFIG`, composed into `GRPOConfig` by `trl_grpo_ext.config`)."""

from dataclasses import dataclass, field

from ..field_checks import ConfigPart
from ..launch_engine import sharding_engine

VLLM_LORA_SYNC = ("merge", "adapter")


@dataclass
class VLLMLoRAFields:
    r"""
    > Parameters that control how a LoRA policy reaches vLLM

    vllm_lora_sync (`str`, *optional*, defaults to `"merge"`):
        How a PEFT LoRA policy's weights reach TRL's colocated vLLM (`use_vllm=True`, `vllm_mode="colocate"`) at each
        sync. `merge`: TRL's sync, the adapters merged into the base weights and the merged weights loaded into
        vLLM (lossy on quantized bases). `adapter`: vLLM is built with LoRA enabled (`max_lora_rank` from the
        adapter's rank), keeps its base weights, and each sync saves only the adapter to a temporary folder and
        loads it in place; every generation passes that adapter. Needs a PEFT LoRA model without DoRA,
        `modules_to_save`, bias or LoRA on the embeddings (vLLM cannot load those), and colocate mode.
    """

    vllm_lora_sync: str = field(
        default="merge",
        metadata={
            "help": "How a LoRA policy reaches colocated vLLM: merge (TRL's sync, adapters merged into the base "
            "weights), adapter (vLLM keeps its base weights and loads only the adapter at each sync).",
            "choices": list(VLLM_LORA_SYNC),
        },
    )


def check_vllm_lora_fields(args) -> None:
    """`vllm_lora_sync="adapter"` refused where vLLM does not generate in this process or cannot keep its weights.

    Raises:
        ValueError: one line naming the field, its value and the setting in the way: no `use_vllm`, server mode
            (TRL's server takes merged weights over NCCL, `trl vllm-serve`'s /generate/ takes no LoRA request), sleep
            mode (level 2 drops vLLM's weights, which TRL pushes again merged), FSDP or ZeRO-3 (each process's
            adapter is a shard).
    """
    if args.vllm_lora_sync != "adapter":
        return
    head = "vllm_lora_sync='adapter'"
    if not args.use_vllm:
        raise ValueError(f"{head} hands the LoRA adapter to vLLM: set use_vllm=True (got use_vllm=False)")
    if args.vllm_mode != "colocate":
        raise ValueError(
            f"{head} needs vllm_mode='colocate', got {args.vllm_mode!r}: in server mode TRL pushes merged weights to "
            "`trl vllm-serve` over NCCL and its /generate/ takes no LoRA request; use vllm_lora_sync='merge' there"
        )
    if args.vllm_enable_sleep_mode:
        raise ValueError(
            f"{head} keeps vLLM's base weights, which vllm_enable_sleep_mode=True drops between generations (sleep "
            "level 2) for TRL to push them again merged: turn one of them off"
        )
    engine = sharding_engine(args)
    if engine is not None:
        raise ValueError(
            f"{head} saves each process's whole adapter, which is sharded under {engine}: use DDP or ZeRO-1/2, or "
            "vllm_lora_sync='merge'"
        )


VLLM_LORA_CONFIG = ConfigPart(VLLMLoRAFields, checks=(check_vllm_lora_fields,))
