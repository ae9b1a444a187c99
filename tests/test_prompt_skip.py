"""Issue #17: prompt skipping. Pure functions against hand-computed values, the draws' contracts, and tiny end-to-end
runs: solved prompts are skipped once seen, the generation batch keeps its size and TRL's repeat contract, metrics
are logged, and a resumed run (one process and two) continues exactly."""

import pytest
import torch
from datasets import Dataset
from torch.testing import assert_close

from tests.conftest import small_grpo_kwargs
from tests.resume_check import check_resume
from tests.two_process import resume_diff, two_process
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows
from trl_grpo_ext.policy_groups.state import PolicyGroupState
from trl_grpo_ext.prompt_skip.history import NEVER, STREAK_MAX, PromptHistory, uninformative
from trl_grpo_ext.prompt_skip.skipping import adapt_base, keep_probability, skip_streak
from trl_grpo_ext.prompt_skip.state import PromptSkipState

NAN = float("nan")


def test_uninformative_groups_are_those_whose_scored_rewards_all_agree():
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.5, NAN, 0.5, 0.5], [NAN, NAN, NAN, NAN]])
    scored, equal, value = uninformative(rewards)
    assert scored.tolist() == [True, True, True, False]
    assert equal.tolist() == [True, False, True, False]  # unscored completions do not count; all unscored: unknown
    assert_close(value[:3], torch.tensor([1.0, 0.25, 0.5]))  # the mean scored reward
    assert torch.isnan(value[3])


def test_history_counts_streaks_and_remembers_the_value_and_length():
    history = PromptHistory(4)
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [NAN, NAN]])
    lengths = torch.tensor([[10.0, 12.0], [3.0, NAN], [5.0, 5.0]])
    history.observe(torch.tensor([0, 1, 2]), rewards, lengths, step=5)
    history.observe(torch.tensor([0]), torch.tensor([[1.0, 1.0]]), torch.tensor([[8.0, 8.0]]), step=6)
    assert history.streak.tolist() == [2, 0, 0, 0]
    assert history.last_step.tolist() == [6, 5, NEVER, NEVER]  # row 2 was unscored: nothing measured
    assert history.value[0] == 1.0 and torch.isnan(history.value[1])
    assert history.length.tolist() == [8, 3, 0, 0]  # mean tokens of the last visit; truncated ones left out
    history.observe(torch.tensor([0]), torch.tensor([[0.0, 1.0]]), torch.tensor([[8.0, 8.0]]), step=7)
    assert history.streak[0] == 0  # an informative visit ends the streak
    history.streak[3] = STREAK_MAX
    history.observe(torch.tensor([3]), torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]]), step=8)
    assert history.streak[3] == STREAK_MAX  # saturates


def test_a_million_prompts_fit_in_the_issues_64_megabytes():
    history = PromptHistory(1_000_000)
    assert history.nbytes() == 11 * 1_000_000  # int32 step + int8 streak + float32 value + int16 length
    state = PromptSkipState(1_000_000, base=0.5, seed=0)
    state.draw_rows(1, keep=None)  # a pass begun: its order holds the other 999,999 rows
    assert state.nbytes() == 11 * 1_000_000 + 8 * 999_999 <= 64 * 2**20


def test_keep_probability_is_the_base_to_the_streak_with_a_floor():
    streak = torch.tensor([0, 1, 2, 3, 10])
    # 0.5^z: 1, 0.5, 0.25, 0.125, 0.000977 -> floored at 0.05
    assert_close(keep_probability(streak, 0.5, 0.05), torch.tensor([1.0, 0.5, 0.25, 0.125, 0.05], dtype=torch.float64))
    assert keep_probability(torch.tensor([0]), 0.0, 0.01).item() == 1.0  # never seen or informative: always kept


