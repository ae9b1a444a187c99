"""What the memory estimate (`consumer_gpu.memory`) needs from a recipe, and what a recipe does with its answer.

    training_args, model_args = load_config("recipes/configs/gsm8k-8gb.yaml")
    estimate_for(architecture_config(model_args.model_name_or_path), training_args, model_args)

* `architecture_config`: a model's `PretrainedConfig` without a download, for the Qwen2.5 models the presets use
  (their real `config.json` values, shipped in this package as `trl_grpo_ext/consumer_gpu/model_configs/*.json`), a
  local model folder or a `config.json`-style file.
* `load_config`: the (GRPOConfig, ModelConfig) of a recipe YAML, as `TrlParser` reads it.
* `warn_if_too_big`: the `MemoryFitWarning` a recipe gives on a GPU before it loads a model whose run is estimated
  above 90% of the card (`fit_warning` words it; `cuda_card_gib` gives the card's size).
* `training_precision`: "bf16", "fp16" or "fp32", what this machine's card trains in (the notebooks pick their dtype
  with it; `recipes/configs/gsm8k-t4.yaml` is the fp16 preset).
* `no_cuda_problem`: a GPU config launched on a machine without CUDA, in one line that points to the CPU configs,
  before transformers' own check of bf16 fails with "Your setup doesn't support bf16/gpu".
"""

import json
import warnings
from importlib.resources import files
from pathlib import Path

from .memory import GIB, MemoryEstimate, estimate_for

MODEL_CONFIG_DIR = files(__package__) / "model_configs"  # package data (pyproject.toml: tool.setuptools.package-data)
MODEL_CONFIG_FILES = {
    "Qwen/Qwen2.5-0.5B-Instruct": "qwen2.5-0.5b-instruct.json",
    "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b-instruct.json",
    "Qwen/Qwen2.5-3B-Instruct": "qwen2.5-3b-instruct.json",
}


class MemoryFitWarning(UserWarning):
    """The estimated peak memory of a run is above 90% of the card's."""


def architecture_config(name_or_path: str):
    """A model's `PretrainedConfig` without a download: one of `MODEL_CONFIG_FILES` (the real `config.json` values,
    kept in `trl_grpo_ext/consumer_gpu/model_configs/`), a `config.json`-style file, or a local model folder.

    Raises:
        ValueError: anything else, naming the models known offline.
    """
    from transformers import AutoConfig

    path = MODEL_CONFIG_DIR / MODEL_CONFIG_FILES[name_or_path] if name_or_path in MODEL_CONFIG_FILES else None
    path = path or Path(name_or_path)
    if path.is_dir() and (path / "config.json").is_file():
        return AutoConfig.from_pretrained(path)
    if path.is_file():
        values = json.loads(path.read_text())
        return AutoConfig.for_model(values.pop("model_type"), **values)
    raise ValueError(
        f"no architecture config for {name_or_path!r} without a download: use one of {sorted(MODEL_CONFIG_FILES)}, a "
        "local model folder, or a config.json file (--model-config)"
    )


def fit_warning(estimate: MemoryEstimate, card_gib: float, name: str = "this run") -> str | None:
    """A message naming the three largest terms when the peak is above 90% of `card_gib`, else None."""
    if estimate.total <= 0.9 * card_gib:
        return None
    largest = ", ".join(f"{term} {gib:.2f} GiB" for term, gib in estimate.largest(3))
    return (
        f"{name} is estimated to peak at {estimate.total:.2f} GiB, above 90% of this {card_gib:.1f} GiB card "
        f"({0.9 * card_gib:.2f} GiB); largest terms: {largest}. Lower per_device_train_batch_size, "
        "max_completion_length or lora_r, set load_in_4bit, or pick a smaller preset (trl-grpo-ext memory --config "
        "... prints the breakdown)."
    )


def cuda_card_gib() -> float | None:
    """Memory of CUDA device 0 in GiB, or None without CUDA."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / GIB if torch.cuda.is_available() else None


def training_precision() -> str:
    """The mixed precision for this machine: "bf16" on a CUDA card that computes in bfloat16 (compute capability 8.0
    and up: Ampere, Ada, Hopper), "fp16" on an older one (a T4 is 7.5), "fp32" without CUDA.

    `torch.cuda.is_bf16_supported()` with its default `including_emulation=True` says True on a T4 too (bfloat16
    emulated in software, slowly); this asks for bfloat16 in hardware.
    """
    import torch

    if not torch.cuda.is_available():
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"


# the recipe configs for a machine without CUDA (recipes/configs/), and what each trains
CPU_CONFIGS = {"smollm2_cpu.yaml": "SmolLM2-135M-Instruct with LoRA, a pretrained model",
               "demo_cpu.yaml": "the tiny random model of the CPU demo, no download"}  # fmt: skip
MIXED_PRECISION = ("bf16", "fp16", "use_cpu")


def _flag_on(value) -> bool:
    """A boolean setting as TRL's parser reads it from YAML or the command line (true, yes, 1, ...)."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "y", "on", "t")


