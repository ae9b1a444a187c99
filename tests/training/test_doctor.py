"""The run doctor (issue #19): its windows and trends against hand-computed values, each check on logs made to
fail and on their healthy twins, the callback (once per finding, the same findings as the command), the trainer
side (`run_doctor`: timings logged, training unchanged), and `trl-grpo-ext doctor` on good and bad folders."""

import ast
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from datasets import Dataset

from tests.conftest import length_reward, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer, cli
from trl_grpo_ext.doctor import CHECKS, DoctorCallback, diagnose
from trl_grpo_ext.doctor import callback as callback_module
from trl_grpo_ext.doctor import series as S
from trl_grpo_ext.doctor.checks import Run, Skip
from trl_grpo_ext.doctor.learning import _direction
from trl_grpo_ext.doctor.thresholds import THRESHOLDS
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows


def log(steps: int = 60, every: int = 1, **metrics) -> list[dict]:
    """Rows of a healthy-looking run (rising reward with spread, steady entropy, a few truncated completions), with
    `metrics` (name -> a constant, or a function of the step array) replacing or adding series."""
    rng = np.random.default_rng(0)
    t = np.arange(1, steps + 1)
    base = {
        "reward": 0.2 + 0.5 * t / steps + rng.normal(0, 0.02, steps),
        "reward_std": 0.4,
        "frac_reward_zero_std": 0.3,
        "entropy": 0.8 + rng.normal(0, 0.01, steps),
        "completions/clipped_ratio": 0.05,
        "completions/max_length": 256.0,
        "grad_norm": 0.3 * np.exp(rng.normal(0, 0.2, steps)),
        "step_time": 10.0,
    }
    for name, values in metrics.items():
        base[name] = values(t) if callable(values) else values
    columns = {name: np.broadcast_to(np.asarray(v, dtype=np.float64), (steps,)) for name, v in base.items()}
    return [
        {"step": int(t[i]), **{name: float(v[i]) for name, v in columns.items()}}
        for i in range(every - 1, steps, every)
    ]


def checks_found(rows, check: str, settings=None) -> list:
    return [f for f in diagnose(rows, settings).findings if f.check == check]


# ----- windows and trends -----------------------------------------------------------------------------------------


def test_rolling_rise_is_the_least_squares_rise_of_each_window():
    values = np.array([0.1, 0.4, 0.2, 0.8, 0.5, 0.9, 1.3])
    rises, se = S.rolling_rise(values, 4)
    assert len(rises) == 4
    t = np.arange(4.0)
    for i in range(4):  # ordinary least squares, window by window: the rise slope·(W−1) and its standard error
        (slope, _), cov = np.polyfit(t, values[i : i + 4], 1, cov="unscaled")
        residuals = values[i : i + 4] - np.polyval(np.polyfit(t, values[i : i + 4], 1), t)
        error = np.sqrt(cov[0, 0] * (residuals**2).sum() / (4 - 2))
        np.testing.assert_allclose((rises[i], se[i]), (3 * slope, 3 * error), rtol=1e-9, atol=1e-12)
    # a straight line rises by slope·(W−1) with no error: 0.5·3 = 1.5
    rise, error = S.rolling_rise(np.arange(5) * 0.5, 4)
    np.testing.assert_allclose(rise, 1.5)
    np.testing.assert_allclose(error, 0.0, atol=1e-7)


def test_rolling_mean_leaves_out_nans_and_windows_follow_the_logging_interval():
    np.testing.assert_allclose(S.rolling_mean(np.array([1.0, np.nan, 3.0, 5.0]), 2), [1.0, 3.0, 4.0])
    assert S.window_rows(np.arange(1, 100), 20) == 20  # logged every step: 20 rows
    assert S.window_rows(np.arange(5, 500, 5), 20) == 4  # every 5 steps: 4 rows
    assert S.window_rows(np.arange(10, 500, 10), 20) == 3  # never fewer than 3
    assert S.first_window(np.array([False, False, True, True]), 3) == 4  # the window [2, 4] ends at row 4


