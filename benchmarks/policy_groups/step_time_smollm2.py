"""Policy grouping's step time on a real model (issue #69): SmolLM2-135M-Instruct with LoRA on the `arithmetic` mix
of `benchmarks/real_model/real_model_mix.py`, stock TRL and the README setting (`policy_group_column: task`)
measured in one process, one after the other, `--rounds` times each, so that both see the same machine.

    trl-grpo-ext smollm2 /work/smollm2
    python benchmarks/policy_groups/step_time_smollm2.py --model /work/smollm2 \\
        --output benchmarks/policy_groups/results/step_time_smollm2.txt

Each round trains each variant `--steps` steps from the same seed (the regime of the mix: LoRA r 16, 8 prompts x 4
completions x 16 tokens, temperature 1), the first step of each left out (model set-up). Two figures: the ratio of
the mean step time (TRL's `step_time`) of policy grouping to stock TRL's, which also holds what the draw changes (the
prompts drawn, hence the completions' lengths), and the time policy grouping's own work takes per step (its hooks:
the statistics, the score and the draw, the log-probabilities noted and summed), over stock TRL's mean step time.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.real_model.real_model_mix import COMPLETIONS, MIXES, MixReward  # noqa: E402

HOOKS = ("generation_batch", "rewards", "advantages", "policy_logps", "loss_end")


def train(model: str, grouped: bool, steps: int, seed: int, threads: int) -> tuple[list[float], float]:
    """(step times after the first, seconds spent in policy grouping's hooks after the first step) of one run."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback

    from trl_grpo_ext import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    mix = MIXES["arithmetic"]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, per_device_train_batch_size=COMPLETIONS, num_generations=4, max_completion_length=16,
            learning_rate=1e-4, max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", seed=seed,
            use_cpu=True, bf16=False, disable_tqdm=True, temperature=1.0, beta=0.0, gradient_checkpointing=False,
            **({"policy_group_column": "task"} if grouped else {}),
        )  # fmt: skip
        lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
        reward = MixReward(Path(out) / "rewards.jsonl", mix)
        dataset = Dataset.from_list(mix.rows())
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=dataset, peft_config=lora)
        trainer.remove_callback(PrinterCallback)
        spent = [0.0]
        if grouped:
            feature = trainer.features["policy_groups"]
            for name in HOOKS:
                setattr(feature, name, _timed(getattr(feature, name), spent, trainer))
        trainer.train()
    times = [row["step_time"] for row in trainer.state.log_history if "step_time" in row]
    return times[1:], spent[0]


def _timed(hook, spent: list[float], trainer):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return hook(*args, **kwargs)
        finally:
            if trainer.state.global_step >= 1:
                spent[0] += time.perf_counter() - start

    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the SmolLM2 folder (`trl-grpo-ext smollm2 DIR`)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", help="also write the result to this file")
    args = parser.parse_args(argv)
    stock, grouped, hooks = [], [], []
    for round_ in range(args.rounds):
        stock += train(args.model, False, args.steps, round_, args.threads)[0]
        times, spent = train(args.model, True, args.steps, round_, args.threads)
        grouped += times
        hooks.append(spent / len(times))
    lines = [
        f"# {' '.join(sys.argv)}",
        f"stock TRL: mean step time {statistics.fmean(stock):.2f} s over {len(stock)} steps",
        f"policy groups: {statistics.fmean(grouped):.2f} s over {len(grouped)} steps; "
        f"ratio {statistics.fmean(grouped) / statistics.fmean(stock):.3f}",
        f"policy groups' own work: {statistics.fmean(hooks):.3f} s a step, "
        f"{statistics.fmean(hooks) / statistics.fmean(stock):.2%} of stock TRL's step",
    ]  # fmt: skip
    print("\n".join(lines))
    if args.output:
        Path(args.output).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
