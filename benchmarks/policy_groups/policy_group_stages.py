"""Training stages of policy grouping (issue #18) against policy grouping without them, on the task-mix family of
`policy_groups_learning.py` (the robust-defaults family of issue #11, plus its GSM8K-like mix).

    python benchmarks/policy_groups/policy_group_stages.py               # every mix, 3 seeds, 2 worker processes
    python benchmarks/policy_groups/policy_group_stages.py --mixes base4 --seeds 0 --plot stages.png
    python benchmarks/policy_groups/policy_group_stages.py \\
        --report benchmarks/policy_groups/results/policy_group_stages.json \\
        --trl benchmarks/policy_groups/results/policy_groups_learning.json  # stock TRL's steps from issue #11's runs

Each run is `policy_groups_learning.run` (the tiny local model, 256 prompts in policy groups by task, 16 completions a
step, evaluation of the learnable groups every 4 steps), trained for all `--max_steps` (not stopped at the
threshold), so that the final rewards can be compared. Variants: `groups` (`policy_group_column="task"`, every other
setting at its default: the competition stage from step 0) and `staged` (the same plus `STAGES`: warm-up until step
32, fusion over the last quarter of the run); `--add NAME=JSON` adds a variant of `STAGES` with those overrides
(`--add 'fusion_only={"policy_group_warmup_steps": null}'`: the README's setting). The figures, per mix, median over
seeds:

- steps until the learnable groups' evaluation reward (each group counted alike, mean of the last 2 evaluations)
  reaches the mix's threshold (`policy_groups_learning.steps_to`); with `--trl`, stock TRL's from an earlier
  `policy_groups_learning.py --json` (those runs stopped at the threshold, so they give steps only);
- each learnable group's final evaluation reward (mean of the last 2 evaluations), their spread (max − min over the
  learnable groups) and the worst group's: whether fusion lowers the spread;
- the step warm-up ended at and each stage change's reason (from the `staged` runs' logs).

`--json` writes every figure (as runs come in), `--report` prints the report of earlier `--json` files (of the
`--seeds` given), `--plot`
draws the policy-group plot (`plots.plot_policy_groups`: draw shares, rewards, stages shaded) of the first staged
run.
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
from benchmarks.policy_groups.policy_groups_learning import MIXES, TASKS, run, steps_to  # noqa: E402

STAGES = {"policy_group_warmup_steps": 32, "policy_group_fusion_start": 0.75}
VARIANTS = {"groups": {}, "staged": STAGES}


def final_rewards(result: dict) -> dict[str, float]:
    """Each learnable group's mean evaluation reward over the last 2 evaluations."""
    groups, _ = MIXES[result["mix"]]
    learnable = [g for g, (task, _) in groups.items() if TASKS[task][1]]
    last = [per_group for _, per_group in sorted(result["group_evals"].items(), key=lambda kv: int(kv[0]))][-2:]
    return {g: statistics.mean(e[g] for e in last) for g in learnable}


def spread(result: dict) -> float:
    values = final_rewards(result).values()
    return max(values) - min(values)


def stage_changes(result: dict) -> list[tuple[int, int]]:
    """(step, stage index) at each logged stage change of a staged run."""
    if "stage_changes" in result:  # noted when the run came in (the logs are not kept in the JSON)
        return [tuple(change) for change in result["stage_changes"]]
    changes, last = [], None
    for row in result.get("log") or []:
        stage = row.get("policy_groups/stage")
        if stage is not None and stage != last:
            changes.append((row["step"], round(stage)))
            last = stage
    return changes


def _median(values) -> float:
    return statistics.median(v if v is not None else float("inf") for v in values)


