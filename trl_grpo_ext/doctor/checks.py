"""The run doctor's checks: each reads the logged rows of a GRPO run and returns its findings, or says why it was
skipped. `CHECKS` maps a check's name to its function; `diagnose` runs them all.

A check reports the first window of steps where its condition held (so the callback, which runs the checks at every
log, and `trl-grpo-ext doctor`, which runs them once on the whole log, report the same finding at the same step).
Windows are `thresholds.THRESHOLDS["window_steps"]` optimizer steps long, W logged rows at the run's logging
interval; every threshold and its source is in `thresholds.py`.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import series as S
from .thresholds import value


@dataclass(frozen=True)
class Finding:
    """Something wrong with the run, with its evidence and what to change.

    Attributes:
        check: the check's name in `CHECKS`.
        subject: what it is about: "run", or "policy group 'hard'".
        title: one line, what is wrong.
        evidence: the metric, the step range and its values.
        suggestion: the setting to change and to what.
        step: the step at which the condition first held (the end of its window).
    """

    check: str
    subject: str
    title: str
    evidence: str
    suggestion: str
    step: int

    @property
    def key(self) -> tuple[str, str]:
        """What a finding is about; the callback warns once per key."""
        return self.check, self.subject

    def text(self) -> str:
        head = f"[{self.check}] {self.title} (from step {self.step})"
        return f"{head}\n  evidence: {self.evidence}\n  try: {self.suggestion}"


@dataclass(frozen=True)
class Skip:
    """A check that could not run on this log, and why (the metric it needs, the rows it needs)."""

    check: str
    reason: str


@dataclass
class Diagnosis:
    """The findings and the skipped checks of one log of `rows` logged training rows up to `last_step`."""

    findings: list[Finding] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    rows: int = 0
    last_step: int = 0

    def report(self) -> str:
        """The short report `trl-grpo-ext doctor` prints: findings first, then what was skipped and why."""
        head = f"{self.rows} logged training step{'s' if self.rows != 1 else ''}, up to step {self.last_step}: "
        if not self.findings:
            head += "no finding; every check that could run found the run healthy"
        else:
            head += f"{len(self.findings)} finding(s)"
        lines = [head, *(finding.text() for finding in self.findings)]
        if self.skipped:
            lines.append("skipped:")
            lines += [f"  {skip.check}: {skip.reason}" for skip in self.skipped]
        return "\n".join(lines)


class Run:
    """The logged training rows of a run (`series.training_rows`, or the `series.Columns` the callback keeps), with
    the settings known for it (a dict of `GRPOConfig` field values; empty when only the log is known)."""

    def __init__(self, rows: "list[dict] | S.Columns", settings: dict | None = None):
        self.columns = rows if isinstance(rows, S.Columns) else S.Columns(rows)
        self.rows = self.columns.rows
        self.settings = settings or {}
        self._series: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        if key not in self._series:
            self._series[key] = self.columns.series(key)
        return self._series[key]

    def finite(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the rows where `key` is a finite number (NaN, None and inf left out)."""
        steps, values = self.series(key)
        keep = np.isfinite(values)
        return steps[keep], values[keep]

    def aligned(self, *keys: str) -> tuple[np.ndarray, list[np.ndarray]]:
        """(steps, [values of each key]) of the rows where every one of `keys` is a finite number."""
        steps, values = self.finite(keys[0])
        found = [values]
        for key in keys[1:]:
            other_steps, other = self.finite(key)
            steps, mine, theirs = np.intersect1d(steps, other_steps, return_indices=True)
            found = [*(v[mine] for v in found), other[theirs]]
        return steps, found

    def keys_like(self, prefix: str, suffix: str) -> list[str]:
        """The middle parts of the logged keys `<prefix><middle><suffix>`, sorted (`series.middles`)."""
        return S.middles(self.columns.keys(), prefix, suffix)

    def window(self, steps: np.ndarray, name: str = "window_steps") -> int:
        """W, the rows of the `name` span at this metric's logging interval."""
        return S.window_rows(steps, value(name))

    def now(self, name: str) -> str:
        """' (now <value>)' when the setting is known, else ''."""
        return f" (now {self.settings[name]})" if self.settings.get(name) is not None else ""


