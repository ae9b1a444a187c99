"""`GRPOTrainer`: TRL's GRPO trainer with this package's features composed in one place; `register()`, which makes
`from trl import GRPOConfig, GRPOTrainer` return this package's classes.

TRL's private methods reach this class only as the public hooks of `trl_contact.TRLContact` (each override here
calls `super()`, which ends in TRL's method). At each hook the trainer calls the features listed for that point of
the step in `STEP`, in that order; a feature whose settings are off is not built, and with none built every hook is
a plain call to TRL's method.
"""

import contextlib
import functools
import inspect
import logging
import math
import os
import time
import traceback
from collections.abc import Callable

import trl
import trl.trainer
from transformers.integrations.neftune import deactivate_neftune
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints, speed_metrics
from trl.trainer.utils import get_config_model_id

from .composition import STEP, step_features
from .config import GRPOConfig, TRLGRPOConfig, policy_grouping_requested
from .dataset_preparation import check_dataset_columns, with_row_column
from .feature_api import FEATURE_CLASSES, Feature, Regroup
from .generation.checks import multi_turn_problem
from .launch_engine import engine_fallback
from .policy_groups.feature import check_policy_group_setup
from .resume import (
    EpochSeededSampler,
    RunAlreadyComplete,
    Stopped,
    TerminationHandler,
    TrainingTerminated,
    batch_layout,
    checkpoint_problem,
    checkpoint_step,
    finishing,
    last_complete_checkpoint,
    layout_problem,
    load_resume_state,
    save_layout,
    save_resume_state,
    saved_model,
    stop_signals,
    termination,
    write_manifest,
)
from .trl_contact import GRPOLoopState, TRLContact, output_dir, save_checkpoint, save_model_files, stop_memory_tracking
from .vllm_lora.feature import vllm_lora_engine

logger = logging.getLogger(__name__)
_TRL_INIT = inspect.signature(TRLContact.__init__)  # TRL's GRPOTrainer.__init__: which argument is which


def _check_trainable(model) -> None:
    """Refuse a policy with no trainable parameter: the optimizer would hold none and every step change nothing, while
    the logged loss and gradient norm move as if it learnt (TRL trains it without a word, huggingface/trl#6700).

    Raises:
        ValueError: naming the cause and the fix; for a PEFT model, the adapters loaded frozen (PEFT's
            `PeftModel.from_pretrained` loads them with `is_trainable=False` unless told otherwise), also when
            another parameter (an unfrozen `lm_head`) is trainable.
    """
    from peft import PeftModel

    adapters = [p for name, p in model.named_parameters() if "lora_" in name]
    if isinstance(model, PeftModel) and adapters and not any(p.requires_grad for p in adapters):
        raise ValueError(
            "the model's LoRA adapters are frozen: they were loaded without is_trainable=True "
            "(PeftModel.from_pretrained's default), so training would change nothing of them; load them with "
            "PeftModel.from_pretrained(base, adapter_dir, is_trainable=True), or pass the base model with peft_config"
        )
    if any(p.requires_grad for p in model.parameters()):
        return
    if isinstance(model, PeftModel):
        raise ValueError(
            "the model has no trainable parameter: its LoRA adapters were loaded without is_trainable=True "
            "(PeftModel.from_pretrained's default freezes them), so training would change nothing; load them with "
            "PeftModel.from_pretrained(base, adapter_dir, is_trainable=True), or pass the base model with peft_config"
        )
    raise ValueError(
        f"the model ({type(model).__name__}) has no trainable parameter (requires_grad is False for all of them), so "
        "training would change nothing: unfreeze the parameters to train, or pass peft_config to train LoRA adapters"
    )


def raising_reward_function(error: BaseException, functions: list, names: list[str]) -> str:
    """The name of the reward function among `functions` (with their `names`) whose code is on `error`'s traceback,
    innermost first; "a reward function" when none is (TRL's own check of what one returned)."""
    codes = {}
    for function, name in zip(functions, names, strict=True):
        target = inspect.unwrap(getattr(function, "func", function))  # a functools.partial's function
        call = target if inspect.isfunction(target) else type(target).__call__  # an instance: its method
        code = getattr(call, "__code__", None)
        if code is not None:
            codes[code] = name
    frames = [frame.f_code for frame, _ in traceback.walk_tb(error.__traceback__)]
    return next((codes[code] for code in reversed(frames) if code in codes), "a reward function")


