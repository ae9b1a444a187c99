"""`GRPOTrainer`: TRL's GRPO trainer, extended only through the hooks of `trl_contact.TRLContact` (each override
calls `super()`)."""

import logging
import math
import os
import time
from collections.abc import Callable

from transformers.integrations.neftune import deactivate_neftune
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints, speed_metrics
from trl.trainer.utils import get_config_model_id

from .config import GRPOConfig, TRLGRPOConfig, policy_grouping_requested
from .dataset_checks import check_dataset_columns
from .entropy_hooks import EntropyRegHooks
from .generation.hooks import FastGenerationHooks
from .grad_reg_hooks import GradRegHooks
from .policy_group_hooks import PolicyGroupHooks, check_policy_group_setup, with_row_column
from .resume import (
    EpochSeededSampler,
    RunAlreadyComplete,
    checkpoint_problem,
    last_complete_checkpoint,
    load_resume_state,
    save_resume_state,
    write_manifest,
)
from .trl_contact import GRPOLoopState, TRLContact, output_dir, stop_memory_tracking

logger = logging.getLogger(__name__)


class GRPOTrainer(FastGenerationHooks, EntropyRegHooks, GradRegHooks, PolicyGroupHooks, TRLContact):
    """
    Drop-in replacement for [`trl.GRPOTrainer`]: same constructor, same reward function forms, `peft_config`,
    callbacks and loggers.

    GRPO (Shao et al., DeepSeekMath, arXiv:2402.03300, eq. 3) samples a generation group of `num_generations`
    completions per prompt, scores them with the reward functions, and uses each completion's reward relative to its
    generation group as the advantage. While every [`GRPOConfig`] setting of this package is at its default, an
    uninterrupted run is bit for bit the one `trl.GRPOTrainer` makes.

    A resumed run continues exactly as the uninterrupted one (`trl_grpo_ext.resume` says what TRL loses and how it
    comes back): checkpoints also hold the GRPO loop's state and every object in `resumable_state()`, and are marked
    complete only once fully written. `train(resume_from_checkpoint=True)` picks the newest complete checkpoint and
    says which incomplete ones it skipped. Resuming a finished run (its checkpoint at the last step) trains nothing and
    changes no file: `train` says so and sets `run_already_complete`.

    Dynamic policy grouping (off unless `GRPOConfig.policy_group_column` / `policy_group_features` is set, or
    `policy_group_fn` is given): `policy_group_fn(example: dict) -> str` names each training prompt's policy group;
    the trainer then keeps per-group statistics and weights (`self.policy_groups`, a `PolicyGroupState`) and applies
    them to the advantages and to which prompts are generated for. It adds a `policy_group_row` column (the row
    index) to the training dataset, which reward functions receive among their keyword arguments.

    Adaptive gradient regularization (off unless `GRPOConfig.grad_reg` or `kl_target` is set; `grad_reg_hooks`):
    ZClip and AGC where the Trainer clips gradients, a guard that skips non-finite steps (`self.grad_reg_state`
    counts them; `NonFiniteGradientError` after `grad_reg_max_skips` in a row), and an adaptive KL coefficient β.

    Fast generation (off unless `GRPOConfig.generation_compile` or `generation_lora_merge` is set;
    `trl_grpo_ext.generation`): a static KV cache with a compiled decode step, and generation from LoRA weights merged
    in place (restored bit for bit) or into a separate generation copy (`self.fast_generation`).

    Raises:
        ValueError: policy grouping with an iterable or missing training dataset; a column that a reward function
            or `policy_group_column` reads missing from the training dataset (the message names the column, the
            function and the dataset's columns; raised before the model is loaded); `grad_reg` with `agc` under
            DeepSpeed or FSDP; a fast-generation setting that cannot apply to this model
            (`FastGenerationHooks._init_fast_generation` says which).

    `args` may be TRL's `GRPOConfig` or a subclass of it (a script that swapped only the trainer import): the object
    is kept, and this package's settings are added to it at their defaults. With `args=None` the default output
    folder is TRL's (`<model name>-GRPO`).
    """

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: TRLGRPOConfig | None = None,
        train_dataset=None,
        *more,
        policy_group_fn: Callable[[dict], str] | None = None,
        **kwargs,
    ):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = GRPOConfig(f"{model_name.split('/')[-1]}-GRPO")
        elif not isinstance(args, GRPOConfig):
            args = GRPOConfig.add_defaults(args)
        grouping = policy_grouping_requested(args) or policy_group_fn is not None
        check_policy_group_setup(args, grouping)
        eval_dataset = more[0] if more else kwargs.get("eval_dataset")
        check_dataset_columns(train_dataset, reward_funcs, args, eval_dataset)  # before the model is loaded
        if grouping:
            train_dataset = with_row_column(train_dataset)
        super().__init__(model, reward_funcs, args, train_dataset, *more, **kwargs)
        self.policy_group_fn = policy_group_fn
        self.run_already_complete = False  # set by `train`
        self.policy_groups = self._build_policy_groups() if grouping else None
        self._init_entropy_reg()
        self._init_grad_reg()
        self._init_fast_generation()

    def resumable_state(self) -> dict:
        """Objects with `state_dict()` / `load_state_dict()` saved in every checkpoint and restored on resume, by
        name. Each feature of this package that keeps state across steps adds its object here."""
        state = {"grpo_loop": GRPOLoopState(self)}
        if self.policy_groups is not None:
            state["policy_groups"] = self.policy_groups
        if self.entropy_reg_state is not None:
            state["entropy_reg"] = self.entropy_reg_state
        if self.grad_reg_state is not None:
            state["grad_reg"] = self.grad_reg_state
        return state

    def train(self, resume_from_checkpoint: str | bool | None = None, *more, **kwargs):
        """TRL's `train`; `resume_from_checkpoint=True` resumes from the newest *complete* checkpoint.

        A checkpoint at or past the run's last step (`max_steps`, or the step `num_train_epochs` ends at) means the
        run is complete (a finished job relaunched): nothing is trained, logged, saved or evaluated, a warning says so,
        and `self.run_already_complete` is True until the next call. The model then holds the checkpoint's weights
        and `self.state` its trainer state (so a later `save_model` writes the final model again, not the initial
        one). Returns `TrainOutput(global_step=<the checkpoint's>, training_loss=nan, metrics)`: no step ran, so
        there is no loss, as transformers' `train_loss` covers only the steps of the call.

        Raises:
            ValueError: `resume_from_checkpoint` names a checkpoint that is incomplete (says which file), or is True
                and `output_dir` holds no complete checkpoint.
        """
        start_time = time.time()
        self.run_already_complete = False
        if resume_from_checkpoint is True:
            path, skipped = last_complete_checkpoint(self.args.output_dir)
            for skipped_path, reason in skipped:
                logger.warning("Skipping incomplete checkpoint %s: %s", skipped_path, reason)
            if path is None:
                raise ValueError(f"No complete checkpoint found in output_dir={self.args.output_dir!r}")
            if skipped:
                logger.warning("Resuming from %s, the last complete checkpoint", path)
            resume_from_checkpoint = path
        elif isinstance(resume_from_checkpoint, str | os.PathLike):
            problem = checkpoint_problem(resume_from_checkpoint)
            if problem is not None:
                raise ValueError(f"resume_from_checkpoint={str(resume_from_checkpoint)!r} is incomplete: {problem}")
        try:
            return super().train(resume_from_checkpoint, *more, **kwargs)
        except RunAlreadyComplete as complete:
            return self._end_complete_run(complete, start_time)

    def _end_complete_run(self, complete: RunAlreadyComplete, start_time: float) -> TrainOutput:
        """Undo what transformers set up for training (as its end of training does) and report the finished run."""
        self.is_in_train = False
        if self.neftune_noise_alpha is not None:
            deactivate_neftune(self.model, self.neftune_hook_handle, self.accelerator)
        metrics = speed_metrics("train", start_time, num_samples=0, num_steps=0)
        metrics.update(total_flos=self.state.total_flos, train_loss=float("nan"))
        stop_memory_tracking(self, metrics)
        self.run_already_complete = True
        bound = f"max_steps={self.args.max_steps}"
        if self.args.max_steps <= 0:
            bound = f"num_train_epochs={self.args.num_train_epochs}: {complete.max_steps} steps"
        logger.warning(
            "Run already complete at step %d (%s): nothing to train; %s and %s are left as they are",
            complete.global_step,
            bound,
            complete.checkpoint,
            self.args.output_dir,
        )
        return TrainOutput(complete.global_step, float("nan"), metrics)

    def hook_get_train_sampler(self, dataset=None):
        self._epoch_sampler = EpochSeededSampler(super().hook_get_train_sampler(dataset))
        return self._epoch_sampler

    def hook_save_checkpoint(self, model, trial):
        run_dir = output_dir(self, trial)
        checkpoint_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        # Our state first: a folder holding it but no manifest is then known to be an unfinished save of ours.
        os.makedirs(checkpoint_dir, exist_ok=True)
        state = {name: obj.state_dict() for name, obj in self.resumable_state().items()}
        save_resume_state(checkpoint_dir, self.accelerator.process_index, state)
        # Older checkpoints are rotated out only once this one is complete, so a crash mid-save keeps one to resume.
        save_total_limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super().hook_save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = save_total_limit
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            write_manifest(checkpoint_dir)
            rotate_checkpoints(run_dir, save_total_limit, self.state.best_model_checkpoint, use_mtime=True)

    def hook_load_rng_state(self, checkpoint):
        # Called once where the resumed run rejoins the uninterrupted one, after transformers reset its running loss.
        super().hook_load_rng_state(checkpoint)
        GRPOLoopState.restore_pending_loss(self)

    def hook_load_optimizer_and_scheduler(self, checkpoint):
        # Resuming: transformers has loaded the checkpoint's weights and trainer state, and set `state.max_steps` to
        # this run's last step; nothing has been trained or logged yet. transformers would train one step past it.
        if checkpoint is not None and self.state.global_step >= self.state.max_steps:
            raise RunAlreadyComplete(checkpoint, self.state.global_step, self.state.max_steps)
        super().hook_load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        # The checkpoint's trainer state is loaded by now. Under several processes accelerate's wrappers do not
        # forward `set_epoch` to the sampler after a resume, so the sampler is told the epoch here.
        if getattr(self, "_epoch_sampler", None) is not None:
            self._epoch_sampler.set_epoch(math.floor(self.state.epoch or 0))
        state = load_resume_state(checkpoint, self.accelerator.process_index)
        if state is None:
            logger.warning(
                "%s holds no trl_grpo_ext state for process %d (written by stock TRL, or with another number of "
                "processes): resuming, but not exactly as the uninterrupted run",
                checkpoint,
                self.accelerator.process_index,
            )
            return
        for name, obj in self.resumable_state().items():
            obj.load_state_dict(state[name])
