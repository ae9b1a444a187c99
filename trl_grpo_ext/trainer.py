"""`GRPOTrainer`: TRL's GRPO trainer, extended only through its hooks (each override calls `super()`)."""

import logging
import math
import os
from collections.abc import Callable

import torch
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer
from trl.trainer.utils import get_config_model_id

from . import grouping
from . import policy_groups as pg
from .config import GRPOConfig, TRLGRPOConfig, policy_grouping_requested
from .policy_group_state import PolicyGroupState
from .resume import (
    EpochSeededSampler,
    checkpoint_problem,
    last_complete_checkpoint,
    load_resume_state,
    save_resume_state,
    write_manifest,
)

logger = logging.getLogger(__name__)

ROW_COLUMN = "policy_group_row"  # added to the training dataset when policy grouping is on: each row's index


def with_row_column(dataset):
    """`dataset` with its row index in `ROW_COLUMN`, so that rows keep their policy group through TRL's loader.

    Raises:
        ValueError: no dataset, an iterable dataset (policy grouping needs to index rows), or one that already
            has the column.
    """
    if dataset is None or not hasattr(dataset, "add_column"):
        raise ValueError(f"policy grouping needs a map-style datasets.Dataset as train_dataset, got {type(dataset)}")
    if ROW_COLUMN in dataset.column_names:
        raise ValueError(f"the training dataset already has a column named {ROW_COLUMN!r}, which policy grouping uses")
    return dataset.add_column(ROW_COLUMN, list(range(len(dataset))))


class _GRPOLoopState:
    """The training loop's state that TRL and transformers do not checkpoint: the micro-step counter `_step`, the
    buffered generations reused for `steps_per_generation * num_iterations` micro-steps, and what was gathered since
    the last log (with `logging_steps > 1`): TRL's metrics and transformers' running loss."""

    def __init__(self, trainer: "GRPOTrainer"):
        self.trainer = trainer

    def state_dict(self) -> dict:
        trainer = self.trainer
        return {
            "step": trainer._step,
            "buffered_inputs": trainer._buffered_inputs,
            "pending_metrics": {key: list(values) for key, values in trainer._metrics["train"].items()},
            "pending_loss": trainer._tr_loss.item(),
            "last_logged_step": trainer._globalstep_last_logged,
        }

    def load_state_dict(self, state: dict) -> None:
        trainer = self.trainer
        trainer._step = state["step"]
        trainer._buffered_inputs = state["buffered_inputs"]
        trainer._metrics["train"].clear()
        trainer._metrics["train"].update(state["pending_metrics"])
        # transformers resets its running loss after this hook runs: `_load_rng_state` puts it back.
        trainer._resumed_loss = (state["pending_loss"], state["last_logged_step"])