def report(results: list[dict], trl: list[dict] | None = None) -> str:
    variants = list(dict.fromkeys(r["variant"] for r in results))
    lines, summary = [], {v: {"spread": [], "worst": [], "mean": [], "steps": []} for v in variants}
    for mix in MIXES:
        rows = {v: sorted((r for r in results if r["mix"] == mix and r["variant"] == v), key=lambda r: r["seed"])
                for v in variants}  # fmt: skip
        if not all(rows.values()):
            continue
        seeds = sorted({r["seed"] for rs in rows.values() for r in rs})
        lines.append(f"{mix} (threshold {MIXES[mix][1]}, seeds {seeds}):")
        steps = [steps_to(r["curve"], MIXES[mix][1]) for r in trl or [] if r["mix"] == mix and r["seed"] in seeds]
        if steps:
            lines.append(f"  {'trl':7s} steps {steps}, median {_median(steps)}")
        for v, rs in rows.items():
            steps = [steps_to(r["curve"], MIXES[mix][1]) for r in rs]
            finals = [final_rewards(r) for r in rs]
            groups = {g: statistics.median(f[g] for f in finals) for g in finals[0]}
            spreads = [spread(r) for r in rs]
            worst = [min(f.values()) for f in finals]
            means = [statistics.mean(f.values()) for f in finals]
            for key, values in (("spread", spreads), ("worst", worst), ("mean", means)):
                summary[v][key].append(statistics.median(values))
            summary[v]["steps"].append(_median(steps))
            text = ", ".join(f"{g} {value:.2f}" for g, value in groups.items())
            lines.append(f"  {v:7s} steps {steps}, median {_median(steps)}; final rewards {text}; spread median "
                         f"{statistics.median(spreads):.3f} {[round(s, 2) for s in spreads]}, worst group "
                         f"{statistics.median(worst):.3f}, mean {statistics.median(means):.3f}")  # fmt: skip
            changes = [stage_changes(r) for r in rs]
            if any(c and c[0][1] == 0 for c in changes):  # runs that started in warm-up
                ends = [next((s for s, stage in c if stage == 1), None) for c in changes]
                lines.append(f"          warm-up ended at logged steps {ends}")
    lines.append("over the mixes (median of the per-mix medians):")
    for v, figures in summary.items():
        if figures["spread"]:
            lines.append(f"  {v:7s} spread {statistics.median(figures['spread']):.3f}, worst group "
                         f"{statistics.median(figures['worst']):.3f}, mean {statistics.median(figures['mean']):.3f}, "
                         f"steps {statistics.median(figures['steps'])}")  # fmt: skip
    for v in variants:
        if v == "groups" or not summary[v]["spread"] or not summary.get("groups", {}).get("spread"):
            continue
        pairs = list(zip(summary[v]["spread"], summary["groups"]["spread"], strict=True))
        lines.append(f"{v} lowers the spread of final per-group rewards on {sum(s < g for s, g in pairs)} of "
                     f"{len(pairs)} mixes (ties {sum(s == g for s, g in pairs)})")  # fmt: skip
    return "\n".join(lines)


def write_json(results: list[dict], path: str) -> None:
    """Every figure this report reads; the per-step logs only of the run `plot` draws (all of them would take ~9 MB)
    and no per-step zero-std shares."""
    plotted = next((r for r in results if r["variant"] != "groups" and r.get("log")), None)
    kept = [{k: v for k, v in r.items() if k != "zero_std" and (k != "log" or r is plotted)} for r in results]
    Path(path).write_text(json.dumps(kept))


def plot(results: list[dict], path: str) -> None:
    from trl_grpo_ext.reporting.plots import plot_policy_groups

    staged = next(r for r in results if r["variant"] != "groups" and r.get("log"))
    print(f"Saved {plot_policy_groups(staged['log'], path)} ({staged['mix']}, seed {staged['seed']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--add", nargs="*", default=[], metavar="NAME=JSON",
                        help="more variants: JSON stage settings over STAGES")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", help="default 0 1 2; with --report, only these seeds' runs")
    parser.add_argument("--max_steps", type=int, default=120)
    parser.add_argument("--trl", nargs="+", help="stock TRL's runs from earlier --json files of "
                        "policy_groups_learning.py or prompt_skip_learning.py (steps only)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", help="write every figure to this JSON file")
    parser.add_argument("--report", nargs="+", help="only print the report of these --json files")
    parser.add_argument("--plot", help="write the policy-group plot of the first staged run to this PNG")
    args = parser.parse_args()
    trl = [r for path in args.trl or [] for r in json.loads(Path(path).read_text()) if r["variant"] == "trl"]
    trl = list({(r["mix"], r["seed"]): r for r in trl}.values())  # one run per mix and seed
    for text in args.add:
        name, overrides = text.split("=", 1)
        VARIANTS[name] = {**STAGES, **json.loads(overrides)}
        args.variants.append(name)
    if args.report:
        results = [r for path in args.report for r in json.loads(Path(path).read_text())
                   if args.seeds is None or r["seed"] in args.seeds]  # fmt: skip
        print(report(results, trl))
        if args.plot:
            plot(results, args.plot)
        return
    args.seeds = args.seeds or [0, 1, 2]
    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(f"{tmp}/tiny"))
        jobs = [{"mix": m, "seed": s, "variant": v, "overrides": VARIANTS[v], "max_steps": args.max_steps,
                 "model_dir": model_dir, "stop": False, "keep_log": True}
                for m in args.mixes for s in args.seeds for v in args.variants]  # fmt: skip
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
            for result in pool.map(run, jobs):
                print(f"{result['mix']} seed {result['seed']} {result['variant']}: steps {result['steps']}, spread "
                      f"{spread(result):.3f}, stages {stage_changes(result)}", flush=True)  # fmt: skip
                result["stage_changes"] = stage_changes(result)
                results.append(result)
                if args.json:  # written as the runs come in, so a long run can be reported before it ends
                    write_json(results, args.json)
    print(report(results, trl))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
