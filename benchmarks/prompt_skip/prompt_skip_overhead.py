"""What prompt skipping costs (issues #17, #29): memory for a million prompts, and the time of its per-batch work.

    python benchmarks/prompt_skip/prompt_skip_overhead.py [--prompts 1000000] [--batch 64] [--generations 8] \\
        [--repeats 20]

Memory: the bytes `PromptHistory` holds for `--prompts` prompts, and the size of the state as a checkpoint writes it
(`torch.save` of `PromptSkipState.state_dict()`, which also holds the rest of the current pass over the dataset: 8
bytes a prompt at the start of a pass, none at its end). Time, median of `--repeats`, with half of the history
uninformative (streaks 1-5) and half of it never seen:

- without refilling (the default): the keep probabilities of the `--batch` drawn prompts, with the first-visit
  prediction from 8 policy groups (the solved share of each, over the whole history), the decisions and the layout,
  plus folding the batch's rewards into the history;
- with refilling: the draw of `--batch` prompts through the keep filter, plus folding the rewards in.

Compare it with a step: 40-58 s on an H200 for the presets, 0.24 s for the tiny CPU model of
`prompt_skip_learning.py`.
"""

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from trl_grpo_ext.prompt_skip.history import NEVER  # noqa: E402
from trl_grpo_ext.prompt_skip.skipping import (  # noqa: E402
    count_evidence,
    hopeless_base,
    keep_for_layout,
    keep_probability,
    layout_quantum,
    prompt_keep_probability,
)
from trl_grpo_ext.prompt_skip.state import PromptSkipState  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    state = PromptSkipState(args.prompts, base=0.5, seed=0)
    generator = torch.Generator().manual_seed(0)
    uninformative = torch.rand(args.prompts, generator=generator) < 0.5
    state.history.streak[uninformative] = torch.randint(1, 6, (int(uninformative.sum()),), generator=generator).to(
        torch.int8
    )
    seen = torch.rand(args.prompts, generator=generator) < 0.5
    state.history.last_step[seen] = 1
    state.history.value[uninformative] = 1.0
    state.best_reward = 1.0
    groups = (torch.randint(0, 8, (args.prompts,), generator=generator), 8)
    no_refill = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        rows = torch.randint(0, args.prompts, (args.batch,), generator=generator)
        hopeless = hopeless_base(state.evidence)  # as with prompt_skip_hopeless (its cost included)
        probability = prompt_keep_probability(
            state.history,
            rows,
            base=state.base,
            hopeless=hopeless,
            best=state.best_reward,
            grace=3,
            floor=0.05,
            groups=groups,
        )
        draws = torch.rand(args.batch, dtype=torch.float64, generator=state.decision_generator())
        kept = keep_for_layout(draws < probability, probability, layout_quantum(args.generations, 1, 1))
        skipped = rows[~kept]
        estimate = state.history.length[skipped].double().where(state.history.last_step[skipped] != NEVER, 200.0)
        float(estimate.sum())  # the skipped completions' tokens, for the loss's normalizer
        rewards = torch.randint(0, 2, (int(kept.sum()), args.generations), generator=generator).double()
        lengths = torch.full((int(kept.sum()), args.generations), 200.0)
        state.history.observe(rows[kept], rewards, lengths, step=1)
        state.evidence = count_evidence(state.evidence, kept[kept], kept[kept], rewards.std(dim=1) > 0)
        no_refill.append(time.perf_counter() - start)
    state.history.last_step[~seen] = NEVER
    decisions = state.decision_generator()

    def keep(row: int) -> bool:
        streak = state.history.streak[row]
        if streak == 0:
            return True
        return float(torch.rand((), dtype=torch.float64, generator=decisions)) < float(
            keep_probability(streak, state.base, 0.05)
        )

    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        rows = state.draw_rows(args.batch, keep)
        rewards = torch.randint(0, 2, (args.batch, args.generations), generator=generator).double()
        lengths = torch.full((args.batch, args.generations), 200.0)
        state.history.observe(rows, rewards, lengths, step=1)
        times.append(time.perf_counter() - start)
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    history_mb, state_mb = state.history.nbytes() / 2**20, state.nbytes() / 2**20
    print(f"prompts {args.prompts:,}: history {history_mb:.1f} MiB ({state.history.nbytes() / args.prompts:.0f} bytes "
          f"a prompt), with the pass order {state_mb:.1f} MiB (limit 64 MB); checkpointed state "
          f"{len(buffer.getvalue()) / 2**20:.1f} MiB")  # fmt: skip
    for name, measured in (("without refilling", no_refill), ("with refilling", times)):
        per_batch = statistics.median(measured)
        print(f"one generation batch ({args.batch} prompts x {args.generations}), {name}: {per_batch * 1e3:.2f} ms "
              f"(median of {args.repeats}); {per_batch / 0.24:.4f} of a 0.24 s tiny CPU step, {per_batch / 40:.6f} "
              "of a 40 s H200 preset step")  # fmt: skip


if __name__ == "__main__":
    main()
