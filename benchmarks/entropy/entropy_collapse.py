"""Entropy collapse on CPU, and what each entropy option does about it (issue #5's first benchmark).

    python benchmarks/entropy/entropy_collapse.py [--max_steps 200] [--seeds 0 1 2] [--out benchmarks/entropy/results]

A tiny random-init Qwen2 model with a 1,024-token vocabulary (mean token entropy starts near ln 1024 = 6.9 nats)
learns, at learning rate 3e-3, to write 8-token completions made of digits (reward = fraction of digit characters).
Plain TRL GRPO collapses the entropy while the reward reaches 1.0. The same run is repeated with:
    trl_static   TRL's static bonus, `entropy_coef=0.01`
    trl_adaptive TRL's Skywork-OR1 on/off controller, `use_adaptive_entropy=True`, `entropy_target=1.0`
    ours_target  `entropy_reg=target`, `entropy_target=1.0` (our PI controller)
Pass criteria (issue #5): with ours_target the mean token entropy stays >= 0.8 nats at every logged step after step
100 and the final reward (mean of the last 10 steps) is >= 0.9. Writes `entropy_collapse.json` and
`entropy_collapse.png` (entropy and reward against step, one line per option and seed) to `--out`.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trl
from datasets import Dataset
from transformers import PrinterCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from trl_grpo_ext import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_grpo_ext.cli.tiny_model import save_tiny_model  # noqa: E402
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows  # noqa: E402

TARGET = 1.0
OPTIONS = {
    "trl": (trl.GRPOTrainer, trl.GRPOConfig, {}),
    "trl_static": (trl.GRPOTrainer, trl.GRPOConfig, {"entropy_coef": 0.01}),
    "trl_adaptive": (trl.GRPOTrainer, trl.GRPOConfig, {"use_adaptive_entropy": True, "entropy_target": TARGET}),
    "ours_target": (GRPOTrainer, GRPOConfig, {"entropy_reg": "target", "entropy_target": TARGET}),
}


def digit_reward(completions, **kwargs) -> list[float]:
    """Fraction of digit characters in each completion (0 for an empty one)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in texts]


def run(option: str, model_dir: str, seed: int, max_steps: int, output_dir: str, keep_log: bool = False) -> dict:
    """One run of `option`: its entropy, reward and coefficient per step (and with `keep_log`, its whole
    `log_history`, which benchmarks/doctor/doctor_detection.py reads)."""
    trainer_cls, config_cls, extra = OPTIONS[option]
    args = config_cls(
        output_dir=output_dir, per_device_train_batch_size=16, num_generations=8, max_completion_length=8,
        learning_rate=3e-3, max_steps=max_steps, logging_steps=1, report_to="none", save_strategy="no", seed=seed,
        use_cpu=True, bf16=False, disable_tqdm=True, **extra,
    )  # fmt: skip
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(256, seed=seed)))
    trainer = trainer_cls(model_dir, digit_reward, args, dataset)
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    rows = [row for row in trainer.state.log_history if "entropy" in row]
    return {
        "seconds": time.perf_counter() - start,
        "entropy": [row["entropy"] for row in rows],
        "reward": [row["reward"] for row in rows],
        "coef": [row.get("entropy_reg/coef", row.get("entropy_coef")) for row in rows],
        **({"log": trainer.state.log_history} if keep_log else {}),
    }


def verdict(result: dict) -> dict:
    after_100 = result["entropy"][100:]
    return {
        "min_entropy_after_step_100": min(after_100) if after_100 else None,
        "final_entropy": statistics.mean(result["entropy"][-10:]),
        "final_reward": statistics.mean(result["reward"][-10:]),
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_entropy, ax_reward) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = dict(zip(OPTIONS, ["tab:red", "tab:orange", "tab:purple", "tab:green"], strict=True))
    for option, per_seed in results.items():
        for i, result in enumerate(per_seed.values()):
            steps = range(1, len(result["entropy"]) + 1)
            label = option if i == 0 else None
            ax_entropy.plot(steps, result["entropy"], color=colors[option], alpha=0.8, label=label)
            ax_reward.plot(steps, result["reward"], color=colors[option], alpha=0.8, label=label)
    ax_entropy.axhline(TARGET, color="gray", linestyle="--", label=f"target {TARGET} nats")
    ax_entropy.set(xlabel="step", ylabel="mean token entropy (nats)", title="Entropy", ylim=(0, None))
    ax_reward.set(xlabel="step", ylabel="reward (fraction of digits)", title="Reward", ylim=(0, 1.05))
    ax_entropy.legend()
    ax_reward.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--options", nargs="+", default=list(OPTIONS), choices=list(OPTIONS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--ours", type=json.loads, default={}, help="JSON of GRPOConfig overrides for ours_target")
    cli = parser.parse_args()
    OPTIONS["ours_target"][2].update(cli.ours)
    out = Path(cli.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(Path(tmp) / "model", vocab_size=1024))
        results = {
            option: {seed: run(option, model_dir, seed, cli.max_steps, f"{tmp}/{option}-{seed}") for seed in cli.seeds}
            for option in cli.options
        }
    summary = {option: {seed: verdict(r) for seed, r in per_seed.items()} for option, per_seed in results.items()}
    for option, per_seed in summary.items():
        for seed, v in per_seed.items():
            print(f"{option:13s} seed {seed}: " + ", ".join(f"{k} {v[k]:.3f}" for k in v if v[k] is not None))
    if "ours_target" in summary:
        passed = all(
            v["min_entropy_after_step_100"] >= 0.8 and v["final_reward"] >= 0.9
            for v in summary["ours_target"].values()
        )
        print(f"ours_target: entropy >= 0.8 after step 100 and final reward >= 0.9 on every seed: {passed}")
    (out / "entropy_collapse.json").write_text(json.dumps({"summary": summary, "curves": results}, indent=1))
    plot(results, out / "entropy_collapse.png")
    print(f"wrote {out / 'entropy_collapse.json'} and {out / 'entropy_collapse.png'}")


if __name__ == "__main__":
    main()
