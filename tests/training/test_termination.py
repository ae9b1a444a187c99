"""SIGTERM (a scheduler stopping a job: `timeout`, Slurm, Kubernetes) and Ctrl-C, wherever they arrive in the GSM8K
recipe or `trl-grpo-ext grpo` (`trl_grpo_ext.resume.termination`): real signals to a real run. One line at receipt;
in training the step finishes and its checkpoint is saved; in the final save the model is saved (and the step's
checkpoint kept) first; a second signal stops at once; one line says what was saved, what was not and the command
that resumes; a requeued run does the end-of-run work it still owes. Issues #58 and #71 (item 1)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM

from tests.conftest import REPO_ROOT, small_grpo_kwargs
from tests.training.signal_at import aim, send
from tests.training.test_recipes import load_recipe
from trl_grpo_ext import GRPOConfig, GRPOTrainer, cli
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows
from trl_grpo_ext.resume import MODEL_MANIFEST_NAME, TrainingTerminated, checkpoint_problem, saved_model_step

RUN = ["recipes/math_gsm8k.py", "--config", "recipes/configs/demo_cpu.yaml", "--max_steps", "50", "--eval_limit", "0",
       "--run_doctor", "false", "--save_strategy", "no"]  # fmt: skip
ACK = "SIGTERM received: stopping once {}; send it again to stop now"


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def test_sigterm_during_training_saves_a_checkpoint_and_says_how_to_resume(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, *RUN, "--output_dir", str(out)]
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**_env(), "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        seen = []
        deadline = time.monotonic() + 300
        for line in proc.stdout:  # the metrics table: a row per step
            seen.append(line)
            if re.match(r"\s+1\s", line) or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGTERM)  # during step 2 (step 1's row is printed once it is done)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + stderr[-3000:]
    assert ACK.format("the current step is done and its checkpoint saved") in stderr  # at receipt
    last = stderr.strip().splitlines()[-1]
    match = re.fullmatch(r"math_gsm8k\.py: stopped by SIGTERM at step (\d+); the last complete checkpoint is (\S+) "
                         r"\(step (\d+)\); resume with: (.*)", last)  # fmt: skip
    assert match, last
    step = int(match[1])
    assert step >= 2 and match[2] == str(out / f"checkpoint-{step}") and int(match[3]) == step
    assert checkpoint_problem(match[2]) is None  # complete: a save_strategy of "no" saved it all the same
    assert "--resume_from_checkpoint true" in match[4]

    resumed = subprocess.run([sys.executable, *RUN, "--output_dir", str(out), "--max_steps", str(step + 1),
                              "--resume_from_checkpoint", "true"], cwd=REPO_ROOT, capture_output=True, text=True,
                             env=_env(), timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resuming from {out}/checkpoint-{step} (step {step})" in resumed.stderr
    assert re.search(rf"^\s+{step + 1}\s", resumed.stdout, re.MULTILINE), resumed.stdout


def test_sigterm_while_the_recipe_starts_is_one_line(tmp_path):
    """During the imports (before the recipe's handler for the run is set up): Python's default ended the process
    with exit code 143 and no word."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, *RUN, "--output_dir", str(out)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())  # fmt: skip
    try:
        _wait_for_handler(proc.pid, signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        "math_gsm8k.py: stopped by SIGTERM before training started: nothing was trained or saved; run the same "
        "command again"
    )
    assert not out.exists()


def _wait_for_handler(pid: int, number: int, timeout: float = 60) -> None:
    """Wait until process `pid` catches signal `number` (Linux: its `SigCgt` mask in /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.MULTILINE)[1], 16)
        if caught >> (number - 1) & 1:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} never caught signal {number}")


# The recipe in this process (`recipe.cli`, which handles the signals as the script does): 1 step of the CPU demo.
def _recipe_argv(out: Path, *more: str) -> list[str]:
    return ["--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(out),
            "--synthetic_problems", "16", "--max_steps", "1", "--eval_limit", "1", "--run_doctor", "false",
            "--save_strategy", "no", *more]  # fmt: skip


def _lines(capfd) -> tuple[list[str], str]:
    """(the recipe's own lines on stderr, all of stderr): the acknowledgement is written to the file descriptor."""
    captured = capfd.readouterr()
    return [line for line in captured.err.splitlines() if line.startswith("math_gsm8k.py:")], captured.err


def _resume_argv(line: str) -> list[str]:
    """The recipe's arguments in the command a line ends with ("... to finish it: python recipes/... true")."""
    command = re.search(r"(?:resume with|to finish it): (.*)$", line)[1].split()
    assert command[1].endswith("math_gsm8k.py") and command[-2:] == ["--resume_from_checkpoint", "true"]
    return command[2:]


def _stopped(tmp_path, capfd, monkeypatch, point: str, *signals: int, more: tuple = (), code: int = 143):
    """The recipe (in this process) run with `signals` sent at `point`: (the recipe module, its output folder, its
    own lines on stderr, all of stderr), once it exited with `code`."""
    recipe = load_recipe("math_gsm8k")
    out = tmp_path / "run"
    aim(point, send(*signals), monkeypatch.setattr)
    assert recipe.cli(_recipe_argv(out, *more)) == code
    monkeypatch.undo()
    return recipe, out, *_lines(capfd)


def _weights(folder: Path) -> dict:
    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stop_in_the_final_save_keeps_the_weights_and_the_requeued_run_evaluates(tmp_path, capfd, monkeypatch,
                                                                                     number):  # fmt: skip
    """With save_strategy "no" (the CPU demo's) a stop in the final save lost the trained weights: SIGTERM killed the
    process (exit 143, no word), Ctrl-C left a partial save and said only "interrupted"."""
    recipe, out, lines, stderr = _stopped(tmp_path, capfd, monkeypatch, "save", number, code=128 + number)
    name = signal.Signals(number).name
    assert f"{name} received: stopping once the model is saved; send it again to stop now" in stderr
    how = "interrupted" if number == signal.SIGINT else "stopped by SIGTERM"
    assert len(lines) == 1 and lines[0].startswith(
        f"math_gsm8k.py: {how} after training (step 1): saved: the final model in {out}; not done: the evaluation "
        f"(eval_results.json); the last complete checkpoint is {out}/checkpoint-1 (step 1); to finish it: "
    ), lines
    assert saved_model_step(out) == 1  # the whole save, its manifest last
    trained = _weights(out)
    assert trained.keys() == _weights(out / "checkpoint-1").keys()
    assert all((trained[k] == _weights(out / "checkpoint-1")[k]).all() for k in trained)
    assert not (out / "eval_results.json").exists()
    if number == signal.SIGINT:
        return  # the requeued job, once: after SIGTERM

    # the requeued job: the same command with --resume_from_checkpoint true does the evaluation it owed, no more
    model_files = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}
    assert recipe.cli(_resume_argv(lines[0])) == 0
    printed = capfd.readouterr().out
    assert "Run already complete at step 1: doing the end-of-run work it still owes: the evaluation" in printed
    results = json.loads((out / "eval_results.json").read_text())
    assert results["global_step"] == 1 and results["num_problems"] == 1
    assert all(out.joinpath(n).stat().st_mtime_ns == t for n, t in model_files.items() if n != "eval_results.json")
    assert recipe.cli(_resume_argv(lines[0])) == 0  # once more: nothing left
    assert "Run already complete at step 1: its final model and evaluation are written; nothing to do" in (
        capfd.readouterr().out
    )


def test_a_stop_in_the_evaluation_keeps_the_step_and_the_requeued_run_evaluates(tmp_path, capfd, monkeypatch):
    _, out, lines, _ = _stopped(tmp_path, capfd, monkeypatch, "evaluation", signal.SIGTERM)
    assert len(lines) == 1 and lines[0].startswith(
        f"math_gsm8k.py: stopped by SIGTERM after training (step 1): saved: the final model in {out}; not done: the "
        f"evaluation (eval_results.json); the last complete checkpoint is {out}/checkpoint-1 (step 1); to finish it: "
    ), lines
    assert saved_model_step(out) == 1 and not (out / "eval_results.json").exists()


def test_a_stop_in_the_last_step_leaves_the_final_model_and_evaluation_to_the_requeued_run(tmp_path, capfd,
                                                                                           monkeypatch):  # fmt: skip
    """The checkpoint of the last step was saved, and the requeued job then said "Run already complete ... nothing
    saved or evaluated": the final model and eval_results.json were never written (NVIDIA-NeMo/Automodel PR #3007)."""
    recipe, out, lines, stderr = _stopped(tmp_path, capfd, monkeypatch, "last_step", signal.SIGTERM)
    assert ACK.format("the current step is done and its checkpoint saved") in stderr
    assert lines[0].startswith(f"math_gsm8k.py: stopped by SIGTERM at step 1; the last complete checkpoint is "
                               f"{out}/checkpoint-1 (step 1); resume with: ")  # fmt: skip
    assert saved_model_step(out) is None and not (out / "eval_results.json").exists()
    assert recipe.cli(_resume_argv(lines[0])) == 0
    printed = capfd.readouterr().out
    assert ("Run already complete at step 1: doing the end-of-run work it still owes: the final model, the "
            "evaluation (eval_results.json)") in printed  # fmt: skip
    assert saved_model_step(out) == 1 and json.loads((out / "eval_results.json").read_text())["global_step"] == 1


def test_a_second_signal_stops_the_save_at_once_and_leaves_no_model_that_looks_complete(tmp_path, capfd,
                                                                                        monkeypatch):  # fmt: skip
    more = ("--save_strategy", "steps", "--save_steps", "1")
    _, out, lines, stderr = _stopped(tmp_path, capfd, monkeypatch, "save", signal.SIGTERM, signal.SIGTERM, more=more)
    assert ACK.format("the model is saved") in stderr
    assert lines == [
        f"math_gsm8k.py: stopped by SIGTERM at once (a second signal) after training (step 1): saved: nothing more; "
        f"not done: the final model, the evaluation (eval_results.json); the last complete checkpoint is "
        f"{out}/checkpoint-1 (step 1); to finish it: {lines[0].split('to finish it: ')[1]}"
    ]
    assert not (out / "model.safetensors").exists() and saved_model_step(out) is None


def test_a_save_killed_mid_write_leaves_no_partial_model_where_the_model_is_looked_for(tmp_path):
    """SIGKILL (a scheduler's, after its grace period) while the weights file is written: the file transformers
    writes was `<output_dir>/model.safetensors` itself, and the half written looked like the model."""
    out = tmp_path / "run"
    argv = [sys.executable, "tests/training/signal_at.py", "save", "SIGKILL_MID_WRITE", "--",
            *_recipe_argv(out, "--eval_limit", "0")]  # fmt: skip
    run = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, env=_env(), timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    partial = [path for path in out.rglob("model.safetensors") if "tiny-model" not in path.parts]
    assert [p.parent.name for p in partial] == [".trl_grpo_ext_saving"], partial  # only in the staging folder
    assert partial[0].stat().st_size > 0 and not (out / MODEL_MANIFEST_NAME).exists()
    assert saved_model_step(out) is None


def test_training_terminated_in_a_plain_script_says_the_signal_step_checkpoint_and_resume(tiny_model_dir, tmp_path):
    """Its message was `(15, 5)`."""
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16, seed=0)))
    args = GRPOConfig(**small_grpo_kwargs(tmp_path / "out", max_steps=5, save_strategy="no"))
    trainer = GRPOTrainer(tiny_model_dir, _reward, args=args, train_dataset=dataset)
    step = trainer.training_step
    sent = []

    def training_step(*args, **kwargs):  # a real SIGTERM during step 3
        if trainer.state.global_step == 2 and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        return step(*args, **kwargs)

    trainer.training_step = training_step
    with pytest.raises(TrainingTerminated) as raised:
        trainer.train()
    checkpoint = tmp_path / "out" / "checkpoint-3"
    assert str(raised.value) == (
        f"SIGTERM at step 3: training stopped after the step in progress; the last complete checkpoint is "
        f"{checkpoint} (step 3); resume with trainer.train(resume_from_checkpoint=True), or the same command with "
        "--resume_from_checkpoint true"
    )
    assert checkpoint_problem(str(checkpoint)) is None
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back as it was


