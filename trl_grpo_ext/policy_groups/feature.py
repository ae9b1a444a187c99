"""The trainer wiring of dynamic policy grouping: `PolicyGroups`, the feature the trainer calls at the points of a
step that `composition.STEP` lists for it. The formulas are in the other modules of this folder, the state in `state`.
"""

import logging

import torch
from accelerate.utils import gather_object

from ..dataset_preparation import ROW_COLUMN
from ..feature_api import Feature, Regroup, local_rows, prompts_per_draw, total_rewards
from ..trl_contact import log_total, loss_mask, metrics
from . import regrouping
from .advantages import loss_weights, policy_group_advantages
from .assignment import (
    assign_from_callable,
    assign_from_column,
    embedding_features,
    group_of_key,
    kmeans_groups,
    prompt_texts,
    row_key,
    tfidf_features,
)
from .config import policy_grouping_requested, stages_requested
from .state import PolicyGroupState

logger = logging.getLogger(__name__)


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
        "policy_group_warmup_steps": args.policy_group_warmup_steps is not None,
        "policy_group_fusion_start": args.policy_group_fusion_start is not None,
        "prompt_skip_group_informative": args.prompt_skip_group_informative > 0,
    }
    if any(changed.values()):
        fields = ", ".join(f"{name}={getattr(args, name)!r}" for name, on in changed.items() if on)
        raise ValueError(
            f"{fields} needs policy groups: set policy_group_column or policy_group_features, or pass policy_group_fn"
        )


