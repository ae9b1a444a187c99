"""SIGTERM handled like Ctrl-C: a scheduler that stops a job (SLURM, Kubernetes, `timeout`) sends SIGTERM and, after
a grace period, SIGKILL. Python's default for SIGTERM ends the process at once, so a run stopped that way saved
nothing since its last scheduled checkpoint and said nothing.

While `GRPOTrainer.train` runs, `TerminationHandler` catches SIGTERM (in the main thread; elsewhere the default
stays): the optimizer step in progress finishes, a checkpoint of it is saved (a complete one, as any of ours), training
stops, and `train` raises `TrainingTerminated`, a `KeyboardInterrupt`, so a script stops as it does on Ctrl-C and the
entry points print one line with the command that resumes (`cli.errors.run`, exit code 143 = 128 + SIGTERM). The
grace period must cover the rest of one step and a save. Under several processes the request is the union over them
(one all-reduce of a flag per optimizer step), so every process saves the same step and stops there.
"""

import signal

import torch
from transformers import TrainerCallback


class TrainingTerminated(KeyboardInterrupt):
    """Training stopped on a signal (SIGTERM) after saving a checkpoint of its last step.

    Attributes:
        signal_number: the signal received (`signal.SIGTERM`).
        step: the last optimizer step done, whose checkpoint was saved.
    """

    def __init__(self, signal_number: int, step: int):
        super().__init__(signal_number, step)
        self.signal_number, self.step = signal_number, step


class TerminationHandler(TrainerCallback):
    """Catches SIGTERM during `install` ... `uninstall` and, at the end of the next optimizer step (over all
    processes: `accelerator`), asks transformers' loop to save a checkpoint and stop (`control.should_save`,
    `control.should_training_stop`). `received` is the signal number once one arrived on any process, else None."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.received: int | None = None
        self._local: int | None = None
        self._previous = None

    def install(self) -> bool:
        """Catch SIGTERM from now on; False (nothing changed) outside the main thread, where Python allows no
        handler."""
        try:
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        except ValueError:  # not the main thread
            return False
        return True

    def uninstall(self) -> None:
        """Put back the handler SIGTERM had before `install`."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_signal(self, number, frame) -> None:
        self._local = number

    def on_step_end(self, args, state, control, **kwargs):
        local = float(self._local or 0)
        if self.accelerator.num_processes > 1:  # every process stops at the same step, or their collectives hang
            local = self.accelerator.reduce(torch.tensor(local, device=self.accelerator.device), "max").item()
        if local:
            self.received = int(local)
            control.should_save = True
            control.should_training_stop = True
        return control