def _reward(completions, **kwargs) -> list[float]:
    return [float(len(str(c))) for c in completions]


def test_the_grpo_command_says_what_a_stop_saved(tmp_path, tiny_model_dir, capfd, monkeypatch):
    """`trl-grpo-ext grpo` (TRL's script on our classes): a stop while the trainer is built, then one in the final
    save; SIGTERM ended the command with exit code 143 and no word in both."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(f'{{"prompt": "{n} + {n} ="}}\n' for n in range(8)))
    out = tmp_path / "out"
    argv = ["grpo", "--model_name_or_path", tiny_model_dir, "--dataset_name", str(tmp_path / "data"),
            "--reward_funcs", "get_soft_overlong_punishment", "--num_generations", "4",
            "--per_device_train_batch_size", "4", "--max_completion_length", "8", "--max_steps", "1",
            "--output_dir", str(out), "--use_cpu", "true", "--bf16", "false", "--report_to", "none",
            "--save_strategy", "no", "--disable_tqdm", "true"]  # fmt: skip
    aim("build", send(signal.SIGTERM), monkeypatch.setattr)
    assert cli.main(argv) == 143
    monkeypatch.undo()
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("trl-grpo-ext grpo:")]
    assert err == ["trl-grpo-ext grpo: stopped by SIGTERM before training started: nothing was trained or saved; "
                   "run the same command again"]  # fmt: skip

    aim("save", send(signal.SIGTERM), monkeypatch.setattr)
    assert cli.main(argv) == 143
    monkeypatch.undo()
    captured = capfd.readouterr().err
    assert ACK.format("the model is saved") in captured
    err = [line for line in captured.splitlines() if line.startswith("trl-grpo-ext grpo:")]
    assert err == [
        f"trl-grpo-ext grpo: stopped by SIGTERM after training (step 1): the model is saved in {out}; the last "
        f"complete checkpoint is {out}/checkpoint-1 (step 1); resume with: trl-grpo-ext {' '.join(argv)} "
        "--resume_from_checkpoint true"
    ]
    assert saved_model_step(out) == 1
