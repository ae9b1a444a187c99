"""Gradient spikes every 50 steps, with and without ZClip (issue #5's second benchmark).

    python benchmarks/grad_reg/gradient_spikes.py [--max_steps 200] [--seeds 0 1 2] [--factor 1000] [--json FILE]

The task of `entropy_collapse.py` (tiny model, 8-token completions rewarded by their fraction of digits). At every
50th optimizer step the gradient of every parameter is multiplied by `--factor` during the backward pass, before the
Trainer clips it: a crafted large-gradient batch. The learning rate is 1e-3 and constant, so that the reward is still
climbing at the last spike and update norms compare across steps. Runs per seed:
    trl                stock `trl.GRPOTrainer`, clipping at `max_grad_norm=1.0` (the default)
    trl_noclip         stock `trl.GRPOTrainer` with `max_grad_norm=0` (no clipping): what a spike does unguarded
    ours_zclip         `grad_reg=["zclip"]` (α 0.97, z_thr 2.5, 25 warm-up steps), `max_grad_norm=1.0`
    trl_clip10         stock, `max_grad_norm=10`: a static bound far above the typical norm (~0.7 here), as 1.0 is
                       for a model whose gradient norm is typically 0.05-0.1
    ours_zclip_clip10  ZClip with `max_grad_norm=10`
Per step it records the norm of the parameter update the optimizer applied (‖θ_after − θ_before‖). The ratio is
taken over the steps after the first WARMUP = 25 (ZClip's warm-up): Adam's first steps move every weight by about the
learning rate whatever the gradient (m/√v = sign(g) at step 1: a norm of lr·√(number of weights)), with or without
any clipping, and no spike falls there. Pass criteria: with ZClip the largest update after the warm-up is <= 3x the
median update, and the final reward (mean of the last 10 steps) is >= TRL's.
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
from transformers import PrinterCallback, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.entropy.entropy_collapse import digit_reward  # noqa: E402
from trl_grpo_ext import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_grpo_ext.cli.tiny_model import save_tiny_model  # noqa: E402
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows  # noqa: E402

SPIKE_EVERY = 50
WARMUP = 25


class SpikeAndMeasure(TrainerCallback):
    """Multiplies every gradient by `factor` in each SPIKE_EVERY-th step's backward, and records update norms."""

    def __init__(self, model, factor: float):
        self.factor, self.spiking, self.updates, self.before = factor, False, [], None
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            p.register_hook(lambda grad: grad * self.factor if self.spiking else grad)

    def on_step_begin(self, args, state, control, **kwargs):
        self.spiking = (state.global_step + 1) % SPIKE_EVERY == 0

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.before = torch.cat([p.detach().flatten().clone() for p in self.params])

    def on_optimizer_step(self, args, state, control, **kwargs):
        after = torch.cat([p.detach().flatten() for p in self.params])
        self.updates.append((after - self.before).norm().item())
        self.spiking = False


RUNS = {
    "trl": (trl.GRPOTrainer, trl.GRPOConfig, {"max_grad_norm": 1.0}),
    "trl_noclip": (trl.GRPOTrainer, trl.GRPOConfig, {"max_grad_norm": 0.0}),
    "ours_zclip": (GRPOTrainer, GRPOConfig, {"max_grad_norm": 1.0, "grad_reg": ["zclip"]}),
    "trl_clip10": (trl.GRPOTrainer, trl.GRPOConfig, {"max_grad_norm": 10.0}),
    "ours_zclip_clip10": (GRPOTrainer, GRPOConfig, {"max_grad_norm": 10.0, "grad_reg": ["zclip"]}),
}


def run(
    name: str, model_dir: str, seed: int, max_steps: int, factor: float, output_dir: str, keep_log: bool = False
) -> dict:
    """One run of `name` with spikes of `factor` (with `keep_log`, also its whole `log_history`, which
    benchmarks/doctor/doctor_detection.py reads)."""
    trainer_cls, config_cls, extra = RUNS[name]
    args = config_cls(
        output_dir=output_dir, per_device_train_batch_size=16, num_generations=8, max_completion_length=8,
        learning_rate=1e-3, lr_scheduler_type="constant", max_steps=max_steps, logging_steps=1, report_to="none",
        save_strategy="no", seed=seed, use_cpu=True, bf16=False, disable_tqdm=True, **extra,
    )  # fmt: skip
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(256, seed=seed)))
    trainer = trainer_cls(model_dir, digit_reward, args, dataset)
    trainer.remove_callback(PrinterCallback)
    spikes = SpikeAndMeasure(trainer.model, factor)
    trainer.add_callback(spikes)
    trainer.train()
    rows = [row for row in trainer.state.log_history if "reward" in row]
    updates = spikes.updates
    measured = updates[WARMUP:]
    return {
        "updates": updates,
        "grad_norm": [row["grad_norm"] for row in rows],
        "reward": [row["reward"] for row in rows],
        "max_update": max(measured),
        "median_update": statistics.median(measured),
        "max_over_median": max(measured) / statistics.median(measured),
        "max_update_all_steps": max(updates),
        "final_reward": statistics.mean(row["reward"] for row in rows[-10:]),
        "spike_steps": [s for s in range(1, max_steps + 1) if s % SPIKE_EVERY == 0],
        **({"log": trainer.state.log_history} if keep_log else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--factor", type=float, default=1000.0)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--json", default=None)
    cli = parser.parse_args()
    results = {name: {} for name in cli.runs}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(Path(tmp) / "model", vocab_size=1024))
        for seed in cli.seeds:
            for name in cli.runs:
                result = run(name, model_dir, seed, cli.max_steps, cli.factor, f"{tmp}/{name}")
                results[name][seed] = result
                spikes = [result["updates"][s - 1] for s in result["spike_steps"]]
                print(f"{name:17s} seed {seed}: max update {result['max_update']:.4f} = "
                      f"{result['max_over_median']:.2f}x median {result['median_update']:.4f}; updates at spikes "
                      f"{', '.join(f'{u:.4f}' for u in spikes)}; final reward {result['final_reward']:.3f}",
                      flush=True)  # fmt: skip
    for ours, stock in (("ours_zclip", "trl"), ("ours_zclip_clip10", "trl_clip10")):
        if ours in results and stock in results:
            bounded = all(r["max_over_median"] <= 3 for r in results[ours].values())
            rewards = [(results[ours][s]["final_reward"], results[stock][s]["final_reward"]) for s in cli.seeds]
            print(f"{ours}: largest update <= 3x median on every seed: {bounded}; final reward ours vs {stock}: "
                  + ", ".join(f"{a:.3f} vs {b:.3f}" for a, b in rewards))  # fmt: skip
    if cli.json:
        Path(cli.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
