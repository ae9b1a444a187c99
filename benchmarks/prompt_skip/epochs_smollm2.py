"""Prompt skipping on a real model where prompts come back (issue #70): SmolLM2-135M-Instruct with LoRA, 64 arithmetic
prompts of mixed difficulty trained for 5 epochs, against stock TRL and the bound of a skipping rule.

    trl-grpo-ext smollm2 /work/smollm2
    python benchmarks/prompt_skip/epochs_smollm2.py run --model /work/smollm2 --seeds 0 1 2
    python benchmarks/prompt_skip/epochs_smollm2.py report --output benchmarks/prompt_skip/results/epochs_smollm2.txt
    python benchmarks/prompt_skip/epochs_smollm2.py smoke      # 2 steps on the tiny model (CI)

The prompts (`epoch_rows`, 64): single-digit sums and products (32, learnable: 16-22% solved at the start), two-digit
sums (16, about 5%: rarely informative) and three-digit sums (16, 0%: never informative). 8 prompts a step, so 40
steps are 5 epochs: each prompt comes back 4 times, where a skipping rule can act. Reward 1.0 when the completion's
last integer is the answer. Runs as `benchmarks/real_model/real_model_mix.py` (resumable per variant x seed, a final
evaluation of every group). Variants: `stock`, `prompt_skip` (`prompt_skip: true`, the README setting) and
`groups` (prompt skipping told each prompt's policy group, the `task` column, with TRL's draw: a group none of whose
prompts was ever informative is thinned from its first visits, `prompt_skip_group_informative` 0.2) and
`posterior` (`prompt_skip_rule: posterior`: a prompt kept with its chance of giving signal, from all its
completions so far). The
bound (`skip_bound` in the report) is stock TRL's own runs with every generation group whose completions all got the
same reward not generated: a rule that knew in advance which groups give no signal, and changed nothing else (those
groups have zero advantage), saves exactly their tokens; it is read from stock's logs, each step's tokens times the
share of its generation groups that disagreed (TRL's `frac_reward_zero_std`). `history_bound`: the same with the
first epoch generated whole, the bound of a rule that reads each prompt's own history (it sees every prompt once
before it can skip it). Reported: completion tokens until the
learnable group's reward reaches 0.8 x stock TRL's final one (median over seeds), over stock's, and the share of the
bound's saving; the final reward of every group.
"""

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.real_model.real_model_mix import (  # noqa: E402
    COMPLETIONS,
    THRESHOLD_SHARE,
    Mix,
    arithmetic_score,
    learnable_curve,
    main,
)

RESULTS = Path(__file__).resolve().parent / "results" / "epochs_smollm2"


def epoch_rows() -> list[dict]:
    """The 64 prompts (module docstring), in a fixed order."""
    import random

    rng = random.Random(70)
    rows = []

    def add(task: str, text: str, answer: int) -> None:
        content = f"{text} Answer with the number."
        rows.append({"prompt": [{"role": "user", "content": content}], "answer": str(answer), "task": task})

    pairs = [(a, b) for a in range(2, 10) for b in range(2, 10)]
    for a, b in rng.sample(pairs, 16):
        add("single", f"What is {a} times {b}?", a * b)
    for a, b in rng.sample(pairs, 16):
        add("single", f"What is {a} plus {b}?", a + b)
    for _ in range(16):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        add("two_digit", f"What is {a} plus {b}?", a + b)
    for _ in range(16):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        add("three_digit", f"What is {a} plus {b}?", a + b)
    return rows


# the README setting, and prompt skipping told each prompt's policy group (the `task` column) with TRL's draw, so
# that a group none of whose prompts was ever informative is thinned from its first visits on
# (`prompt_skip_group_informative`, f = 0.2 as benchmarks/prompt_skip/README.md measured it on the synthetic family)
VARIANTS = {"stock": {}, "prompt_skip": {"prompt_skip": True},
            "groups": {"prompt_skip": True, "policy_group_column": "task", "policy_group_sampling": "uniform",
                       "prompt_skip_group_informative": 0.2},
            "posterior": {"prompt_skip": True, "prompt_skip_rule": "posterior"}}  # fmt: skip
EPOCHS = Mix(epoch_rows, arithmetic_score, ("single", "two_digit", "three_digit"), ("single",), ("three_digit",),
             ("three_digit",), VARIANTS, RESULTS)  # fmt: skip
EPOCH_STEPS = 8  # 64 prompts, 8 a step: steps 1-8 are every prompt's first visit
GENERATIONS = COMPLETIONS // 8  # completions a generation group (8 prompts a step)


