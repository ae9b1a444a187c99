"""The logged rows of a run as arrays (pure functions on numpy arrays).

A row is one entry of transformers' `state.log_history` (or one line of the recipe's `training_metrics.jsonl`): a
dict with the global `step` and the values logged there. n = rows that log a metric, W = rows in a window.
"""

import math

import numpy as np

# Keys that TRL's GRPOTrainer logs at every generation batch: a log without them is not a GRPO run's.
GRPO_KEYS = ("reward", "frac_reward_zero_std")
MIN_WINDOW_ROWS = 3  # a trend or a mean over fewer rows says nothing


def training_rows(log_history: list[dict]) -> list[dict]:
    """The training rows of `log_history`, in step order: those with a `step` and a GRPO key (`GRPO_KEYS`) or the
    training `loss` (a step that trained on a buffered generation batch logs no reward); the evaluation rows
    (`eval_*`) and the closing summary (`train_runtime`) are left out."""
    rows = [row for row in log_history if has_step(row) and "train_runtime" not in row
            and any(key in row for key in (*GRPO_KEYS, "loss"))]  # fmt: skip
    return sorted(rows, key=lambda row: row["step"])


def has_step(row) -> bool:
    """Whether `row` is a dict with a whole-number `step` (a hand-edited or foreign log may hold anything)."""
    return isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool)


def number(value) -> float | None:
    """`value` as a float when it is a logged number (None is NaN: TRL logs one where no reward was valid), else
    None (a string, a list: not a metric value)."""
    if value is None:
        return np.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def is_grpo_log(rows: list[dict]) -> bool:
    """Whether any of `rows` logs a GRPO key (`GRPO_KEYS`)."""
    return any(key in row for row in rows for key in GRPO_KEYS)


def middles(keys, prefix: str, suffix: str) -> list[str]:
    """The middle parts of the `keys` that read `<prefix><middle><suffix>`, sorted."""
    found = {key[len(prefix) : len(key) - len(suffix)] for key in keys
             if key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix) + len(suffix)}  # fmt: skip
    return sorted(found)


class Columns:
    """Training rows kept by metric as they come (key -> the steps and values that log it, in arrays that double
    when full), so that reading a metric costs one copy, not a pass over every row: what the callback appends to at
    each log."""

    def __init__(self, rows: list[dict] = ()):
        self.rows: list[dict] = []
        self._steps: dict[str, np.ndarray] = {}  # key -> (capacity,) buffers, the first `_count[key]` in use
        self._values: dict[str, np.ndarray] = {}
        self._count: dict[str, int] = {}
        for row in rows:
            self.append(row)

    def append(self, row: dict) -> None:
        """Add one training row (rows come in step order)."""
        self.rows.append(row)
        for key, value in row.items():
            if key == "step" or (v := number(value)) is None:
                continue
            n = self._count.get(key, 0)
            if n == len(self._values.get(key, ())):  # full: double the buffers
                self._steps[key] = np.resize(self._steps.get(key, np.empty(0, np.int64)), max(16, 2 * n))
                self._values[key] = np.resize(self._values.get(key, np.empty(0)), max(16, 2 * n))
            self._steps[key][n], self._values[key][n] = row["step"], v
            self._count[key] = n + 1

    def keys(self):
        return self._values.keys()

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps (n,), values (n,)) of the rows that log `key` as a number (`number`: None is NaN, a value that is
        not a number is left out); copies, as the buffers are written in place."""
        n = self._count.get(key, 0)
        if not n:
            return np.empty(0, dtype=np.int64), np.empty(0)
        return self._steps[key][:n].copy(), self._values[key][:n].copy()


def window_rows(steps: np.ndarray, span: float) -> int:
    """W, the rows that cover `span` optimizer steps at this run's logging interval (the mean gap between the logged
    steps), at least `MIN_WINDOW_ROWS`."""
    gap = (float(steps[-1]) - float(steps[0])) / (len(steps) - 1) if len(steps) > 1 else 1.0
    return max(MIN_WINDOW_ROWS, math.ceil(span / max(gap, 1.0) - 1e-9))


def rolling_mean(values: np.ndarray, width: int) -> np.ndarray:
    """(n − W + 1,) the mean of each run of `width` consecutive values, NaNs left out (NaN where all are)."""
    if len(values) < width:
        return np.empty(0)
    finite = np.isfinite(values)
    sums = np.convolve(np.where(finite, values, 0.0), np.ones(width), "valid")
    counts = np.convolve(finite.astype(np.float64), np.ones(width), "valid")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def first_window(condition: np.ndarray, width: int) -> int | None:
    """The index of the last row of the first window (of `width` rows) where `condition` (n − W + 1,) holds, or
    None."""
    hits = np.flatnonzero(condition)
    return int(hits[0]) + width - 1 if len(hits) else None


def onset(end: int, width: int, holds: np.ndarray) -> int:
    """The row where a condition found over the window of `width` rows ending at row `end` began: the window's first
    row at which `holds` (n,), the condition row by row, is true (the window's first row when none is). A stretch that
    starts at step 30 is found at the end of its first window (step 39 for 10 rows), and began at 30."""
    start = end - width + 1
    hits = np.flatnonzero(holds[start : end + 1])
    return start + int(hits[0]) if len(hits) else start


def fmt(values: np.ndarray, limit: int = 6) -> str:
    """Up to `limit` values as text, `…` between the first and the last ones when there are more."""
    text = [f"{v:.3g}" for v in values]
    if len(text) > limit:
        text = [*text[: limit // 2], "…", *text[-(limit - limit // 2) :]]
    return "[" + ", ".join(text) + "]"


def rolling_rise(values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(n − W + 1,) each window's least-squares rise and its standard error, in the units of `values` (n,) (finite
    numbers): the rise b·(W−1) of the ordinary least-squares line through the window over t = 0..W−1, and its
    standard error se(b)·(W−1), se(b) = √(Σ residual² / (W − 2) / Σ(t − t̄)²), for every window at once from rolling
    sums."""
    if len(values) < width or width < MIN_WINDOW_ROWS:
        return np.empty(0), np.empty(0)
    x = np.asarray(values, dtype=np.float64)
    ones, t = np.ones(width), np.arange(width, dtype=np.float64)
    sum_x = np.convolve(x, ones, "valid")
    sum_xx = np.convolve(x * x, ones, "valid")
    sum_tx = np.convolve(x, t[::-1], "valid")  # Σ_t t·x[i + t] for each window start i
    t_mean, s_tt = (width - 1) / 2, width * (width**2 - 1) / 12
    slope = (sum_tx - t_mean * sum_x) / s_tt
    residual = np.maximum(sum_xx - sum_x**2 / width - slope**2 * s_tt, 0.0)
    se = np.sqrt(residual / (width - 2) / s_tt)
    return slope * (width - 1), se * (width - 1)
