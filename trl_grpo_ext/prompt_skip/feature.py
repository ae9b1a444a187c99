"""The trainer wiring of prompt skipping: `PromptSkip`, the feature the trainer calls at the points of a step that
`composition.STEP` lists for it.

By default (`prompt_skip_refill=False`) a skipped prompt is not replaced: TRL's sampler (or the policy groups) draws
the generation batch as without skipping, and `skip_prompts` takes the skipped prompts out of it before generation,
deciding on the whole draw (gathered over the processes, the same decisions everywhere). Each prompt is kept with its
keep probability: from its history (`skipping.history_keep`: GRESO's streak, or the posterior of its completions
with `prompt_skip_rule: posterior`) when it was generated for before, else, with policy
groups, from its group's solved share (`skipping.first_visit_keep`); with policy groups, a prompt never informative
keeps at most its group's `skipping.failing_group_keep` (a group none of whose prompts was ever informative). Skipped
prompts are put back until every process holds the same number of completions, a whole number of micro-batches each
(`skipping.keep_for_layout`). After generation, TRL's loss is told about the skipped completions as if present with
zero advantage (`normalizer`): their estimated tokens are added to `num_items_in_batch`, or the loss is scaled by a
factor carried in the batch.

With `prompt_skip_refill=True` a skipped prompt is replaced by the next prompt of the same draw, so the batch keeps
its size: every prompt drawn passes through `prompt_filter`, inside each policy group's draw with policy groups (and
a sampling rule other than `uniform`), else in this feature's own shuffled pass over the dataset.

After generation, the batch's rewards update each prompt's history and the base keep probability. The metrics
(training, every generation batch): `prompt_skip/uninformative_frac` (the share of its generation groups whose
completions all got the same reward, over the scored ones; per policy group as
`prompt_skip/<group>/uninformative_frac`), `prompt_skip/keep_base`, `prompt_skip/hopeless_keep_base` (with
`prompt_skip_hopeless`: `skipping.hopeless_base`), `prompt_skip/skipped_in_batch`,
`prompt_skip/completion_tokens` (the completion tokens generated for the batch, over all processes, as TRL's
`completions/mean_length` counts them), and the running totals `prompt_skip/skipped` (prompts),
`prompt_skip/completion_tokens_total` and `prompt_skip/tokens_saved` (completion tokens not generated: each skipped
prompt counted at `num_generations` times the batch's mean generated length; 0 with refilling, where a skipped
prompt is replaced).
"""

import torch

from ..dataset_preparation import ROW_COLUMN
from ..feature_api import Feature, local_rows, prompts_per_draw, total_rewards
from ..trl_contact import log_total, loss_mask, metrics
from .history import NEVER
from .normalizer import normalizer_correction
from .skipping import (
    adapt_base,
    count_evidence,
    history_keep,
    hopeless_base,
    keep_for_layout,
    layout_quantum,
    prompt_keep_probability,
    static_cache_quantum,
)
from .state import PromptSkipState

LOSS_SCALE = "prompt_skip_loss_scale"  # the batch entry (0-dim) TRL's loss is multiplied by, where one is needed


