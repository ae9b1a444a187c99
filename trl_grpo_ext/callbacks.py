"""`MetricsTableCallback`: a per-step table of the GRPO metrics on stdout and a PNG plot of them in `output_dir`."""

import json
import math
import os

import numpy as np
from transformers import TrainerCallback

# (logged key, column title, format) in the order the table prints them; TRL's GRPOTrainer logs every key.
COLUMNS = (
    ("reward", "reward", "{:>8.4f}"),
    ("reward_std", "reward std", "{:>10.4f}"),
    ("entropy", "entropy", "{:>8.4f}"),
    ("completions/mean_length", "length", "{:>7.1f}"),
    ("step_time", "step time (s)", "{:>13.3f}"),
)
# with prompt skipping, also the completion tokens generated for the step's generation batch and those left out so far
# (a row without a generation, such as a resumed run's first inside a generation cycle, shows "-")
SKIP_COLUMNS = (
    ("prompt_skip/completion_tokens", "tokens", "{:>8.0f}"),
    ("prompt_skip/tokens_saved", "skipped (total)", "{:>15.0f}"),
)
PLOT_NAME = "training_curves.png"
GROUPS_PLOT_NAME = "policy_groups.png"
HISTORY_NAME = "training_metrics.jsonl"


class MetricsTableCallback(TrainerCallback):
    """Print one table row per logged training step and, at the end, plot reward and entropy against the step.

    Rows come from the logs TRL's `GRPOTrainer` writes (`reward`, `reward_std`, `entropy` in nats per token,
    `completions/mean_length` in tokens, `step_time` in seconds), so `logging_steps=1` gives a row per step; with
    prompt skipping also the completion tokens generated for the step (`prompt_skip/completion_tokens`) and those
    left out so far (`prompt_skip/tokens_saved`, an estimate). At the end
    of training the main process writes `<output_dir>/training_metrics.jsonl` (one logged row a line, every value
    logged at that step: TRL's, this package's, the run doctor's) and `<output_dir>/training_curves.png`. A resumed
    run's files start at step 1: the rows logged before the checkpoint come from its `trainer_state.json`, and each
    step appears once however many times the run was resumed.
    """

    def __init__(self):
        self.rows: list[dict] = []
        self.columns = COLUMNS  # with prompt skipping (`args.prompt_skip`), SKIP_COLUMNS too
        self._header = False  # the table's header printed
        self._first_step = 0  # the global step training (re)started from

    def on_train_begin(self, args, state, control, **kwargs):
        # a resumed run: the checkpoint's log (the Trainer loads it before this call); a fresh one: nothing
        self.rows = [dict(row) for row in state.log_history if "step" in row and _is_training_row(row)]
        self._first_step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "train_runtime" in logs:  # the Trainer's closing summary
            trained = state.global_step - self._first_step
            since = f" (resumed at step {self._first_step})" if self._first_step else ""
            print(f"train_runtime: {logs['train_runtime']:.1f} s for {trained} steps{since}", flush=True)
            return
        if not _is_training_row(logs):
            return
        if not self._header:
            self._header = True
            skipping = getattr(args, "prompt_skip", False)  # our GRPOConfig's field; TRL's config has none
            self.columns = COLUMNS + (SKIP_COLUMNS if skipping else ())
            print(" ".join(["step".rjust(5), *(title.rjust(len(fmt.format(0.0))) for _, title, fmt in self.columns)]))
        row = {"step": state.global_step, **{key: logs.get(key) for key, _, _ in self.columns}, **logs}
        self.rows.append(row)
        cells = [_format(row[key], fmt) for key, _, fmt in self.columns]
        print(" ".join([str(row["step"]).rjust(5), *cells]), flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or not self.rows:
            return
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, HISTORY_NAME), "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in self.rows)
        plot_path = plot_curves(self.rows, os.path.join(args.output_dir, PLOT_NAME))
        print(f"Saved {plot_path}")
        if any(key.startswith("policy_groups/") for row in self.rows for key in row):
            print(f"Saved {plot_policy_groups(self.rows, os.path.join(args.output_dir, GROUPS_PLOT_NAME))}")


def _is_training_row(logs: dict) -> bool:
    """A training step's logged row: not the Trainer's closing summary nor an evaluation's row (a step on a buffered
    batch has a loss but no reward)."""
    return "train_runtime" not in logs and ("reward" in logs or "loss" in logs)


