"""What the run doctor adds to the step time (issue #19's target: at most 1%).

    python benchmarks/doctor/doctor_overhead.py [--repeats 3] [--max_steps 40]

Three measurements on 2 CPU cores:
  1. The CPU demo (recipes/configs/demo_cpu.yaml, logging every step) with `run_doctor` on: the time spent in the
     callback's checks, as the share of the training time it reports at the end (`DoctorCallback.seconds`).
  2. The same demo with `run_doctor` off and on, `--repeats` times each, alternating: transformers' `train_runtime`
     (everything the doctor adds: the checks, the timings, the callback's bookkeeping; noisy at this size).
  3. The cost of one check of every metric as the log grows (200, 1000, 3000 rows), the worst case of a long run logged
     at every step; the callback caps the checks at `callback.BUDGET` (0.5%) of the training time by deferring them.
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.doctor.doctor_detection import synthetic_log  # noqa: E402
from trl_grpo_ext.doctor import diagnose  # noqa: E402
from trl_grpo_ext.doctor.series import Columns  # noqa: E402

RESULTS = ROOT / "benchmarks" / "doctor" / "results"


def demo(doctor: bool, max_steps: int) -> tuple[float, float | None]:
    """(train_runtime in s, the checks' share of the training time in % or None) of one CPU demo run."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, str(ROOT / "recipes/math_gsm8k.py"), "--config",
                   str(ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", out, "--eval_limit", "0",
                   "--max_steps", str(max_steps), "--run_doctor", str(doctor).lower()]  # fmt: skip
        done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
    runtime = float(re.search(r"train_runtime: ([\d.]+) s", done.stdout).group(1))
    share = re.search(r"the checks took [\d.]+ s, ([\d.]+)% of the training time", done.stderr)
    return runtime, float(share.group(1)) if share else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--out", default=str(RESULTS))
    cli = parser.parse_args()
    runs = {False: [], True: []}
    shares = []
    for _ in range(cli.repeats):
        for doctor in (False, True):
            runtime, share = demo(doctor, cli.max_steps)
            runs[doctor].append(runtime)
            if share is not None:
                shares.append(share)
    off, on = statistics.median(runs[False]), statistics.median(runs[True])
    lines = [
        f"CPU demo, {cli.max_steps} steps logged every step, {cli.repeats} runs each:",
        f"  the checks' share of the training time (DoctorCallback.seconds): {', '.join(f'{s:.3f}%' for s in shares)}",
        f"  train_runtime off {', '.join(f'{r:.2f}' for r in runs[False])} s; "
        f"on {', '.join(f'{r:.2f}' for r in runs[True])} s;"
        f" median on/off {on / off:.3f}",
        "one check of every metric on a log of n rows (policy groups and kl logged):",
    ]  # fmt: skip
    for rows in (200, 1000, 3000):
        columns = Columns(synthetic_log(None, 0, steps=rows, beta=0.04, groups=True))
        diagnose(columns)
        start = time.perf_counter()
        for _ in range(20):
            diagnose(columns)
        lines.append(f"  n = {rows:4d}: {(time.perf_counter() - start) / 20 * 1000:.2f} ms per log")
    text = "\n".join(lines)
    print(text)
    (Path(cli.out) / "doctor_overhead.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
