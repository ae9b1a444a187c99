"""The command line's error handling, shared by its entry points (`trl-grpo-ext`, `recipes/math_gsm8k.py`,
`recipes/eval_gsm8k.py`): user errors as one line, the debug switch, "did you mean" for unknown config keys, and a
quiet start.

    def cli(argv: list[str] | None = None) -> int:
        return errors.run(_cli, sys.argv[1:] if argv is None else argv, prog="math_gsm8k.py")

* `run`: calls the entry point and turns a *user error* (`USER_ERRORS`: a value a config check rejects, a missing
  file, an unknown key) into one line on stderr, `<prog>: error: <what is wrong, with the value>: <the fix>`, exit
  code 1, or 2 for a `UsageError` (the command line or the config file). Any other exception is a bug and keeps its
  traceback. `FIXES` (by message) and `TYPE_FIXES` (by exception type) add the fix to messages that do not say it:
  TRL's own checks, a GSM8K data file.
* Debug switch: `--debug` anywhere on the command line, as a flag (`--debug VALUE` stays TrainingArguments' own
  `debug` option), or `TRL_GRPO_EXT_DEBUG=1` in the environment: user errors raise with their full traceback, and
  the start-up messages `quiet_start` hides are shown.
* `parse_command_line`: a `TrlParser` / `HfArgumentParser` parse whose unknown keys (in the `--config` YAML or on the
  command line) are a `UsageError` with "did you mean `policy_group_column`?" over the parser's fields.
* `quiet_start`: hides the known harmless start-up messages (`QUIET_WARNINGS`, `QUIET_LOGS`) in this process. Only an
  entry point calls it: importing this module, or any of the package, changes no warning filter or logger.
* `check_model_path` / `check_local_path`: a model or data path that does not exist, found before anything loads;
  `check_new_folder`: a folder a command writes a model into is new or empty.
* `training_errors`: around an entry point's training, saves the full traceback of an error raised after training
  started, and the versions (`versions`), to `<output_dir>/error.log`, which `run`'s one line names:
  `<prog>: error: <what is wrong> (full traceback: <output_dir>/error.log)`. Config-time errors stay one line.
"""

import ast
import contextlib
import dataclasses
import difflib
import logging
import os
import re
import shlex
import signal
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ..error_reports import VERSIONED_PACKAGES, versions, write_traceback  # noqa: F401 - re-exported
from ..gsm8k.data import DatasetFormatError
from .optional_dependencies import MissingDependencyError

DEBUG_ENV = "TRL_GRPO_EXT_DEBUG"
DEBUG_HELP = (
    f"--debug (or {DEBUG_ENV}=1): on an error, the full traceback instead of one line, and the start-up warnings "
    "this command hides."
)


class UsageError(ValueError):
    """A problem with the command line or the config file (an unknown command or key, a missing or unreadable config
    file); the entry point exits with code 2, as argparse does."""


# Exceptions that are the user's to fix: one line, no traceback (without the debug switch). TRL's and transformers'
# config checks raise ValueError, HfArgumentParser / TrlParser too for unknown arguments.
USER_ERRORS = (ValueError, FileNotFoundError, MissingDependencyError)


def _divisor_fix(match: re.Match) -> str:
    batch, groups = int(match[1]), int(match[2])
    divisors = [d for d in range(2, batch + 1) if batch % d == 0][:8]
    return (
        f"set num_generations to a divisor of {batch} ({', '.join(map(str, divisors))}), or make the generation "
        f"batch (per_device_train_batch_size x processes x steps_per_generation) a multiple of {groups}"
    )


# Messages of TRL's own checks that name the value but not the fix: pattern -> the fix, from the match.
FIXES: list[tuple[re.Pattern, Callable[[re.Match], str]]] = [
    (re.compile(r"generation_batch_size \((\d+)\) must be divisible by num_generations \((\d+)\)"), _divisor_fix),
    (
        re.compile(r"GRPO requires at least 2 generations per prompt"),
        lambda match: "set num_generations to 2 or more (each completion is scored against the others of its prompt)",
    ),
]

# The fix for errors whose message names the file and the problem but not what is expected there: type -> fix.
TYPE_FIXES = {
    DatasetFormatError: 'give --dataset_path a folder of GSM8K-format train.jsonl/test.jsonl ({"question": ..., '
    '"answer": "... #### N"} per line)',
}

