"""Complete checkpoints and the state TRL and transformers leave out of them.

A checkpoint counts as complete once `MANIFEST_NAME` lists its files with their sizes; the manifest is written last
and atomically, so a process killed while saving leaves a checkpoint that `last_complete_checkpoint` skips. Each
process's resume state (the GRPO loop's and every feature's, `GRPOTrainer.resumable_state`) is saved next to it
(`save_resume_state`), read back on resume (`load_resume_state`), and checked field by field against the schema of
the object that wrote it (`schema_state`, `schema_fields`).

A checkpoint at or past the run's last step (a finished job relaunched by a scheduler) is not trained on: transformers
would train one step more and overwrite the final checkpoint. `RunAlreadyComplete` ends such a resume early.
"""

import json
import logging
import os
from pathlib import Path

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

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
    write_json_atomically(root / MANIFEST_NAME, {"files": files})
    return str(root / MANIFEST_NAME)


def write_json_atomically(path: str | os.PathLike, content: dict, indent: int = 1) -> None:
    """`content` as JSON at `path`, atomically: a temporary file beside it, flushed to disk, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(content, f, indent=indent)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
