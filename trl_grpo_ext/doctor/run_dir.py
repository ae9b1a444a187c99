"""A run folder's logs read into rows for the run doctor (`load_run`).

A run's output folder holds its log in up to three places, read in this order and merged by step (for a step and a
key in more than one, the later file's value is kept: they are the same numbers):
    checkpoint-<N>/trainer_state.json   transformers' `log_history` up to each checkpoint (the newest readable one is
                                        used: a checkpoint being written may be incomplete)
    trainer_state.json                  the same, where `trainer.save_state()` wrote it at the end
    run_doctor_log.jsonl                the rows the run doctor's callback checked (`run_doctor`), written at the end
    training_metrics.jsonl              the recipe's every logged row (`MetricsTableCallback`), written at the end
A file that is not valid JSON (a run writing it right now) is skipped with a note; the log of another trainer (no
`reward` or `frac_reward_zero_std` in its rows) is refused.
"""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..reporting.callbacks import HISTORY_NAME
from .callback import DOCTOR_LOG
from .series import GRPO_KEYS, has_step, is_grpo_log, training_rows

STATE_NAME = "trainer_state.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
WHERE = (f"{STATE_NAME}, checkpoint-*/{STATE_NAME} (transformers writes one at every save, save_steps), "
         f"{DOCTOR_LOG} (run_doctor=True writes it at the end) or {HISTORY_NAME} (the recipe writes it at the "
         "end)")  # fmt: skip


class RunDirError(ValueError):
    """A folder the doctor cannot read a GRPO log from: missing, empty, unreadable, or another trainer's."""


@dataclass
class RunLog:
    """The merged training rows of a run folder, the files they came from, and notes on files that were skipped."""

    rows: list[dict]
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _state_rows(path: Path, notes: list[str]) -> list[dict] | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        notes.append(f"{path}: not readable JSON ({error}): skipped")
        return None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        notes.append(f"{path}: no log_history list (not a transformers trainer state): skipped")
        return None
    return [row for row in state["log_history"] if isinstance(row, dict)]


def _history_rows(path: Path, notes: list[str]) -> list[dict] | None:
    rows, bad = [], []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        notes.append(f"{path}: not readable ({error}): skipped")
        return None
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad.append(number)
            continue
        if isinstance(row, dict):
            rows.append(row)
    if bad:
        notes.append(f"{path}: line(s) {bad[:5]}{'…' if len(bad) > 5 else ''} not JSON: skipped")
    return rows


def _newest_checkpoint_state(folder: Path, notes: list[str]) -> tuple[Path, list[dict]] | None:
    checkpoints = sorted(
        (int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := CHECKPOINT.match(p.name))
    )
    for _, checkpoint in reversed(checkpoints):
        path = checkpoint / STATE_NAME
        if path.is_file():
            rows = _state_rows(path, notes)
            if rows is not None:
                return path, rows
    return None


def load_run(path: str | Path) -> RunLog:
    """The training rows logged by the run in folder `path` (or in the one log file `path` names), merged by step.

    Raises:
        RunDirError: `path` does not exist; it holds no log (says where it looked); every log in it is unreadable; or
            its rows are not a GRPO run's (another trainer's log).
    """
    path = Path(path)
    if not path.exists():
        raise RunDirError(f"{path} does not exist: give a run's output_dir (holding {WHERE})")
    notes: list[str] = []
    found: list[tuple[Path, list[dict] | None]] = []
    if path.is_file():
        reader = _history_rows if path.suffix == ".jsonl" else _state_rows
        found.append((path, reader(path, notes)))
    else:
        newest = _newest_checkpoint_state(path, notes)
        if newest is not None:
            found.append(newest)
        for name, reader in ((STATE_NAME, _state_rows), (DOCTOR_LOG, _history_rows), (HISTORY_NAME, _history_rows)):
            if (path / name).is_file():
                found.append((path / name, reader(path / name, notes)))
    readable = [(source, rows) for source, rows in found if rows is not None]
    if not found and not notes:
        raise RunDirError(f"{path} holds no training log: looked for {WHERE}")
    if not readable:
        raise RunDirError(f"{path}: no readable training log ({'; '.join(notes)})")
    merged: dict[int, dict] = {}
    for source, rows in readable:
        stepless = sum(not has_step(row) for row in rows)
        if stepless:
            notes.append(f"{source}: {stepless} row(s) without a whole-number `step`: skipped")
        for row in training_rows(rows):
            merged.setdefault(row["step"], {}).update(row)
    if not is_grpo_log(list(merged.values())):
        logged = sorted({key for _, rows in readable for row in rows for key in row} - {"step", "epoch"})
        if not logged:
            raise RunDirError(
                f"{path}: no training step logged in it yet (transformers logs the first at logging_steps, in the "
                f"trainer_state.json of the first checkpoint; the recipe writes {HISTORY_NAME} at the end)"
            )
        raise RunDirError(
            f"{path}: not a GRPO run's log: its rows have none of {list(GRPO_KEYS)} (they log {logged[:8]}"
            f"{'…' if len(logged) > 8 else ''}); the doctor reads logs of TRL's GRPOTrainer and trl_grpo_ext's"
        )
    return RunLog([merged[step] for step in sorted(merged)], [str(source) for source, _ in readable], notes)
