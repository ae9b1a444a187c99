"""`GRPOTrainer`: TRL's GRPO trainer, extended only through its hooks (each override calls `super()`)."""

import trl
from trl.trainer.utils import get_config_model_id

from .config import GRPOConfig


class GRPOTrainer(trl.GRPOTrainer):
    """
    Drop-in replacement for [`trl.GRPOTrainer`]: same constructor, same reward function forms, `peft_config`,
    callbacks and loggers.

    GRPO (Shao et al., DeepSeekMath, arXiv:2402.03300, eq. 3) samples a generation group of `num_generations`
    completions per prompt, scores them with the reward functions, and uses each completion's reward relative to its
    generation group as the advantage. This class adds nothing while every [`GRPOConfig`] setting of this package is at
    its default: a run is then bit for bit the one `trl.GRPOTrainer` makes.

    `args` may be a plain `trl.GRPOConfig` (a script that swapped only the trainer import): its values are kept and
    this package's settings take their defaults. With `args=None` the default output folder is TRL's
    (`<model name>-GRPO`).
    """

    _tag_names = [*trl.GRPOTrainer._tag_names, "trl-grpo-ext"]

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | trl.GRPOConfig | None = None, *more, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = GRPOConfig(f"{model_name.split('/')[-1]}-GRPO")
        elif not isinstance(args, GRPOConfig):
            args = GRPOConfig.from_trl(args)
        super().__init__(model, reward_funcs, args, *more, **kwargs)
