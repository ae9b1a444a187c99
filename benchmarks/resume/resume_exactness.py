"""Max difference between a resumed and an uninterrupted GRPO run, stock TRL against trl_grpo_ext (issue #3).

    python benchmarks/resume/resume_exactness.py [--configs default lora ...]

For each configuration of `tests/training/test_resume.py`, trains the tiny Qwen2 model 6 steps uninterrupted
(checkpoint every 3 steps) and again resumed from checkpoint-3, with `trl.GRPOTrainer` and with
`trl_grpo_ext.GRPOTrainer`, and prints the max abs difference over every metric logged after the resume, over every
trainable parameter at the end, and whether the prompts seen after the resume were the same.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import trl

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests import resume_check  # noqa: E402
from tests.training.test_resume import CONFIGS  # noqa: E402
from trl_grpo_ext import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_grpo_ext.cli.tiny_model import save_tiny_model  # noqa: E402


def measure(config: dict, model_dir: str, stock: bool) -> tuple[float, float, bool]:
    resume_check.GRPOTrainer = trl.GRPOTrainer if stock else GRPOTrainer
    resume_check.GRPOConfig = trl.GRPOConfig if stock else GRPOConfig
    with tempfile.TemporaryDirectory() as tmp:
        full = resume_check.run_phase(config, model_dir, f"{tmp}/full")
        resumed = resume_check.run_phase(config, model_dir, f"{tmp}/resumed", resume_from=f"{tmp}/full/checkpoint-3")
    rows = lambda run: [r for r in run["logs"] if r.get("step", 0) > 3]  # noqa: E731
    same_prompts = [c for c in full["prompts"] if c[0] >= 3] == resumed["prompts"]
    metric_diffs = [abs(a[k] - b[k]) for a, b in zip(rows(full), rows(resumed), strict=False) for k in a if k in b]
    param_diffs = [(full["params"][n] - resumed["params"][n]).abs().max().item() for n in full["params"]]
    return max(metric_diffs, default=0.0), max(param_diffs), same_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(f"{tmp}/tiny"))
        header = ["configuration", "TRL metrics", "TRL params", "TRL prompts"]
        header += ["ext metrics", "ext params", "ext prompts"]
        print(f"{header[0]:36}" + "".join(f"{h:>12}" for h in header[1:]))
        for name in args.configs:
            cells = []
            for stock in (True, False):
                metrics, params, prompts = measure(CONFIGS[name], model_dir, stock=stock)
                cells += [f"{metrics:12.3e}", f"{params:12.3e}", f"{'same' if prompts else 'DIFFER':>12}"]
            print(f"{name:36}" + "".join(cells), flush=True)


if __name__ == "__main__":
    main()
