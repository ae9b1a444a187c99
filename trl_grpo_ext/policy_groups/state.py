"""`PolicyGroupState`: the policy groups of a run (assignment, statistics, weights, sampler queues), identical on
every process, saved in every checkpoint by an explicit schema (`CHECKPOINT_FIELDS`, each field's default in
`checkpoint_defaults`). The formulas it applies are in `statistics`, `weights` and `sampling`."""

import torch

from ..resume import schema_fields, schema_state
from . import sampling, statistics, weights
from .stages import StageSchedule, stage_checkpoint_defaults, toward_uniform, uniform_draw

# Per-group statistics kept as EMAs (K,), all float64: mean reward, mean within-prompt reward std, fraction of
# prompts whose completions all got the same reward, success rate (= mean reward when rewards are binary), mean
# completion length in tokens, mean token entropy in nats.
STATS = ("reward", "reward_std", "zero_std_frac", "success", "length", "entropy")
# The `learnability` rule's statistics: the mean reward over a group's first `policy_group_progress_halflife`
# completions (its start, then frozen), a completion-count EMA of the reward with that half-life (recent) and of its
# square. Kept with the statistics above, so regrouping carries them along.
PROGRESS = ("progress_start", "progress_recent", "progress_second")
# The checkpoint schema of `PolicyGroupState` (`CHECKPOINT_FIELDS`): the fields a checkpoint must hold (the partition
# and the seed of every draw), then every other field with the value a checkpoint without it loads with
# (`checkpoint_defaults`). An attribute outside the schema is refused at saving (`resume.schema_state`), a field
# outside it at loading (`resume.schema_fields`).
REQUIRED_FIELDS = ("seed", "names", "assignment")


