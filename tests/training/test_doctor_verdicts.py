"""The run doctor's verdicts on the runs its docs describe (issue #58): the CPU demo's real log ends without signal
though its last step is noisy; a run whose parameters never change (a frozen model) is a finding; generation groups
too small for the run's pass rate (p^G + (1 − p)^G) are a finding with the num_generations to raise to."""

import json
import logging
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from datasets import Dataset

from tests.conftest import REPO_ROOT, length_reward, small_grpo_kwargs
from tests.training.test_doctor import checks_found, log
from tests.training.test_recipes import load_recipe
from trl_grpo_ext import GRPOConfig, GRPOTrainer, cli
from trl_grpo_ext.doctor import CHECKS, DoctorCallback, diagnose
from trl_grpo_ext.doctor import callback as callback_module
from trl_grpo_ext.doctor.checks import Run
from trl_grpo_ext.doctor.learning import degenerate_share, pass_fail_reward
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows

# ----- the end of a run: one noisy step does not clear it ---------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "rows"),
    [
        ([0, 1, 1, 1, 1, 1], 5),  # the last 5 hold: enough (tail_rows)
        ([1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1], 12),  # 1 row out (tail_outliers): the whole run
        ([0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0], 11),  # the CPU demo: 10 rows, then 1 noisy last one
        ([0, 0, 0, 1, 1, 1, 1, 1, 0], 6),  # 5 held, the last row out
        ([0, 1, 1, 1, 1, 0], 5),  # 4 held are enough in a 6-row run (its last half, 3)
        ([0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0], 0),  # the same in a 12-row run: 4 held, under tail_rows (5)
        ([1, 0, 1, 0, 1, 0, 1, 0, 1, 0], 0),  # half out: no state to end in
        ([1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1], 9),  # two rows out: the tail starts after the first (8 held)
        ([1, 1, 1, 1, 1, 0, 0], 0),  # 2 rows out: the run left it
    ],
)
def test_the_tail_lets_one_noisy_row_pass(condition, rows):
    condition = np.array(condition, dtype=bool)
    assert Run(log(len(condition)), ended=True).tail(condition) == rows
    assert Run(log(len(condition))).tail(condition) == 0  # not ended: more steps may come


@pytest.mark.parametrize("last", [0.75, 0.0, 1.0], ids=["noisy last step", "a last step with signal", "clean"])
def test_a_run_ending_without_signal_stays_a_finding_whatever_its_last_step(last):
    """The CPU demo's shape: no signal over steps 32-39, then a last step that may have a signal: the verdict does
    not flip on it; a second noisy step among the last nine does (the tail after it is under 5 steps)."""
    rows = log(40, frac_reward_zero_std=lambda t: np.where(t > 31, 1.0, 0.3),
               reward=lambda t: np.where(t > 31, 0.0, -0.4 + 0.01 * t))  # fmt: skip
    rows[-1]["frac_reward_zero_std"] = last
    [finding] = [f for f in diagnose(rows, ended=True).findings if f.check == "no_signal"]
    assert finding.step == 32 and "over steps 32-40" in finding.evidence  # where it began (issue #71)
    assert f"({9 if last == 1.0 else 8} of the last 9 rows >= 0.95)" in finding.evidence
    rows[-2]["frac_reward_zero_std"] = 0.5
    still = [f.check for f in diagnose(rows, ended=True).findings if f.check == "no_signal"]
    assert still == (["no_signal"] if last == 1.0 else [])  # with a clean last step, one noisy row of nine


# ----- the CPU demo's real log ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The CPU demo as the docs run it (`make demo`: recipes/configs/demo_cpu.yaml, 40 steps of the tiny model),
    without the evaluation: its output folder and the run doctor's end-of-run line."""
    recipe = load_recipe("math_gsm8k")
    out = tmp_path_factory.mktemp("demo")
    argv = ["--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(out),
            "--eval_limit", "0"]  # fmt: skip
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    doctor_logger = logging.getLogger("trl_grpo_ext.doctor.callback")
    doctor_logger.addHandler(handler)
    try:
        recipe.main(*recipe.make_parser().parse_args_and_config(argv))
    finally:
        doctor_logger.removeHandler(handler)
    return out, [record.getMessage() for record in records]


