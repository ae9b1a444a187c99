"""Prompt skipping without refilling (issue #29) against stock TRL and the no-refill oracle, on two families of task
mixes: prompt sets that come back 5-10 times, and a single pass over a GSM8K-like set larger than the run draws.

    python benchmarks/prompt_skip/prompt_skip_family.py \\
        --json benchmarks/prompt_skip/results/prompt_skip_family.json          # both, 5 seeds
    python benchmarks/prompt_skip/prompt_skip_family.py --family multi_epoch --mixes solved70 --seeds 0 1
    python benchmarks/prompt_skip/prompt_skip_family.py --report benchmarks/prompt_skip/results/prompt_skip_family.json

Each run is `policy_groups_learning.run`: the tiny local model, 4 prompts x 4 completions a step, the learnable groups
evaluated every 4 steps (8 prompts each, 4 completions), trained all `--max_steps` (120). Every variant's run of a seed
draws the same completions for a prompt at a step with the same weights (common random numbers,
`policy_groups_learning.couple_sampling`; `--independent`: each samples on its own). Variants:

- `trl`: stock `trl.GRPOTrainer`;
- `skip`: `prompt_skip=True` as the README shows it, no other setting; in the single-pass family with
  `policy_group_column="task"`, `policy_group_sampling="uniform"` and `policy_group_loss_weighting=False`, so that
  the difficulty groups predict first visits while TRL's sampler draws and the loss weighs as stock TRL's do;
- `groups`: `skip` with the policy groups as in the single-pass family and `prompt_skip_group_informative=0.1`, so
  that a group's evidence predicts its prompts (first visits from its solved share, a group never informative from
  its failing visits);
- `hopeless`: `skip` with `prompt_skip_hopeless=True` (failing prompts never informative skipped at a measured rate);
- `oracle`: the no-refill oracle, prompt skipping told which prompts can only give all-equal rewards (the `solved`,
  `hopeless` and `constant` tasks: never generated for, but for the layout's floor), the loss normalized as `skip`'s;
- `oracle_history`: the bound of a rule that reads only each prompt's own history: the same prompts generated for on
  their first visit, never after;
- `oracle_signal`: the bound of a rule that cannot skip before the run's first informative generation group (as the
  failing-group test waits): every prompt generated until then, as `oracle` after it.

The figures, per mix, median over seeds: the completion tokens generated until the learnable groups' evaluation
reward (mean of the last 2 evaluations) reaches the mix's threshold, and their ratio to stock TRL's (a run that does
not reach it counts as infinite); the steps until then, and their ratio; the completion tokens of all the run's steps
(a fixed budget), and their ratio; the last evaluation reward (mean of the last 3 evaluations); the share of the
oracle's token saving that `skip` and `hopeless` capture, (trl − skip) / (trl − oracle), and of the history
bound's.
"""

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import add_output_arguments, load_results  # noqa: E402
from benchmarks.policy_groups.policy_groups_learning import ALL_EQUAL_TASKS, run, steps_to  # noqa: E402

