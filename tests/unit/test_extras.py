"""Issue #61: `pip install trl-grpo-ext` is the trainer and its features; the GSM8K task (math-verify), the plots
(matplotlib) and QLoRA (bitsandbytes) come with the extras of `pyproject.toml`. Without its package, each use fails
with one line naming the extra (`error_reports.needs_extra`), and a training run's closing plot is skipped with a
warning instead of failing a finished run. A package is hidden as an uninstalled one is (`sys.modules[name] = None`
makes its import raise `ModuleNotFoundError`): all of them in one fresh process for the core install's imports, or one
in this process (`monkeypatch`) for a use inside a running program."""

import json
import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest
import tomllib

from tests.conftest import REPO_ROOT
from trl_grpo_ext.cli import optional_dependencies
from trl_grpo_ext.error_reports import EXTRAS, MissingDependencyError, needs_extra
from trl_grpo_ext.reporting import callbacks


def test_the_extras_of_pyproject_are_the_ones_the_messages_name():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for package, extra in EXTRAS.values():
        assert extras[extra] == [package]
        assert package in extras["all"]
        assert package not in project["dependencies"]  # the core install leaves it out


def test_a_finished_run_without_matplotlib_keeps_its_log_and_warns(tmp_path, monkeypatch, caplog):
    def missing(*args, **kwargs):
        with needs_extra("the plots"):
            import matplotlib  # noqa: F401

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(callbacks, "plot_curves", missing)
    callback = callbacks.MetricsTableCallback()
    args = SimpleNamespace(output_dir=str(tmp_path))
    state = SimpleNamespace(is_world_process_zero=True, global_step=1)
    callback.on_log(args, state, None, logs={"reward": 0.5, "reward_std": 0.1, "entropy": 2.0, "step_time": 0.5})
    with caplog.at_level(logging.WARNING):
        callback.on_train_end(args, state, None)
    assert len((tmp_path / callbacks.HISTORY_NAME).read_text().splitlines()) == 1
    assert not (tmp_path / callbacks.PLOT_NAME).exists()
    assert "No plot of the run: the plots needs matplotlib" in caplog.text
    assert "pip install 'trl-grpo-ext[doctor]'" in caplog.text


def test_qlora_without_bitsandbytes_is_refused_before_loading(monkeypatch):
    monkeypatch.setattr(optional_dependencies, "is_installed", lambda package: package != "bitsandbytes")
    refused = r"load_in_4bit or load_in_8bit \(QLoRA\) needs the package 'bitsandbytes'"
    with pytest.raises(MissingDependencyError, match=refused):
        optional_dependencies.check_optional_dependencies(quantized=True)
    optional_dependencies.check_optional_dependencies(use_vllm=False, quantized=False)


def test_an_import_error_of_another_package_passes_unchanged():
    with pytest.raises(ModuleNotFoundError) as raised, needs_extra("a test"):
        import trl_grpo_ext_no_such_module  # noqa: F401
    assert not isinstance(raised.value, MissingDependencyError)


# Run by a fresh Python in which none of the extras' packages imports (the core install): the `trl-grpo-ext` command,
# then each use of an extra, each in a fresh import of its module; prints what each printed or raised, as JSON.
WITHOUT_EXTRAS = """
import contextlib, io, json, runpy, sys, traceback
for module in sys.argv[1:]:
    sys.modules[module] = None
seen = {}

def attempt(name, use):
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            seen[name] = {"returned": use()}
    except SystemExit as stop:
        seen[name] = {"exit": stop.code}
    except Exception as error:
        seen[name] = {"raised": type(error).__name__, "message": str(error), "traceback": traceback.format_exc()}
    seen[name].update(stdout=out.getvalue(), stderr=err.getvalue())

import trl_grpo_ext.trainer, trl_grpo_ext.cli.tiny_model
from trl_grpo_ext.cli import main
attempt("command", lambda: main(["--help"]))
for recipe in ("math_gsm8k.py", "eval_gsm8k.py"):
    sys.argv = [recipe, "--help"]
    attempt(recipe, lambda: runpy.run_path(f"recipes/{recipe}", run_name="__main__"))
attempt("gsm8k_rewards", lambda: __import__("trl_grpo_ext.gsm8k.rewards"))
from trl_grpo_ext.doctor.dashboard import plot_dashboard
attempt("dashboard", lambda: plot_dashboard([{"step": 1, "reward": 0.5}], None, "out.png"))
print(json.dumps(seen))
"""