def test_the_demo_ends_with_no_signal_as_its_docs_say(demo_run, capsys):
    """docs/features/doctor.md and docs/getting-started.md: on the demo expect `no_signal` (the tiny random model
    learns to end its completions at once, the length penalty's best; its accuracy stays 0), found at the end of the
    run by the callback and by `trl-grpo-ext doctor`, and nothing else."""
    out, messages = demo_run
    end_line = messages[-1]
    # the line docs/getting-started.md quotes: skipped, format_only (too short), kl_runaway (beta 0), fast_generation
    # and memory (not logged on CPU)
    assert end_line.startswith(f"run doctor: 1 finding(s) (no_signal); 4 of {len(CHECKS)} checks skipped over 40 ")
    assert [m for m in messages[:-1] if "[no_signal] no learning signal at the end of the run" in m]
    rows = [json.loads(line) for line in (out / "training_metrics.jsonl").read_text().splitlines()]
    diagnosis = diagnose(rows, {"num_generations": 4}, ended=True)
    [finding] = diagnosis.findings
    assert finding.check == "no_signal" and "at the end of the run" in finding.title
    # the step the stretch without signal began (issue #71: it said 40, the run's last): the first of the rows the
    # evidence names that has no signal
    start = int(re.search(r"over steps (\d+)-40", finding.evidence)[1])
    without = [row["step"] for row in rows if row["step"] >= start and row["frac_reward_zero_std"] >= 0.95]
    assert finding.step == without[0] < 40
    # during training (not ended) the state is shorter than a window: no finding yet
    assert diagnose(rows, {"num_generations": 4}).findings == []
    # the verdict does not flip on the last step, whatever it logged
    for last in (0.0, 0.5, 1.0):
        noisy = [dict(row) for row in rows]
        noisy[-1]["frac_reward_zero_std"] = last
        assert [f.check for f in diagnose(noisy, ended=True).findings] == ["no_signal"]
    assert cli.main(["doctor", str(out)]) == 0  # and its dashboard, policy groups and all
    report = capsys.readouterr().out
    assert (out / "doctor.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "40 logged training steps, up to step 40: 1 finding(s) (no_signal)" in report
    assert "[no_signal] no learning signal at the end of the run (best reward, no accuracy)" in report


def test_the_demo_facts_the_docs_state_are_the_demos(demo_run):
    """Issue #72: the docs gave the demo's steps without signal as 9, 10 or 30-39 and its completions as 4-7 tokens
    (2.2-4.8 measured). docs/facts.toml holds one value each, which scripts/check_docs_facts.py holds every page to;
    here they are recomputed from a fresh run of the demo."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_docs_facts", REPO_ROOT / "scripts" / "check_docs_facts.py")
    facts_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts_check)
    out, _ = demo_run
    rows = [json.loads(line) for line in (out / "training_metrics.jsonl").read_text().splitlines()]
    facts = facts_check.load_facts()
    measured = facts_check.demo_facts(rows)
    assert measured == {name: facts[name]["value"] for name in measured}  # 31-39, 9, 2.1-5.3


# ----- parameters that do not change --------------------------------------------------------------------------------


def test_a_zero_gradient_where_there_is_a_signal_is_a_finding_and_one_without_signal_is_not():
    frozen = log(30, grad_norm=0.0)  # frac_reward_zero_std 0.3: every step has a signal
    [finding] = checks_found(frozen, "no_update")
    assert finding.step == 1 and "grad_norm exactly 0 at 5 logged rows in a row" in finding.evidence  # from the start
    assert "is_trainable=True" in finding.suggestion and "ms-swift#5890" in finding.suggestion
    # the CPU demo's shape (beta 0): a zero norm only at steps without signal (frac 1): learning, not frozen
    quiet = log(30, grad_norm=lambda t: np.where(t > 10, 0.0, 0.3),
                frac_reward_zero_std=lambda t: np.where(t > 10, 1.0, 0.3))  # fmt: skip
    assert checks_found(quiet, "no_update") == []
    rows = log(30)
    for row in rows[10:14]:  # 4 zero rows in a row with a signal: under no_update_rows (5)
        row["grad_norm"] = 0.0
    assert checks_found(rows, "no_update") == []


def test_with_beta_the_kl_says_whether_the_policy_moved():
    """A fresh PEFT adapter loaded frozen with beta > 0: PEFT's disable_adapter turns requires_grad back on, so the
    gradient norm is not 0, but the policy equals the reference at every step (kl exactly 0). A run that learns has
    a KL above 0 after its first update, and an old DeepSpeed's zero gradient norm is then not a finding."""
    [finding] = checks_found(log(30, kl=lambda t: np.zeros_like(t, dtype=float)), "no_update")
    assert "kl exactly 0" in finding.evidence and finding.step == 2  # the first row's KL is 0 in any run
    moving = log(30, grad_norm=0.0, kl=lambda t: np.where(t > 1, 0.01, 0.0))
    assert checks_found(moving, "no_update") == []


def test_a_zero_learning_rate_and_no_trainable_parameter_are_findings():
    [finding] = checks_found(log(30, learning_rate=0.0), "no_update", {"learning_rate": 0.0})
    assert "learning rate is 0" in finding.title and "learning_rate above 0 (now 0.0)" in finding.suggestion
    decayed = log(30, learning_rate=lambda t: 1e-5 * (30 - t) / 30)  # linear decay: 0 at the last step only
    assert checks_found(decayed, "no_update") == []
    [finding] = checks_found(log(3), "no_update", {"trainable_parameters": 0})
    assert finding.step == 1 and "none is trainable" in finding.title


def test_a_frozen_model_trains_silently_and_the_doctor_says_so(tiny_model_dir, tmp_path, caplog):
    """Issue #58: a model whose parameters are all frozen trains without an error (the trainer refuses one at init,
    so they are frozen after it, as a PEFT adapter loaded without is_trainable=True is under stock TRL): the callback
    warns at the first log, and `trl-grpo-ext doctor` finds it in the log alone (grad_norm 0 with a signal)."""
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16, seed=0)))
    args = GRPOConfig(**small_grpo_kwargs(tmp_path / "out", max_steps=6, run_doctor=True))
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=[length_reward], args=args, train_dataset=dataset)
    trainer.model.requires_grad_(False)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.doctor.callback"):
        trainer.train()
    for name, p in trainer.model.named_parameters():  # nothing changed
        torch.testing.assert_close(p, before[name], rtol=0, atol=0)
    [callback] = [c for c in trainer.callback_handler.callbacks if isinstance(c, DoctorCallback)]
    assert [(f.check, f.step) for f in callback.findings] == [("no_update", 1)]
    assert "none is trainable" in caplog.text
    rows = [row for row in trainer.state.log_history if "reward" in row]
    assert all(row["grad_norm"] == 0 for row in rows) and sum(row["frac_reward_zero_std"] < 1 for row in rows) >= 5
    [finding] = checks_found(trainer.state.log_history, "no_update")  # the log alone, as the command reads it
    assert "the gradient is 0 where there is a signal" in finding.title


