"""The training stages of dynamic policy grouping: warm-up, competition, fusion (`StageSchedule`), and the pure
functions they follow. Shapes: K policy groups.

    warmup       every policy group treated alike: prompts drawn as TRL draws them (in proportion to group size),
                 loss weights 1; statistics gathered, no merge or split. Ends at `policy_group_warmup_steps`.
    competition  the draw follows the groups' scores (what policy grouping does without stages).
    fusion       from `policy_group_fusion_start`: the groups that did well are merged by the merge rule, no more
                 splits, and the draw and the loss weights go back to TRL's over `policy_group_fusion_anneal_steps`
                 steps (`fusion_mix`), so the final model is not tilted toward the groups drawn most last.

Stages change at generation batches: with `steps_per_generation` > 1, a stage due at a global step begins at the
first generation batch at or after it.

Formula: λ = min(1, (step − s_f) / n_anneal), s_f the fusion step (λ = 1 at once when n_anneal = 0); the draw
probabilities become (1 − λ)·p + λ·n_i / Σn and the loss weights (1 − λ)·w + λ.
"""

from ..resume import schema_fields, schema_state

STAGES = ("warmup", "competition", "fusion")  # logged as `policy_groups/stage`: the index, 0, 1 or 2


def fusion_step(start: float, max_steps: int) -> int:
    """The global step fusion starts at: `start` itself when >= 1, else that fraction of `max_steps` (at least 1)."""
    return int(start) if start >= 1 else max(1, round(start * max_steps))


def fusion_mix(step: int, start: int, anneal_steps: int) -> float:
    """λ in [0, 1], how far the draw and the weights are back to TRL's at `step` of a fusion from `start`."""
    return 1.0 if anneal_steps == 0 else min(1.0, max(0.0, (step - start) / anneal_steps))


def stage_checkpoint_defaults() -> dict:
    """The checkpoint schema of `StageSchedule`: every field a checkpoint holds, with the value a checkpoint without
    it loads with: a run in competition from the start (no mix, no fusion step, no stage change)."""
    return {"stage": "competition", "since": 0, "uniform_mix": 0.0, "fusion_at": None, "events": []}


class StageSchedule:
    """The stage of a run and when it changes. Identical on every process (it reads the step only) and saved in
    checkpoints with the policy groups (`state_dict` holds plain numbers and lists).

    Args:
        warmup: whether the run starts in warm-up (`policy_group_warmup_steps` is set).

    Attributes:
        stage: the stage, one of `STAGES`.
        since: the global step the stage began at.
        uniform_mix: λ, 1 in warm-up, 0 in competition, 0 -> 1 in fusion.
        fusion_at: fusion's global step once resolved against the run's length, else None.
        events: each stage change, with its reason.
    """

    def __init__(self, warmup: bool):
        vars(self).update(stage_checkpoint_defaults())
        if warmup:
            self.stage, self.uniform_mix = "warmup", 1.0

    @property
    def index(self) -> int:
        return STAGES.index(self.stage)

    def advance(self, step: int, args, max_steps: int) -> list[str]:
        """Change the stage when its end is due at global step `step` of a run of `max_steps` steps. Returns the
        reason of each change (none, one, or two when warm-up ends at the fusion step)."""
        reasons, warmup, start = [], args.policy_group_warmup_steps, args.policy_group_fusion_start
        if start is not None and self.fusion_at is None:
            self.fusion_at = fusion_step(start, max_steps)
        if self.stage == "warmup" and step >= warmup:
            reasons.append(self._enter("competition", step, f"policy_group_warmup_steps={warmup} reached"))
        if self.stage != "fusion" and self.fusion_at is not None and step >= self.fusion_at:
            when = f"{start:g} of {max_steps} steps = step {self.fusion_at}" if start < 1 else f"step {self.fusion_at}"
            reasons.append(self._enter("fusion", step, f"policy_group_fusion_start reached ({when})"))
        if self.stage == "fusion":
            self.uniform_mix = fusion_mix(step, self.since, args.policy_group_fusion_anneal_steps)
        return reasons

    def _enter(self, stage: str, step: int, why: str) -> str:
        reason = f"step {step}: {self.stage} -> {stage}: {why}"
        self.stage, self.since, self.uniform_mix = stage, step, 0.0
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
