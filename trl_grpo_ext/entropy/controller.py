"""`EntropyPI`: the PI controllers of the `target` mode, one per key (all completions, or each policy group)."""

import math


class EntropyPI:
    """PI controllers holding mean token entropy at a target by setting the entropy-bonus coefficient, one per key,
    with a proportional term that anticipates a fall.

    For each key every optimizer step, with H the measured entropy (nats) and e = target − H (positive when entropy is
    too low):
        v ← β·v + (1 − β)·(H − H_prev − s)²  the squared surprise of each change against the trend (before s moves)
        s ← β·s + (1 − β)·(H − H_prev)      the entropy's trend, nats per step (exponentially filtered difference)
        σ_s = √((1 − β)/(1 + β)·v)           the standard error of s, were the changes independent with variance v
                                             (the EWMA statistic's variance λ/(2 − λ)·σ², λ = 1 − β: Roberts 1959,
                                             Technometrics 1(3), EWMA control charts)
        Ĥ = H + τ·min(s + z·σ_s, 0)          where the entropy is heading over `horizon` τ steps, if it is falling by
                                             more than `band` z standard errors of its own noise
        I ← clip(I + e, c_min/k_i, c_max/k_i)  only while the output is not saturated in the direction of e
                                             (anti-windup by clamping); k_i·I stays within the coefficient's range,
                                             so a spell above the target leaves no negative integral to unwind
        c = clip(k_p·(target − Ĥ) + k_i·I, c_min, c_max)
    The PI law and clamping anti-windup are the textbook ones (Åström & Murray, *Feedback Systems*, 2nd ed., ch. 11,
    PID control and integrator windup); acting on the predicted error Ĥ adds a filtered derivative term, k_p·τ·s
    with s the filtered per-step change (ch. 11, "filtering the derivative"), applied to falls only: a bonus starts
    before the entropy crosses the target when it falls fast, while a rising entropy above the target gets none and a
    slow drift little. The band z keeps step-to-step noise from setting the look-ahead off: only the part of a fall
    beyond z standard errors of the entropy's own changes is projected, and a steady fall (each change close to the
    trend) keeps σ_s near 0 and the full look-ahead (z chosen on benchmarks/entropy/entropy_target_smollm2.py, see
    benchmarks/entropy/README.md). `horizon=0` is the plain PI controller, `band=0` the look-ahead without the band.
    The bonus −c·H enters the loss (TRL's objective L = L_policy − c·H), so a larger c raises entropy. A key with no
    measurement in a step keeps its state. When policy groups change, `regroup` gives each new group the state of the
    groups its prompts came from.

    The target is absolute (`target` nats, every key), or relative (`target=None`, `ratio` r in (0, 1]): for each key
    r × its reference, the mean of its measured entropies over the run's first `window` optimizer steps (the model's
    own entropy before training has moved it much: 0.14-0.63 nats for 7B-0.5B Qwen2.5 Instruct models on GSM8K at
    temperature 1, 6.7 for a random 1,024-token model). Until the window ends there is no target: the coefficient
    stays at c_min and nothing is integrated. A key not measured in the window takes r × the mean reference of all
    keys (step-weighted); a key that a regroup creates takes its parents' targets, weighted. With a relative target
    the errors e and target − Ĥ are in units of the key's target (divided by it), so k_p and k_i are per unit of
    relative error: the same fall of 10% below the target gets the same coefficient at 0.1 nats as at 1 nat (in nats
    the gains would act 10x more weakly on the model that starts 10x lower; at a 1-nat target the two coincide).
    """

    SMOOTHING = 0.5  # β of the trend filter

    def __init__(
        self,
        target: float | None,
        *,
        kp: float,
        ki: float,
        bounds: tuple[float, float],
        keys: list[str],
        horizon: float = 0.0,
        ratio: float | None = None,
        window: int = 1,
        band: float = 0.0,
    ):
        if (target is None) == (ratio is None):
            raise ValueError(f"EntropyPI takes an absolute target or a ratio, one of them: {target=}, {ratio=}")
        self.target, self.kp, self.ki, self.bounds, self.horizon = target, kp, ki, bounds, horizon
        self.ratio, self.window, self.band = ratio, window, band
        self.steps = 0  # optimizer steps measured
        self.reference = {}  # key -> [sum of measured entropies, steps] over the first `window` steps (relative)
        self.targets = {} if ratio is not None else None  # key -> target, once the window is over (relative)
        self.mean_reference = math.nan  # over all keys' measurements in the window, step-weighted (relative)
        self.coef = {key: bounds[0] for key in keys}
        self.integral = {key: 0.0 for key in keys}
        self.last = {key: None for key in keys}  # the last measured entropy
        self.trend = {key: 0.0 for key in keys}
        self.noise = {key: 0.0 for key in keys}  # filtered squared deviation of the change from the trend

    def coefficient(self, key: str) -> float:
        """The coefficient of `key`; a key never seen starts at `c_min` with no integral and no trend."""
        if key not in self.coef:
            self.coef[key], self.integral[key], self.last[key], self.trend[key] = self.bounds[0], 0.0, None, 0.0
            self.noise[key] = 0.0
        return self.coef[key]

    def target_of(self, key: str) -> float | None:
        """The entropy `key` is held at (nats); None while the relative target's reference is still measured."""
        if self.ratio is None:
            return self.target
        if self.steps < self.window:
            return None
        # a key not measured in the window: the mean reference of all keys
        return self.targets.get(key, self.ratio * self.mean_reference)

    def mean_target(self) -> float | None:
        """The mean target over the keys (nats), None while the reference is measured."""
        targets = [self.target_of(key) for key in self.coef]
        targets = [t for t in targets if t is not None and not math.isnan(t)]
        return sum(targets) / len(targets) if targets else None

    def mean_coefficient(self) -> float:
        """The mean coefficient over the keys (used for completions of no policy group, e.g. evaluation)."""
        return sum(self.coef.values()) / len(self.coef) if self.coef else self.bounds[0]

    def update(self, measured: dict[str, float]) -> None:
        """Fold in one optimizer step's mean token entropy per key (nats); NaN or missing keys are skipped. With a
        relative target, the first `window` steps measure each key's reference instead (the trend is followed)."""
        low, high = self.bounds
        self.steps += 1
        measuring = self.ratio is not None and self.steps <= self.window
        for key, entropy in measured.items():
            if math.isnan(entropy):
                continue
            self.coefficient(key)
            if self.last[key] is not None:
                change, beta = entropy - self.last[key], self.SMOOTHING
                self.noise[key] = beta * self.noise[key] + (1 - beta) * (change - self.trend[key]) ** 2
                self.trend[key] = beta * self.trend[key] + (1 - beta) * change
            self.last[key] = entropy
            if measuring:
                total, count = self.reference.get(key, (0.0, 0))
                self.reference[key] = [total + entropy, count + 1]
                continue
            target = self.target_of(key)
            if target is None or math.isnan(target) or target <= 0:  # no reference measured, or an entropy of 0
                continue
            # relative target: the error in units of the target, so the gains act alike at every model's entropy
            unit = target if self.ratio is not None else 1.0
            error = (target - entropy) / unit
            spread = self.band * math.sqrt((1 - self.SMOOTHING) / (1 + self.SMOOTHING) * self.noise[key])
            anticipated = (target - (entropy + self.horizon * min(self.trend[key] + spread, 0.0))) / unit
            integral = self.integral[key] + error
            if self.ki > 0:  # the integral term stays within the coefficient's range: k_i·I in [c_min, c_max]
                integral = min(max(integral, low / self.ki), high / self.ki)
            output = self.kp * anticipated + self.ki * integral
            if (output > high and error > 0) or (output < low and error < 0):
                integral = self.integral[key]  # saturated and the error pushes further out: do not integrate
                output = self.kp * anticipated + self.ki * integral
            self.integral[key] = integral
            self.coef[key] = min(max(output, low), high)
        if self.ratio is not None and self.steps == self.window:  # the references are measured: fix the targets
            self.targets = {key: self.ratio * total / count for key, (total, count) in self.reference.items()}
            count = sum(n for _, n in self.reference.values())
            self.mean_reference = sum(t for t, _ in self.reference.values()) / count if count else math.nan

    def regroup(self, parents: dict[str, dict[str, float]]) -> None:
        """Replace the keys by those of `parents` (new key -> {old key: weight, e.g. prompts it took}): each new key
        gets the weighted mean coefficient, integral, trend, noise and last entropy of its old keys; old keys not
        listed are dropped."""
        state = {"coef": {}, "integral": {}, "trend": {}, "noise": {}, "last": {}}
        targets, reference = {}, {}
        for key, weights in parents.items():
            known = {old: w for old, w in weights.items() if old in self.coef and w > 0}
            total = sum(known.values())
            measured = {o: w for o, w in weights.items() if self.targets and o in self.targets and w > 0}
            if measured:
                targets[key] = sum(self.targets[o] * w for o, w in measured.items()) / sum(measured.values())
            seen = {o: w for o, w in weights.items() if o in self.reference and w > 0}
            if seen:  # the reference of a group measured in the window: its parents' mean entropy, weighted
                share = sum(seen.values())
                reference[key] = [sum(self.reference[o][0] / self.reference[o][1] * w for o, w in seen.items())
                                  / share, 1]  # fmt: skip
            state["coef"][key] = sum(self.coef[o] * w for o, w in known.items()) / total if total else self.bounds[0]
            for name in ("integral", "trend", "noise"):
                values = getattr(self, name)
                state[name][key] = sum(values[o] * w for o, w in known.items()) / total if total else 0.0
            lasts = {o: w for o, w in known.items() if self.last[o] is not None}
            weight = sum(lasts.values())
            state["last"][key] = sum(self.last[o] * w for o, w in lasts.items()) / weight if weight else None
        self.coef, self.integral, self.trend, self.noise, self.last = (
            state[n] for n in ("coef", "integral", "trend", "noise", "last")
        )
        if self.ratio is not None:
            self.reference = reference
            self.targets = targets if self.steps >= self.window else {}

    def state_dict(self) -> dict:
        """Plain floats (or None) by key, for checkpoints."""
        return {"coef": dict(self.coef), "integral": dict(self.integral), "trend": dict(self.trend),
                "noise": dict(self.noise), "last": dict(self.last), "steps": self.steps,
                "reference": {k: list(v) for k, v in self.reference.items()},
                "targets": None if self.targets is None else dict(self.targets),
                "mean_reference": self.mean_reference}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.integral = dict(state["coef"]), dict(state["integral"])
        self.trend, self.last = dict(state["trend"]), dict(state["last"])
        noise = state.get("noise", {})  # absent before the noise band: no noise measured yet
        self.noise = {key: noise.get(key, 0.0) for key in self.coef}
        # absent from checkpoints written before the relative target: an absolute one, nothing to restore
        self.steps = state.get("steps", 0)
        self.reference = {k: list(v) for k, v in state.get("reference", {}).items()}
        targets = state.get("targets")
        self.mean_reference = state.get("mean_reference", math.nan)
        if self.ratio is not None:
            self.targets = dict(targets) if targets is not None else {}