@pytest.mark.parametrize(("reward", "kind"), [(0.9, "all-correct"), (0.1, "all-wrong"), (0.5, "mixed")])
def test_a_group_without_signal_is_placed_in_the_runs_reward_range(reward, kind):
    assert _direction(reward, 0.0, 1.0) == kind  # top quarter, bottom quarter, between
    assert _direction(reward, 0.3, 0.3) == "constant"


# ----- each check: a failing log and its healthy twin ---------------------------------------------------------------


def test_a_healthy_log_has_no_finding():
    diagnosis = diagnose(log(120))
    assert diagnosis.findings == [] and diagnosis.rows == 120
    # what it could not check, and why: no kl (beta 0), no timings or memory (run_doctor off)
    assert {skip.check for skip in diagnosis.skipped} >= {"kl_runaway", "generation_bound", "memory"}


def test_a_short_runs_verdict_says_it_could_not_judge_and_a_longer_ones_how_much_it_checked():
    """Issue #30: 3 logged steps skip most checks: the verdict says so instead of "healthy"."""
    short = diagnose(log(3), ended=True)
    assert short.findings == []
    skipped, total = len(short.skipped), short.checks
    assert total == len(CHECKS) and 2 * skipped >= total
    assert short.verdict() == f"too short to judge: {skipped} of {total} checks skipped"
    assert short.report().splitlines()[0] == f"3 logged training steps, up to step 3: {short.verdict()}"
    healthy = diagnose(log(120), ended=True)
    ran = total - len(healthy.skipped)
    assert (
        healthy.verdict()
        == f"no finding in the {ran} checks that could run ({len(healthy.skipped)} of {total} skipped)"
    )


def test_a_run_that_ends_without_signal_is_a_finding_though_shorter_than_a_window():
    """The CPU demo's end: its last 9 of 40 steps had no informative generation group (a window is 40 steps). At the
    end of the run (`ended`) that is a finding; during training (more steps may come) it is not yet."""
    rows = log(40, frac_reward_zero_std=lambda t: np.where(t > 31, 1.0, 0.3),
               reward=lambda t: np.where(t > 31, 0.0, -0.4 + 0.01 * t))  # fmt: skip
    [finding] = [f for f in diagnose(rows, ended=True).findings if f.check == "no_signal"]
    assert finding.title.startswith("no learning signal at the end of the run (all-correct)")
    assert "over steps 32-40" in finding.evidence and finding.step == 32  # where the stretch began (issue #71)
    assert checks_found(rows, "no_signal") == []  # not ended: not yet
    assert [f.check for f in diagnose(log(40), ended=True).findings] == []  # the healthy twin
    # the demo itself: the top of the reward range is the length penalty's 0, the accuracy reward is 0: not "solved"
    for row in rows:
        row["rewards/gsm8k_accuracy/mean"] = 0.0
    [demo] = [f for f in diagnose(rows, {"num_generations": 4}, ended=True).findings if f.check == "no_signal"]
    assert "(best reward, no accuracy)" in demo.title and "gsm8k_accuracy 0" in demo.evidence
    assert "raise num_generations (now 4) so that some completion is right" in demo.suggestion


@pytest.mark.parametrize(("lengths", "found"), [([40.0, 0.4, 0.0], True), ([40.0, 30.0, 0.0], False),
                                                ([40.0, 5.0, 4.0], False)])  # fmt: skip
def test_completions_that_collapse_to_nothing_are_a_finding_with_the_learning_rate_to_lower(lengths, found):
    """SmolLM2 full fine-tuned at the demo's learning rate answers with the empty string from the second step: a
    3-step run whose last 2 steps' completions are empty is a finding; one empty step, or 4-5 tokens (the demo's
    tiny model, which learns to end early), is not."""
    rows = log(3, **{"completions/mean_length": np.array(lengths)})
    findings = [f for f in diagnose(rows, {"learning_rate": 0.003}, ended=True).findings if f.check == "collapse"]
    assert bool(findings) is found
    if found:
        assert "learning_rate (now 0.003)" in findings[0].suggestion and "[40, 0.4, 0]" not in findings[0].evidence
        assert "completions/mean_length [0.4, 0] tokens over steps 2-3" in findings[0].evidence
    collapsed_mid_run = log(60, **{"completions/mean_length": lambda t: np.where(t > 10, 0.5, 40.0)})
    [mid] = checks_found(collapsed_mid_run, "collapse")
    # found over the first full window of 20 steps, 11-30; it began at 11 (issue #71: the finding said 30)
    assert mid.step == 11 and "at the end" not in mid.title


