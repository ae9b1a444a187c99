"""A saved model that a save cut short is never taken for: `GRPOTrainer.save_model` writes into a staging folder
beside its files (`STAGING_NAME`) and moves each finished file into place with `os.replace` (atomic on one file
system), so a save stopped mid-write (a second stop signal, SIGKILL after a scheduler's grace period, a full disk)
leaves no partial `model.safetensors` where the model is looked for. A save that is not a checkpoint's then writes
`MODEL_MANIFEST_NAME` (the files, their sizes and the training step) last, atomically: `saved_model_step` reads the
step of a complete save back, for a requeued run to know whether the final model is still owed.
"""

import json
import os
import re
import shutil
from pathlib import Path

from .checkpoints import write_json_atomically

STAGING_NAME = ".trl_grpo_ext_saving"
MODEL_MANIFEST_NAME = "trl_grpo_ext_model.json"
# The weight files of a save (full, sharded or an adapter; safetensors or torch): those a new save does not write are
# removed, so that no stale shard of an earlier save is loaded with the new files.
_WEIGHT_FILE = re.compile(
    r"(?:model|pytorch_model|adapter_model)(?:-\d+-of-\d+)?\.(?:safetensors|bin)(?:\.index\.json)?"
)


def clear_staging(output_dir: str | os.PathLike) -> None:
    """Remove what a save cut short left in `output_dir`'s staging folder (the save creates the folder again)."""
    staging = Path(output_dir) / STAGING_NAME
    if staging.exists():
        shutil.rmtree(staging)


def move_into_place(output_dir: str | os.PathLike, step: int | None) -> list[str]:
    """Move every file and folder of `output_dir`'s staging folder into `output_dir` (`os.replace`, each atomic),
    after removing the folder's earlier model manifest and the weight files the new save does not have; then remove
    the staging folder and, when `step` is given, write `MODEL_MANIFEST_NAME` last. Returns the names moved."""
    root = Path(output_dir)
    staging = root / STAGING_NAME
    names = sorted(p.name for p in staging.iterdir())
    (root / MODEL_MANIFEST_NAME).unlink(missing_ok=True)
    for path in root.iterdir():
        if path.is_file() and _WEIGHT_FILE.fullmatch(path.name) and path.name not in names:
            path.unlink()
    for name in names:
        target = root / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(staging / name, target)
    staging.rmdir()
    if step is not None:
        write_json_atomically(root / MODEL_MANIFEST_NAME, {"global_step": step, "files": _sizes(root, names)})
    return names


def saved_model_step(output_dir: str | os.PathLike) -> int | None:
    """The training step of the model saved in `output_dir` when that save is complete (its manifest there, every
    file it lists with its size); None otherwise."""
    root = Path(output_dir)
    try:
        manifest = json.loads((root / MODEL_MANIFEST_NAME).read_text())
        files, step = manifest["files"], int(manifest["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    complete = all((root / name).is_file() and (root / name).stat().st_size == size for name, size in files.items())
    return step if complete else None


def _sizes(root: Path, names: list[str]) -> dict[str, int]:
    """Each file under the entries `names` of `root` (relative path -> bytes)."""
    sizes = {}
    for name in names:
        path = root / name
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file():
                sizes[str(file.relative_to(root))] = file.stat().st_size
    return sizes
