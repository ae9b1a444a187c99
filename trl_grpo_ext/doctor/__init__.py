"""The run doctor: why a GRPO run is not learning, and what to change.

    `checks`      what a check returns (`Finding`, `Skip`), the registry of checks by name (`CHECKS`, filled by
                  the check modules below, which this package imports in the order of the report), `diagnose`
                  (runs them on a log)
    `learning`    the checks of whether the run learns: no signal (overall and per policy group), generation
                  groups too small for the pass rate, collapsed completions, truncation, format-only learning, a
                  reward plateau
    `stability`   entropy collapse and explosion, KL runaway, non-finite values, parameters that do not change,
                  gradient-norm spikes
    `resources`   fast generation that fell back or stopped being fast, generation-bound steps, CUDA memory
                  headroom
    `thresholds`  every threshold the checks use, with the source it comes from (`THRESHOLDS`)
    `series`      the logged rows as arrays: training rows, one metric's values, windows of steps, trends
    `run_dir`     a run folder's logs (`trainer_state.json` in it and in its checkpoints, the recipe's
                  `training_metrics.jsonl`) read into rows, with clear errors for a missing, partial or foreign run
    `dashboard`   one PNG of the run at a glance (`plot_dashboard`)
    `callback`    `DoctorCallback`: the checks during training, each finding warned once
    `config`      its setting, `run_doctor` (`RunDoctorFields`), its part of `GRPOConfig`
    `feature`     the trainer side (`GRPOConfig.run_doctor`): times generation and scoring, reads CUDA memory, adds the
                  callback

The command `trl-grpo-ext doctor RUN_DIR` runs the same checks on a finished or running output folder.
"""

from .callback import DoctorCallback
from .checks import CHECKS, Diagnosis, Finding, diagnose

# The check modules, in the order of the report: importing one registers its checks in `CHECKS` (`checks.check`).
# isort: off
from . import learning  # noqa: F401
from . import stability  # noqa: F401
from . import resources  # noqa: F401
# isort: on

__all__ = ["CHECKS", "Diagnosis", "DoctorCallback", "Finding", "diagnose"]