def bound_tokens(result: dict, threshold: float, seen_first: int = 0) -> float | None:
    """The tokens a perfect skipping rule would have generated in stock TRL's run `result` until the threshold: each
    step's tokens times the share of its generation groups that disagreed (None: never reached). `seen_first`: the
    steps generated whole before the rule knows anything (`EPOCH_STEPS`: the bound of a rule that reads each prompt's
    own history, which has seen every prompt once only after the first epoch)."""
    tokens = 0.0
    for step, (value, row) in enumerate(zip(learnable_curve(result, EPOCHS), result["steps"], strict=False), start=1):
        kept = 1.0 if step <= seen_first else 1 - row["frac_reward_zero_std"]
        tokens += row["completions/mean_length"] * COMPLETIONS * kept
        if value is not None and value >= threshold:
            return tokens
    return None


def bound_line(results: Path = RESULTS) -> str:
    """The bound's tokens to the threshold (median over stock's seeds) and its ratio to stock TRL's; the same for the
    bound of a rule that must see each prompt once (`bound_tokens`' `seen_first`)."""
    import json

    from benchmarks.real_model.real_model_mix import to_threshold

    stock = [json.loads(p.read_text()) for p in sorted(results.glob("stock_seed*.json"))]
    if not stock:
        return "skip_bound: no stock run yet"
    threshold = THRESHOLD_SHARE * statistics.median(learnable_curve(r, EPOCHS)[-1] for r in stock)
    reached = [r for r in stock if to_threshold(r, threshold, EPOCHS)[1] is not None]
    if not reached:
        return "skip_bound: stock never reached the threshold"
    full = statistics.median(to_threshold(r, threshold, EPOCHS)[1] for r in reached)
    lines = []
    for name, seen in (("skip_bound", 0), ("history_bound", EPOCH_STEPS)):
        bound = statistics.median(bound_tokens(r, threshold, seen) for r in reached)
        lines.append(f"{name} (stock's {len(reached)} seeds that reached it): {bound:.0f} tokens, x{bound / full:.2f} "
                     "of stock's")  # fmt: skip
    return "\n".join(lines)


PHASES = ((1, EPOCH_STEPS), (EPOCH_STEPS + 1, 3 * EPOCH_STEPS), (3 * EPOCH_STEPS + 1, 5 * EPOCH_STEPS))


def phase_figures(result: dict) -> list[tuple[float, float]]:
    """Per phase of the run (`PHASES`: the first epoch, epochs 2-3, epochs 4-5), the generation groups generated and
    the share of them whose completions all got the same reward (TRL's `frac_reward_zero_std`, weighted by each
    step's groups). A rule that skips the groups that would give no signal lowers that share; one whose skips are
    no better than chance leaves it as stock TRL's and only generates fewer groups."""
    figures = []
    for first, last in PHASES:
        rows = result["steps"][first - 1 : last]
        groups = [row.get("prompt_skip/completion_tokens", row["completions/mean_length"] * COMPLETIONS)
                  / max(row["completions/mean_length"], 1e-9) / GENERATIONS for row in rows]  # fmt: skip
        agreed = sum(row["frac_reward_zero_std"] * n for row, n in zip(rows, groups, strict=True))
        figures.append((sum(groups), agreed / sum(groups) if sum(groups) else math.nan))
    return figures


def phase_line(results: Path = RESULTS) -> str:
    """`phase_figures` per variant, the mean over its seeds; and the whole run's completion tokens over stock's."""
    import json

    from benchmarks.real_model.real_model_mix import run_tokens

    runs: dict[str, list[dict]] = {}
    for path in sorted(results.glob("*_seed*.json")):
        data = json.loads(path.read_text())
        runs.setdefault(data["variant"], []).append(data)
    if "stock" not in runs:
        return "phases: no stock run yet"
    stock_tokens = statistics.fmean(run_tokens(r) for r in runs["stock"])
    phases = ", ".join(f"{first}-{last}" for first, last in PHASES)
    lines = [f"generation groups generated / the share giving no signal, mean over seeds, in steps {phases}; the "
             "whole run's completion tokens over stock's:"]  # fmt: skip
    for variant, variant_runs in runs.items():
        cells = []
        for index in range(len(PHASES)):
            pairs = [phase_figures(r)[index] for r in variant_runs]
            cells.append(f"{statistics.fmean(g for g, _ in pairs):.0f} / {statistics.fmean(s for _, s in pairs):.2f}")
        tokens = statistics.fmean(run_tokens(r) for r in variant_runs) / stock_tokens
        lines.append(f"{variant} ({len(variant_runs)} seeds): {' | '.join(cells)}; run tokens x{tokens:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], {"epochs": EPOCHS}, extra=lambda _: bound_line() + "\n" + phase_line()))