class PolicyGroups(Feature):
    """Dynamic policy grouping in the trainer: the groups of the training prompts (`groups`, a `PolicyGroupState`),
    their statistics from every generation batch, the weights applied to the advantages, the prompts drawn per
    group, and the regroups, each announced to the trainer (`trainer._announce`) for the features that follow the
    groups.

    Built when `policy_group_column` or `policy_group_features` is set, or the trainer got `policy_group_fn`.
    """

    name = "policy_groups"
    exposes = "policy_groups"
    reads = ("prompt_skip",)
    writes = ("output['advantages']", "output['policy_group_ids']")

    def __init__(self, trainer):
        super().__init__(trainer)
        self._batch = None  # (gathered rewards per function (N, F), dataset rows (N,)) of this generation batch
        self._entropies = None  # (B, T) entropies of the loss being computed
        self._entropy_window = None  # (group names, (2, K) [entropy sum, completions]) over the window
        self._keys: list[str | None] = []  # each training row's group key (column value or function name)
        self.groups = self._build_groups()

    @classmethod
    def build(cls, trainer) -> "PolicyGroups | None":
        if not (policy_grouping_requested(trainer.args) or trainer.policy_group_fn is not None):
            return None
        return cls(trainer)

    def state(self) -> PolicyGroupState:
        return self.groups

    def _build_groups(self) -> PolicyGroupState:
        trainer = self.trainer
        args, dataset, fn = trainer.args, trainer.train_dataset, trainer.policy_group_fn
        features = None
        if fn is not None:
            names, assignment = assign_from_callable(dataset, fn)
        elif args.policy_group_column is not None:
            names, assignment = assign_from_column(dataset, args.policy_group_column)
        else:
            features = self._features(args.policy_group_features)
            names, assignment = kmeans_groups(features, args.num_policy_groups, args.seed)
        names, assignment, merges = regrouping.merge_small_groups(
            names, assignment, args.policy_group_min_size, features, args.min_policy_groups
        )
        for reason in merges:
            logger.warning("Policy groups: %s", reason)
        self._keys = [self._key(row) for row in dataset] if features is None else []
        state = PolicyGroupState(
            names, torch.as_tensor(assignment), args.seed, args.policy_group_warmup_steps is not None
        )
        state.events.extend(merges)
        logger.info("Policy groups: %s", dict(zip(names, torch.bincount(state.assignment).tolist(), strict=True)))
        return state

    def _features(self, kind: str):
        trainer = self.trainer
        texts = prompt_texts(trainer.train_dataset)
        if kind == "embedding":
            model = trainer.accelerator.unwrap_model(trainer.model)
            return embedding_features(model, trainer.processing_class, texts)
        return tfidf_features(texts)

    # -- generation batch, rewards, advantages

    def generation_batch(self, inputs: list[dict], keep) -> list[dict] | None:
        trainer = self.trainer
        if not trainer.model.training or trainer.args.policy_group_sampling == "uniform":
            return None  # TRL's order (or, with prompt skipping, its uniform draw)
        return self.draw_generation_batch(len(inputs), keep)

    def draw_generation_batch(self, local_size: int, keep=None) -> list[dict]:
        """Replace the data loader's generation batch by prompts drawn per policy group, each through `keep` (the
        prompt filters, inside its group's draw): the same global draw on every process (each takes its slice),
        every prompt repeated `num_generations` times, as TRL's sampler."""
        trainer = self.trainer
        rows = self.groups.draw_rows(prompts_per_draw(trainer, local_size), trainer.args, keep)
        return local_rows(trainer, rows, local_size)

    def rewards(self, inputs: list[dict], rewards_per_func: torch.Tensor) -> None:
        trainer = self.trainer
        if trainer.model.training:
            rows = torch.tensor([row[ROW_COLUMN] for row in inputs], device=rewards_per_func.device)
            self._batch = (rewards_per_func, trainer.accelerator.gather(rows))
        else:
            self._log_eval(inputs, rewards_per_func)

    def _total_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        return total_rewards(rewards_per_func, self.trainer.reward_weights)

    def _log_eval(self, inputs: list[dict], rewards_per_func: torch.Tensor) -> None:
        """Mean evaluation reward per policy group; a prompt whose group the training run does not know (or that
        k-means grouping cannot place) is reported under `unassigned`."""
        keys = [self._key(row) for row in inputs]
        current = self._group_of_key()
        names = gather_object([current.get(key, "unassigned") for key in keys])
        rewards = self._total_rewards(rewards_per_func)
        for name in sorted(set(names)):
            values = rewards[torch.tensor([n == name for n in names])]
            metrics(self.trainer, "eval")[f"policy_groups/{name}/reward"].append(torch.nanmean(values).item())

    def _key(self, row: dict) -> str | None:
        return row_key(row, self.trainer.policy_group_fn, self.trainer.args.policy_group_column)

    def _group_of_key(self) -> dict[str, str]:
        return group_of_key(self._keys, self.groups.assignment.tolist(), self.groups.names)

    def advantages(self, output: dict) -> None:
        if self.trainer.model.training:
            self.apply_policy_groups(output)

    def apply_policy_groups(self, output: dict) -> None:
        """Fold the generation batch into the statistics, update the weights, regroup when due, and apply the groups
        to TRL's advantages (B,) in `output`, adding each completion's group id (`policy_group_ids`)."""
        trainer = self.trainer
        args, state = trainer.args, self.groups
        rewards_per_func, rows = (t.cpu() for t in self._batch)  # (N, F), (N,)
        rewards = self._total_rewards(rewards_per_func)  # (N,)
        # (N,) tokens of TRL's loss mask (model tokens, as TRL's completion lengths); a completion masked as truncated
        # (`mask_truncated_completions`) has none and is left out of the statistics, as out of TRL's loss
        lengths = trainer.accelerator.gather(loss_mask(output).sum(dim=1)).cpu().double()
        lengths[lengths == 0] = torch.nan
        state.observe(rows[:: trainer.num_generations], rewards, lengths, num_generations=trainer.num_generations,
                      decay=args.policy_group_ema, progress_halflife=args.policy_group_progress_halflife)  # fmt: skip
        step = trainer.state.global_step
        self.advance_stage(step, rewards)
        state.maybe_update_weights(step, args)
        self.maybe_regroup(step)

        group_ids = state.assignment[rows]  # (N,)
        advantages = output["advantages"]  # (B,) this process's part of the N completions
        start = trainer.accelerator.process_index * len(advantages)
        local = slice(start, start + len(advantages))
        if args.advantage_baseline == "policy_group":
            global_advantages = policy_group_advantages(rewards, group_ids, state.num_groups, trainer.scale_rewards)
            advantages = global_advantages[local].to(advantages)
        if args.policy_group_loss_weighting:
            used = ~torch.isnan(rewards) & ~torch.isnan(lengths)  # (N,) completions TRL's policy loss uses
            advantages = advantages * loss_weights(state.applied_weights, group_ids, used)[local].to(advantages)
        output["advantages"] = advantages
        output["policy_group_ids"] = group_ids[local].to(output["completion_mask"].device)
        for key, value in state.metrics().items():
            metrics(trainer, "train")[key].append(value)
        totals = state.totals()
        if stages_requested(args):  # the stage at the logged step, not a mean of stage indices since the last log
            totals |= {
                "policy_groups/stage": float(state.stages.index),
                "policy_groups/uniform_mix": state.stages.uniform_mix,
            }
        for key, value in totals.items():
            log_total(trainer, "train", key, value)

    # -- stages

    def advance_stage(self, step: int, rewards: torch.Tensor) -> None:
        """Move the stage schedule on by this generation batch's rewards (N,) over all processes (`stages`); log each
        stage change with its reason; at the start of fusion, merge the groups that did well."""
        if not stages_requested(self.trainer.args):
            return
        valid = rewards[~torch.isnan(rewards)].double()
        mean = float(valid.mean()) if len(valid) else float("nan")
        std = float(valid.std()) if len(valid) > 1 else 0.0
        stages = self.groups.stages
        for reason in stages.advance(step, mean, std, self.trainer.args, self.trainer.state.max_steps):
            logger.warning("Policy groups: %s", reason)
            self.groups.events.append(reason)
            if stages.stage == "fusion":
                self.fusion_merges(step)

    def fusion_merges(self, step: int) -> None:
        """Merge the groups that did well, pair by pair, as `regrouping.plan_fusion_merge` plans; each merge is
        announced."""
        state = self.groups
        while self._merge(regrouping.plan_fusion_merge, state.has_ema["reward"] & state.available, step, "fusion: "):
            pass

    def _merge(self, plan, seen: torch.Tensor, step: int, label: str = "") -> bool:
        """Plan a merge by `plan` (`regrouping.plan_merge` or `plan_fusion_merge`) over the EMA reward and reward std
        of the groups `seen` (K,) (the others never match) and make it; whether a merge was made."""
        args, state = self.trainer.args, self.groups
        merge = plan(
            state.names, torch.where(seen, state.ema["reward"], torch.nan).numpy(),
            torch.where(seen, state.ema["reward_std"], torch.nan).numpy(), args.policy_group_merge_tol,
            args.min_policy_groups,
        )  # fmt: skip
        if merge is None:
            return False
        i, j, reason = merge
        names, assignment = regrouping.apply_merge(state.names, state.assignment.numpy(), i, j)
        self.regroup_to(names, assignment, f"step {step}: {label}{reason}")
        return True

    # -- regrouping

    def maybe_regroup(self, step: int) -> None:
        """Refine at `policy_group_refine_step`; every `policy_group_regroup_steps`, merge two groups that behave
        alike or else split one whose prompts' success rates are bimodal. Each regroup is announced. In warm-up
        nothing is merged or split (the statistics are still forming); in fusion nothing is refined or split."""
        args, state = self.trainer.args, self.groups
        stage = state.stages.stage
        if (args.policy_group_refine_step is not None and not state.refined and step >= args.policy_group_refine_step
                and stage != "fusion"):  # fmt: skip
            state.refined = True
            features = self._features(args.policy_group_features or "tfidf")
            names, assignment = regrouping.refine_groups(
                state.names, state.assignment.numpy(), features, parts=args.policy_group_refine_parts, seed=args.seed,
                max_groups=args.max_policy_groups,
            )  # fmt: skip
            self.regroup_to(names, assignment, f"step {step}: refined {state.num_groups} groups into {len(names)}")
        regroup_steps = args.policy_group_regroup_steps
        if stage == "warmup" or regroup_steps is None or step - state.last_regroup_step < regroup_steps:
            return
        state.last_regroup_step = step
        # a group made by a split or refinement is not merged back before batches have been observed for it
        if self._merge(regrouping.plan_merge, state.has_ema["reward"] & state.observed, step):
            return
        if state.num_groups >= args.max_policy_groups or stage == "fusion":
            return
        for group, name in enumerate(state.names):
            members = (state.assignment == group) & ~torch.isnan(state.prompt_success)
            prompt_ids = members.nonzero().flatten()
            split = regrouping.plan_split(
                name, prompt_ids.numpy(), state.prompt_success[prompt_ids].numpy(), args.policy_group_min_size,
                args.policy_group_split_gap,
            )  # fmt: skip
            if split is not None:
                _, high_ids, reason = split
                names, assignment = regrouping.apply_split(state.names, state.assignment.numpy(), group, high_ids)
                self.regroup_to(names, assignment, f"step {step}: {reason}")
                return

    def regroup_to(self, names: list[str], assignment, reason: str) -> None:
        """Replace the groups by `names` / `assignment` (N,) and announce the change (`feature_api.Regroup`)."""
        old_names, old_assignment = tuple(self.groups.names), self.groups.assignment.clone()
        self.groups.regroup(names, torch.as_tensor(assignment), reason)
        logger.warning("Policy groups: %s -> %s", reason, self.groups.names)
        self.trainer._announce(
            Regroup(old_names, old_assignment, tuple(self.groups.names), self.groups.assignment.clone(), reason)
        )

    # -- loss: each group's entropy

    def policy_logps(self, batch: dict, logps: torch.Tensor, entropies: torch.Tensor | None) -> torch.Tensor:
        if self.trainer.model.training and entropies is not None:
            self._entropies = entropies.detach()
        return logps

    def loss_end(self, batch: dict, loss: torch.Tensor) -> torch.Tensor:
        entropies, self._entropies = self._entropies, None
        if entropies is not None and "policy_group_ids" in batch:
            self._observe_entropy(entropies, batch)
        return loss

    def _observe_entropy(self, entropies: torch.Tensor, inputs: dict) -> None:
        """Add this micro-batch's per-group sums of token entropy and tokens (from `entropies` (B, T), nats) to the
        accumulation window; at its end, sum over processes and fold the window's per-group mean token entropy into
        the EMA, once per optimizer step however the step is split into micro-batches. The tokens are those of TRL's
        `entropy` metric (`loss_mask`: a completion masked as truncated has none), so with one group the measurement
        is TRL's `entropy` over the step. A window whose groups changed midway (a regroup at a generation batch
        inside it) starts anew."""
        accelerator = self.trainer.accelerator
        mask = loss_mask(inputs).double()  # (B, T)
        names, k = list(self.groups.names), self.groups.num_groups
        ids = inputs["policy_group_ids"]  # set after any regroup of this generation batch, so still valid
        sums = torch.zeros(2, k, dtype=torch.float64, device=mask.device)  # (2, K) [entropy sum, tokens]
        sums[0].index_add_(0, ids, (entropies.double() * mask).sum(1))
        sums[1].index_add_(0, ids, mask.sum(1))
        window = self._entropy_window
        self._entropy_window = (names, sums if window is None or window[0] != names else window[1] + sums)
        if not accelerator.sync_gradients:
            return
        totals = accelerator.reduce(self._entropy_window[1], reduction="sum").cpu()  # (2, K)
        self._entropy_window = None
        self.groups.observe_entropy(totals[0] / totals[1].clamp(min=1), totals[1], self.trainer.args.policy_group_ema)
