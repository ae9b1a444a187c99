"""The training stages of dynamic policy grouping: warm-up, competition, fusion (`StageSchedule`), and the pure
functions they follow. Shapes: K policy groups, W generation batches in the plateau window.

    warmup       every policy group treated alike: weights 1, prompts drawn in proportion to group size (TRL's
                 uniform draw over prompts); statistics gathered, no merge or split. Ends at
                 `policy_group_warmup_steps`, or earlier with `policy_group_warmup_plateau` when the overall reward's
                 trend flattens (`reward_flat`).
    competition  the weight rule and the sampling rule act (what policy grouping does without stages).
    fusion       from `policy_group_fusion_start`: the groups that did well are merged by the merge rule, no more
                 splits, and the weights and the draw go back to uniform over `policy_group_fusion_anneal_steps`
                 steps (`fusion_mix`), so the final model is not tilted toward the group that was last behind.

Stages change at generation batches (the schedule reads each batch's gathered rewards): with `steps_per_generation`
> 1, a stage due at a global step begins at the first generation batch at or after it.

Formulas:
    - trend of the overall reward: the least-squares line through the last W generation batches' mean rewards
      r_0..r_{W-1}; its rise over the window is b·(W−1), b = Σ(t − t̄)(r_t − r̄) / Σ(t − t̄)², with standard error
      se(b)·(W−1), se(b) = √(Σ residual² / (W − 2) / Σ(t − t̄)²) (ordinary least squares). The trend is flat when the
      rise plus one standard error is below `policy_group_plateau_tol` × the mean within-batch reward std, so a
      reward still rising by more than that (in units of its own spread) keeps warm-up going, noise or not.
    - fusion: λ = min(1, (step − s_f) / n_anneal), s_f the fusion step (λ = 1 at once when n_anneal = 0); applied
      weights (1 − λ)·α + λ (mean 1 stays mean 1) and draw probabilities (1 − λ)·p + λ·n_i / Σn.
"""

import torch

from ..resume import schema_fields, schema_state

STAGES = ("warmup", "competition", "fusion")  # logged as `policy_groups/stage`: the index, 0, 1 or 2


def reward_rise(rewards: torch.Tensor) -> tuple[float, float]:
    """The rise over the window of the least-squares line through `rewards` (W,), W >= 3 batch mean rewards in
    order, and its standard error, both in reward units (module docstring)."""
    r = rewards.double()
    t = torch.arange(len(r), dtype=torch.float64)
    t = t - t.mean()
    slope = (t * (r - r.mean())).sum() / (t**2).sum()
    residuals = r - r.mean() - slope * t
    se = ((residuals**2).sum() / (len(r) - 2) / (t**2).sum()).sqrt()
    span = len(r) - 1
    return float(slope * span), float(se * span)


def reward_flat(rewards: torch.Tensor, reward_std: float, tol: float) -> bool:
    """Whether the overall reward's trend over `rewards` (W,) is flat: rise + its standard error < `tol` ×
    `reward_std` (the mean within-batch reward std over the window)."""
    rise, se = reward_rise(rewards)
    return rise + se < tol * reward_std


def fusion_step(start: float, max_steps: int) -> int:
    """The global step fusion starts at: `start` itself when >= 1, else that fraction of `max_steps` (at least 1)."""
    return int(start) if start >= 1 else max(1, round(start * max_steps))


def fusion_mix(step: int, start: int, anneal_steps: int) -> float:
    """λ in [0, 1], how far the weights and the draw are back to uniform at `step` of a fusion from `start`."""
    if anneal_steps == 0:
        return 1.0
    return min(1.0, max(0.0, (step - start) / anneal_steps))


def toward_uniform(weights: torch.Tensor, mix: float, available: torch.Tensor) -> torch.Tensor:
    """Weights (K,) of mean 1 over `available` groups, moved a share `mix` of the way to 1 (inactive groups keep 0)."""
    return torch.where(available, (1 - mix) * weights + mix, weights)


def uniform_draw(probabilities: torch.Tensor, sizes: torch.Tensor, mix: float) -> torch.Tensor:
    """Draw probabilities (K,) moved a share `mix` of the way to the prompt-proportional draw sizes / Σ sizes."""
    sizes = sizes.double()
    return (1 - mix) * probabilities + mix * sizes / sizes.sum()


