"""Exact resume, and runs that keep their work when stopped.

A resumed GRPO run continues exactly as the uninterrupted one only if three things come back: the prompt order
(`sampler`: epoch e's order from e alone), the GRPO loop's own state (the micro-step counter and the buffered
generations reused for `steps_per_generation * num_iterations` micro-steps, lost when a checkpoint falls inside a
generation cycle) and the extension's statistics (policy groups, controllers), both saved per process next to each
checkpoint (`checkpoints`). A resume with another batch layout than the checkpoint's is refused (`layout`).

    `checkpoints`    complete checkpoints (a manifest written last), the resume state files and their schemas,
                     `RunAlreadyComplete` for a finished run relaunched
    `sampler`        `EpochSeededSampler`
    `layout`         the batch layout a checkpoint was written with, compared with the resumed run's
    `termination`    SIGTERM and Ctrl-C wherever they arrive: the work under way finished (a step and its checkpoint,
                     a model's save), one line at receipt, a second signal stops at once (`Stopped`,
                     `TrainingTerminated`, `stop_signals`, `finishing`, `TerminationHandler`)
    `saved_model`    a model saved so that one cut short is never taken for complete, and the step it was saved at
"""

from .checkpoints import (
    MANIFEST_NAME,
    STATE_NAME,
    TRAINER_STATE_NAME,
    RunAlreadyComplete,
    checkpoint_problem,
    checkpoint_step,
    last_complete_checkpoint,
    load_resume_state,
    save_resume_state,
    schema_fields,
    schema_state,
    write_json_atomically,
    write_manifest,
)
from .layout import LAYOUT_NAME, batch_layout, layout_problem, save_layout
from .sampler import EpochSeededSampler
from .saved_model import MODEL_MANIFEST_NAME, saved_model_step
from .termination import Stopped, TerminationHandler, TrainingTerminated, finishing, stop_signals

__all__ = [
    "LAYOUT_NAME",
    "MANIFEST_NAME",
    "MODEL_MANIFEST_NAME",
    "STATE_NAME",
    "TRAINER_STATE_NAME",
    "EpochSeededSampler",
    "RunAlreadyComplete",
    "Stopped",
    "TerminationHandler",
    "TrainingTerminated",
    "batch_layout",
    "checkpoint_problem",
    "checkpoint_step",
    "finishing",
    "last_complete_checkpoint",
    "layout_problem",
    "load_resume_state",
    "save_layout",
    "save_resume_state",
    "saved_model_step",
    "schema_fields",
    "schema_state",
    "stop_signals",
    "write_json_atomically",
    "write_manifest",
]
