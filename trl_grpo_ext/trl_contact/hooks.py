"""`TRLContact`, the base of `trl_grpo_ext.GRPOTrainer` and the only class of the package that overrides a private
method of TRL's trainer (`surface.PRIVATE_METHODS`): each override forwards to a public hook (`hook_name`)."""

import inspect

from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer


def hook_name(method: str) -> str:
    """The public hook a private method forwards to: `_compute_loss` -> `hook_compute_loss`."""
    return "hook_" + method.lstrip("_")


class TRLContact(TRLGRPOTrainer):
    """TRL's `GRPOTrainer` with each private method this package extends forwarded to a public hook.

    `_x(...)` calls `self.hook_x(...)`; `hook_x` here calls TRL's `_x`. Features override `hook_x` and call `super()`.
    `hook_get_per_token_logps_and_entropies` receives every argument by name (`compute_entropy` included, however
    TRL passed it).
    """

    _tag_names = [*TRLGRPOTrainer._tag_names, "trl-grpo-ext"]

    def _generate_and_score_completions(self, inputs):
        return self.hook_generate_and_score_completions(inputs)

    def hook_generate_and_score_completions(self, inputs):
        return super()._generate_and_score_completions(inputs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return self.hook_calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def hook_calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        bound = _LOGPS_SIGNATURE.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments["self"]
        return self.hook_get_per_token_logps_and_entropies(**arguments)

    def hook_get_per_token_logps_and_entropies(self, **kwargs):
        return super()._get_per_token_logps_and_entropies(**kwargs)

    def _compute_loss(self, model, inputs):
        return self.hook_compute_loss(model, inputs)

    def hook_compute_loss(self, model, inputs):
        return super()._compute_loss(model, inputs)

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        return self.hook_generate_single_turn(prompt_ids, *args, **kwargs)

    def hook_generate_single_turn(self, prompt_ids, *args, **kwargs):
        return super()._generate_single_turn(prompt_ids, *args, **kwargs)

    def _get_train_sampler(self, dataset=None):
        return self.hook_get_train_sampler(dataset)

    def hook_get_train_sampler(self, dataset=None):
        return super()._get_train_sampler(dataset)

    def _save_checkpoint(self, model, trial):
        return self.hook_save_checkpoint(model, trial)

    def hook_save_checkpoint(self, model, trial):
        return super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        return self.hook_load_optimizer_and_scheduler(checkpoint)

    def hook_load_optimizer_and_scheduler(self, checkpoint):
        return super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint):
        return self.hook_load_rng_state(checkpoint)

    def hook_load_rng_state(self, checkpoint):
        return super()._load_rng_state(checkpoint)

    def _clip_grad_norm(self, model):
        return self.hook_clip_grad_norm(model)

    def hook_clip_grad_norm(self, model):
        return super()._clip_grad_norm(model)


_LOGPS_SIGNATURE = inspect.signature(TRLGRPOTrainer._get_per_token_logps_and_entropies)