def checkpoint_defaults(num_groups: int, num_rows: int) -> dict:
    """The value each field of a `PolicyGroupState` checkpoint outside `REQUIRED_FIELDS` loads with when the checkpoint
    lacks it (one written before the field existed), for the checkpoint's K = `num_groups` groups and N = `num_rows`
    dataset rows: nothing observed yet (no EMA, no prompt seen or visited, no reward window, empty sampler queues),
    weights 1, rewards binary, one generation per prompt, no event, and the competition stage throughout
    (`stages.stage_checkpoint_defaults`: a checkpoint from before the stages, issue #18). A new field goes here, with
    the value that keeps an older run's behaviour."""
    k, n = num_groups, num_rows
    return {
        "stages": stage_checkpoint_defaults(),
        "binary": True,
        "nan_rewards": 0,
        "generations": 0,
        "last_update_step": 0,
        "last_regroup_step": 0,
        "refined": False,
        "num_generations": 1,
        "events": [],
        "prompt_success": torch.full((n,), float("nan"), dtype=torch.float64),  # (N,)
        "prompt_visits": torch.zeros(n, dtype=torch.long),  # (N,)
        "ema": {name: torch.zeros(k, dtype=torch.float64) for name in STATS + PROGRESS},  # (K,) each
        "has_ema": {name: torch.zeros(k, dtype=torch.bool) for name in STATS + PROGRESS},  # (K,) each
        "prompts_seen": torch.zeros(k, dtype=torch.float64),  # (K,)
        "progress_moments": torch.zeros(2, k, dtype=torch.float64),  # (2, K)
        "window_reward": torch.full((k,), float("nan"), dtype=torch.float64),  # (K,)
        "queues": [torch.empty(0, dtype=torch.long) for _ in range(k)],  # K x (rows left,)
        "observed": torch.zeros(k, dtype=torch.bool),  # (K,)
        "weights": torch.ones(k, dtype=torch.float64),  # (K,)
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
        self.seed = seed
        self.stages = StageSchedule(warmup)
        self.binary = True  # every reward seen so far was 0 or 1
        self.nan_rewards = 0
        self.generations = 0
        self.last_update_step = 0
        self.last_regroup_step = 0
        self.refined = False
        self.num_generations = 1  # set by `observe`; the completions seen are prompts seen x this
        self.events: list[str] = []  # merges, splits and refinements, with their reasons
        self.prompt_success = torch.full((len(assignment),), float("nan"), dtype=torch.float64)
        self.prompt_visits = torch.zeros(len(assignment), dtype=torch.long)  # times each dataset row was drawn
        self._set_groups(names, torch.as_tensor(assignment, dtype=torch.long))
        self.weights = torch.ones(self.num_groups, dtype=torch.float64)

    def _set_groups(self, names: list[str], assignment: torch.Tensor) -> None:
        self.names, self.assignment = list(names), assignment
        k = len(names)
        self.ema = {name: torch.zeros(k, dtype=torch.float64) for name in STATS + PROGRESS}
        self.has_ema = {name: torch.zeros(k, dtype=torch.bool) for name in STATS + PROGRESS}
        self.prompts_seen = torch.zeros(k, dtype=torch.float64)
        # Σw² of the recent EMA's completion weights, and the number of completions in the start mean
        self.progress_moments = torch.zeros(2, k, dtype=torch.float64)
        self.window_reward = torch.full((k,), float("nan"), dtype=torch.float64)
        self.queues = [torch.empty(0, dtype=torch.long) for _ in range(k)]
        self.observed = torch.zeros(k, dtype=torch.bool)  # seen in a batch since it was made

    @property
    def num_groups(self) -> int:
        return len(self.names)

    @property
    def available(self) -> torch.Tensor:
        """(K,) groups that hold at least one prompt."""
        return torch.bincount(self.assignment, minlength=self.num_groups) > 0

    def _generator(self, purpose: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1_000_003 + self.generations * 7 + purpose)

    # ----- statistics -----------------------------------------------------------------------------------------

    def observe(self, rows: torch.Tensor, rewards: torch.Tensor, lengths: torch.Tensor, *, num_generations: int,
                decay: float, progress_halflife: float = 48.0) -> None:  # fmt: skip
        """Fold one gathered generation batch in: `rows` (P,) dataset rows, `rewards` and `lengths` (N,) per
        completion, prompt by prompt. NaN rewards are left out and counted in `nan_rewards`. `decay` is the per-batch
        EMA decay of the statistics, `progress_halflife` the slow progress EMA's half-life in completions."""
        rewards = rewards.double()
        self.nan_rewards += int(torch.isnan(rewards).sum())
        valid = rewards[~torch.isnan(rewards)]
        self.binary = self.binary and bool(((valid == 0) | (valid == 1)).all())
        per_prompt = statistics.prompt_statistics(rewards, num_generations)
        ids = self.assignment[rows]
        k = self.num_groups
        batch = {
            "reward": statistics.group_means(per_prompt["mean"], ids, k),
            "reward_std": statistics.group_means(
                torch.where(per_prompt["valid"], per_prompt["std"], torch.nan), ids, k
            ),
            "zero_std_frac": statistics.group_means(
                torch.where(per_prompt["valid"], per_prompt["zero_std"].double(), torch.nan), ids, k
            ),  # fmt: skip
            "length": statistics.group_means(lengths.double(), ids.repeat_interleave(num_generations), k),
        }
        batch["success"] = batch["reward"]
        for name, (means, counts) in batch.items():
            self._fold(name, means, counts > 0, decay)
        completion_ids = ids.repeat_interleave(num_generations)
        means, counts = statistics.group_means(rewards, completion_ids, k)
        squares, _ = statistics.group_means(rewards**2, completion_ids, k)
        k_recent = statistics.ema_share(counts, self.has_ema["progress_recent"], progress_halflife)
        start_count = self.progress_moments[1]
        k_start = torch.where(start_count < progress_halflife, counts / (start_count + counts).clamp(min=1), 0.0)
        for name, values, share in (("progress_start", means, k_start), ("progress_recent", means, k_recent),
                                    ("progress_second", squares, k_recent)):  # fmt: skip
            self.ema[name] = self.ema[name] + share * (values - self.ema[name])
            self.has_ema[name] = self.has_ema[name] | (counts > 0)
        recent_moment = torch.where(counts > 0, (1 - k_recent) ** 2 * self.progress_moments[0]
                                    + k_recent**2 / counts.clamp(min=1), self.progress_moments[0])  # fmt: skip
        self.progress_moments = torch.stack([recent_moment, start_count + torch.where(k_start > 0, counts, 0.0)])
        self.prompts_seen += torch.bincount(ids, minlength=k).double()
        self.prompt_visits.index_add_(0, rows, torch.ones_like(rows))
        self.observed |= torch.bincount(ids, minlength=k) > 0
        self.num_generations = num_generations
        known = ~torch.isnan(per_prompt["mean"])
        old = self.prompt_success[rows[known]]
        new = per_prompt["mean"][known]
        self.prompt_success[rows[known]] = torch.where(torch.isnan(old), new, decay * old + (1 - decay) * new)
        self.generations += 1

    def observe_entropy(self, means: torch.Tensor, counts: torch.Tensor, decay: float) -> None:
        """Fold in per-group mean token entropy (K,) in nats over `counts` (K,) completions."""
        self._fold("entropy", means, counts > 0, decay)

    def _fold(self, name: str, means: torch.Tensor, seen: torch.Tensor, decay: float) -> None:
        self.ema[name] = statistics.ema_update(self.ema[name], means, seen, self.has_ema[name], decay)
        self.has_ema[name] = self.has_ema[name] | seen

    # ----- weights and sampling -------------------------------------------------------------------------------

    def maybe_update_weights(self, step: int, args) -> bool:
        """Apply the weight rule once `policy_group_update_steps` steps have passed since the last update (every step
        for the `learnability` rule, whose statistics are running EMAs). In warm-up the rule is not applied (the
        weights stay 1, so the first, noisy batches leave no trace in them); only the progress window moves on."""
        learnability = args.policy_group_weight_rule == "learnability"
        if not learnability and step - self.last_update_step < args.policy_group_update_steps:
            return False
        reward, seen = self.ema["reward"], self.has_ema["reward"]
        active = self.available & seen
        if active.sum() >= 2 and self.stages.stage != "warmup":
            bounds = (args.policy_group_weight_min, args.policy_group_weight_max)
            previous = self.weights
            if learnability:
                z = args.policy_group_deficit_z
                floor = z * self.spread_standard_error(reward, active) if z > 0 else 0.0
                self.weights = weights.learnability_weights(
                    reward, self.noise_like(args), w_min=bounds[0], w_max=bounds[1], active=active, spread_floor=floor
                )
            elif args.policy_group_weight_rule == "progress":
                change = torch.nan_to_num(reward - self.window_reward, nan=0.0)  # no window yet: no change
                self.weights = weights.progress_weights(
                    self.weights, change, eta=args.policy_group_eta, w_min=bounds[0], w_max=bounds[1], active=active
                )
            else:
                self.weights = weights.deficit_weights(
                    self.weights, reward, eta=args.policy_group_eta, w_min=bounds[0], w_max=bounds[1], active=active
                )
            self.weights = torch.where(active, self.weights, torch.ones_like(self.weights))
            self.weights = weights.smooth_weights(previous, self.weights, args.policy_group_weight_smoothing)
            self.weights = weights.normalize_weights(self.weights, *bounds, self.available)
        self.window_reward = torch.where(seen, reward, self.window_reward)
        self.last_update_step = step
        return True

    @property
    def applied_weights(self) -> torch.Tensor:
        """(K,) the weights the loss and the draw use: the rule's weights moved toward 1 by the stage's
        `uniform_mix` (all 1 in warm-up, the rule's in competition, annealed to 1 in fusion; `stages`)."""
        mix = self.stages.uniform_mix
        return self.weights if mix == 0 else toward_uniform(self.weights, mix, self.available)

    def _reward_variance(self) -> torch.Tensor:
        """(K,) variance of one completion's reward in each group: the recent EMAs' second moment minus the squared
        mean, at least Laplace's p(1−p) over the completions seen for 0/1 rewards (a group seen always right or
        always wrong is not certain), else at least 1e-4."""
        completions = self.prompts_seen * self.num_generations
        recent = self.ema["progress_recent"]
        if self.binary:
            p = (recent * completions + 1) / (completions + 2)
            floor = p * (1 - p)
        else:
            floor = torch.full_like(completions, 1e-4)
        return torch.maximum(self.ema["progress_second"] - recent**2, floor)

    def _progress_z(self) -> torch.Tensor:
        """(K,) z-score of each group's learning progress since its start (`policy_groups.progress_z`), with the
        reward variance of `_reward_variance`."""
        variance = self._reward_variance()
        return statistics.progress_z(self.ema["progress_recent"], self.ema["progress_start"], variance,
                                     *self.progress_moments)  # fmt: skip

    def spread_standard_error(self, reward: torch.Tensor, active: torch.Tensor) -> float:
        """The standard error of R_max − R_min, the difference between the highest and the lowest of the `active`
        groups' rewards `reward` (K,): √(SE_max² + SE_min²), each group's SE² = v·Σw², v its completion reward
        variance (`_reward_variance`) and Σw² that of its recent EMA's completion weights (the variance of a
        weighted mean of i.i.d. rewards). Reward units; 0 for a group seen in no batch yet."""
        groups = active.nonzero().squeeze(1)
        high, low = groups[reward[groups].argmax()], groups[reward[groups].argmin()]
        variance = self._reward_variance() * self.progress_moments[0]
        return float((variance[high] + variance[low]).sqrt())

    def noise_like(self, args) -> torch.Tensor:
        """(K,) bool: groups that look like noise to the `learnability` rule. Warm, no learning progress since their
        start (z < `policy_groups.PROGRESS_Z`), and more than `policy_groups.NOISE_INFORMATIVE` of their prompts
        with completions that disagree (EMA of 1 − zero_std_frac)."""
        informative = 1 - torch.where(self.has_ema["zero_std_frac"], self.ema["zero_std_frac"], 0.0)
        return self._warm(args) & (self._progress_z() < weights.PROGRESS_Z) & (informative > weights.NOISE_INFORMATIVE)

    def _warm(self, args) -> torch.Tensor:
        """(K,) groups with enough completions (two half-lives) for their recent reward to be told from their start."""
        return self.prompts_seen * self.num_generations >= 2 * args.policy_group_progress_halflife

    def probabilities(self, args) -> torch.Tensor:
        """(K,) probability of drawing each group for the next generation batch (`policy_group_sampling`)."""
        if args.policy_group_sampling == "learnability":
            # group size × weight × informative share: TRL's prompt-proportional draw, reweighted
            sizes = torch.bincount(self.assignment, minlength=self.num_groups).double()
            zero_std = torch.where(self.has_ema["zero_std_frac"], self.ema["zero_std_frac"], torch.zeros_like(sizes))
            uncertainty = sizes / sizes.sum() * sampling.informative_share(zero_std, self.prompts_seen)
        elif args.policy_group_sampling == "uncertainty":
            uncertainty = sampling.group_uncertainty(
                self.ema["success"], self.ema["reward_std"], self.binary, self.prompts_seen * self.num_generations
            )
            # a group not seen yet is as uncertain as can be
            uncertainty = torch.where(self.has_ema["reward"], uncertainty, torch.full_like(uncertainty, 0.25))
        else:
            uncertainty = torch.ones_like(self.weights)
        probabilities = sampling.sampling_probabilities(
            self.weights, uncertainty, args.policy_group_sampling_floor, self.available
        )
        mix = self.stages.uniform_mix  # warm-up and fusion: (toward) the prompt-proportional draw
        if mix == 0:
            return probabilities
        return uniform_draw(probabilities, torch.bincount(self.assignment, minlength=self.num_groups), mix)

    def draw_rows(self, num_prompts: int, args, keep=None) -> torch.Tensor:
        """Dataset rows (num_prompts,) for the next generation batch: groups drawn from `probabilities`, and within a
        group its prompts in a seeded random order without repeats until all were drawn. With `keep(row) -> bool`
        (prompt skipping), a drawn row that fails it is consumed and the group's next one is tried; after as many
        failures in a row as the group has prompts, the last one is taken."""
        generator = self._generator(purpose=1)
        groups = torch.multinomial(self.probabilities(args), num_prompts, replacement=True, generator=generator)
        sizes = torch.bincount(self.assignment, minlength=self.num_groups).tolist()
        rows = []
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
        """Replace the partition. Each new group inherits the statistics and weight of the old
        groups its prompts came from (averaged by prompts seen), its prompts-seen count in proportion to the rows it
        took, and, when it holds only part of a parent (a split child), a reward seeded from its own prompts'
        success rates. Weights are rescaled to mean 1. A new group counts as unobserved until a batch holds it, so it
        is not merged straight back (see the trainer's regroup)."""
        assignment = torch.as_tensor(assignment, dtype=torch.long)
        old_ids, old_ema, old_has = self.assignment, self.ema, self.has_ema
        old_seen, old_weights, old_window = self.prompts_seen, self.weights, self.window_reward
        old_moments = self.progress_moments
        old_sizes = torch.bincount(old_ids, minlength=len(old_seen)).double()
        old_observed = dict(zip(self.names, self.observed.tolist(), strict=True))
        self._set_groups(names, assignment)
        weights = torch.ones(self.num_groups, dtype=torch.float64)
        for new in range(self.num_groups):
            members = assignment == new
            parents, taken = torch.unique(old_ids[members], return_counts=True)
            share = old_seen[parents] + 1e-9
            share = share / share.sum()
            for stat in STATS + PROGRESS:
                has = old_has[stat][parents]
                if has.any():
                    self.ema[stat][new] = (old_ema[stat][parents][has] * share[has]).sum() / share[has].sum()
                    self.has_ema[stat][new] = True
            self.prompts_seen[new] = (old_seen[parents] * taken / old_sizes[parents]).sum()
            self.progress_moments[:, new] = (old_moments[:, parents] * share).sum(1)
            weights[new] = (old_weights[parents] * share).sum()
            window = old_window[parents]
            if not torch.isnan(window).all():
                self.window_reward[new] = window[~torch.isnan(window)].mean()
            own = self.prompt_success[members]
            if bool((taken < old_sizes[parents]).any()) and (~torch.isnan(own)).any():
                self.ema["reward"][new] = own[~torch.isnan(own)].mean()
                self.ema["success"][new] = self.ema["reward"][new]
        self.weights = weights * self.available.sum() / weights[self.available].sum()
        self.observed = torch.tensor([old_observed.get(name, False) for name in names], dtype=torch.bool)
        self.events.append(reason)

    # ----- checkpoints and logging ----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The fields of `CHECKPOINT_FIELDS` by name (the stage schedule as its own `state_dict`).

        Raises:
            RuntimeError: the state has an attribute outside `CHECKPOINT_FIELDS` (`resume.schema_state`).
        """
        state = schema_state(self, CHECKPOINT_FIELDS)
        state["stages"] = self.stages.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Load a `state_dict`: each field of `CHECKPOINT_FIELDS`, a field the checkpoint lacks with its value in
        `checkpoint_defaults` (for the checkpoint's groups and rows).

        Raises:
            ValueError: the checkpoint lacks a field of `REQUIRED_FIELDS` or holds one outside `CHECKPOINT_FIELDS`
                (`resume.schema_fields`: naming them).
        """
        defaults = checkpoint_defaults(len(state.get("names", ())), len(state.get("assignment", ())))
        fields = schema_fields("PolicyGroupState", state, defaults, REQUIRED_FIELDS)
        self.stages.load_state_dict(fields.pop("stages"))
        vars(self).update(fields)

    def metrics(self) -> dict[str, float]:
        """`policy_groups/<name>/{weight,reward,reward_std,zero_std_frac,entropy,progress_z}` of this step, averaged
        over the steps since the last log; weight = the weight as applied (`applied_weights`), progress_z = the
        learning progress z-score since the group's start (`_progress_z`)."""
        out = {}
        progress_z, applied = self._progress_z(), self.applied_weights
        for i, name in enumerate(self.names):
            out[f"policy_groups/{name}/weight"] = float(applied[i])
            for stat in ("reward", "reward_std", "zero_std_frac", "entropy"):
                if self.has_ema[stat][i]:
                    out[f"policy_groups/{name}/{stat}"] = float(self.ema[stat][i])
            if self.has_ema["progress_recent"][i]:
                out[f"policy_groups/{name}/progress_z"] = float(progress_z[i])
        return out

    def totals(self) -> dict[str, float]:
        """Running totals, logged as their value at the last step (`trl_contact.log_total`, not averaged):
        `policy_groups/<name>/count`, how many times the group's prompts were drawn since the start (counted per
        dataset row, so after a split or merge each group counts exactly the draws of the rows it now holds: a whole
        number), and `policy_groups/nan_rewards`, the completions no reward function scored."""
        counts = torch.bincount(self.assignment, weights=self.prompt_visits.double(), minlength=self.num_groups)
        out = {f"policy_groups/{name}/count": float(counts[i]) for i, name in enumerate(self.names)}
        out["policy_groups/nan_rewards"] = float(self.nan_rewards)
        return out
