"""Entropy regularization wired into TRL's `GRPOTrainer` hooks: a mixin of `trl_grpo_ext.GRPOTrainer` (each override
calls `super()`). The formulas are in `entropy`; the settings are `GRPOConfig.entropy_reg` and the fields after it.

TRL's `_compute_loss` computes the per-token log-probabilities and entropies with `_get_per_token_logps_and_entropies`
before it reads the advantages; `trl_contact` forwards both to the hooks here. Our `hook_compute_loss` hands TRL a
shallow copy of the batch (TRL buffers the original and reuses it for `num_iterations` passes), and our
`hook_get_per_token_logps_and_entropies` acts on that copy while TRL's loss is being computed: it shifts the
advantages (`advantage`), or detaches the log-probabilities of Clip-Cov's tokens (`clip_cov`). Terms added to TRL's
loss (the `target` bonus, KL-Cov's penalty) are token means scaled for gradient accumulation only, as TRL's own
entropy bonus is.
"""

import logging

import torch

from . import entropy as er
from .trl_contact import metrics, micro_step

logger = logging.getLogger(__name__)


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

    def hook_compute_loss(self, model, inputs):
        if self.entropy_reg_state is None:
            return super().hook_compute_loss(model, inputs)
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
        mask = batch["completion_mask"] if "tool_mask" not in batch else batch["completion_mask"] * batch["tool_mask"]
        if "advantage" in modes:
            shifted = er.entropy_advantages(batch["advantages"], entropies, mask, self.args.entropy_advantage_coef)
            shift = self.accelerator.gather((shifted - batch["advantages"]).float().reshape(len(shifted), -1)[:, 0])
            metrics(self, "train" if self.model.training else "eval")["entropy_reg/advantage_shift"].append(
                shift.mean().item()
            )
            batch["advantages"] = shifted
        chosen = None
        if "clip_cov" in modes or "kl_cov" in modes:
            cov = er.token_covariance(logps, batch["advantages"], self._global_means(logps, batch["advantages"], mask))
            if "clip_cov" in modes:
                chosen = er.clip_cov_mask(
                    cov, mask.bool() & ~self._ppo_clipped(logps, batch), int(mask.sum()), self.args.clip_cov_ratio,
                    (self.args.clip_cov_lb, self.args.clip_cov_ub), self._clip_cov_generator(),
                )  # fmt: skip
                logps = torch.where(chosen, logps.detach(), logps)
            else:
                chosen = er.kl_cov_mask(cov, mask, self.args.kl_cov_ratio)
        self._entropy_capture = (logps, entropies, chosen)
        return (logps, *result[1:])

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
        """Clip-Cov's random draw: seeded by the run's seed, the process and the micro-step (checkpointed), so a
        resumed run draws the same tokens and no other random stream moves."""
        seed = (self.args.seed * 1_000_003 + self.accelerator.process_index * 10_007 + micro_step(self)) % 2**63
        return torch.Generator().manual_seed(seed)

    def _entropy_loss_terms(self, batch, capture) -> torch.Tensor:
        """The `target` bonus (subtracted) and KL-Cov's penalty (added) for this micro-batch, with metrics and, at
        the end of an accumulation window in training, the controller update."""
        logps, entropies, chosen = capture
        mask = batch["completion_mask"] if "tool_mask" not in batch else batch["completion_mask"] * batch["tool_mask"]
        training = self.model.training
        mode = "train" if training else "eval"
        accumulation = self.current_gradient_accumulation_steps if training else 1.0
        extra = torch.zeros((), device=logps.device, dtype=logps.dtype)
        modes = self.args.entropy_reg
        if "kl_cov" in modes:
            old = batch.get("old_per_token_logps")
            old = logps.detach() if old is None else old
            extra = extra + er.kl_cov_penalty(logps, old, chosen, mask, self.args.kl_cov_coef) / accumulation
        if chosen is not None:
            counts = self.accelerator.reduce(torch.stack([chosen.sum(), mask.sum()]).float(), reduction="sum")
            name = "clipped_frac" if "clip_cov" in modes else "penalized_frac"
            metrics(self, mode)[f"entropy_reg/{name}"].append((counts[0] / counts[1].clamp(min=1.0)).item())
        controller = self.entropy_reg_state.controller
        if controller is not None:
            keys, ids = self._entropy_keys(batch, len(entropies))
            coefs = [controller.mean_coefficient() if key == "mean" else controller.coefficient(key) for key in keys]
            coef = torch.tensor(coefs, dtype=entropies.dtype, device=entropies.device)[ids]  # (B,)
            extra = extra - er.entropy_bonus(entropies, mask, coef) / accumulation
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
