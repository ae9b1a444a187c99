"""Issue #61: `pip install trl-grpo-ext` is the trainer and its features; the GSM8K task (math-verify), the plots
(matplotlib) and QLoRA (bitsandbytes) come with the extras of `pyproject.toml`. Without its package, each use fails
with one line naming the extra (`error_reports.needs_extra`), and a training run's closing plot is skipped with a
warning instead of failing a finished run. Each test hides the package as an uninstalled one is (`sys.modules[name] =
None` makes its import raise `ModuleNotFoundError`), in a fresh process where the import must run again."""

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


def _run_without(module: str, code: str) -> subprocess.CompletedProcess:
    """`code` run by a fresh Python in which importing `module` fails as it does when it is not installed."""
    hide = f"import sys; sys.modules[{module!r}] = None\n"
    return subprocess.run([sys.executable, "-c", hide + code], capture_output=True, text=True, timeout=300,
                          cwd=REPO_ROOT)  # fmt: skip


def test_the_extras_of_pyproject_are_the_ones_the_messages_name():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for package, extra in EXTRAS.values():
        assert extras[extra] == [package]
        assert package in extras["all"]
        assert package not in project["dependencies"]  # the core install leaves it out


def test_the_gsm8k_rewards_without_math_verify_name_the_extra():
    done = _run_without(
        "math_verify",
        "from trl_grpo_ext.error_reports import MissingDependencyError\n"
        "try:\n    import trl_grpo_ext.gsm8k.rewards\n"
        "except MissingDependencyError as error:\n    print(error)\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "the GSM8K reward functions (trl_grpo_ext.gsm8k) needs math-verify, which is not installed: "
        "pip install 'trl-grpo-ext[gsm8k]'"
    )


def test_the_dashboard_without_matplotlib_names_the_extra():
    done = _run_without(
        "matplotlib",
        "from trl_grpo_ext.doctor.dashboard import plot_dashboard\n"
        "from trl_grpo_ext.error_reports import MissingDependencyError\n"
        "try:\n    plot_dashboard([{'step': 1, 'reward': 0.5}], None, 'out.png')\n"
        "except MissingDependencyError as error:\n    print(error)\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("needs matplotlib, which is not installed: pip install 'trl-grpo-ext[doctor]'")


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


def test_the_command_and_the_trainer_need_no_extra():
    """The core install (none of the extras' packages) imports the trainer and runs the `trl-grpo-ext` command: its
    error handling and the tiny model read GSM8K's data format but not its reward functions."""
    hide = "; ".join(f"sys.modules[{module!r}] = None" for module in EXTRAS)
    code = (f"import sys; {hide}\n"
            "import trl_grpo_ext.trainer, trl_grpo_ext.cli.tiny_model\n"
            "from trl_grpo_ext.cli import main\n"
            "raise SystemExit(main(['--help']))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tiny-model" in done.stdout


@pytest.mark.parametrize("recipe", ["math_gsm8k.py", "eval_gsm8k.py"])
def test_a_gsm8k_recipe_without_math_verify_stops_with_one_line(recipe):
    """The GSM8K recipes, even for `--help`, name the `gsm8k` extra in one line when math-verify is missing."""
    done = _run_without(
        "math_verify",
        f"import runpy, sys; sys.argv = [{recipe!r}, '--help']\n"
        f"runpy.run_path('recipes/{recipe}', run_name='__main__')\n",
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[-1] == (
        f"{recipe}: error: the GSM8K reward functions (trl_grpo_ext.gsm8k) needs math-verify, which is not "
        "installed: pip install 'trl-grpo-ext[gsm8k]'"
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
