"""trl-grpo-ext: TRL's GRPO trainer with opt-in extensions, as a drop-in swap of one import line.

    from trl_grpo_ext import GRPOConfig, GRPOTrainer   # instead of: from trl import GRPOConfig, GRPOTrainer

`register()` makes `from trl import GRPOConfig, GRPOTrainer` return this package's classes, for scripts that cannot
be edited (TRL's own `trl/scripts/grpo.py`); `unregister()` restores TRL's.

The four names are imported on first use (PEP 562 module `__getattr__`), so that `import trl_grpo_ext.cli.errors`
or `trl-grpo-ext --help` does not load torch, transformers and TRL, and an entry point can set its quiet-start
filters (`cli.errors.quiet_start`) before TRL's imports log anything.

The library core is this folder's modules and the feature folders (`policy_groups`, `prompt_skip`, `entropy`,
`grad_reg`, `generation`, `vllm_lora`, `doctor`: `composition.py` names their features); the tools are in `cli` (the
`trl-grpo-ext` command, its error handling, export, the tiny model, optional-dependency checks) and `reporting` (the
metrics table and plots); task support is in `gsm8k` and the consumer-GPU presets and memory estimate in
`consumer_gpu`.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names for static analysis (type checkers, the docs' griffe); at run time they come lazily
    from .config import GRPOConfig as GRPOConfig
    from .trainer import GRPOTrainer as GRPOTrainer
    from .trainer import register as register
    from .trainer import unregister as unregister

__version__ = "0.1.0"
_EXPORTS = {"GRPOConfig": "config", "GRPOTrainer": "trainer", "register": "trainer", "unregister": "trainer"}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
