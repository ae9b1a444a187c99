"""The same run however a step is split, in float32, with every feature on: stock TRL against ours, several seeds.

    python benchmarks/entropy/split_invariance.py [--seeds 0 1 2 3 4] [--steps 4] [--dtype float32] [--json FILE]

A tiny random-init Qwen2 model trains `--steps` steps of 8 completions (2 prompts x 4 generations, 2 passes over each
generation batch, beta 0.04) as 8x1 and as 2x4 (`per_device_train_batch_size` x `gradient_accumulation_steps`), once
with stock `trl.GRPOTrainer` and once with ours and every feature on (policy groups, prompt skipping, the entropy
target per group with Clip-Cov and the entropy advantage, ZClip, AGC and the non-finite guard, adaptive KL, the run
doctor). For each seed: the largest parameter difference between the two splits, for TRL and for ours. The same
completions are trained in both splits; what differs is only the order of float32 sums, and Adam's first updates
(g / (|g| + 1e-8)) turn that rounding into parameter differences where a gradient entry is near 1e-8, so the
differences vary from seed to seed for TRL as for ours: compare their medians and maxima over seeds.
`tests/training/test_split_invariance.py` checks the same in float64, with the statistics and metrics that steer
training, against TRL's own differences.
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from trl_grpo_ext import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_grpo_ext.cli.tiny_model import save_tiny_model  # noqa: E402
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows  # noqa: E402

SPLITS = ((8, 1), (2, 4))
EVERY_FEATURE = dict(policy_group_column="difficulty", remove_unused_columns=False, prompt_skip=True,
                     entropy_reg=["target", "clip_cov", "advantage"], entropy_target=8.0,
                     entropy_target_per_group=True, grad_reg=["zclip", "agc", "skip_nonfinite"],
                     zclip_warmup_steps=2, kl_target=1e-4, run_doctor=True)  # fmt: skip


def reward(completions, **kwargs) -> list[float]:
    return [len(str(c)) % 7 / 7 for c in completions]


def final_parameters(trainer_class, config_class, model_dir, output_dir, split, seed, steps, dtype, features):
    batch, accumulation = split
    args = config_class(output_dir=output_dir, per_device_train_batch_size=batch,
                        gradient_accumulation_steps=accumulation, num_generations=4, max_completion_length=8,
                        max_steps=steps, learning_rate=1e-3, num_iterations=2, beta=0.04, logging_steps=1,
                        report_to="none", save_strategy="no", seed=seed, use_cpu=True, bf16=False, disable_tqdm=True,
                        **features)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(32, seed=0)))
    trainer = trainer_class(model, reward, args, dataset, processing_class=AutoTokenizer.from_pretrained(model_dir))
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--json", help="write the differences here")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    runs = {"trl": (trl.GRPOTrainer, trl.GRPOConfig, {}), "ours": (GRPOTrainer, GRPOConfig, EVERY_FEATURE)}
    diffs = {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(Path(tmp) / "tiny", seed=0)
        for seed in args.seeds:
            for name, (trainer_class, config_class, features) in runs.items():
                a, b = (final_parameters(trainer_class, config_class, model_dir, f"{tmp}/{name}{s[0]}", s, seed,
                                         args.steps, dtype, features) for s in SPLITS)  # fmt: skip
                diffs[name].append(max((a[k] - b[k]).abs().max().item() for k in a))
            print(f"seed {seed}: TRL {diffs['trl'][-1]:.3g}, ours {diffs['ours'][-1]:.3g}", flush=True)
    summary = {name: {"median": statistics.median(v), "max": max(v), "per_seed": v} for name, v in diffs.items()}
    ratio = summary["ours"]["median"] / summary["trl"]["median"]
    print(f"median: TRL {summary['trl']['median']:.3g}, ours {summary['ours']['median']:.3g} ({ratio:.2f}x); max: TRL "
          f"{summary['trl']['max']:.3g}, ours {summary['ours']['max']:.3g}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"dtype": args.dtype, "steps": args.steps, "seeds": args.seeds,
                                               **summary}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
