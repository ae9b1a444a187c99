"""benchmarks/timing/suite_durations.py: the test suite's time by pattern, from two `pytest --durations=0` logs."""

import importlib.util

from tests.conftest import REPO_ROOT

BEFORE = """\
============================= slowest durations =============================
40.00s call     tests/training/test_resume.py::test_two_processes_resume_exactly
30.00s call     tests/training/test_notebooks.py::test_notebook_runs_in_smoke_mode[a.ipynb]
12.50s call     tests/training/test_cli_errors.py::test_recipe_process_prints_one_line
3.00s setup    tests/training/test_generation.py::test_training_with_a_lever_matches_stock_generation[compile]
5.00s call     tests/training/test_generation.py::test_training_with_a_lever_matches_stock_generation[compile]
1.00s call     tests/unit/test_rewards.py::test_one
10 passed, 2 skipped, 1 warning in 95.10s (0:01:35)
"""
AFTER = """\
2.00s call     tests/training/test_notebooks.py::test_notebook_runs_in_smoke_mode[a.ipynb]
1.00s call     tests/unit/test_rewards.py::test_one
10 passed, 2 skipped in 9.00s
"""


def load():
    spec = importlib.util.spec_from_file_location(
        "suite_durations", REPO_ROOT / "benchmarks/timing/suite_durations.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_log_sums_each_tests_phases_and_each_pattern(tmp_path):
    suite = load()
    (tmp_path / "before.log").write_text(BEFORE)
    run = suite.read(tmp_path / "before.log")
    assert (run["wall"], run["passed"], run["skipped"]) == (95.1, 10, 2)
    lever = "tests/training/test_generation.py::test_training_with_a_lever_matches_stock_generation[compile]"
    assert run["tests"][lever] == 8
    totals = suite.by_pattern(run["tests"])
    assert totals["two-process runs (accelerate launch)"] == (1, 40.0)
    assert totals["notebook kernels"] == (1, 30.0)
    assert totals["fresh interpreters (CLI, recipe, killed runs, throughput children)"] == (1, 12.5)
    assert totals["CPU compiles (generation_compile)"] == (1, 8.0)
    assert totals[suite.OTHER] == (1, 1.0)


def test_the_report_compares_before_and_after_and_names_a_bad_log(tmp_path, capsys):
    suite = load()
    (tmp_path / "before.log").write_text(BEFORE)
    (tmp_path / "after.log").write_text(AFTER)
    assert suite.main([str(tmp_path / "before.log"), str(tmp_path / "after.log"), "--output-dir", str(tmp_path)]) == 0
    text = (tmp_path / "suite_durations.md").read_text()
    assert "| pytest wall time (s) | 95 | 9 |" in text and "| tests passed / skipped | 10 / 2 | 10 / 2 |" in text
    assert "| notebook kernels | 1 | 30 | 1 | 2 |" in text
    resumed = "tests/training/test_resume.py::test_two_processes_resume_exactly"
    assert f"| `{resumed}` | 40.0 | < 0.005 (or renamed) |" in text
    (tmp_path / "empty.log").write_text("no summary here\n")
    assert suite.main([str(tmp_path / "empty.log"), str(tmp_path / "after.log")]) == 1
    assert "empty.log: no pytest summary line" in capsys.readouterr().err
