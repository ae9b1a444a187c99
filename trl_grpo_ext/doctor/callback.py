"""`DoctorCallback`: the run doctor's checks during training, each finding warned once, and at the end the log it
checked, written to `<output_dir>/run_doctor_log.jsonl` (`DOCTOR_LOG`) for `trl-grpo-ext doctor`."""

import json
import logging
import os
import time

from transformers import TrainerCallback

from ..error_reports import cli_command
from .checks import CHECKS, Diagnosis, Finding, Run, diagnose, generation_accounting
from .series import Columns, training_rows

logger = logging.getLogger(__name__)

# the settings the checks' suggestions quote ("raise num_generations (now 4)")
# the share of the training time the checks may take: a log at which they have used more is only recorded, and checked
# at a later one (the checks scan the whole log, so a finding is then warned later with the same step and evidence)
BUDGET = 0.005
DOCTOR_LOG = "run_doctor_log.jsonl"  # in output_dir: the training rows the callback checked, a JSON object a line
SETTINGS = ("num_generations", "temperature", "learning_rate", "beta", "max_completion_length", "max_grad_norm",
            "per_device_train_batch_size", "use_vllm", "generation_compile", "generation_lora_merge")  # fmt: skip


def settings_of(args) -> dict:
    """The values of `SETTINGS` on a `GRPOConfig` (those it has)."""
    settings = {name: getattr(args, name) for name in SETTINGS if hasattr(args, name)}
    if settings.get("generation_lora_merge") == "none":
        settings["generation_lora_merge"] = None
    return settings


class DoctorCallback(TrainerCallback):
    """Run the run doctor's checks (`doctor.checks.CHECKS`) on the logged metrics at every log and warn once per
    finding (a `logging` warning of `trl_grpo_ext.doctor.callback`: what is wrong, the evidence, what to change).

    On with `GRPOConfig(run_doctor=True)` (the recipes set it), or added by hand:
    `GRPOTrainer(..., callbacks=[DoctorCallback()])` (then `generation_bound` and `memory` are skipped: the timings
    and memory they read are logged with `run_doctor`). Only the main process checks. A resumed run starts from the
    checkpoint's log. The checks take at most `BUDGET` (0.5%) of the training time: when a long log makes them cost
    more, some logs are only recorded and the findings come at a later one (with the same step and evidence). At the
    end of training the log is checked once more, written to `<output_dir>/run_doctor_log.jsonl` (`DOCTOR_LOG`; a
    run with `save_strategy="no"` and no recipe keeps no other log), and one line sums up the findings with the
    `trl-grpo-ext doctor` command that reads it.

    Args:
        checks: names in `CHECKS` to run (default: all).

    Attributes:
        findings: the findings warned so far, in order.
        seconds: time spent in the checks since the start, in seconds (`benchmarks/doctor/doctor_overhead.py`
            compares it with the step time).

    Raises:
        ValueError: a name in `checks` that is not a check.
    """

    def __init__(self, checks: list[str] | None = None):
        unknown = sorted(set(checks or ()) - set(CHECKS))
        if unknown:
            raise ValueError(f"checks: unknown run doctor check(s) {unknown}; known: {sorted(CHECKS)}")
        self.checks = list(checks) if checks else None
        self.columns = Columns()
        self.findings: list[Finding] = []
        self.seconds = 0.0
        self._settings: dict = {}
        self._start = time.perf_counter()
        self._unchecked = False  # rows recorded since the last check
        self._skipped: list = []  # the `Skip`s of the last check
        self._total = 0  # the checks the last check ran or skipped

    @property
    def rows(self) -> list[dict]:
        """The training rows logged so far."""
        return self.columns.rows

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._settings = settings_of(args)
        if model is not None:  # what `no_update` reads: 0 for a model trained frozen (a PEFT adapter, stock TRL)
            self._settings["trainable_parameters"] = sum(p.requires_grad for p in model.parameters())
        self.columns = Columns([dict(row) for row in training_rows(state.log_history)])  # a resumed run's earlier log
        self._start = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        start = time.perf_counter()
        row = {**logs, "step": state.global_step}
        if training_rows([row]):
            self.columns.append(row)
            self._unchecked = True
            if self.seconds <= BUDGET * (start - self._start):
                self._check()
        self.seconds += time.perf_counter() - start

    def _check(self, ended: bool = False) -> None:
        seen = {finding.key for finding in self.findings}
        diagnosis = diagnose(self.columns, self._settings, self.checks, ended=ended)
        self._skipped = diagnosis.skipped
        self._total = diagnosis.checks
        for finding in diagnosis.findings:
            if finding.key not in seen:
                self.findings.append(finding)
                logger.warning("run doctor: %s", finding.text())
        self._unchecked = False

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self._check(ended=True)  # the whole run: a state its last rows are in counts too
        write_log(self.rows, args.output_dir)
        verdict = Diagnosis(findings=self.findings, skipped=self._skipped, checks=self._total).verdict()
        skipped = (f"; skipped {', '.join(skip.check for skip in self._skipped)} (a metric not logged, or too few "
                   "steps)" if self._skipped else "")  # fmt: skip
        elapsed = time.perf_counter() - self._start
        generation = generation_accounting(Run(self.columns))
        logger.warning(
            "run doctor: %s over %d logged steps%s (the checks took %.3f s, %.2f%% of the training time); %s"
            "`%s doctor %s` prints the report, why each skipped check was skipped, and the dashboard",
            verdict, len(self.rows), skipped, self.seconds, 100 * self.seconds / max(elapsed, 1e-9),
            f"{generation}; " if generation else "", cli_command(), args.output_dir,
        )  # fmt: skip


def write_log(rows: list[dict], output_dir: str) -> str | None:
    """Write `rows` to `<output_dir>/DOCTOR_LOG`, one JSON object a line (the folder made if need be); returns the
    path, or None when it cannot be written (the end-of-run line still names the folder's other logs)."""
    path = os.path.join(output_dir, DOCTOR_LOG)
    try:
        os.makedirs(output_dir, exist_ok=True)
        with open(path, "w") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    except OSError as error:
        logger.warning("run doctor: could not write %s (%s)", path, error)
        return None
    return path
