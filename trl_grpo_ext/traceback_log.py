"""A traceback kept in a file of the run folder, with what reproducing it needs (the command, the working folder, the
versions): `<output_dir>/error.log` of an error during training (`cli.errors.write_error_log`) and
`fast_generation_fallback.log` of the error fast generation fell back on (`generation.fallback`)."""

import os
import platform
import shlex
import sys
import time
import traceback
from pathlib import Path

VERSIONED_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate")


def versions() -> dict[str, str]:
    """What an error report needs to reproduce the run: python (and the platform), `VERSIONED_PACKAGES` ("not
    installed" for one missing), trl_grpo_ext, and the CUDA device ("none" without one). Never raises."""
    from importlib import metadata

    from . import __version__

    found = {"python": f"{platform.python_version()} ({platform.platform()})"}
    for name in VERSIONED_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["trl_grpo_ext"] = __version__
    try:
        import torch

        found["cuda device"] = "none"
        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(torch.cuda.current_device())
            found["cuda device"] = f"{name} (CUDA {torch.version.cuda})"
    except Exception as error:  # noqa: BLE001 - a broken CUDA state is reported, not raised over the error logged
        found["cuda device"] = f"unknown ({type(error).__name__}: {error})"
    return found


def write_traceback(path: Path, error: BaseException, heading: list[str]) -> Path | None:
    """Write `heading` (lines), the time, the command line, the working folder, `versions()` and the full traceback
    of `error` to `path`. Returns `path`, or None when it cannot be written (a full disk, a read-only folder): the
    error is reported either way."""
    header = [*heading, time.strftime("%Y-%m-%d %H:%M:%S %Z"), f"command: {shlex.join([sys.executable, *sys.argv])}",
              f"working folder: {os.getcwd()}", ""]  # fmt: skip
    header += [f"{name}: {value}" for name, value in versions().items()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(header) + "\n\n" + "".join(traceback.format_exception(error)))
    except OSError:
        return None
    return path