# Known harmless warnings our entry points hide (category, regex matched at the start of the message).
QUIET_WARNINGS = [
    # transformers 5 renamed gradient checkpointing; TRL and the Trainer still use the old names.
    (FutureWarning, r"`(is_)?gradient_checkpointing\w*` is deprecated and will be removed in v6"),
]
# Known harmless log records our entry points drop: logger name -> regex matched at the start of the message.
QUIET_LOGS = {
    # bitsandbytes logs this (logger.warning, not a print) on CPUs with AVX512-BF16 when the optional `kernels`
    # package is missing; its own CPU code path is used instead. It logs it while it is imported (TRL -> PEFT ->
    # bitsandbytes), so the entry points set this filter before they import TRL (`trl_grpo_ext/__init__.py` imports
    # its classes on first use, and the recipes call `quiet_script_start` first).
    "bitsandbytes.backends.cpu.ops": r"Failed to load CPU gemm_4bit_forward from kernels-community",
}


class _DropMessages(logging.Filter):
    """A logging filter that drops the records whose message starts with `pattern`."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


_LOG_FILTERS = {name: _DropMessages(pattern) for name, pattern in QUIET_LOGS.items()}


def debug_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `TRL_GRPO_EXT_DEBUG` is set to a true value (1, true, yes, on)."""
    environ = os.environ if environ is None else environ
    return environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def pop_debug_flag(argv: Iterable[str]) -> tuple[list[str], bool]:
    """`argv` without the debug switch, and whether it was there.

    `--debug` is the switch when it is last or followed by another option; `--debug VALUE` and `--debug=VALUE` are
    left alone: they are TrainingArguments' own `debug` field (underflow_overflow, tpu_metrics_debug).
    """
    argv = list(argv)
    rest, found = [], False
    for i, arg in enumerate(argv):
        if arg == "--debug" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            found = True
        else:
            rest.append(arg)
    return rest, found


def quiet_start(debug: bool = False) -> None:
    """Hide `QUIET_WARNINGS` and `QUIET_LOGS` in this process; with `debug`, show them (undoing an earlier call's log
    filters). Calling it again changes nothing.

    Only entry points call it, first thing: the filters are the process's (`warnings.filterwarnings`, a
    `logging.Filter` on each logger of `QUIET_LOGS`). A record logged before the call, such as one a package logs
    while it is imported, has already been printed.
    """
    for name, log_filter in _LOG_FILTERS.items():
        logger = logging.getLogger(name)
        if debug:
            logger.removeFilter(log_filter)
        else:
            logger.addFilter(log_filter)  # a filter already there is not added twice
    if not debug:
        for category, message in QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)


def quiet_script_start(argv: Iterable[str] | None = None) -> None:
    """`quiet_start` for a script run as `__main__`, called before its imports of TRL (whose import chain logs
    bitsandbytes' CPU-kernel line): the debug switch is read from `argv` (default `sys.argv[1:]`) or the
    environment, and `argv` is left as it is (`run` takes the switch out later)."""
    quiet_start(pop_debug_flag(sys.argv[1:] if argv is None else argv)[1] or debug_from_env())


# where a stop signal found an entry point that trains, before its training began
BEFORE_TRAINING = " before training started: nothing was trained or saved; run the same command again"


