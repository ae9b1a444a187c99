"""The trainer wiring of prompt skipping: `PromptSkip`, the feature the trainer calls at the points of a step that
`trainer.STEP` lists for it.

Before generation, every prompt a generation batch is drawn from passes through `prompt_filter`: kept with its keep
probability (`skipping.keep_probability`), else skipped and replaced by the next prompt of the same draw, so the batch
keeps its size and TRL's repeat contract (each prompt `num_generations` times in a row, the same global draw on every
process, each taking its slice). With policy groups (and a sampling rule other than `uniform`) the filter acts inside
each group's draw; otherwise this feature draws the batch itself, in a shuffled pass over the dataset as TRL's
sampler does. After generation, the batch's rewards update each prompt's history and the base keep probability.

The metrics (training, every generation batch): `prompt_skip/uninformative_frac` (the share of its generation groups
whose completions all got the same reward, over the scored ones; per policy group as
`prompt_skip/<group>/uninformative_frac`), `prompt_skip/keep_base`, `prompt_skip/skipped_in_batch`, and the running
totals `prompt_skip/skipped` (prompts) and `prompt_skip/tokens_saved` (completion tokens not generated, each skip
counted at its prompt's last mean completion length times `num_generations`).
"""

import torch

from ..dataset_checks import ROW_COLUMN
from ..features import Feature, local_rows, prompts_per_draw, total_rewards
from ..trl_contact import log_total, loss_mask, metrics
from .skipping import adapt_base, keep_probability, skip_streak
from .state import PromptSkipState


class PromptSkip(Feature):
    """Prompt skipping in the trainer (`skip`, a `PromptSkipState`). Built when `prompt_skip` is set."""

    name = "prompt_skip"

    def __init__(self, trainer):
        super().__init__(trainer)
        args = trainer.args
        self.skip = PromptSkipState(len(trainer.train_dataset), args.prompt_skip_initial_keep, args.seed)
        self._batch = None  # (gathered rewards per function (N, F), dataset rows (N,)) of this generation batch
        self._decisions = None  # (the batch count it is for, its generator)
        self._skipped_in_batch = 0

    @classmethod
    def build(cls, trainer) -> "PromptSkip | None":
        return cls(trainer) if trainer.args.prompt_skip else None

    def state(self) -> PromptSkipState:
        return self.skip

    # -- before generation

    def prompt_filter(self, row: int) -> bool:
        skip = self.skip
        if self._decisions is None or self._decisions[0] != skip.batches:
            self._decisions = (skip.batches, skip.decision_generator())
        args = self.trainer.args
        history = skip.history
        streak = skip_streak(history.streak[row], history.value[row], skip.best_reward, args.prompt_skip_failing_grace)
        if streak == 0:
            return True
        probability = float(keep_probability(streak, skip.base, args.prompt_skip_min_keep))
        if float(torch.rand((), dtype=torch.float64, generator=self._decisions[1])) < probability:
            return True
        skip.skipped += 1
        skip.tokens_saved += float(skip.history.length[row]) * self.trainer.num_generations
        self._skipped_in_batch += 1
        return False

    def generation_batch(self, inputs: list[dict], keep) -> list[dict] | None:
        """Without policy groups drawing the batch: the same global draw on every process, each taking its slice of
        `len(inputs)` rows, every prompt repeated `num_generations` times (TRL's sampler's contract)."""
        trainer = self.trainer
        if not trainer.model.training:
            return None
        rows = self.skip.draw_rows(prompts_per_draw(trainer, len(inputs)), keep)
        return local_rows(trainer, rows, len(inputs))

    # -- after generation

    def rewards(self, inputs: list[dict], rewards_per_func: torch.Tensor) -> None:
        trainer = self.trainer
        if trainer.model.training:
            rows = torch.tensor([row[ROW_COLUMN] for row in inputs], device=rewards_per_func.device)
            self._batch = (rewards_per_func, trainer.accelerator.gather(rows))

    def advantages(self, output: dict) -> None:
        trainer = self.trainer
        if not trainer.model.training:
            return
        skip, generations = self.skip, trainer.num_generations
        rewards_per_func, rows = (t.cpu() for t in self._batch)  # (N, F), (N,)
        rewards = total_rewards(rewards_per_func, trainer.reward_weights).view(-1, generations)  # (P, G)
        lengths = trainer.accelerator.gather(loss_mask(output).sum(dim=1)).cpu().double()  # (N,) tokens
        lengths[lengths == 0] = torch.nan  # masked as truncated: not a length TRL's loss saw
        prompt_rows = rows[::generations]  # (P,)
        if (~torch.isnan(rewards)).any():
            skip.best_reward = max(skip.best_reward, float(rewards[~torch.isnan(rewards)].max()))
        equal = skip.history.observe(prompt_rows, rewards, lengths.view(-1, generations), trainer.state.global_step)
        scored = ~torch.isnan(rewards).all(dim=1)
        share = float(equal[scored].double().mean()) if scored.any() else float("nan")
        args = trainer.args
        skip.base = adapt_base(skip.base, share, args.prompt_skip_target, args.prompt_skip_adapt_step,
                               args.prompt_skip_min_keep)  # fmt: skip
        skip.batches += 1
        train_metrics = metrics(trainer, "train")
        train_metrics["prompt_skip/uninformative_frac"].append(share)
        train_metrics["prompt_skip/keep_base"].append(skip.base)
        train_metrics["prompt_skip/skipped_in_batch"].append(float(self._skipped_in_batch))
        self._skipped_in_batch = 0
        log_total(trainer, "train", "prompt_skip/skipped", float(skip.skipped))
        log_total(trainer, "train", "prompt_skip/tokens_saved", skip.tokens_saved)
        groups = trainer.policy_groups  # the policy groups' state, when they are on
        if groups is not None:
            ids = groups.assignment[prompt_rows]
            for group, name in enumerate(groups.names):
                members = scored & (ids == group)
                if members.any():
                    value = float(equal[members].double().mean())
                    train_metrics[f"prompt_skip/{name}/uninformative_frac"].append(value)
