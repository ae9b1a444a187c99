"""Prompt skipping (issue #17) with its default settings against stock TRL and the policy-group sampler alone, on the
task-mix family of `policy_groups_learning.py` plus its GSM8K-like mix (easy, learnable and impossible prompts).

    python benchmarks/prompt_skip/prompt_skip_learning.py                # every mix, 5 seeds, 2 worker processes
    python benchmarks/prompt_skip/prompt_skip_learning.py --mixes base4 gsm8k_like --seeds 0 1 2 \\
        --reuse benchmarks/policy_groups/results/policy_groups_learning.json  # stock TRL, policy groups not run again

Each run is `policy_groups_learning.run`: the tiny local model, 256 prompts, 16 completions a step, evaluation every
4 steps on the learnable groups, stopped once their evaluation reward reaches the mix's threshold. Variants:
`trl` (stock `trl.GRPOTrainer`), `groups` (`policy_group_column="task"`, the policy-group sampler alone), `skip`
(`prompt_skip=True`, no policy groups) and `groups+skip` (both), skipping with refilling (`prompt_skip_refill=True`,
the design of issue #17; `prompt_skip_family.py` measures the default since #29, which does not refill). The
figures, per mix, median over seeds:

- the completion tokens generated until the threshold (a run that does not reach it within `--max_steps` counts as
  infinite) and its ratio to stock TRL's (target <= 0.6);
- the steps until the threshold;
- the uninformative share of generated generation groups (TRL's `frac_reward_zero_std`), mean over the steps after
  the first epoch (64 steps), or over the second half of the run when it stopped before (marked `*`);
- the learnable groups' last evaluation reward, and the median step time (evaluation excluded).

`--reuse FILE` takes runs from an earlier `policy_groups_learning.py --json` (its `trl` and `ours` = `groups`
variants), `--json` writes every figure, `--report` prints the report of earlier `--json` files.
"""

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.policy_groups.policy_groups_learning import MIXES, run  # noqa: E402

EPOCH_STEPS = 64  # 256 prompts, 4 a step
# the refilling design of issue #17 (`prompt_skip_refill=True` since #29; prompt_skip_family.py measures the default)
VARIANTS = {
    "trl": None,
    "groups": {},
    "skip": {"prompt_skip": True, "prompt_skip_refill": True, "policy_group_column": None},
    "groups+skip": {"prompt_skip": True, "prompt_skip_refill": True},
}


def tokens(result: dict) -> float:
    return result["tokens"] if result["tokens"] is not None else float("inf")


def uninformative_share(result: dict) -> tuple[float, bool]:
    """(mean `frac_reward_zero_std` after the first epoch, else over the second half of the run; which one)."""
    series = result.get("zero_std") or []
    after = [value for step, value in series if step > EPOCH_STEPS]
    if after:
        return statistics.mean(after), False
    half = [value for step, value in series if step > result["final_step"] / 2]
    return (statistics.mean(half) if half else float("nan")), True


def report(results: list[dict]) -> str:
    lines = []
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in results)]
    for mix in MIXES:
        rows = {v: sorted((r for r in results if r["mix"] == mix and r["variant"] == v), key=lambda r: r["seed"])
                for v in variants}  # fmt: skip
        if not rows.get("trl") or not any(rows[v] for v in variants if v != "trl"):
            continue
        seeds = sorted({r["seed"] for v in variants if v != "trl" for r in rows[v]})
        rows = {v: [r for r in rs if r["seed"] in seeds] for v, rs in rows.items()}
        trl_tokens = statistics.median(tokens(r) for r in rows["trl"])
        lines.append(f"{mix} (threshold {MIXES[mix][1]}, seeds {seeds}):")
        for v in variants:
            if not rows[v]:
                continue
            median = statistics.median(tokens(r) for r in rows[v])
            shares = [uninformative_share(r) for r in rows[v] if r.get("zero_std")]
            share = (f"{statistics.median(s for s, _ in shares):.2f}{'*' if any(h for _, h in shares) else ''}"
                     if shares else "n/a")  # fmt: skip
            last = statistics.median(r["curve"][-1][1] for r in rows[v] if r["curve"])
            steps = [r["steps"] for r in rows[v]]
            ratio = median / trl_tokens if trl_tokens not in (0, float("inf")) else float("nan")
            step_time = statistics.median(r["step_time"] for r in rows[v])
            per_seed = [round(tokens(r)) if r["tokens"] else None for r in rows[v]]
            lines.append(
                f"  {v:12s} tokens median {median:>8.0f} (ratio {ratio:.2f}, target <= 0.60), per seed {per_seed}, "
                f"steps {steps}, uninformative share {share}, last eval reward {last:.3f}, step time {step_time:.3f} s"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--max_steps", type=int, default=160)
    parser.add_argument("--reuse", help="runs of `trl` and `groups` from a policy_groups_learning.py --json")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", help="write every figure to this JSON file")
    parser.add_argument("--report", nargs="+", help="only print the report of these --json files")
    args = parser.parse_args()
    if args.report:
        print(report([r for path in args.report for r in json.loads(Path(path).read_text())]))
        return
    previous = []
    if args.reuse:
        for r in json.loads(Path(args.reuse).read_text()):
            name = {"trl": "trl", "ours": "groups"}.get(r["variant"])
            if name in args.variants and r["mix"] in args.mixes and r["seed"] in args.seeds:
                previous.append({**r, "variant": name})
    done = {(r["mix"], r["seed"], r["variant"]) for r in previous}
    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    results = list(previous)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(f"{tmp}/tiny"))
        jobs = [{"mix": m, "seed": s, "variant": v, "overrides": VARIANTS[v], "max_steps": args.max_steps,
                 "model_dir": model_dir}
                for m in args.mixes for s in args.seeds for v in args.variants if (m, s, v) not in done]  # fmt: skip
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
            for result in pool.map(run, jobs):
                print(f"{result['mix']} seed {result['seed']} {result['variant']}: steps {result['steps']}, tokens "
                      f"{result['tokens']}, step time {result['step_time']:.3f} s", flush=True)  # fmt: skip
                results.append(result)
                if args.json:  # written as the runs come in, so a long run can be reported before it ends
                    Path(args.json).write_text(json.dumps(results, indent=1))
    print(report(results))


if __name__ == "__main__":
    main()
