"""The modes of `GRPOConfig.entropy_reg`, one class each, registered by name in `ENTROPY_REG_MODES`.

The config reads the registry for the names `entropy_reg` accepts, its `--help` text and its docstring entry, and
calls every mode's `check` when it is built; `feature.EntropyReg` builds one object per mode the config names and
calls it at fixed points of TRL's loss on each micro-batch, modes in registry order:

    1. `shift_advantages`: change the advantages TRL's loss reads (the `advantage` mode);
    2. `pick`: choose tokens by the covariance of log-probability and advantage, over the optimizer step's
       accumulation window (a mode with `picks_tokens`; at most one per run);
    3. `adjust_logps`: change the log-probabilities TRL's loss goes on with, given the picked tokens (Clip-Cov);
    4. `loss_term`: a term added to TRL's loss, as a token mean over the micro-batch (`LossTerms`); the feature
       scales it to the micro-batch's share of the optimizer step, so that it is a token mean over the whole step.

A new mode is one class here (or anywhere: `ENTROPY_REG_MODES.register("name")` on a subclass of `EntropyMode`)
plus the config fields it reads; `tests/training/test_entropy.py` registers a trivial one.
"""

import logging
import math
from dataclasses import dataclass

import torch
from trl import GRPOConfig as TRLGRPOConfig

from ..feature_api import Registry
from ..trl_contact import loss_mask
from . import bonus, covariance
from .controller import EntropyPI

logger = logging.getLogger(__name__)

ENTROPY_REG_MODES = Registry("entropy_reg")
# TRL's default `entropy_target` (0.2 nats in TRL 1.16): a config that leaves it there sets no absolute target
TRL_ENTROPY_TARGET = TRLGRPOConfig.__dataclass_fields__["entropy_target"].default


@dataclass
class LossTerms:
    """What a mode's `loss_term` sees of one micro-batch in TRL's loss (B completions, T tokens).

    Attributes:
        batch: the micro-batch TRL's loss computed on (advantages (B,) or (B, T), masks, old log-probabilities).
        logps: (B, T) the policy's log-probabilities, with gradient (after `adjust_logps`).
        entropies: (B, T) the policy's token entropies in nats, with gradient.
        mask: (B, T) the tokens TRL's loss counts (`trl_contact.loss_mask`).
        chosen: (B, T) bool, the tokens the picking mode chose, or None.
        training: whether the model is training (False in evaluation).
    """

    batch: dict
    logps: torch.Tensor
    entropies: torch.Tensor
    mask: torch.Tensor
    chosen: torch.Tensor | None
    training: bool


