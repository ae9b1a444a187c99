"""`PolicyGroupState`: the policy groups of a run (assignment, per-group sums, draw queues), identical on every
process, saved in every checkpoint by an explicit schema (`CHECKPOINT_FIELDS`, each field's default in
`checkpoint_defaults`). The formulas it applies are in `score`."""

import torch

from ..resume import schema_fields, schema_state
from . import score
from .stages import StageSchedule, stage_checkpoint_defaults

# The checkpoint schema: the fields a checkpoint must hold (the partition and the seed of every draw), then every other
# field with the value a checkpoint without it loads with (`checkpoint_defaults`). An attribute outside the schema is
# refused at saving (`resume.schema_state`), a field outside it at loading (`resume.schema_fields`).
REQUIRED_FIELDS = ("seed", "names", "assignment")
# `score.SUMS` folded in when the rewards come, and those folded in once the policy's log-probabilities are known
REWARD_SUMS, LOGP_SUMS = score.SUMS[:5], score.SUMS[5:]


def checkpoint_defaults(num_groups: int, num_rows: int) -> dict:
    """The value each field of a `PolicyGroupState` checkpoint outside `REQUIRED_FIELDS` loads with when the checkpoint
    lacks it, for K = `num_groups` groups and N = `num_rows` dataset rows: nothing observed yet, progress weights 1,
    no batch pending, the competition stage throughout."""
    k, n = num_groups, num_rows
    return {
        "stages": stage_checkpoint_defaults(),
        **{"generations": 0, "nan_rewards": 0, "last_update_step": 0, "last_regroup_step": 0, "events": []},
        "sums": {name: torch.zeros(k, dtype=torch.float64) for name in score.SUMS},  # (K,) each
        "alpha": torch.ones(k, dtype=torch.float64),  # (K,) the `progress` weights
        "update_reward": torch.full((k,), float("nan"), dtype=torch.float64),  # (K,) reward at the last update
        "prompt_success": torch.full((n,), float("nan"), dtype=torch.float64),  # (N,) at the row's last visit
        "prompt_visits": torch.zeros(n, dtype=torch.long),  # (N,)
        "queues": [torch.empty(0, dtype=torch.long) for _ in range(k)],  # K x (rows left,)
        "observed": torch.zeros(k, dtype=torch.bool),  # (K,) seen in a batch since the group was made
        "pending": None,  # the last batch: {"rows" (P,), "rewards" (P, G), "logps" (P, G)}, until folded in
    }


CHECKPOINT_FIELDS = (*REQUIRED_FIELDS, *checkpoint_defaults(0, 0))


