"""How to run this package's `trl-grpo-ext` command from the current environment, for messages that tell a user what
to type (the run doctor's "run `trl-grpo-ext doctor RUN_DIR`"). Kept in the library core, not in `cli/`: the doctor's
callback runs inside `GRPOTrainer`, which imports nothing of the command line."""

import os
import shutil
import sys
from pathlib import Path


def cli_command() -> str:
    """How to run the `trl-grpo-ext` command from here: its name when it is on PATH, else the script beside this
    Python (a virtual environment not activated: `.venv/bin/trl-grpo-ext`, relative when under the working
    folder), else `python -m trl_grpo_ext.cli` with this Python."""
    if shutil.which("trl-grpo-ext"):
        return "trl-grpo-ext"
    script = Path(sys.executable).parent / "trl-grpo-ext"
    if script.is_file():
        relative = os.path.relpath(script)
        return relative if not relative.startswith("..") else str(script)
    return f"{sys.executable} -m trl_grpo_ext.cli"
