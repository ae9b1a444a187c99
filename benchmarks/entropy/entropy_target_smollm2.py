"""The entropy target on a real pretrained model (issue #33): SmolLM2-135M-Instruct with LoRA on short arithmetic.

    trl-grpo-ext smollm2 /work/smollm2        # builds the model folder once, no Hub needed
    python benchmarks/entropy/entropy_target_smollm2.py --model /work/smollm2 \
        --json benchmarks/entropy/results/entropy_target_smollm2_30.json          # seeds 0-2, every variant
    python benchmarks/entropy/entropy_target_smollm2.py --model /work/smollm2 --variants \\
        --ours '{"entropy_pi_noise_band": 0}'

Prompts: every single-digit sum and product ("What is 7 times 8? Answer with the number."), 162 of them; reward 1.0
when the last integer of the completion is the answer. LoRA r 16 on every projection, learning rate 1e-4,
`MAX_STEPS` steps of 8 prompts x 4 completions x 16 tokens at temperature 1 (a step takes tens of seconds on 2
CPU cores: this is kept out of CI). Variants as in `entropy_target_family.py`: stock TRL, TRL's adaptive entropy at
its defaults, our absolute target at the presets' former 0.6 nats, and the README's relative target
(`entropy_target_ratio`, `entropy_target_family.RATIO`, its other settings at their defaults); `--ours` JSON
overrides on top of it make more variants. Reported per
variant: the entropy at step 1, its target, the lowest entropy after the first crossing over the target, the final
entropy and reward (means of the last 5 steps).
"""

import argparse
import json
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.entropy.entropy_target_family import RATIO  # noqa: E402
from benchmarks.harness import add_output_arguments, load_results, with_ours  # noqa: E402

MAX_STEPS = 30  # a step takes about 26 s on 2 idle cores here (100-300 s on busy ones)
VARIANTS = {"relative": {"entropy_reg": "target", "entropy_target_ratio": RATIO},  # the README's setting
            "trl": None, "trl_adaptive": {"use_adaptive_entropy": True},
            "absolute": {"entropy_reg": "target", "entropy_target": 0.6}}  # fmt: skip
_INTEGER = re.compile(r"-?\d+")


def arithmetic_rows() -> list[dict]:
    """Every single-digit sum and product as a chat prompt with its `answer`: 162 rows."""
    rows = []
    for a in range(1, 10):
        for b in range(1, 10):
            for word, value in (("plus", a + b), ("times", a * b)):
                content = f"What is {a} {word} {b}? Answer with the number."
                rows.append({"prompt": [{"role": "user", "content": content}], "answer": str(value)})
    return rows


def last_integer_is_the_answer(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's last integer equals `answer`, else 0.0."""
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        numbers = _INTEGER.findall(completion[0]["content"] if isinstance(completion, list) else completion)
        scores.append(float(bool(numbers) and numbers[-1] == gold))
    return scores


def run(job: dict) -> dict:
    import torch

    torch.set_num_threads(job["threads"])
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback

    from trl_grpo_ext import GRPOConfig, GRPOTrainer

    overrides = job["overrides"]
    ours = overrides is not None and "entropy_reg" in overrides
    with tempfile.TemporaryDirectory() as out:
        settings = dict(
            output_dir=out, per_device_train_batch_size=32, num_generations=4, max_completion_length=16,
            learning_rate=1e-4, max_steps=job["max_steps"], logging_steps=1, report_to="none", save_strategy="no",
            seed=job["seed"], use_cpu=True, bf16=False, disable_tqdm=True, temperature=1.0,
            **(overrides or {}),
        )  # fmt: skip
        config_cls, trainer_cls = (GRPOConfig, GRPOTrainer) if ours else (trl.GRPOConfig, trl.GRPOTrainer)
        lora = LoraConfig(
            r=16,
            lora_alpha=32,
            task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
        dataset = Dataset.from_list(arithmetic_rows())
        trainer = trainer_cls(job["model"], last_integer_is_the_answer, config_cls(**settings), dataset,
                              peft_config=lora)  # fmt: skip
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    rows = [row for row in trainer.state.log_history if "entropy" in row]
    entropy, rewards = [row["entropy"] for row in rows], [row["reward"] for row in rows]
    measured = [row["entropy_reg/target"] for row in rows if "entropy_reg/target" in row]
    target = measured[-1] if measured else (overrides or {}).get("entropy_target", 0.2 if overrides else None)
    begin = settings.get("entropy_target_window", GRPOConfig.entropy_target_window) if measured else 0  # its 1st step
    crossed = None if target is None else next((i for i, h in enumerate(entropy) if i >= begin and h <= target), None)
    lowest = min(entropy[crossed:]) if crossed is not None else None
    return {"variant": job["variant"], "seed": job["seed"], "entropy": entropy, "reward": rewards, "target": target,
            "coef": [row.get("entropy_reg/coef") for row in rows], "first_crossing": crossed,
            "lowest_share": None if lowest is None else lowest / target,
            "final_reward": statistics.mean(rewards[-5:]), "final_entropy": statistics.mean(entropy[-5:]),
            "step_time": statistics.mean(row["step_time"] for row in rows if "step_time" in row)}  # fmt: skip


def report(results: list[dict]) -> str:
    lines = []
    trl_final = {r["seed"]: r["final_reward"] for r in results if r["variant"] == "trl"}
    for r in sorted(results, key=lambda r: (list(VARIANTS).index(r["variant"]) if r["variant"] in VARIANTS else 9,
                                            r["seed"])):  # fmt: skip
        gap = r["final_reward"] - trl_final[r["seed"]] if r["seed"] in trl_final else float("nan")
        share = "-" if r["lowest_share"] is None else f"{r['lowest_share']:.2f}"
        target = "-" if r["target"] is None else f"{r['target']:.3f}"
        lines.append(f"{r['variant']:13s} seed {r['seed']}: entropy at step 1 {r['entropy'][0]:.3f}, target {target}, "
                     f"lowest after crossing / target {share}, final entropy {r['final_entropy']:.3f}, reward at "
                     f"step 1 {r['reward'][0]:.3f}, final reward {r['final_reward']:.3f} ({gap:+.3f} against trl), "
                     f"{r['step_time']:.0f} s a step")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="SmolLM2-135M-Instruct folder (`trl-grpo-ext smollm2 DIR` builds one)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ours", nargs="*", default=[], help="JSON overrides of `relative`, one variant each")
    parser.add_argument("--max_steps", type=int, default=MAX_STEPS)
    add_output_arguments(parser)
    args = parser.parse_args()
    if args.report:
        print(report(load_results(args.report)))
        return
    if not args.model or not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: not a model folder; build one with trl-grpo-ext smollm2 DIR")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).is_file() else []
    done = {(r["variant"], r["seed"]) for r in results}
    threads = max(1, (os.cpu_count() or 2) // args.workers)
    variants = with_ours(VARIANTS, args.variants, args.ours)
    jobs = [{"variant": v, "seed": s, "overrides": overrides, "model": args.model, "max_steps": args.max_steps,
             "threads": threads}
            for s in args.seeds for v, overrides in variants.items() if (v, s) not in done]  # fmt: skip
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for result in pool.map(run, jobs):
            print(f"{result['variant']} seed {result['seed']}: final reward {result['final_reward']:.3f}", flush=True)
            results.append(result)
            if args.json:
                Path(args.json).write_text(json.dumps(results))
    print(report(results))


if __name__ == "__main__":
    main()
