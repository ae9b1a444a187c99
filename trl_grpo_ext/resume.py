"""Exact resume: the training state TRL and transformers leave out of a checkpoint, and complete checkpoints.

A resumed GRPO run continues exactly as the uninterrupted one only if three things come back:

1. the prompt order: TRL's `RepeatSampler` draws a new permutation from one stateful generator each epoch, so a
   fresh sampler after a resume in epoch `e > 0` replays epoch 0's order (`EpochSeededSampler` fixes this);
2. the GRPO loop's own state: the micro-step counter and the buffered generations that are reused for
   `steps_per_generation * num_iterations` micro-steps, lost when a checkpoint falls inside a generation cycle;
3. the extension's own statistics (policy groups, controllers): saved with 2 by `save_resume_state`.

A checkpoint counts as complete once `MANIFEST_NAME` lists its files with their sizes; the manifest is written last
and atomically, so a process killed while saving leaves a checkpoint that `last_complete_checkpoint` skips.

A checkpoint at or past the run's last step (a finished job relaunched by a scheduler) is not trained on: transformers
would train one step more and overwrite the final checkpoint. `RunAlreadyComplete` ends such a resume early.

SIGTERM handled like Ctrl-C: a scheduler that stops a job (SLURM, Kubernetes, `timeout`) sends SIGTERM and, after
a grace period, SIGKILL. Python's default for SIGTERM ends the process at once, so a run stopped that way saved
nothing since its last scheduled checkpoint and said nothing.

While `GRPOTrainer.train` runs, `TerminationHandler` catches SIGTERM (in the main thread; elsewhere the default
stays): the optimizer step in progress finishes, a checkpoint of it is saved (a complete one, as any of ours), training
stops, and `train` raises `TrainingTerminated`, a `KeyboardInterrupt`, so a script stops as it does on Ctrl-C and the
entry points print one line with the command that resumes (`cli.errors.run`, exit code 143 = 128 + SIGTERM). The
grace period must cover the rest of one step and a save. Under several processes the request is the union over them
(one all-reduce of a flag per optimizer step), so every process saves the same step and stops there.
"""

import json
import logging
import os
import signal
from pathlib import Path

import torch
from torch.utils.data import Sampler
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .trl_contact import repeat_sampler_fields

logger = logging.getLogger(__name__)

MANIFEST_NAME = "trl_grpo_ext_manifest.json"
STATE_NAME = "trl_grpo_ext_state_rank{rank}.pt"
# transformers writes trainer_state.json last of its files: a checkpoint without our manifest (written by stock TRL)
# counts as complete when it has this file.
TRAINER_STATE_NAME = "trainer_state.json"


class RunAlreadyComplete(Exception):
    """The checkpoint being resumed is at or past the run's last step: raised where transformers has loaded its
    weights and trainer state and before anything is trained, logged or written, and caught by `GRPOTrainer.train`."""

    def __init__(self, checkpoint: str, global_step: int, max_steps: int):
        super().__init__(f"{checkpoint} is at step {global_step}, the run ends at step {max_steps}")
        self.checkpoint, self.global_step, self.max_steps = checkpoint, global_step, max_steps


class EpochSeededSampler(Sampler):
    """Wrap TRL's `RepeatSampler` so that epoch `e`'s prompt order depends on `e` alone, not on how many epochs this
    sampler object has iterated.

    `RepeatSampler` seeds one `torch.Generator` with `seed` at construction and draws a permutation per `__iter__`,
    so in an uninterrupted run epoch `e` gets the `(e+1)`-th draw, and a fresh sampler after a resume replays epoch
    0's order. Here each `__iter__` reseeds the generator and discards `epoch` draws first, then counts the epoch: an
    uninterrupted run gets TRL's orders bit for bit, and a resumed one gets them too once `epoch` is set to the epoch
    it resumes in (`set_epoch`, which transformers calls where the data loader forwards it, or by the trainer).
    """

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator, seed, num_samples, shuffle = repeat_sampler_fields(self.sampler)
        if shuffle and seed is not None:
            generator.manual_seed(seed)
            for _ in range(self.epoch):
                torch.randperm(num_samples, generator=generator)
        self.epoch += 1
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


def save_resume_state(checkpoint_dir: str, rank: int, state: dict) -> str:
    """Save this process's resume `state` (tensors, lists, numbers, strings) into `checkpoint_dir`; return the path."""
    path = os.path.join(checkpoint_dir, STATE_NAME.format(rank=rank))
    torch.save(state, path)
    return path


