"""Max difference between a resumed and an uninterrupted GRPO run, stock TRL against trl_grpo_ext (issue #3).

    python benchmarks/resume_exactness.py [--configs default lora ...]

For each configuration of `tests/test_resume.py`, trains the tiny Qwen2 model 6 steps uninterrupted (checkpoint every
3 steps) and again resumed from checkpoint-3, with `trl.GRPOTrainer` and with `trl_grpo_ext.GRPOTrainer`, and prints
the max abs difference over every metric logged after the resume and every trainable parameter, and whether the
prompts seen after the resume were the same.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import trl

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests import resume_check  # noqa: E402
from tests.test_resume import CONFIGS  # noqa: E402
from trl_grpo_ext import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_grpo_ext.tiny_model import save_tiny_model  # noqa: E402


def measure(config: dict, model_dir: str, stock: bool) -> tuple[float, bool]:
    resume_check.GRPOTrainer = trl.GRPOTrainer if stock else GRPOTrainer
    resume_check.GRPOConfig = trl.GRPOConfig if stock else GRPOConfig
    with tempfile.TemporaryDirectory() as tmp:
        full = resume_check.run_phase(config, model_dir, f"{tmp}/full")
        resumed = resume_check.run_phase(config, model_dir, f"{tmp}/resumed", resume_from=f"{tmp}/full/checkpoint-3")
    rows = lambda run: [r for r in run["logs"] if r.get("step", 0) > 3]  # noqa: E731
    same_prompts = [c for c in full["prompts"] if c[0] >= 3] == resumed["prompts"]
    diffs = [abs(a[k] - b[k]) for a, b in zip(rows(full), rows(resumed), strict=False) for k in a if k in b]
    diffs += [(full["params"][n] - resumed["params"][n]).abs().max().item() for n in full["params"]]
    return max(diffs), same_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(f"{tmp}/tiny"))
        print(f"{'configuration':38} {'stock TRL max diff':>18} {'prompts':>8} {'trl_grpo_ext':>13} {'prompts':>8}")
        for name in args.configs:
            stock, stock_prompts = measure(CONFIGS[name], model_dir, stock=True)
            ours, our_prompts = measure(CONFIGS[name], model_dir, stock=False)
            print(f"{name:38} {stock:18.3e} {'same' if stock_prompts else 'DIFFER':>8} {ours:13.3e} "
                  f"{'same' if our_prompts else 'DIFFER':>8}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
