"""Stopping on a signal without losing work: SIGTERM (a scheduler stopping a job: `timeout`, Slurm, Kubernetes, which
send SIGKILL after a grace period) and SIGINT (Ctrl-C), wherever they arrive.

Python's default for SIGTERM ends the process at once, without a word: a run stopped that way loses everything since
its last scheduled checkpoint (all of it with `save_strategy="no"`). Inside `stop_signals()` (the entry points around
everything they do, `GRPOTrainer.train` around training; the main thread only, as Python allows) both signals go
through one handler:

* while work that must not be cut short is under way (`finishing(what)`: an optimizer step and its checkpoint, the
  save of a model), the first signal prints one line at once, "SIGTERM received: stopping once <what>; send it again
  to stop now", and the work goes on; then `Stopped` is raised (or, in training, `TerminationHandler` asks
  transformers' loop to save a checkpoint at the end of the step and stop, and `train` raises `TrainingTerminated`);
* anywhere else (start-up, an evaluation) the first signal raises `Stopped` at once;
* a second signal raises `Stopped(at_once=True)` wherever it arrives, even mid-step or mid-save: checkpoints and
  saved models are written so that one cut short is never taken for complete (`checkpoints.MANIFEST_NAME`,
  `final_model`).

`Stopped` is a `KeyboardInterrupt`, so a script stops as on Ctrl-C, and the entry points print one line of what was
saved and what was not, with the command that resumes (`cli.errors.run`; exit code 128 + the signal: 143, 130).
Under several processes the request is the union over them at each optimizer step (one all-reduce of a flag), so
every process saves the same step and stops there.
"""

import contextlib
import os
import signal
import threading

import torch
from transformers import TrainerCallback

from .checkpoints import checkpoint_step, last_complete_checkpoint

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_name(number: int) -> str:
    """ "SIGTERM" for 15."""
    return signal.Signals(number).name


class Stopped(KeyboardInterrupt):
    """A stop signal ended what the process was doing.

    Attributes:
        signal_number: the signal (`signal.SIGTERM`, `signal.SIGINT`).
        at_once: a second signal stopped the process without waiting for the work under way.
        finished: what was completed before stopping (a first signal waited for it), e.g. "the model is saved in out";
            None when nothing was waited for.
        not_done: what the stop left undone, that a resumed run does (the evaluation); None: nothing named.
        output_dir: the run's folder, whose last complete checkpoint resumes it (None: not known).
        step: the last optimizer step completed (None: not known).
    """

    def __init__(self, signal_number: int, at_once: bool = False, *, finished: str | None = None,
                 not_done: str | None = None, output_dir: str | None = None, step: int | None = None,
                 message: str = ""):  # fmt: skip
        self.signal_number, self.at_once, self.finished, self.not_done = signal_number, at_once, finished, not_done
        self.output_dir, self.step = output_dir, step
        super().__init__(message or f"{signal_name(signal_number)}{' (a second one: at once)' if at_once else ''}")


class TrainingTerminated(Stopped):
    """Training stopped on a signal: after the step in progress, whose checkpoint was saved, or at once (a second
    signal, `at_once`). Its message names the signal, the step, the last complete checkpoint and how to resume.

    Attributes:
        checkpoint: the last complete checkpoint in `output_dir` (None: there is none).
    """

    def __init__(self, signal_number: int, step: int, output_dir: str, at_once: bool = False):
        self.checkpoint = last_complete_checkpoint(output_dir)[0]
        how = "at once, mid-step (a second signal)" if at_once else "after the step in progress"
        if self.checkpoint is None:
            saved = f"no complete checkpoint in {output_dir}: training starts over when run again"
        else:
            saved = (f"the last complete checkpoint is {self.checkpoint} (step {checkpoint_step(self.checkpoint)}); "
                     f"resume with trainer.train(resume_from_checkpoint=True), or the same command with "
                     f"--resume_from_checkpoint true")  # fmt: skip
        message = f"{signal_name(signal_number)} at step {step}: training stopped {how}; {saved}"
        super().__init__(signal_number, at_once, output_dir=output_dir, step=step, message=message)