# ----- generation groups too small for the pass rate ----------------------------------------------------------------


def test_the_expected_share_of_groups_that_all_pass_or_all_fail():
    # G = 2 at p = 0.2: 0.2² + 0.8² = 0.04 + 0.64 = 0.68 (issue #58 measured 0.72); G = 8: 0.8⁸ + 0.2⁸ ≈ 0.168
    np.testing.assert_allclose(degenerate_share(np.array([0.2, 0.5, 0.0]), 2), [0.68, 0.5, 1.0])
    np.testing.assert_allclose(degenerate_share(np.array([0.2]), 8), [0.8**8 + 0.2**8])


def _binary(p: float, completions: int = 16) -> float:
    """The std TRL logs for a pass/fail reward with mean p over `completions` (Bessel-corrected)."""
    return float(np.sqrt(p * (1 - p) * completions / (completions - 1)))


def test_a_pass_fail_reward_is_told_from_a_graded_one_by_its_variance():
    # pass/fail: var = p(1 − p)·16/15 ≥ p(1 − p); graded in [0, 1] with the same mean: far less
    rows = log(30, **{"rewards/accuracy_reward/mean": 0.2, "rewards/accuracy_reward/std": _binary(0.2)})
    assert pass_fail_reward(Run(rows)) == "accuracy_reward"
    graded = log(30, **{"rewards/accuracy_reward/mean": 0.2, "rewards/accuracy_reward/std": 0.1})
    assert pass_fail_reward(Run(graded)) is None
    # the run's only reward function counts though not named accuracy; one of several does not
    only = log(30, **{"rewards/my_reward/mean": 0.3, "rewards/my_reward/std": _binary(0.3)})
    assert pass_fail_reward(Run(only)) == "my_reward"
    other = {"rewards/format_reward/mean": 0.3, "rewards/format_reward/std": _binary(0.3)}
    assert pass_fail_reward(Run(log(30, **other, **{"rewards/length/mean": 0.5}))) is None


