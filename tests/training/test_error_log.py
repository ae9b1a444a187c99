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
        f"math_gsm8k.py: error: reward function 'exploding_reward' raised ValueError at step 1: exploding_reward: a "
        f"completion it cannot score (full traceback: {out}/error.log); no complete checkpoint in {out} "
        "(save_strategy / save_steps set when one is written): run the same command again to start over"
    ]
    assert_error_log(out / "error.log", "exploding_reward", "ValueError: exploding_reward: a completion it cannot")


def test_a_reward_function_raising_mid_run_is_one_line_with_the_checkpoint_to_resume(tmp_path, monkeypatch, capsys):
    """Issue #71, item 4: a reward function's exception (the user's code, of any type) at step 2 printed a 76-line
    traceback and no resume hint; Ctrl-C gives one."""

    def buggy_at_step_2(completions, trainer_state, **kwargs):
        if trainer_state.global_step == 1:
            return buggy_reward(completions)
        return [0.0] * len(completions)

    monkeypatch.setitem(REWARD_FUNCS, "buggy_at_step_2", buggy_at_step_2)
    out = tmp_path / "run"
    argv = demo_argv(out, "buggy_at_step_2", "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "1")
    assert load_recipe("math_gsm8k").cli(argv) == 1
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    python = errors.script_command(str(REPO_ROOT / "recipes" / "math_gsm8k.py"))
    assert entry_lines(stderr, "math_gsm8k.py") == [
        f"math_gsm8k.py: error: reward function 'buggy_at_step_2' raised RuntimeError at step 2: buggy_reward: a bug "
        f"(full traceback: {out}/error.log); the last complete checkpoint is {out}/checkpoint-1 (step 1); resume "
        f"with: {' '.join(python)} {' '.join(argv)} --resume_from_checkpoint true"
    ]
    assert_error_log(out / "error.log", "buggy_reward", "RuntimeError: buggy_reward: a bug")


def test_a_bug_in_training_keeps_its_traceback_which_names_the_log(tmp_path, monkeypatch):
    from trl_grpo_ext import GRPOTrainer

    def buggy_step(self, *args, **kwargs):
        raise RuntimeError("a bug in a training step")

    monkeypatch.setattr(GRPOTrainer, "training_step", buggy_step)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="a bug in a training step") as raised:
        load_recipe("math_gsm8k").cli(demo_argv(out, "gsm8k_format"))
    assert raised.value.__notes__ == [
        f"full traceback and versions: {out}/error.log",
        f"no complete checkpoint in {out} (save_strategy / save_steps set when one is written): run the same "
        "command again to start over",
    ]
    assert_error_log(out / "error.log", "buggy_step", "RuntimeError: a bug in a training step")


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
        f"trl-grpo-ext grpo: error: reward function 'exploding_reward' raised ValueError at step 1: exploding_reward: "
        f"cannot score (full traceback: {out}/error.log); no complete checkpoint in {out} (save_strategy / "
        "save_steps set when one is written): run the same command again to start over"
    ]
    assert_error_log(out / "error.log", "exploding_reward", "ValueError: exploding_reward: cannot score")
    sys.modules.pop("exploding_rewards", None)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("my_rewards.nope", "reward_funcs: 'my_rewards' ({folder}/my_rewards.py) has no 'nope'; its functions: score"),
        ("my_rewards.scor", "reward_funcs: 'my_rewards' ({folder}/my_rewards.py) has no 'scor' (did you mean "
                            "`score`?)"),
        ("nomodule.fn", "reward_funcs: no module 'nomodule' for 'nomodule.fn': give a Python file nomodule.py in the "
                        "working folder ({folder}) or a module on the Python path, as module.function"),
        ("my_rewards.WEIGHT", "reward_funcs: 'my_rewards.WEIGHT' is a float, not a function"),
        ("broken_rewards.score", "reward_funcs: importing 'broken_rewards' for 'broken_rewards.score' failed: "
                                 "ZeroDivisionError: division by zero"),
    ],
    ids=["no-function", "typo", "no-module", "not-a-function", "module-raises"],
)  # fmt: skip
def test_a_reward_function_path_that_does_not_import_is_one_line_first(tmp_path, monkeypatch, capsys, path, message):
    """Issue #71, item 4: TRL's script imported the path with the model still to load, and a typo gave a 16-22 line
    traceback. The model folder here cannot load (an empty config.json): the line comes first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for module in ("my_rewards", "broken_rewards", "nomodule"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    (tmp_path / "my_rewards.py").write_text("WEIGHT = 0.5\n\n\ndef score(completions, **kwargs):\n    return [0.0]\n")
    (tmp_path / "broken_rewards.py").write_text("1 / 0\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"prompt": "1+1?"}\n')
    argv = ["grpo", "--model_name_or_path", str(tmp_path / "model"), "--dataset_name", str(tmp_path / "data"),
            "--reward_funcs", path, "--num_generations", "4", "--per_device_train_batch_size", "4", "--output_dir",
            str(tmp_path / "out"), "--use_cpu", "true", "--bf16", "false", "--report_to", "none"]  # fmt: skip
    assert cli.main(argv) == 1
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    assert entry_lines(stderr, "trl-grpo-ext grpo") == [
        f"trl-grpo-ext grpo: error: {message.format(folder=tmp_path)} (run with --debug for the traceback)"
    ]
    assert not (tmp_path / "out").exists()


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
