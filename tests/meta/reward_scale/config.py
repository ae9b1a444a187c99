"""The reward scale's settings: `RewardScaleFields`, a part of `GRPOConfig` (`REWARD_SCALE_CONFIG`)."""

import dataclasses
from dataclasses import dataclass

from trl_grpo_ext.field_checks import ConfigPart, Range


@dataclass
class RewardScaleFields:
    """
    > Parameters that control the reward scale (a test feature)

    reward_scale (`float`, *optional*, defaults to `1.0`):
        Factor on every advantage.
    reward_scale_from_step (`int`, *optional*, defaults to `0`):
        First global step at which the factor applies.
    """

    reward_scale: float = dataclasses.field(default=1.0, metadata={"help": "Factor on every advantage."})
    reward_scale_from_step: int = dataclasses.field(
        default=0, metadata={"help": "First global step at which the factor applies."}
    )


def check_reward_scale(args) -> None:
    """A scale other than 1 needs `beta=0.0`. Raises ValueError naming both values."""
    if args.reward_scale != 1.0 and args.beta != 0.0:
        raise ValueError(f"reward_scale={args.reward_scale} needs beta=0.0, got beta={args.beta}")


REWARD_SCALE_CONFIG = ConfigPart(
    RewardScaleFields,
    ranges={"reward_scale": Range(0.0, 10.0, low_open=True), "reward_scale_from_step": Range(0)},
    checks=(check_reward_scale,),
)
