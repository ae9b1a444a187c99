"""What the family benchmarks share: variants from `--ours` (`with_ours` for the entropy benchmarks), stock TRL's
runs reused from `--trl-json`, and `--report` over earlier `--json` files."""

import json
import os
from pathlib import Path


def print_reports(paths: list[str], report) -> None:
    """Print `report(results, ["trl", *other variants])` over the results of the `--json` files at `paths`."""
    results = [r for path in paths for r in json.loads(Path(path).read_text())]
    print(report(results, ["trl", *sorted({r["variant"] for r in results} - {"trl"})]))


def variants_and_reused(ours: list[str], trl_json: str | None) -> tuple[dict, list[dict]]:
    """({variant name: overrides, None for stock TRL}, stock TRL's results reused from `trl_json`). Each `--ours`
    JSON text is a variant named "ours" plus the text ("ours" alone for "{}"); with `trl_json`, stock TRL is not run
    again and its results there are returned."""
    variants = {"trl": None, **{f"ours{text if text != '{}' else ''}": json.loads(text) for text in ours}}
    reused = []
    if trl_json:
        reused = [r for r in json.loads(Path(trl_json).read_text()) if r["variant"] == "trl"]
        variants.pop("trl")
    return variants, reused


def with_ours(variants: dict, names: list[str], ours: list[str]) -> dict:
    """The `variants` named in `names`, plus one per `--ours` JSON text: `relative` with those overrides on top,
    named "relative" followed by the text (the entropy benchmarks' tuning variants)."""
    chosen = {name: variants[name] for name in names}
    return chosen | {f"relative{text}": {**variants["relative"], **json.loads(text)} for text in ours}


def add_output_arguments(parser, workers: int = 2) -> None:
    """`--workers`, `--json` (results already in the file are kept) and `--report`."""
    parser.add_argument("--workers", type=int, default=workers, help=f"runs in parallel (default {workers})")
    parser.add_argument("--json", help="write every figure to this JSON file (results already there are kept)")
    parser.add_argument("--report", nargs="+", help="only print the report of these --json files")


def load_results(paths: list[str]) -> list[dict]:
    """The results of every `--json` file of `paths`, in order."""
    return [r for path in paths for r in json.loads(Path(path).read_text())]


def add_family_arguments(parser, seeds: list[int], max_steps: int) -> None:
    """The options both family benchmarks take, after their own `--mixes` / `--tasks`."""
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds)
    parser.add_argument("--max_steps", type=int, default=max_steps)
    parser.add_argument("--ours", nargs="*", default=["{}"], help="JSON overrides of the defaults, one variant each")
    parser.add_argument("--trl-json", help="stock TRL's results from an earlier --json, instead of running them")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel, one CPU thread each (default 2)")
    parser.add_argument("--json", help="write every figure to this JSON file")
    parser.add_argument("--report", nargs="+", help="only print the report of these --json files")


def prepare_runs(args, report) -> tuple[dict, list[dict]] | None:
    """With `--report`, print the report of those files and return None. Else set the offline environment (no Hub
    calls, no tokenizer threads) and return `variants_and_reused(args.ours, args.trl_json)`."""
    if args.report:
        print_reports(args.report, report)
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return variants_and_reused(args.ours, args.trl_json)
