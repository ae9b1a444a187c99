"""`PromptSkipState`: everything prompt skipping decides from, identical on every process, saved in every
checkpoint."""

import torch

from .history import PromptHistory


class PromptSkipState:
    """The per-prompt history, the adapted base keep probability of solved prompts, the evidence a failing prompt's
    base is measured from (`skipping.count_evidence`), the uniform prompt order used without policy groups, and the
    running totals. Every random decision comes from a generator seeded by (seed, counter), so all processes
    decide alike and a resumed run decides as the uninterrupted one.

    Args:
        num_rows: the training dataset's rows.
        base: the starting base keep probability.
        seed: the run's seed.
        counts: keep each prompt's completion counts (`prompt_skip_rule: posterior`).
    """

    def __init__(self, num_rows: int, base: float, seed: int, counts: bool = False):
        self.history = PromptHistory(num_rows, counts)
        self.base = base
        self.seed = seed
        self.batches = 0  # generation batches observed: seeds the keep decisions of the next one
        self.passes = 0  # uniform passes over the dataset begun (no policy groups)
        self.order = torch.empty(0, dtype=torch.long)  # the rest of the current pass
        self.best_reward = -float("inf")  # the best completion reward seen: a prompt uninformative at it is solved
        self.worst_reward = float("inf")  # the worst seen: until a better one is, no prompt counts as solved
        self.skipped = 0  # prompts skipped since the start
        self.tokens_saved = 0.0  # completion tokens those skips did not generate (at each batch's mean length)
        self.generated_tokens = 0.0  # completion tokens generated for training since the start
        # visits of failing prompts and after informative ones, and how many came out informative (decayed counts)
        self.evidence = torch.zeros(4, dtype=torch.float64)

    def solved_at(self, tol: float = 1e-6) -> float:
        """The reward at which an uninformative prompt counts as solved: the best seen, once a reward below it was
        also seen; +inf before (a run whose completions have all scored alike, say all 0 at the start of a hard task,
        cannot tell solved prompts from failing ones: they all get the failing grace)."""
        return self.best_reward if self.best_reward > self.worst_reward + tol else float("inf")

    @property
    def num_rows(self) -> int:
        return len(self.history.streak)

    def nbytes(self) -> int:
        """Bytes held: the history's 12 a prompt (16 with the counts), and the rest of the current pass (int64 rows, up
        to 8 a prompt)."""
        return self.history.nbytes() + self.order.numel() * self.order.element_size()

    def decision_generator(self) -> torch.Generator:
        """The generator of the next generation batch's keep decisions."""
        return torch.Generator().manual_seed((self.seed * 1_000_003 + self.batches * 7_919 + 17) % 2**63)

    def draw_rows(self, num_prompts: int, keep) -> torch.Tensor:
        """Dataset rows (num_prompts,) in a seeded random order without repeats until every row was drawn (TRL's
        shuffled epoch), each drawn row passing through `keep(row) -> bool` (None: all pass); a row that fails is
        consumed and the next one is tried, and after `num_rows` failures in a row the last one is taken."""
        rows = []
        for _ in range(num_prompts):
            for tries in range(1, self.num_rows + 1):
                if len(self.order) == 0:
                    generator = torch.Generator().manual_seed((self.seed * 1_000_033 + self.passes) % 2**63)
                    self.order = torch.randperm(self.num_rows, generator=generator)
                    self.passes += 1
                row = int(self.order[0])
                self.order = self.order[1:]
                if keep is None or keep(row) or tries == self.num_rows:
                    break
            rows.append(row)
        return torch.tensor(rows, dtype=torch.long)

    def state_dict(self) -> dict:
        return {"history": self.history.state_dict(), "base": self.base, "batches": self.batches,
                "passes": self.passes, "order": self.order.clone(), "skipped": self.skipped,
                "tokens_saved": self.tokens_saved, "best_reward": self.best_reward,
                "worst_reward": self.worst_reward, "generated_tokens": self.generated_tokens,
                "evidence": self.evidence.clone()}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state["history"])
        self.base, self.batches, self.passes = state["base"], state["batches"], state["passes"]
        self.order, self.skipped, self.tokens_saved = state["order"].clone(), state["skipped"], state["tokens_saved"]
        self.best_reward = state["best_reward"]
        # absent from checkpoints written before they were kept
        self.generated_tokens = state.get("generated_tokens", 0.0)
        self.worst_reward = state.get("worst_reward", -float("inf"))  # as before: the best reward alone decided
        self.evidence = state.get("evidence", torch.zeros(4, dtype=torch.float64)).clone()  # none: failing base 1