def load_resume_state(checkpoint_dir: str, rank: int) -> dict | None:
    """This process's resume state from `checkpoint_dir`, or None when the checkpoint has none (stock TRL's)."""
    path = os.path.join(checkpoint_dir, STATE_NAME.format(rank=rank))
    if not os.path.isfile(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def schema_state(owner: object, fields: tuple[str, ...]) -> dict:
    """The checkpoint of `owner`: its attributes named in `fields`, its checkpoint schema, by name.

    Raises:
        RuntimeError: `owner` has an attribute outside `fields`, which no checkpoint would hold (a resumed run would
            silently start it anew): add it to the schema, with the value a checkpoint without it loads with.
    """
    unsaved = sorted(set(vars(owner)) - set(fields))
    if unsaved:
        raise RuntimeError(
            f"{type(owner).__name__} has attributes outside its checkpoint schema, which a checkpoint would not hold: "
            f"{unsaved}; add each to the schema with the value a checkpoint without it loads with"
        )
    return {name: getattr(owner, name) for name in fields}


def schema_fields(owner: str, saved: dict, defaults: dict, required: tuple[str, ...] = ()) -> dict:
    """The fields of a checkpoint `saved` of `owner` (a class name, for the message) by the schema `required` +
    `defaults`: `saved`'s values, and for a field it lacks (a checkpoint written before the field existed) its value
    in `defaults` (name -> value).

    Raises:
        ValueError: `saved` lacks a `required` field, or holds a field the schema does not have (a checkpoint of
            another version of trl_grpo_ext); the message names them and the schema's fields. An unknown field is
            refused, not dropped: resuming without it would not be the run that was saved.
    """
    missing = [name for name in required if name not in saved]
    unknown = sorted(set(saved) - set(required) - set(defaults))
    if missing or unknown:
        problems = [
            f"{what} {names}" for what, names in (("lacks", missing), ("has unknown fields", unknown)) if names
        ]
        raise ValueError(
            f"this {owner} checkpoint does not fit this version of trl_grpo_ext: it {' and '.join(problems)} "
            f"(fields: {[*required, *defaults]})"
        )
    return defaults | saved


def write_manifest(checkpoint_dir: str) -> str:
    """List every file of `checkpoint_dir` with its size in bytes, atomically, as the checkpoint's last file."""
    root = Path(checkpoint_dir)
    files = {
        str(p.relative_to(root)): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME and not p.name.endswith(".tmp")
    }
    tmp = root / (MANIFEST_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST_NAME)
    return str(root / MANIFEST_NAME)


def checkpoint_problem(checkpoint_dir: str) -> str | None:
    """Why `checkpoint_dir` cannot be resumed from (a missing or truncated file, no manifest), or None if it can.

    trl_grpo_ext writes its state file first and the manifest last; a checkpoint with neither (written by stock TRL)
    passes when transformers' `trainer_state.json`, its last file, is there.
    """
    root = Path(checkpoint_dir)
    manifest = root / MANIFEST_NAME
    if not manifest.is_file():
        if any(root.glob(STATE_NAME.format(rank="*"))):
            return f"no {MANIFEST_NAME}: the save did not finish"
        if (root / TRAINER_STATE_NAME).is_file():
            return None
        return f"no {MANIFEST_NAME} and no {TRAINER_STATE_NAME}: the save did not finish"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as e:
        return f"unreadable {MANIFEST_NAME} ({e})"
    for name, size in files.items():
        path = root / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {size}"
    return None


def checkpoint_step(path: str | os.PathLike) -> int:
    """The global step a checkpoint folder was saved at (its `trainer_state.json`)."""
    with open(os.path.join(path, "trainer_state.json")) as f:
        return int(json.load(f)["global_step"])


def last_complete_checkpoint(output_dir: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest `checkpoint-N` folder of `output_dir` that `checkpoint_problem` accepts, and the newer ones skipped.

    Returns:
        `(path or None, [(skipped path, reason), ...])`, the skipped list newest first.
    """
    if not os.path.isdir(output_dir):
        return None, []
    steps = []
    for name in os.listdir(output_dir):
        prefix, _, step = name.rpartition("-")
        if prefix == PREFIX_CHECKPOINT_DIR and step.isdigit() and os.path.isdir(os.path.join(output_dir, name)):
            steps.append((int(step), os.path.join(output_dir, name)))
    skipped = []
    for _, path in sorted(steps, reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


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
