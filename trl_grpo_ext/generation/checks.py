"""The fast-generation settings that depend on the model, checked from what is known before it is loaded (LoRA or
not, 4-bit or not). The trainer, the memory estimate and the GSM8K recipe ask the same question here, so the three
refuse the same combinations with the same words."""


def model_setting_problem(args, *, lora: bool, quantized: bool) -> str | None:
    """Why `args`' fast-generation settings cannot apply to a model with (or without) LoRA and 4-bit weights, or None.

    Args:
        args: a `GRPOConfig` (or a TRL config given this package's fields by `GRPOConfig.add_defaults`).
        lora: the model is a PEFT LoRA model (`peft_config`, the recipe's `use_peft`).
        quantized: its weights are bitsandbytes-quantized (`load_in_4bit` / `load_in_8bit`).
    """
    mode = args.generation_lora_merge
    if mode != "none" and not lora:
        return (
            f"generation_lora_merge={mode!r} merges LoRA adapters, but the model has none: train with LoRA "
            "(peft_config; in the recipes --use_peft true) or set generation_lora_merge='none'"
        )
    if mode == "inplace" and quantized:
        return (
            "generation_lora_merge='inplace' cannot merge into bitsandbytes-quantized weights (a requantized merge "
            "is lossy): use generation_lora_merge='copy'"
        )
    if args.generation_compile and quantized and mode != "copy":
        return (
            "generation_compile=True: transformers does not compile bitsandbytes-quantized models (their quantizer "
            "is not compileable), so generation would silently stay uncompiled; set generation_lora_merge='copy' to "
            "generate from an unquantized copy, which compiles"
        )
    return None


def multi_turn_problem(args, multi_turn: bool) -> str | None:
    """Why `generation_compile` cannot serve a multi-turn run (`tools` or `environment_factory` given to the
    trainer), or None."""
    if args.generation_compile and multi_turn:
        return (
            "generation_compile=True with tools or environment_factory (multi-turn): each tool-calling turn generates "
            "for another batch size and prompt length, so every turn would build its own static cache and compile "
            "the decode step again, slower than TRL's dynamic cache; set generation_compile=False "
            "(generation_lora_merge still applies)"
        )
    return None