def no_cuda_problem(config_path: str, config: dict, overrides: list[str], *, cuda: bool) -> str | None:
    """One line when a recipe config asks for a GPU on a machine without CUDA (`cuda` False), else None.

    A config asks for a GPU when it trains in bf16 or fp16 mixed precision without `use_cpu`: the values of the
    command-line `overrides` (`--bf16 false`, `--use_cpu=true`, a bare `--use_cpu`) over the YAML mapping `config`
    over TRL's defaults (`GRPOConfig` trains in bf16 unless fp16 is set). The line names the settings and the CPU
    configs (`CPU_CONFIGS`)."""
    settings = {"bf16": None, "fp16": False, "use_cpu": False}
    settings |= {name: config[name] for name in MIXED_PRECISION if name in config}
    for i, arg in enumerate(overrides):
        name, equals, value = arg[2:].partition("=")
        if arg.startswith("--") and name in MIXED_PRECISION:
            following = overrides[i + 1] if i + 1 < len(overrides) else None
            settings[name] = value if equals else following if following and not following.startswith("-") else True
    if settings["bf16"] is None:  # TRL's GRPOConfig: bf16 unless fp16 is set
        settings["bf16"] = not _flag_on(settings["fp16"])
    asked = [f"{name}: true" for name in ("bf16", "fp16") if _flag_on(settings[name])]
    if cuda or _flag_on(settings["use_cpu"]) or not asked:
        return None
    folder = Path(config_path).parent
    configs = ", ".join(f"{folder / name} ({what})" for name, what in CPU_CONFIGS.items())
    return (f"{config_path} is a GPU config ({', '.join(asked)}) and this machine has no CUDA device: on a CPU use "
            f"{configs}, or add --use_cpu true --bf16 false --fp16 false to run this one on the CPU")  # fmt: skip


def warn_if_too_big(
    model_args, args, card_gib: float | None, eval_batch_size: int | None = None
) -> MemoryEstimate | None:
    """Warn (`MemoryFitWarning`) before a model is loaded when its run is estimated not to fit the card, its
    end-of-run evaluation at `eval_batch_size` prompts a batch included (None: no evaluation).

    Returns the estimate, or None when there is no card or the architecture is not known locally (nothing downloads).

    Raises:
        ValueError: settings the estimate refuses because the run cannot train (`memory.estimate`: fp16 with 4-bit
            weights, a fast-generation setting that cannot apply), so that a recipe stops before loading the model.
    """
    name = model_args.model_name_or_path
    if card_gib is None or name is None or model_args.dtype not in ("bfloat16", "float16"):
        return None
    try:
        model_config = architecture_config(name)
    except ValueError:
        return None
    result = estimate_for(model_config, args, model_args, card_gib=card_gib, eval_batch_size=eval_batch_size)
    message = fit_warning(result, card_gib, name)
    if message:
        warnings.warn(message, MemoryFitWarning, stacklevel=2)
    return result


# the GSM8K recipe's defaults of its evaluation settings (`recipes/math_gsm8k.py`, `GSM8KScriptArguments`)
RECIPE_EVAL_DEFAULTS = {"eval_limit": 200, "eval_batch_size": 16}


def recipe_eval_batch_size(path, *overrides: str) -> int | None:
    """The prompts a batch of a recipe YAML's end-of-run evaluation (`eval_batch_size`, from the command-line
    `overrides` over the file over the recipe's defaults), or None when it evaluates nothing (`eval_limit` 0)."""
    import yaml

    config = yaml.safe_load(Path(path).read_text()) or {}
    settings = {**RECIPE_EVAL_DEFAULTS, **{k: v for k, v in config.items() if k in RECIPE_EVAL_DEFAULTS}}
    for i, arg in enumerate(overrides[:-1]):
        if arg.startswith("--") and arg[2:] in RECIPE_EVAL_DEFAULTS:
            settings[arg[2:]] = int(overrides[i + 1])
    return int(settings["eval_batch_size"]) if int(settings["eval_limit"]) > 0 else None


def load_config(path, *overrides: str, use_cpu: bool = True):
    """(GRPOConfig, ModelConfig) of a recipe YAML, ignoring the recipe's own script fields.

    `use_cpu` (default) lets a bf16 config parse on a machine without a bf16 GPU; it changes no term of the estimate.
    """
    from trl import ModelConfig, TrlParser

    from ..config import GRPOConfig

    argv = ["--config", str(path), "--use_cpu", str(use_cpu).lower(), *overrides]
    return TrlParser((GRPOConfig, ModelConfig)).parse_args_and_config(argv, fail_with_unknown_args=False)
