"""Where the test suite's time goes: two `pytest --durations=0` logs compared, by pattern and by test.

    python benchmarks/timing/suite_durations.py BEFORE.log AFTER.log [--output-dir benchmarks/timing/results]

Each log is the output of `pytest tests -q -p no:cacheprovider --durations=0` (with or without `-n 2`; pytest leaves
out durations under 0.005 s, so a test missing from a log took less, or was renamed). The
table gives the wall time pytest printed, the sum of the per-test durations (setup + call + teardown; under
pytest-xdist the two workers' sums together, so more than the wall time), the test counts, and the sum by the
patterns of issue #28: two-process runs, fresh interpreters, notebook kernels, CPU compiles, and the rest (in-process
training and unit tests). A test belongs to the first pattern whose expression matches its id.
"""

import argparse
import re
import sys
from pathlib import Path

PATTERNS = {  # the first that matches a test id wins
    "two-process runs (accelerate launch)": r"two_processes|test_multi_gpu\.py::test_recipe_on_two_processes",
    "notebook kernels": r"test_notebooks\.py::test_notebook_runs",
    "fresh interpreters (CLI, recipe, killed runs, throughput children)": (
        r"test_cli_errors\.py::test_(recipe_process|importing)|test_registration\.py::test_cli_|"
        r"test_recipes\.py::test_recipe_end_to_end|test_resume\.py::test_killed_process|"
        r"test_gpu_throughput_benchmark_runs|test_style\.py"
    ),
    "CPU compiles (generation_compile)": r"compile",
}
OTHER = "in-process training and unit tests"
DURATION = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)")
SUMMARY = re.compile(r"(\d+) passed(?:, (\d+) skipped)?.* in ([\d.]+)s")


def read(log: Path) -> dict:
    """{"wall": s, "passed": n, "skipped": n, "tests": {id: s}} from a pytest log with --durations=0."""
    tests: dict[str, float] = {}
    wall = passed = skipped = None
    for line in log.read_text().splitlines():
        if m := DURATION.match(line):
            tests[m.group(3)] = tests.get(m.group(3), 0.0) + float(m.group(1))
        elif m := SUMMARY.search(line):
            passed, skipped, wall = int(m.group(1)), int(m.group(2) or 0), float(m.group(3))
    if wall is None:
        raise ValueError(f"{log}: no pytest summary line ('N passed ... in S s')")
    return {"wall": wall, "passed": passed, "skipped": skipped, "tests": tests}


def pattern(test_id: str) -> str:
    return next((name for name, expr in PATTERNS.items() if re.search(expr, test_id)), OTHER)


def by_pattern(tests: dict[str, float]) -> dict[str, tuple[int, float]]:
    totals = {name: (0, 0.0) for name in [*PATTERNS, OTHER]}
    for test_id, seconds in tests.items():
        count, total = totals[pattern(test_id)]
        totals[pattern(test_id)] = (count + 1, total + seconds)
    return totals


def report(before: dict, after: dict, top: int = 25) -> str:
    counts = [f"{run['passed']} / {run['skipped']}" for run in (before, after)]
    lines = [
        "| | before | after |",
        "|---|---|---|",
        f"| pytest wall time (s) | {before['wall']:.0f} | {after['wall']:.0f} |",
        f"| tests passed / skipped | {counts[0]} | {counts[1]} |",
        f"| sum of test durations (s) | {sum(before['tests'].values()):.0f} | {sum(after['tests'].values()):.0f} |",
        "",
        "| pattern | tests before | s before | tests after | s after |",
        "|---|---|---|---|---|",
    ]
    patterns_before, patterns_after = by_pattern(before["tests"]), by_pattern(after["tests"])
    for name in patterns_before:
        (n0, s0), (n1, s1) = patterns_before[name], patterns_after[name]
        lines.append(f"| {name} | {n0} | {s0:.0f} | {n1} | {s1:.0f} |")
    lines += ["", f"The {top} slowest tests before, and after:", "", "| test | s before | s after |", "|---|---|---|"]
    for test_id, seconds in sorted(before["tests"].items(), key=lambda item: -item[1])[:top]:
        now = after["tests"].get(test_id)
        lines.append(f"| `{test_id}` | {seconds:.1f} | {'< 0.005 (or renamed)' if now is None else f'{now:.1f}'} |")
    lines += ["", "| test (slowest after) | s after |", "|---|---|"]
    lines += [f"| `{t}` | {s:.1f} |" for t, s in sorted(after["tests"].items(), key=lambda item: -item[1])[:top]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--output-dir", type=Path, help="write suite_durations.md there (default: print only)")
    args = parser.parse_args(argv)
    try:
        text = report(read(args.before), read(args.after))
    except (OSError, ValueError) as error:
        print(f"test_durations.py: error: {error}", file=sys.stderr)
        return 1
    print(text)
    if args.output_dir is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "suite_durations.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
