"""trl-grpo-ext: TRL's GRPO trainer with opt-in extensions, as a drop-in swap of one import line.

    from trl_grpo_ext import GRPOConfig, GRPOTrainer   # instead of: from trl import GRPOConfig, GRPOTrainer

`register()` makes `from trl import GRPOConfig, GRPOTrainer` return this package's classes, for scripts that cannot
be edited (TRL's own `trl/scripts/grpo.py`); `unregister()` restores TRL's.
"""

from .config import GRPOConfig
from .registration import register, unregister
from .trainer import GRPOTrainer

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "GRPOTrainer", "register", "unregister", "__version__"]
