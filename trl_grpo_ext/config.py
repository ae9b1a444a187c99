"""`GRPOConfig`: TRL's GRPO configuration plus this package's settings, every one of them off by default."""

import dataclasses
from dataclasses import dataclass

from trl.trainer.grpo_config import GRPOConfig as TRLGRPOConfig  # TRL's class, also after register()


@dataclass
class GRPOConfig(TRLGRPOConfig):
    r"""
    Configuration for [`trl_grpo_ext.GRPOTrainer`]: every field of [`trl.GRPOConfig`] keeps its meaning and default.

    This class is a drop-in replacement: `from trl_grpo_ext import GRPOConfig` instead of `from trl import GRPOConfig`
    changes nothing until one of this package's settings is turned on. With every setting at its default, a run is
    numerically identical to stock TRL GRPO (`tests/test_equivalence.py` proves it). The features that are planned
    add their opt-in fields here, grouped under `> Parameters that control …` headers, each with the same text in
    its `field(metadata={"help": ...})` (TRL's convention).
    """

    @classmethod
    def add_defaults(cls, args: TRLGRPOConfig) -> TRLGRPOConfig:
        """Give a TRL `GRPOConfig` (or a user's subclass of it) this package's settings at their defaults, in place.

        For scripts that pass TRL's config to our trainer: `args` stays the same object, of the same class, with
        every value it had; only the fields this package adds are set, off. Returns `args`.

        Raises:
            TypeError: `args` is not a TRL `GRPOConfig`.
        """
        if not isinstance(args, TRLGRPOConfig):
            raise TypeError(f"args must be a trl.GRPOConfig, got {type(args).__module__}.{type(args).__name__}")
        for f in dataclasses.fields(cls):
            if not hasattr(args, f.name):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                setattr(args, f.name, default)
        return args
