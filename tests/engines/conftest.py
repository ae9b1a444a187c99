"""The real-engine tests (`make test-engines`, CI's engines stage) run in an environment of their own, with DeepSpeed
and vLLM beside the main suite's versions (scripts/engines_setup.sh). Elsewhere their modules skip, saying which
package is missing; with TRL_GRPO_EXT_ENGINES=1 (set by `make test-engines`) a missing package fails instead, so the
stage cannot pass by skipping."""

import importlib.util
import os

import pytest

REQUIRED_ENV = "TRL_GRPO_EXT_ENGINES"


def require(*packages: str) -> None:
    """Skip the calling test module unless every one of `packages` is installed; fail instead under REQUIRED_ENV=1."""
    missing = [package for package in packages if importlib.util.find_spec(package) is None]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed: the real-engine tests run in `make test-engines`'s environment"
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)


RUNS: list[tuple[str, int]] = []  # (engine, optimizer steps) of each training run outside the two-process jobs


def count_run(engine: str, steps: int) -> None:
    """Record a training run of `steps` optimizer steps under `engine` (a vLLM test's), for the stage's summary."""
    RUNS.append((engine, steps))


def pytest_terminal_summary(terminalreporter) -> None:
    """One line for CI's log: the engines run for real, the training runs (scenario phases: uninterrupted and
    resumed) and the optimizer steps they trained, counted from what the runs logged."""
    from tests.two_process import LAUNCHED, SCENARIOS

    runs = list(RUNS)
    for name, ranks in LAUNCHED.items():
        for phase in ("full", "resumed"):
            record = ranks[0][phase]
            if record is None or "logs" not in record:
                continue
            after = SCENARIOS[name]["resume_step"] if phase == "resumed" else 0  # resumed logs hold the earlier rows
            runs.append(
                (SCENARIOS[name]["engine"], sum(row["step"] > after for row in record["logs"] if "loss" in row))
            )
    if runs:
        engines = sorted({engine for engine, _ in runs})
        steps = sum(steps for _, steps in runs)
        summary = f"real engines: {len(engines)} ({', '.join(engines)}); training runs: {len(runs)}"
        terminalreporter.write_line(f"{summary}; optimizer steps: {steps}")
