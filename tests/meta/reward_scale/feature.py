"""The reward scale's trainer wiring: `RewardScale`, called at the `advantages` point of the step."""

from trl_grpo_ext.feature_api import Feature


class RewardScale(Feature):
    """Multiplies the advantages of the generation batches drawn from `reward_scale_from_step` on by `reward_scale`.
    Built when `reward_scale` is not 1.

    Attributes:
        scaled: the global step of each generation batch it scaled.
    """

    name = "reward_scale"
    exposes = "reward_scale_steps"  # trainer.reward_scale_steps: `scaled`, None while the feature is off
    writes = ("output['advantages']",)

    @classmethod
    def build(cls, trainer) -> "RewardScale | None":
        return cls(trainer) if getattr(trainer.args, "reward_scale", 1.0) != 1.0 else None

    def __init__(self, trainer):
        super().__init__(trainer)
        self.scaled: list[int] = []

    def exposed(self) -> list[int]:
        return self.scaled

    def advantages(self, output: dict) -> None:
        if self.trainer.state.global_step >= self.trainer.args.reward_scale_from_step:
            output["advantages"] = output["advantages"] * self.trainer.args.reward_scale
            self.scaled.append(self.trainer.state.global_step)
