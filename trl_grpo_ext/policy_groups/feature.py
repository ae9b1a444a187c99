"""The trainer wiring of dynamic policy grouping: `PolicyGroups`, the feature the trainer calls at the points of a
step that `composition.STEP` lists for it. The formulas are in `score`, the state in `state`.
"""

import logging

import torch
from accelerate.utils import gather_object

from ..dataset_preparation import ROW_COLUMN
from ..feature_api import Feature, Regroup, local_rows, prompts_per_draw, total_rewards
from ..trl_contact import log_total, loss_mask, metrics
from . import regrouping, score
from .assignment import assign_groups, group_of_key, row_key
from .config import policy_grouping_requested, stages_requested
from .state import PolicyGroupState

logger = logging.getLogger(__name__)


# the settings that act only on policy groups, with their values that leave a run without groups as it is (`uniform`
# is TRL's order: harmless, and saved configs of earlier versions hold it)
INERT = {"policy_group_sampling": ("learnability", "uniform"), "policy_group_loss_weighting": (False,),
         "policy_group_regroup_steps": (None,), "policy_group_warmup_steps": (None,),
         "policy_group_fusion_start": (None,), "prompt_skip_group_informative": (0,)}  # fmt: skip


def check_policy_group_setup(args, grouping: bool) -> None:
    """Settings that need policy groups, without them, as a `ValueError` naming the fields.

    Raises:
        ValueError: grouping with `remove_unused_columns=True` (the row column would be dropped), or a setting of
            `INERT` changed while no group source (column, features or `policy_group_fn`) is set.
    """
    if grouping and args.remove_unused_columns:
        raise ValueError("policy grouping needs remove_unused_columns=False (got True): rows carry their group")
    changed = [f"{name}={getattr(args, name)!r}" for name, inert in INERT.items() if getattr(args, name) not in inert]
    if changed and not grouping:
        raise ValueError(f"{', '.join(changed)} needs policy groups: set policy_group_column or "
                         "policy_group_features, or pass policy_group_fn")  # fmt: skip