CheckFn = Callable[[Run], "list[Finding] | Skip"]
CHECKS: dict[str, CheckFn] = {}


def check(name: str) -> Callable[[CheckFn], CheckFn]:
    """Register a check under `name` (ValueError for a name already taken)."""

    def add(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"run doctor check {name!r} is already registered")
        CHECKS[name] = fn
        return fn

    return add


def diagnose(
    rows: "list[dict] | S.Columns", settings: dict | None = None, checks: list[str] | None = None
) -> Diagnosis:
    """Run the `checks` (default: all of `CHECKS`) on `rows`, a run's log (`state.log_history` or the recipe's
    `training_metrics.jsonl` rows; the training rows are picked out) or the `series.Columns` of its training rows,
    with the run's `settings` when known.

    Raises:
        ValueError: a name in `checks` that is not a check (says which exist).
    """
    unknown = sorted(set(checks or ()) - set(CHECKS))
    if unknown:
        raise ValueError(f"checks: unknown run doctor check(s) {unknown}; known: {sorted(CHECKS)}")
    run = Run(rows if isinstance(rows, S.Columns) else S.training_rows(rows), settings)
    diagnosis = Diagnosis(rows=len(run.rows), last_step=run.rows[-1]["step"] if run.rows else 0)
    for name in checks or CHECKS:
        result = CHECKS[name](run)
        if isinstance(result, Skip):
            diagnosis.skipped.append(result)
        else:
            diagnosis.findings += result
    diagnosis.findings.sort(key=lambda finding: finding.step)
    return diagnosis


def _needs(name: str, key: str, why: str) -> Skip:
    return Skip(name, f"needs `{key}` in the log, which this run does not log ({why})")


def _too_short(name: str, key: str, have: int, need: int) -> Skip:
    return Skip(name, f"needs {need} logged values of `{key}` (finite numbers), the log has {have}")


def _mean_between(run: Run, key: str, first: int, last: int) -> float:
    steps, values = run.series(key)
    inside = values[(steps >= first) & (steps <= last)]
    return float(np.nanmean(inside)) if np.isfinite(inside).any() else float("nan")


def _span(steps: np.ndarray, end: int, width: int) -> str:
    return f"steps {steps[end - width + 1]}-{steps[end]}"


# ----- no learning signal ---------------------------------------------------------------------------------------


def _direction(reward: float, low: float, high: float) -> str:
    """'all-correct', 'all-wrong', 'mixed' or 'constant': where `reward` sits in the run's reward range."""
    if not high - low > 1e-9:
        return "constant"
    position = (reward - low) / (high - low)
    top = value("solved_position")
    return "all-correct" if position >= top else "all-wrong" if position <= 1 - top else "mixed"


NO_SIGNAL_FIX = {
    "all-wrong": "the prompts are too hard for the model as it is: raise num_generations{G} so that some completion "
    "succeeds, start on easier prompts (policy groups by difficulty with policy_group_warmup_steps), raise "
    "temperature{T}, and check the reward function on a correct answer written by hand",
    "all-correct": "the prompts are solved: train on harder ones, set prompt_skip=True to skip the prompts whose "
    "generation groups all agree, or stop the run here",
    "mixed": "set prompt_skip=True (skips prompts whose generation groups all agree and fills the batch with others), "
    "or raise num_generations{G}",
    "constant": "every completion has had the same reward since the start: check that the reward functions can "
    "score differently (a parse that always fails, a constant)",
}