class PolicyGroupState:
    """Everything policy grouping decides from. Statistics come from gathered (all-process) batches, and every
    random draw from a generator seeded by (seed, draw count), so all processes hold the same state.

    Args:
        names: group names, index = group id (K).
        assignment: (num_rows,) group id of every training-dataset row.
        seed: the run's seed.
        warmup: whether the run starts in the warm-up stage (`stages`).
    """

    def __init__(self, names: list[str], assignment: torch.Tensor, seed: int, warmup: bool = False):
        vars(self).update(checkpoint_defaults(len(names), len(assignment)))
        self.seed, self.names, self.stages = seed, list(names), StageSchedule(warmup)
        self.assignment = torch.as_tensor(assignment, dtype=torch.long)

    @property
    def num_groups(self) -> int:
        return len(self.names)

    @property
    def sizes(self) -> torch.Tensor:
        """(K,) the prompts of each group."""
        return torch.bincount(self.assignment, minlength=self.num_groups)

    # ----- statistics -----------------------------------------------------------------------------------------

    def observe(self, rows: torch.Tensor, rewards: torch.Tensor, *, num_generations: int, halflife: float) -> None:
        """Fold one gathered generation batch in: `rows` (P,) dataset rows, `rewards` (N,) per completion, prompt by
        prompt (NaN: unscored, counted in `nan_rewards`, and left out). The batch stays `pending` until the policy's
        log-probabilities of its completions are noted (`note_logps`); the previous one is folded in now."""
        self._fold_pending()
        rewards = rewards.double().view(-1, num_generations)  # (P, G)
        self.nan_rewards += int(torch.isnan(rewards).sum())
        ids = self.assignment[rows]
        batch = score.prompt_sums(rewards, None, ids, self.num_groups)
        self.sums |= score.decayed_add(self.sums, batch, batch["prompts"], halflife, REWARD_SUMS)
        success = rewards.nanmean(1)  # (P,)
        known = ~torch.isnan(success)
        self.prompt_success[rows[known]] = success[known]
        self.prompt_visits.index_add_(0, rows, torch.ones_like(rows))
        self.observed |= torch.bincount(ids, minlength=self.num_groups) > 0
        self.pending = {"rows": rows.clone(), "rewards": rewards, "logps": torch.full_like(rewards, torch.nan)}
        self.generations += 1

    def note_logps(self, logps: torch.Tensor, known: torch.Tensor) -> None:
        """Note the policy's mean token log-probability of the pending batch's completions, `logps` (N,) where
        `known` (N,); a completion noted before (a later pass over the batch) keeps its first value."""
        pending = self.pending["logps"].view(-1)
        fill = known & torch.isnan(pending)
        pending[fill] = logps[fill].double()

    def _fold_pending(self) -> None:
        """Add the pending batch's `LOGP_SUMS` to the run's: kept over the whole run, not decayed."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        ids = self.assignment[pending["rows"]]
        batch = score.prompt_sums(pending["rewards"], pending["logps"], ids, self.num_groups)
        self.sums |= {name: self.sums[name] + batch[name] for name in LOGP_SUMS}

    def scores(self, args) -> torch.Tensor:
        """(K,) each group's score (`score.scores`), times its `progress` weight with that sampling rule."""
        scores = score.scores(self.sums)
        return scores * self.alpha if args.policy_group_sampling == "progress" else scores

    def update_progress(self, step: int, args) -> None:
        """The `progress` weights, every `policy_group_update_steps` steps: α_i ← α_i·(1 + η·ΔR_i), ΔR_i the change of
        group i's reward since the last update minus the mean change, then rescaled to mean 1 (a group not seen at
        both ends counts no change). In warm-up only the window moves on."""
        if args.policy_group_sampling != "progress" or step - self.last_update_step < args.policy_group_update_steps:
            return
        reward, available = self.sums["reward"] / self.sums["prompts"], self.sizes > 0
        if self.stages.stage != "warmup" and available.any():
            change = torch.nan_to_num(reward - self.update_reward, nan=0.0)
            alpha = self.alpha * (1 + args.policy_group_eta * (change - change[available].mean()))
            self.alpha = torch.where(available, alpha * available.sum() / alpha[available].sum(), 0.0)
        self.update_reward, self.last_update_step = reward, step

    def probabilities(self, args) -> torch.Tensor:
        """(K,) probability of drawing each group for a prompt of the next generation batch
        (`score.draw_probabilities`), moved toward TRL's draw by the stage's mix (`stages`)."""
        sizes, mix = self.sizes.double(), self.stages.uniform_mix
        drawn = score.draw_probabilities(self.scores(args), sizes, args.policy_group_sampling_floor)
        return (1 - mix) * drawn + mix * sizes / sizes.sum()

    def loss_weights(self, args) -> torch.Tensor:
        """(K,) the loss weight of each group (`policy_group_loss_weighting`): its score, moved toward 1 by the stage's
        mix; the caller normalises it over the completions that carry a gradient."""
        mix = self.stages.uniform_mix
        return (1 - mix) * self.scores(args) / self.scores(args).mean() + mix

    def draw_rows(self, num_prompts: int, args, keep=None) -> torch.Tensor:
        """Dataset rows (num_prompts,) for the next generation batch: groups drawn from `probabilities`, and within a
        group its prompts in a seeded random order without repeats until all were drawn. With `keep(row) -> bool`
        (prompt skipping), a drawn row that fails it is consumed and the group's next one is tried; after as many
        failures in a row as the group has prompts, the last one is taken."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.generations * 7 + 1)  # (seed, draws)
        groups = torch.multinomial(self.probabilities(args), num_prompts, replacement=True, generator=generator)
        sizes, rows = self.sizes.tolist(), []
        for group in groups.tolist():
            for tries in range(1, sizes[group] + 1):
                if len(self.queues[group]) == 0:
                    members = (self.assignment == group).nonzero().flatten()
                    self.queues[group] = members[torch.randperm(len(members), generator=generator)]
                row = int(self.queues[group][0])
                self.queues[group] = self.queues[group][1:]
                if keep is None or keep(row) or tries == sizes[group]:
                    break
            rows.append(row)
        return torch.tensor(rows, dtype=torch.long)

    # ----- regrouping -----------------------------------------------------------------------------------------

    def regroup(self, names: list[str], assignment: torch.Tensor, reason: str) -> None:
        """Replace the partition. Each new group takes, of every old group's sums and `progress` weight, the share of
        the old group's rows it holds (a merged group the sum of both, a split child its share of the parent); its
        draw queue starts anew, and it counts as unobserved until a batch holds it, so it is not merged straight
        back (see the trainer's regroup)."""
        assignment = torch.as_tensor(assignment, dtype=torch.long)
        taken = torch.zeros(len(names), self.num_groups, dtype=torch.float64)  # (K', K) rows new i took from old j
        taken.index_put_((assignment, self.assignment), torch.ones(len(assignment), dtype=torch.float64), True)
        share = taken / self.sizes.double().clamp(min=1)
        observed = dict(zip(self.names, self.observed.tolist(), strict=True))
        self.sums = {name: share @ values for name, values in self.sums.items()}
        self.alpha = (taken @ self.alpha) / taken.sum(1).clamp(min=1)
        self.names, self.assignment = list(names), assignment
        self.update_reward = self.sums["reward"] / self.sums["prompts"]
        self.queues = [torch.empty(0, dtype=torch.long) for _ in names]
        self.observed = torch.tensor([observed.get(name, False) for name in names], dtype=torch.bool)
        self.events.append(reason)

    # ----- checkpoints and logging ----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The fields of `CHECKPOINT_FIELDS` by name (the stage schedule as its own `state_dict`).

        Raises:
            RuntimeError: the state has an attribute outside `CHECKPOINT_FIELDS` (`resume.schema_state`).
        """
        return schema_state(self, CHECKPOINT_FIELDS) | {"stages": self.stages.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Load a `state_dict`: each field of `CHECKPOINT_FIELDS`, a field the checkpoint lacks with its value in
        `checkpoint_defaults` (for the checkpoint's groups and rows).

        Raises:
            ValueError: the checkpoint lacks a field of `REQUIRED_FIELDS` or holds one outside `CHECKPOINT_FIELDS`
                (a checkpoint of another version's policy groups; `resume.schema_fields` names them).
        """
        defaults = checkpoint_defaults(len(state.get("names", ())), len(state.get("assignment", ())))
        fields = schema_fields("PolicyGroupState", state, defaults, REQUIRED_FIELDS)
        self.stages.load_state_dict(fields.pop("stages"))
        vars(self).update(fields)

    def metrics(self, args) -> dict[str, float]:
        """`policy_groups/<name>/{draw,weight,score,credibility,reward,zero_std_frac}` of this step: draw = the
        probability of drawing the group for a prompt of the next generation batch (summing to 1 over the groups),
        weight = that over the group's share of the prompts (1: drawn as TRL draws it), score and credibility (κ²) as
        `score` computes them, reward and zero_std_frac (the share of its prompts whose completions all got the same
        reward) over its recent prompts (half-life `policy_group_halflife`); the last four once it was seen."""
        sums, out, scores, drawn = self.sums, {}, self.scores(args), self.probabilities(args)
        kappa = score.credibility(sums["rl"], sums["rr"], sums["ll"], sums["df"])
        for i, name in enumerate(self.names):
            out[f"policy_groups/{name}/draw"] = float(drawn[i])
            out[f"policy_groups/{name}/weight"] = float(drawn[i] / (self.sizes[i] / len(self.assignment)))
            if sums["prompts"][i] > 0:
                seen = {"score": scores[i], "credibility": kappa[i], "reward": sums["reward"][i] / sums["prompts"][i],
                        "zero_std_frac": 1 - sums["informative"][i] / sums["prompts"][i]}  # fmt: skip
                out |= {f"policy_groups/{name}/{key}": float(value) for key, value in seen.items()}
        return out

    def totals(self, stages: bool = False) -> dict[str, float]:
        """Running totals, logged as their value at the last step (`trl_contact.log_total`, not averaged):
        `policy_groups/<name>/count`, how many times the group's prompts were drawn since the start (counted per
        dataset row, so after a split or merge each group counts exactly the draws of the rows it now holds: a whole
        number), `policy_groups/nan_rewards`, the completions no reward function scored, and with `stages` the stage
        index (`stages.STAGES`) and its `uniform_mix`."""
        counts = torch.bincount(self.assignment, weights=self.prompt_visits.double(), minlength=self.num_groups)
        out = {f"policy_groups/{name}/count": float(counts[i]) for i, name in enumerate(self.names)}
        stage = {"policy_groups/stage": float(self.stages.index), "policy_groups/uniform_mix": self.stages.uniform_mix}
        return out | {"policy_groups/nan_rewards": float(self.nan_rewards)} | (stage if stages else {})
