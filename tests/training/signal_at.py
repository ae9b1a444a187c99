"""Real signals at chosen points of a real GSM8K recipe run, where a timer from outside could not aim (the tiny model's
save takes milliseconds): `aim` wraps the function the run calls at that point so that it first sends this process
the signals (`os.kill`, delivered by the kernel; the recipe's handler runs before the call goes on). The tests use it
in-process (`aim(..., monkeypatch.setattr)`), and as a script, which runs the recipe as `python recipes/math_gsm8k.py`
does:

    python tests/training/signal_at.py POINT SIGNALS -- RECIPE ARGS...

POINT (`POINTS`): `build` (the trainer is being built: start-up), `last_step` (the last optimizer step begins), `save`
(the final model's weights are about to be written), `evaluation` (the end-of-run evaluation's first batch).
SIGNALS: e.g. `SIGTERM`, `SIGTERM,SIGTERM` (one after the other), or `SIGKILL_MID_WRITE`: at `save`, write the first
half of the weights file, as a process killed mid-write leaves it, then SIGKILL.
"""

import os
import runpy
import signal
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POINTS = ("build", "last_step", "save", "evaluation")


def send(*signals: int) -> Callable:
    """An action for `aim`: send this process `signals`, one after the other."""

    def act(*args, **kwargs):
        for number in signals:
            os.kill(os.getpid(), number)

    return act


def killed_mid_write(tensors, filename, *args, **kwargs) -> None:
    """An action for `aim` at `save`: the first half of the weights file written, then SIGKILL."""
    import safetensors.torch

    data = safetensors.torch.save(tensors)
    with open(filename, "wb") as f:
        f.write(data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)


def aim(point: str, act: Callable, patch: Callable = setattr) -> None:
    """Make the run call `act` once, at `point` (`POINTS`), with the arguments of the call it wraps; `patch(owner,
    name, value)` replaces the function (`setattr`, or pytest's `monkeypatch.setattr`)."""
    from trl_grpo_ext import GRPOTrainer
    from trl_grpo_ext.resume import termination

    done = []

    def wrap(function, when=lambda *args, **kwargs: True):
        def wrapped(*args, **kwargs):
            if not done and when(*args, **kwargs):
                done.append(True)
                act(*args, **kwargs)
            return function(*args, **kwargs)

        return wrapped

    if point == "build":
        patch(GRPOTrainer, "__init__", wrap(GRPOTrainer.__init__))
    elif point == "last_step":
        last = lambda self, *args, **kwargs: self.state.global_step == self.state.max_steps - 1  # noqa: E731
        patch(GRPOTrainer, "training_step", wrap(GRPOTrainer.training_step, last))
    elif point == "save":  # transformers writes every safetensors file through this name
        import transformers.modeling_utils as modeling_utils

        final = lambda tensors, filename, *args, **kwargs: (  # noqa: E731
            termination.training_started() and "checkpoint-" not in str(filename)
        )
        patch(modeling_utils, "safe_save_file", wrap(modeling_utils.safe_save_file, final))
    elif point == "evaluation":
        from trl_grpo_ext.gsm8k import evaluation

        patch(evaluation, "generate", wrap(evaluation.generate))
    else:
        raise ValueError(f"unknown point {point!r}; one of {POINTS}")


def main() -> None:
    point, names = sys.argv[1], sys.argv[2]
    if names == "SIGKILL_MID_WRITE":
        act = killed_mid_write
    else:
        act = send(*(signal.Signals[name] for name in names.split(",")))
    aim(point, act)
    sys.argv = [str(REPO / "recipes" / "math_gsm8k.py"), *sys.argv[sys.argv.index("--") + 1 :]]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