@check("no_signal")
def no_signal(run: Run) -> list[Finding] | Skip:
    """Most generation groups give every completion the same reward, so the advantages are 0 and nothing is learnt:
    overall (TRL's `frac_reward_zero_std`) and per policy group (`policy_groups/<name>/zero_std_frac`); each finding
    says whether the group sits at the top of the run's rewards (all-correct) or the bottom (all-wrong)."""
    if not len(run.series("frac_reward_zero_std")[0]):
        return _needs("no_signal", "frac_reward_zero_std", "TRL's GRPOTrainer logs it at every logging step")
    steps, frac = run.finite("frac_reward_zero_std")
    width = run.window(steps, "persist_steps")
    if len(frac) < width:
        return _too_short("no_signal", "frac_reward_zero_std", len(frac), width)
    reward_steps, reward = run.finite("reward")
    threshold, findings = value("zero_std_frac"), []
    fix = {kind: text.format(G=run.now("num_generations"), T=run.now("temperature"))
           for kind, text in NO_SIGNAL_FIX.items()}  # fmt: skip
    means = S.rolling_mean(frac, width)
    end = S.first_window(means >= threshold, width)
    if end is not None:
        at = reward_steps <= steps[end]
        recent = at & (reward_steps >= steps[end - width + 1])
        if recent.any():
            level, low, high = float(np.mean(reward[recent])), float(np.min(reward[at])), float(np.max(reward[at]))
        else:  # no finite reward: TRL logs NaN where no completion had a valid reward
            level = low = high = float("nan")
        kind = _direction(level, low, high)
        first_step, last_step = steps[end - width + 1], steps[end]
        per_function = [f"{name} {_mean_between(run, f'rewards/{name}/mean', first_step, last_step):.3g}"
                        for name in run.keys_like("rewards/", "/mean")]  # fmt: skip
        findings.append(Finding(
            "no_signal", "run", f"no learning signal ({kind}): the completions of a prompt all get the same reward",
            f"frac_reward_zero_std {S.fmt(frac[end - width + 1 : end + 1])} over {_span(steps, end, width)} "
            f"(mean {means[end - width + 1]:.3g} >= {threshold}); reward {level:.3g} in the run's range "
            f"[{low:.3g}, {high:.3g}]"
            + (f"; per reward function: {', '.join(per_function)}" if per_function else ""),
            fix[kind], int(steps[end]),
        ))  # fmt: skip
    for name in run.keys_like("policy_groups/", "/zero_std_frac"):
        findings += _group_no_signal(run, name, threshold, fix)
    return findings


def _group_no_signal(run: Run, name: str, threshold: float, fix: dict) -> list[Finding]:
    steps, frac = run.finite(f"policy_groups/{name}/zero_std_frac")
    width = run.window(steps, "persist_steps")
    means = S.rolling_mean(frac, width) if len(frac) >= width else np.empty(0)
    end = S.first_window(means >= threshold, width)
    if end is None:
        return []
    group_steps, reward = run.finite(f"policy_groups/{name}/reward")
    rewards = [run.finite(f"policy_groups/{other}/reward") for other in run.keys_like("policy_groups/", "/reward")]
    rewards.append(run.finite("reward"))
    seen = np.concatenate([values[at <= steps[end]] for at, values in rewards])
    mine = reward[(group_steps <= steps[end]) & (group_steps >= steps[end - width + 1])]
    level = float(np.mean(mine)) if len(mine) else float("nan")
    low, high = (float(seen.min()), float(seen.max())) if len(seen) else (float("nan"), float("nan"))
    kind = _direction(level, low, high)
    group_fix = {
        "all-correct": f"policy group {name!r} is solved: prompt_skip=True skips its prompts (with policy grouping "
        "its weight also falls by itself), or take it out of the data",
        "all-wrong": f"policy group {name!r} is out of reach for now: raise num_generations"
        f"{run.now('num_generations')}, "
        "leave it for later (a curriculum, or policy grouping's weights, which put the steps elsewhere), and check "
        "its reward function on a correct answer",
    }.get(kind, fix[kind])
    return [Finding(
        "no_signal", f"policy group {name!r}", f"no learning signal in policy group {name!r} ({kind})",
        f"policy_groups/{name}/zero_std_frac {S.fmt(frac[end - width + 1 : end + 1])} over {_span(steps, end, width)}"
        f" (mean {means[end - width + 1]:.3g} >= {threshold}); its reward {level:.3g} in the run's range "
        f"[{low:.3g}, {high:.3g}]",
        group_fix, int(steps[end]),
    )]  # fmt: skip