def test_a_failing_prompts_first_visits_do_not_count_a_solved_ones_do():
    streak, value = torch.tensor([2, 2, 5, 1]), torch.tensor([1.0, 0.0, 0.0, NAN])
    # best reward 1: row 0 is solved (streak 2); rows 1 and 2 fail (2 - 3 -> 0, 5 - 3 = 2); NaN: never uninformative
    assert skip_streak(streak, value, best=1.0, grace=3).tolist() == [2, 0, 2, 0]
    assert skip_streak(streak, value, best=0.0, grace=3).tolist() == [2, 2, 5, 0]  # all at the best: solved


def test_the_base_moves_towards_the_target_within_its_bounds():
    assert adapt_base(0.5, observed=0.4, target=0.25, step=0.02, low=0.05) == pytest.approx(0.48)  # skip more
    assert adapt_base(0.5, observed=0.1, target=0.25, step=0.02, low=0.05) == pytest.approx(0.52)  # skip less
    assert adapt_base(0.06, observed=0.9, target=0.25, step=0.02, low=0.05) == 0.05
    assert adapt_base(0.99, observed=0.0, target=0.25, step=0.02, low=0.05) == 1.0
    assert adapt_base(0.5, observed=NAN, target=0.25, step=0.02, low=0.05) == 0.5


def test_the_uniform_draw_passes_over_every_row_and_skips_what_the_filter_refuses():
    state = PromptSkipState(10, base=0.5, seed=3)
    first = state.draw_rows(10, keep=None)
    assert sorted(first.tolist()) == list(range(10))  # one shuffled pass, no repeats
    odd_refused = state.draw_rows(5, keep=lambda row: row % 2 == 0)
    assert sorted(odd_refused.tolist()) == [0, 2, 4, 6, 8]  # the refused rows are consumed, the batch is filled
    refuse_all = state.draw_rows(1, keep=lambda row: False)
    assert len(refuse_all) == 1  # after a whole pass of refusals the last row is taken
    again = PromptSkipState(10, base=0.5, seed=3)
    assert again.draw_rows(10, keep=None).tolist() == first.tolist()  # seeded: every process draws the same


def test_inside_a_policy_groups_draw_the_groups_are_drawn_as_without_the_filter():
    assignment = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    args = GRPOConfig(output_dir="unused", use_cpu=True, bf16=False, policy_group_sampling="weighted")
    plain, filtered = PolicyGroupState(["a", "b"], assignment, 0), PolicyGroupState(["a", "b"], assignment, 0)
    rows = plain.draw_rows(6, args)
    kept = filtered.draw_rows(6, args, keep=lambda row: row not in (0, 4))  # one refused prompt in each group
    assert assignment[rows].tolist() == assignment[kept].tolist()  # the groups' share is the policy groups' choice
    assert not set(kept.tolist()) & {0, 4}


def _half_solved(n: int = 16) -> Dataset:
    rows = to_grpo_rows(synthetic_gsm8k(n, seed=4))
    return Dataset.from_list([{**row, "solved": i % 2 == 0} for i, row in enumerate(rows)])


class _SeenPrompts:
    """Rewards 1 for every completion of a solved prompt, else the completion length mod 7 over 7; records which
    prompts each training generation batch held."""

    __name__ = "seen_prompts"

    def __init__(self):
        self.trainer, self.batches = None, []

    def __call__(self, completions, solved, **kwargs):
        if self.trainer.model.training:  # the row column is added by the trainer, after the dataset check
            self.batches.append((list(solved), list(kwargs["policy_group_row"])))
        return [1.0 if s else (len(c[0]["content"]) % 7) / 7 for c, s in zip(completions, solved, strict=True)]


def _train(tmp_path, model_dir, **settings):
    reward = _SeenPrompts()
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=8, per_device_train_batch_size=16), **settings)
    trainer = GRPOTrainer(model_dir, [reward], args, _half_solved())
    reward.trainer = trainer
    trainer.train()
    return trainer, reward


