"""Training stages of policy grouping (issue #18): warm-up, competition, fusion. Formulas against hand-computed
values, the schedule's stage changes, the state in each stage, a tiny run, resume and two processes."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from datasets import Dataset
from torch.testing import assert_close

from tests.conftest import small_grpo_kwargs
from tests.resume_check import check_resume
from tests.two_process import full_records, two_process
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows
from trl_grpo_ext.policy_groups.stages import (
    StageSchedule,
    fusion_mix,
    fusion_step,
    reward_flat,
    reward_rise,
    toward_uniform,
    uniform_draw,
)
from trl_grpo_ext.policy_groups.state import PolicyGroupState
from trl_grpo_ext.reporting.plots import plot_policy_groups, stage_spans

D = torch.float64


def test_reward_rise_by_hand():
    # a straight line 0, 1, 2: slope 1, rise 1 * (3 - 1) = 2, no residuals
    assert reward_rise(torch.tensor([0.0, 1.0, 2.0])) == pytest.approx((2.0, 0.0))
    # 0, 2, 1: t = -1, 0, 1, mean 1, slope ((-1)(-1) + 0 + (1)(0)) / 2 = 0.5, rise 1.0; residuals r - 1 - 0.5 t =
    # -0.5, 1, -0.5, sum of squares 1.5, / (W - 2) = 1.5, / sum t^2 = 0.75, sqrt = 0.866, times span 2 = 1.732
    rise, se = reward_rise(torch.tensor([0.0, 2.0, 1.0]))
    assert rise == pytest.approx(1.0) and se == pytest.approx(2 * math.sqrt(0.75))


def test_reward_flat_needs_rise_plus_its_error_below_tol_times_std():
    flat = torch.tensor([0.5, 0.5, 0.5, 0.5])
    assert reward_flat(flat, reward_std=0.5, tol=0.1)  # 0 + 0 < 0.05
    rising = torch.tensor([0.1, 0.2, 0.3, 0.4])  # rise 0.3, no error
    assert not reward_flat(rising, reward_std=0.5, tol=0.1)
    assert reward_flat(rising, reward_std=0.5, tol=0.7)  # 0.3 < 0.35
    noisy = torch.tensor([0.5, 0.0, 1.0, 0.5])  # slope 0.1 -> rise 0.3, and a large error
    assert not reward_flat(noisy, reward_std=0.5, tol=0.7)  # 0.3 + se > 0.35: not known to be flat


def test_fusion_step_mix_and_uniform_by_hand():
    assert fusion_step(0.75, 100) == 75 and fusion_step(30.0, 100) == 30 and fusion_step(0.001, 100) == 1
    assert fusion_mix(15, 10, 10) == 0.5 and fusion_mix(25, 10, 10) == 1.0 and fusion_mix(10, 10, 10) == 0.0
    assert fusion_mix(10, 10, 0) == 1.0
    available = torch.tensor([True, True, False])
    # weights 1.5, 0.5 (mean 1) a quarter of the way to 1: 1.375, 0.625; the empty group keeps 0
    assert_close(toward_uniform(torch.tensor([1.5, 0.5, 0.0], dtype=D), 0.25, available),
                 torch.tensor([1.375, 0.625, 0.0], dtype=D))  # fmt: skip
    # p = 0.9, 0.1, 0; sizes 1, 3, 0 -> prompt-proportional 0.25, 0.75, 0; half-way: 0.575, 0.425, 0
    assert_close(uniform_draw(torch.tensor([0.9, 0.1, 0.0], dtype=D), torch.tensor([1, 3, 0]), 0.5),
                 torch.tensor([0.575, 0.425, 0.0], dtype=D))  # fmt: skip


def _args(**overrides):
    fields = dict(
        policy_group_warmup_steps=5,
        policy_group_warmup_plateau=False,
        policy_group_plateau_window=4,
        policy_group_plateau_tol=0.1,
        policy_group_fusion_start=None,
        policy_group_fusion_anneal_steps=10,
    )
    return SimpleNamespace(**{**fields, **overrides})  # fmt: skip


def test_schedule_fixed_warmup_then_competition_then_annealed_fusion():
    args = _args(policy_group_fusion_start=0.5)  # of 40 steps: fusion at step 20
    schedule = StageSchedule(warmup=True)
    for step in range(5):
        assert schedule.advance(step, 0.1 * step, 0.4, args, 40) == []
        assert (schedule.stage, schedule.uniform_mix) == ("warmup", 1.0)
    (reason,) = schedule.advance(5, 0.5, 0.4, args, 40)
    assert reason == "step 5: warmup -> competition: policy_group_warmup_steps=5 reached"
    assert (schedule.stage, schedule.uniform_mix, schedule.index) == ("competition", 0.0, 1)
    assert all(schedule.advance(step, 0.5, 0.4, args, 40) == [] for step in range(6, 20))
    (reason,) = schedule.advance(20, 0.5, 0.4, args, 40)
    assert "competition -> fusion" in reason and "0.5 of 40 steps = step 20" in reason
    assert schedule.uniform_mix == 0.0
    schedule.advance(25, 0.5, 0.4, args, 40)
    assert (schedule.stage, schedule.uniform_mix) == ("fusion", 0.5)
    schedule.advance(31, 0.5, 0.4, args, 40)
    assert schedule.uniform_mix == 1.0 and schedule.events[-1] == reason


def test_schedule_plateau_ends_warmup_once_the_reward_stops_rising():
    args = _args(policy_group_warmup_steps=100, policy_group_warmup_plateau=True)
    schedule = StageSchedule(warmup=True)
    for step, reward in enumerate([0.1, 0.2, 0.3, 0.4, 0.5]):  # rising by 0.3 per window of 4, std 0.4: not flat
        assert schedule.advance(step, reward, 0.4, args, 200) == []
    assert schedule.rewards == [0.2, 0.3, 0.4, 0.5]  # the window keeps the last 4
    for step in range(5, 7):  # 0.4, 0.5, 0.5, 0.5: rise 0.15 + se 0.09 > 0.04
        assert schedule.advance(step, 0.5, 0.4, args, 200) == []
    (reason,) = schedule.advance(7, 0.5, 0.4, args, 200)  # 0.5 four times: flat
    assert reason.startswith("step 7: warmup -> competition: the reward's trend flattened: rise +0.0000")
    assert schedule.advance(8, float("nan"), 0.0, args, 200) == [] and len(schedule.rewards) == 4  # NaN: not noted


def test_state_treats_groups_alike_in_warmup_and_keeps_the_rule_out_of_the_weights():
    # groups of 1 and 3 prompts; rewards 1 for group 0, 0 for group 1 -> the learnability rule would favour group 1
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1, 1, 1]), seed=0, warmup=True)
    args = SimpleNamespace(policy_group_weight_rule="progress", policy_group_update_steps=1, policy_group_eta=1.0,
                           policy_group_weight_min=0.05, policy_group_weight_max=2.0,
                           policy_group_weight_smoothing=1.0, policy_group_deficit_z=0.0,
                           policy_group_sampling="weighted",
                           policy_group_sampling_floor=0.0)  # fmt: skip
    state.observe(
        torch.tensor([0, 1]), torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=D), torch.ones(4), num_generations=2, decay=0.9
    )
    assert state.maybe_update_weights(1, args)
    assert_close(state.weights, torch.ones(2, dtype=D))  # not applied in warm-up ...
    assert_close(state.window_reward, torch.tensor([1.0, 0.0], dtype=D))  # ... but the window moved on
    assert_close(state.probabilities(args), torch.tensor([0.25, 0.75], dtype=D))  # prompt-proportional
    state.stages.stage, state.stages.uniform_mix = "competition", 0.0
    state.weights = torch.tensor([0.5, 1.5], dtype=D)
    assert_close(state.applied_weights, state.weights)
    assert_close(state.probabilities(args), torch.tensor([0.25, 0.75], dtype=D))  # weighted: 0.5 : 1.5
    state.stages.stage, state.stages.uniform_mix = "fusion", 0.5
    assert_close(state.applied_weights, torch.tensor([0.75, 1.25], dtype=D))
    assert state.metrics()["policy_groups/a/weight"] == 0.75  # the weight as applied is what is logged


def test_stage_schedule_is_in_the_state_dict_and_loads_without_pickles(tmp_path):
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1]), seed=0, warmup=True)
    state.stages.advance(5, 0.3, 0.2, _args(), 10)
    path = tmp_path / "state.pt"
    torch.save(state.state_dict(), path)
    loaded = PolicyGroupState(["x"], torch.tensor([0]), seed=1)
    loaded.load_state_dict(torch.load(path, weights_only=True))
    assert loaded.stages.state_dict() == state.stages.state_dict() and loaded.stages.stage == "competition"
    older = {k: v for k, v in state.state_dict().items() if k != "stages"}  # a checkpoint from before issue #18
    loaded.load_state_dict(older)
    assert loaded.stages.stage == "competition" and loaded.stages.uniform_mix == 0.0


def test_stage_spans_from_the_logged_stage():
    rows = [{"step": s, "policy_groups/stage": float(stage)} for s, stage in [(1, 0), (2, 0), (3, 1), (4, 2), (5, 2)]]
    assert stage_spans(rows + [{"step": 5, "train_runtime": 1.0}]) == [
        ("warmup", 1, 2), ("competition", 3, 3), ("fusion", 4, 5)
    ]  # fmt: skip
    assert stage_spans([{"step": 1, "reward": 0.5}]) == []


def task_reward(completions, task, **kwargs):
    """Length parity for addition (learnable), always 1 for multiplication (solved), 0 for the rest."""
    table = {"addition": lambda c: float(len(c) % 2), "multiplication": lambda c: 1.0}
    return [table.get(t, lambda c: 0.0)(c[0]["content"]) for c, t in zip(completions, task, strict=True)]


def test_staged_run_logs_each_stage_and_ends_on_uniform_weights(tiny_model_dir, tmp_path, caplog):
    args = GRPOConfig(
        **small_grpo_kwargs(tmp_path, max_steps=7, per_device_train_batch_size=12), policy_group_column="task",
        remove_unused_columns=False, policy_group_min_size=4, policy_group_warmup_steps=2,
        policy_group_fusion_start=0.6, policy_group_fusion_anneal_steps=2,
    )  # fmt: skip
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(48, seed=5)))
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=dataset)
    with caplog.at_level("WARNING"):
        trainer.train()
    rows = [row for row in trainer.state.log_history if "policy_groups/stage" in row]
    # global steps 0-1 of the generation batches are warm-up (logged at steps 1-2); fusion from round(0.6 * 7) = 4
    assert [row["policy_groups/stage"] for row in rows] == [0, 0, 1, 1, 2, 2, 2]
    assert [row["policy_groups/uniform_mix"] for row in rows] == [1, 1, 0, 0, 0, 0.5, 1]
    weights = lambda row: [v for k, v in row.items() if k.startswith("policy_groups/") and k.endswith("/weight")]  # noqa: E731
    assert all(w == 1.0 for row in rows[:2] + rows[-1:] for w in weights(row))
    # statistics are gathered in warm-up too: the groups drawn have EMA rewards from the first step on
    first = [k for k in rows[0] if k.endswith("/reward")]
    assert first and all(0.0 <= rows[0][k] <= 1.0 for k in first)
    assert rows[0].get("policy_groups/multiplication/reward", 1.0) == 1.0  # always rewarded 1, if it was drawn
    assert max(weights(rows[3])) > 1.0  # competition: the rule's weights act
    events = trainer.policy_groups.stages.events
    assert events == [
        "step 2: warmup -> competition: policy_group_warmup_steps=2 reached",
        "step 4: competition -> fusion: policy_group_fusion_start reached (0.6 of 7 steps = step 4)",
    ]
    assert all(event in caplog.text for event in events) and set(events) <= set(trainer.policy_groups.events)
    assert stage_spans(trainer.state.log_history) == [("warmup", 1, 2), ("competition", 3, 4), ("fusion", 5, 7)]
    assert plot_policy_groups(trainer.state.log_history, str(tmp_path / "groups.png")).endswith("groups.png")


def _observed(state, rewards):
    k = state.num_groups
    state.ema["reward"] = torch.tensor(rewards, dtype=D)
    state.ema["reward_std"] = torch.zeros(k, dtype=D)
    state.has_ema["reward"] = torch.ones(k, dtype=torch.bool)
    state.observed = torch.ones(k, dtype=torch.bool)


def test_fusion_merges_the_groups_that_did_well_only(tiny_model_dir, tmp_path):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, per_device_train_batch_size=12), policy_group_column="task",
                      remove_unused_columns=False, policy_group_min_size=2, policy_group_fusion_start=3)  # fmt: skip
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(48, seed=5)))
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=dataset)
    feature, state = trainer.features["policy_groups"], trainer.policy_groups
    assert state.names == ["addition", "four-step", "multiplication", "three-step", "two-step"]
    # mean 0.55: addition 0.98 and multiplication 1.0 did well (and are within tol 0.05); four-step 0.2 and
    # three-step 0.22 are as close but below the mean, so they stay apart, as does two-step
    _observed(state, [0.98, 0.2, 1.0, 0.22, 0.35])
    feature.fusion_merges(step=3)
    assert state.names == ["addition+multiplication", "four-step", "three-step", "two-step"]
    assert "fusion: merge 'addition' and 'multiplication'" in state.events[-1]


def test_plan_fusion_merge_by_hand():
    from trl_grpo_ext.policy_groups.regrouping import plan_fusion_merge

    names = ["a", "b", "c", "d", "e"]
    std = np.zeros(5)
    # seen: a, c, d, e; mean (0.98 + 1.0 + 0.2 + 0.22) / 4 = 0.6: a and c did well and are within 0.05
    assert plan_fusion_merge(names, np.array([0.98, np.nan, 1.0, 0.2, 0.22]), std, 0.05, 2)[:2] == (0, 2)
    assert plan_fusion_merge(names, np.array([0.9, np.nan, 1.0, 0.2, 0.22]), std, 0.05, 2) is None  # 0.1 apart
    assert plan_fusion_merge(names, np.full(5, np.nan), std, 0.05, 2) is None  # nothing seen yet


def test_stage_settings_without_groups_are_an_error(tiny_model_dir, tmp_path):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), policy_group_warmup_steps=2)
    with pytest.raises(ValueError, match=r"policy_group_warmup_steps=2 needs policy groups"):
        GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args,
                    train_dataset=Dataset.from_list(to_grpo_rows(synthetic_gsm8k(8, seed=5))))  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy_group_fusion_start": 2.5}, r"in \(0, 1000000000\] \(a whole number from 1\), or None, got 2.5"),
        ({"policy_group_warmup_plateau": True}, r"set policy_group_warmup_steps \(got None\)"),
        (
            {"policy_group_warmup_steps": 10, "policy_group_fusion_start": 5},
            r"policy_group_warmup_steps \(10\) must be < policy_group_fusion_start \(5\)",
        ),
        ({"policy_group_fusion_start": 9}, r"policy_group_fusion_start \(9\) is after the run's last step"),
        ({"policy_group_plateau_window": 2}, "policy_group_plateau_window must be an integer >= 3, got 2"),
        ({"policy_group_fusion_anneal_steps": -1}, "policy_group_fusion_anneal_steps must be an integer >= 0"),
    ],
)
def test_stage_fields_are_checked_at_config_time(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=8), **overrides)


STAGED = {
    "policy_group_column": "task",
    "policy_group_min_size": 2,
    "remove_unused_columns": False,
    "num_problems": 24,
    # warm-up until the 4th generation batch (global step 3, just after the checkpoint at 3: its reward window must
    # come back from the checkpoint) when the reward is flat by a generous tolerance; fusion at round(0.8 * 6) = 5
    "policy_group_warmup_steps": 5,
    "policy_group_warmup_plateau": True,
    "policy_group_plateau_window": 4,
    "policy_group_plateau_tol": 100.0,
    "policy_group_fusion_start": 0.8,
    "policy_group_fusion_anneal_steps": 0,
}


def test_staged_run_resumes_exactly(tmp_path, tiny_model_dir):
    assert check_resume(STAGED, tmp_path, tiny_model_dir) == 0.0


@two_process("stages", {**STAGED, "per_device_train_batch_size": 6})
def test_two_processes_hold_identical_stages(two_process_runs):
    """The run is scenario "stages" of the suite's shared two-process job (tests/two_process.py)."""
    records = full_records(two_process_runs["stages"])
    stages = [[row["policy_groups/stage"] for row in r["logs"] if "policy_groups/stage" in row] for r in records]
    assert stages[0] == stages[1] == [0, 0, 0, 1, 1, 2]
    keys = [k for k in records[0]["logs"][-2] if k.startswith("policy_groups/")]
    assert all(row0.get(k) == row1.get(k) for row0, row1 in zip(records[0]["logs"], records[1]["logs"], strict=True)
               for k in keys)  # fmt: skip