def test_no_signal_says_all_wrong_and_where_it_starts():
    rows = log(60, frac_reward_zero_std=lambda t: np.where(t > 20, 1.0, 0.3),
               reward=lambda t: np.where(t > 20, 0.0, 0.2 + 0.01 * t))  # fmt: skip
    [finding] = checks_found(rows, "no_signal")
    assert "all-wrong" in finding.title and finding.subject == "run"
    # the mean over 40 rows reaches 0.95 at step 58: (2·0.3 + 38·1.0) / 40 = 0.965; at 57, (3·0.3 + 37) / 40 = 0.9475;
    # so it is found over steps 19-58, and it began at 21, the first of them without signal (issue #71: it said 58)
    assert finding.step == 21 and "over steps 19-58" in finding.evidence
    assert "num_generations" in finding.suggestion
    assert "num_generations (now 8)" in checks_found(rows, "no_signal", {"num_generations": 8})[0].suggestion


def test_no_signal_in_one_policy_group_says_it_is_solved():
    groups = {"policy_groups/solved/zero_std_frac": 1.0, "policy_groups/solved/reward": 1.0,
              "policy_groups/hard/zero_std_frac": 0.4, "policy_groups/hard/reward": lambda t: t / 100}  # fmt: skip
    rows = log(60, **groups)
    [finding] = checks_found(rows, "no_signal")
    assert finding.subject == "policy group 'solved'" and "all-correct" in finding.title
    assert "prompt_skip=True" in finding.suggestion


def test_a_policy_group_first_drawn_at_step_2_of_a_40_step_run_is_judged_over_its_39_rows():
    # issue #70, SmolLM2 (policy_groups seed 0 of the real-model mix): 'sum3', right only by luck, first drawn at
    # step 2, logged at 0.93-1.0 (mean 0.965); its 39 rows were fewer than the 40-step window and it went unnamed
    lucky = np.where(np.arange(1, 41) < 20, 1.0, 0.94)  # (40,) one lucky answer at step 20
    groups = {"policy_groups/sum3/zero_std_frac": lucky, "policy_groups/sum3/reward": 0.01,
              "policy_groups/product/zero_std_frac": 0.3,
              "policy_groups/product/reward": lambda t: t / 60}  # fmt: skip
    rows = log(40, **groups)
    del rows[0]["policy_groups/sum3/zero_std_frac"], rows[0]["policy_groups/sum3/reward"]  # not drawn at step 1
    [finding] = checks_found(rows, "no_signal")
    assert finding.subject == "policy group 'sum3'" and "all-wrong" in finding.title
    assert "over steps 2-40" in finding.evidence
    # a group that learns after a long spell of no signal is not named: mean over its 39 rows 0.89
    rows = log(40, **{**groups, "policy_groups/sum3/zero_std_frac": np.where(np.arange(1, 41) < 20, 1.0, 0.79)})
    del rows[0]["policy_groups/sum3/zero_std_frac"]
    assert checks_found(rows, "no_signal") == []


def test_truncation_that_falls_is_not_reported_and_truncation_that_stays_is():
    assert checks_found(log(60, **{"completions/clipped_ratio": lambda t: np.maximum(0.9 - 0.03 * t, 0)}),
                        "truncation") == []  # fmt: skip
    [finding] = checks_found(log(60, **{"completions/clipped_ratio": 0.4}), "truncation")
    assert "max_completion_length (now 256) to about 512" in finding.suggestion  # read off completions/max_length