class PromptSkip(Feature):
    """Prompt skipping in the trainer (`skip`, a `PromptSkipState`). Built when `prompt_skip` is set."""

    name = "prompt_skip"
    reads = ("policy_groups", "fast_generation")
    writes = ("output['num_items_in_batch']", "output['prompt_skip_loss_scale']")

    def __init__(self, trainer):
        super().__init__(trainer)
        args = trainer.args
        self.refill = args.prompt_skip_refill
        self.skip = PromptSkipState(len(trainer.train_dataset), args.prompt_skip_initial_keep, args.seed,
                                    counts=args.prompt_skip_rule == "posterior")  # fmt: skip
        self._batch = None  # (gathered rewards per function (N, F), dataset rows (N,)) of this generation batch
        self._decisions = None  # refill: (the batch count it is for, its generator)
        self._skipped_in_batch = 0
        self._skipped_rows = torch.empty(0, dtype=torch.long)  # no refill: the rows skipped from this batch's draw
        self._drawn = 0  # no refill: the prompts of this batch's draw

    @classmethod
    def build(cls, trainer) -> "PromptSkip | None":
        return cls(trainer) if trainer.args.prompt_skip else None

    def state(self) -> PromptSkipState:
        return self.skip

    # -- before generation

    def keep_probabilities(self, rows: torch.Tensor) -> torch.Tensor:
        """(P,) float64 the keep probability of each dataset row of `rows` (P,): `skipping.prompt_keep_probability`."""
        args, skip, groups = self.trainer.args, self.skip, self.trainer.policy_groups
        by_group = groups is not None and (args.prompt_skip_first_visit or args.prompt_skip_group_informative > 0)
        return prompt_keep_probability(
            skip.history,
            rows,
            base=skip.base,
            hopeless=self.hopeless_base(),
            best=skip.solved_at(),
            grace=args.prompt_skip_failing_grace,
            floor=args.prompt_skip_min_keep,
            groups=(groups.assignment, len(groups.names)) if by_group else None,
            first_visit=args.prompt_skip_first_visit,
            group_informative=args.prompt_skip_group_informative,
            generations=self.trainer.num_generations,
        )

    def hopeless_base(self) -> float | None:
        """With `prompt_skip_hopeless`, the base keep probability of a failing prompt never informative, measured on
        the run so far (`skipping.hopeless_base`); else None."""
        return hopeless_base(self.skip.evidence) if self.trainer.args.prompt_skip_hopeless else None

    def prompt_filter(self, row: int) -> bool:
        if not self.refill:
            return True
        skip = self.skip
        if self._decisions is None or self._decisions[0] != skip.batches:
            self._decisions = (skip.batches, skip.decision_generator())
        args = self.trainer.args
        probability = float(
            history_keep(
                skip.history,
                torch.tensor([row]),
                base=skip.base,
                hopeless=self.hopeless_base(),
                best=skip.solved_at(),
                grace=args.prompt_skip_failing_grace,
                floor=args.prompt_skip_min_keep,
                generations=self.trainer.num_generations,
            )
        )
        if probability >= 1.0:
            return True
        if float(torch.rand((), dtype=torch.float64, generator=self._decisions[1])) < probability:
            return True
        skip.skipped += 1  # replaced by the next prompt of the draw: no token saved
        self._skipped_in_batch += 1
        return False

    def generation_batch(self, inputs: list[dict], keep) -> list[dict] | None:
        """With refilling and without policy groups drawing the batch: the same global draw on every process, each
        taking its slice of `len(inputs)` rows, every prompt repeated `num_generations` times (TRL's sampler's
        contract). Without refilling, TRL's sampler draws."""
        trainer = self.trainer
        if not self.refill or not trainer.model.training:
            return None
        rows = self.skip.draw_rows(prompts_per_draw(trainer, len(inputs)), keep)
        return local_rows(trainer, rows, len(inputs))

    def skip_prompts(self, inputs: list[dict]) -> list[dict]:
        """This process's rows of the generation batch without the skipped prompts (no refill; training only).

        Raises:
            RuntimeError: the drawn batch does not hold each prompt `num_generations` times in a row over the
                processes (TRL's sampler's contract, which the layout relies on).
        """
        trainer = self.trainer
        if self.refill or not trainer.model.training:
            return inputs
        accelerator, generations = trainer.accelerator, trainer.num_generations
        local = torch.tensor([row[ROW_COLUMN] for row in inputs], device=accelerator.device)
        rows = accelerator.gather(local).cpu().view(-1, generations)  # (P, G)
        if not (rows == rows[:, :1]).all():
            raise RuntimeError(
                "prompt_skip: the generation batch does not hold each prompt num_generations "
                f"({generations}) times in a row, as TRL's sampler lays it out; got rows {rows.flatten().tolist()}"
            )
        prompts = rows[:, 0]  # (P,)
        probability = self.keep_probabilities(prompts)
        draws = torch.rand(len(prompts), dtype=torch.float64, generator=self.skip.decision_generator())
        quantum = layout_quantum(generations, accelerator.num_processes, trainer.args.steps_per_generation)
        if trainer.args.generation_compile:  # a static cache and a compiled graph per batch size: two sizes at most
            quantum = static_cache_quantum(len(prompts), quantum)
        kept = keep_for_layout(draws < probability, probability, quantum)
        self._skipped_rows, self._drawn = prompts[~kept], len(prompts)
        self._skipped_in_batch = len(self._skipped_rows)
        self.skip.skipped += self._skipped_in_batch
        return local_rows(trainer, prompts[kept], int(kept.sum()) * generations // accelerator.num_processes)

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
        lengths = trainer.accelerator.gather(loss_mask(output).sum(dim=1)).cpu().double()  # (N,) loss tokens
        loss_tokens = float(lengths.sum())
        lengths[lengths == 0] = torch.nan  # masked as truncated: not a length TRL's loss saw
        prompt_rows = rows[::generations]  # (P,)
        train_metrics = metrics(trainer, "train")
        # generated, truncated ones included: TRL's mean completion length of this batch (over all processes) times N
        mean_generated = train_metrics["completions/mean_length"][-1]
        generated = mean_generated * len(lengths)
        if not self.refill:
            mean_loss_length = torch.nan_to_num(lengths.nanmean(), nan=0.0)
            self._account_for_skipped(output, loss_tokens, mean_loss_length, mean_generated)
        skip.generated_tokens += generated
        before = self._visit_kinds(prompt_rows)  # decided on the history before this batch
        if (~torch.isnan(rewards)).any():
            scored_rewards = rewards[~torch.isnan(rewards)]
            skip.best_reward = max(skip.best_reward, float(scored_rewards.max()))
            skip.worst_reward = min(skip.worst_reward, float(scored_rewards.min()))
        step = trainer.state.global_step
        equal = skip.history.observe(prompt_rows, rewards, lengths.view(-1, generations), step, skip.solved_at())
        scored = ~torch.isnan(rewards).all(dim=1)
        skip.evidence = count_evidence(skip.evidence, before[0] & scored, before[1] & scored, scored & ~equal)
        share = float(equal[scored].double().mean()) if scored.any() else float("nan")
        args = trainer.args
        skip.base = adapt_base(skip.base, share, target=args.prompt_skip_target, step=args.prompt_skip_adapt_step,
                               low=args.prompt_skip_min_keep)  # fmt: skip
        skip.batches += 1
        train_metrics["prompt_skip/uninformative_frac"].append(share)
        train_metrics["prompt_skip/keep_base"].append(skip.base)
        if args.prompt_skip_hopeless:
            train_metrics["prompt_skip/hopeless_keep_base"].append(self.hopeless_base())
        train_metrics["prompt_skip/skipped_in_batch"].append(float(self._skipped_in_batch))
        self._skipped_in_batch = 0
        train_metrics["prompt_skip/completion_tokens"].append(generated)
        log_total(trainer, "train", "prompt_skip/skipped", float(skip.skipped))
        log_total(trainer, "train", "prompt_skip/tokens_saved", skip.tokens_saved)
        log_total(trainer, "train", "prompt_skip/completion_tokens_total", skip.generated_tokens)
        groups = trainer.policy_groups  # the policy groups' state, when they are on
        if groups is not None:
            ids = groups.assignment[prompt_rows]
            for group, name in enumerate(groups.names):
                members = scored & (ids == group)
                if members.any():
                    value = float(equal[members].double().mean())
                    train_metrics[f"prompt_skip/{name}/uninformative_frac"].append(value)

    def _visit_kinds(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(failing (P,) bool: the last visit was uninformative below the reward a solved prompt gets and none was
        informative, after an informative visit (P,) bool) for the dataset rows `rows` (P,), from the history now."""
        history = self.skip.history
        after_informative = (history.last_step[rows] != NEVER) & (history.streak[rows] == 0)
        return history.failing_never_informative(self.skip.solved_at(), rows), after_informative

    def _account_for_skipped(self, output: dict, generated: float, mean_length, mean_generated: float) -> None:
        """Tell TRL's loss about this batch's skipped completions, as present with zero advantage (`normalizer`):
        `generated` completion tokens its loss counts, over all processes; a skipped prompt's completions are
        estimated at its last visit's mean length, or at `mean_length` (this batch's, tokens) for a prompt never
        generated for (lengths in the loss's tokens: a completion masked as truncated counts 0). The tokens saved
        are counted at `mean_generated`, this batch's mean generated length (truncated completions included)."""
        trainer, history = self.trainer, self.skip.history
        if self._drawn == 0:  # no draw was decided on for this batch (`skip_prompts` runs before every generation)
            return
        skipped = self._skipped_rows
        seen = history.last_step[skipped] != NEVER
        estimate = torch.where(seen, history.length[skipped].double(), mean_length.double())
        skipped_tokens = float(estimate.sum()) * trainer.num_generations
        self.skip.tokens_saved += len(skipped) * trainer.num_generations * mean_generated
        kept, drawn = self._drawn - len(skipped), self._drawn
        self._drawn = 0  # used: the next batch is corrected only once its own draw was decided on
        extra, scale = normalizer_correction(trainer.args.loss_type, kept, drawn, generated, skipped_tokens)
        if extra:
            output["num_items_in_batch"] = output["num_items_in_batch"] + extra
        if scale != 1.0:
            output[LOSS_SCALE] = torch.tensor(scale, dtype=torch.float32, device=output["advantages"].device)

    # -- TRL's loss

    def loss_end(self, batch: dict, loss: torch.Tensor) -> torch.Tensor:
        """TRL's loss over the generated completions, scaled (`normalizer`) where its normalizer is a mean over the
        micro-batch's completions or tokens; unchanged otherwise (and in evaluation, never skipped)."""
        scale = batch.get(LOSS_SCALE)
        return loss if scale is None else loss * scale
