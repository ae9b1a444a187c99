"""The trainer wiring of entropy regularization: `EntropyReg`, the feature the trainer calls at the points of a step
that `composition.STEP` lists for it; it calls the modes of `GRPOConfig.entropy_reg` (`modes`) at fixed points of TRL's
loss. The formulas are in `bonus`, `covariance` and `controller`.

TRL's `_compute_loss` computes the per-token log-probabilities and entropies with `_get_per_token_logps_and_entropies`
before it reads the advantages. The trainer hands TRL's loss a shallow copy of the micro-batch (TRL buffers the
original and reuses it for `num_iterations` passes) and gives this feature the policy's log-probabilities and
entropies (`policy_logps`): the modes shift the copy's advantages (`advantage`), or detach the log-probabilities of
Clip-Cov's tokens (`clip_cov`). Terms added to TRL's loss (the `target` bonus, KL-Cov's penalty) are token means over
the whole optimizer step (all its micro-batches and processes), as TRL's `dapo` loss is a token sum over it. The
logged `loss` is then TRL's loss plus those terms: both parts are logged too, `loss/policy` (TRL's loss, its own KL
and entropy terms included) and `loss/entropy_reg` (the terms added here), each a mean over micro-batches and
processes.

Completions TRL leaves out stay out. One that no reward function scored (all None) has advantage exactly 0 in TRL:
`advantage` does not shift it, and Clip-Cov/KL-Cov neither choose its tokens nor count them in the covariance's means
(we mark them in the batch, `SCORED`). One masked as truncated (`mask_truncated_completions`) has no token in TRL's
loss mask (`trl_contact.loss_mask`), which every term and statistic here uses, as TRL's `entropy` metric and entropy
bonus do (so the `target` bonus and its measurement include unscored completions, as TRL's bonus does).

Split invariance (issue #12): nothing depends on how an optimizer step is split between `per_device_train_batch_size`
and `gradient_accumulation_steps`. The controllers are updated once per optimizer step from the sums of its whole
accumulation window; Clip-Cov's and KL-Cov's tokens are chosen once for the window, `clip_cov_ratio` / `kl_cov_ratio`
of its tokens, with the covariance centred by the window's means (`_plan_window`).
"""

import logging

import torch

from ..feature_api import Feature, Regroup
from ..trl_contact import (
    buffered_inputs,
    high_entropy_mask,
    loss_mask,
    metrics,
    micro_step,
    per_token_logps_and_entropies,
)
from . import covariance
from .modes import ENTROPY_REG_MODES, EntropyMode, LossTerms

logger = logging.getLogger(__name__)

SCORED = "completion_scored"  # the batch entry (B,) bool we add: some reward function scored the completion


def _scored(batch: dict) -> torch.Tensor:
    """(B,) bool: completions some reward function scored. TRL sets the advantage of the others (every reward None)
    to exactly 0, so that they do not move the policy; a batch without the entry (a checkpoint from before it) counts
    all as scored."""
    scored = batch.get(SCORED)
    if scored is None:
        mask = batch["completion_mask"]
        return torch.ones(len(mask), dtype=torch.bool, device=mask.device)
    return scored


def _advantage_mask(batch: dict) -> torch.Tensor:
    """(B, T) the tokens whose advantage TRL's loss uses: `loss_mask` of the scored completions. Clip-Cov's and
    KL-Cov's covariance of log-probability and advantage is taken over these (an unscored completion's advantage is
    not a measured one)."""
    return loss_mask(batch) * _scored(batch)[:, None].to(batch["completion_mask"].dtype)