def test_solved_prompts_are_skipped_once_seen_and_batches_keep_trls_contract(tmp_path, tiny_model_dir):
    """16 prompts, half of them solved; 4 prompts x 4 completions a step for 8 steps. Once a solved prompt has been
    seen, it comes back with probability 0.5^z at most: later batches hold fewer solved prompts than the 50% a
    uniform draw gives, and every logged figure says so."""
    trainer, reward = _train(tmp_path, tiny_model_dir, prompt_skip=True, prompt_skip_target=0.0)
    assert len(reward.batches) == 8
    for _, rows in reward.batches:
        assert len(rows) == 16
        assert all(len(set(rows[i : i + 4])) == 1 for i in range(0, 16, 4))  # each prompt 4 times in a row
    later = [s for solved, _ in reward.batches[4:] for s in solved[::4]]
    assert sum(later) / len(later) < 0.5
    logs = [row for row in trainer.state.log_history if "prompt_skip/skipped" in row]
    assert logs[-1]["prompt_skip/skipped"] == trainer.features["prompt_skip"].skip.skipped > 0
    assert logs[-1]["prompt_skip/tokens_saved"] > 0
    shares = [row["prompt_skip/uninformative_frac"] for row in logs]
    assert all(0.0 <= share <= 1.0 for share in shares)
    # the target 0: the base falls by 0.02 from 0.5 after each batch with an uninformative group, else stays
    assert logs[-1]["prompt_skip/keep_base"] == pytest.approx(0.5 - 0.02 * sum(share > 0 for share in shares))
    assert sum(share > 0 for share in shares) >= 4
    history = trainer.features["prompt_skip"].skip.history
    solved_rows = torch.arange(16)[::2]
    seen = history.last_step[solved_rows] != NEVER
    assert (history.streak[solved_rows][seen] > 0).all() and (history.value[solved_rows][seen] == 1.0).all()


def test_with_policy_groups_the_filter_acts_inside_each_groups_draw(tmp_path, tiny_model_dir):
    """Two groups, solved and not, drawn alike (weights held at 1): the solved group's prompts are skipped once seen,
    its draws going on to its next prompts."""
    trainer, reward = _train(tmp_path, tiny_model_dir, prompt_skip=True, prompt_skip_target=0.0,
                             policy_group_column="solved", policy_group_min_size=2,
                             policy_group_sampling="weighted", policy_group_weight_rule="progress",
                             policy_group_update_steps=1000, remove_unused_columns=False)  # fmt: skip
    assert trainer.features["prompt_skip"].skip.skipped > 0
    assert sorted(trainer.policy_groups.names) == ["False", "True"]
    solved = [row["prompt_skip/True/uninformative_frac"] for row in trainer.state.log_history
              if "prompt_skip/True/uninformative_frac" in row]  # fmt: skip
    assert solved and all(share == 1.0 for share in solved)  # every completion of a solved prompt gets 1


def test_a_config_asks_for_indexed_rows(tmp_path):
    with pytest.raises(ValueError, match=r"prompt_skip=True needs remove_unused_columns=False \(got True\)"):
        GRPOConfig(**small_grpo_kwargs(tmp_path), prompt_skip=True, remove_unused_columns=True)
    with pytest.raises(ValueError, match=r"need prompt_skip_min_keep \(0.5\) <= prompt_skip_initial_keep \(0.3\)"):
        GRPOConfig(**small_grpo_kwargs(tmp_path), prompt_skip_min_keep=0.5, prompt_skip_initial_keep=0.3)


SKIPPING = {"prompt_skip": True, "prompt_skip_target": 0.0, "half_solved": True, "num_problems": 12}


def test_resume_is_exact(tmp_path, tiny_model_dir):
    assert check_resume(SKIPPING, tmp_path, tiny_model_dir) == 0.0


@two_process("prompt_skip", {**SKIPPING, "per_device_train_batch_size": 6}, resume_step=3)
def test_two_processes_resume_exactly(two_process_runs):
    """Both ranks take their slices of one global draw and keep one history: the resumed 2-process run is the
    uninterrupted one on every rank. Scenario "prompt_skip" of the suite's shared two-process job
    (tests/two_process.py)."""
    assert resume_diff(two_process_runs["prompt_skip"], resume_step=3) == 0.0
