"""User errors at the entry points (recipes, `trl-grpo-ext`): one line naming the value and the fix, a non-zero exit
code, no traceback unless the debug switch is on, checks before any model is loaded, and a quiet start."""

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.training.test_recipes import load_recipe
from trl_grpo_ext import cli, error_reports
from trl_grpo_ext.cli import errors
from trl_grpo_ext.gsm8k.data import DatasetFormatError

DEMO = str(REPO_ROOT / "recipes/configs/demo_cpu.yaml")
MISSING_MODEL_FIX = "give a model, checkpoint or LoRA adapter folder, or a Hub id"


@pytest.fixture(autouse=True)
def no_debug_env(monkeypatch):
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)


@pytest.fixture
def grpo_config(tmp_path):
    """A `trl-grpo-ext grpo` YAML whose model folder passes the path check (a config.json) and whose data exists."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"prompt": "1+1?"}\n')
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"model_name_or_path: {tmp_path / 'model'}\ndataset_name: {tmp_path / 'data'}\nnum_generations: 4\n"
        f"per_device_train_batch_size: 4\noutput_dir: {tmp_path / 'out'}\nuse_cpu: true\nbf16: false\n"
        "report_to: none\n"
    )
    return config


def run_recipe(argv):
    return load_recipe("math_gsm8k").cli(argv)


def run_grpo(argv):
    return cli.main(["grpo", *argv])


def error_line(capsys) -> str:
    """The one line an entry point printed on stderr (asserting there is exactly one and no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def typo_config(path: Path, base: str) -> str:
    path.write_text(Path(base).read_text() + "\npolicy_group_colum: task\n")
    return str(path)


# case -> (argv of the recipe, argv of `trl-grpo-ext grpo` after its --config, exit code, parts of the line: the
# first from the exception's own message, the others the fix added to it)
CASES = {
    "missing config": (
        ["--config", "does_not_exist.yaml"],
        ["--config", "does_not_exist.yaml"],
        2,
        ["--config does_not_exist.yaml: no such file (relative paths start at"],
    ),
    "unknown option": (
        ["--config", DEMO, "--max_stepz", "3"],
        ["--max_stepz", "3"],
        2,
        ["command line: unknown option `--max_stepz` (did you mean `--max_steps`?)"],
    ),
    "num_generations does not divide": (
        ["--config", DEMO, "--num_generations", "3"],
        ["--num_generations", "3"],
        1,
        ["must be divisible by num_generations (3)", "(3): set num_generations to a divisor of", "a multiple of 3"],
    ),
    "one generation": (
        ["--config", DEMO, "--num_generations", "1"],
        ["--num_generations", "1"],
        1,
        ["You provided 1", "set num_generations to 2 or more"],
    ),
    "missing model": (
        ["--config", DEMO, "--tiny_model", "false", "--model_name_or_path", "/no/such_model"],
        ["--model_name_or_path", "/no/such_model"],
        1,
        [f"model_name_or_path='/no/such_model': no such file or folder; {MISSING_MODEL_FIX}"],
    ),
}


@pytest.mark.parametrize("entry", ["recipe", "grpo"])
@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line_and_debug_raises(capsys, tmp_path, grpo_config, entry, case):
    recipe_argv, grpo_argv, code, parts = CASES[case]
    if entry == "recipe":
        run, argv, prog = run_recipe, [*recipe_argv, "--output_dir", str(tmp_path / "out")], "math_gsm8k.py"
    else:
        if "--config" not in grpo_argv:
            grpo_argv = ["--config", str(grpo_config), *grpo_argv]
        run, argv, prog = run_grpo, grpo_argv, "trl-grpo-ext grpo"
    assert run(argv) == code
    line = error_line(capsys)
    assert line.startswith(f"{prog}: error: {parts[0] if code == 2 else ''}"), line
    assert all(part in line for part in parts), line
    assert line.endswith("(run with --debug for the traceback)") == (code == 1), line
    with pytest.raises(errors.USER_ERRORS, match=re.escape(parts[0])):
        run([*argv, "--debug"])  # the switch: the exception itself, which Python prints with its traceback
    assert not (tmp_path / "out" / "tiny-model").exists()  # every check ran before a model was built


def test_num_generations_fix_lists_the_divisors(capsys, grpo_config):
    # The demo's batch: 16 completions per generation; grpo_config's: 4.
    assert run_recipe(["--config", DEMO, "--num_generations", "3"]) == 1
    expected = "generation_batch_size (16) must be divisible by num_generations (3): set num_generations to a divisor"
    assert f"{expected} of 16 (2, 4, 8, 16)" in error_line(capsys)
    assert run_grpo(["--config", str(grpo_config), "--num_generations", "3"]) == 1
    assert "divisor of 4 (2, 4)" in error_line(capsys)


@pytest.mark.parametrize("entry", ["recipe", "grpo"])
def test_yaml_typo_gets_did_you_mean(capsys, tmp_path, grpo_config, entry):
    base = DEMO if entry == "recipe" else str(grpo_config)
    config = typo_config(tmp_path / "typo.yaml", base)
    assert (run_recipe if entry == "recipe" else run_grpo)(["--config", config]) == 2
    line = error_line(capsys)
    assert line.endswith(f"error: {config}: unknown key `policy_group_colum` (did you mean `policy_group_column`?)")


def test_option_that_starts_a_field_name_is_not_taken_for_it(capsys):
    # argparse would read --policy_group_colum as --policy_group_column (allow_abbrev): a typo silently accepted.
    assert run_recipe(["--config", DEMO, "--policy_group_colum", "task"]) == 2
    assert "unknown option `--policy_group_colum` (did you mean `--policy_group_column`?)" in error_line(capsys)


def test_unknown_key_without_a_close_match_says_where_the_fields_are(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(Path(DEMO).read_text() + "\nfrobnicate: 1\n")
    assert run_recipe(["--config", str(config)]) == 2
    line = error_line(capsys)
    assert "unknown key `frobnicate`; not a field of GSM8KScriptArguments, GRPOConfig, ModelConfig" in line, line


def test_config_that_is_not_yaml_is_one_line(capsys, tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text("num_generations: 4\n  beta: [0.0\n")
    assert run_recipe(["--config", str(config)]) == 2
    assert f"error: --config {config}: not valid YAML at line 2" in error_line(capsys)


def test_empty_dataset_folder_names_the_file_and_the_fix(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    argv = ["--config", DEMO, "--dataset_path", str(tmp_path / "empty"), "--output_dir", str(tmp_path / "out")]
    assert run_recipe(argv) == 1
    line = error_line(capsys)
    assert f"{tmp_path / 'empty' / 'train.jsonl'}: file not found" in line
    assert "give --dataset_path a folder of GSM8K-format train.jsonl/test.jsonl" in line
    assert not (tmp_path / "out" / "tiny-model").exists()
    with pytest.raises(DatasetFormatError):
        run_recipe([*argv, "--debug"])


def test_grpo_missing_dataset_fails_before_the_model(capsys, tmp_path, grpo_config):
    missing = str(tmp_path / "no_such_dataset")
    assert run_grpo(["--config", str(grpo_config), "--dataset_name", missing]) == 1
    assert f"error: dataset_name='{missing}': no such file or folder; give a Hub dataset id" in error_line(capsys)


def test_unknown_command_suggests_and_prints_usage(capsys):
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [cli.USAGE, "trl-grpo-ext: error: unknown command 'frobnicate'"], err
    assert cli.main(["tiny_model", "out"]) == 2
    assert "unknown command 'tiny_model' (did you mean `tiny-model`?)" in capsys.readouterr().err


def test_export_is_a_command():
    assert "export" in cli.COMMANDS and "export" in cli.USAGE


def test_tiny_model_refuses_a_folder_that_is_not_empty(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    assert cli.main(["tiny-model", str(tmp_path)]) == 1
    line = error_line(capsys)
    assert f"trl-grpo-ext tiny-model: error: {tmp_path} is not empty: " in line and "pass --force" in line
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert cli.main(["tiny-model", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "config.json").is_file() and (tmp_path / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize("problem", ["missing", "empty run folder"])
def test_eval_with_a_missing_model_or_run_folder(capsys, tmp_path, problem):
    model = tmp_path / "run"
    if problem != "missing":
        (model / "checkpoint-10").mkdir(parents=True)
        (model / "checkpoint-200").mkdir()
    argv = ["--model_name_or_path", str(model), "--dataset_path", str(tmp_path / "no_data")]
    eval_recipe = load_recipe("eval_gsm8k")
    assert eval_recipe.cli(argv) == 1
    line = error_line(capsys)  # the model is checked first: the missing data folder is not what it says
    expected = {
        "missing": f"eval_gsm8k.py: error: model_name_or_path='{model}': no such file or folder; {MISSING_MODEL_FIX}",
        "empty run folder": "no config.json or adapter_config.json in this folder; it has checkpoints (latest: "
        "checkpoint-200): pass one of them",
    }[problem]
    assert expected in line, line
    with pytest.raises((FileNotFoundError, ValueError)):
        eval_recipe.cli([*argv, "--debug"])


def test_eval_unknown_option(capsys):
    assert load_recipe("eval_gsm8k").cli(["--model_name_or_path", "m", "--max_new_tokenz", "3"]) == 2
    assert "unknown option `--max_new_tokenz` (did you mean `--max_new_tokens`?)" in error_line(capsys)


def test_bugs_keep_their_traceback():
    def buggy(argv):
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        errors.run(buggy, [], prog="x")


@pytest.mark.parametrize(
    ("argv", "rest", "debug"),
    [
        (["--config", "c.yaml", "--debug"], ["--config", "c.yaml"], True),
        (["--debug", "--config", "c.yaml"], ["--config", "c.yaml"], True),
        (["--debug", "underflow_overflow"], ["--debug", "underflow_overflow"], False),  # TrainingArguments' field
        (["--debug=tpu_metrics_debug"], ["--debug=tpu_metrics_debug"], False),
    ],
)
def test_debug_flag(argv, rest, debug):
    assert errors.pop_debug_flag(argv) == (rest, debug)


def test_debug_env(monkeypatch):
    monkeypatch.setenv(errors.DEBUG_ENV, "1")
    with pytest.raises(ValueError, match="You provided 1"):
        run_recipe(["--config", DEMO, "--num_generations", "1"])


GC_WARNING = (
    "`gradient_checkpointing` is deprecated and will be removed in v6. Use `activation_checkpointing` instead."
)
BNB_MESSAGE = "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already `pip ..."


@pytest.mark.parametrize("debug", [False, True])
def test_quiet_start_hides_only_the_known_messages(debug):
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            errors.quiet_start(debug)
            warnings.warn(GC_WARNING, FutureWarning, stacklevel=1)
            warnings.warn("`other` is deprecated", FutureWarning, stacklevel=1)
            logger.warning(BNB_MESSAGE, "No module named 'kernels'")
            logger.warning("another bitsandbytes message")
    finally:
        logger.removeHandler(handler)
        errors.quiet_start(debug=True)  # takes the log filter off again
    assert [str(w.message) for w in caught] == ([GC_WARNING] if debug else []) + ["`other` is deprecated"]
    assert [r.msg for r in records] == ([BNB_MESSAGE] if debug else []) + ["another bitsandbytes message"]


def _subprocess(args, **env):
    environ = {key: value for key, value in os.environ.items() if key != errors.DEBUG_ENV}
    environ.update(HF_HUB_OFFLINE="1", **env)
    return subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=environ)


RECIPE_ERROR = "generation_batch_size (16) must be divisible by num_generations (3)."
RECIPE_EXIT = "recipe exit code: "  # what the debug process prints between its two runs


def test_recipe_process_prints_one_line():
    """As a user runs it, in a process of its own (the real exit code and stderr): the FutureWarning transformers
    gives while the config is parsed is hidden, the error is the last line."""
    cmd = [sys.executable, "recipes/math_gsm8k.py", "--config", DEMO, "--num_generations", "3"]
    proc = _subprocess(cmd)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and "FutureWarning: `gradient_checkpointing`" not in proc.stderr
    assert lines[-1].startswith(f"math_gsm8k.py: error: {RECIPE_ERROR.rstrip('.')}")
    assert not [line for line in lines if "Warning" in line], proc.stderr


@pytest.fixture(scope="module")
def debug_process() -> tuple[subprocess.CompletedProcess, str, str]:
    """One fresh process for the two tests below: importing the package (and all it imports) and checking that it
    added no warning or log filter and left TRL's classes in `trl` (tests/conftest.py unregisters before every test,
    so only a fresh process sees what an import does); then, with TRL_GRPO_EXT_DEBUG=1, the recipe run as `python
    recipes/math_gsm8k.py` (runpy, as __main__); then `trl-grpo-ext --debug grpo`. (Formerly a process each.) The
    process, and its stderr split into the recipe's part and the command's."""
    code = (
        "import logging, os, runpy, sys, traceback, warnings\n"
        "import trl_grpo_ext.trainer\n"  # the package and all it imports: TRL, datasets... add filters of their own
        "before = list(warnings.filters)\n"
        "from trl_grpo_ext import cli\nfrom trl_grpo_ext.cli import errors\n"
        "import trl\n"
        "assert warnings.filters == before and not logging.getLogger('bitsandbytes.backends.cpu.ops').filters\n"
        # importing registers nothing: only register() and the grpo command do
        "assert trl.GRPOTrainer is not trl_grpo_ext.trainer.GRPOTrainer\n"
        f"os.environ[errors.DEBUG_ENV] = '1'\n"
        f"sys.argv = ['recipes/math_gsm8k.py', '--config', {DEMO!r}, '--num_generations', '3']\n"
        "try:\n"
        "    runpy.run_path('recipes/math_gsm8k.py', run_name='__main__')\n"
        "    code = 0\n"
        "except SystemExit as end:\n"
        "    code = end.code\n"
        "except Exception:\n"  # as the interpreter ends a script whose exception escapes: its traceback, exit code 1
        "    traceback.print_exc()\n"
        "    code = 1\n"
        f"print({RECIPE_EXIT!r} + str(code), file=sys.stderr, flush=True)\n"
        "sys.exit(cli.main(['--debug', 'grpo', '--config', 'does_not_exist.yaml']))\n"
    )
    proc = _subprocess([sys.executable, "-c", code])
    recipe, _, grpo = proc.stderr.partition(RECIPE_EXIT)
    return proc, recipe, grpo


def test_recipe_with_debug_shows_the_warning_and_the_traceback(debug_process):
    """With TRL_GRPO_EXT_DEBUG=1 transformers' FutureWarning and the traceback are there (shared process:
    `debug_process`)."""
    proc, recipe, grpo = debug_process
    assert grpo.startswith("1\n"), proc.stderr[-3000:]  # the recipe's exit code
    assert "Traceback" in recipe and "FutureWarning: `gradient_checkpointing`" in recipe
    assert recipe.strip().splitlines()[-1] == f"ValueError: {RECIPE_ERROR}"


def test_importing_the_package_changes_no_filter_and_cli_debug_shows_the_traceback(debug_process):
    """Shared process: `debug_process`."""
    proc, _, grpo = debug_process
    assert proc.returncode == 1 and "AssertionError" not in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" in grpo
    last = grpo.strip().splitlines()[-1]
    assert last.endswith(
        f"UsageError: --config does_not_exist.yaml: no such file (relative paths start at {REPO_ROOT})"
    )


@pytest.mark.parametrize("command", ["tiny-model", "memory", "export", "doctor"])
def test_each_commands_help_prints_its_text_as_written(capsys, command):
    """Issue #30: argparse %-formats help strings, not a description: a "90%%" there printed as written."""
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: trl-grpo-ext {command}") and "%%" not in out


def test_the_command_named_in_messages_runs_from_here(monkeypatch, tmp_path):
    """Issue #30: right after `make demo` the venv is not activated, so `trl-grpo-ext` is not on PATH: the messages
    name the script in the venv, or `python -m trl_grpo_ext.cli` when there is none."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no trl-grpo-ext on PATH
    command = error_reports.cli_command()
    beside = Path(sys.executable).parent / "trl-grpo-ext"
    if beside.is_file():
        assert Path(command).resolve() == beside.resolve()
    else:
        assert command == f"{sys.executable} -m trl_grpo_ext.cli"
    result = subprocess.run([*command.split(" -m ")[0:1], *(["-m", "trl_grpo_ext.cli"] if " -m " in command else []),
                             "--help"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0 and "doctor" in result.stdout


def test_an_unreachable_hub_model_is_one_line_at_once(capsys, tmp_path, monkeypatch):
    """Issue #30: a Hub id with no network took 45 s of retries and an 82-line traceback; now one request, one line.
    Offline (HF_HUB_OFFLINE, as the tests run) it is refused without a request."""
    recipe = load_recipe("math_gsm8k")
    argv = ["--config", str(REPO_ROOT / "recipes/configs/smollm2_cpu.yaml"), "--output_dir", str(tmp_path / "o")]
    assert recipe.cli(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "math_gsm8k.py: error: model_name_or_path='HuggingFaceTB/SmolLM2-135M-Instruct' is not in the local "
        "Hugging Face cache and HF_HUB_OFFLINE is set: download it on a machine with internet (`hf download "
        "HuggingFaceTB/SmolLM2-135M-Instruct`) and pass its folder (run with --debug for the traceback)"
    ]