class EntropyRegState:
    """What entropy regularization keeps across optimizer steps: the `target` controllers (coefficient and integral
    per key: `all`, or each policy group's name)."""

    def __init__(self, controller):
        self.controller = controller

    def state_dict(self) -> dict:
        return {"controller": None if self.controller is None else self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.controller is not None:
            self.controller.load_state_dict(state["controller"])


class EntropyReg(Feature):
    """Entropy regularization in the trainer: one object per mode of `entropy_reg` (`self.modes`, registry order),
    called at fixed points of TRL's loss (`modes` module docstring), and the optimizer step's accumulation window they
    share (`_plan_window`). Built when `entropy_reg` names a mode.

    Raises:
        ValueError: what a mode refuses when built (`entropy_target_per_group=True` without policy groups).
    """

    name = "entropy_reg"
    exposes = "entropy_reg_state"
    reads = ("policy_groups",)
    writes = ("batch['advantages']", "output['completion_scored']")

    def __init__(self, trainer):
        super().__init__(trainer)
        chosen = trainer.args.entropy_reg
        self.modes = [mode(self) for name, mode in ENTROPY_REG_MODES.items() if name in chosen]
        self.picker = next((mode for mode in self.modes if mode.picks_tokens), None)  # at most one (config check)
        self.shifters = [mode for mode in self.modes if mode.shifts_advantages]
        # modes that add a term to TRL's loss (the `target` bonus, KL-Cov's penalty): the logged loss is then a sum
        self.adds_loss_terms = any(type(mode).loss_term is not EntropyMode.loss_term for mode in self.modes)
        target = next((mode for mode in self.modes if mode.name == "target"), None)
        self.measurer = target  # measures each optimizer step's entropy before its loss (`_plan_window`)
        self._state = EntropyRegState(None if target is None else target.controller)
        self.plan = None  # what the micro-batches of the window's part in TRL's buffer share (`_plan_window`)
        self._window_start = None  # (optimizer step, micro-step) where the current accumulation window began
        self._warned = False  # warned once that a training batch was not TRL's buffered slice
        self._window_sums = {}  # metric -> its sums over the accumulation window so far (`_over_window`)
        self._capture = None  # (log-probabilities (B, T) with gradient, entropies (B, T), tokens chosen (B, T))
        self._scored_all = None  # (N,) bool over all processes: the last scored batch's completions some reward scored

    @classmethod
    def build(cls, trainer) -> "EntropyReg | None":
        return cls(trainer) if trainer.args.entropy_reg else None

    def state(self) -> EntropyRegState:
        return self._state

    def log(self, name: str, value: float, mode: str | None = None) -> None:
        """Append `value` to the metric `name` of `mode` ("train" or "eval"; None: the trainer's current one), logged
        by TRL."""
        mode = mode or ("train" if self.trainer.model.training else "eval")
        metrics(self.trainer, mode)[name].append(value)

    scored = staticmethod(_scored)

    # -- rewards, advantages: which completions some reward function scored

    def rewards(self, inputs: list[dict], rewards_per_func: torch.Tensor) -> None:
        self._scored_all = ~torch.isnan(rewards_per_func).all(dim=1)  # (N,) over all processes, as TRL's mask

    def advantages(self, output: dict) -> None:
        size = len(output["advantages"])
        start = self.trainer.accelerator.process_index * size
        output[SCORED] = self._scored_all[start : start + size].to(output["completion_mask"].device)

    def regroup(self, event: Regroup) -> None:
        parents = event.parents()
        for mode in self.modes:
            mode.regroup(parents)

    # -- loss

    def loss_start(self, model, inputs: dict, batch: dict) -> None:
        if self.trainer.model.training and any(mode.uses_window for mode in self.modes):
            self._plan_window(model, inputs)

    def policy_logps(self, batch: dict, logps: torch.Tensor, entropies: torch.Tensor | None) -> torch.Tensor:
        if entropies is None:  # TRL computed no entropies: nothing to regularize
            return logps
        if self.shifters:
            self._shift(batch, entropies)
        chosen = None
        if self.picker is not None:
            plan = self.plan if self.trainer.model.training else None
            if plan is not None and plan["chosen"] is not None:
                chosen = plan["chosen"][plan["index"]]  # chosen with the rest of the window
            else:  # the window's part (or the evaluation batch) is this batch alone
                masks = [self._pickable(batch, entropies)]
                chosen = self._choose_tokens([logps], [batch], 0 if plan is None else plan["before"], masks)[0]
                if plan is not None:
                    plan["picked_from"] = int(masks[0].sum())
        for mode in self.modes:
            logps = mode.adjust_logps(logps, chosen)
        self._capture = (logps, entropies, chosen)
        return logps

    def loss_end(self, batch: dict, loss: torch.Tensor) -> torch.Tensor:
        capture, self._capture = self._capture, None
        if capture is None:
            return loss
        extra = self._loss_terms(batch, capture)
        if self.adds_loss_terms:  # the logged `loss` is their sum: each part, summed over the step's micro-batches
            # (each is its share of the step's loss, as transformers sums them), a mean over processes
            parts = self._over_window("loss", torch.stack([loss.detach(), extra.detach()]).float(), "mean")
            if parts is not None:
                self.log("loss/policy", parts[0].item())
                self.log("loss/entropy_reg", parts[1].item())
        return loss + extra

    def _over_window(self, key: str, values: torch.Tensor, reduction: str = "sum") -> torch.Tensor | None:
        """`values` summed over the micro-batches of the optimizer step's accumulation window, then reduced over the
        processes (`reduction`): None until the window's last micro-batch. In evaluation each batch is its own window.
        So a metric of the step is the same however the step is split into micro-batches."""
        if self.trainer.model.training:
            values = self._window_sums[key] = values + self._window_sums.get(key, 0)
            if not self.trainer.accelerator.sync_gradients:
                return None
            del self._window_sums[key]
        return self.trainer.accelerator.reduce(values, reduction=reduction)

    def _shifted(self, batch: dict, entropies: torch.Tensor) -> torch.Tensor:
        """The advantages of `batch` after every mode that shifts them, in registry order."""
        mask = loss_mask(batch)
        for mode in self.shifters:
            batch = {**batch, "advantages": mode.shift_advantages(batch, entropies, mask)}
        return batch["advantages"]

    def _shift(self, batch: dict, entropies: torch.Tensor) -> None:
        """Shift the advantages TRL's loss reads from `batch`, and log the mean shift over the completions TRL's loss
        uses (scored, with tokens: not masked as truncated) as `entropy_reg/advantage_shift`."""
        shifted = self._shifted(batch, entropies)
        shift = (shifted - batch["advantages"]).float().reshape(len(shifted), -1)[:, 0]
        used = (_scored(batch) & (loss_mask(batch).sum(1) > 0)).float()
        totals = self._over_window("advantage_shift", torch.stack([(shift * used).sum(), used.sum()]))
        if totals is not None:
            self.log("entropy_reg/advantage_shift", (totals[0] / totals[1]).item() if totals[1] > 0 else float("nan"))
        batch["advantages"] = shifted

    # -- the accumulation window

    def _plan_window(self, model, inputs: dict) -> None:
        """At the first micro-step of each accumulation window, plan what its micro-batches share, so that none of it
        depends on how the optimizer step is split into micro-batches: the window's tokens over all processes (the
        normalizer of the loss terms, `_window_share`), Clip-Cov's or KL-Cov's tokens, chosen over the whole
        window at once (`_choose_tokens`: covariance centred by the window's means, `window_token_count` tokens), and
        when the `target` mode measures the step's entropy (`plan["measure"]`: "loss", in the loss's own forward pass
        of the window's one micro-batch; "window", here, before any of its loss; None, in the loss as the window goes,
        for a window planned in parts, whose coefficient then acts from the next step).

        The window is the `current_gradient_accumulation_steps` micro-steps from the first one after the last
        optimizer step. TRL generates a whole generation batch before its micro-steps and keeps one slice per
        micro-step in `_buffered_inputs` (`_prepare_inputs`), so the window's batches are known when it starts; a
        window that runs into the next generation batch (`steps_per_generation * num_iterations` not a multiple of
        the accumulation steps) is planned in parts, each when it starts: its token counts still add up over the
        window, its means and normalizer come from the known part (the normalizer scaled to the window's micro-steps,
        as TRL's `dapo` normalizer is). With more than one micro-batch in the part, Clip-Cov, KL-Cov and the
        `target` mode's measurement cost one forward pass over it without gradient (`_window_logps`, shared); with
        one (no accumulation) nothing is added.
        """
        trainer = self.trainer
        step, optimizer_step = micro_step(trainer), trainer.state.global_step
        if self._window_start is None or self._window_start[0] != optimizer_step:
            self._window_start = (optimizer_step, step)
        first, size = self._window_start[1], trainer.current_gradient_accumulation_steps
        every = trainer.args.steps_per_generation * trainer.num_iterations
        generated = step - step % every  # the micro-step that generated the buffered batches
        start, end = max(first, generated), min(first + size, generated + every)
        buffered = buffered_inputs(trainer)
        batches = [buffered[t % trainer.args.steps_per_generation] for t in range(start, end)]
        if not start <= step < end or batches[step - start] is not inputs:  # not TRL's buffered slice: alone
            if not self._warned:
                self._warned = True
                logger.warning(
                    "entropy_reg: the training batch of micro-step %d is not TRL's buffered slice %d (TRL's "
                    "buffering changed?): Clip-Cov/KL-Cov and the loss terms now act per micro-batch, so the run "
                    "depends on how a step is split into micro-batches",
                    step,
                    step % trainer.args.steps_per_generation,
                )
            batches, start = [inputs], step
        plan = self.plan
        key = (optimizer_step, start - first)
        if plan is None or plan["key"] != key:
            same_step = plan is not None and plan["key"][0] == optimizer_step
            before = plan["before"] + plan["picked_from"] if same_step else 0
            tokens = sum(int(loss_mask(batch).sum()) for batch in batches)
            picked_from = sum(int(_advantage_mask(batch).sum()) for batch in batches)  # the part's own, if alone
            device = inputs["completion_mask"].device
            total = trainer.accelerator.reduce(torch.tensor(float(tokens), device=device), reduction="sum").item()
            normalizer = total * size / len(batches) / trainer.accelerator.num_processes
            # the `target` mode measures the step's entropy before its loss when all of its batches are known now:
            # in the loss's own forward pass if the window is this one batch, else in the pass without gradient
            whole = start == first and start + len(batches) == first + size
            measure = self.measurer is not None and whole
            plan = {
                "key": key,
                "before": before,
                "picked_from": picked_from,
                "normalizer": max(normalizer, 1.0),
                "chosen": None,
                "measure": ("loss" if len(batches) == 1 else "window") if measure else None,
            }
            self.plan = plan
            if len(batches) > 1 and (self.picker is not None or measure):
                logps, seen, masks, entropies = self._window_logps(model, batches, entropy=measure)
                if self.picker is not None:
                    plan["chosen"] = self._choose_tokens(logps, seen, before, masks)
                    plan["picked_from"] = sum(int(mask.sum()) for mask in masks)
                if measure:
                    self.measurer.measure(batches, entropies)
        plan["index"] = step - start

    def _pickable(self, batch: dict, entropies: torch.Tensor | None) -> torch.Tensor:
        """(B, T) the tokens Clip-Cov and KL-Cov may pick and count: those of scored completions in TRL's loss mask
        (`_advantage_mask`) that TRL's policy loss keeps under `top_entropy_quantile` < 1 (`high_entropy_mask`:
        elsewhere the policy gradient is zero, so clipping or penalizing a token there would spend the ratio on a
        token the update does not move). `entropies` (B, T), or None when TRL computed none (then no restriction)."""
        mask = _advantage_mask(batch)
        kept = None if entropies is None else high_entropy_mask(self.trainer, entropies, batch)
        return mask if kept is None else mask * kept.to(mask.dtype)

    @torch.no_grad()
    def _window_logps(self, model, batches: list[dict], entropy: bool = False) -> tuple[list, list, list, list]:
        """The policy's log-probabilities (B_j, T) of the completions of each of `batches`, without gradient (the
        policy does not change within an accumulation window), the batches with the advantages TRL's loss will see
        (shifted by the modes that shift them), the tokens each lets Clip-Cov and KL-Cov pick (`_pickable`), and the
        token entropies (B_j, T) (None unless `entropy`, a shift or `top_entropy_quantile` needs them). Runs before
        TRL's loss, so no feature sees these log-probabilities as the policy's in the loss
        (`trainer.hook_get_per_token_logps_and_entropies`)."""
        trainer = self.trainer
        shift = bool(self.shifters)
        entropy = entropy or shift or trainer.top_entropy_quantile < 1.0
        logps, seen, masks, entropies = [], [], [], []
        device = batches[0]["completion_ids"].device
        # Dropout in this pass must not move the random stream that the gradient pass (and a 16x1 run) draws from.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type):
            for batch in batches:
                result = per_token_logps_and_entropies(trainer, model, batch, compute_entropy=entropy)
                if shift:
                    batch = {**batch, "advantages": self._shifted(batch, result[1])}
                logps.append(result[0])
                seen.append(batch)
                masks.append(self._pickable(batch, result[1]))
                entropies.append(result[1])
        return logps, seen, masks, entropies

    def _choose_tokens(self, logps: list[torch.Tensor], batches: list[dict], before: int,
                       masks: list[torch.Tensor]) -> list[torch.Tensor]:  # fmt: skip
        """The picking mode's tokens (B_j, T) in each of `batches`, chosen over all of them at once: the covariance
        (`covariance.token_covariance`) of the policy's log-probabilities `logps` (B_j, T) and the batches'
        advantages, centred by their means over all of them and all processes; `before` tokens of the same optimizer
        step came earlier (`covariance.window_token_count`). Only the tokens of `masks` (B_j, T) (`_pickable`: of
        scored completions, as an unscored completion's advantage is TRL's 0, not a measurement; and kept by
        `top_entropy_quantile`) are counted, centred over and chosen. The draw and the ranking see the tokens in the
        same order however the batches are split, so the choice is that of one batch holding them all."""
        mask, all_logps = torch.cat(masks), torch.cat(logps)  # (R, T), R = Σ B_j
        advantages = torch.cat([batch["advantages"] for batch in batches])  # (R,) or (R, T)
        cov = covariance.token_covariance(all_logps, advantages, self._global_means(all_logps, advantages, mask))
        chosen = self.picker.pick(cov, mask, logps, batches, before)
        return list(chosen.split([len(m) for m in masks]))

    def _window_share(self, mask: torch.Tensor) -> float:
        """This micro-batch's tokens over the optimizer step's tokens per process: a token mean over the micro-batch
        times this is its part of the token mean over the step, after the gradients are averaged over processes
        (1.0 without accumulation on one process)."""
        plan = self.plan
        if plan is None:
            return 1.0 / self.trainer.current_gradient_accumulation_steps
        return float(mask.sum()) / plan["normalizer"]

    def _global_means(self, logps, advantages, mask) -> tuple[float, float]:
        """(mean log-probability, mean advantage) over the valid tokens of every process."""
        mask = mask.to(logps.dtype)
        advantages = advantages if advantages.dim() == 2 else advantages[:, None]
        sums = torch.stack([(logps.detach() * mask).sum(), (advantages.detach() * mask).sum(), mask.sum()])
        sums = self.trainer.accelerator.reduce(sums, reduction="sum")
        count = sums[2].clamp(min=1.0)
        return (sums[0] / count).item(), (sums[1] / count).item()

    def _loss_terms(self, batch, capture) -> torch.Tensor:
        """The modes' loss terms for this micro-batch (the `target` bonus subtracted, KL-Cov's penalty added), each
        its part of the token mean over the optimizer step (`_window_share`), with the picked-token metric."""
        logps, entropies, chosen = capture
        trainer = self.trainer
        mask = loss_mask(batch)
        training = trainer.model.training
        share = self._window_share(mask) if training else 1.0
        extra = torch.zeros((), device=logps.device, dtype=logps.dtype)
        terms = LossTerms(batch, logps, entropies, mask, chosen, training)
        for mode in self.modes:
            term = mode.loss_term(terms)
            if term is not None:
                extra = extra + term * share
        if chosen is not None:
            self._log_chosen(chosen, batch)
        return extra

    def _log_chosen(self, chosen: torch.Tensor, batch: dict) -> None:
        """`entropy_reg/clipped_frac` (Clip-Cov) or `penalized_frac` (KL-Cov): the share of the scored tokens picked,
        one value per optimizer step over its window (per batch in evaluation), over all processes."""
        counts = self._over_window("chosen", torch.stack([chosen.sum(), _advantage_mask(batch).sum()]).float())
        if counts is not None:
            name = "clipped_frac" if self.picker.name == "clip_cov" else "penalized_frac"
            self.log(f"entropy_reg/{name}", (counts[0] / counts[1].clamp(min=1.0)).item())
