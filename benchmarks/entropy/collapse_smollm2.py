"""The entropy target where a real model's entropy collapses (issue #70): SmolLM2-135M-Instruct with LoRA on a narrow
task, in regimes that push stock TRL's entropy down, against stock TRL and TRL's own entropy options.

    trl-grpo-ext smollm2 /work/smollm2
    python benchmarks/entropy/collapse_smollm2.py run --model /work/smollm2 --mix lr1e-3 --variants stock --seeds 0
    python benchmarks/entropy/collapse_smollm2.py run --model /work/smollm2 --mix lr1e-3 --seeds 0 1 2
    python benchmarks/entropy/collapse_smollm2.py report --mix lr1e-3
    python benchmarks/entropy/collapse_smollm2.py smoke           # 2 steps on the tiny model (CI)

The task (`narrow_rows`): single-digit sums and products as chat prompts, reward 1.0 when the completion's last
integer is the answer; 120 prompts trained, 42 held out for the final evaluation (pass@4 and the share of distinct
completions, `real_model_mix.final_evaluation`). The regimes (`REGIMES`, each a mix of its own with the settings it
changes over `real_model_mix.py`'s runs: LoRA r 16, learning rate 1e-4, 8 prompts x 4 completions x 16 tokens at
temperature 1): a learning rate 10 times higher, four optimizer steps per generation batch (`num_iterations`), and
both halved. Variants: `stock`; `entropy`, the README setting (`entropy_reg: target`, `entropy_target_ratio: 0.15`);
TRL's own options, `trl_adaptive` (`use_adaptive_entropy`, its defaults) and `trl_bonus` (`entropy_coef` 0.01).
Reported per variant (`entropy_report`, median and mean±SE over seeds): the entropy at step 1, the target (0.15 of it),
the lowest 5-step mean entropy over the target, the final entropy and reward (means of the last 5 steps), and the
held-out pass@4, reward and distinct share.
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.real_model.real_model_mix import Mix, arithmetic_score, main  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "collapse_smollm2"
RATIO = 0.15  # the README's entropy_target_ratio
VARIANTS = {"stock": {}, "entropy": {"entropy_reg": "target", "entropy_target_ratio": RATIO},
            "trl_adaptive": {"use_adaptive_entropy": True}, "trl_bonus": {"entropy_coef": 0.01}}  # fmt: skip
REGIMES = {"lr1e-3": {"learning_rate": 1e-3}, "iter4": {"num_iterations": 4},
           "lr5e-4_iter2": {"learning_rate": 5e-4, "num_iterations": 2}}  # fmt: skip


def narrow_rows(held_out: bool = False) -> list[dict]:
    """Every single-digit sum and product, 162 prompts: a seeded 42 held out (`held_out=True`) and the other 120."""
    import random

    rows = []
    for a in range(1, 10):
        for b in range(1, 10):
            for word, value in (("plus", a + b), ("times", a * b)):
                content = f"What is {a} {word} {b}? Answer with the number."
                rows.append({"prompt": [{"role": "user", "content": content}], "answer": str(value), "task": "arith"})
    kept = set(random.Random(33).sample(range(len(rows)), 42))
    return [row for i, row in enumerate(rows) if (i in kept) == held_out]


MIXES = {name: Mix(narrow_rows, arithmetic_score, ("arith",), ("arith",), (), (), VARIANTS, RESULTS / name, settings,
                   eval_rows=lambda: narrow_rows(held_out=True)) for name, settings in REGIMES.items()}  # fmt: skip


def _mean_se(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}" if values else "-"
    return f"{statistics.fmean(values):.3f}±{statistics.stdev(values) / len(values) ** 0.5:.3f}"


def entropy_figures(result: dict) -> dict:
    """A run's entropy figures (module docstring) from its logged rows and its final evaluation."""
    rows = result["steps"]
    entropy = [row["entropy"] for row in rows]
    target = RATIO * entropy[0]
    means = [statistics.fmean(entropy[i : i + 5]) for i in range(len(entropy) - 4)]
    held_out = result.get("eval", {}).get("arith", {})
    return {
        "start": entropy[0],
        "target": target,
        "lowest_share": min(means) / target,
        "final_entropy": statistics.fmean(entropy[-5:]),
        "final_reward": statistics.fmean(row["reward"] for row in rows[-5:]),
        "pass@4": held_out.get("pass@4"),
        "held_out": held_out.get("reward"),
        "distinct": held_out.get("distinct"),
    }


def entropy_report(regime: str) -> str:
    """One line per variant of `regime` over the seeds it ran: each figure's mean±SE."""
    runs: dict[str, list[dict]] = {}
    for path in sorted(MIXES[regime].results.glob("*_seed*.json")):
        data = json.loads(path.read_text())
        runs.setdefault(data["variant"], []).append(entropy_figures(data))
    lines = [f"# entropy collapse, regime {regime} {REGIMES[regime]}: mean±SE over seeds"]
    keys = ("start", "target", "lowest_share", "final_entropy", "final_reward", "pass@4", "held_out", "distinct")
    lines.append("variant | seeds | " + " | ".join(keys))
    for variant, figures in runs.items():
        cells = [_mean_se([f[k] for f in figures if f[k] is not None]) for k in keys]
        lines.append(f"{variant} | {len(figures)} | " + " | ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], MIXES, extra=entropy_report))