class GRPOTrainer(TRLContact):
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

    Each feature of this package is off until its settings in [`GRPOConfig`] turn it on (the configuration
    reference has a section per feature). The features that are on are in `self.features` (name ->
    `feature_api.Feature`, built in the order `composition.STEP` first names them); each acts at the points of a step
    that `STEP` lists for it, called by this class's hooks and nowhere else. A feature's state is also an attribute
    of the trainer, None while the feature is off, under the name its class `exposes` (`self.policy_groups`, the
    `PolicyGroupState`, for one).

    `policy_group_fn(example: dict) -> str`, when given, names each training prompt's policy group, and turns policy
    grouping on. Policy grouping and prompt skipping add a `policy_group_row` column (the row index) to the training
    dataset, which reward functions receive among their keyword arguments.

    Raises:
        ValueError: a model with no trainable parameter (a PEFT model loaded without `is_trainable=True`; after the
            model loads); policy grouping with an iterable or missing training dataset; a column that a reward function
            or `policy_group_column` reads missing from the training dataset (the message names the column, the
            function and the dataset's columns; raised before the model is loaded); `generation_compile` with
            `tools` or `environment_factory` (before the model is loaded); a setting a feature cannot apply to this
            model, data or engine (the feature's `build` says which).

    FSDP asked for (`args.fsdp`, or `accelerate launch` with an FSDP config) where accelerate sets up another engine
    (on CPU processes it runs plain DDP) is logged as a warning that names the engine used (`launch_engine`).

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
        rows_kept = grouping or args.prompt_skip  # both keep statistics per dataset row
        check_dataset_columns(train_dataset, reward_funcs, args, eval_dataset, rows_kept)  # before the model loads
        given = _TRL_INIT.bind_partial(None, model, reward_funcs, args, train_dataset, *more, **kwargs).arguments
        problem = multi_turn_problem(args, bool(given.get("tools") or given.get("environment_factory")))
        if problem is not None:
            raise ValueError(problem)
        if rows_kept:
            settings = {"policy_group_column": args.policy_group_column, "policy_group_features":
                        args.policy_group_features, "policy_group_fn": policy_group_fn}  # fmt: skip
            needed_by = next((name for name, value in settings.items() if value is not None), "prompt_skip")
            train_dataset = with_row_column(train_dataset, needed_by)
        with vllm_lora_engine(args, model, given):  # vllm_lora_sync="adapter": TRL's engine built with LoRA enabled
            super().__init__(model, reward_funcs, args, train_dataset, *more, **kwargs)
        _check_trainable(self.model)
        fallback = engine_fallback(args, self.accelerator.distributed_type)  # FSDP asked for, DDP set up (on CPU)
        if fallback is not None and self.accelerator.is_main_process:
            logger.warning(fallback)
        self.policy_group_fn = policy_group_fn
        self.run_already_complete = False  # set by `train`
        self.features: dict[str, Feature] = {}  # the features that are on, by name, in the order `STEP` names them
        for feature_class in step_features(STEP):
            if feature_class.exposes in self.__dict__ or hasattr(type(self), feature_class.exposes or ""):
                raise ValueError(
                    f"feature {feature_class.name!r} exposes {feature_class.exposes!r}, an attribute the trainer "
                    "already has: name its state otherwise"
                )
            feature = feature_class.build(self)
            if feature is not None:
                self.features[feature.name] = feature
        self._loss_batch = None  # the copy of the micro-batch TRL's loss is computing on, while it does

    def _acting(self, point: str) -> list[Feature]:
        """The features that are on and act at `point` of the step, in `STEP` order."""
        return [self.features[name] for name in STEP[point] if name in self.features]

    def _announce(self, event: Regroup) -> None:
        """Deliver a regroup (announced by the policy groups) to the features listed under `regroup`."""
        for feature in self._acting("regroup"):
            feature.regroup(event)

    def __getattr__(self, name: str):
        """`self.<name>` for a feature's state (the name its class `exposes`, such as `policy_groups`): the feature's
        `exposed()` while it is on, None while it is off.
        Called only for a name the trainer does not have; raises AttributeError for one no feature exposes."""
        for feature_class in FEATURE_CLASSES.values():
            if feature_class.exposes == name:
                feature = self.__dict__.get("features", {}).get(feature_class.name)
                return None if feature is None else feature.exposed()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self):
        exposed = (feature_class.exposes for feature_class in FEATURE_CLASSES.values() if feature_class.exposes)
        return sorted({*super().__dir__(), *exposed})

    # -- the points of a step (`STEP`): each TRL hook calls the features acting there, then or around TRL's method

    def hook_generate_and_score_completions(self, inputs):
        filters = self._acting("prompt_filter")
        keep = (lambda row: all(f.prompt_filter(row) for f in filters)) if filters else None
        for feature in self._acting("generation_batch"):  # the first that draws the batch draws it
            drawn = feature.generation_batch(inputs, keep)
            if drawn is not None:
                inputs = drawn
                break
        for feature in self._acting("skip_prompts"):
            inputs = feature.skip_prompts(inputs)
        output = super().hook_generate_and_score_completions(inputs)
        for feature in self._acting("advantages"):
            feature.advantages(output)
        return output

    def hook_generate_single_turn(self, prompt_ids, *args, **kwargs):
        acting = self._acting("generation")
        generate = functools.partial(super().hook_generate_single_turn, prompt_ids, *args, **kwargs)  # TRL's
        if not acting:
            return generate()
        with contextlib.ExitStack() as stack:
            for feature in acting:
                stack.enter_context(feature.generation(prompt_ids, generate))
            return generate()
        # Reached only when a feature stopped the generation's error: fast generation fell back to TRL's generation
        # (and put the random state back), so the batch is generated again, as TRL generates it.
        return self.hook_generate_single_turn(prompt_ids, *args, **kwargs)

    def hook_calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        try:
            rewards_per_func = super().hook_calculate_rewards(inputs, prompts, completions, completion_ids_list)
        except Exception as error:  # the user's reward function: named, for the entry points' one line
            error.reward_function = raising_reward_function(error, self.reward_funcs, self.reward_func_names)
            error.step = self.state.global_step + 1
            raise
        for feature in self._acting("rewards"):
            feature.rewards(inputs, rewards_per_func)
        return rewards_per_func

    def hook_compute_loss(self, model, inputs):
        acting = [f for point in ("loss_start", "policy_logps", "loss_end") for f in self._acting(point)]
        if not acting:
            return super().hook_compute_loss(model, inputs)
        batch = dict(inputs)  # TRL buffers `inputs` for `num_iterations` passes: features change this pass's copy
        for feature in self._acting("loss_start"):
            feature.loss_start(model, inputs, batch)
        self._loss_batch = batch
        try:
            loss = super().hook_compute_loss(model, batch)
        finally:
            self._loss_batch = None
        for feature in self._acting("loss_end"):
            loss = feature.loss_end(batch, loss)
        return loss

    def hook_get_per_token_logps_and_entropies(self, **kwargs):
        result = super().hook_get_per_token_logps_and_entropies(**kwargs)
        batch, self._loss_batch = self._loss_batch, None  # TRL's loss computes the policy's first, and only those
        if batch is None:  # outside TRL's loss (old and reference log-probabilities, a feature's own pass)
            return result
        logps, entropies = result[0], result[1]  # (B, T) each; entropies None without compute_entropy
        for feature in self._acting("policy_logps"):
            logps = feature.policy_logps(batch, logps, entropies)
        return (logps, *result[1:])

    def training_step(self, model, *args, **kwargs):
        for feature in self._acting("training_step"):
            feature.training_step(model)
        loss = super().training_step(model, *args, **kwargs)
        for feature in self._acting("training_step_end"):
            feature.training_step_end()
        return loss

    def hook_clip_grad_norm(self, model):
        clip = super().hook_clip_grad_norm  # transformers' clipping
        acting = self._acting("clip_gradients")  # at most one: `STEP` lists one feature here
        return acting[0].clip_gradients(model, clip) if acting else clip(model)

    def resumable_state(self) -> dict:
        """Objects with `state_dict()` / `load_state_dict()` saved in every checkpoint and restored on resume, by
        name: the GRPO loop's, and that of each feature acting at `checkpoint`."""
        state = {"grpo_loop": GRPOLoopState(self)}
        for feature in self._acting("checkpoint"):
            state[feature.name] = feature.state()
        return state

    def train(self, resume_from_checkpoint: str | bool | None = None, *more, **kwargs):
        """TRL's `train`; `resume_from_checkpoint=True` resumes from the newest *complete* checkpoint.

        A checkpoint at or past the run's last step (`max_steps`, or the step `num_train_epochs` ends at) means
        the training is complete (a finished job relaunched): nothing is trained, logged or saved, a warning
        says so, and `self.run_already_complete` is True until the next call (a script then does only the work
        after training it still owes: `resume.saved_model_step` says whether the final model was saved). The
        model then holds the checkpoint's weights and `self.state` its trainer state (so a later `save_model`
        writes the final model again, not the initial one). Returns `TrainOutput(global_step=<the
        checkpoint's>, training_loss=nan, metrics)`: no step ran, so there is no loss, as transformers'
        `train_loss` covers only the steps of the call.

        SIGTERM (a scheduler stopping the job) or Ctrl-C during training (`resume.termination`): one line says so at
        once, the step in progress finishes, its checkpoint is saved (also with `save_strategy="no"`), and
        `TrainingTerminated` (a `KeyboardInterrupt`) is raised; a second signal stops at once, mid-step.

        Raises:
            ValueError: `resume_from_checkpoint` names a checkpoint that is incomplete (says which file), or is True
                and `output_dir` holds no complete checkpoint.
            TrainingTerminated: a stop signal arrived; its message names the signal, the step, the last complete
                checkpoint and how to resume.
        """
        start_time = time.time()
        self.run_already_complete = False
        if resume_from_checkpoint is True:
            path, skipped = last_complete_checkpoint(self.args.output_dir)
            for skipped_path, reason in skipped:
                logger.warning("Skipping incomplete checkpoint %s: %s", skipped_path, reason)
            if path is None:
                found = f" ({len(skipped)} incomplete one(s) skipped)" if skipped else ""
                raise ValueError(
                    f"resume_from_checkpoint=True: no complete checkpoint-N folder in output_dir="
                    f"{self.args.output_dir!r}{found}; start the run without resume_from_checkpoint, or name a "
                    f"checkpoint folder with resume_from_checkpoint=PATH"
                )
            resume_from_checkpoint = path
        elif isinstance(resume_from_checkpoint, str | os.PathLike):
            if not os.path.isdir(resume_from_checkpoint):
                raise ValueError(
                    f"resume_from_checkpoint={str(resume_from_checkpoint)!r} is not a folder; give a checkpoint-N "
                    "folder of the run, or True for the newest complete one in output_dir"
                )
            problem = checkpoint_problem(resume_from_checkpoint)
            if problem is not None:
                raise ValueError(f"resume_from_checkpoint={str(resume_from_checkpoint)!r} is incomplete: {problem}")
        if resume_from_checkpoint:
            step = checkpoint_step(resume_from_checkpoint)
            layout = batch_layout(self.args, self.accelerator.num_processes)
            problem = layout_problem(str(resume_from_checkpoint), layout, step)
            if problem is not None and not 0 < self.args.max_steps <= step:  # a finished run trains nothing
                raise ValueError(problem)
            logger.warning("Resuming from %s (step %d)", resume_from_checkpoint, step)
        termination.note_training_started()
        stopping = TerminationHandler(self.accelerator)  # a stop signal: a checkpoint at the step's end, then stop
        self.add_callback(stopping)
        try:
            with stop_signals(), finishing("the current step is done and its checkpoint saved", stop_after=False):
                output = super().train(resume_from_checkpoint, *more, **kwargs)
        except RunAlreadyComplete as complete:
            return self._end_complete_run(complete, start_time)
        except Stopped as stop:  # a second signal: at once, mid-step
            raise TrainingTerminated(stop.signal_number, self.state.global_step, self.args.output_dir, True) from None
        finally:
            self.remove_callback(stopping)
        if stopping.received is not None:
            raise TrainingTerminated(stopping.received, self.state.global_step, self.args.output_dir)
        return output

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
            "Run already complete at step %d (%s): nothing to train (%s is of that step)",
            complete.global_step,
            bound,
            complete.checkpoint,
        )
        return TrainOutput(complete.global_step, float("nan"), metrics)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """transformers' `save_model`, written so that a save cut short is never taken for complete
        (`resume.saved_model`): into a staging folder, then each file moved into `output_dir`; a save that is not a
        checkpoint's then writes `trl_grpo_ext_model.json` (the files and the step) last. A first stop signal during
        it waits for the save to finish (`resume.termination.finishing`); after training, a complete checkpoint of
        the step is then kept too (`save_checkpoint_now`), so that a requeued run finds the step it stopped at.

        Raises:
            Stopped: a stop signal arrived during the save (after it, unless a second one stopped it at once).
        """
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        done = f"the model is saved in {output_dir}"
        with finishing("the model is saved", done, self.args.output_dir, self.state.global_step):
            staging = os.path.join(output_dir, saved_model.STAGING_NAME)
            if self.args.should_save:
                saved_model.clear_staging(output_dir)
            save_model_files(super().save_model, staging)
            if self.is_deepspeed_enabled or self.is_fsdp_enabled:  # every process wrote its part
                self.accelerator.wait_for_everyone()
            if self.args.should_save:
                saved_model.move_into_place(output_dir, None if _internal_call else self.state.global_step)
            if self.args.push_to_hub and not _internal_call:
                self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)
            if termination.received() is not None and not _internal_call and not self.is_in_train:
                self.save_checkpoint_now()  # the step the run stopped at, for a requeued run

    def save_checkpoint_now(self) -> str | None:
        """Save a complete checkpoint of the current step into `output_dir` now, as at `save_steps`, unless one is
        there; its path (None before the first step). For a run stopped after training (the final save, an
        evaluation), so that a requeued `train(resume_from_checkpoint=True)` finds the last step and the work after
        training can be done then. A first stop signal during it waits for it."""
        step = self.state.global_step
        if step == 0:
            return None
        path = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if os.path.isdir(path) and checkpoint_problem(path) is None:
            return path
        with finishing(f"the checkpoint of step {step} is saved", stop_after=False):
            save_checkpoint(self, self.model_wrapped)
        return path

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
            save_layout(checkpoint_dir, batch_layout(self.args, self.accelerator.num_processes))
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
            if name in state:
                obj.load_state_dict(state[name])
            else:  # a feature turned on since the checkpoint was written
                logger.warning(
                    "%s holds no state of %s (it was off when the checkpoint was written): it starts afresh, so the "
                    "resumed run is not the uninterrupted one",
                    checkpoint,
                    name,
                )


# The drop-in swap (`register()`): the modules that export the classes by name; `trl.trainer.grpo_trainer` itself
# keeps TRL's class, which ours subclasses.
_MODULES = (trl, trl.trainer)
_NAMES = ("GRPOConfig", "GRPOTrainer")
_originals: dict[tuple[str, str], type] = {}


def register() -> None:
    """Point `trl.GRPOConfig` / `trl.GRPOTrainer` (and `trl.trainer.*`) at `trl_grpo_ext`'s classes.

    Code that imports the names afterwards (`from trl import GRPOTrainer`, as `trl/scripts/grpo.py` does inside its
    functions) gets the extension classes. A name bound by an import that ran before `register()` keeps TRL's class.
    Calling it again changes nothing.
    """
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