# ----- completions ------------------------------------------------------------------------------------------------


@check("truncation")
def truncation(run: Run) -> list[Finding] | Skip:
    """Many completions are cut at `max_completion_length` (TRL's `completions/clipped_ratio`) over the second half
    of `persist_steps`, and no fewer than in the first half."""
    if not len(run.series("completions/clipped_ratio")[0]):
        return _needs("truncation", "completions/clipped_ratio", "TRL's GRPOTrainer logs it at every logging step")
    steps, clipped = run.finite("completions/clipped_ratio")
    width = run.window(steps, "persist_steps")
    half = width // 2
    if len(clipped) < width:
        return _too_short("truncation", "completions/clipped_ratio", len(clipped), width)
    first = S.rolling_mean(clipped, half)[: len(clipped) - width + 1]  # (n − W + 1,) each window's first half
    second = S.rolling_mean(clipped, width - half)[half:]  # and its second half
    kept = (second >= value("truncated_frac")) & (second >= (1 - value("truncated_fall")) * first)
    end = S.first_window(kept, width)
    if end is None:
        return []
    i = end - width + 1
    length = run.settings.get("max_completion_length")
    if length is None:  # a truncated completion is exactly max_completion_length long
        _, longest = run.finite("completions/max_length")
        length = int(longest.max()) if len(longest) else None
    raise_to = f" to about {2 * length}" if length else ""
    return [Finding(
        "truncation", "run", "completions are cut at max_completion_length and the share is not falling",
        f"completions/clipped_ratio {S.fmt(clipped[i : end + 1])} over {_span(steps, end, width)} (mean "
        f"{first[i]:.2f} in the first half, {second[i]:.2f} in the second >= {value('truncated_frac')})",
        f"raise max_completion_length{f' (now {length})' if length else ''}{raise_to}, or teach the model to end "
        "sooner: a length penalty (reward_funcs with soft_overlong_punishment, DAPO's overlong shaping), or "
        "mask_truncated_completions=True so that cut completions do not count in the loss",
        int(steps[end]),
    )]  # fmt: skip


# ----- entropy ----------------------------------------------------------------------------------------------------


def _entropy_windows(run: Run, name: str):
    if not len(run.series("entropy")[0]):
        return _needs(name, "entropy", "TRL's GRPOTrainer logs the mean token entropy at every logging step")
    steps, entropy = run.finite("entropy")
    width = run.window(steps)
    if len(entropy) < 2 * width:
        return _too_short(name, "entropy", len(entropy), 2 * width)
    means = S.rolling_mean(entropy, width)
    start = means[0]
    later = np.arange(len(means)) >= width  # windows after the first one
    return steps, entropy, width, means, start, later


@check("entropy_collapse")
def entropy_collapse(run: Run) -> list[Finding] | Skip:
    """The mean token entropy fell to a small share of its start: the policy stopped exploring (Cui et al.,
    arXiv:2505.22617)."""
    windows = _entropy_windows(run, "entropy_collapse")
    if isinstance(windows, Skip):
        return windows
    steps, entropy, width, means, start, later = windows
    ratio = value("entropy_collapse_ratio")
    end = S.first_window(later & (means <= ratio * start), width)
    if end is None:
        return []
    return [Finding(
        "entropy_collapse", "run", "entropy collapse: the policy has stopped exploring",
        f"entropy {means[end - width + 1]:.3g} nats over {_span(steps, end, width)}, "
        f"{means[end - width + 1] / start:.0%} "
        f"of its {start:.3g} over the first {width} rows (<= {ratio:.0%})",
        f"entropy_reg=target with entropy_target={0.3 * start:.2g} (trl_grpo_ext keeps the entropy at a target), or "
        f"entropy_reg=clip_cov; a larger upper clip ratio epsilon_high=0.28 (DAPO's clip-higher); temperature"
        f"{run.now('temperature')} at 1.0",
        int(steps[end]),
    )]  # fmt: skip