def stop_while_starting(prog: str, trains: bool = False) -> None:
    """For a script run as `__main__`, called before its imports: SIGTERM or Ctrl-C during them prints `<prog>:
    stopped by SIGTERM` (with `trains`: "... before training started: nothing was trained or saved") and exits at
    once with 128 + the signal, as nothing is under way to keep. `run` replaces the handler with its own."""
    before = BEFORE_TRAINING if trains else ""

    def stop(number, frame):
        how = "interrupted" if number == signal.SIGINT else f"stopped by {signal.Signals(number).name}"
        os.write(2, f"{prog}: {how}{before}\n".encode())
        raise SystemExit(128 + number)  # out of the imports under way; Python prints nothing for it

    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, stop)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """The suffix ` (did you mean `close`?)` for the closest of `known` to `name` (difflib), or "" if none is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""


def unknown_names_message(where: str, kind: str, names: list[str], known: Iterable[str], fix: str) -> str:
    """`<where>: unknown <kind> `name` (did you mean `close`?)` for every name, then `; <fix>` unless every name has a
    close match."""
    known = sorted(known)
    suggestions = [did_you_mean(name, known) for name in names]
    parts = [f"`{name}`{suggestion}" for name, suggestion in zip(names, suggestions, strict=True)]
    message = f"{where}: unknown {kind}{'s' if len(names) > 1 else ''} {', '.join(parts)}"
    return message if all(suggestions) else f"{message}; {fix}"


def field_names(parser) -> set[str]:
    """The fields an `HfArgumentParser` (or `TrlParser`) fills: the names its `--config` YAML and options take."""
    return {f.name for dtype in parser.dataclass_types for f in dataclasses.fields(dtype) if f.init}


def _class_names(parser) -> str:
    return ", ".join(dtype.__name__ for dtype in parser.dataclass_types)


def config_path(argv: list[str]) -> str | None:
    """The path after `--config` in `argv`, as TrlParser reads it (None without one)."""
    if "--config" not in argv:
        return None
    index = argv.index("--config") + 1
    if index == len(argv):
        raise UsageError("--config needs a path: --config FILE.yaml")
    return argv[index]


def read_config_file(path: str, examples: str | None = None) -> dict:
    """The `--config` YAML at `path` as a mapping, before anything else reads it.

    Args:
        examples: where working configs are, for the message of a missing file (e.g. "recipes/configs/*.yaml").

    Raises:
        UsageError: naming the file and the problem (no such file, not valid YAML with the line and column, not a
            mapping).
    """
    if not Path(path).is_file():
        where = f"relative paths start at {os.getcwd()}" + (f"; working configs: {examples}" if examples else "")
        raise UsageError(f"--config {path}: no such file ({where})")
    import yaml

    try:
        config = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "cannot be parsed"
        raise UsageError(f"--config {path}: not valid YAML{line}: {problem}") from error
    if not isinstance(config, dict):
        raise UsageError(f"--config {path}: expected a YAML mapping of field: value, got {type(config).__name__}")
    return config


def check_config_file(parser, argv: list[str], examples: str | None = None) -> None:
    """Check the `--config` YAML of `argv` (if any) before anything reads it: `read_config_file`, and every key is a
    field of `parser` (or `env`, TrlParser's environment variables).

    Raises:
        UsageError: naming the file and the problem; an unknown key with the closest field name.
    """
    path = config_path(argv)
    if path is None:
        return
    config = read_config_file(path, examples)
    known = field_names(parser)
    unknown = [str(key) for key in config if key not in known and key != "env"]
    if unknown:
        fix = f"not a field of {_class_names(parser)} (--help lists them)"
        raise UsageError(unknown_names_message(path, "key", unknown, known, fix))


_UNUSED = re.compile(r"Some specified arguments are not used by the HfArgumentParser: (\[.*\])")


def parse_command_line(parser, argv: list[str], examples: str | None = None) -> tuple:
    """`parser`'s dataclasses from `argv`: `parse_args_and_config` for a TrlParser (after `check_config_file`),
    `parse_args_into_dataclasses` for an HfArgumentParser.

    Raises:
        UsageError: the config file's problems (`check_config_file`), or command-line options no field takes, with
            the closest option ("--max_stepz: did you mean `--max_steps`?").
        ValueError: a value a config class's checks reject (their message, unchanged).
    """
    from trl import TrlParser

    argv = list(argv)
    try:
        if isinstance(parser, TrlParser):
            check_config_file(parser, argv, examples)
            return parser.parse_args_and_config(argv)
        return parser.parse_args_into_dataclasses(argv)
    except UsageError:
        raise
    except ValueError as error:
        match = _UNUSED.match(str(error))
        if match is None:
            raise
        unused = [arg.split("=", 1)[0] for arg in ast.literal_eval(match[1]) if arg.startswith("--")]
        known = [f"--{name}" for name in field_names(parser)]
        fix = f"not a field of {_class_names(parser)} (--help lists them)"
        if not unused:  # only values: a value given to an option that takes none, or one value too many
            raise UsageError(f"command line: unexpected {ast.literal_eval(match[1])}; {fix}") from error
        raise UsageError(unknown_names_message("command line", "option", unused, known, fix)) from error


def looks_like_local_path(value: str) -> bool:
    """Whether `value` is meant as a local path rather than a Hub id ("name" or "namespace/name"): absolute, starting
    with `.` or `~`, with more than one `/`, or with a backslash."""
    return os.path.isabs(value) or value.startswith((".", "~")) or value.count("/") > 1 or "\\" in value


def check_local_path(field: str, value: str | None, fix: str) -> None:
    """Raise when `value` is meant as a local path (`looks_like_local_path`) and nothing is there.

    Raises:
        FileNotFoundError: "<field>='<value>': no such file or folder; <fix>".
    """
    if value is not None and looks_like_local_path(value) and not Path(value).expanduser().exists():
        raise FileNotFoundError(f"{field}={value!r}: no such file or folder; {fix}")


def check_new_folder(output_dir: Path, force: bool) -> None:
    """Before a command writes a model into `output_dir`: a new or empty folder, or any folder with `force`.

    Raises:
        ValueError: `output_dir` is a file, or a folder that is not empty without `force`.
    """
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"{output_dir} is a file: give a folder to write the model into")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not force:
        raise ValueError(
            f"{output_dir} is not empty: give a new or empty folder, or pass --force to write the model into it"
        )


def check_model_path(field: str, value: str | None) -> None:
    """Before anything loads: `value` (a model, checkpoint or LoRA adapter) is a Hub id, or a folder with a
    `config.json` or `adapter_config.json`.

    Raises:
        FileNotFoundError: a local path with nothing there.
        ValueError: a file, or a folder with neither file (its `checkpoint-*` subfolders named, for a run folder).
    """
    fix = "give a model, checkpoint or LoRA adapter folder, or a Hub id such as Qwen/Qwen2.5-0.5B-Instruct"
    check_local_path(field, value, fix)
    path = Path(value).expanduser() if value is not None else None
    if path is None:
        return
    if not path.exists():
        check_hub_model(field, value)
        return
    if not path.is_dir():
        raise ValueError(f"{field}={value!r} is a file; {fix}")
    if not ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()):
        steps = sorted(int(p.name[11:]) for p in path.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit())
        seen = f"; it has checkpoints (latest: checkpoint-{steps[-1]}): pass one of them" if steps else f"; {fix}"
        raise ValueError(f"{field}={value!r}: no config.json or adapter_config.json in this folder{seen}")


HUB_TIMEOUT = 10  # seconds the Hub may take to answer whether a model exists


def check_hub_model(field: str, repo_id: str) -> None:
    """Before anything loads: a Hub id not in the local Hugging Face cache can be downloaded. One request to the Hub
    (`HUB_TIMEOUT` s at most), so that an unreachable Hub, a missing or gated model is one line at once rather than a
    traceback after transformers' retries.

    Raises:
        ValueError: the model is not cached and `HF_HUB_OFFLINE` is set, the Hub cannot be reached, has no such
            model, or gates it.
    """
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if any(isinstance(huggingface_hub.try_to_load_from_cache(repo_id, name), str)
           for name in ("config.json", "adapter_config.json")):  # fmt: skip
        return
    local = "download it on a machine with internet (`hf download " + repo_id + "`) and pass its folder"
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"{field}={repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: {local}"
        )
    try:
        huggingface_hub.model_info(repo_id, timeout=HUB_TIMEOUT)
    except GatedRepoError:
        raise ValueError(f"{field}={repo_id!r} is gated on the Hub: accept its terms on its page and log in "
                         "(`hf auth login`), or pass a local folder") from None  # fmt: skip
    except RepositoryNotFoundError:
        raise ValueError(f"{field}={repo_id!r}: no such model on the Hub (nor a local folder); check the name, or log "
                         "in (`hf auth login`) for a private one") from None  # fmt: skip
    except Exception as error:  # noqa: BLE001 - any transport error (DNS, refused, timeout, proxy) is the same fix
        reason = " ".join(str(error).split()) or type(error).__name__
        raise ValueError(f"{field}={repo_id!r} is not a local folder, not in the Hugging Face cache, and the Hub "
                         f"cannot be reached ({reason}): {local}") from None  # fmt: skip


def one_line(error: BaseException) -> str:
    """The message of `error` on one line, with its fix from `FIXES` or `TYPE_FIXES` when the message lacks it."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        message = f"{error.filename}: {error.strerror}"  # not "[Errno 2] No such file or directory: '...'"
    else:
        message = str(error) or type(error).__name__
    message = " ".join(message.split())
    fix = next((make(match) for pattern, make in FIXES if (match := pattern.search(message))), None)
    fix = fix or next((hint for kind, hint in TYPE_FIXES.items() if isinstance(error, kind)), None)
    return f"{message.rstrip('.')}: {fix}" if fix else message


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or a stop signal during training, raised by an entry point from the `KeyboardInterrupt` that ended
    `train` (a `resume.TrainingTerminated`, or a plain one), so that `run` can say where the run stopped, which
    checkpoint is complete and the command that resumes from it.

    Args:
        output_dir: the run's output folder.
        step: the last optimizer step completed.
        interrupt: what ended training: its `signal_number` (SIGINT when it has none) and `at_once`.
    """

    def __init__(self, output_dir: str, step: int, interrupt: BaseException | None = None):
        super().__init__(output_dir, step)
        self.output_dir, self.step = output_dir, step
        self.signal_number = getattr(interrupt, "signal_number", signal.SIGINT)
        self.at_once = getattr(interrupt, "at_once", False)


def script_command(script: str) -> list[str]:
    """The start of the command that runs `script` (an entry point's `__file__`) again: the interpreter that runs
    it (a venv's, relative to the working folder when under it) and the script, relative when inside it."""
    relative = os.path.relpath(script)
    python = os.path.relpath(sys.executable)  # as the doctor's hint does
    python = python if not python.startswith("..") and os.sep in python else "python"
    return [python, script if relative.startswith("..") else relative]


def resume_command(command: list[str], argv: list[str]) -> str:
    """`command` with `argv`, any `--resume_from_checkpoint VALUE` (or `=VALUE`) replaced by
    `--resume_from_checkpoint true`, as one shell line."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume_from_checkpoint":
            skip = True
        elif not arg.startswith("--resume_from_checkpoint="):
            kept.append(arg)
    return shlex.join([*command, *kept, "--resume_from_checkpoint", "true"])


def checkpoint_hint(output_dir: str, command: list[str], argv: list[str], verb: str = "resume with") -> str:
    """ "the last complete checkpoint is <path> (step N); resume with: <command>", or that `output_dir` holds none."""
    from ..resume import checkpoint_step, last_complete_checkpoint

    path, _ = last_complete_checkpoint(output_dir)
    if path is None:
        return (f"no complete checkpoint in {output_dir} (save_strategy / save_steps set when one is written): run "
                "the same command again to start over")  # fmt: skip
    return (f"the last complete checkpoint is {path} (step {checkpoint_step(path)}); {verb}: "
            f"{resume_command(command, argv)}")  # fmt: skip


def stop_line(prog: str, stop: BaseException, argv: list[str], command: list[str], trains: bool) -> str:
    """The one line an entry point prints when a stop signal or Ctrl-C ended it (`resume.termination`): how
    (interrupted, stopped by SIGTERM, at once by a second signal), where (before training, at step N, after
    training), what was saved and what was not, and the command that resumes or finishes the run."""
    from ..resume import termination

    number = getattr(stop, "signal_number", signal.SIGINT)
    how = "interrupted" if number == signal.SIGINT else f"stopped by {termination.signal_name(number)}"
    how += " at once (a second signal)" if getattr(stop, "at_once", False) else ""
    output_dir, step = getattr(stop, "output_dir", None), getattr(stop, "step", None)
    if output_dir is None:
        if trains and not termination.training_started():
            return f"{prog}: {how}{BEFORE_TRAINING}"
        return f"{prog}: {how}"
    finished = getattr(stop, "finished", None)
    if finished is None:  # in training
        return f"{prog}: {how} at step {step}; {checkpoint_hint(output_dir, command, argv)}"
    not_done = getattr(stop, "not_done", None)
    left = f"not done: {not_done}; {checkpoint_hint(output_dir, command, argv, 'to finish it')}" if not_done else (
        checkpoint_hint(output_dir, command, argv))  # fmt: skip
    return f"{prog}: {how} after training (step {step}): {finished}; {left}"


ERROR_LOG = "error.log"  # in the run's output_dir: the traceback of an error raised after training started


def write_error_log(output_dir: str, error: BaseException) -> Path | None:
    """Write `<output_dir>/ERROR_LOG` (`write_traceback`). The main process (`RANK` 0 or unset) writes `error.log`,
    process k `error.log.<k>`, so that an error raised on one process only keeps its traceback too. Returns the
    file's path, or None when it cannot be written."""
    rank = os.environ.get("RANK", "0")
    return write_traceback(Path(output_dir) / (ERROR_LOG if rank == "0" else f"{ERROR_LOG}.{rank}"), error, [])


def raised_in_training(error: BaseException) -> bool:
    """Whether `error` was raised inside transformers' training loop, after the model, data and optimizer were set
    up (`trl_contact.raised_in_training_loop`)."""
    from ..trl_contact import raised_in_training_loop

    return raised_in_training_loop(error)


@contextlib.contextmanager
def training_errors(output_dir: str, *, started: bool = False):
    """Save the full traceback of an error raised after training started to `<output_dir>/error.log`
    (`write_error_log`), for the entry point's one line (`run`) to name.

    An error raised inside transformers' training loop (`raised_in_training`) counts, or, with `started`, any error
    raised inside the block (the recipe's saving and evaluation after training). It is re-raised unchanged, with the
    log's path as its `error_log` attribute and a note (`add_note`) that ends its printed traceback. Other errors (a
    config check, a model that does not load) and Ctrl-C pass through as they are.
    """
    try:
        yield
    except Exception as error:
        if started or raised_in_training(error):
            path = write_error_log(output_dir, error)
            if path is not None:
                error.error_log = str(path)
                error.add_note(f"full traceback and versions: {path}")
        raise


def _reward_name(name: str) -> str:
    """`reward function 'name'`, or the words `raising_reward_function` gives when it found none."""
    return name if name == "a reward function" else f"reward function {name!r}"


def run(entry: Callable[[list[str]], int | None], argv: Iterable[str], prog: str, *, debug: bool = False,
        command: list[str] | None = None, trains: bool = False) -> int:  # fmt: skip
    """Run `entry(argv)` (the debug switch taken out of `argv`) after `quiet_start`, with SIGTERM and Ctrl-C handled
    as `resume.termination` says (`stop_signals`), and return its exit code (0 for None). A user error
    (`USER_ERRORS`) prints `<prog>: error: <one_line(error)>` on stderr and returns 2 for a `UsageError`, else 1;
    with the debug switch (`--debug` in `argv`, `debug`, or `TRL_GRPO_EXT_DEBUG=1`) it is raised instead, with its
    traceback. An error raised in a reward function (the user's code; marked by the trainer) is one too: `reward
    function 'name' raised <type> at step N: <message>`. Other exceptions are raised. A stop signal or Ctrl-C
    (`KeyboardInterrupt`) prints one line (`stop_line`) and returns 128 + the signal (130 for SIGINT, 143 for
    SIGTERM). An error raised after training started (`training_errors`) names the file holding its traceback
    instead of `--debug`, and the last complete checkpoint with the command that resumes from it (a bug's traceback
    ends with them).

    Args:
        command: the start of the command that runs this entry point again (`script_command(__file__)`, or
            `["trl-grpo-ext", "grpo"]`), for the resume hints; default `[prog]`.
        trains: the entry point trains: a stop before training says that nothing was trained or saved.
    """
    from ..resume import stop_signals

    argv, flag = pop_debug_flag(argv)
    debug = debug or flag or debug_from_env()
    command = command or [prog]
    quiet_start(debug)
    try:
        with stop_signals():
            code = entry(argv)
    except KeyboardInterrupt as interrupt:  # Ctrl-C, SIGTERM: one line (the main process's), what is saved, how on
        if debug:
            raise
        if os.environ.get("RANK", "0") == "0":
            print(stop_line(prog, interrupt, argv, command, trains), file=sys.stderr, flush=True)
        return 128 + getattr(interrupt, "signal_number", signal.SIGINT)  # as a shell reports it: 130, 143
    except Exception as error:
        reward = getattr(error, "reward_function", None)  # raised in a reward function: the user's code
        log = getattr(error, "error_log", None)  # raised after training started (`training_errors`)
        if debug or not (isinstance(error, USER_ERRORS) or reward):  # a bug: its traceback, the log, how to resume
            if log and not debug:
                error.add_note(checkpoint_hint(os.path.dirname(log), command, argv))
            raise
        hint = "" if isinstance(error, UsageError) else " (run with --debug for the traceback)"
        if log:
            hint = f" (full traceback: {log}); {checkpoint_hint(os.path.dirname(log), command, argv)}"
        message = one_line(error)
        if reward:
            message = f"{_reward_name(reward)} raised {type(error).__name__} at step {error.step}: {message}"
        print(f"{prog}: error: {message}{hint}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    return 0 if code is None else code