def _format(value, fmt: str) -> str:
    width = len(fmt.format(0.0))
    return "-".rjust(width) if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def plot_curves(rows: list[dict], path: str) -> str:
    """Plot mean reward (with ± one reward std band) and entropy against the step into a PNG at `path`; return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key: str) -> np.ndarray:  # a missing value (TRL logs None when no reward was valid) is a gap
        return np.array([np.nan if row.get(key) is None else row[key] for row in rows], dtype=float)

    steps, reward, std = [row["step"] for row in rows], series("reward"), series("reward_std")
    fig, (ax_reward, ax_entropy) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_reward.plot(steps, reward, marker="o", markersize=3, label="mean reward")
    ax_reward.fill_between(steps, reward - std, reward + std, alpha=0.2, label="± std")
    ax_reward.set(xlabel="step", ylabel="reward", title="Reward")
    ax_reward.legend()
    ax_entropy.plot(steps, series("entropy"), color="tab:orange", marker="o", markersize=3)
    ax_entropy.set(xlabel="step", ylabel="nats / token", title="Entropy of the policy")
    for ax in (ax_reward, ax_entropy):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def stage_spans(log_history: list[dict]) -> list[tuple[str, int, int]]:
    """The training stages of a run as (stage name, first step, last step), in order, from the logged
    `policy_groups/stage` (the index into `policy_groups.stages.STAGES`); [] when the run had no stages."""
    from .policy_groups.stages import STAGES

    spans: list[tuple[str, int, int]] = []
    for row in log_history:
        if "step" not in row or row.get("policy_groups/stage") is None:
            continue
        stage = STAGES[round(row["policy_groups/stage"])]
        if spans and spans[-1][0] == stage:
            spans[-1] = (stage, spans[-1][1], row["step"])
        else:
            spans.append((stage, row["step"], row["step"]))
    return spans


STAGE_COLOURS = {"warmup": "tab:gray", "competition": "white", "fusion": "tab:green"}


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")


def plot_policy_groups(log_history: list[dict], path: str) -> str:
    """Plot each policy group's weight (stacked, as its share of the weights' sum: equal weights are equal bands) and
    EMA reward (one dash and marker per group) against the step into a PNG at `path`, one legend to the right of
    both; return the path.

    `log_history` is `trainer.state.log_history` (or the rows `MetricsTableCallback` keeps): dicts with a `step`
    and `policy_groups/<name>/weight` / `policy_groups/<name>/reward` keys. Groups that appear later (a split)
    start where they first appear; merged-away groups stop. With training stages (`policy_groups/stage` logged),
    warm-up is shaded grey and fusion green, each span named at the top (`stage_spans`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prefix, suffix = "policy_groups/", "/weight"
    names = sorted(
        {
            key[len(prefix) : -len(suffix)]
            for row in log_history
            for key in row
            if key.startswith(prefix) and key.endswith(suffix)
        }
    )
    fig, (ax_weight, ax_reward) = plt.subplots(1, 2, figsize=(11, 3.8))
    # weights stacked as shares of their sum, so equal weights are equal bands (lines on top of each other would hide
    # all but one); a group absent at a step (before a split made it, after a merge ended it) takes no share there
    steps = sorted({row["step"] for row in log_history if "step" in row and any(f"{prefix}{n}{suffix}" in row
                                                                                  for n in names)})  # fmt: skip
    by_step = {}
    for row in log_history:
        if "step" in row:
            by_step.setdefault(row["step"], {}).update(row)
    stacked = [[by_step[step].get(f"{prefix}{name}{suffix}", 0.0) for step in steps] for name in names]
    totals = [sum(column) or 1.0 for column in zip(*stacked, strict=True)] if stacked else []
    shares = [[value / total for value, total in zip(series, totals, strict=True)] for series in stacked]
    if steps:
        ax_weight.stackplot(steps, *shares, labels=names, colors=[f"C{i % 10}" for i in range(len(names))],
                            alpha=0.85, edgecolor="white", linewidth=0.5)  # fmt: skip
    ax_weight.set_ylim(0, 1)
    for i, name in enumerate(names):
        points = [(row["step"], row[f"{prefix}{name}/reward"]) for row in log_history
                  if "step" in row and f"{prefix}{name}/reward" in row]  # fmt: skip
        if points:  # each group its own dash and marker, so equal rewards stay readable
            ax_reward.plot(*zip(*points, strict=True), linestyle=LINE_STYLES[i % len(LINE_STYLES)],
                           marker=MARKERS[i % len(MARKERS)], markersize=3, markevery=max(1, len(points) // 20),
                           linewidth=1.4, color=f"C{i % 10}")  # fmt: skip
    ax_weight.set(xlabel="step", ylabel="share of the summed weights", title="Policy group weights (stacked)")
    ax_reward.set(xlabel="step", ylabel="EMA reward", title="Policy group rewards")
    spans = stage_spans(log_history)
    for ax in (ax_weight, ax_reward):
        for i, (stage, first, last) in enumerate(spans):
            end = spans[i + 1][1] if i + 1 < len(spans) else last  # shaded up to where the next stage starts
            ax.axvspan(first, end, color=STAGE_COLOURS[stage], alpha=0.15, lw=0, zorder=3)  # over the stacked bands
            ax.text((first + end) / 2, 0.99, stage, transform=ax.get_xaxis_transform(), ha="center", va="top",
                    fontsize=7, color="dimgray")  # fmt: skip
        ax.grid(alpha=0.3)
    # one legend, off the lines: to the right of both panels
    fig.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, title="policy group", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
