"""Training stages of policy grouping (issue #18): warm-up, competition, fusion. Formulas against hand-computed
values, the schedule's stage changes, the state in each stage, a tiny run, resume and two processes."""

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
from trl_grpo_ext.policy_groups import score
from trl_grpo_ext.policy_groups.stages import StageSchedule, fusion_mix, fusion_step
from trl_grpo_ext.policy_groups.state import PolicyGroupState
from trl_grpo_ext.reporting.plots import plot_policy_groups, stage_spans

D = torch.float64


def test_fusion_step_and_mix_by_hand():
    assert fusion_step(0.75, 100) == 75 and fusion_step(30.0, 100) == 30 and fusion_step(0.001, 100) == 1
    assert fusion_mix(15, 10, 10) == 0.5 and fusion_mix(25, 10, 10) == 1.0 and fusion_mix(10, 10, 10) == 0.0
    assert fusion_mix(10, 10, 0) == 1.0


def _args(**overrides):
    fields = dict(policy_group_warmup_steps=5, policy_group_fusion_start=None, policy_group_fusion_anneal_steps=10,
                  policy_group_sampling="learnability", policy_group_sampling_floor=0.0)  # fmt: skip
    return SimpleNamespace(**{**fields, **overrides})


def test_schedule_fixed_warmup_then_competition_then_annealed_fusion():
    args = _args(policy_group_fusion_start=0.5)  # of 40 steps: fusion at step 20
    schedule = StageSchedule(warmup=True)
    for step in range(5):
        assert schedule.advance(step, args, 40) == []
        assert (schedule.stage, schedule.uniform_mix) == ("warmup", 1.0)
    (reason,) = schedule.advance(5, args, 40)
    assert reason == "step 5: warmup -> competition: policy_group_warmup_steps=5 reached"
    assert (schedule.stage, schedule.uniform_mix, schedule.index) == ("competition", 0.0, 1)
    assert all(schedule.advance(step, args, 40) == [] for step in range(6, 20))
    (reason,) = schedule.advance(20, args, 40)
    assert "competition -> fusion" in reason and "0.5 of 40 steps = step 20" in reason
    assert schedule.uniform_mix == 0.0
    schedule.advance(25, args, 40)
    assert (schedule.stage, schedule.uniform_mix) == ("fusion", 0.5)
    schedule.advance(31, args, 40)
    assert schedule.uniform_mix == 1.0 and schedule.events[-1] == reason


def test_state_draws_as_trl_in_warmup_by_the_scores_in_competition_and_back_in_fusion():
    # groups of 1 and 3 prompts; a's prompt disagrees (variance 0.5), b's agree: the score favours a
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1, 1, 1]), seed=0, warmup=True)
    args = _args()
    state.observe(torch.tensor([0, 1]), torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=D), num_generations=2, halflife=8.0)
    assert_close(state.probabilities(args), torch.tensor([0.25, 0.75], dtype=D))  # warm-up: prompt-proportional
    assert_close(state.loss_weights(args), torch.ones(2, dtype=D))
    state.stages.stage, state.stages.uniform_mix = "competition", 0.0
    by_score = score.draw_probabilities(score.scores(state.sums), state.sizes, 0.0)
    assert_close(state.probabilities(args), by_score) and by_score[0] > 0.25
    state.stages.stage, state.stages.uniform_mix = "fusion", 0.5
    assert_close(state.probabilities(args), (by_score + torch.tensor([0.25, 0.75], dtype=D)) / 2)
    weights = state.scores(args) / state.scores(args).mean()
    assert_close(state.loss_weights(args), (weights + 1) / 2)
    assert state.metrics(args)["policy_groups/a/weight"] == pytest.approx(float(state.probabilities(args)[0]) * 4)


def test_stage_schedule_is_in_the_state_dict_and_loads_without_pickles(tmp_path):
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1]), seed=0, warmup=True)
    state.stages.advance(5, _args(), 10)
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
        remove_unused_columns=False, policy_group_warmup_steps=2,
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
    assert all(w == pytest.approx(1.0) for row in rows[:2] + rows[-1:] for w in weights(row))  # TRL's draw
    # statistics are gathered in warm-up too: the groups drawn have rewards from the first step on
    first = [k for k in rows[0] if k.endswith("/reward")]
    assert first and all(0.0 <= rows[0][k] <= 1.0 for k in first)
    assert rows[0].get("policy_groups/multiplication/reward", 1.0) == 1.0  # always rewarded 1, if it was drawn
    assert max(weights(rows[3])) > 1.0  # competition: the scores act
    events = trainer.policy_groups.stages.events
    assert events == [
        "step 2: warmup -> competition: policy_group_warmup_steps=2 reached",
        "step 4: competition -> fusion: policy_group_fusion_start reached (0.6 of 7 steps = step 4)",
    ]
    assert all(event in caplog.text for event in events) and set(events) <= set(trainer.policy_groups.events)
    assert stage_spans(trainer.state.log_history) == [("warmup", 1, 2), ("competition", 3, 4), ("fusion", 5, 7)]
    assert plot_policy_groups(trainer.state.log_history, str(tmp_path / "groups.png")).endswith("groups.png")


def _observed(state, rewards):
    state.sums["prompts"][:] = 1.0
    state.sums["reward"] = torch.tensor(rewards, dtype=D)
    state.observed[:] = True


def test_fusion_merges_the_groups_that_did_well_only(tiny_model_dir, tmp_path):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, per_device_train_batch_size=12), policy_group_column="task",
                      remove_unused_columns=False, policy_group_fusion_start=3)  # fmt: skip
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(48, seed=5)))
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=dataset)
    feature, state = trainer.features["policy_groups"], trainer.policy_groups
    assert state.names == ["addition", "four-step", "multiplication", "three-step", "two-step"]
    # mean 0.55: addition 0.98 and multiplication 1.0 did well (and are within tol 0.05); four-step 0.2 and
    # three-step 0.22 are as close but below the mean, so they stay apart, as does two-step
    _observed(state, [0.98, 0.2, 1.0, 0.22, 0.35])
    state.stages.fusion_at = 3
    feature.advance_stage(step=3)
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
        (
            {"policy_group_warmup_steps": 10, "policy_group_fusion_start": 5},
            r"policy_group_warmup_steps \(10\) must be < policy_group_fusion_start \(5\)",
        ),
        ({"policy_group_fusion_start": 9}, r"policy_group_fusion_start \(9\) is after the run's last step"),
        ({"policy_group_fusion_anneal_steps": -1}, "policy_group_fusion_anneal_steps must be an integer >= 0"),
    ],
)
def test_stage_fields_are_checked_at_config_time(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=8), **overrides)


STAGED = {
    "policy_group_column": "task",
    "remove_unused_columns": False,
    "num_problems": 24,
    # warm-up until the 4th generation batch (global step 3, the checkpoint's: the stage must come back from it);
    # fusion at round(0.8 * 6) = 5
    "policy_group_warmup_steps": 3,
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
