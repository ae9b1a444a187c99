"""Whether the generation copy (`generation_lora_merge="copy"`) fits on the device beside training, checked at the
first generation, when the model is where it trains (`check_copy_fits`): the copy's bytes and a lower bound of what
training still allocates there, against the device's free memory. The full estimate, activations and workspaces
included, is `trl-grpo-ext memory` (`consumer_gpu.memory`)."""

from collections.abc import Iterable

import torch

from .lora_merge import compute_dtype, is_quantized_linear, lora_linears

GIB = 2**30


def free_device_memory(device: torch.device) -> int | None:
    """Free bytes on a CUDA device, None on any other (no check there)."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def copy_weight_bytes(shapes: Iterable[tuple[int, int]], element_size: int) -> int:
    """Bytes of the weights a generation copy (`generation_lora_merge="copy"`) owns: Σ d_in·d_out over its linear
    layers' weight `shapes` (d_in, d_out), at `element_size` bytes a weight (the copy's dtype). The one formula of
    the copy's size: `generation_copy_bytes` applies it to a model, the memory estimate
    (`consumer_gpu.memory.generation_copy_bytes`) to a config."""
    return sum(d_in * d_out for d_in, d_out in shapes) * element_size


def generation_copy_bytes(model: torch.nn.Module) -> int:
    """Bytes a `GenerationCopy` of `model` (a PEFT model) allocates: every adapted or quantized linear layer's
    d_out·d_in weights in the compute dtype (`lora_merge.compute_dtype`), `copy_weight_bytes`."""
    base = model.get_base_model()
    adapted = lora_linears(base)
    layers = [layer.get_base_layer() for layer in adapted.values()]
    layers += [m for name, m in base.named_modules() if is_quantized_linear(m) and not name.startswith(tuple(adapted))]
    element = torch.empty((), dtype=compute_dtype(base)).element_size()
    return copy_weight_bytes(((layer.in_features, layer.out_features) for layer in layers), element)


def training_still_allocates(trainer, policy: torch.nn.Module, cache_tokens: int) -> int:
    """A lower bound, in bytes, of what training allocates on the device after the first generation starts: the
    gradients of the trainable parameters, the optimizer state (created at the first optimizer step: AdamW's two
    moments in the parameters' dtype, two bytes a parameter for an 8-bit optimizer, none counted for others) and,
    with `generation_compile`, the static cache of a generation batch (`cache_tokens` tokens a sequence; K and V of
    every layer). Activations and workspaces come on top (`trl-grpo-ext memory` estimates them)."""
    args = trainer.args
    trainable = [p for p in policy.parameters() if p.requires_grad]
    gradients = sum(p.numel() * p.element_size() for p in trainable)
    optim = str(getattr(args.optim, "value", args.optim))
    states = 2 * sum(p.numel() for p in trainable) if "8bit" in optim else 2 * gradients if "adam" in optim else 0
    cache = 0
    if cache_tokens:
        config = policy.config.get_text_config(decoder=True)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        element = torch.empty((), dtype=compute_dtype(policy)).element_size()
        per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element
        cache = per_token * cache_tokens * (args.generation_batch_size // max(trainer.accelerator.num_processes, 1))
    return gradients + states + cache


def check_copy_fits(trainer, policy: torch.nn.Module, device: torch.device, cache_tokens: int) -> None:
    """Refuse a generation copy that does not fit in the free memory of `device` next to what training will still
    allocate (`training_still_allocates`); no check off CUDA.

    Raises:
        ValueError: naming the copy's size, what training still allocates and the free memory.
    """
    free = free_device_memory(device)
    if free is None:
        return
    needed = generation_copy_bytes(policy)
    upcoming = training_still_allocates(trainer, policy, cache_tokens)
    if needed + upcoming <= free:
        return
    raise ValueError(
        f"generation_lora_merge='copy' needs {needed / GIB:.2f} GiB for the generation copy, and training will "
        f"allocate at least {upcoming / GIB:.2f} GiB more (gradients, optimizer state, static cache), but only "
        f"{free / GIB:.2f} GiB of the GPU is free: use 'inplace' (LoRA on unquantized weights) or 'none', or lower "
        "the memory use (trl-grpo-ext memory --config ... shows it)"
    )
