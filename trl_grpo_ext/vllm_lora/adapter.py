"""What vLLM can load of a PEFT LoRA adapter (`adapter_problem`, `embedding_lora_problem`, `max_lora_rank`), and
`AdapterSync`: a policy's adapter saved to a folder and loaded into a vLLM engine in place.

vLLM 0.30 loads a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`, what PEFT's
`save_pretrained` writes) onto its linear layers only, and refuses DoRA, `modules_to_save` and LoRA biases
(`vllm.lora.peft_helper.PEFTHelper.validate_legal`); it reads one rank and alpha for every layer (PEFT's
`rank_pattern` / `alpha_pattern` would be ignored) and, for most models (Qwen2, Llama: `embedding_modules` empty), no
LoRA on the input or output embeddings. vLLM keys its prefix cache on the adapter's name, so a sync that changes the
adapter in place also resets that cache (else a cached prompt keeps the old adapter's keys and values).
"""

import os
from pathlib import Path

import torch

ADAPTER_NAME = "policy"  # the adapter's name and id inside vLLM (one adapter per engine)
ADAPTER_ID = 1


def lora_config_of(model, peft_config):
    """The LoRA config TRL will train with: `peft_config` when given, else the active adapter's of a PEFT `model`;
    None when neither is a LoRA config."""
    from peft import LoraConfig, PeftModel

    if peft_config is None and isinstance(model, PeftModel):
        peft_config = model.peft_config[model.active_adapter]
    return peft_config if isinstance(peft_config, LoraConfig) else None


def adapter_problem(config) -> str | None:
    """What in the LoRA `config` vLLM cannot load, as a sentence (None: nothing)."""
    if config.use_dora:
        return "it uses DoRA (use_dora=True), which vLLM does not load"
    if config.modules_to_save:
        return f"it trains modules_to_save={sorted(config.modules_to_save)}, which vLLM does not load"
    if config.bias != "none":
        return f"it trains biases (bias={config.bias!r}), which vLLM does not load"
    if config.rank_pattern or config.alpha_pattern:
        return "it has a rank_pattern / alpha_pattern, while vLLM applies one rank and alpha to every layer"
    return None


def embedding_lora_problem(model) -> str | None:
    """LoRA on the PEFT `model`'s input or output embeddings (vLLM loads LoRA onto linear layers only), as a
    sentence naming the modules; None when there is none."""
    from peft.tuners.lora import LoraLayer

    embeddings = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
    on = [name for name, module in model.named_modules()
          if isinstance(module, LoraLayer) and id(module.get_base_layer()) in embeddings]  # fmt: skip
    return f"it has LoRA on the embeddings ({', '.join(on)}), which vLLM does not load" if on else None


def max_lora_rank(rank: int, ranks: tuple[int, ...]) -> int:
    """The smallest of vLLM's allowed `max_lora_rank` values `ranks` that holds an adapter of rank `rank`.

    Raises:
        ValueError: `rank` is above all of them, naming both."""
    fitting = [r for r in ranks if r >= rank]
    if not fitting:
        raise ValueError(f"vllm_lora_sync='adapter': LoRA rank r={rank} is above vLLM's largest max_lora_rank "
                         f"({max(ranks)}); use a smaller r or vllm_lora_sync='merge'")  # fmt: skip
    return fitting[0]


class AdapterSync:
    """Saves a PEFT `model`'s active adapter to `folder` and loads it into `engine` (a `vllm.LLM` built with LoRA
    enabled) under `ADAPTER_NAME`, replacing the one loaded before; `request` is what each generation passes.

    A sync writes the adapter's tensors as they are in the model (dtype and values: vLLM casts them to its
    `lora_dtype`, the engine's dtype unless set) and the adapter's config; no base weight is read or written."""

    def __init__(self, model, engine, folder: str | os.PathLike):
        from vllm.lora.request import LoRARequest

        self.model, self.engine = model, engine
        self.adapter = model.active_adapter
        self.folder = Path(folder)
        self.request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(self.folder))
        self.syncs = 0

    def save(self) -> Path:
        """The active adapter as PEFT saves it (`adapter_model.safetensors`, `adapter_config.json`) in `folder`."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        state = get_peft_model_state_dict(self.model, adapter_name=self.adapter)  # {name: (out, r) or (r, in)}
        self.folder.mkdir(parents=True, exist_ok=True)
        save_file({name: tensor.detach().contiguous().cpu() for name, tensor in state.items()},
                  str(self.folder / "adapter_model.safetensors"))  # fmt: skip
        self.model.peft_config[self.adapter].save_pretrained(str(self.folder))
        return self.folder

    @torch.no_grad()
    def __call__(self) -> None:
        """The sync: the adapter saved and loaded in place (`load_inplace=True`), vLLM's prefix cache reset."""
        from vllm.lora.request import LoRARequest

        self.save()
        self.engine.llm_engine.add_lora(LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(self.folder), load_inplace=True))
        self.engine.reset_prefix_cache()
        self.syncs += 1
