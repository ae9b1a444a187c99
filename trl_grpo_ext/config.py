"""`GRPOConfig`: TRL's GRPO configuration plus this package's settings, every one of them off by default.

Each feature declares its settings in its own folder (`<feature>/config.py`, a `field_checks.ConfigPart`): the fields
with their help, their section of the class docstring, the ranges of its number fields and the rules between fields.
`GRPOConfig` has the fields classes as bases (through `composition.FeatureFields`; `FEATURE_CONFIGS` is found from
them), composes its docstring from their sections, and checks TRL's counts and then each part.
"""

import dataclasses
import warnings
from dataclasses import dataclass

from trl.trainer.grpo_config import GRPOConfig as TRLGRPOConfig  # TRL's class, also after register()

from .composition import FeatureFields
from .field_checks import config_parts
from .generation.config import FAST_GENERATION_CONFIG, check_generation_engine, generation_levers
from .grad_reg.config import GRAD_REG_CONFIG, check_grad_reg_engine
from .policy_groups.config import policy_grouping_requested, stages_requested
from .trl_fields import check_trl_fields, misleading_values

__all__ = ["FEATURE_CONFIGS", "FIELD_MODES", "FIELD_RANGES", "GRPOConfig", "TRLGRPOConfig", "TRL_COUNTS",
           "generation_levers", "own_fields", "policy_grouping_requested", "stages_requested"]  # fmt: skip

# TRL's and transformers' count fields checked before TRL's `__post_init__` (`GRPOConfig._check_trl_counts`): the
# least value each allows, and what the message asks for. num_generations 1 is left to TRL's own message.
TRL_COUNTS = {
    "num_generations": (1, "2 or more (completions per prompt: each is scored against the others of its prompt)"),
    "per_device_train_batch_size": (1, ">= 1 (completions per micro-batch)"),
    "gradient_accumulation_steps": (1, ">= 1 (micro-batches per optimizer step)"),
    "steps_per_generation": (1, ">= 1 (micro-batches per generation batch)"),
    "generation_batch_size": (1, ">= 1 (completions generated at once)"),
    "max_completion_length": (1, ">= 1 (tokens)"),
    "num_iterations": (1, ">= 1 (passes over each generation batch)"),
}


