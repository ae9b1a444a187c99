"""The run doctor's checks: each reads the logged rows of a GRPO run and returns its findings, or says why it was
skipped. `CHECKS` maps a check's name to its function; `diagnose` runs them all.

The checks are in `learning`, `stability` and `resources`, which import this module and register each check with
`check`; this module imports none of them (no import cycle). The package (`trl_grpo_ext.doctor`, which Python
imports before any of its modules) imports them in the order of the report, so `CHECKS` is complete whenever this
module is importable.

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
        step: the step at which the condition first held: the first step of the first stretch of rows over which
            it held (a check over windows of W rows finds it at the stretch's last row), or the step of the event.
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
    generation: str = ""  # what generation cost and what prompt skipping saved (`generation_accounting`), or ""
    checks: int = 0  # the checks run or skipped

    def verdict(self) -> str:
        """How much the doctor could judge, and what it found: "too short to judge: N of M checks skipped" when at
        least half of the checks could not run, else "no finding in the K checks that could run (N skipped)" or
        the findings' count and checks."""
        skipped, total = len(self.skipped), self.checks or len(self.skipped) + 1
        names = sorted({finding.check for finding in self.findings})
        found = f"{len(self.findings)} finding(s) ({', '.join(names)})" if names else ""
        if 2 * skipped >= total:
            return f"too short to judge: {skipped} of {total} checks skipped" + (f"; {found}" if found else "")
        if found:
            return found + (f"; {skipped} of {total} checks skipped" if skipped else "")
        ran = total - skipped
        return f"no finding in the {ran} checks that could run" + (
            f" ({skipped} of {total} skipped)" if skipped else ""
        )

    def report(self) -> str:
        """The short report `trl-grpo-ext doctor` prints: the verdict, the findings, then what was skipped and why."""
        head = f"{self.rows} logged training step{'s' if self.rows != 1 else ''}, up to step {self.last_step}: "
        lines = [
            head + self.verdict(),
            *([self.generation] if self.generation else []),
            *(finding.text() for finding in self.findings),
        ]
        if self.skipped:
            lines.append("skipped:")
            lines += [f"  {skip.check}: {skip.reason}" for skip in self.skipped]
        return "\n".join(lines)


class Run:
    """The logged training rows of a run (`series.training_rows`, or the `series.Columns` the callback keeps), with
    the settings known for it (a dict of `GRPOConfig` field values, and the callback's `trainable_parameters`: the
    parameter tensors that required gradients at the start of training; empty when only the log is known)."""

    def __init__(self, rows: "list[dict] | S.Columns", settings: dict | None = None, ended: bool = False):
        self.columns = rows if isinstance(rows, S.Columns) else S.Columns(rows)
        self.rows = self.columns.rows
        self.settings = settings or {}
        self.ended = ended  # the log is the whole run: a state its last rows are in is reported (`tail`)
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

    def tail(self, condition: np.ndarray) -> int:
        """At the end of a run (`ended`), the number of last rows that are in the state `condition` (n,) bool marks,
        when they are enough to report; else 0. The tail is the longest run of last rows that starts at a row in the
        state and has at most `tail_outliers` rows out of it (so one noisy step, the last one included, does not end
        it); enough is `tail_rows` rows in the state, or the last half of a shorter run (2 at least)."""
        if not self.ended or not len(condition):
            return 0
        last_first = np.asarray(condition, dtype=bool)[::-1]  # (n,) the rows from the last one back
        out = np.cumsum(~last_first)  # (n,) rows out of the state among the last k = 1..n
        fits = np.flatnonzero(last_first & (out <= value("tail_outliers")))
        if not len(fits):
            return 0
        length = int(fits[-1]) + 1
        need = min(int(value("tail_rows")), max(2, len(condition) // 2))
        return length if length - int(out[length - 1]) >= need else 0

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
    rows: "list[dict] | S.Columns", settings: dict | None = None, checks: list[str] | None = None, ended: bool = False
) -> Diagnosis:
    """Run the `checks` (default: all of `CHECKS`) on `rows`, a run's log (`state.log_history` or the recipe's
    `training_metrics.jsonl` rows; the training rows are picked out) or the `series.Columns` of its training rows,
    with the run's `settings` when known. `ended`: the log is a whole run (the end of training, or a run folder read
    afterwards), so a state its last rows are in is reported though it lasted less than a window.

    Raises:
        ValueError: a name in `checks` that is not a check (says which exist).
    """
    unknown = sorted(set(checks or ()) - set(CHECKS))
    if unknown:
        raise ValueError(f"checks: unknown run doctor check(s) {unknown}; known: {sorted(CHECKS)}")
    run = Run(rows if isinstance(rows, S.Columns) else S.training_rows(rows), settings, ended)
    names = checks or list(CHECKS)
    diagnosis = Diagnosis(rows=len(run.rows), last_step=run.rows[-1]["step"] if run.rows else 0, checks=len(names))
    for name in names:
        result = CHECKS[name](run)
        if isinstance(result, Skip):
            diagnosis.skipped.append(result)
        else:
            diagnosis.findings += result
    diagnosis.findings.sort(key=lambda finding: finding.step)
    diagnosis.generation = generation_accounting(run)
    return diagnosis


def generation_accounting(run: Run) -> str:
    """One line on the completion tokens the run generated and those prompt skipping left out (its running totals
    `prompt_skip/completion_tokens_total`, `prompt_skip/tokens_saved` and `prompt_skip/skipped` at the last logged
    step), or "" without prompt skipping."""
    totals = {}
    for key in ("prompt_skip/completion_tokens_total", "prompt_skip/tokens_saved", "prompt_skip/skipped"):
        _, values = run.finite(key)
        if not len(values):
            return ""
        totals[key] = float(values[-1])
    generated, saved = totals["prompt_skip/completion_tokens_total"], totals["prompt_skip/tokens_saved"]
    share = saved / (generated + saved) if generated + saved > 0 else 0.0
    return (
        f"generation: {generated:,.0f} completion tokens generated for training; prompt skipping skipped "
        f"{totals['prompt_skip/skipped']:,.0f} prompts, leaving out about {saved:,.0f} tokens ({share:.0%} of what "
        "generating every drawn prompt would have cost)"
    )


def missing(name: str, key: str, why: str) -> Skip:
    return Skip(name, f"needs `{key}` in the log, which this run does not log ({why})")


def too_short(name: str, key: str, have: int, need: int) -> Skip:
    return Skip(name, f"needs {need} logged values of `{key}` (finite numbers), the log has {have}")


def mean_between(run: Run, key: str, first: int, last: int) -> float:
    steps, values = run.series(key)
    inside = values[(steps >= first) & (steps <= last)]
    return float(np.nanmean(inside)) if np.isfinite(inside).any() else float("nan")


def span(steps: np.ndarray, end: int, width: int) -> str:
    return f"steps {steps[end - width + 1]}-{steps[end]}"
