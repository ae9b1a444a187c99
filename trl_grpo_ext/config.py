"""`GRPOConfig`: TRL's GRPO configuration plus this package's settings, every one of them off by default."""

import dataclasses
from dataclasses import dataclass

import trl


@dataclass
class GRPOConfig(trl.GRPOConfig):
    r"""
    Configuration for [`trl_grpo_ext.GRPOTrainer`]: every field of [`trl.GRPOConfig`] keeps its meaning and default.

    This class is a drop-in replacement: `from trl_grpo_ext import GRPOConfig` instead of `from trl import GRPOConfig`
    changes nothing until one of this package's settings is turned on. With every setting at its default, a run is
    numerically identical to stock TRL GRPO (`tests/test_equivalence.py` proves it), so the fields below are opt-in.
    They are grouped under `> Parameters that control …` headers, and each carries the same text in its
    `field(metadata={"help": ...})` (TRL's convention).
    """

    @classmethod
    def from_trl(cls, args: trl.GRPOConfig) -> "GRPOConfig":
        """This package's config holding every value of a plain `trl.GRPOConfig`; this package's settings at default.

        The values are copied as `args` holds them after its `__post_init__`, so nothing is normalised twice.

        Raises:
            TypeError: `args` is not a `trl.GRPOConfig`.
        """
        if not isinstance(args, trl.GRPOConfig):
            raise TypeError(f"args must be a trl.GRPOConfig, got {type(args).__name__}")
        config = cls.__new__(cls)
        config.__dict__.update(args.__dict__)
        for f in dataclasses.fields(cls):
            if f.name not in config.__dict__:
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                setattr(config, f.name, default)
        return config