def test_entropy_collapse_and_explosion():
    [collapse] = checks_found(log(80, entropy=lambda t: 0.8 * np.exp(-t / 10) + 0.01), "entropy_collapse")
    assert "entropy_reg=target" in collapse.suggestion
    [explosion] = checks_found(log(80, entropy=lambda t: 0.5 + 0.05 * t), "entropy_explosion")
    assert explosion.check == "entropy_explosion"
    assert checks_found(log(80, entropy=lambda t: 0.8 - 0.004 * t), "entropy_collapse") == []  # 0.8 -> 0.48


def test_an_entropy_collapse_within_the_first_window_is_found():
    # SmolLM2 at learning rate 1e-3 (benchmarks/entropy/collapse_smollm2.py): 2.08 nats at step 1, 0.07 at step 8,
    # 0.02-0.05 after. Against the first 20 rows' mean (0.18 here) the last window is 17%, above the 10% ratio; against
    # the first 3 rows' mean (0.83) it is 4%.
    rows = log(40, entropy=lambda t: 2.0 * np.exp(-t / 2) + 0.03)
    [collapse] = checks_found(rows, "entropy_collapse")
    assert "over the first 3 rows" in collapse.evidence and collapse.step <= 10
    # a fast fall to half, then steady, is not a collapse
    assert checks_found(log(40, entropy=lambda t: 0.4 + 0.8 * np.exp(-t / 2)), "entropy_collapse") == []


def test_kl_runaway_needs_a_large_and_rising_kl():
    [finding] = checks_found(log(80, kl=lambda t: 0.01 * np.exp(t / 12)), "kl_runaway")
    assert "beta" in finding.suggestion
    assert checks_found(log(80, kl=0.6), "kl_runaway") == []  # large but steady: a policy that moved and stays
    assert checks_found(log(80, kl=lambda t: 0.0005 * t), "kl_runaway") == []  # rising but small (0.04)


def test_format_only_waits_for_the_accuracy_to_follow():
    def fmt(t):
        return np.minimum(0.1 + 0.03 * t, 0.9)  # learnt by step 27

    only = log(100, **{"rewards/format_reward/mean": fmt, "rewards/accuracy_reward/mean": 0.05})
    [finding] = checks_found(only, "format_only")
    assert finding.step > 40 and "accuracy" in finding.suggestion
    follows = log(
        100, **{"rewards/format_reward/mean": fmt, "rewards/accuracy_reward/mean": lambda t: 0.05 + 0.004 * t}
    )
    assert checks_found(follows, "format_only") == []
    skip = next(s for s in diagnose(log(100)).skipped if s.check == "format_only")
    assert "named *format*" in skip.reason


def test_reward_plateau_with_signal_but_not_without():
    flat = log(80, reward=lambda t: 0.3 + 0.01 * np.sin(t))
    [finding] = checks_found(flat, "reward_plateau")
    assert "learning_rate" in finding.suggestion
    no_signal = log(80, reward=0.0, reward_std=0.0, frac_reward_zero_std=1.0)
    assert checks_found(no_signal, "reward_plateau") == []  # that is no_signal's finding


def test_nonfinite_values_and_skipped_steps():
    rows = log(30)
    rows[9]["grad_norm"], rows[12]["reward"] = float("nan"), float("inf")
    rows[-1]["grad_reg/skipped_steps"] = 2.0
    [finding] = checks_found(rows, "nonfinite")
    assert (
        finding.step == 10
        and "grad_reg/skipped_steps 2" in finding.evidence
        and "reward not finite" in finding.evidence
    )
    rows = log(30)
    rows[5]["reward"] = None  # TRL's "no completion had a valid reward" (every function returned None): not a finding
    assert checks_found(rows, "nonfinite") == []