# mix -> ({group: (task, share)}, threshold of the learnable groups' evaluation reward)
MULTI_EPOCH = {  # 48 prompts: 120 steps draw each 10 times
    "solved50_noise20": ({"short": ("short", 0.3), "solved": ("solved", 0.5), "noise": ("uniform_noise", 0.2)}, 0.7),
    "solved70": ({"short": ("short", 0.3), "solved": ("solved", 0.7)}, 0.7),
    "hopeless50": ({"short": ("short", 0.5), "hopeless": ("hopeless", 0.5)}, 0.7),
    "continuous50": ({"brevity": ("brevity", 0.5), "constant": ("constant", 0.5)}, 0.6),
    "solved20": ({"short": ("short", 0.5), "shorter": ("shorter", 0.3), "solved": ("solved", 0.2)}, 0.7),
}  # fmt: skip
SINGLE_PASS = {  # 1024 prompts: 120 steps draw 480 of them, none twice
    "gsm8k_like": ({"easy": ("easy", 0.4), "medium": ("short", 0.2), "hard": ("shorter", 0.2),
                    "impossible": ("hopeless", 0.2)}, 0.7),
    "gsm8k_solved": ({"solved": ("solved", 0.5), "medium": ("short", 0.3), "hard": ("shorter", 0.2)}, 0.7),
}  # fmt: skip
FAMILIES = {"multi_epoch": (MULTI_EPOCH, 48), "single_pass": (SINGLE_PASS, 1024)}
VARIANTS = {
    "multi_epoch": {"trl": None, "skip": {"prompt_skip": True, "policy_group_column": None},
                    "groups": {"prompt_skip": True, "policy_group_sampling": "uniform",
                               "policy_group_loss_weighting": False, "prompt_skip_group_informative": 0.1},
                    "hopeless": {"prompt_skip": True, "prompt_skip_hopeless": True, "policy_group_column": None},
                    "oracle": {"prompt_skip": True, "policy_group_column": None},
                    "oracle_history": {"prompt_skip": True, "policy_group_column": None},
                    "oracle_signal": {"prompt_skip": True, "policy_group_column": None}},
    "single_pass": {"trl": None, "skip": {"prompt_skip": True, "policy_group_sampling": "uniform",
                                          "policy_group_loss_weighting": False},
                    "groups": {"prompt_skip": True, "policy_group_sampling": "uniform",
                               "policy_group_loss_weighting": False, "prompt_skip_group_informative": 0.1},
                    "hopeless": {"prompt_skip": True, "prompt_skip_hopeless": True, "policy_group_sampling": "uniform",
                                 "policy_group_loss_weighting": False},
                    "oracle": {"prompt_skip": True, "policy_group_column": None},
                    "oracle_history": {"prompt_skip": True, "policy_group_column": None},
                    "oracle_signal": {"prompt_skip": True, "policy_group_column": None}},
}  # fmt: skip


# variant -> `policy_groups_learning.skip_oracle`'s kind
ORACLES = {"oracle": "never", "oracle_history": "history", "oracle_signal": "signal"}


def dump(results: list[dict]) -> str:
    """The results as JSON, one run a line (the file stays under 1 MB for the 175 runs)."""
    return "[\n" + ",\n".join(json.dumps(result) for result in results) + "\n]\n"


def uninformative_share(groups: dict) -> float:
    return sum(share for task, share in groups.values() if task in ALL_EQUAL_TASKS)


def tokens_to(result: dict, threshold: float) -> tuple[int | None, float]:
    """(steps, completion tokens generated before that step) until `threshold`; (None, inf) if never reached."""
    steps = steps_to(result["curve"], threshold)
    if steps is None:
        return None, float("inf")
    return steps, sum(n for step, n in result["tokens_per_step"].items() if int(step) < steps)


def final_reward(result: dict) -> float:
    return statistics.mean(value for _, value in result["curve"][-3:])


def _median(values):
    return statistics.median(values) if values else float("nan")


