"""SIGTERM, as a scheduler stops a job (`timeout`, SLURM, Kubernetes), handled like Ctrl-C
(`trl_grpo_ext.resume`): the recipe saves a checkpoint of the step in progress, prints one line with the command
that resumes, and exits with 143; the resumed run goes on from that step."""

import os
import re
import signal
import subprocess
import sys
import time

from tests.conftest import REPO_ROOT
from trl_grpo_ext.resume import checkpoint_problem

RUN = ["recipes/math_gsm8k.py", "--config", "recipes/configs/demo_cpu.yaml", "--max_steps", "50", "--eval_limit", "0",
       "--run_doctor", "false", "--save_strategy", "no"]  # fmt: skip


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


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