def test_fp16_loss_scaler_overflows_are_not_findings_but_a_scale_below_1_is():
    # an fp16 run: the GradScaler's calibration overflows at steps 1-3 (scale 65536 halved each time), a T4 (no bf16)
    scale = lambda t: np.where(t <= 3, 65536.0 / 2 ** (t - 1), 8192.0)  # noqa: E731
    rows = log(30, loss_scale=scale, **{"device/bf16_supported": 0.0})
    for row in rows[:3]:
        row["grad_norm"] = float("inf")
    assert checks_found(rows, "nonfinite") == []
    # the same overflows counted by grad_reg (no loss_scale logged: the doctor was off during training)
    counted = log(30, **{"grad_reg/scaler_overflows": lambda t: np.minimum(t, 3).astype(float)})
    for row in counted[:3]:
        row["grad_norm"] = float("inf")
    assert checks_found(counted, "nonfinite") == []
    # a diverging run: every step overflows and the scale falls below 1
    diverging = log(30, loss_scale=lambda t: 65536.0 / 2 ** (t - 1), **{"device/bf16_supported": 0.0})
    for row in diverging:
        row["grad_norm"] = float("inf")
    [finding] = checks_found(diverging, "nonfinite")
    assert "grad_norm not finite at steps [18, 19" in finding.evidence
    assert "loss scale fell below 1 at step 18, to 0.000122 by step 30" in finding.evidence  # 2**16 / 2**29 = 2**-13
    assert finding.step == 18 and "bf16" not in finding.suggestion  # the card has none
    # the loss scale alone (no gradient norm logged): no advice about rewards or skipping steps
    scale_only = [{k: v for k, v in row.items() if k != "grad_norm"} for row in diverging]
    [finding] = checks_found(scale_only, "nonfinite")
    assert finding.suggestion == "lower the learning_rate" and finding.step == 18
    on_a_bf16_card = log(30, **{"device/bf16_supported": 1.0})
    on_a_bf16_card[4]["grad_norm"] = float("nan")
    [finding] = checks_found(on_a_bf16_card, "nonfinite")
    assert "train in bf16=True" in finding.suggestion


def test_grad_spikes_against_the_recent_median_ignoring_steps_without_signal():
    rows = log(40)
    rows[25]["grad_norm"] *= 30
    [finding] = checks_found(rows, "grad_spikes")
    assert finding.step == 26
    quiet = log(40, grad_norm=lambda t: np.where((t > 10) & (t < 30), 0.0, 0.3))  # zero norms: no signal, no spike
    assert checks_found(quiet, "grad_spikes") == []


def test_generation_bound_and_its_skip_without_timings():
    rows = log(40, **{"timing/generation": 9.5, "timing/scoring": 0.2})
    [finding] = checks_found(rows, "generation_bound", {"generation_compile": True, "use_vllm": False})
    assert "95%" in finding.title and "use_vllm=True" in finding.suggestion
    assert "generation_compile" not in finding.suggestion  # already on
    assert checks_found(log(40, **{"timing/generation": 6.0}), "generation_bound") == []
    skip = next(s for s in diagnose(log(40)).skipped if s.check == "generation_bound")
    assert "run_doctor=True" in skip.reason


def test_memory_headroom_both_ways():
    [high] = checks_found(log(40, **{"memory/peak_reserved_gib": lambda t: 20 + t / 10, "memory/total_gib": 24.0}),
                          "memory")  # fmt: skip
    assert "nearly full" in high.title and high.step == 28  # 20 + 28 / 10 = 22.8 = 0.95 · 24, the first step there
    [low] = checks_found(log(40, **{"memory/peak_reserved_gib": 5.0, "memory/total_gib": 24.0}), "memory")
    assert "mostly unused" in low.title
    assert checks_found(log(40, **{"memory/peak_reserved_gib": 15.0, "memory/total_gib": 24.0}), "memory") == []


def test_short_logs_and_unknown_checks_are_said_not_guessed():
    diagnosis = diagnose(log(5))
    assert diagnosis.findings == []
    reasons = {skip.check: skip.reason for skip in diagnosis.skipped}
    assert reasons["no_signal"] == "needs 40 logged values of `frac_reward_zero_std` (finite numbers), the log has 5"
    with pytest.raises(ValueError, match=r"unknown run doctor check\(s\) \['nope'\]"):
        diagnose(log(5), checks=["nope"])
    assert isinstance(CHECKS["kl_runaway"](Run(log(30))), Skip)  # beta 0: no kl logged


