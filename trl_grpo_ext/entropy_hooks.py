"""Entropy regularization wired into TRL's `GRPOTrainer` hooks: a mixin of `trl_grpo_ext.GRPOTrainer` (each override
calls `super()`). The formulas are in `entropy`; the settings are `GRPOConfig.entropy_reg` and the fields after it.

TRL's `_compute_loss` computes the per-token log-probabilities and entropies with `_get_per_token_logps_and_entropies`
before it reads the advantages; `trl_contact` forwards both to the hooks here. Our `hook_compute_loss` hands TRL a
shallow copy of the batch (TRL buffers the original and reuses it for `num_iterations` passes), and our
`hook_get_per_token_logps_and_entropies` acts on that copy while TRL's loss is being computed: it shifts the
advantages (`advantage`), or detaches the log-probabilities of Clip-Cov's tokens (`clip_cov`). Terms added to TRL's
loss (the `target` bonus, KL-Cov's penalty) are token means over the whole optimizer step (all its micro-batches and
processes), as TRL's `dapo` loss is a token sum over it.

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

from . import entropy as er
from .trl_contact import buffered_inputs, loss_mask, metrics, micro_step, per_token_logps_and_entropies

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

    def __init__(self, controller: er.EntropyPI | None):
        self.controller = controller

    def state_dict(self) -> dict:
        return {"controller": None if self.controller is None else self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.controller is not None:
            self.controller.load_state_dict(state["controller"])


class EntropyRegHooks:
    """TRL hook overrides for entropy regularization; each is a plain call to TRL's method while `entropy_reg` is
    empty (`self.entropy_reg_state` is None)."""

    entropy_reg_state: EntropyRegState | None = None
    _entropy_batch = None  # the copy of the batch TRL's loss is computing on, while it does
    _entropy_capture = None  # (log-probabilities (B, T) with gradient, entropies (B, T), tokens chosen (B, T))
    _entropy_window = None  # (keys, (K, 2) [entropy sum, token count] per key) over the accumulation window
    _chosen_window = None  # (2,) [tokens Clip-Cov/KL-Cov picked, tokens] over the accumulation window
    _window_start = None  # (optimizer step, micro-step) where the current accumulation window began
    _window_warned = False  # warned once that a training batch was not TRL's buffered slice
    _entropy_plan = None  # what the micro-batches of the window's part in TRL's buffer share (`_plan_window`)
    _entropy_scored = None  # (N,) bool over all processes: the last scored batch's completions some reward scored

    def _init_entropy_reg(self) -> None:
        """Called at the end of `GRPOTrainer.__init__`.

        Raises:
            ValueError: `entropy_target_per_group=True` without policy groups.
        """
        args = self.args
        if not args.entropy_reg:
            return
        controller = None
        if "target" in args.entropy_reg:
            if args.entropy_target_per_group and self.policy_groups is None:
                raise ValueError("entropy_target_per_group=True needs policy groups (policy_group_column, ...)")
            keys = list(self.policy_groups.names) if args.entropy_target_per_group else ["all"]
            bounds = (args.entropy_coef_min, args.entropy_coef_max)
            controller = er.EntropyPI(
                args.entropy_target, args.entropy_pi_kp, args.entropy_pi_ki, bounds, keys, args.entropy_pi_horizon
            )
        self.entropy_reg_state = EntropyRegState(controller)
        if "kl_cov" in args.entropy_reg and args.num_iterations == 1:
            if args.steps_per_generation <= args.gradient_accumulation_steps:
                logger.warning(
                    "entropy_reg 'kl_cov' penalizes |log pi - log pi_old|, which has no gradient while the policy has "
                    "not moved since generation: with num_iterations=1 and steps_per_generation <= "
                    "gradient_accumulation_steps it has no effect"
                )

    def _regroup(self, names, assignment, reason: str) -> None:
        """Policy groups changed (merge, split, refinement): each new group's controller takes the state of the groups
        its prompts came from, weighted by prompts; the old groups' controllers are dropped."""
        controller = None if self.entropy_reg_state is None else self.entropy_reg_state.controller
        if controller is None or not self.args.entropy_target_per_group:
            return super()._regroup(names, assignment, reason)
        old_names, old_ids = list(self.policy_groups.names), self.policy_groups.assignment.clone()
        super()._regroup(names, assignment, reason)
        new_ids = self.policy_groups.assignment
        parents = {}
        for group, name in enumerate(self.policy_groups.names):
            ids, counts = torch.unique(old_ids[new_ids == group], return_counts=True)
            parents[name] = {old_names[i]: float(c) for i, c in zip(ids.tolist(), counts.tolist(), strict=True)}
        controller.regroup(parents)

    def hook_calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super().hook_calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.entropy_reg_state is not None:  # (N,) over all processes, as TRL's `unscorable_mask`
            self._entropy_scored = ~torch.isnan(rewards_per_func).all(dim=1)
        return rewards_per_func

    def hook_generate_and_score_completions(self, inputs):
        output = super().hook_generate_and_score_completions(inputs)
        if self.entropy_reg_state is not None:
            size = len(output["advantages"])
            start = self.accelerator.process_index * size
            output[SCORED] = self._entropy_scored[start : start + size].to(output["completion_mask"].device)
        return output

    def hook_compute_loss(self, model, inputs):
        if self.entropy_reg_state is None:
            return super().hook_compute_loss(model, inputs)
        if self.model.training and set(self.args.entropy_reg) - {"advantage"}:
            self._plan_window(model, inputs)
        self._entropy_batch = dict(inputs)
        try:
            loss = super().hook_compute_loss(model, self._entropy_batch)
        finally:
            batch, capture = self._entropy_batch, self._entropy_capture
            self._entropy_batch = self._entropy_capture = None
        return loss + self._entropy_loss_terms(batch, capture)

    def hook_get_per_token_logps_and_entropies(self, **kwargs):
        result = super().hook_get_per_token_logps_and_entropies(**kwargs)
        batch = self._entropy_batch
        if batch is None or not kwargs.get("compute_entropy"):
            return result
        modes = self.args.entropy_reg
        logps, entropies = result[0], result[1]  # (B, T) each
        mask = loss_mask(batch)
        if "advantage" in modes:
            scored = _scored(batch)
            shifted = er.entropy_advantages(
                batch["advantages"], entropies, mask, self.args.entropy_advantage_coef, scored
            )
            # the mean shift over the completions TRL's loss uses: scored, with tokens (not masked as truncated)
            shift = (shifted - batch["advantages"]).float().reshape(len(shifted), -1)[:, 0]
            used = (scored & (mask.sum(1) > 0)).float()
            totals = self.accelerator.reduce(torch.stack([(shift * used).sum(), used.sum()]), reduction="sum")
            metrics(self, "train" if self.model.training else "eval")["entropy_reg/advantage_shift"].append(
                (totals[0] / totals[1]).item() if totals[1] > 0 else float("nan")
            )
            batch["advantages"] = shifted
        chosen = None
        if "clip_cov" in modes or "kl_cov" in modes:
            plan = self._entropy_plan if self.model.training else None
            if plan is not None and plan["chosen"] is not None:
                chosen = plan["chosen"][plan["index"]]  # chosen with the rest of the window
            else:  # the window's part (or the evaluation batch) is this batch alone
                chosen = self._choose_tokens([logps], [batch], 0 if plan is None else plan["before"])[0]
            if "clip_cov" in modes:
                logps = torch.where(chosen, logps.detach(), logps)
        self._entropy_capture = (logps, entropies, chosen)
        return (logps, *result[1:])

    def _plan_window(self, model, inputs: dict) -> None:
        """At the first micro-step of each accumulation window, plan what its micro-batches share, so that none of it
        depends on how the optimizer step is split into micro-batches: the window's tokens over all processes (the
        normalizer of the loss terms, `_window_share`), and Clip-Cov's or KL-Cov's tokens, chosen over the whole
        window at once (`_choose_tokens`: covariance centred by the window's means, `window_token_count` tokens).

        The window is the `current_gradient_accumulation_steps` micro-steps from the first one after the last
        optimizer step. TRL generates a whole generation batch before its micro-steps and keeps one slice per
        micro-step in `_buffered_inputs` (`_prepare_inputs`), so the window's batches are known when it starts; a
        window that runs into the next generation batch (`steps_per_generation * num_iterations` not a multiple of
        the accumulation steps) is planned in parts, each when it starts: its token counts still add up over the
        window, its means and normalizer come from the known part (the normalizer scaled to the window's micro-steps,
        as TRL's `dapo` normalizer is). With more than one micro-batch in the part, Clip-Cov and KL-Cov cost one
        forward pass over it without gradient (`_window_logps`); with one (no accumulation) nothing is added.
        """
        step, optimizer_step = micro_step(self), self.state.global_step
        if self._window_start is None or self._window_start[0] != optimizer_step:
            self._window_start = (optimizer_step, step)
        first, size = self._window_start[1], self.current_gradient_accumulation_steps
        every = self.args.steps_per_generation * self.num_iterations
        generated = step - step % every  # the micro-step that generated the buffered batches
        start, end = max(first, generated), min(first + size, generated + every)
        buffered = buffered_inputs(self)
        batches = [buffered[t % self.args.steps_per_generation] for t in range(start, end)]
        if not start <= step < end or batches[step - start] is not inputs:  # not TRL's buffered slice: alone
            if not self._window_warned:
                self._window_warned = True
                logger.warning(
                    "entropy_reg: the training batch of micro-step %d is not TRL's buffered slice %d (TRL's "
                    "buffering changed?): Clip-Cov/KL-Cov and the loss terms now act per micro-batch, so the run "
                    "depends on how a step is split into micro-batches",
                    step,
                    step % self.args.steps_per_generation,
                )
            batches, start = [inputs], step
        plan = self._entropy_plan
        key = (optimizer_step, start - first)
        if plan is None or plan["key"] != key:
            same_step = plan is not None and plan["key"][0] == optimizer_step
            before = plan["before"] + plan["picked_from"] if same_step else 0
            tokens = sum(int(loss_mask(batch).sum()) for batch in batches)
            picked_from = sum(int(_advantage_mask(batch).sum()) for batch in batches)
            device = inputs["completion_mask"].device
            total = self.accelerator.reduce(torch.tensor(float(tokens), device=device), reduction="sum").item()
            normalizer = total * size / len(batches) / self.accelerator.num_processes
            plan = {"key": key, "before": before, "picked_from": picked_from, "normalizer": max(normalizer, 1.0),
                    "chosen": None}  # fmt: skip
            self._entropy_plan = plan
            if len(batches) > 1 and {"clip_cov", "kl_cov"} & set(self.args.entropy_reg):
                plan["chosen"] = self._choose_tokens(*self._window_logps(model, batches), before)
        plan["index"] = step - start

    @torch.no_grad()
    def _window_logps(self, model, batches: list[dict]) -> tuple[list[torch.Tensor], list[dict]]:
        """The policy's log-probabilities (B_j, T) of the completions of each of `batches`, without gradient (the
        policy does not change within an accumulation window), and the batches with the advantages TRL's loss will
        see (shifted by the `advantage` mode). Runs before TRL's loss: our hooks on the log-probabilities capture
        nothing from it (TRL's own call overwrites what the policy-group hooks keep)."""
        shift = "advantage" in self.args.entropy_reg
        logps, seen = [], []
        device = batches[0]["completion_ids"].device
        # Dropout in this pass must not move the random stream that the gradient pass (and a 16x1 run) draws from.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type):
            for batch in batches:
                result = per_token_logps_and_entropies(self, model, batch, compute_entropy=shift)
                if shift:
                    shifted = er.entropy_advantages(
                        batch["advantages"], result[1], loss_mask(batch), self.args.entropy_advantage_coef,
                        _scored(batch),
                    )  # fmt: skip
                    batch = {**batch, "advantages": shifted}
                logps.append(result[0])
                seen.append(batch)
        return logps, seen

    def _choose_tokens(self, logps: list[torch.Tensor], batches: list[dict], before: int) -> list[torch.Tensor]:
        """Clip-Cov's or KL-Cov's tokens (B_j, T) in each of `batches`, chosen over all of them at once: the covariance
        (`entropy.token_covariance`) of the policy's log-probabilities `logps` (B_j, T) and the batches' advantages,
        centred by their means over all of them and all processes; `entropy.window_token_count` tokens, after `before`
        tokens of the same optimizer step. Only tokens of scored completions (`_advantage_mask`) are counted, centred
        over and chosen: an unscored completion's advantage is TRL's 0, not a measurement. The draw and the ranking
        see the tokens in the same order however the batches are split, so the choice is that of one batch holding
        them all."""
        masks = [_advantage_mask(batch) for batch in batches]
        mask, all_logps = torch.cat(masks), torch.cat(logps)  # (R, T), R = Σ B_j
        advantages = torch.cat([batch["advantages"] for batch in batches])  # (R,) or (R, T)
        cov = er.token_covariance(all_logps, advantages, self._global_means(all_logps, advantages, mask))
        if "clip_cov" in self.args.entropy_reg:
            count = er.window_token_count(self.args.clip_cov_ratio, before, int(mask.sum()))
            clipped = torch.cat([self._ppo_clipped(lp, batch) for lp, batch in zip(logps, batches, strict=True)])
            bounds = (self.args.clip_cov_lb, self.args.clip_cov_ub)
            chosen = er.clip_cov_draw(cov, mask.bool() & ~clipped, count, bounds, self._clip_cov_generator())
        else:
            count = er.window_token_count(self.args.kl_cov_ratio, before, int(mask.bool().sum()))
            chosen = er.kl_cov_top(cov, mask, count)
        return list(chosen.split([len(m) for m in masks]))

    def _window_share(self, mask: torch.Tensor) -> float:
        """This micro-batch's tokens over the optimizer step's tokens per process: a token mean over the micro-batch
        times this is its part of the token mean over the step, after the gradients are averaged over processes
        (1.0 without accumulation on one process)."""
        plan = self._entropy_plan
        if plan is None:
            return 1.0 / self.current_gradient_accumulation_steps
        return float(mask.sum()) / plan["normalizer"]

    def _global_means(self, logps, advantages, mask) -> tuple[float, float]:
        """(mean log-probability, mean advantage) over the valid tokens of every process."""
        mask = mask.to(logps.dtype)
        advantages = advantages if advantages.dim() == 2 else advantages[:, None]
        sums = torch.stack([(logps.detach() * mask).sum(), (advantages.detach() * mask).sum(), mask.sum()])
        sums = self.accelerator.reduce(sums, reduction="sum")
        count = sums[2].clamp(min=1.0)
        return (sums[0] / count).item(), (sums[1] / count).item()

    def _ppo_clipped(self, logps, batch) -> torch.Tensor:
        """(B, T) tokens where the clipped PPO surrogate is the active one; Clip-Cov leaves them alone (the reference
        implementation's `clip_by_origin`)."""
        old = batch.get("old_per_token_logps")
        ratio = torch.exp(logps.detach() - (logps.detach() if old is None else old))
        advantages = batch["advantages"] if batch["advantages"].dim() == 2 else batch["advantages"][:, None]
        clipped = torch.clamp(ratio, 1 - self.epsilon_low, 1 + self.epsilon_high)
        return -advantages * clipped > -advantages * ratio

    def _clip_cov_generator(self) -> torch.Generator:
        """Clip-Cov's random draw: seeded by the run's seed, the process, the optimizer step (checkpointed) and the
        part of its window, named by the tokens of the step before it (a part starts where a generation batch does,
        whatever the micro-batch size), so a resumed run draws the same tokens, the draw does not depend on how the
        step is split into micro-batches, and no other random stream moves."""
        plan = self._entropy_plan if self.model.training else None
        part = 0 if plan is None else plan["before"]
        seed = self.args.seed * 1_000_003 + self.accelerator.process_index * 10_007
        seed = (seed + self.state.global_step * 1_000_000_007 + part * 7_919) % 2**63
        return torch.Generator().manual_seed(seed)

    def _entropy_loss_terms(self, batch, capture) -> torch.Tensor:
        """The `target` bonus (subtracted) and KL-Cov's penalty (added) for this micro-batch, each its part of the
        token mean over the optimizer step (`_window_share`), with metrics and, at the end of an accumulation window
        in training, the controller update."""
        logps, entropies, chosen = capture
        mask = loss_mask(batch)
        training = self.model.training
        mode = "train" if training else "eval"
        share = self._window_share(mask) if training else 1.0
        extra = torch.zeros((), device=logps.device, dtype=logps.dtype)
        modes = self.args.entropy_reg
        if "kl_cov" in modes:
            old = batch.get("old_per_token_logps")
            old = logps.detach() if old is None else old
            extra = extra + er.kl_cov_penalty(logps, old, chosen, mask, self.args.kl_cov_coef) * share
        if chosen is not None:
            counts = torch.stack([chosen.sum(), _advantage_mask(batch).sum()]).float()
            if training:  # one value per optimizer step, over its window
                window = self._chosen_window
                counts = self._chosen_window = counts if window is None else window + counts
            if not training or self.accelerator.sync_gradients:
                counts = self.accelerator.reduce(counts, reduction="sum")
                if training:
                    self._chosen_window = None
                name = "clipped_frac" if "clip_cov" in modes else "penalized_frac"
                metrics(self, mode)[f"entropy_reg/{name}"].append((counts[0] / counts[1].clamp(min=1.0)).item())
        controller = self.entropy_reg_state.controller
        if controller is not None:
            keys, ids = self._entropy_keys(batch, len(entropies))
            coefs = [controller.mean_coefficient() if key == "mean" else controller.coefficient(key) for key in keys]
            coef = torch.tensor(coefs, dtype=entropies.dtype, device=entropies.device)[ids]  # (B,)
            extra = extra - er.entropy_bonus(entropies, mask, coef) * share
            if training:
                self._observe_entropy(keys, ids, entropies.detach(), mask)
        return extra

    def _entropy_keys(self, batch, size: int) -> tuple[list[str], torch.Tensor]:
        """The controller keys K and each of the `size` completions' index among them, (B,): the policy groups'
        names, or `all`. An evaluation batch carries no policy groups: with per-group targets its completions get the
        mean coefficient (`mean`)."""
        device = batch["completion_mask"].device
        if self.args.entropy_target_per_group and "policy_group_ids" in batch:
            return list(self.policy_groups.names), batch["policy_group_ids"]
        key = "mean" if self.args.entropy_target_per_group else "all"
        return [key], torch.zeros(size, dtype=torch.long, device=device)

    def _observe_entropy(self, keys: list[str], ids: torch.Tensor, entropies: torch.Tensor, mask) -> None:
        """Add this micro-batch's entropy sums per key to the window; at its end, reduce over processes (every
        process then holds the same measurement) and update the controllers. `keys` are the same on every process
        (policy groups change on all at once); a window whose keys changed midway (a regroup) starts anew."""
        tokens = mask.to(entropies.dtype)
        per_completion = torch.stack([(entropies * tokens).sum(1), tokens.sum(1)], dim=1).double()  # (B, 2)
        sums = torch.zeros(len(keys), 2, dtype=torch.float64, device=entropies.device).index_add_(
            0, ids, per_completion
        )
        window = self._entropy_window
        self._entropy_window = (keys, sums if window is None or window[0] != keys else window[1] + sums)
        if not self.accelerator.sync_gradients:
            return
        totals = self.accelerator.reduce(self._entropy_window[1], reduction="sum").tolist()  # (K, 2)
        self._entropy_window = None
        measured = {key: s / n for key, (s, n) in zip(keys, totals, strict=True) if n > 0}
        controller = self.entropy_reg_state.controller
        controller.update(measured)
        train_metrics = metrics(self, "train")
        if self.args.entropy_target_per_group:
            for key in keys:
                train_metrics[f"entropy_reg/{key}/coef"].append(controller.coefficient(key))
                if key in measured:
                    train_metrics[f"entropy_reg/{key}/entropy"].append(measured[key])
        coefs = [controller.coefficient(key) for key in keys if key in measured] or [0.0]
        train_metrics["entropy_reg/coef"].append(sum(coefs) / len(coefs))
