"""Policy grouping wired into TRL's `GRPOTrainer` through the hooks of `trl_contact.TRLContact`: a mixin of
`trl_grpo_ext.GRPOTrainer` (each override calls `super()`). The formulas are in `policy_groups`, the grouping rules
in `grouping`, the state in `policy_group_state`.
"""

import logging

import torch
from accelerate.utils import gather_object

from . import grouping
from . import policy_groups as pg
from .grouping import ROW_COLUMN
from .policy_group_state import PolicyGroupState
from .trl_contact import log_total, loss_mask, metrics

logger = logging.getLogger(__name__)


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


def check_policy_group_setup(args, grouping: bool) -> None:
    """Settings that need policy groups, without them (or the reverse), as a `ValueError` naming the fields.

    Raises:
        ValueError: grouping with `remove_unused_columns=True` (the row column would be dropped), or a grouping
            setting changed from its default while no group source (column, features or `policy_group_fn`) is set.
    """
    if grouping and args.remove_unused_columns:
        raise ValueError("policy grouping needs remove_unused_columns=False (got True): rows carry their group")
    if grouping:
        return
    changed = {
        # `uniform` is TRL's order: harmless without groups, and the default before issue #11 (saved configs hold it)
        "policy_group_sampling": args.policy_group_sampling not in ("learnability", "uniform"),
        "advantage_baseline": args.advantage_baseline != "prompt",
        "policy_group_refine_step": args.policy_group_refine_step is not None,
        "policy_group_regroup_steps": args.policy_group_regroup_steps is not None,
    }
    if any(changed.values()):
        fields = ", ".join(f"{name}={getattr(args, name)!r}" for name, on in changed.items() if on)
        raise ValueError(
            f"{fields} needs policy groups: set policy_group_column or policy_group_features, or pass policy_group_fn"
        )