def test_the_checks_register_without_an_import_cycle_in_the_order_of_the_report():
    """`checks` (the registry) imports no module of the doctor that imports it, directly or through others; the
    package imports the check modules, whose checks fill `CHECKS` in the report's order."""
    folder = Path(callback_module.__file__).parent
    imports = {}  # doctor module -> the doctor modules it imports (relative imports: `from . import x`, `from .x`)
    for path in folder.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module} if node.module else {alias.name for alias in node.names}
        imports[path.stem] = found

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for other in imports.get(todo.pop(), ()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen

    assert imports["checks"] == {"series", "thresholds"}
    assert "checks" not in reach("checks")
    assert all(module not in reach(module) for module in imports if module != "__init__")  # no cycle anywhere
    assert {"learning", "stability", "resources"} <= imports["__init__"]
    order = [CHECKS[name].__module__.rpartition(".")[2] for name in CHECKS]
    assert sorted(set(order), key=order.index) == ["learning", "stability", "resources"]
    assert order == sorted(order, key=["learning", "stability", "resources"].index)  # each module's checks together
    assert list(CHECKS) == ["no_signal", "small_groups", "collapse", "truncation", "format_only", "reward_plateau",
                            "entropy_collapse", "entropy_explosion", "kl_runaway", "nonfinite", "no_update",
                            "grad_spikes", "fast_generation", "generation_bound", "memory"]  # fmt: skip


def test_every_threshold_has_a_source():
    for name, threshold in THRESHOLDS.items():
        assert threshold.source and threshold.meaning and threshold.unit, name


# ----- the callback -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1e9, callback_module.BUDGET], ids=["every log", "default budget"])
def test_callback_warns_once_per_finding_at_the_step_the_command_reports(caplog, tmp_path, monkeypatch, budget):
    monkeypatch.setattr(callback_module, "BUDGET", budget)
    rows = log(60, frac_reward_zero_std=lambda t: np.where(t > 20, 1.0, 0.3),
               reward=lambda t: np.where(t > 20, 0.0, 0.2 + 0.01 * t),
               **{"completions/clipped_ratio": 0.5})  # fmt: skip
    callback = DoctorCallback()
    args = SimpleNamespace(output_dir=str(tmp_path), num_generations=4)
    state = SimpleNamespace(is_world_process_zero=True, global_step=0, log_history=[])
    callback.on_train_begin(args, state, None)
    warned_at = {}
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.doctor.callback"):
        for row in rows:
            state.global_step = row["step"]
            before = len(callback.findings)
            callback.on_log(args, state, None, logs={k: v for k, v in row.items() if k != "step"})
            for finding in callback.findings[before:]:
                warned_at[finding.key] = row["step"]
        callback.on_train_end(args, state, None)
    offline = diagnose(rows, {"num_generations": 4}).findings
    expected = {("truncation", "run"): 1, ("no_signal", "run"): 21}  # where each began (issue #71)
    assert {f.key: f.step for f in offline} == {f.key: f.step for f in callback.findings} == expected
    if budget > 1:  # checked at every log: each warned at the log where its first window ends
        assert warned_at == {("truncation", "run"): 40, ("no_signal", "run"): 58}  # 40: the first full window
    else:  # here no training time passes between logs, so the 0.5% budget defers the checks, and nothing is lost
        assert all(warned_at.get(key, 60) >= step for key, step in expected.items())
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and "2 finding(s) (no_signal, truncation)" in warnings[-1]  # two findings, one summary


# ----- the trainer side ---------------------------------------------------------------------------------------------


def _train(model_dir, output_dir, reward, **overrides):
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(8, seed=0)))
    args = GRPOConfig(**small_grpo_kwargs(output_dir, **overrides))
    trainer = GRPOTrainer(model=model_dir, reward_funcs=[reward], args=args,
                          train_dataset=dataset)  # fmt: skip
    trainer.train()
    return trainer