@check("entropy_explosion")
def entropy_explosion(run: Run) -> list[Finding] | Skip:
    """The mean token entropy rose far above its start: the completions are turning to noise."""
    windows = _entropy_windows(run, "entropy_explosion")
    if isinstance(windows, Skip):
        return windows
    steps, entropy, width, means, start, later = windows
    ratio, nats = value("entropy_explosion_ratio"), value("entropy_explosion_nats")
    end = S.first_window(later & (means >= ratio * start) & (means - start >= nats), width)
    if end is None:
        return []
    return [Finding(
        "entropy_explosion", "run", "entropy explosion: the completions are turning to noise",
        f"entropy {means[end - width + 1]:.3g} nats over {_span(steps, end, width)}, "
        f"{means[end - width + 1] / start:.1f}x its {start:.3g} over the first {width} rows (>= {ratio}x)",
        f"lower the entropy bonus (entropy_coef, entropy_target or entropy_coef_max), the learning_rate"
        f"{run.now('learning_rate')} or the temperature{run.now('temperature')}; grad_reg=zclip bounds the "
        "updates that push it",
        int(steps[end]),
    )]  # fmt: skip


# ----- KL ---------------------------------------------------------------------------------------------------------


@check("kl_runaway")
def kl_runaway(run: Run) -> list[Finding] | Skip:
    """The KL to the reference policy is large and still rising (TRL's `kl`, logged with beta > 0)."""
    if not len(run.series("kl")[0]):
        return _needs(
            "kl_runaway", "kl", "TRL logs it only with beta > 0: without a KL term there is none to run away"
        )
    steps, kl = run.finite("kl")
    width = run.window(steps)
    if len(kl) < width:
        return _too_short("kl_runaway", "kl", len(kl), width)
    means = S.rolling_mean(kl, width)
    rises, se = S.rolling_rise(kl, width)
    end = S.first_window((means >= value("kl_level")) & (rises > 2 * se), width)
    if end is None:
        return []
    return [Finding(
        "kl_runaway", "run", "KL runaway: the policy keeps moving away from the reference",
        f"kl {S.fmt(kl[end - width + 1 : end + 1])} nats/token over {_span(steps, end, width)} (mean "
        f"{means[end - width + 1]:.3g} >= {value('kl_level')}, rising {rises[end - width + 1]:.3g} ± "
        f"{se[end - width + 1]:.2g} over the window)",
        f"lower the learning_rate{run.now('learning_rate')}, raise beta{run.now('beta')} or let it adapt "
        "(kl_target, trl_grpo_ext's adaptive KL coefficient), and look for a reward being gamed "
        "(log_completions=True)",
        int(steps[end]),
    )]  # fmt: skip


# ----- rewards ----------------------------------------------------------------------------------------------------