# The features' settings are one base, `composition.FeatureFields`, whose bases are each feature's fields class (whose
# `ConfigPart` is found from it: `field_checks.config_parts`). dataclasses collect fields from the last base to the
# first: TRL's fields first (`GRPOConfig("out")` still sets `output_dir`), then the features'.
@dataclass
class GRPOConfig(FeatureFields, TRLGRPOConfig):
    r"""
    Configuration for [`trl_grpo_ext.GRPOTrainer`]: every field of [`trl.GRPOConfig`] keeps its meaning and default.

    This class is a drop-in replacement: `from trl_grpo_ext import GRPOConfig` instead of `from trl import GRPOConfig`
    changes nothing until one of this package's settings is turned on. With every setting at its default, a run is
    numerically identical to stock TRL GRPO (`tests/training/test_equivalence.py` proves it).

    Every field below is checked when the config is built, its feature on or off, by its type and the range
    `FIELD_RANGES` declares (`field_checks.check_field`; strings are read as TrlParser reads the command line).

    Raises:
        ValueError: a field of this package with a value of the wrong kind or out of its range ("<field> must be
            <what it allows>, got <value>"), or settings that contradict each other, naming the fields.

    Parameters:
    """  # each feature's `> Parameters that control ...` section is added from its part (below the class)

    def __post_init__(self):
        self._check_trl_counts()  # before TRL's own __post_init__, which divides by some of them
        check_trl_fields(self)  # TRL's and transformers' other numbers, and numbers in YAML mappings
        # Fast generation under FSDP or ZeRO-3, and gradient regularization under DeepSpeed or FSDP, also before:
        # TrainingArguments' __post_init__ builds the DeepSpeed plugin from the same settings (and needs deepspeed
        # installed for it). Checked again with the other rules.
        FAST_GENERATION_CONFIG.check_fields(self)
        check_generation_engine(self)
        GRAD_REG_CONFIG.check_fields(self)  # the same for gradient regularization under DeepSpeed or FSDP
        check_grad_reg_engine(self)
        super().__post_init__()
        self._check_fields()

    def _check_trl_counts(self) -> None:
        """TRL's and transformers' counts that they take unchecked: 0 divides by zero in TRL's `__post_init__`
        (`num_generations`) or fails only once the model is loaded, naming another field (a batch size of 0 from
        `steps_per_generation=0`). Raises ValueError naming the field and the value; valid values change nothing."""
        for name, (least, wanted) in TRL_COUNTS.items():
            value = getattr(self, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value < least:
                raise ValueError(f"{name} must be {wanted}, got {value}")

    def _check_fields(self, parts=None) -> None:
        """This package's checks (also run on a TRL config by `add_defaults`), and those of the parts a subclass adds
        as bases: `parts`, by default those of `self`'s class (`field_checks.config_parts`). Raises ValueError naming
        the field."""
        parts = parts if parts is not None else config_parts(type(self))
        for part in parts:  # each field by its type and declared range (`field_checks`), feature on or off
            part.check_fields(self)
        GRPOConfig._check_trl_fields(self)  # named, not looked up on `self`: a TRL config has no such method
        for part in parts:  # then the rules between fields, feature by feature
            for check in part.checks:
                check(self)

    def _check_trl_fields(self) -> None:
        """Values of transformers' and TRL's own fields that they accept but that cannot mean what was asked; a
        warning (`UserWarning`) for a temperature in `generation_kwargs` other than `temperature`, for
        `do_sample=False` there (greedy completions: equal within a generation group), and for each value of
        `trl_fields.misleading_values`."""
        steps = self.max_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < -1:
            raise ValueError(
                f"max_steps must be a number of optimizer steps >= 1, or -1 (or 0) to train for num_train_epochs, "
                f"got {steps!r}"
            )
        for message in misleading_values(self):
            warnings.warn(message, UserWarning, stacklevel=3)
        if (self.generation_kwargs or {}).get("do_sample") is False:
            warnings.warn(
                "generation_kwargs do_sample=False makes every completion of a prompt the same greedy one: GRPO's "
                "generation groups then carry no signal (their rewards are equal); drop it from generation_kwargs",
                UserWarning,
                stacklevel=3,
            )
        sampled = (self.generation_kwargs or {}).get("temperature")
        if sampled is not None and sampled != self.temperature:
            # TRL passes generation_kwargs to generate, over its own temperature, but scales the logits of its
            # log-probabilities and entropies by `temperature` (`_get_per_token_logps_and_entropies`)
            warnings.warn(
                f"generation_kwargs temperature={sampled!r} samples the completions, but the log-probabilities, the "
                f"entropy and the entropy target are computed at temperature={self.temperature!r} (TRL's field): set "
                f"temperature={sampled!r} and drop it from generation_kwargs",
                UserWarning,
                stacklevel=3,
            )

    @classmethod
    def add_defaults(cls, args: TRLGRPOConfig) -> TRLGRPOConfig:
        """Give a TRL `GRPOConfig` (or a user's subclass of it) this package's settings at their defaults, in place.

        For scripts that pass TRL's config to our trainer: `args` stays the same object, of the same class, with
        every value it had; only the fields this package adds are set, off. Returns `args`.

        Raises:
            TypeError: `args` is not a TRL `GRPOConfig`.
            ValueError: a value of this package's fields already set on `args` is invalid (as in `__post_init__`).
        """
        if not isinstance(args, TRLGRPOConfig):
            raise TypeError(f"args must be a trl.GRPOConfig, got {type(args).__module__}.{type(args).__name__}")
        for f in dataclasses.fields(cls):
            if not hasattr(args, f.name):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                setattr(args, f.name, default)
        check_trl_fields(args)  # values a script set on the TRL config: checked too
        GRPOConfig._check_fields(args, config_parts(cls))
        return args


# Each feature's part, in the order its fields are declared and documented: found from `GRPOConfig`'s bases.
FEATURE_CONFIGS = config_parts(GRPOConfig)

# TRL's docstring style: the class docstring documents each field under its feature's `> Parameters that control ...`
# header, composed from the parts' sections (`ConfigPart.section`).
GRPOConfig.__doc__ = (
    GRPOConfig.__doc__.rstrip(" ") + "\n\n".join(part.section() for part in FEATURE_CONFIGS) + "\n    "
)

# What each number field of this package accepts beyond its type (`field_checks`), from each part's declarations: a
# new int or float field needs an entry in its part (`ConfigPart` refuses to import without one). HfArgumentParser
# hands a field's metadata to argparse as keyword arguments, so the ranges live in the parts rather than the metadata.
FIELD_RANGES = {name: spec for part in FEATURE_CONFIGS for name, spec in part.ranges.items()}
# The modes each list field takes (one or more, comma-separated on the command line): the registries, read when a
# config is checked, so a mode registered later (a plugin, a test) is accepted
FIELD_MODES = {name: modes for part in FEATURE_CONFIGS for name, modes in part.modes.items()}


def own_fields() -> list[dataclasses.Field]:
    """The fields this package adds to TRL's `GRPOConfig`, in declaration order."""
    trl_fields = {f.name for f in dataclasses.fields(TRLGRPOConfig)}
    return [f for f in dataclasses.fields(GRPOConfig) if f.name not in trl_fields]