def stage_checkpoint_defaults() -> dict:
    """The checkpoint schema of `StageSchedule`: every field a checkpoint holds, with the value a checkpoint without
    it loads with (a new field: the value that keeps an older run's behaviour). Together they are a run that has
    been in competition from the start: no mix, no fusion step, no plateau window, no stage change."""
    return {"stage": "competition", "since": 0, "uniform_mix": 0.0, "fusion_at": None, "rewards": [],
            "reward_stds": [], "events": []}  # fmt: skip


class StageSchedule:
    """The stage of a run and when it changes. Identical on every process (it reads gathered rewards only) and saved
    in checkpoints with the policy groups (`state_dict` holds plain numbers and lists).

    Args:
        warmup: whether the run starts in warm-up (`policy_group_warmup_steps` is set).
    """

    def __init__(self, warmup: bool):
        self.stage = "warmup" if warmup else "competition"
        self.since = 0  # the global step the stage began at
        self.uniform_mix = 1.0 if warmup else 0.0  # λ: 1 in warm-up, 0 in competition, 0 -> 1 in fusion
        self.fusion_at: int | None = None  # fusion's step, resolved against the run's length
        self.rewards: list[float] = []  # the last generation batches' mean rewards (the plateau window)
        self.reward_stds: list[float] = []  # ... and their within-batch reward std
        self.events: list[str] = []  # each stage change, with its reason

    @property
    def index(self) -> int:
        return STAGES.index(self.stage)

    def advance(self, step: int, reward: float, reward_std: float, args, max_steps: int) -> list[str]:
        """Note one generation batch's mean reward and std (over all processes) at global step `step`; change the
        stage when its end is due. Returns the reason of each change (none, one, or two when warm-up ends at the
        fusion step). `max_steps` is the run's length in steps."""
        window = args.policy_group_plateau_window
        if reward == reward:  # a batch no reward function scored says nothing about the trend
            self.rewards = (self.rewards + [reward])[-window:]
            self.reward_stds = (self.reward_stds + [reward_std])[-window:]
        if args.policy_group_fusion_start is not None and self.fusion_at is None:
            self.fusion_at = fusion_step(args.policy_group_fusion_start, max_steps)
        reasons = []
        if self.stage == "warmup":
            reasons += self._warmup_end(step, args)
        if self.stage != "fusion" and self.fusion_at is not None and step >= self.fusion_at:
            start = f"step {self.fusion_at}"
            if args.policy_group_fusion_start < 1:
                start = f"{args.policy_group_fusion_start:g} of {max_steps} steps = {start}"
            reasons.append(self._enter("fusion", step, f"policy_group_fusion_start reached ({start})"))
        if self.stage == "fusion":
            self.uniform_mix = fusion_mix(step, self.since, args.policy_group_fusion_anneal_steps)
        return reasons

    def _warmup_end(self, step: int, args) -> list[str]:
        if step >= args.policy_group_warmup_steps:
            return [self._enter("competition", step, f"policy_group_warmup_steps={args.policy_group_warmup_steps} "
                                                     f"reached")]  # fmt: skip
        window = args.policy_group_plateau_window
        if not args.policy_group_warmup_plateau or len(self.rewards) < window:
            return []
        rewards, spread = torch.tensor(self.rewards), sum(self.reward_stds) / window
        if not reward_flat(rewards, spread, args.policy_group_plateau_tol):
            return []
        rise, se = reward_rise(rewards)
        return [self._enter(
            "competition", step,
            f"the reward's trend flattened: rise {rise:+.4f} ± {se:.4f} over the last {window} generation batches < "
            f"policy_group_plateau_tol={args.policy_group_plateau_tol} × reward std {spread:.4f}",
        )]  # fmt: skip

    def _enter(self, stage: str, step: int, why: str) -> str:
        reason = f"step {step}: {self.stage} -> {stage}: {why}"
        self.stage, self.since = stage, step
        self.uniform_mix = 0.0
        self.events.append(reason)
        return reason

    def state_dict(self) -> dict:
        """The fields of `stage_checkpoint_defaults` (plain numbers, strings and lists)."""
        return schema_state(self, tuple(stage_checkpoint_defaults()))

    def load_state_dict(self, state: dict) -> None:
        """Load a `state_dict`; a field it lacks takes its value in `stage_checkpoint_defaults`.

        Raises:
            ValueError: `state` holds a field the schema does not have (`resume.schema_fields`).
        """
        vars(self).update(schema_fields("StageSchedule", state, stage_checkpoint_defaults()))
