"""`MetricsTableCallback`: a per-step table of the GRPO metrics on stdout and a PNG plot of them in `output_dir`
(drawn by `plots`; without matplotlib, the `doctor` extra, a warning instead); `HISTORY_NAME` is the log file it
writes, which the run doctor reads."""

import json
import logging
import math
import os

from transformers import TrainerCallback

from ..error_reports import MissingDependencyError
from .plots import plot_curves, plot_policy_groups

logger = logging.getLogger(__name__)

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
    """Print one table row per logged training step and, at the end, plot reward, completion length, entropy and
    each feature's own metrics (when it logged them) against the step.

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
        try:
            print(f"Saved {plot_curves(self.rows, os.path.join(args.output_dir, PLOT_NAME))}")
            if any(key.startswith("policy_groups/") for row in self.rows for key in row):
                print(f"Saved {plot_policy_groups(self.rows, os.path.join(args.output_dir, GROUPS_PLOT_NAME))}")
        except MissingDependencyError as error:  # a finished run is not failed for want of its plot
            logger.warning("No plot of the run: %s", error)


def _is_training_row(logs: dict) -> bool:
    """A training step's logged row: not the Trainer's closing summary nor an evaluation's row (a step on a buffered
    batch has a loss but no reward)."""
    return "train_runtime" not in logs and ("reward" in logs or "loss" in logs)


def _format(value, fmt: str) -> str:
    width = len(fmt.format(0.0))
    return "-".rjust(width) if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)