def test_the_core_install_runs_the_command_and_names_the_extra_of_each_tool():
    """The core install (none of the extras' packages) imports the trainer and runs the `trl-grpo-ext` command: its
    error handling and the tiny model read GSM8K's data format but not its reward functions. Each tool that needs an
    extra stops with one line naming it: the GSM8K recipes, even for `--help` (`SystemExit` with the line, which Python
    prints to stderr with exit status 1, no traceback), the GSM8K reward functions and the run doctor's dashboard
    (`MissingDependencyError`). One fresh process for all: a failed import leaves nothing in `sys.modules`, so each
    use imports its module afresh."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, *EXTRAS], capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["command"]["returned"] == 0, seen["command"]
    assert "tiny-model" in seen["command"]["stdout"]
    for recipe in ("math_gsm8k.py", "eval_gsm8k.py"):
        assert "Traceback" not in seen[recipe]["stderr"], seen[recipe]
        assert seen[recipe]["exit"] == (
            f"{recipe}: error: the GSM8K reward functions (trl_grpo_ext.gsm8k) needs math-verify, which is not "
            "installed: pip install 'trl-grpo-ext[gsm8k]'"
        ), seen[recipe]
    assert seen["gsm8k_rewards"]["raised"] == "MissingDependencyError", seen["gsm8k_rewards"]
    assert seen["gsm8k_rewards"]["message"] == (
        "the GSM8K reward functions (trl_grpo_ext.gsm8k) needs math-verify, which is not installed: "
        "pip install 'trl-grpo-ext[gsm8k]'"
    )
    assert seen["dashboard"]["raised"] == "MissingDependencyError", seen["dashboard"]
    assert seen["dashboard"]["message"].endswith(
        "needs matplotlib, which is not installed: pip install 'trl-grpo-ext[doctor]'"
    )


def test_the_grpo_command_refuses_4bit_without_bitsandbytes_before_loading(tmp_path, monkeypatch, capsys):
    """`trl-grpo-ext grpo --load_in_4bit true` without bitsandbytes: one line naming the `qlora` extra, before TRL's
    script loads the dataset or the model (both paths exist but are not models or data)."""
    from trl_grpo_ext import cli

    monkeypatch.setattr(optional_dependencies, "is_installed", lambda package: package != "bitsandbytes")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1?"}\n')
    argv = ["grpo", "--model_name_or_path", str(tmp_path / "model"), "--dataset_name", str(tmp_path / "data.jsonl"),
            "--output_dir", str(tmp_path / "out"), "--load_in_4bit", "true", "--use_peft", "true",
            "--use_cpu", "true", "--bf16", "false"]  # fmt: skip
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "trl-grpo-ext grpo: error: load_in_4bit or load_in_8bit (QLoRA) needs the package 'bitsandbytes', which is "
        "not installed: pip install 'trl-grpo-ext[qlora]' (run with --debug for the traceback)"
    ]
    assert not (tmp_path / "out").exists()


def test_the_doctor_command_without_matplotlib_prints_its_report_and_skips_the_picture(tmp_path, monkeypatch, capsys):
    """The run doctor's report needs no extra; its dashboard does: without matplotlib the command prints the report,
    one line for the missing picture, and succeeds."""
    from trl_grpo_ext import cli

    rows = [{"step": step, "reward": 0.5, "reward_std": 0.2, "loss": 0.1} for step in range(1, 31)]
    (tmp_path / "training_metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "30 logged training steps" in out
    assert out.strip().splitlines()[-1] == (
        "No dashboard: the run doctor's dashboard needs matplotlib, which is not installed: "
        "pip install 'trl-grpo-ext[doctor]'"
    )
    assert not (tmp_path / "doctor.png").exists()


def test_the_trl_reward_functions_that_need_math_verify_are_the_ones_checked():
    """`TRL_REWARD_MODULES` names exactly the reward functions of TRL's `trl grpo` registry whose code needs
    math-verify (TRL raises "Please install the `math_verify` package" from their first call)."""
    import inspect
    import re

    from trl import rewards
    from trl.scripts import grpo

    registry = re.search(r"reward_funcs_registry = \{(.*?)\n    \}", inspect.getsource(grpo.main), re.S).group(1)
    names = re.findall(r'"(\w+)":', registry)
    assert {"accuracy_reward", "think_format_reward"} <= set(names)
    needing = {name for name in names if "math_verify" in inspect.getsource(getattr(rewards, name))}
    assert set(optional_dependencies.TRL_REWARD_MODULES) == needing
    assert set(optional_dependencies.TRL_REWARD_MODULES.values()) == {"math_verify"}


def test_the_grpo_command_names_the_extra_of_a_reward_function_before_loading(tmp_path, monkeypatch, capsys):
    """Issue #72: `trl-grpo-ext grpo --reward_funcs accuracy_reward` without math-verify loaded the model, started
    training and died with a 60-line traceback at the first reward call; now one line naming the `gsm8k` extra, before
    TRL's script loads the dataset or the model (both paths exist but are not models or data)."""
    from trl_grpo_ext import cli

    monkeypatch.setattr(optional_dependencies, "is_installed", lambda package: package != "math_verify")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1?"}\n')
    argv = ["grpo", "--model_name_or_path", str(tmp_path / "model"), "--dataset_name", str(tmp_path / "data.jsonl"),
            "--output_dir", str(tmp_path / "out"), "--reward_funcs", "think_format_reward", "accuracy_reward",
            "--use_cpu", "true", "--bf16", "false"]  # fmt: skip
    assert cli.main(argv) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "trl-grpo-ext grpo: error: --reward_funcs accuracy_reward (TRL's) needs math-verify, which is not installed: "
        "pip install 'trl-grpo-ext[gsm8k]' (run with --debug for the traceback)"
    ]
    assert not (tmp_path / "out").exists()