class GRPOTrainer(TRLGRPOTrainer):
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
    says which incomplete ones it skipped.

    Dynamic policy grouping (off unless `GRPOConfig.policy_group_column` / `policy_group_features` is set, or
    `policy_group_fn` is given): `policy_group_fn(example: dict) -> str` names each training prompt's policy group;
    the trainer then keeps per-group statistics and weights (`self.policy_groups`, a `PolicyGroupState`) and applies
    them to the advantages and to which prompts are generated for. It adds a `policy_group_row` column (the row
    index) to the training dataset, which reward functions receive among their keyword arguments.

    Raises:
        ValueError: policy grouping with an iterable or missing training dataset, or with a missing column (the
            message lists the dataset's columns).

    `args` may be TRL's `GRPOConfig` or a subclass of it (a script that swapped only the trainer import): the object
    is kept, and this package's settings are added to it at their defaults. With `args=None` the default output
    folder is TRL's (`<model name>-GRPO`).
    """

    _tag_names = [*TRLGRPOTrainer._tag_names, "trl-grpo-ext"]

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
        if grouping:
            train_dataset = with_row_column(train_dataset)
        super().__init__(model, reward_funcs, args, train_dataset, *more, **kwargs)
        self.policy_group_fn = policy_group_fn
        self.policy_groups = self._build_policy_groups() if grouping else None
        self._policy_group_batch = None  # (gathered rewards per function (N, F), dataset rows (N,)) of this batch
        self._policy_group_entropies = None  # (B, T) entropies of the last loss computation

    def resumable_state(self) -> dict:
        """Objects with `state_dict()` / `load_state_dict()` saved in every checkpoint and restored on resume, by
        name. Each feature of this package that keeps state across steps adds its object here."""
        state = {"grpo_loop": _GRPOLoopState(self)}
        if self.policy_groups is not None:
            state["policy_groups"] = self.policy_groups
        return state

    # ----- policy grouping: wiring of `grouping`, `policy_groups` and `policy_group_state` into TRL's hooks -----

    def _build_policy_groups(self) -> PolicyGroupState:
        args, dataset = self.args, self.train_dataset
        features = None
        if self.policy_group_fn is not None:
            names, assignment = grouping.assign_from_callable(dataset, self.policy_group_fn)
        elif args.policy_group_column is not None:
            names, assignment = grouping.assign_from_column(dataset, args.policy_group_column)
        else:
            features = self._policy_group_features(args.policy_group_features)
            names, assignment = grouping.kmeans_groups(features, args.num_policy_groups, args.seed)
        names, assignment, merges = grouping.merge_small_groups(
            names, assignment, args.policy_group_min_size, features
        )
        for reason in merges:
            logger.warning("Policy groups: %s", reason)
        state = PolicyGroupState(names, torch.as_tensor(assignment), args.seed)
        state.events.extend(merges)
        logger.info("Policy groups: %s", dict(zip(names, torch.bincount(state.assignment).tolist(), strict=True)))
        return state

    def _policy_group_features(self, kind: str):
        texts = grouping.prompt_texts(self.train_dataset)
        if kind == "embedding":
            model = self.accelerator.unwrap_model(self.model)
            return grouping.embedding_features(model, self.processing_class, texts)
        return grouping.tfidf_features(texts)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.policy_groups is not None and self.model.training:
            rows = torch.tensor([row[ROW_COLUMN] for row in inputs], device=rewards_per_func.device)
            self._policy_group_batch = (rewards_per_func, self.accelerator.gather(rows))
        elif self.policy_groups is not None:
            self._log_eval_policy_groups(inputs, rewards_per_func)
        return rewards_per_func

    def _total_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """(N,) weighted sum over reward functions as TRL forms it; NaN where every function returned None."""
        rewards_per_func = rewards_per_func.cpu()
        rewards = (rewards_per_func * self.reward_weights.cpu()).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards

    def _log_eval_policy_groups(self, inputs: list[dict], rewards_per_func: torch.Tensor) -> None:
        """Mean evaluation reward per policy group; a prompt whose group the training run does not know (or that
        k-means grouping cannot place) is reported under `unassigned`."""
        known = set(self.policy_groups.names)
        if self.policy_group_fn is not None:
            names = [self.policy_group_fn(row) for row in inputs]
        elif self.args.policy_group_column is not None:
            names = [row.get(self.args.policy_group_column) for row in inputs]
        else:
            names = [None] * len(inputs)
        names = gather_object([str(name) if str(name) in known else "unassigned" for name in names])
        rewards = self._total_rewards(rewards_per_func)
        for name in sorted(set(names)):
            values = rewards[torch.tensor([n == name for n in names])]
            self._metrics["eval"][f"policy_groups/{name}/reward"].append(torch.nanmean(values).item())

    def _generate_and_score_completions(self, inputs):
        grouping_on = self.policy_groups is not None and self.model.training
        if grouping_on and self.args.policy_group_sampling != "uniform":
            inputs = self._draw_generation_batch(len(inputs))
        output = super()._generate_and_score_completions(inputs)
        if grouping_on:
            self._apply_policy_groups(output)
        return output

    def _draw_generation_batch(self, local_size: int) -> list[dict]:
        """Replace the data loader's generation batch by prompts drawn per policy group: the same global draw on
        every process (each takes its slice), every prompt repeated `num_generations` times, as TRL's sampler."""
        num_prompts = local_size * self.accelerator.num_processes // self.num_generations
        rows = self.policy_groups.draw_rows(num_prompts, self.args).repeat_interleave(self.num_generations)
        start = self.accelerator.process_index * local_size
        return [self.train_dataset[int(row)] for row in rows[start : start + local_size]]

    def _apply_policy_groups(self, output: dict) -> None:
        args, state = self.args, self.policy_groups
        rewards_per_func, rows = (t.cpu() for t in self._policy_group_batch)  # (N, F), (N,)
        rewards = self._total_rewards(rewards_per_func)  # (N,)
        lengths = self.accelerator.gather(output["completion_mask"].sum(dim=1)).cpu()  # (N,) tokens
        state.observe(rows[:: self.num_generations], rewards, lengths, self.num_generations, args.policy_group_ema)
        step = self.state.global_step
        state.maybe_update_weights(step, args)
        self._maybe_regroup(step)

        group_ids = state.assignment[rows]  # (N,)
        advantages = output["advantages"]  # (B,) this process's part of the N completions
        start = self.accelerator.process_index * len(advantages)
        local = slice(start, start + len(advantages))
        if args.advantage_baseline == "policy_group":
            scale = self.scale_rewards
            global_advantages = pg.policy_group_advantages(rewards, group_ids, state.num_groups, scale)
            advantages = global_advantages[local].to(advantages)
        if args.policy_group_loss_weighting:
            advantages = advantages * pg.loss_weights(state.weights, group_ids)[local].to(advantages)
        output["advantages"] = advantages
        output["policy_group_ids"] = group_ids[local].to(output["completion_mask"].device)
        for key, value in state.metrics().items():
            self._metrics["train"][key].append(value)

    def _maybe_regroup(self, step: int) -> None:
        args, state = self.args, self.policy_groups
        if args.policy_group_refine_step is not None and not state.refined and step >= args.policy_group_refine_step:
            state.refined = True
            features = self._policy_group_features(args.policy_group_features or "tfidf")
            names, assignment = grouping.refine_groups(
                state.names, state.assignment.numpy(), features, args.policy_group_refine_parts, args.seed,
                args.max_policy_groups,
            )  # fmt: skip
            self._regroup(names, assignment, f"step {step}: refined {state.num_groups} groups into {len(names)}")
        if args.policy_group_regroup_steps is None or step - state.last_regroup_step < args.policy_group_regroup_steps:
            return
        state.last_regroup_step = step
        seen = state.has_ema["reward"]
        merge = grouping.plan_merge(
            state.names, torch.where(seen, state.ema["reward"], torch.nan).numpy(),
            torch.where(seen, state.ema["reward_std"], torch.nan).numpy(), args.policy_group_merge_tol,
            args.min_policy_groups,
        )  # fmt: skip
        if merge is not None:
            i, j, reason = merge
            self._regroup(*grouping.apply_merge(state.names, state.assignment.numpy(), i, j), f"step {step}: {reason}")
            return
        if state.num_groups >= args.max_policy_groups:
            return
        for group, name in enumerate(state.names):
            members = (state.assignment == group) & ~torch.isnan(state.prompt_success)
            prompt_ids = members.nonzero().flatten()
            split = grouping.plan_split(
                name, prompt_ids.numpy(), state.prompt_success[prompt_ids].numpy(), args.policy_group_min_size,
                args.policy_group_split_gap,
            )  # fmt: skip
            if split is not None:
                _, high_ids, reason = split
                names, assignment = grouping.apply_split(state.names, state.assignment.numpy(), group, high_ids)
                self._regroup(names, assignment, f"step {step}: {reason}")
                return

    def _regroup(self, names, assignment, reason: str) -> None:
        self.policy_groups.regroup(names, torch.as_tensor(assignment), reason)
        logger.warning("Policy groups: %s -> %s", reason, self.policy_groups.names)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self.policy_groups is not None and self.model.training and kwargs.get("compute_entropy"):
            self._policy_group_entropies = result[1].detach()
        return result

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        entropies, self._policy_group_entropies = self._policy_group_entropies, None
        if entropies is not None and "policy_group_ids" in inputs:
            mask = inputs["completion_mask"]
            per_completion = (entropies * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B,) nats per token
            k = self.policy_groups.num_groups
            ids = inputs["policy_group_ids"]  # set after any regroup of this generation batch, so still valid
            sums = torch.zeros(k, device=mask.device).index_add_(0, ids, per_completion.float())
            counts = torch.zeros(k, device=mask.device).index_add_(0, ids, torch.ones_like(per_completion.float()))
            totals = self.accelerator.gather(torch.stack([sums, counts])[None]).sum(0).double().cpu()  # (2, K)
            means = totals[0] / totals[1].clamp(min=1)
            self.policy_groups.observe_entropy(means, totals[1], self.args.policy_group_ema)
        return loss

    def train(self, resume_from_checkpoint: str | bool | None = None, *more, **kwargs):
        """TRL's `train`; `resume_from_checkpoint=True` resumes from the newest *complete* checkpoint.

        Raises:
            ValueError: `resume_from_checkpoint` names a checkpoint that is incomplete (says which file), or is True
                and `output_dir` holds no complete checkpoint.
        """
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
        return super().train(resume_from_checkpoint, *more, **kwargs)

    def _get_train_sampler(self, dataset=None):
        self._epoch_sampler = EpochSeededSampler(super()._get_train_sampler(dataset))
        return self._epoch_sampler

    def _save_checkpoint(self, model, trial):
        run_dir = self._get_output_dir(trial=trial)
        checkpoint_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        # Our state first: a folder holding it but no manifest is then known to be an unfinished save of ours.
        os.makedirs(checkpoint_dir, exist_ok=True)
        state = {name: obj.state_dict() for name, obj in self.resumable_state().items()}
        save_resume_state(checkpoint_dir, self.accelerator.process_index, state)
        # Older checkpoints are rotated out only once this one is complete, so a crash mid-save keeps one to resume.
        save_total_limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = save_total_limit
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            write_manifest(checkpoint_dir)
            rotate_checkpoints(run_dir, save_total_limit, self.state.best_model_checkpoint, use_mtime=True)

    def _load_rng_state(self, checkpoint):
        # Called once where the resumed run rejoins the uninterrupted one, after transformers reset its running loss.
        super()._load_rng_state(checkpoint)
        resumed_loss = getattr(self, "_resumed_loss", None)
        if resumed_loss is not None:
            self._tr_loss += resumed_loss[0]
            self._globalstep_last_logged = resumed_loss[1]
            self._resumed_loss = None

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
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
