"""`PromptHistory`: what prompt skipping remembers of each training prompt, in 12 bytes (16 with the completion counts
of `prompt_skip_rule: posterior`), and how a generation batch updates it. Shapes: R training-dataset rows, P prompts
of a generation batch (over all processes), G completions per prompt (`num_generations`)."""

import torch

STREAK_MAX = 127  # the streak saturates here (int8)
NEVER = -1  # `last_step` of a prompt never generated for
COUNT_MAX = 2**15 - 1  # the completion counts saturate here (int16)


def uninformative(rewards: torch.Tensor, tol: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which generation groups gave GRPO nothing to learn from: every scored completion got the same reward, so
    every advantage is zero (TRL's `frac_reward_zero_std` counts them too, over every group: a group none of whose
    completions was scored is left out here).

    Args:
        rewards: (P, G) total rewards, NaN where no reward function scored the completion.
        tol: the largest max − min reward that counts as equal.

    Returns:
        (scored (P,) bool: at least one completion was scored, equal (P,) bool: scored and all scored rewards equal,
        value (P,) float: the mean scored reward, NaN for an unscored prompt).
    """
    finite = ~torch.isnan(rewards)
    scored = finite.any(dim=1)
    high = torch.where(finite, rewards, torch.full_like(rewards, -torch.inf)).amax(dim=1)
    low = torch.where(finite, rewards, torch.full_like(rewards, torch.inf)).amin(dim=1)
    equal = scored & (high - low <= tol)
    value = torch.where(scored, torch.nanmean(rewards, dim=1), torch.full_like(high, torch.nan))
    return scored, equal, value


class PromptHistory:
    """Per training prompt: the optimizer step it was last generated for (`last_step`, int32, `NEVER` before), its
    streak of consecutive uninformative visits (`streak`, int8, saturating at `STREAK_MAX`; 0 after an informative
    one), the reward all its completions got at the last uninformative visit (`value`, float32, NaN if none), the
    mean completion length of its last visit (`length`, int16 tokens, for the tokens a skip saves) and whether any
    visit was informative (`informed`, bool: a failing prompt that was is learnable): 12 bytes a prompt, 12 MB for a
    million. With `counts`, also its scored completions over all visits that got the reward a solved prompt gets
    (`successes`, int16, saturating at `COUNT_MAX`) and those that did not (`failures`): 16 bytes a prompt.

    Args:
        num_rows: R, the training dataset's rows.
        counts: keep the completion counts (`prompt_skip_rule: posterior` reads them).
    """

    def __init__(self, num_rows: int, counts: bool = False):
        self.last_step = torch.full((num_rows,), NEVER, dtype=torch.int32)
        self.streak = torch.zeros(num_rows, dtype=torch.int8)
        self.value = torch.full((num_rows,), torch.nan, dtype=torch.float32)
        self.length = torch.zeros(num_rows, dtype=torch.int16)
        self.informed = torch.zeros(num_rows, dtype=torch.bool)
        self.successes = torch.zeros(num_rows if counts else 0, dtype=torch.int16)
        self.failures = torch.zeros(num_rows if counts else 0, dtype=torch.int16)

    def nbytes(self) -> int:
        """Bytes held, over all prompts."""
        return sum(t.numel() * t.element_size() for t in self.state_dict().values())

    def observe(
        self, rows: torch.Tensor, rewards: torch.Tensor, lengths: torch.Tensor, step: int, best: float = torch.inf
    ) -> torch.Tensor:
        """Fold one generation batch in: `rows` (P,) its prompts' dataset rows, `rewards` (P, G) their completions'
        total rewards (NaN: unscored), `lengths` (P, G) their completion tokens (NaN: masked as truncated). A prompt
        none of whose completions was scored is left as it was (nothing was measured). With the completion counts, a
        scored completion whose reward is within 1e-6 of `best` (the reward a solved prompt gets; +inf: none yet)
        counts as a success, any other scored one as a failure. Returns `equal` (P,) bool, the uninformative
        generation groups (`uninformative`).

        A prompt drawn twice in the batch is updated in batch order (its last visit wins), as two visits in a row.
        """
        scored, equal, value = uninformative(rewards)
        mean_length = torch.nan_to_num(torch.nanmean(lengths.double(), dim=1), nan=0.0).round().clamp(0, 2**15 - 1)
        finite = ~torch.isnan(rewards)
        succeeded = (finite & (rewards >= best - 1e-6)).sum(dim=1)  # (P,)
        failed = finite.sum(dim=1) - succeeded
        counting = len(self.successes) > 0
        for i in scored.nonzero().flatten().tolist():  # P is a generation batch: tens of prompts
            row = int(rows[i])
            if counting:
                self.successes[row] = min(int(self.successes[row]) + int(succeeded[i]), COUNT_MAX)
                self.failures[row] = min(int(self.failures[row]) + int(failed[i]), COUNT_MAX)
            self.last_step[row] = step
            self.length[row] = int(mean_length[i])
            if equal[i]:
                self.streak[row] = min(int(self.streak[row]) + 1, STREAK_MAX)
                self.value[row] = float(value[i])
            else:
                self.streak[row] = 0
                self.informed[row] = True
        return equal

    def failing_never_informative(self, best: float, rows: torch.Tensor | None = None, tol: float = 1e-6):
        """(R,) bool, or (P,) for the dataset rows `rows`: prompts whose last visit was uninformative at a reward below
        `best` (the reward a solved prompt's completions all get) and none of whose visits was informative."""
        index = slice(None) if rows is None else rows
        seen = self.last_step[index] != NEVER
        solved = self.value[index].double() >= best - tol
        return seen & (self.streak[index] > 0) & ~solved & ~self.informed[index]

    def state_dict(self) -> dict:
        return {"last_step": self.last_step.clone(), "streak": self.streak.clone(), "value": self.value.clone(),
                "length": self.length.clone(), "informed": self.informed.clone(),
                "successes": self.successes.clone(), "failures": self.failures.clone()}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.last_step, self.streak = state["last_step"].clone(), state["streak"].clone()
        self.value, self.length = state["value"].clone(), state["length"].clone()
        # absent from checkpoints written before it was kept: a prompt whose last visit was informative
        self.informed = state.get("informed", (self.last_step != NEVER) & (self.streak == 0)).clone()
        # absent from checkpoints written before they were kept, or kept by the other rule: the counts start at 0
        if len(state.get("successes", ())) == len(self.successes):
            self.successes, self.failures = state["successes"].clone(), state["failures"].clone()
