"""What this package tells a user about an error, kept apart from the features that meet it, so that no feature
imports another:

- a traceback kept in a file of the run folder with what reproducing it needs (the command, the working folder, the
  versions): `<output_dir>/error.log` of an error during training (`cli.errors.write_error_log`) and
  `fast_generation_fallback.log` of the error fast generation fell back on (`generation.fallback`);
- how to run the `trl-grpo-ext` command from the current environment, for messages that tell a user what to type
  (the run doctor's "run `trl-grpo-ext doctor RUN_DIR`"; the doctor's callback runs inside `GRPOTrainer`, which
  imports nothing of the command line);
- the optional packages of the extras (`EXTRAS`): a module that needs one imports it inside `needs_extra`, which
  fails with one line naming the pip command (`MissingDependencyError`, which the entry points print as one line);
- the words of fast generation's fall back and of its compile troubles, by key: the fast-generation feature warns
  with them (`generation.fallback`) and logs the key (`fast_generation/fell_back/<cause>`,
  `fast_generation/<trouble>`); the run doctor reads the key from the log and reports the same words
  (`doctor.resources.fast_generation`).
"""

import contextlib
import os
import platform
import shlex
import shutil
import sys
import time
import traceback
from pathlib import Path

VERSIONED_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate")
# module -> (its package on PyPI, the extra of pyproject.toml that installs it): what `pip install trl-grpo-ext` leaves
# out, for the GSM8K task, the plots, the QLoRA path and the offline SmolLM2 build (`trl-grpo-ext smollm2`)
EXTRAS = {"math_verify": ("math-verify", "gsm8k"), "matplotlib": ("matplotlib", "doctor"),
          "bitsandbytes": ("bitsandbytes", "qlora"), "gguf": ("gguf", "smollm2")}  # fmt: skip


class MissingDependencyError(ImportError):
    """A setting or a tool needs an optional package that is not installed; the message gives the pip command."""


@contextlib.contextmanager
def needs_extra(needed_by: str):
    """Around the imports of a module of `EXTRAS`: its absence becomes one line naming the extra to install.

    Raises:
        MissingDependencyError: a module of `EXTRAS` is not installed: "<needed_by> needs <package>, which is not
            installed: pip install 'trl-grpo-ext[<extra>]'". Any other import error passes unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in EXTRAS:
            raise
        package, extra = EXTRAS[error.name.split(".")[0]]
        raise MissingDependencyError(
            f"{needed_by} needs {package}, which is not installed: pip install 'trl-grpo-ext[{extra}]'"
        ) from error


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


# cause -> (what happened, in words; the setting to change). `fallback_cause` picks one from the error.
CAUSES = {
    "out_of_memory": (
        "the GPU ran out of memory",
        "generation_lora_merge='inplace' or 'none' (no generation copy on the GPU), or a smaller "
        "generation_max_prompt_length, max_completion_length or per_device_train_batch_size "
        "(`trl-grpo-ext memory --config ...` estimates each term)",
    ),
    "no_compiler": (
        "torch.compile could not build its kernels: no working compiler (on a GPU Triton builds its launcher with a "
        "C compiler and Python's headers, Python.h; on a CPU inductor needs a C++ compiler), as in slim Docker images "
        "and WSL",
        "install the compilers and Python's headers (Debian/Ubuntu: apt install build-essential python3-dev), or set "
        "generation_compile=False",
    ),
    "no_triton": (
        "Triton, which torch.compile needs on CUDA, is missing or too old",
        "pip install triton (on Windows: pip install triton-windows), or set generation_compile=False",
    ),
    "old_card": (
        "the GPU is older than Triton supports (CUDA compute capability 7.0, Volta, or newer)",
        "set generation_compile=False (generation_lora_merge still applies)",
    ),
    "compile_error": (
        "torch.compile failed on the decode step",
        "set generation_compile=False (generation_lora_merge still applies)",
    ),
    "other": (
        "the fast path raised an error",
        "set generation_compile=False and generation_lora_merge='none'",
    ),
}

COMPILE_TROUBLE = {
    "recompile_limit_hits": (
        "the compiled decode step hit torch's recompile limit, so it runs uncompiled from now on",
        "keep the shapes of generation fixed: generation_max_prompt_length at least the longest prompt, one "
        "generation batch size (an evaluation batch size equal to the training one)",
    ),
    "cudagraph_skips": (
        "the compiled decode step ran without its CUDA graph (TORCH_LOGS=cudagraphs says why)",
        "generation_max_prompt_length at least the longest prompt (a grown cache re-records the graph), or set "
        "generation_compile=False if it recurs",
    ),
}
