"""Issue #57.4: an error raised after training started keeps its traceback. The entry point's one line names
`<output_dir>/error.log`, which holds the full traceback and the versions; a bug is raised with its traceback, which
ends with the log's path; config-time errors stay one line and write no log."""

import os
import re
import sys

import peft
import pytest
import torch

import trl_grpo_ext
from tests.conftest import REPO_ROOT
from tests.training.test_recipes import load_recipe
from trl_grpo_ext import cli
from trl_grpo_ext.cli import errors
from trl_grpo_ext.gsm8k.rewards import REWARD_FUNCS

DEMO = str(REPO_ROOT / "recipes/configs/demo_cpu.yaml")
VERSIONS = ("python", "torch", "transformers", "trl", "peft", "accelerate", "trl_grpo_ext", "cuda device")


@pytest.fixture(autouse=True)
def no_debug_env(monkeypatch):
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)


def exploding_reward(completions, **kwargs) -> list[float]:
    raise ValueError("exploding_reward: a completion it cannot score")


def buggy_reward(completions, **kwargs) -> list[float]:
    raise RuntimeError("buggy_reward: a bug")


def demo_argv(out, reward: str, *more: str) -> list[str]:
    """One step of the CPU demo whose second reward function is `reward` (registered by the test)."""
    return ["--config", DEMO, "--output_dir", str(out), "--synthetic_problems", "16", "--max_steps", "1",
            "--eval_limit", "0", "--reward_funcs", "gsm8k_accuracy", reward, *more]  # fmt: skip


def entry_lines(stderr: str, prog: str) -> list[str]:
    """The lines the entry point printed (stderr also holds the library's log records and warnings)."""
    return [line for line in stderr.splitlines() if line.startswith(f"{prog}:")]


def assert_error_log(path, function: str, message: str) -> None:
    log = path.read_text()
    assert "Traceback (most recent call last)" in log and f"in {function}" in log and message in log, log
    for name in VERSIONS:
        assert re.search(rf"^{name}: \S", log, re.MULTILINE), f"{name} missing from\n{log}"
    assert f"torch: {torch.__version__}" in log and f"peft: {peft.__version__}" in log
    assert f"trl_grpo_ext: {trl_grpo_ext.__version__}" in log
    assert "cuda device: none" in log or not torch.cuda.is_available()


def test_a_reward_functions_error_at_step_1_is_one_line_naming_the_log(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(REWARD_FUNCS, "exploding_reward", exploding_reward)
    out = tmp_path / "run"
    assert load_recipe("math_gsm8k").cli(demo_argv(out, "exploding_reward")) == 1
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    assert entry_lines(stderr, "math_gsm8k.py") == [
        f"math_gsm8k.py: error: exploding_reward: a completion it cannot score (full traceback: {out}/error.log)"
    ]
    assert_error_log(out / "error.log", "exploding_reward", "ValueError: exploding_reward: a completion it cannot")


def test_a_bug_in_training_keeps_its_traceback_which_names_the_log(tmp_path, monkeypatch):
    monkeypatch.setitem(REWARD_FUNCS, "buggy_reward", buggy_reward)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="buggy_reward: a bug") as raised:
        load_recipe("math_gsm8k").cli(demo_argv(out, "buggy_reward"))
    assert raised.value.__notes__ == [f"full traceback and versions: {out}/error.log"]
    assert_error_log(out / "error.log", "buggy_reward", "RuntimeError: buggy_reward: a bug")


@pytest.mark.parametrize(
    ("more", "message"),
    [
        (["--eval_limit", "-1"], "eval_limit must be >= 0"),  # a value the config rejects
        # raised by the trainer's `train`, before transformers' training loop: still a setting to fix
        (["--resume_from_checkpoint", "true"], "resume_from_checkpoint=True: no complete checkpoint-N folder"),
    ],
    ids=["config", "resume"],
)
def test_an_error_before_training_starts_stays_one_line_without_a_log(tmp_path, monkeypatch, capsys, more, message):
    monkeypatch.setitem(REWARD_FUNCS, "exploding_reward", exploding_reward)
    out = tmp_path / "run"
    assert load_recipe("math_gsm8k").cli(demo_argv(out, "exploding_reward", *more)) == 1
    stderr = capsys.readouterr().err
    lines = entry_lines(stderr, "math_gsm8k.py")
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith(f"math_gsm8k.py: error: {message}")
    assert lines[0].endswith(" (run with --debug for the traceback)")
    assert not (out / "error.log").exists()


def test_the_grpo_command_names_the_log_of_an_error_in_training(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """`trl-grpo-ext grpo` runs TRL's script, which imports a reward function by its dotted path from the working
    folder: one that raises at the first step."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # TRL's script puts the working folder first
    monkeypatch.delitem(sys.modules, "exploding_rewards", raising=False)
    (tmp_path / "exploding_rewards.py").write_text(
        "def exploding_reward(completions, **kwargs):\n    raise ValueError('exploding_reward: cannot score')\n"
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(f'{{"prompt": "{n} + {n} ="}}\n' for n in range(8)))
    out = tmp_path / "out"
    argv = ["--model_name_or_path", tiny_model_dir, "--dataset_name", str(tmp_path / "data"), "--reward_funcs",
            "exploding_rewards.exploding_reward", "--num_generations", "4", "--per_device_train_batch_size", "4",
            "--max_completion_length", "8", "--max_steps", "1", "--output_dir", str(out), "--use_cpu", "true",
            "--bf16", "false", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true"]  # fmt: skip
    assert cli.main(["grpo", *argv]) == 1
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    assert entry_lines(stderr, "trl-grpo-ext grpo") == [
        f"trl-grpo-ext grpo: error: exploding_reward: cannot score (full traceback: {out}/error.log)"
    ]
    assert_error_log(out / "error.log", "exploding_reward", "ValueError: exploding_reward: cannot score")
    sys.modules.pop("exploding_rewards", None)


def test_each_process_writes_its_own_log_and_a_log_that_cannot_be_written_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")  # an error on another process only: its own log, named in its line
    with (
        pytest.raises(ValueError, match="late") as raised,
        errors.training_errors(str(tmp_path / "one"), started=True),
    ):
        raise ValueError("late")
    assert raised.value.error_log == str(tmp_path / "one" / "error.log.1")
    assert "ValueError: late" in (tmp_path / "one" / "error.log.1").read_text()
    assert f"working folder: {os.getcwd()}" in (tmp_path / "one" / "error.log.1").read_text()
    assert not (tmp_path / "one" / "error.log").exists()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="late") as raised, errors.training_errors(str(blocked / "run"), started=True):
        raise ValueError("late")  # not a folder: nothing written, the error as it was
    assert not hasattr(raised.value, "error_log") and not hasattr(raised.value, "__notes__")
    with pytest.raises(ValueError), errors.training_errors(str(tmp_path / "run")):  # not in training: no log
        raise ValueError("before")
    assert not (tmp_path / "run").exists()
    with pytest.raises(KeyboardInterrupt), errors.training_errors(str(tmp_path / "run"), started=True):
        raise KeyboardInterrupt  # Ctrl-C is the entry point's (`errors.Interrupted`), not an error to log
    assert not (tmp_path / "run").exists()
