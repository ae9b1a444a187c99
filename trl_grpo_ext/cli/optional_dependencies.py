"""Optional packages a run asks for, checked before anything is loaded: vLLM for `use_vllm`, bitsandbytes for
`load_in_4bit` (the `qlora` extra), DeepSpeed for a DeepSpeed config (TrainingArguments' `deepspeed` field, on the
command line or in the YAML, or `ACCELERATE_USE_DEEPSPEED=true`).

Without this check, a missing vLLM surfaces only after the model has been loaded, and a missing DeepSpeed as a stack
trace from inside `TrainingArguments`; here either is one line that says what to install. (`accelerate launch
--config_file` with a DeepSpeed config already refuses in the launcher when DeepSpeed is missing.)
"""

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..error_reports import EXTRAS, MissingDependencyError

INSTALL = {"vllm": "pip install vllm", "deepspeed": "pip install deepspeed",
           "bitsandbytes": f"pip install 'trl-grpo-ext[{EXTRAS['bitsandbytes'][1]}]'"}  # fmt: skip


def is_installed(package: str) -> bool:
    """Whether `package` can be imported (found on the path; not imported)."""
    return importlib.util.find_spec(package) is not None


def deepspeed_requested(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether a launch asks for DeepSpeed: `accelerate launch` with a DeepSpeed config sets
    `ACCELERATE_USE_DEEPSPEED=true`; a `--deepspeed` argument or a `deepspeed:` key in the `--config` YAML."""
    environ = os.environ if environ is None else environ
    if environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes", "on"):
        return True
    if any(arg == "--deepspeed" or arg.startswith("--deepspeed=") for arg in argv):
        return True
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        import yaml

        path = Path(argv[argv.index("--config") + 1])
        config = yaml.safe_load(path.read_text()) if path.is_file() else None
        return isinstance(config, dict) and bool(config.get("deepspeed"))
    return False


def check_optional_dependencies(*, use_vllm: bool = False, deepspeed: bool = False, quantized: bool = False) -> None:
    """Raise before any model or data is loaded when a requested optional package is missing: vLLM for `use_vllm`,
    DeepSpeed for `deepspeed`, bitsandbytes for `quantized` (`load_in_4bit` or `load_in_8bit`).

    Raises:
        MissingDependencyError: naming the setting, the package and the pip command that installs it.
    """
    wanted = {"vllm": ("use_vllm=True", use_vllm), "deepspeed": ("a DeepSpeed config", deepspeed),
              "bitsandbytes": ("load_in_4bit or load_in_8bit (QLoRA)", quantized)}  # fmt: skip
    for package, (setting, requested) in wanted.items():
        if requested and not is_installed(package):
            raise MissingDependencyError(
                f"{setting} needs the package {package!r}, which is not installed: {INSTALL[package]}"
            )
