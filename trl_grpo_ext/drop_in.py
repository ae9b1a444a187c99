"""Make `from trl import GRPOConfig, GRPOTrainer` return this package's classes, and undo it."""

import trl
import trl.trainer

# Modules that export the classes by name; `trl.trainer.grpo_trainer` itself keeps TRL's class, which ours subclasses.
_MODULES = (trl, trl.trainer)
_NAMES = ("GRPOConfig", "GRPOTrainer")
_originals: dict[tuple[str, str], type] = {}


def register() -> None:
    """Point `trl.GRPOConfig` / `trl.GRPOTrainer` (and `trl.trainer.*`) at `trl_grpo_ext`'s classes.

    Code that imports the names afterwards (`from trl import GRPOTrainer`, as `trl/scripts/grpo.py` does inside its
    functions) gets the extension classes. A name bound by an import that ran before `register()` keeps TRL's class.
    Calling it again changes nothing.
    """
    from .config import GRPOConfig
    from .trainer import GRPOTrainer

    ours = {"GRPOConfig": GRPOConfig, "GRPOTrainer": GRPOTrainer}
    for module in _MODULES:
        for name in _NAMES:
            current = getattr(module, name)
            if current is not ours[name]:
                _originals[(module.__name__, name)] = current
                setattr(module, name, ours[name])


def unregister() -> None:
    """Restore TRL's own `GRPOConfig` / `GRPOTrainer` in `trl` and `trl.trainer`. Calling it again changes nothing."""
    for module in _MODULES:
        for name in _NAMES:
            original = _originals.pop((module.__name__, name), None)
            if original is not None:
                setattr(module, name, original)