class PolicyGroups(Feature):
    """Dynamic policy grouping in the trainer: the groups of the training prompts (`groups`, a `PolicyGroupState`),
    their statistics from every generation batch and from the policy's log-probabilities of its completions, the
    prompts drawn per group, the loss weights when asked for, and the regroups, each announced to the trainer
    (`trainer._announce`) for the features that follow the groups.

    Built when `policy_group_column` or `policy_group_features` is set, or the trainer got `policy_group_fn`.
    """

    name = "policy_groups"
    exposes = "policy_groups"
    reads = ("prompt_skip",)
    writes = ("output['advantages']", "output['policy_group_ids']", "output['policy_group_completion']")

    def __init__(self, trainer):
        super().__init__(trainer)
        args = trainer.args
        self._batch = None  # (gathered rewards per function (N, F), dataset rows (N,)) of this generation batch
        self._logps: list[tuple[torch.Tensor, torch.Tensor]] = []  # (completion indices, mean log-probabilities)
        names, assignment = assign_groups(trainer.train_dataset, args, trainer.policy_group_fn)
        # each training row's key (`assignment.row_key`), its first group's name (k-means: no evaluation row has one)
        self._keys = [names[i] for i in assignment]
        self.groups = PolicyGroupState(names, assignment, args.seed, args.policy_group_warmup_steps is not None)
        logger.info("Policy groups: %s", dict(zip(names, self.groups.sizes.tolist(), strict=True)))

    @classmethod
    def build(cls, trainer) -> "PolicyGroups | None":
        return cls(trainer) if policy_grouping_requested(trainer.args) or trainer.policy_group_fn is not None else None

    def state(self) -> PolicyGroupState:
        return self.groups

    # -- generation batch, rewards, advantages

    def generation_batch(self, inputs: list[dict], keep) -> list[dict] | None:
        if not self.trainer.model.training or self.trainer.args.policy_group_sampling == "uniform":
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
        if not trainer.model.training:
            return self._log_eval(inputs, rewards_per_func)
        rows = torch.tensor([row[ROW_COLUMN] for row in inputs], device=rewards_per_func.device)
        self._batch = (rewards_per_func, trainer.accelerator.gather(rows))

    def _log_eval(self, inputs: list[dict], rewards_per_func: torch.Tensor) -> None:
        """Mean evaluation reward per policy group; a prompt whose group the training run does not know (or that
        k-means grouping cannot place) is reported under `unassigned`."""
        trainer, groups = self.trainer, self.groups
        current = group_of_key(self._keys, groups.assignment.tolist(), groups.names)
        keys = [row_key(row, trainer.policy_group_fn, trainer.args.policy_group_column) for row in inputs]
        names = gather_object([current.get(key, "unassigned") for key in keys])
        rewards = total_rewards(rewards_per_func, trainer.reward_weights)
        for name in sorted(set(names)):
            values = rewards[torch.tensor([n == name for n in names])]
            metrics(trainer, "eval")[f"policy_groups/{name}/reward"].append(torch.nanmean(values).item())

    def advantages(self, output: dict) -> None:
        if self.trainer.model.training:
            self.apply_policy_groups(output)

    def apply_policy_groups(self, output: dict) -> None:
        """Fold the generation batch into the statistics, move the stages and the `progress` weights, regroup when
        due, weight TRL's advantages (B,) in `output` when `policy_group_loss_weighting` is on, and add each
        completion's group id (`policy_group_ids`) and its index in the gathered batch (`policy_group_completion`,
        for the log-probabilities `policy_logps` notes)."""
        trainer = self.trainer
        args, state, accelerator = trainer.args, self.groups, trainer.accelerator
        rewards, rows = total_rewards(self._batch[0], trainer.reward_weights), self._batch[1].cpu()  # (N,), (N,)
        # a completion TRL's loss leaves out (masked as truncated, `mask_truncated_completions`) is left out here too
        tokens = accelerator.gather(loss_mask(output).sum(dim=1)).cpu()  # (N,)
        rewards[tokens == 0] = torch.nan
        state.observe(rows[:: trainer.num_generations], rewards, num_generations=trainer.num_generations,
                      halflife=args.policy_group_halflife)  # fmt: skip
        step = trainer.state.global_step
        self.advance_stage(step)
        state.update_progress(step, args)
        self.maybe_regroup(step)

        group_ids = state.assignment[rows]  # (N,)
        advantages = output["advantages"]  # (B,) this process's part of the N completions
        start = accelerator.process_index * len(advantages)
        local = slice(start, start + len(advantages))
        if args.policy_group_loss_weighting:
            used = accelerator.gather(advantages).cpu() != 0  # (N,) completions that carry a gradient
            weights = score.loss_weights(state.loss_weights(args), group_ids, used)
            output["advantages"] = advantages * weights[local].to(advantages)
        output["policy_group_ids"] = group_ids[local].to(advantages.device)
        output["policy_group_completion"] = torch.arange(start, start + len(advantages), device=advantages.device)
        for key, value in state.metrics(args).items():
            metrics(trainer, "train")[key].append(value)
        for key, value in state.totals(stages_requested(args)).items():
            log_total(trainer, "train", key, value)

    # -- loss: the policy's log-probability of each completion

    def policy_logps(self, batch: dict, logps: torch.Tensor, entropies: torch.Tensor | None) -> torch.Tensor:
        if self.trainer.model.training and "policy_group_completion" in batch:
            mask = loss_mask(batch).to(logps.dtype)  # (B, T)
            mean = (logps.detach() * mask).sum(1) / mask.sum(1)  # (B,) NaN for a completion without tokens
            self._logps.append((batch["policy_group_completion"], mean))
        return logps

    def loss_end(self, batch: dict, loss: torch.Tensor) -> torch.Tensor:
        """At the end of an optimizer step, note the mean log-probabilities of the micro-batches since the last one
        (summed over processes: each completion lives on one) in the pending batch, the same on every process."""
        accelerator, pending = self.trainer.accelerator, self.groups.pending
        if not self.trainer.model.training or not accelerator.sync_gradients or pending is None:
            return loss
        noted = torch.zeros(2, pending["logps"].numel(), dtype=torch.float64, device=loss.device)  # (2, N)
        for indices, means in self._logps:
            noted[:, indices] = torch.stack([torch.nan_to_num(means.double(), nan=0.0), ~torch.isnan(means)])
        self._logps = []
        noted = accelerator.reduce(noted, reduction="sum").cpu()
        self.groups.note_logps(noted[0], noted[1] > 0)
        return loss

    # -- stages

    def advance_stage(self, step: int) -> None:
        """Move the stage schedule on to `step` (`stages`); log each stage change with its reason; at the start of
        fusion, merge the groups that did well."""
        if not stages_requested(self.trainer.args):
            return
        for reason in self.groups.stages.advance(step, self.trainer.args, self.trainer.state.max_steps):
            logger.warning("Policy groups: %s", reason)
            self.groups.events.append(reason)
            if self.groups.stages.stage == "fusion":
                while self._merge(regrouping.plan_fusion_merge, self.groups.sums["prompts"] > 0, step, "fusion: "):
                    pass

    def _merge(self, plan, seen: torch.Tensor, step: int, label: str = "") -> bool:
        """Plan a merge by `plan` (`regrouping.plan_merge` or `plan_fusion_merge`) over the reward and within-prompt
        reward std of the groups `seen` (K,) (the others never match) and make it; whether a merge was made."""
        args, sums = self.trainer.args, self.groups.sums
        reward = torch.where(seen, sums["reward"] / sums["prompts"], torch.nan).numpy()
        std = torch.where(seen, (sums["variance"] / sums["prompts"]).sqrt(), torch.nan).numpy()
        merge = plan(self.groups.names, reward, std, args.policy_group_merge_tol, args.min_policy_groups)
        if merge is not None:  # (i, j, reason)
            names, assignment = regrouping.apply_merge(self.groups.names, self.groups.assignment.numpy(), *merge[:2])
            self.regroup_to(names, assignment, f"step {step}: {label}{merge[2]}")
        return merge is not None

    # -- regrouping

    def maybe_regroup(self, step: int) -> None:
        """Every `policy_group_regroup_steps`, merge two groups that behave alike or else split one whose prompts'
        success rates are bimodal. Each regroup is announced. Nothing is merged or split in warm-up (the statistics
        are still forming), nothing split in fusion, and a group made by a split is not merged back before a batch
        held it."""
        args, state = self.trainer.args, self.groups
        regroup_steps, stage = args.policy_group_regroup_steps, state.stages.stage
        if stage == "warmup" or regroup_steps is None or step - state.last_regroup_step < regroup_steps:
            return
        state.last_regroup_step = step
        if self._merge(regrouping.plan_merge, (state.sums["prompts"] > 0) & state.observed, step):
            return
        for group in range(state.num_groups if state.num_groups < args.max_policy_groups and stage != "fusion" else 0):
            rows = ((state.assignment == group) & ~torch.isnan(state.prompt_success)).nonzero().flatten()
            split = regrouping.plan_split(state.names[group], rows.numpy(), state.prompt_success[rows].numpy(),
                                          args.policy_group_min_size, args.policy_group_split_gap)  # fmt: skip
            if split is not None:
                names, assignment = regrouping.apply_split(state.names, state.assignment.numpy(), group, split[1])
                return self.regroup_to(names, assignment, f"step {step}: {split[2]}")

    def regroup_to(self, names: list[str], assignment, reason: str) -> None:
        """Replace the groups by `names` / `assignment` (N,) and announce the change (`feature_api.Regroup`)."""
        old = tuple(self.groups.names), self.groups.assignment.clone()
        self.groups.regroup(names, torch.as_tensor(assignment), reason)
        logger.warning("Policy groups: %s -> %s", reason, self.groups.names)
        self.trainer._announce(Regroup(*old, tuple(self.groups.names), self.groups.assignment.clone(), reason))