@check("format_only")
def format_only(run: Run) -> list[Finding] | Skip:
    """A format reward rose and, `plateau_steps` later, every accuracy reward is still where it started: the model
    learnt the format, not the task (a healthy run learns the format first too, and its accuracy follows)."""
    names = run.keys_like("rewards/", "/mean")
    formats = [name for name in names if "format" in name.lower()]
    accuracies = [name for name in names if "accuracy" in name.lower() or "correct" in name.lower()]
    if not formats or not accuracies:
        return Skip("format_only", "needs a format reward and an accuracy reward, reward functions named *format* and "
                    f"*accuracy* or *correct* (rewards/<name>/mean); this run logs {names or 'none'}")  # fmt: skip
    steps, _ = run.aligned(*(f"rewards/{name}/mean" for name in formats + accuracies))
    width = run.window(steps)
    if len(steps) < width + run.window(steps, "plateau_steps"):
        return _too_short("format_only", f"rewards/{formats[0]}/mean", len(steps),
                          width + run.window(steps, "plateau_steps"))  # fmt: skip
    _, values = run.aligned(*(f"rewards/{name}/mean" for name in formats + accuracies))
    start_of = {name: S.rolling_mean(v, width) for name, v in zip(formats + accuracies, values, strict=True)}
    n = len(steps) - width + 1
    flat = np.ones(n, dtype=bool)
    for name in accuracies:
        flat &= np.abs(start_of[name][:n] - start_of[name][0]) < value("accuracy_flat")
    flat = np.logical_and.accumulate(flat)  # flat from the start up to each window
    wait = run.window(steps, "plateau_steps")
    for name in formats:
        rose = start_of[name][:n] - start_of[name][0] >= value("format_rise")
        if not rose.any():
            continue
        learnt = np.arange(n) >= np.argmax(rose) + wait  # the format learnt `plateau_steps` ago, accuracy still flat
        end = S.first_window(learnt & flat, width)
        if end is not None:
            i = end - width + 1
            accuracy = ", ".join(f"{a} {start_of[a][0]:.3g} -> {start_of[a][i]:.3g}" for a in accuracies)
            return [Finding(
                "format_only", "run", f"format-only learning: {name} rises, accuracy does not",
                f"{name} {start_of[name][0]:.3g} -> {start_of[name][i]:.3g} (first window -> "
                f"{_span(steps, end, width)}, rise >= {value('format_rise')}, reached at step "
                f"{steps[np.argmax(rose) + width - 1]}); {accuracy} (moved < {value('accuracy_flat')} since the "
                "start)",
                "check the accuracy reward on a correct completion (does it parse the answer the model writes?); give "
                "the format reward a smaller weight (reward_weights) or only together with a correct answer (as "
                "open-instruct does), and make sure the model can solve some prompts (num_generations"
                f"{run.now('num_generations')})",
                int(steps[end]),
            )]  # fmt: skip
    return []


@check("reward_plateau")
def reward_plateau(run: Run) -> list[Finding] | Skip:
    """The reward has not risen for `plateau_steps` steps (flat or falling with 95% confidence), in each of the
    windows ending over `window_steps` steps in a row, although the completions still disagree (so there is a
    signal, and it is not being learnt)."""
    steps, (reward, reward_std, frac) = run.aligned("reward", "reward_std", "frac_reward_zero_std")
    width = run.window(steps, "plateau_steps")
    if len(reward) < width:
        return _too_short("reward_plateau", "reward, reward_std and frac_reward_zero_std", len(reward), width)
    rises, se = S.rolling_rise(reward, width)
    spread = S.rolling_mean(reward_std, width)
    short = run.window(steps)  # the completions still disagree at the end of the window (else: no_signal's)
    recent = S.rolling_mean(frac, short)[width - short :] if width >= short else S.rolling_mean(frac, width)
    signal = recent < value("zero_std_frac")
    seen = np.fmax.accumulate(reward)[width - 1 :] - np.fmin.accumulate(reward)[width - 1 :]  # the range so far
    disagree = (spread > 0) & (spread >= value("plateau_spread") * seen)
    flat = (rises + 2 * se < value("plateau_tol") * spread) & disagree & signal  # (n − W + 1,) per window
    # and for `window_steps` windows in a row: a run that rises is not called flat on one unlucky window
    run_of = run.window(steps)
    held = S.rolling_mean(flat.astype(np.float64), run_of) == 1.0 if len(flat) >= run_of else np.zeros(0, dtype=bool)
    start = S.first_window(held, run_of)
    if start is None:
        return []
    end = start + width - 1  # the last row of the last window of the run of flat ones
    i = start - run_of + 1  # the first flat window
    how = "fell" if rises[i] + 2 * se[i] < 0 else "does not rise"
    return [Finding(
        "reward_plateau", "run", f"reward plateau: the completions still disagree, but the reward {how}",
        f"reward {S.fmt(reward[i : i + width])} over {_span(steps, i + width - 1, width)} and the windows "
        f"after it to step {steps[end]}: rise {rises[i]:.3g} + 2 x "
        f"{se[i]:.2g} (its standard error) under {value('plateau_tol')} x the mean reward std {spread[i]:.3g}",
        f"raise the learning_rate{run.now('learning_rate')} (LoRA usually wants 1e-5 to 1e-4), lower beta"
        f"{run.now('beta')}; with several kinds of prompts, policy grouping (policy_group_column) puts the steps "
        "where the reward still moves; at the task's ceiling, stop here",
        int(steps[end]),
    )]  # fmt: skip


