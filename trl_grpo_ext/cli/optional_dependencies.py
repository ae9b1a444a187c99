"""Optional packages a run asks for, checked before anything is loaded: vLLM for `use_vllm`, bitsandbytes for
`load_in_4bit` (the `qlora` extra), DeepSpeed for a DeepSpeed config (TrainingArguments' `deepspeed` field, on the
command line or in the YAML, or `ACCELERATE_USE_DEEPSPEED=true`), math-verify for TRL's reward functions that check
answers with it (`--reward_funcs accuracy_reward` of `trl-grpo-ext grpo`: the `gsm8k` extra).

Without this check, a missing vLLM surfaces only after the model has been loaded, and a missing DeepSpeed as a stack
trace from inside `TrainingArguments`, and a missing math-verify as a traceback from the first reward call, after
the model has loaded; here each is one line that says what to install. (`accelerate launch
--config_file` with a DeepSpeed config already refuses in the launcher when DeepSpeed is missing.)
"""

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..error_reports import EXTRAS, MissingDependencyError

INSTALL = {"vllm": "pip install vllm", "deepspeed": "pip install deepspeed",
           "bitsandbytes": f"pip install 'trl-grpo-ext[{EXTRAS['bitsandbytes'][1]}]'"}  # fmt: skip
# The reward functions of TRL's `trl grpo` script (its registry in trl/scripts/grpo.py) that need an optional package
# when called: the two accuracy rewards check answers with math-verify (trl/rewards/accuracy_rewards.py raises
# "Please install the `math_verify` package" from the first call). A test keeps this in step with TRL's sources.
TRL_REWARD_MODULES = {"accuracy_reward": "math_verify", "reasoning_accuracy_reward": "math_verify"}


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


def check_optional_dependencies(
    *, use_vllm: bool = False, deepspeed: bool = False, quantized: bool = False, reward_funcs: Sequence[str] = ()
) -> None:
    """Raise before any model or data is loaded when a requested optional package is missing: vLLM for `use_vllm`,
    DeepSpeed for `deepspeed`, bitsandbytes for `quantized` (`load_in_4bit` or `load_in_8bit`), math-verify for a
    name of `reward_funcs` (`trl grpo`'s `--reward_funcs`) in `TRL_REWARD_MODULES`.

    Raises:
        MissingDependencyError: naming the setting, the package and the pip command that installs it.
    """
    for name in reward_funcs or ():
        module = TRL_REWARD_MODULES.get(name)
        if module is not None and not is_installed(module):
            package, extra = EXTRAS[module]
            raise MissingDependencyError(
                f"--reward_funcs {name} (TRL's) needs {package}, which is not installed: "
                f"pip install 'trl-grpo-ext[{extra}]'"
            )
    wanted = {"vllm": ("use_vllm=True", use_vllm), "deepspeed": ("a DeepSpeed config", deepspeed),
              "bitsandbytes": ("load_in_4bit or load_in_8bit (QLoRA)", quantized)}  # fmt: skip
    for package, (setting, requested) in wanted.items():
        if requested and not is_installed(package):
            raise MissingDependencyError(
                f"{setting} needs the package {package!r}, which is not installed: {INSTALL[package]}"
            )