class _SignalState:
    """The handler's state for this process: the first signal received (None: none yet), what is being finished
    (a stack: the innermost last), and the handlers `stop_signals` replaced."""

    def __init__(self):
        self.received: int | None = None
        self.finishing: list[str] = []
        self.depth = 0
        self.previous: dict[int, object] = {}
        self.training_started = False


_STATE = _SignalState()


def received() -> int | None:
    """The first stop signal received inside `stop_signals` (None: none), until the outermost block ends."""
    return _STATE.received


def training_started() -> bool:
    """Whether `GRPOTrainer.train` has been called inside the outermost `stop_signals` block."""
    return _STATE.training_started


def _say(line: str) -> None:
    """Write `line` on stderr from the signal handler: one write to the file descriptor (the handler may run while
    Python's own stderr object is mid-write); the main process only (`RANK` 0 or unset)."""
    if os.environ.get("RANK", "0") == "0":
        os.write(2, f"{line}\n".encode())


def _on_signal(number, frame) -> None:
    if _STATE.received is not None:  # a second signal: stop now, whatever is under way
        raise Stopped(number, at_once=True)
    _STATE.received = number
    if not _STATE.finishing:
        raise Stopped(number)
    _say(f"{signal_name(number)} received: stopping once {_STATE.finishing[-1]}; send it again to stop now")


@contextlib.contextmanager
def stop_signals():
    """Handle SIGINT and SIGTERM as this module says, inside the block (nested blocks share the outermost's handler;
    outside the main thread nothing changes). The signal state is cleared when the outermost block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _STATE.depth == 0:
        _STATE.previous = {number: signal.signal(number, _on_signal) for number in STOP_SIGNALS}
    _STATE.depth += 1
    try:
        yield
    finally:
        _STATE.depth -= 1
        if _STATE.depth == 0:
            for number, handler in _STATE.previous.items():
                signal.signal(number, handler)
            _STATE.__init__()


@contextlib.contextmanager
def finishing(what: str, done: str | None = None, output_dir: str | None = None, step: int | None = None,
              stop_after: bool = True):  # fmt: skip
    """Let the work of the block finish when a first stop signal arrives during it (`what` completes the line
    "stopping once <what>"); a second signal still stops at once.

    Args:
        what: the work, as the acknowledgement says it ("the model is saved").
        done: what is then saved, for `Stopped.finished` ("the model is saved in out"; default `what`).
        output_dir, step: the run's folder and step, for `Stopped`.
        stop_after: raise `Stopped` when the block ends if a signal arrived during it (not inside another
            `finishing` block, which decides); False: the caller stops by itself (training).

    Raises:
        Stopped: at the end of the block, for a first signal received during it.
    """
    start = _STATE.received
    _STATE.finishing.append(what)
    try:
        yield
    finally:
        _STATE.finishing.pop()
    if stop_after and not _STATE.finishing and start is None and _STATE.received is not None:
        raise Stopped(_STATE.received, finished=done or what, output_dir=output_dir, step=step)


def note_training_started() -> None:
    """Record that training began (`training_started`), for the entry points' line about a stop before it."""
    _STATE.training_started = True


class TerminationHandler(TrainerCallback):
    """At the end of each optimizer step, when a stop signal has arrived (on any process: `accelerator`), asks
    transformers' loop to save a checkpoint and stop (`control.should_save`, `control.should_training_stop`).
    `received` is the signal number once one arrived, else None."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.received: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        local = float(_STATE.received or 0)
        if self.accelerator.num_processes > 1:  # every process stops at the same step, or their collectives hang
            local = self.accelerator.reduce(torch.tensor(local, device=self.accelerator.device), "max").item()
        if local:
            self.received = int(local)
            control.should_save = True
            control.should_training_stop = True
        return control