@check("nonfinite")
def nonfinite(run: Run) -> list[Finding] | Skip:
    """A reward, loss or gradient norm that is not finite, or optimizer steps skipped for non-finite gradients
    (`grad_reg/skipped_steps`)."""
    evidence, first = [], None
    names = ["reward", *(f"rewards/{name}/mean" for name in run.keys_like("rewards/", "/mean")), "loss",
             "grad_norm"]  # fmt: skip
    for key in names:
        steps, values = run.series(key)
        bad = steps[~np.isfinite(values)]
        if key == "reward":  # NaN is TRL's "no completion had a valid reward" only where every function was None
            bad = steps[np.isinf(values)] if len(steps) else bad
        if len(bad):
            evidence.append(f"{key} not finite at steps {S.fmt(bad)}")
            first = min(first if first is not None else bad[0], bad[0])
    steps, skipped = run.series("grad_reg/skipped_steps")
    if len(steps) and np.nanmax(skipped) > 0:
        at = steps[np.argmax(skipped > 0)]
        evidence.append(f"grad_reg/skipped_steps {int(np.nanmax(skipped))} by step {steps[-1]}")
        first = min(first if first is not None else at, at)
    if not evidence:
        return []
    return [Finding(
        "nonfinite", "run", "non-finite values: a reward, the loss or the gradients",
        "; ".join(evidence),
        "make reward functions return finite numbers (None leaves a completion out); train in bf16=True rather than "
        f"fp16; grad_reg=skip_nonfinite skips such an optimizer step without touching the weights; lower the "
        f"learning_rate{run.now('learning_rate')}",
        int(first),
    )]  # fmt: skip


# ----- gradients and step time -------------------------------------------------------------------------------------


