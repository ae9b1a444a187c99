"""Entropy regularization: small pure functions on tensors, and the PI controller of the `target` mode.

Shapes: B completions on this process, T completion tokens. Entropy is that of the full next-token distribution, in
nats per token (TRL's `entropy_from_logits`), never the negative log-probability of the sampled token.
"""

import math

import torch


def completion_entropy(entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean token entropy of each completion, (B, T) x (B, T) -> (B,) nats; 0 for a completion with no tokens."""
    mask = mask.to(entropies.dtype)
    return (entropies * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def entropy_bonus(entropies: torch.Tensor, mask: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Σ_bt c_b·H_bt·m_bt / Σ_bt m_bt: the mean token entropy weighted by each completion's coefficient `coef` (B,).

    With one coefficient for all completions this is TRL's entropy bonus (`entropy_coef` times the mean token
    entropy), the term subtracted from the loss; with one coefficient per policy group each group is pushed alone.
    Returns a scalar that keeps the gradient of `entropies` (B, T).
    """
    mask = mask.to(entropies.dtype)
    return (coef[:, None].to(entropies.dtype) * entropies * mask).sum() / mask.sum().clamp(min=1.0)


def entropy_advantages(advantages: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor, tau: float,
                       scored: torch.Tensor | None = None):  # fmt: skip
    """A_i + τ·H_i with H_i the completion's mean token entropy, detached: the entropy-regularized relative reward.

    A related shaping, with a clip at |A|/κ, is the entropy-based advantage of Cheng et al. 2025, arXiv:2506.14758.
    `advantages` is (B,) or (B, T); returns the same shape. `scored` (B,) bool: completions some reward function
    scored; the others keep their advantage as it is (TRL sets it to exactly 0 so that they do not move the policy).
    A completion without tokens in `mask` (masked as truncated) gets no shift either.
    """
    bonus = tau * completion_entropy(entropies.detach(), mask)  # (B,)
    if scored is not None:
        bonus = torch.where(scored, bonus, torch.zeros_like(bonus))
    return advantages + (bonus if advantages.dim() == 1 else bonus[:, None]).to(advantages.dtype)


def token_covariance(logps: torch.Tensor, advantages: torch.Tensor, means: tuple[float, float]) -> torch.Tensor:
    """Per-token covariance term (log π_t − mean log π)·(A_t − mean A), (B, T) from `logps` (B, T) and `advantages`
    (B,) or (B, T), detached; `means` = (mean log-probability, mean advantage) over all valid tokens of all processes.

    Cui et al. 2025, arXiv:2505.22617 (entropy dynamics): the entropy change of a policy-gradient step follows the
    covariance of log-probability and advantage, and these are its per-token terms, centred as in the reference
    implementation (PRIME-RL/Entropy-Mechanism-of-RL, verl's `compute_policy_loss_clip_cov`).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    return (logps.detach() - means[0]) * (advantages.detach() - means[1])


def clip_cov_mask(
    cov: torch.Tensor,
    candidates: torch.Tensor,
    num_valid: int,
    ratio: float,
    bounds: tuple[float, float],
    generator: torch.Generator,
) -> torch.Tensor:
    """Clip-Cov's tokens (arXiv:2505.22617, Clip-Cov): `ratio` of the `num_valid` completion tokens (at least one),
    drawn at random among the `candidates` (B, T) bool whose covariance `cov` (B, T) lies strictly inside `bounds` =
    (ω_low, ω_high). Returns a (B, T) bool mask of the tokens whose gradient is detached; the draw uses `generator`
    (CPU). The count is taken over all valid tokens, as in the reference implementation.
    """
    return clip_cov_draw(cov, candidates, max(int(ratio * num_valid), 1), bounds, generator)


def clip_cov_draw(
    cov: torch.Tensor, candidates: torch.Tensor, count: int, bounds: tuple[float, float], generator: torch.Generator
) -> torch.Tensor:
    """Clip-Cov's draw (arXiv:2505.22617, Clip-Cov): `count` tokens (fewer if fewer qualify) drawn at random among the
    `candidates` (B, T) bool whose covariance `cov` (B, T) lies strictly inside `bounds` = (ω_low, ω_high). Returns a
    (B, T) bool mask; the draw uses `generator` (CPU) and depends only on the flattened order of the tokens."""
    inside = candidates & (cov > bounds[0]) & (cov < bounds[1])
    chosen = torch.zeros_like(inside)
    index = inside.flatten().nonzero().flatten().cpu()
    if len(index) and count > 0:
        pick = index[torch.randperm(len(index), generator=generator)[:count]]
        chosen.view(-1)[pick.to(chosen.device)] = True
    return chosen


def kl_cov_mask(cov: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """KL-Cov's tokens (arXiv:2505.22617, KL-Cov): the top `ratio` of valid tokens (at least one) by
    covariance `cov` (B, T) among `mask` (B, T). Returns a (B, T) bool mask of the tokens that get the penalty."""
    return kl_cov_top(cov, mask, max(int(ratio * int(mask.bool().sum())), 1))


def kl_cov_top(cov: torch.Tensor, mask: torch.Tensor, count: int) -> torch.Tensor:
    """KL-Cov's tokens (arXiv:2505.22617, KL-Cov): the `count` valid tokens (at most all of them) with the largest
    covariance `cov` (B, T) among `mask` (B, T). Returns a (B, T) bool mask."""
    valid = mask.bool()
    count = min(count, int(valid.sum()))
    chosen = torch.zeros_like(valid)
    if count > 0:
        scores = torch.where(valid, cov, torch.full_like(cov, -math.inf)).flatten()
        chosen.view(-1)[scores.topk(count).indices] = True
    return chosen


def window_token_count(ratio: float, before: int, tokens: int) -> int:
    """How many of `tokens` completion tokens Clip-Cov or KL-Cov pick when `before` tokens of the same optimizer step
    came earlier, so that the picks over the step add up to max(int(ratio·n), 1) of its n tokens, however the step is
    split into micro-batches: with the cumulative count t(c) = max(int(ratio·c), 1) for c > 0 and t(0) = 0, this is
    t(before + tokens) − t(before) (a telescoping sum; exact rounding over the window).

    arXiv:2505.22617 (Clip-Cov, KL-Cov) picks `ratio` of the tokens of the batch its loss is computed on; here that
    batch is the optimizer step's. E.g. ratio 0.0002 and 4,096 tokens a step: t(4096) = 1 token, also when the step
    is two micro-batches of 2,048 (t(2048) = 1, then t(4096) − t(2048) = 0), where max(int(ratio·n), 1) per
    micro-batch would pick 2.
    """

    def total(c: int) -> int:
        return max(int(ratio * c), 1) if c > 0 else 0

    return total(before + tokens) - total(before)


def kl_cov_penalty(logps: torch.Tensor, old_logps: torch.Tensor, chosen: torch.Tensor, mask: torch.Tensor, coef):
    """β·Σ_chosen |log π − log π_old| / Σ mask: KL-Cov's penalty as a token mean over the valid tokens
    (arXiv:2505.22617, KL-Cov, with the reference implementation's token-mean aggregation). Scalar with the gradient
    of `logps` (B, T).

    The gradient is zero while the policy has not moved since generation (log π = log π_old), so the penalty acts
    from the second pass over a generation batch on (`num_iterations > 1`, or `steps_per_generation` >
    `gradient_accumulation_steps`), as in the paper's PPO mini-batches.
    """
    penalty = (logps - old_logps).abs() * chosen.to(logps.dtype)
    return coef * penalty.sum() / mask.sum().clamp(min=1.0)


class EntropyPI:
    """PI controllers holding mean token entropy at a target by setting the entropy-bonus coefficient, one per key,
    with a proportional term that anticipates a fall.

    For each key every optimizer step, with H the measured entropy (nats) and e = target − H (positive when entropy is
    too low):
        s ← β·s + (1 − β)·(H − H_prev)      the entropy's trend, nats per step (exponentially filtered difference)
        Ĥ = H + τ·min(s, 0)                  where the entropy is heading over `horizon` τ steps, if it is falling
        I ← clip(I + e, c_min/k_i, c_max/k_i)  only while the output is not saturated in the direction of e
                                             (anti-windup by clamping); k_i·I stays within the coefficient's range,
                                             so a spell above the target leaves no negative integral to unwind
        c = clip(k_p·(target − Ĥ) + k_i·I, c_min, c_max)
    The PI law and clamping anti-windup are the textbook ones (Åström & Murray, *Feedback Systems*, 2nd ed., ch. 11,
    PID control and integrator windup); acting on the predicted error Ĥ adds a filtered derivative term, k_p·τ·s
    with s the filtered per-step change (ch. 11, "filtering the derivative"), applied to falls only: a bonus starts
    before the entropy crosses the target when it falls fast, while a rising entropy above the target gets none and a
    slow drift little (step-to-step measurement noise in s can still give a small bonus above the target).
    `horizon=0` is the plain PI controller. The bonus −c·H enters the loss (TRL's objective L = L_policy − c·H), so
    a larger c raises entropy. A key with no measurement in a step keeps its state. When policy groups change,
    `regroup` gives each new group the state of the groups its prompts came from.
    """

    SMOOTHING = 0.5  # β of the trend filter

    def __init__(
        self, target: float, kp: float, ki: float, bounds: tuple[float, float], keys: list[str], horizon: float = 0.0
    ):
        self.target, self.kp, self.ki, self.bounds, self.horizon = target, kp, ki, bounds, horizon
        self.coef = {key: bounds[0] for key in keys}
        self.integral = {key: 0.0 for key in keys}
        self.last = {key: None for key in keys}  # the last measured entropy
        self.trend = {key: 0.0 for key in keys}

    def coefficient(self, key: str) -> float:
        """The coefficient of `key`; a key never seen starts at `c_min` with no integral and no trend."""
        if key not in self.coef:
            self.coef[key], self.integral[key], self.last[key], self.trend[key] = self.bounds[0], 0.0, None, 0.0
        return self.coef[key]

    def mean_coefficient(self) -> float:
        """The mean coefficient over the keys (used for completions of no policy group, e.g. evaluation)."""
        return sum(self.coef.values()) / len(self.coef) if self.coef else self.bounds[0]

    def update(self, measured: dict[str, float]) -> None:
        """Fold in one optimizer step's mean token entropy per key (nats); NaN or missing keys are skipped."""
        low, high = self.bounds
        for key, entropy in measured.items():
            if math.isnan(entropy):
                continue
            self.coefficient(key)
            if self.last[key] is not None:
                self.trend[key] = self.SMOOTHING * self.trend[key] + (1 - self.SMOOTHING) * (entropy - self.last[key])
            self.last[key] = entropy
            error = self.target - entropy
            anticipated = self.target - (entropy + self.horizon * min(self.trend[key], 0.0))
            integral = self.integral[key] + error
            if self.ki > 0:  # the integral term stays within the coefficient's range: k_i·I in [c_min, c_max]
                integral = min(max(integral, low / self.ki), high / self.ki)
            output = self.kp * anticipated + self.ki * integral
            if (output > high and error > 0) or (output < low and error < 0):
                integral = self.integral[key]  # saturated and the error pushes further out: do not integrate
                output = self.kp * anticipated + self.ki * integral
            self.integral[key] = integral
            self.coef[key] = min(max(output, low), high)

    def regroup(self, parents: dict[str, dict[str, float]]) -> None:
        """Replace the keys by those of `parents` (new key -> {old key: weight, e.g. prompts it took}): each new key
        gets the weighted mean coefficient, integral, trend and last entropy of its old keys; old keys not listed are
        dropped."""
        state = {"coef": {}, "integral": {}, "trend": {}, "last": {}}
        for key, weights in parents.items():
            known = {old: w for old, w in weights.items() if old in self.coef and w > 0}
            total = sum(known.values())
            state["coef"][key] = sum(self.coef[o] * w for o, w in known.items()) / total if total else self.bounds[0]
            for name in ("integral", "trend"):
                values = getattr(self, name)
                state[name][key] = sum(values[o] * w for o, w in known.items()) / total if total else 0.0
            lasts = {o: w for o, w in known.items() if self.last[o] is not None}
            weight = sum(lasts.values())
            state["last"][key] = sum(self.last[o] * w for o, w in lasts.items()) / weight if weight else None
        self.coef, self.integral, self.trend, self.last = (state[n] for n in ("coef", "integral", "trend", "last"))

    def state_dict(self) -> dict:
        """Plain floats (or None) by key, for checkpoints."""
        return {"coef": dict(self.coef), "integral": dict(self.integral), "trend": dict(self.trend),
                "last": dict(self.last)}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.integral = dict(state["coef"]), dict(state["integral"])
        self.trend, self.last = dict(state["trend"]), dict(state["last"])
