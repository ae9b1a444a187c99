"""Wall time of the CPU demo (`recipes/configs/demo_cpu.yaml`); issue #2 sets a limit of 3 min on 2 cores.

    python benchmarks/timing/demo_walltime.py [--repeats 3] [--json benchmarks/timing/results/demo_walltime.json]

Runs the demo as a user does (`python recipes/math_gsm8k.py --config ...` in a fresh process, so imports and the
tiny model's build are counted), `--repeats` times, and prints the wall time of each run, the median, and the training
time reported by the Trainer.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 180.0


def run_once(extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "recipes/math_gsm8k.py", "--config", "recipes/configs/demo_cpu.yaml",
               "--output_dir", out, *extra]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"demo failed:\n{proc.stderr[-3000:]}")
        runtime = re.search(r"train_runtime: ([0-9.]+) s", proc.stdout)
        steps = len([line for line in proc.stdout.splitlines() if re.match(r"^\s+\d+\s+-?\d", line)])
        return {"wall_s": wall, "train_runtime_s": float(runtime.group(1)) if runtime else None, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("extra", nargs="*", help="extra recipe arguments, after --")
    args = parser.parse_args()

    runs = [run_once(args.extra) for _ in range(args.repeats)]
    median = statistics.median(run["wall_s"] for run in runs)
    for i, run in enumerate(runs, 1):
        print(f"run {i}: wall {run['wall_s']:.1f} s, training {run['train_runtime_s']} s, {run['steps']} table rows")
    verdict = "within" if median < LIMIT_S else "OVER"
    print(f"median wall time {median:.1f} s on {os.cpu_count()} CPU cores: {verdict} the {LIMIT_S:.0f} s limit")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps({"runs": runs, "median_wall_s": median, "cpus": os.cpu_count()}, indent=2)
        )


if __name__ == "__main__":
    main()