class PolicyGroupHooks:
    """TRL hook overrides for dynamic policy grouping. They act only when `self.policy_groups` (set by the trainer's
    `__init__`) is a `PolicyGroupState`; otherwise every override is a plain call to TRL's method."""

    policy_groups: PolicyGroupState | None = None
    policy_group_fn = None
    _policy_group_batch = None  # (gathered rewards per function (N, F), dataset rows (N,)) of this batch
    _policy_group_entropies = None  # (B, T) entropies of the last loss computation
    _policy_group_entropy_window = None  # (group names, (2, K) [entropy sum, completions]) over the window

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
            names, assignment, args.policy_group_min_size, features, args.min_policy_groups
        )
        for reason in merges:
            logger.warning("Policy groups: %s", reason)
        self._policy_group_keys = [self._policy_group_key(row) for row in dataset] if features is None else []
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

    def hook_calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super().hook_calculate_rewards(inputs, prompts, completions, completion_ids_list)
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
        keys = [self._policy_group_key(row) for row in inputs]
        current = self._group_of_key()
        names = gather_object([current.get(key, "unassigned") for key in keys])
        rewards = self._total_rewards(rewards_per_func)
        for name in sorted(set(names)):
            values = rewards[torch.tensor([n == name for n in names])]
            metrics(self, "eval")[f"policy_groups/{name}/reward"].append(torch.nanmean(values).item())

    def _policy_group_key(self, row: dict) -> str | None:
        """The key that placed a row in its group at the start (column value, or `policy_group_fn`'s name); None
        for k-means groups or a row the function cannot name."""
        if self.policy_group_fn is not None:
            try:
                return str(self.policy_group_fn(row))
            except Exception:  # an evaluation row may lack what the function reads: it is reported as unassigned
                return None
        if self.args.policy_group_column is not None and row.get(self.args.policy_group_column) is not None:
            return str(row[self.args.policy_group_column])
        return None

    def _group_of_key(self) -> dict[str, str]:
        """Key -> name of the current group holding most training rows with that key (groups get split, merged
        and renamed during training; keys stay)."""
        keys = self._policy_group_keys
        if not keys:  # k-means groups have no key
            return {}
        ids = self.policy_groups.assignment.tolist()
        votes: dict[str, dict[int, int]] = {}
        for key, group in zip(keys, ids, strict=True):
            if key is not None:
                votes.setdefault(key, {}).setdefault(group, 0)
                votes[key][group] += 1
        return {key: self.policy_groups.names[max(count, key=count.get)] for key, count in votes.items()}

    def hook_generate_and_score_completions(self, inputs):
        grouping_on = self.policy_groups is not None and self.model.training
        if grouping_on and self.args.policy_group_sampling != "uniform":
            inputs = self._draw_generation_batch(len(inputs))
        output = super().hook_generate_and_score_completions(inputs)
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
        # (N,) tokens of TRL's loss mask (model tokens, as TRL's completion lengths); a completion masked as truncated
        # (`mask_truncated_completions`) has none and is left out of the statistics, as out of TRL's loss
        lengths = self.accelerator.gather(loss_mask(output).sum(dim=1)).cpu().double()
        lengths[lengths == 0] = torch.nan
        state.observe(rows[:: self.num_generations], rewards, lengths, self.num_generations, args.policy_group_ema,
                      args.policy_group_progress_halflife)  # fmt: skip
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
            used = ~torch.isnan(rewards) & ~torch.isnan(lengths)  # (N,) completions TRL's policy loss uses
            advantages = advantages * pg.loss_weights(state.weights, group_ids, used)[local].to(advantages)
        output["advantages"] = advantages
        output["policy_group_ids"] = group_ids[local].to(output["completion_mask"].device)
        for key, value in state.metrics().items():
            metrics(self, "train")[key].append(value)
        for key, value in state.totals().items():
            log_total(self, "train", key, value)

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
        # a group made by a split or refinement is not merged back before batches have been observed for it
        seen = state.has_ema["reward"] & state.observed
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

    def hook_get_per_token_logps_and_entropies(self, **kwargs):
        result = super().hook_get_per_token_logps_and_entropies(**kwargs)
        if self.policy_groups is not None and self.model.training and kwargs.get("compute_entropy"):
            self._policy_group_entropies = result[1].detach()
        return result

    def hook_compute_loss(self, model, inputs):
        loss = super().hook_compute_loss(model, inputs)
        entropies, self._policy_group_entropies = self._policy_group_entropies, None
        if entropies is not None and "policy_group_ids" in inputs:
            self._observe_policy_group_entropy(entropies, inputs)
        return loss

    def _observe_policy_group_entropy(self, entropies: torch.Tensor, inputs: dict) -> None:
        """Add this micro-batch's per-group sums of token entropy and tokens (from `entropies` (B, T), nats) to the
        accumulation window; at its end, sum over processes and fold the window's per-group mean token entropy into
        the EMA, once per optimizer step however the step is split into micro-batches. The tokens are those of TRL's
        `entropy` metric (`loss_mask`: a completion masked as truncated has none), so with one group the measurement
        is TRL's `entropy` over the step. A window whose groups changed midway (a regroup at a generation batch
        inside it) starts anew."""
        mask = loss_mask(inputs).double()  # (B, T)
        names, k = list(self.policy_groups.names), self.policy_groups.num_groups
        ids = inputs["policy_group_ids"]  # set after any regroup of this generation batch, so still valid
        sums = torch.zeros(2, k, dtype=torch.float64, device=mask.device)  # (2, K) [entropy sum, tokens]
        sums[0].index_add_(0, ids, (entropies.double() * mask).sum(1))
        sums[1].index_add_(0, ids, mask.sum(1))
        window = self._policy_group_entropy_window
        self._policy_group_entropy_window = (names, sums if window is None or window[0] != names else window[1] + sums)
        if not self.accelerator.sync_gradients:
            return
        totals = self.accelerator.reduce(self._policy_group_entropy_window[1], reduction="sum").cpu()  # (2, K)
        self._policy_group_entropy_window = None
        self.policy_groups.observe_entropy(totals[0] / totals[1].clamp(min=1), totals[1], self.args.policy_group_ema)