def test_run_doctor_logs_the_step_time_split_and_leaves_training_unchanged(tiny_model_dir, tmp_path, capsys):
    """... and (issue #72) writes the log it checked at the end, so that the command its end-of-run line names works
    on a run that saved nothing else (`save_strategy="no"`, no recipe: before, "holds no training log")."""
    plain = _train(tiny_model_dir, tmp_path / "plain", length_reward)
    doctor = _train(tiny_model_dir, tmp_path / "doctor", length_reward, run_doctor=True)
    assert sum(isinstance(c, DoctorCallback) for c in doctor.callback_handler.callbacks) == 1
    assert not any(isinstance(c, DoctorCallback) for c in plain.callback_handler.callbacks)
    for name, p in plain.model.named_parameters():  # the doctor only reads and times
        torch.testing.assert_close(p, doctor.model.get_parameter(name), rtol=0, atol=0)
    rows = [row for row in doctor.state.log_history if "reward" in row]
    assert len(rows) == 3
    for row in rows:
        assert 0 < row["timing/generation"] < row["step_time"] and 0 < row["timing/scoring"] < row["step_time"]
        assert "memory/peak_reserved_gib" not in row  # CPU
    assert not any("timing/generation" in row for row in plain.state.log_history)
    logged = [json.loads(line) for line in (tmp_path / "doctor" / "run_doctor_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [1, 2, 3] and logged[0]["reward"] == rows[0]["reward"]
    assert {p.name for p in (tmp_path / "doctor").iterdir()} == {"run_doctor_log.jsonl"}  # nothing else was saved
    assert not (tmp_path / "plain" / "run_doctor_log.jsonl").exists()
    capsys.readouterr()
    assert cli.main(["doctor", str(tmp_path / "doctor"), "--no-png"]) == 0
    assert "3 logged training steps, up to step 3" in capsys.readouterr().out


def test_timings_are_per_optimizer_step_when_a_generation_batch_serves_two(tiny_model_dir, tmp_path):
    trainer = _train(tiny_model_dir, tmp_path / "out", length_reward, run_doctor=True, steps_per_generation=2,
                     max_steps=4)  # fmt: skip
    rows = [row for row in trainer.state.log_history if "loss" in row]
    # steps 1 and 3 generate (for themselves and the next step), 2 and 4 train on the buffered batch
    assert [row["timing/generation"] > 0 for row in rows] == [True, False, True, False]
    assert [row["timing/scoring"] > 0 for row in rows] == [True, False, True, False]
    assert all(row["timing/generation"] < row["step_time"] for row in rows)


def test_a_run_without_signal_is_warned_about_while_it_trains(tiny_model_dir, tmp_path, caplog):
    def constant(completions, **kwargs):  # every completion scores alike: no advantage anywhere
        return [0.0] * len(completions)

    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.doctor.callback"):
        trainer = _train(tiny_model_dir, tmp_path / "out", constant, run_doctor=True, max_steps=40,
                         per_device_train_batch_size=4, max_completion_length=8)  # fmt: skip
    [callback] = [c for c in trainer.callback_handler.callbacks if isinstance(c, DoctorCallback)]
    # both hold from the start (found at the end of the first 40-step window); the random model's completions all
    # run to max_completion_length too
    assert {(f.check, f.step) for f in callback.findings} == {("no_signal", 1), ("truncation", 1)}
    assert "no learning signal (constant)" in caplog.text and "check that the reward functions" in caplog.text


# ----- the command --------------------------------------------------------------------------------------------------


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def test_doctor_command_reports_and_draws_the_dashboard(tmp_path, capsys):
    rows = log(60, **{"completions/clipped_ratio": 0.5})
    (tmp_path / "training_metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert cli.main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "60 logged training steps, up to step 60: 1 finding(s)" in out and "[truncation]" in out
    assert "kl_runaway: needs `kl` in the log" in out  # skipped, and why
    png = (tmp_path / "doctor.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000


def test_the_report_and_the_dashboard_account_for_skipped_prompts(tmp_path, capsys):
    """With prompt skipping, the report says what generation cost and what skipping left out (the running totals at
    the last logged step: 30 steps of 300 generated tokens and 100 left out, 1 prompt skipped a step), and the
    dashboard plots both per step; without it, no such line."""
    totals = {"prompt_skip/completion_tokens_total": lambda t: 300.0 * t,
              "prompt_skip/tokens_saved": lambda t: 100.0 * t, "prompt_skip/skipped": lambda t: 1.0 * t}  # fmt: skip
    rows = log(30, **{"prompt_skip/completion_tokens": 300.0}, **totals)
    line = diagnose(rows).generation
    assert line == (
        "generation: 9,000 completion tokens generated for training; prompt skipping skipped 30 prompts, "
        "leaving out about 3,000 tokens (25% of what generating every drawn prompt would have cost)"
    )
    assert diagnose(log(30)).generation == ""
    (tmp_path / "training_metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert cli.main(["doctor", str(tmp_path)]) == 0
    assert line in capsys.readouterr().out
    assert (tmp_path / "doctor.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_doctor_reads_the_newest_readable_checkpoint_of_a_running_run(tmp_path, capsys):
    for step, text in ((20, json.dumps({"log_history": log(20)})), (40, '{"log_history": [')):  # 40: being written
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(text)
    assert cli.main(["doctor", str(tmp_path), "--no-png"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint-20/trainer_state.json" in out and "checkpoint-40/trainer_state.json: not readable JSON" in out
    assert "20 logged training steps, up to step 20" in out


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "nope", "does not exist: give a run's output_dir"),
        (lambda d: d, "holds no training log: looked for trainer_state.json"),
        (
            lambda d: (
                (d / "trainer_state.json").write_text(
                    json.dumps({"log_history": [{"step": 5, "loss": 1.2, "grad_norm": 3.0, "learning_rate": 2e-5}]})
                )
                and d
            ),
            "not a GRPO run's log: its rows have none of ['reward', 'frac_reward_zero_std'] (they log ['grad_norm', ",
        ),
        (
            lambda d: (d / "trainer_state.json").write_text(json.dumps({"log_history": []})) and d,
            "no training step logged in it yet",
        ),
        (lambda d: (d / "trainer_state.json").write_text("not json") and d, "no readable training log"),
    ],
    ids=["missing", "empty", "another trainer", "no step yet", "unreadable"],
)
def test_doctor_command_bad_folders_are_one_line(tmp_path, capsys, make, message):
    folder = make(tmp_path)
    assert cli.main(["doctor", str(folder)]) == 1
    line = _error(capsys)
    assert line.startswith("trl-grpo-ext doctor: error: ") and message in line


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_run_doctor_logs_the_cuda_memory_headroom(tiny_model_dir, tmp_path):
    trainer = _train(tiny_model_dir, tmp_path / "out", length_reward, run_doctor=True, use_cpu=False, bf16=True)
    rows = [row for row in trainer.state.log_history if "reward" in row]
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    for row in rows:
        assert 0 < row["memory/peak_reserved_gib"] <= row["memory/total_gib"] == pytest.approx(total)
    assert not any(skip.check == "memory" for skip in diagnose(trainer.state.log_history).skipped)


def test_values_that_are_not_numbers_are_left_out_and_all_nan_metrics_skip_their_checks(tmp_path, capsys):
    rows = log(60, entropy=np.nan)
    rows[3]["reward"], rows[4]["kl"], rows[5]["step"] = [0.1], "abc", "6"  # hand-edited or foreign values
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": rows}))
    assert cli.main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 row(s) without a whole-number `step`: skipped" in out and "59 logged training steps" in out
    assert "entropy_collapse: needs 40 logged values of `entropy` (finite numbers), the log has 0" in out
    assert (tmp_path / "doctor.png").stat().st_size > 50_000


def test_doctor_command_png_and_checks_options(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "training_metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in log(50)))
    (tmp_path / "dash").mkdir()
    assert cli.main(["doctor", str(tmp_path / "run"), "--png", str(tmp_path / "dash"), "--checks", "no_signal"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "dash" / "doctor.png").is_file() and "skipped" not in out  # one check, and it ran
    for argv, message in (
        (["--png", str(tmp_path / "x.txt")], "give a .png file or a folder to write doctor.png into"),
        (["--png", str(tmp_path / "x.png"), "--no-png"], "and --no-png: give one of them"),
        (["--checks", "no_signl,truncation"], "--checks: unknown check `no_signl` (did you mean `no_signal`?)"),
    ):
        assert cli.main(["doctor", str(tmp_path / "run"), *argv]) == 1
        assert message in _error(capsys)