@check("grad_spikes")
def grad_spikes(run: Run) -> list[Finding] | Skip:
    """A logged gradient norm many times the median of the ones before it (ZClip, arXiv:2504.02507)."""
    history = int(value("grad_spike_history"))
    if not len(run.series("grad_norm")[0]):
        return _needs("grad_spikes", "grad_norm", "transformers logs it when it clips gradients, max_grad_norm > 0")
    steps, norm = run.finite("grad_norm")  # a non-finite norm is `nonfinite`'s
    if len(norm) <= history:
        return _too_short("grad_spikes", "grad_norm", len(norm), history + 1)
    before = np.lib.stride_tricks.sliding_window_view(norm[:-1], history)  # (n − H, H): the H rows before each
    usable = np.isfinite(before).all(1) & (before > 0).all(1)  # steps without signal have a zero norm
    median = np.where(usable, np.median(np.where(usable[:, None], before, 1.0), axis=1), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = norm[history:] / median
    spikes = np.flatnonzero(np.isfinite(ratio) & (ratio >= value("grad_spike_ratio")))
    if not len(spikes):
        return []
    at = steps[history:][spikes]
    return [Finding(
        "grad_spikes", "run", f"gradient-norm spikes at {len(at)} step(s)",
        f"grad_norm at steps {S.fmt(at)} was {S.fmt(ratio[spikes])}x the median of the {history} rows before it "
        f"(>= {value('grad_spike_ratio')}x)",
        f"grad_reg=zclip clips a spike against the recent norms (ZClip); keep max_grad_norm{run.now('max_grad_norm')} "
        "at 1.0; log_completions=True shows the batch that caused it",
        int(at[0]),
    )]  # fmt: skip


@check("generation_bound")
def generation_bound(run: Run) -> list[Finding] | Skip:
    """Nearly all of the step time goes to `model.generate` (`timing/generation`, logged with `run_doctor`, against
    TRL's `step_time`)."""
    if not len(run.series("timing/generation")[0]):
        return _needs(
            "generation_bound", "timing/generation", "trl_grpo_ext's GRPOTrainer logs it with run_doctor=True"
        )
    steps, (generation, step_time) = run.aligned("timing/generation", "step_time")
    width = run.window(steps)
    if len(steps) < width:
        return _too_short("generation_bound", "timing/generation", len(steps), width)
    share = np.convolve(generation, np.ones(width), "valid") / np.convolve(step_time, np.ones(width), "valid")
    end = S.first_window(share >= value("generation_share"), width)
    if end is None:
        return []
    ideas = []
    if not run.settings.get("use_vllm"):
        ideas.append("use_vllm=True with vllm_mode=colocate (TRL generates in vLLM)")
    if not run.settings.get("generation_compile"):
        ideas.append("generation_compile=True (trl_grpo_ext: static KV cache and a compiled decode step)")
    if run.settings.get("use_peft", True) and not run.settings.get("generation_lora_merge"):
        ideas.append("with LoRA, generation_lora_merge=True")
    ideas.append("generate less: prompt_skip=True, or a smaller max_completion_length"
                 f"{run.now('max_completion_length')} or num_generations{run.now('num_generations')}")  # fmt: skip
    return [Finding(
        "generation_bound", "run", f"steps are generation-bound: {share[end - width + 1]:.0%} of the step time",
        f"timing/generation {generation[end - width + 1 : end + 1].sum():.3g} s of step_time "
        f"{step_time[end - width + 1 : end + 1].sum():.3g} s over {_span(steps, end, width)} "
        f"(>= {value('generation_share'):.0%})",
        "; ".join(ideas), int(steps[end]),
    )]  # fmt: skip


@check("memory")
def memory(run: Run) -> list[Finding] | Skip:
    """The CUDA memory headroom: the peak reserved memory near the card's size (an out-of-memory error is close) or
    far below it over the run (room for larger generation batches)."""
    if not len(run.series("memory/peak_reserved_gib")[0]):
        return _needs("memory", "memory/peak_reserved_gib", "logged with run_doctor=True on a CUDA device only")
    steps, (peak, total) = run.aligned("memory/peak_reserved_gib", "memory/total_gib")
    if not len(steps):
        return _too_short("memory", "memory/peak_reserved_gib and memory/total_gib", 0, 1)
    share = np.maximum.accumulate(peak) / total
    high = np.flatnonzero(share >= value("memory_high"))
    if len(high):
        i = high[0]
        return [Finding(
            "memory", "run", "CUDA memory is nearly full: an out-of-memory error is close",
            f"peak reserved {peak[i]:.3g} GiB of {total[i]:.3g} GiB ({share[i]:.0%} >= {value('memory_high'):.0%}) "
            f"at step {steps[i]}",
            "gradient_checkpointing=True, a smaller per_device_train_batch_size"
            f"{run.now('per_device_train_batch_size')} with more gradient_accumulation_steps, QLoRA "
            "(load_in_4bit=True), "
            "or a shorter max_completion_length; `trl-grpo-ext memory --config ...` estimates each term",
            int(steps[i]),
        )]  # fmt: skip
    width = run.window(steps)
    if len(steps) >= width and share[width - 1] <= value("memory_low"):
        i = width - 1
        return [Finding(
            "memory", "run", f"CUDA memory is mostly unused: {share[i]:.0%} of the card at most",
            f"peak reserved {np.nanmax(peak[: i + 1]):.3g} GiB of {total[i]:.3g} GiB over steps {steps[0]}-{steps[i]} "
            f"(<= {value('memory_low'):.0%})",
            "generate more at once for faster steps: a larger per_device_train_batch_size"
            f"{run.now('per_device_train_batch_size')} or steps_per_generation; or turn gradient_checkpointing off",
            int(steps[i]),
        )]  # fmt: skip
    return []