class EntropyMode:
    """One mode of `entropy_reg`. Subclasses override what the mode does (module docstring); the defaults do nothing.

    Attributes:
        name: the registered name (set by `ENTROPY_REG_MODES.register`).
        summary: one line for `--help` and the config docstring: what the mode does and its source.
        picks_tokens: the mode chooses tokens by covariance (`pick`); a run has at most one such mode.
        uses_window: the mode needs the optimizer step's accumulation window planned (its token count over all
            micro-batches and processes), for a loss term or for picking tokens.
        shifts_advantages: the mode overrides `shift_advantages` (also applied when tokens are picked over the
            window, so the covariance sees the advantages TRL's loss will).
    """

    name: str = ""
    summary: str = ""
    picks_tokens = False
    uses_window = True
    shifts_advantages = False

    def __init__(self, feature):
        self.feature = feature  # `feature.EntropyReg`: the trainer (`feature.trainer`), metrics, the window
        self.args = feature.trainer.args

    @classmethod
    def check(cls, args) -> None:
        """Config-time rules of this mode's fields, on or off (`cls.name in args.entropy_reg` says which).

        Raises:
            ValueError: naming the fields and their values.
        """

    def shift_advantages(self, batch: dict, entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The advantages (B,) or (B, T) TRL's loss is to read for `batch`, given the token `entropies` (B, T)."""
        return batch["advantages"]

    def pick(self, cov: torch.Tensor, mask: torch.Tensor, logps: list, batches: list, before: int) -> torch.Tensor:
        """(R, T) bool: the tokens chosen among `mask` (R, T) (scored completions' tokens of the R completions of
        `batches`), by their covariance `cov` (R, T); `before` tokens of the same optimizer step came earlier."""
        raise NotImplementedError

    def adjust_logps(self, logps: torch.Tensor, chosen: torch.Tensor | None) -> torch.Tensor:
        """The log-probabilities (B, T) TRL's loss goes on with."""
        return logps

    def loss_term(self, terms: LossTerms) -> torch.Tensor | None:
        """A scalar added to TRL's loss, a token mean over the micro-batch (None: nothing)."""
        return None

    def regroup(self, parents: dict[str, dict[str, float]]) -> None:
        """Policy groups changed: `parents` maps each new group to {old group: prompts it took from it}."""


@ENTROPY_REG_MODES.register("target")
class TargetEntropy(EntropyMode):
    """A PI controller holds the mean token entropy at its target by setting the entropy-bonus coefficient each
    optimizer step (`controller.EntropyPI`): `entropy_target_ratio` times the model's own mean token entropy over the
    run's first `entropy_target_window` optimizer steps (per policy group with `entropy_target_per_group`), or
    `entropy_target` nats; the bonus −c·H (`bonus.entropy_bonus`) enters the loss as TRL's
    `entropy_coef` term does. With `entropy_target_per_group`, one controller per policy group, each following its
    group through regroups."""

    summary = (
        "a PI controller holds the mean token entropy at its target (entropy_target_ratio x the model's own entropy "
        "over the first entropy_target_window steps, or entropy_target nats) by setting the entropy-bonus "
        "coefficient each optimizer step, within [entropy_coef_min, entropy_coef_max]"
    )

    def __init__(self, feature):
        super().__init__(feature)
        args, groups = self.args, feature.trainer.policy_groups
        if args.entropy_target_per_group and groups is None:
            raise ValueError("entropy_target_per_group=True needs policy groups (policy_group_column, ...)")
        keys = list(groups.names) if args.entropy_target_per_group else ["all"]
        bounds = (args.entropy_coef_min, args.entropy_coef_max)
        relative = args.entropy_target_ratio is not None
        self.controller = EntropyPI(
            None if relative else args.entropy_target,
            kp=args.entropy_pi_kp,
            ki=args.entropy_pi_ki,
            bounds=bounds,
            keys=keys,
            horizon=args.entropy_pi_horizon,
            ratio=args.entropy_target_ratio,
            window=args.entropy_target_window,
            band=args.entropy_pi_noise_band,
        )
        self._window = None  # (keys, (K, 2) [entropy sum, token count] per key) over the accumulation window

    @classmethod
    def check(cls, args) -> None:
        on = cls.name in args.entropy_reg
        if args.entropy_target_per_group and not on:
            raise ValueError(f"entropy_target_per_group=True needs 'target' in entropy_reg (got {args.entropy_reg})")
        relative = args.entropy_target_ratio is not None
        if relative and not on:
            raise ValueError(
                f"entropy_target_ratio={args.entropy_target_ratio} needs 'target' in entropy_reg "
                f"(got {args.entropy_reg})"
            )
        if not on:
            return
        if relative and args.entropy_target != TRL_ENTROPY_TARGET:
            raise ValueError(
                f"entropy_target={args.entropy_target} (nats) and entropy_target_ratio={args.entropy_target_ratio} "
                "(of the model's own entropy) are two targets: set one of them"
            )
        max_steps = getattr(args, "max_steps", -1)
        if relative and 0 < max_steps <= args.entropy_target_window:
            raise ValueError(
                f"entropy_target_window={args.entropy_target_window} steps measure the reference entropy, which "
                f"leaves none of max_steps={max_steps} to hold it: shorten the window"
            )
        if not relative and not math.isfinite(args.entropy_target):
            raise ValueError(f"entropy_target must be a finite number, got {args.entropy_target}")
        if not relative and args.entropy_target <= 0:
            raise ValueError(f"entropy_reg 'target' needs entropy_target > 0 nats, got {args.entropy_target}")
        if args.entropy_pi_kp + args.entropy_pi_ki == 0:
            raise ValueError(
                f"entropy_pi_kp ({args.entropy_pi_kp}) and entropy_pi_ki ({args.entropy_pi_ki}) cannot both be 0"
            )
        if not 0.0 <= args.entropy_coef_min < args.entropy_coef_max:
            raise ValueError(
                f"need 0 <= entropy_coef_min ({args.entropy_coef_min}) < entropy_coef_max ({args.entropy_coef_max})"
            )

    def loss_term(self, terms: LossTerms) -> torch.Tensor:
        """The bonus −c·H of this micro-batch, with the coefficient set from this optimizer step's own entropy
        where the step's batches were all known before its loss (TRL's default layout): measured here when the
        step is this one micro-batch, else at the window's start (`measure`). A step planned in parts (a window
        that runs into the next generation batch) is measured here too, and its coefficient acts from the next
        step."""
        keys, ids = self._keys(terms.batch, len(terms.entropies))
        controller = self.controller
        plan = self.feature.plan
        measure = plan["measure"] if terms.training and plan is not None else None
        if terms.training and measure == "loss":
            self.observe(keys, ids, terms.entropies.detach(), terms.mask)
        coefs = [controller.mean_coefficient() if key == "mean" else controller.coefficient(key) for key in keys]
        coef = torch.tensor(coefs, dtype=terms.entropies.dtype, device=terms.entropies.device)[ids]  # (B,)
        term = -bonus.entropy_bonus(terms.entropies, terms.mask, coef)
        if terms.training and measure is None:
            self.observe(keys, ids, terms.entropies.detach(), terms.mask)
        return term

    def measure(self, batches: list[dict], entropies: list[torch.Tensor]) -> None:
        """Update the controllers from a whole optimizer step's token `entropies` (B_j, T) of its `batches`,
        computed without gradient at the step's start, before its loss."""
        for i, (batch, entropy) in enumerate(zip(batches, entropies, strict=True)):
            keys, ids = self._keys(batch, len(entropy))
            self.observe(keys, ids, entropy, loss_mask(batch), last=i == len(batches) - 1)

    def _keys(self, batch, size: int) -> tuple[list[str], torch.Tensor]:
        """The controller keys K and each of the `size` completions' index among them, (B,): the policy groups'
        names, or `all`. An evaluation batch carries no policy groups: with per-group targets its completions get the
        mean coefficient (`mean`)."""
        device = batch["completion_mask"].device
        if self.args.entropy_target_per_group and "policy_group_ids" in batch:
            return list(self.feature.trainer.policy_groups.names), batch["policy_group_ids"]
        key = "mean" if self.args.entropy_target_per_group else "all"
        return [key], torch.zeros(size, dtype=torch.long, device=device)

    def observe(self, keys: list[str], ids: torch.Tensor, entropies: torch.Tensor, mask, last: bool | None = None):
        """Add this micro-batch's entropy sums per key to the window; at its end (`last`; default: TRL's
        `sync_gradients`, the window's last micro-batch), reduce over processes (every process then holds the same
        measurement) and update the controllers. `keys` are the same on every process (policy groups change on all
        at once); a window whose keys changed midway (a regroup) starts anew."""
        trainer = self.feature.trainer
        tokens = mask.to(entropies.dtype)
        per_completion = torch.stack([(entropies * tokens).sum(1), tokens.sum(1)], dim=1).double()  # (B, 2)
        sums = torch.zeros(len(keys), 2, dtype=torch.float64, device=entropies.device).index_add_(
            0, ids, per_completion
        )
        window = self._window
        self._window = (keys, sums if window is None or window[0] != keys else window[1] + sums)
        if not (trainer.accelerator.sync_gradients if last is None else last):
            return
        totals = trainer.accelerator.reduce(self._window[1], reduction="sum").tolist()  # (K, 2)
        self._window = None
        measured = {key: s / n for key, (s, n) in zip(keys, totals, strict=True) if n > 0}
        controller = self.controller
        controller.update(measured)
        if self.args.entropy_target_per_group:
            for key in keys:
                self.feature.log(f"entropy_reg/{key}/coef", controller.coefficient(key), mode="train")
                if key in measured:
                    self.feature.log(f"entropy_reg/{key}/entropy", measured[key], mode="train")
                if controller.ratio is not None and controller.target_of(key) is not None:
                    self.feature.log(f"entropy_reg/{key}/target", controller.target_of(key), mode="train")
        coefs = [controller.coefficient(key) for key in keys if key in measured] or [0.0]
        self.feature.log("entropy_reg/coef", sum(coefs) / len(coefs), mode="train")
        target = controller.mean_target()
        if target is not None:  # with a relative target, once its reference is measured
            self.feature.log("entropy_reg/target", target, mode="train")

    def regroup(self, parents: dict[str, dict[str, float]]) -> None:
        """Policy groups changed: each new group's controller takes the state of the groups its prompts came from,
        weighted by prompts (`EntropyPI.regroup`); nothing changes without per-group targets."""
        if self.args.entropy_target_per_group:
            self.controller.regroup(parents)


@ENTROPY_REG_MODES.register("clip_cov")
class ClipCov(EntropyMode):
    """Clip-Cov (Cui et al. 2025, arXiv:2505.22617): the gradient of `clip_cov_ratio` of the tokens, drawn among
    those whose covariance lies in (`clip_cov_lb`, `clip_cov_ub`) and that PPO's clip leaves alone, is detached."""

    summary = (
        "detach the gradient of clip_cov_ratio of the tokens, drawn among those with a covariance of log-probability "
        "and advantage in (clip_cov_lb, clip_cov_ub) (Cui et al. 2025, arXiv:2505.22617)"
    )
    picks_tokens = True

    @classmethod
    def check(cls, args) -> None:
        if cls.name in args.entropy_reg and (
            args.loss_type in ("cispo", "sapo", "vespo") or args.importance_sampling_level != "token"
        ):
            raise ValueError(
                f"entropy_reg 'clip_cov' leaves alone the tokens PPO's token-level clip acts on: it needs a clipped "
                f"loss_type (got {args.loss_type!r}) with importance_sampling_level='token' (got "
                f"{args.importance_sampling_level!r})"
            )
        if args.clip_cov_lb >= args.clip_cov_ub:
            raise ValueError(f"need clip_cov_lb ({args.clip_cov_lb}) < clip_cov_ub ({args.clip_cov_ub})")

    def pick(self, cov, mask, logps, batches, before) -> torch.Tensor:
        count = covariance.window_token_count(self.args.clip_cov_ratio, before, int(mask.sum()))
        clipped = torch.cat([self._ppo_clipped(lp, batch) for lp, batch in zip(logps, batches, strict=True)])
        bounds = (self.args.clip_cov_lb, self.args.clip_cov_ub)
        return covariance.clip_cov_draw(cov, mask.bool() & ~clipped, count, bounds, self._generator())

    def adjust_logps(self, logps, chosen):
        return torch.where(chosen, logps.detach(), logps)

    def _ppo_clipped(self, logps, batch) -> torch.Tensor:
        """(B, T) tokens where the clipped PPO surrogate is the active one; Clip-Cov leaves them alone (the reference
        implementation's `clip_by_origin`)."""
        trainer = self.feature.trainer
        old = batch.get("old_per_token_logps")
        ratio = torch.exp(logps.detach() - (logps.detach() if old is None else old))
        advantages = batch["advantages"] if batch["advantages"].dim() == 2 else batch["advantages"][:, None]
        clipped = torch.clamp(ratio, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
        return -advantages * clipped > -advantages * ratio

    def _generator(self) -> torch.Generator:
        """Clip-Cov's random draw: seeded by the run's seed, the process, the optimizer step (checkpointed) and the
        part of its window, named by the tokens of the step before it (a part starts where a generation batch does,
        whatever the micro-batch size), so a resumed run draws the same tokens, the draw does not depend on how the
        step is split into micro-batches, and no other random stream moves."""
        trainer = self.feature.trainer
        plan = self.feature.plan if trainer.model.training else None
        part = 0 if plan is None else plan["before"]
        seed = self.args.seed * 1_000_003 + trainer.accelerator.process_index * 10_007
        seed = (seed + trainer.state.global_step * 1_000_000_007 + part * 7_919) % 2**63
        return torch.Generator().manual_seed(seed)


@ENTROPY_REG_MODES.register("kl_cov")
class KLCov(EntropyMode):
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617): the top `kl_cov_ratio` of the tokens by covariance get the
    penalty `kl_cov_coef`·|log π − log π_old| (`covariance.kl_cov_penalty`)."""

    summary = (
        "penalize kl_cov_coef*|log pi - log pi_old| on the top kl_cov_ratio of the tokens by covariance of "
        "log-probability and advantage (Cui et al. 2025, arXiv:2505.22617)"
    )
    picks_tokens = True

    def __init__(self, feature):
        super().__init__(feature)
        args = self.args
        if args.num_iterations == 1 and args.steps_per_generation <= args.gradient_accumulation_steps:
            logger.warning(
                "entropy_reg 'kl_cov' penalizes |log pi - log pi_old|, which has no gradient while the policy has "
                "not moved since generation: with num_iterations=1 and steps_per_generation <= "
                "gradient_accumulation_steps it has no effect"
            )

    def pick(self, cov, mask, logps, batches, before) -> torch.Tensor:
        count = covariance.window_token_count(self.args.kl_cov_ratio, before, int(mask.bool().sum()))
        return covariance.kl_cov_top(cov, mask, count)

    def loss_term(self, terms: LossTerms) -> torch.Tensor:
        old = terms.batch.get("old_per_token_logps")
        old = terms.logps.detach() if old is None else old
        return covariance.kl_cov_penalty(terms.logps, old, terms.chosen, terms.mask, self.args.kl_cov_coef)


@ENTROPY_REG_MODES.register("advantage")
class EntropyAdvantage(EntropyMode):
    """A_i ← A_i + min(τ·H_i, |A_i|/κ), H_i the completion's mean token entropy, detached (`bonus.entropy_advantages`,
    after Cheng et al. 2025, arXiv:2506.14758, eq. 5); τ is `entropy_advantage_coef`, κ `entropy_advantage_kappa`. A
    completion whose advantage is 0 (its generation group all got the same reward, or no reward function scored it)
    keeps 0; one masked as truncated keeps TRL's advantage."""

    summary = (
        "A_i <- A_i + min(entropy_advantage_coef*H_i, |A_i|/entropy_advantage_kappa), H_i the completion's mean "
        "token entropy, detached (Cheng et al. 2025, arXiv:2506.14758, eq. 5)"
    )
    uses_window = False
    shifts_advantages = True

    def shift_advantages(self, batch, entropies, mask) -> torch.Tensor:
        scored = self.feature.scored(batch)
        return bonus.entropy_advantages(
            batch["advantages"],
            entropies,
            mask,
            tau=self.args.entropy_advantage_coef,
            scored=scored,
            kappa=self.args.entropy_advantage_kappa,
        )


def check_config(args) -> None:
    """The config-time rules of `entropy_reg` (called by `GRPOConfig.__post_init__`, after each field's own check).

    Raises:
        ValueError: modes set while TRL's own entropy bonus is on, two modes that pick tokens, or what a mode's
            `check` refuses; each names the fields and their values.
    """
    modes = args.entropy_reg
    if modes and (args.use_adaptive_entropy or args.entropy_coef != 0.0):
        raise ValueError(
            f"entropy_reg={modes} sets the entropy bonus itself: it needs TRL's use_adaptive_entropy=False (got "
            f"{args.use_adaptive_entropy}) and entropy_coef=0.0 (got {args.entropy_coef})"
        )
    pickers = [name for name, mode in ENTROPY_REG_MODES.items() if name in modes and mode.picks_tokens]
    if len(pickers) > 1:
        raise ValueError(f"entropy_reg={modes}: choose one of {' and '.join(pickers)}")
    for mode in ENTROPY_REG_MODES.values():
        mode.check(args)