def test_groups_too_small_for_the_pass_rate_are_a_finding_with_the_size_to_raise_to():
    """Issue #58's case: num_generations=2 at a 20% pass rate, 72% of the groups without signal: under no_signal's
    0.95, so nothing was said."""
    accuracy = {"rewards/accuracy_reward/mean": 0.2, "rewards/accuracy_reward/std": _binary(0.2),
                "frac_reward_zero_std": 0.72}  # fmt: skip
    rows = log(40, **accuracy)
    [finding] = checks_found(rows, "small_groups", {"num_generations": 2})
    assert finding.step == 1 and "68% are expected to pass or fail as a whole" in finding.title  # from the start
    assert "frac_reward_zero_std measured 0.72" in finding.evidence
    # the smallest G with 0.2^G + 0.8^G <= 0.25: G = 6 gives 0.262, G = 7 gives 0.210
    assert "raise num_generations (now 2) to 7 or more (p^G + (1 − p)^G then 21%)" in finding.suggestion
    assert checks_found(rows, "no_signal", {"num_generations": 2}) == []
    assert checks_found(rows, "small_groups", {"num_generations": 16}) == []  # 0.8^16 ≈ 0.03
    # a pass rate near 0 is no_signal's (the prompts too hard for any G): 0.99^4 ≈ 0.96 >= 0.95
    hard = log(40, **{"rewards/accuracy_reward/mean": 0.01, "rewards/accuracy_reward/std": _binary(0.01)})
    assert checks_found(hard, "small_groups", {"num_generations": 4}) == []
    # the log alone does not say num_generations: skipped, and why
    skip = next(s for s in diagnose(rows).skipped if s.check == "small_groups")
    assert "needs num_generations" in skip.reason


def test_the_callback_knows_num_generations_and_warns_about_small_groups(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(callback_module, "BUDGET", 1e9)  # checked at every log, though no training time passes
    rows = log(30, **{"rewards/accuracy_reward/mean": 0.2, "rewards/accuracy_reward/std": _binary(0.2)})
    callback = DoctorCallback()
    args = SimpleNamespace(output_dir=str(tmp_path), num_generations=2)
    state = SimpleNamespace(is_world_process_zero=True, global_step=0, log_history=[])
    callback.on_train_begin(args, state, None)
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.doctor.callback"):
        for row in rows:
            state.global_step = row["step"]
            callback.on_log(args, state, None, logs={k: v for k, v in row.items() if k != "step"})
    assert [(f.check, f.step) for f in callback.findings] == [("small_groups", 1)]  # found at 20, from the start
    assert "raise num_generations (now 2)" in caplog.text