def report(results: list[dict]) -> str:
    lines = []
    for family, (mixes, _) in FAMILIES.items():
        for mix, (groups, threshold) in mixes.items():
            names = list(VARIANTS[family]) + sorted({r["variant"] for r in results} - set(VARIANTS[family]))
            rows = {v: sorted((r for r in results if r["mix"] == mix and r["variant"] == v), key=lambda r: r["seed"])
                    for v in names}  # fmt: skip
            if not rows["trl"] or not rows["skip"]:
                continue
            figures = {v: [tokens_to(r, threshold) for r in rs] for v, rs in rows.items()}
            median_tokens = {v: _median([t for _, t in f]) for v, f in figures.items()}
            median_steps = {v: _median([s if s is not None else float("inf") for s, _ in f])
                            for v, f in figures.items()}  # fmt: skip
            base = median_tokens["trl"]
            run_tokens = {v: _median([sum(r["tokens_per_step"].values()) for r in rs]) for v, rs in rows.items()}
            lines.append(f"{family}/{mix} (uninformative {uninformative_share(groups):.0%}, threshold {threshold}, "
                         f"seeds {[r['seed'] for r in rows['trl']]}):")  # fmt: skip
            for v, rs in rows.items():
                if not rs:
                    continue
                reached = sum(t != float("inf") for _, t in figures[v])
                ratio = median_tokens[v] / base if base not in (0, float("inf")) else float("nan")
                trl_steps = median_steps["trl"]
                step_ratio = median_steps[v] / trl_steps if trl_steps != float("inf") else float("nan")
                lines.append(
                    f"  {v:7s} tokens {median_tokens[v]:>8.0f} ({ratio:.2f}x), steps {median_steps[v]} "
                    f"({step_ratio:.2f}x), reached {reached}/{len(rs)}, all steps' tokens {run_tokens[v]:.0f} "
                    f"({run_tokens[v] / run_tokens['trl']:.2f}x), final reward "
                    f"{_median([final_reward(r) for r in rs]):.3f}, per seed tokens "
                    f"{[round(t) if t != float('inf') else None for _, t in figures[v]]}"
                )
            for bound in ("oracle", "oracle_history", "oracle_signal"):
                if not rows.get(bound):
                    continue
                saving = base - median_tokens[bound]
                shares = []
                for rule in ("skip", "groups", "hopeless"):
                    if rows.get(rule):
                        captured = (base - median_tokens[rule]) / saving if 0 < saving < float("inf") else None
                        shares.append(f"{rule} {'n/a' if captured is None else f'{captured:.0%}'}")
                lines.append(f"  share of {bound}'s saving captured: {', '.join(shares)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--mixes", nargs="+", help="only these mixes (of the families chosen)")
    parser.add_argument(
        "--variants", nargs="*", default=["trl", "skip", "groups", "hopeless", "oracle", "oracle_history"]
    )
    parser.add_argument("--add", nargs="*", default=[], metavar="NAME=JSON",
                        help="more variants: `skip` with these settings on top (tuning runs)")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--max_steps", type=int, default=120)
    parser.add_argument("--independent", action="store_true",
                        help="each variant samples on its own (default: common random numbers)")  # fmt: skip
    add_output_arguments(parser)
    args = parser.parse_args()
    if args.report:
        print(report(load_results(args.report)))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    previous = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).is_file() else []
    done = {(r["mix"], r["seed"], r["variant"]) for r in previous}
    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    variants = {family: dict(by_name) for family, by_name in VARIANTS.items()}
    for added in args.add:
        name, _, text = added.partition("=")
        for family in variants:
            variants[family][name] = {**variants[family]["skip"], **json.loads(text)}
    results = list(previous)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(f"{tmp}/tiny"))
        jobs = []
        for family in args.family:
            mixes, prompts = FAMILIES[family]
            for mix, spec in mixes.items():
                if args.mixes and mix not in args.mixes:
                    continue
                for seed in args.seeds:
                    for variant in args.variants + [added.partition("=")[0] for added in args.add]:
                        if (mix, seed, variant) in done:
                            continue
                        jobs.append({"mix": mix, "spec": spec, "prompts": prompts, "seed": seed, "variant": variant,
                                     "overrides": variants[family][variant], "max_steps": args.max_steps,
                                     "model_dir": model_dir, "stop": False, "coupled": not args.independent,
                                     "skip_oracle": ORACLES.get(variant)})  # fmt: skip
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
            for result in pool.map(run, jobs):
                for unused in ("log", "zero_std"):  # not in the report: kept out of the results file
                    result.pop(unused, None)
                spec = next(j["spec"] for j in jobs if j["mix"] == result["mix"])
                steps, tokens = tokens_to(result, spec[1])
                print(f"{result['mix']} seed {result['seed']} {result['variant']}: steps {steps}, tokens {tokens}, "
                      f"final {final_reward(result):.3f}", flush=True)  # fmt: skip
                results.append(result)
                if args.json:
                    Path(args.json).write_text(dump(results))
    print(report(results))


if __name__ == "__main__":
    main()
