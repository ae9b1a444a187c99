"""Issues #17 and #29: prompt skipping. Pure functions against hand-computed values, the draws' and the layout's
contracts, and tiny end-to-end runs: solved prompts are skipped once seen and not replaced (or, with refilling,
replaced), a step that skips only uninformative generation groups makes stock TRL's update for every loss type and
layout (one process and two), metrics are logged, evaluation is never skipped, and a resumed run continues exactly."""

import math
import re

import pytest
import torch
from datasets import Dataset, IterableDataset
from torch.testing import assert_close

from tests.conftest import small_grpo_kwargs
from tests.resume_check import check_resume, run_phase
from tests.two_process import full_records, resume_diff, two_process
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows
from trl_grpo_ext.policy_groups.state import PolicyGroupState
from trl_grpo_ext.prompt_skip import normalizer
from trl_grpo_ext.prompt_skip.history import NEVER, STREAK_MAX, PromptHistory, uninformative
from trl_grpo_ext.prompt_skip.normalizer import normalizer_correction
from trl_grpo_ext.prompt_skip.skipping import (
    adapt_base,
    beta_moment,
    count_evidence,
    failing_group_keep,
    first_visit_keep,
    history_keep,
    hopeless_base,
    keep_for_layout,
    keep_probability,
    layout_quantum,
    posterior_keep,
    prompt_keep_probability,
    skip_streak,
    solved_share,
    static_cache_quantum,
    streak_keep,
)
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
    assert history.informed.tolist() == [False, True, False, False]
    history.observe(torch.tensor([0]), torch.tensor([[0.0, 1.0]]), torch.tensor([[8.0, 8.0]]), step=7)
    assert history.streak[0] == 0 and history.informed[0]  # an informative visit ends the streak
    history.streak[3] = STREAK_MAX
    history.observe(torch.tensor([3]), torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]]), step=8)
    assert history.streak[3] == STREAK_MAX  # saturates


def test_with_counts_the_history_adds_each_prompts_completions_at_and_below_the_best_reward():
    history = PromptHistory(3, counts=True)
    rewards = torch.tensor([[1.0, 1.0, 0.0, NAN], [0.5, 0.5, 0.5, 0.5]])
    history.observe(torch.tensor([0, 1]), rewards, torch.ones(2, 4), step=1, best=1.0)
    history.observe(torch.tensor([0]), torch.tensor([[1.0, 1.0, 1.0, 1.0]]), torch.ones(1, 4), step=2, best=1.0)
    assert history.successes.tolist() == [6, 0, 0]  # unscored completions count neither way
    assert history.failures.tolist() == [1, 4, 0]
    history.observe(torch.tensor([2]), torch.ones(1, 4), torch.ones(1, 4), step=3)  # no best reward yet: all failing
    assert history.failures[2] == 4 and history.successes[2] == 0
    history.failures[1] = 2**15 - 2
    history.observe(torch.tensor([1]), torch.zeros(1, 4), torch.ones(1, 4), step=4, best=1.0)
    assert history.failures[1] == 2**15 - 1  # saturates
    restored = PromptHistory(3, counts=True)
    restored.load_state_dict(history.state_dict())
    assert restored.successes.tolist() == [6, 0, 0] and restored.failures[1] == 2**15 - 1
    without = PromptHistory(3)  # the streak rule: no counts kept, none read from a checkpoint that has them
    without.load_state_dict(history.state_dict())
    assert without.successes.numel() == 0 and without.nbytes() == 3 * 12
    assert history.nbytes() == 3 * 16


def _beta_function_moment(a: float, b: float, order: int) -> float:
    """E[p^order] for p ~ Beta(a, b) from the Beta function: B(a + order, b) / B(a, b)."""
    log_beta = lambda x, y: math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)  # noqa: E731
    return math.exp(log_beta(a + order, b) - log_beta(a, b))


def test_the_posterior_keep_is_the_chance_the_next_generation_group_disagrees():
    successes, failures = torch.tensor([9, 0, 0, 0, 4, 16, 50]), torch.tensor([3, 4, 8, 12, 0, 0, 50])
    keep = posterior_keep(successes, failures, 4, floor=0.05)
    for i, (s, f) in enumerate(zip(successes.tolist(), failures.tolist(), strict=True)):
        repeat = _beta_function_moment(1 + s, 1 + f, 4) + _beta_function_moment(1 + f, 1 + s, 4)
        assert keep[i].item() == pytest.approx(max(1 - repeat, 0.05), rel=1e-12)
    assert keep[:4].tolist() == pytest.approx([0.685, 0.437, 0.306, 0.235], abs=1e-3)  # the docstring's figures
    assert keep[6] > 0.85  # a prompt solved half the time gives signal on 7 of 8 groups of 4
    # one agreeing visit of a new prompt: 1 - (1 + G) / (1 + 2G) - E[(1 - p)^G], under 1/2 and nearer it as G grows
    one_visit = [posterior_keep(torch.tensor([g]), torch.tensor([0]), g, floor=0.0).item() for g in (4, 16)]
    assert one_visit == pytest.approx([0.437, 0.485], abs=1e-3)
    assert_close(beta_moment(torch.tensor([2.0]), torch.tensor([3.0]), 0), torch.tensor([1.0], dtype=torch.float64))
    assert posterior_keep(torch.tensor([200]), torch.tensor([0]), 4, floor=0.05).item() == 0.05  # the floor


def test_with_counts_a_prompt_is_kept_by_its_posterior_once_its_last_visit_agreed():
    history = PromptHistory(3, counts=True)
    history.observe(torch.tensor([0, 1]), torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0] * 4]), torch.ones(2, 4), 1, 1.0)
    history.observe(torch.tensor([0]), torch.ones(1, 4), torch.ones(1, 4), step=2, best=1.0)
    settings = {"base": 0.05, "hopeless": None, "best": 1.0, "grace": 3, "floor": 0.05, "generations": 4}
    keep = history_keep(history, torch.arange(3), **settings)
    expected = posterior_keep(torch.tensor([7, 0]), torch.tensor([1, 4]), 4, 0.05)
    assert_close(keep, torch.cat([expected, torch.ones(1, dtype=torch.float64)]))  # row 2 never seen: kept
    history.observe(torch.tensor([0]), torch.tensor([[1.0, 0.0, 0.0, 0.0]]), torch.ones(1, 4), step=3, best=1.0)
    assert history_keep(history, torch.tensor([0]), **settings).item() == 1.0  # informative last visit: kept
    streak = PromptHistory(3)  # the streak rule on the same visits: the failing grace keeps row 1, base row 0
    streak.observe(torch.tensor([0, 1]), torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0] * 4]), torch.ones(2, 4), 1)
    streak.observe(torch.tensor([0]), torch.ones(1, 4), torch.ones(1, 4), step=2)
    assert history_keep(streak, torch.arange(3), **settings).tolist() == [0.05, 1.0, 1.0]


def test_a_million_prompts_fit_in_the_issues_64_megabytes():
    history = PromptHistory(1_000_000)
    assert history.nbytes() == 12 * 1_000_000  # int32 step + int8 streak + float32 value + int16 length + bool
    state = PromptSkipState(1_000_000, base=0.5, seed=0)
    state.draw_rows(1, keep=None)  # a pass begun: its order holds the other 999,999 rows
    assert state.nbytes() == 12 * 1_000_000 + 8 * 999_999 <= 64 * 2**20


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


def test_no_prompt_counts_as_solved_until_a_lower_reward_was_seen():
    """A run whose completions all scored alike so far (all 0 at the start of a hard task) cannot tell solved prompts
    from failing ones: every uninformative prompt gets the failing grace until a different reward is seen."""
    state = PromptSkipState(4, base=0.5, seed=0)
    state.best_reward = state.worst_reward = 0.0
    assert state.solved_at() == float("inf")
    assert skip_streak(torch.tensor([2]), torch.tensor([0.0]), state.solved_at(), grace=3).tolist() == [0]
    state.best_reward = 1.0
    assert state.solved_at() == 1.0
    assert skip_streak(torch.tensor([2]), torch.tensor([1.0]), state.solved_at(), grace=3).tolist() == [2]


def test_a_never_informative_prompts_base_is_measured_from_how_often_such_prompts_turned_informative():
    # no such visit seen: the prior alone, at the reference rate: 1
    assert hopeless_base(torch.zeros(4, dtype=torch.float64), prior=8.0) == 1.0
    # 100 failing visits, none informative; 100 after an informative one, 99 informative: r_a = 100/102,
    # r_f = 8 r_a / 108, base 8/108
    hopeless = torch.tensor([100.0, 0.0, 100.0, 99.0], dtype=torch.float64)
    assert hopeless_base(hopeless, prior=8.0) == pytest.approx(8 / 108)
    # failing prompts as informative as the others (learnable, not yet learnt): never below 1 by much, capped at 1
    learnable = torch.tensor([100.0, 60.0, 100.0, 58.0], dtype=torch.float64)
    r_a = 59 / 102
    assert hopeless_base(learnable, prior=8.0) == pytest.approx(min((60 + 8 * r_a) / 108 / r_a, 1.0))
    assert hopeless_base(torch.tensor([100.0, 30.0, 100.0, 60.0], dtype=torch.float64), 8.0) == pytest.approx(
        (30 + 8 * 61 / 102) / 108 / (61 / 102)
    )


def test_evidence_counts_each_kind_of_visit_and_forgets_geometrically():
    failing = torch.tensor([True, True, False, False, False])
    after_informative = torch.tensor([False, False, True, True, False])  # the last: never seen
    informative = torch.tensor([True, False, True, False, True])
    evidence = count_evidence(torch.zeros(4, dtype=torch.float64), failing, after_informative, informative)
    assert evidence.tolist() == [2.0, 1.0, 2.0, 1.0]
    again = count_evidence(evidence, failing, after_informative, informative, decay=0.5)
    assert again.tolist() == [3.0, 1.5, 3.0, 1.5]


def test_a_failing_prompt_never_informative_keeps_with_the_measured_base_when_hopeless_ones_are_skipped():
    streak, value = torch.tensor([2, 2, 3, 2, 4, 0]), torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, NAN])
    informed = torch.tensor([True, False, False, True, True, True])
    keep = streak_keep(streak, value, informed=informed, best=1.0, base=0.5, hopeless=0.2, grace=3, floor=0.001)
    # solved: 0.5^2; never informative: 0.2^2, 0.2^3; once informative: 0.5^max(2-3, 0), 0.5^(4-3); informative: 1
    assert_close(keep, torch.tensor([0.25, 0.04, 0.008, 1.0, 0.5, 1.0], dtype=torch.float64))
    off = streak_keep(streak, value, informed=informed, best=1.0, base=0.5, hopeless=None, grace=3, floor=0.001)
    # off: every failing prompt gets the grace: 0.5^0, 0.5^0, 0.5^1 for the never-informative ones too
    assert_close(off, torch.tensor([0.25, 1.0, 1.0, 1.0, 0.5, 1.0], dtype=torch.float64))


def test_the_base_moves_towards_the_target_within_its_bounds():
    assert adapt_base(0.5, observed=0.4, target=0.25, step=0.02, low=0.05) == pytest.approx(0.48)  # skip more
    assert adapt_base(0.5, observed=0.1, target=0.25, step=0.02, low=0.05) == pytest.approx(0.52)  # skip less
    assert adapt_base(0.06, observed=0.9, target=0.25, step=0.02, low=0.05) == 0.05
    assert adapt_base(0.99, observed=0.0, target=0.25, step=0.02, low=0.05) == 1.0
    assert adapt_base(0.5, observed=NAN, target=0.25, step=0.02, low=0.05) == 0.5


def test_the_layout_quantum_splits_evenly_over_processes_and_micro_batches():
    assert layout_quantum(num_generations=4, num_processes=1, steps_per_generation=1) == 1
    assert layout_quantum(4, 2, 1) == 1  # 4 completions: 2 per process
    assert layout_quantum(4, 2, 4) == 2  # 8 slots: 2 prompts give 8 completions, 1 per micro-batch and process
    assert layout_quantum(3, 2, 2) == 4  # gcd(3, 4) = 1: 4 prompts, 12 completions, 3 per micro-batch and process
    assert layout_quantum(8, 1, 3) == 3


def test_skipped_prompts_come_back_for_the_layout_the_likeliest_first():
    kept = torch.tensor([True, False, False, True, False, False])
    probability = torch.tensor([1.0, 0.1, 0.3, 1.0, 0.3, 0.2], dtype=torch.float64)
    # 2 kept, quantum 4: the two skipped with the highest keep probability (0.3, 0.3: draw order) come back
    assert keep_for_layout(kept, probability, quantum=4).tolist() == [True, False, True, True, True, False]
    assert keep_for_layout(kept, probability, quantum=2).tolist() == kept.tolist()  # already a multiple
    nothing = torch.zeros(6, dtype=torch.bool)
    assert keep_for_layout(nothing, probability, quantum=3).tolist() == [True, False, True, True, False, False]


def test_a_first_visit_is_predicted_from_the_groups_solved_share():
    assignment = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2])
    seen = torch.tensor([True, True, True, False, True, True, True, True, False])
    solved = torch.tensor([True, True, False, False, False, False, False, True, False])
    share = solved_share(assignment, solved, seen, groups=3, least=3)
    # group 0: 2 of 3 seen solved; group 1: 1 of 4; group 2: none seen (< 3): NaN
    assert_close(share[:2], torch.tensor([2 / 3, 1 / 4], dtype=torch.float64))
    assert torch.isnan(share[2])
    keep = first_visit_keep(torch.tensor([2 / 3, 1 / 4, NAN, 1.0]), floor=0.05)
    assert_close(keep, torch.tensor([1 / 3, 3 / 4, 1.0, 0.05], dtype=torch.float64))


def test_a_policy_group_never_informative_is_skipped_on_the_whole_groups_evidence():
    assignment = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    visits = torch.tensor([3, 2, 0, 1, 0, 0, 0])  # group 0: 5 uninformative failing visits; group 1: 1
    informed = torch.tensor([False, False, False, False, True, False, False])  # group 1 had an informative one
    keep = failing_group_keep(assignment, visits, informed=informed, groups=3, floor=0.05, least=0.1)
    assert_close(keep, torch.tensor([0.9**5, 1.0, 1.0], dtype=torch.float64))  # group 2: nothing seen yet
    many = failing_group_keep(
        assignment, torch.tensor([40, 0, 0, 0, 0, 0, 0]), informed=informed, groups=3, floor=0.05, least=0.1
    )
    assert many[0] == 0.05  # 0.9^40 = 0.015: the floor


def test_the_groups_evidence_caps_first_visits_and_never_informative_prompts_only():
    """Rows 0-3 in policy group 0, never informative: 0 and 1 failed (2 and 1 visits), 2 never generated for, 3
    solved. Rows 4-7 in group 1, one of which (5) was informative. The best reward is 1."""
    history = PromptHistory(8)
    history.observe(
        torch.tensor([0, 1, 3, 4, 5]),
        torch.tensor([[0.0] * 4, [0.0] * 4, [1.0] * 4, [0.0] * 4, [0.0, 1.0, 0.0, 0.0]]),
        torch.ones(5, 4),
        step=0,
    )
    history.observe(torch.tensor([0]), torch.zeros(1, 4), torch.ones(1, 4), step=1)  # fmt: skip
    groups = (torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), 2)
    settings = dict(base=0.5, hopeless=None, best=1.0, grace=3, floor=0.05, groups=groups, first_visit=False)
    without = prompt_keep_probability(history, torch.arange(8), **settings)
    assert_close(without, torch.tensor([1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64))
    keep = prompt_keep_probability(history, torch.arange(8), **settings, group_informative=0.1)
    # group 0's 3 failing visits (the solved row's do not count): 0.9^3 for its failing and unseen rows
    assert_close(keep, torch.tensor([0.729, 0.729, 0.729, 0.5, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64))
    # the same visits without row 5's informative one: no prompt of the run was informative yet, so no group is
    # tested (each would be throttled alike while the policy does not move)
    alike = PromptHistory(8)
    alike.observe(torch.tensor([0, 1, 3, 4]), torch.tensor([[0.0] * 4, [0.0] * 4, [1.0] * 4, [0.0] * 4]),
                  torch.ones(4, 4), step=0)  # fmt: skip
    alike.observe(torch.tensor([0]), torch.zeros(1, 4), torch.ones(1, 4), step=1)
    untested = prompt_keep_probability(alike, torch.arange(8), **settings, group_informative=0.1)
    assert_close(untested, without)


def test_the_normalizer_counts_the_skipped_completions_per_loss_type():
    # 3 of 4 prompts kept, 90 tokens generated, 30 estimated for the skipped prompt
    assert normalizer_correction("dapo", 3, 4, 90.0, 30.0) == (30.0, 1.0)  # num_items_in_batch 90 -> 120
    assert normalizer_correction("grpo", 3, 4, 90.0, 30.0) == (0.0, 0.75)  # mean over 3/4 of the completions
    assert normalizer_correction("dr_grpo", 3, 4, 90.0, 30.0) == (0.0, 0.75)
    assert normalizer_correction("bnpo", 3, 4, 90.0, 30.0) == (0.0, 0.75)  # 90 / (90 + 30)
    assert normalizer_correction("bnpo", 4, 4, 0.0, 0.0) == (0.0, 1.0)
    assert set(normalizer.NORMALIZERS) >= {"dapo", "grpo", "bnpo", "dr_grpo"}


def test_a_loss_type_whose_normalizer_is_unknown_is_refused_at_config_time(tmp_path, monkeypatch):
    monkeypatch.delitem(normalizer.NORMALIZERS, "bnpo")  # as a loss type of a newer TRL would be
    kwargs = small_grpo_kwargs(tmp_path, remove_unused_columns=False, loss_type="bnpo")
    refused = r"prompt_skip=True cannot count the skipped completions in the normalizer of loss_type='bnpo' \(it can "
    with pytest.raises(ValueError, match=refused):
        GRPOConfig(**kwargs, prompt_skip=True)
    GRPOConfig(**kwargs, prompt_skip=True, prompt_skip_refill=True)  # refilling keeps the batch full: no correction
    with pytest.raises(ValueError, match="cannot count"):
        normalizer_correction("bnpo", 1, 2, 1.0, 1.0)


def test_with_a_static_cache_the_batch_takes_two_sizes_at_most():
    assert static_cache_quantum(drawn=16, quantum=1) == 8  # 8 or 16 prompts: two caches, two compiled graphs
    assert static_cache_quantum(drawn=6, quantum=2) == 6  # half (3) is no multiple of 2: no skipping at all
    assert static_cache_quantum(drawn=1, quantum=1) == 1


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"scale_rewards": "batch"}, "scale_rewards='batch': the advantages are divided by the whole batch's reward std"),
     ({"multi_objective_aggregation": "normalize_then_sum"},
      "multi_objective_aggregation='normalize_then_sum': the advantages are normalized over the whole batch"),
     ({"loss_type": "grpo", "entropy_coef": 0.01},
      "loss_type='grpo' and TRL's entropy bonus (entropy_coef=0.01, use_adaptive_entropy=False)")],
    ids=["batch scaling", "normalize_then_sum", "grpo + entropy bonus"],
)  # fmt: skip
def test_settings_where_an_uninformative_group_moves_the_others_are_refused(tmp_path, settings, message):
    """Without refilling, skipping must leave the other generation groups' advantages and the loss's extra terms as
    they are; these settings do not, and the config says which and why (refilling takes any of them)."""
    kwargs = small_grpo_kwargs(tmp_path, remove_unused_columns=False, **settings)
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        GRPOConfig(**kwargs, prompt_skip=True)
    assert str(refused.value).endswith("set prompt_skip_refill=True, which keeps the batch full")
    GRPOConfig(**kwargs, prompt_skip=True, prompt_skip_refill=True)
    if "entropy_coef" in settings:  # dapo's normalizer takes the skipped tokens: the bonus is left as it is
        GRPOConfig(**{**kwargs, "loss_type": "dapo"}, prompt_skip=True)


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
    args = GRPOConfig(output_dir="unused", use_cpu=True, bf16=False)  # no batch seen: groups drawn by their size
    plain, filtered = PolicyGroupState(["a", "b"], assignment, 0), PolicyGroupState(["a", "b"], assignment, 0)
    rows = plain.draw_rows(6, args)
    kept = filtered.draw_rows(6, args, keep=lambda row: row not in (0, 4))  # one refused prompt in each group
    assert assignment[rows].tolist() == assignment[kept].tolist()  # the groups' share is the policy groups' choice
    assert not set(kept.tolist()) & {0, 4}


def _half_solved(n: int = 16, solved_every: int = 2) -> Dataset:
    rows = to_grpo_rows(synthetic_gsm8k(n, seed=4))
    return Dataset.from_list([{**row, "solved": i % solved_every == 0} for i, row in enumerate(rows)])


class _SeenPrompts:
    """Rewards 1 for every completion of a solved prompt, else the completion length mod 7 over 7; records which
    prompts each training generation batch held, and the size of each evaluation batch."""

    __name__ = "seen_prompts"

    def __init__(self):
        self.trainer, self.batches, self.eval_sizes = None, [], []

    def __call__(self, completions, solved, **kwargs):
        if self.trainer.model.training:  # the row column is added by the trainer, after the dataset check
            self.batches.append((list(solved), list(kwargs["policy_group_row"])))
        else:
            self.eval_sizes.append(len(completions))
        return [1.0 if s else (len(c[0]["content"]) % 7) / 7 for c, s in zip(completions, solved, strict=True)]


def _train(tmp_path, model_dir, dataset=None, eval_dataset=None, **settings):
    reward = _SeenPrompts()
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, **{"max_steps": 8, "per_device_train_batch_size": 16, **settings}))
    trainer = GRPOTrainer(model_dir, [reward], args, dataset or _half_solved(), eval_dataset=eval_dataset)
    reward.trainer = trainer
    trainer.train()
    return trainer, reward


def _skip_logs(trainer) -> list[dict]:
    return [row for row in trainer.state.log_history if "prompt_skip/skipped" in row]


def test_solved_prompts_are_skipped_once_seen_and_not_replaced(tmp_path, tiny_model_dir):
    """16 prompts, half of them solved; 4 prompts x 4 completions drawn a step for 8 steps, TRL's sampler drawing.
    Once a solved prompt has been seen it is generated for with probability 0.5^z at most, and nothing takes its
    place: batches shrink, every prompt still 4 times in a row, the counts add up, evaluation is not skipped."""
    evaluation = _half_solved(4)
    trainer, reward = _train(tmp_path, tiny_model_dir, eval_dataset=evaluation, prompt_skip=True,
                             prompt_skip_target=0.0, eval_strategy="steps", eval_steps=4,
                             per_device_eval_batch_size=16)  # fmt: skip
    assert len(reward.batches) == 8
    sizes = [len(rows) for _, rows in reward.batches]
    assert all(size % 4 == 0 and 4 <= size <= 16 for size in sizes) and min(sizes) < 16
    for _, rows in reward.batches:
        assert all(len(set(rows[i : i + 4])) == 1 for i in range(0, len(rows), 4))  # each prompt 4 times in a row
    later = [s for solved, _ in reward.batches[4:] for s in solved[::4]]
    assert sum(later) / len(later) < 0.5
    logs = _skip_logs(trainer)
    skipped = [row["prompt_skip/skipped_in_batch"] for row in logs]
    assert [16 - size for size in sizes] == [4 * n for n in skipped]  # each skip a whole generation group
    assert logs[-1]["prompt_skip/skipped"] == sum(skipped) == trainer.features["prompt_skip"].skip.skipped > 0
    generated = [row["prompt_skip/completion_tokens"] for row in logs]
    assert logs[-1]["prompt_skip/completion_tokens_total"] == pytest.approx(sum(generated))
    assert logs[-1]["prompt_skip/tokens_saved"] > 0
    assert reward.eval_sizes and all(size == 16 for size in reward.eval_sizes)  # 4 prompts (2 solved) x 4
    history = trainer.features["prompt_skip"].skip.history
    solved_rows = torch.arange(16)[::2]
    seen = history.last_step[solved_rows] != NEVER
    assert (history.streak[solved_rows][seen] > 0).all() and (history.value[solved_rows][seen] == 1.0).all()


class _FailingPrompts:
    """Rewards a prompt's completions by its `kind`: `hopeless` 0 always; `late` 0 at its first visit and, like
    `learnable`, the completion length mod 7 over 7 (informative) after. Records each batch's kinds."""

    __name__ = "failing_prompts"

    def __init__(self):
        self.batches, self.visits = [], {}

    def __call__(self, prompts, completions, kind, **kwargs):
        self.batches.append(list(kind[::4]))
        keys = [str(prompt) for prompt in prompts]
        for key in keys[::4]:
            self.visits[key] = self.visits.get(key, 0) + 1
        return [0.0 if k == "hopeless" or (k == "late" and self.visits[key] == 1) else (len(c[0]["content"]) % 7) / 7
                for c, k, key in zip(completions, kind, keys, strict=True)]  # fmt: skip


@pytest.mark.parametrize("failing_kind", ["hopeless", "late"])
def test_never_informative_prompts_are_skipped_only_where_they_stay_failing(tmp_path, tiny_model_dir, failing_kind):
    """`prompt_skip_hopeless=True`; 16 prompts, half `learnable` and half failing at first (all completions 0,
    below the best reward seen): `hopeless` ones never turn informative, so their measured base falls and later
    batches hold fewer of them; `late` ones turn informative at their second visit, so the measured base stays high
    and later batches hold about as many of them as of the learnable ones."""
    rows = to_grpo_rows(synthetic_gsm8k(16, seed=4))
    dataset = Dataset.from_list(
        [{**row, "kind": failing_kind if i % 2 else "learnable"} for i, row in enumerate(rows)]
    )
    reward = _FailingPrompts()
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=16, per_device_train_batch_size=16, prompt_skip=True,
                                          prompt_skip_hopeless=True, remove_unused_columns=False))  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, [reward], args, dataset)
    trainer.train()
    bases = [row["prompt_skip/hopeless_keep_base"] for row in _skip_logs(trainer)]
    late = [k for kinds in reward.batches[8:] for k in kinds]
    if failing_kind == "hopeless":
        assert bases[0] == 1.0 and bases[-1] < 0.6
        assert late.count("hopeless") < 0.75 * late.count("learnable")  # 8 of 16 drawn without skipping: as many
    else:
        assert min(bases) > 0.7
        assert late.count("late") >= 0.8 * late.count("learnable")


@pytest.mark.parametrize("informative", [0.1, 0.0])
def test_a_hopeless_policy_group_is_skipped_from_its_groups_evidence(tmp_path, tiny_model_dir, informative):
    """64 prompts, half `hopeless` (all completions 0) and half `learnable`, one policy group each, 32 drawn in 8
    steps: a single pass, so no prompt's own history can predict it. With `prompt_skip_group_informative` the
    hopeless group's evidence skips its later first visits; with 0, nothing is skipped (no prompt is solved)."""
    rows = to_grpo_rows(synthetic_gsm8k(64, seed=4))
    dataset = Dataset.from_list([{**row, "kind": "hopeless" if i % 2 else "learnable"} for i, row in enumerate(rows)])
    reward = _FailingPrompts()
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=8, per_device_train_batch_size=16, prompt_skip=True,
                                          prompt_skip_group_informative=informative, policy_group_column="kind",
                                          policy_group_sampling="uniform", remove_unused_columns=False))  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, [reward], args, dataset)
    trainer.train()
    skipped = trainer.features["prompt_skip"].skip.skipped
    late = [k for kinds in reward.batches[4:] for k in kinds]
    if not informative:
        assert skipped == 0
        return
    assert skipped > 0 and late.count("hopeless") < 0.5 * late.count("learnable")


def test_the_groups_evidence_without_policy_groups_or_with_refilling_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"prompt_skip_group_informative \(0.1\) acts without refilling only"):
        GRPOConfig(**small_grpo_kwargs(tmp_path), prompt_skip=True, remove_unused_columns=False,
                   prompt_skip_refill=True, prompt_skip_group_informative=0.1)  # fmt: skip
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), prompt_skip=True, remove_unused_columns=False,
                      prompt_skip_group_informative=0.1)  # fmt: skip
    with pytest.raises(
        ValueError, match=r"^prompt_skip_group_informative=0.1 needs policy groups: set policy_group_c"
    ):
        GRPOTrainer("no/such-model", [_SeenPrompts()], args, _half_solved())  # refused before the model loads


def test_a_batch_that_would_skip_everything_keeps_one_prompt(tmp_path, tiny_model_dir):
    """Every prompt solved (reward 1 for every completion: with no lower reward seen, no prompt counts as solved, so
    the failing grace is set to 0), every keep probability at its floor: each batch after the first pass still
    generates for the layout's quantum (one prompt here) and trains without error."""
    trainer, reward = _train(tmp_path, tiny_model_dir, dataset=_half_solved(8, solved_every=1), prompt_skip=True,
                             prompt_skip_initial_keep=1e-6, prompt_skip_min_keep=1e-6,
                             prompt_skip_failing_grace=0)  # fmt: skip
    sizes = [len(rows) for _, rows in reward.batches]
    assert sizes[:2] == [16, 16] and sizes[2:] == [4] * 6  # 8 prompts seen in 2 steps, then the floor
    assert all(math.isfinite(row["loss"]) for row in trainer.state.log_history if "loss" in row)


def test_with_refilling_batches_keep_their_size_and_trls_contract(tmp_path, tiny_model_dir):
    """`prompt_skip_refill=True`: a skipped prompt is replaced by the next one of the draw, so every batch holds 4
    prompts, later ones fewer solved than the 50% a uniform draw gives."""
    trainer, reward = _train(tmp_path, tiny_model_dir, prompt_skip=True, prompt_skip_target=0.0,
                             prompt_skip_refill=True)  # fmt: skip
    assert len(reward.batches) == 8
    for _, rows in reward.batches:
        assert len(rows) == 16
        assert all(len(set(rows[i : i + 4])) == 1 for i in range(0, 16, 4))  # each prompt 4 times in a row
    later = [s for solved, _ in reward.batches[4:] for s in solved[::4]]
    assert sum(later) / len(later) < 0.5
    logs = _skip_logs(trainer)
    assert logs[-1]["prompt_skip/skipped"] == trainer.features["prompt_skip"].skip.skipped > 0
    assert logs[-1]["prompt_skip/tokens_saved"] == 0  # each skipped prompt was replaced: nothing saved
    shares = [row["prompt_skip/uninformative_frac"] for row in logs]
    assert all(0.0 <= share <= 1.0 for share in shares)
    # the target 0: the base falls by 0.02 from 0.5 after each batch with an uninformative group, else stays
    assert logs[-1]["prompt_skip/keep_base"] == pytest.approx(0.5 - 0.02 * sum(share > 0 for share in shares))
    assert sum(share > 0 for share in shares) >= 4


def test_with_refilling_and_policy_groups_the_filter_acts_inside_each_groups_draw(tmp_path, tiny_model_dir):
    """Two groups, solved and not, drawn alike (the whole draw spread evenly, `policy_group_sampling_floor=1`): the
    solved group's prompts are skipped once seen, its draws going on to its next prompts."""
    trainer, reward = _train(tmp_path, tiny_model_dir, prompt_skip=True, prompt_skip_target=0.0,
                             prompt_skip_refill=True, policy_group_column="solved", policy_group_sampling_floor=1.0,
                             remove_unused_columns=False)  # fmt: skip
    assert trainer.features["prompt_skip"].skip.skipped > 0
    assert sorted(trainer.policy_groups.names) == ["False", "True"]
    solved = [row["prompt_skip/True/uninformative_frac"] for row in trainer.state.log_history
              if "prompt_skip/True/uninformative_frac" in row]  # fmt: skip
    assert solved and all(share == 1.0 for share in solved)  # every completion of a solved prompt gets 1


@pytest.mark.parametrize("first_visit", [True, False])
def test_in_a_single_pass_the_policy_group_predicts_first_visits(tmp_path, tiny_model_dir, first_visit):
    """64 prompts in two policy groups (solved or not), 32 drawn in 8 steps: no prompt comes back, so every skip is a
    first visit's, predicted from its group's solved share once 8 of the group were seen. Off: nothing is skipped."""
    trainer, reward = _train(tmp_path, tiny_model_dir, dataset=_half_solved(64), prompt_skip=True,
                             prompt_skip_first_visit=first_visit, policy_group_column="solved",
                             policy_group_sampling="uniform")  # fmt: skip
    drawn = [row for _, rows in reward.batches for row in rows[::4]]
    assert len(set(drawn)) == len(drawn)  # a single pass: every prompt generated for at most once
    skipped = trainer.features["prompt_skip"].skip.skipped
    if not first_visit:
        assert skipped == 0
        return
    assert skipped > 0
    later = [s for solved, _ in reward.batches[4:] for s in solved[::4]]
    assert sum(later) / len(later) < 0.5  # the solved group's first visits skipped


def test_with_generation_compile_batches_hold_half_or_all_prompts(tmp_path, tiny_model_dir):
    """The static cache is built, and the decode step compiled, once per batch size: with skipping a batch holds 2
    or 4 of the 4 drawn prompts, and two caches serve the whole run (compiled with the CPU tests' backend,
    tests/cpu_compile.py)."""
    trainer, reward = _train(tmp_path, tiny_model_dir, dataset=_half_solved(8), prompt_skip=True, max_steps=4,
                             prompt_skip_initial_keep=1e-6, prompt_skip_min_keep=1e-6,
                             generation_compile=True)  # fmt: skip
    sizes = [len(rows) for _, rows in reward.batches]
    assert set(sizes) == {8, 16}  # some batches skip (the solved prompts' later visits), none below half
    assert trainer.fast_generation.caches.built == 2


# Completions scripted from (prompt, copy, step) (tests/resume_check.ScriptedCompletions), so that a run generating
# for fewer prompts gets the same completions for those it keeps. 8 problems, every other one solved; 4 prompts drawn
# a step. With keep probabilities at 1e-6 a solved prompt is skipped from its second visit on; a learnable one never
# (its generation groups are informative, or fail within the grace of 3 visits).
UPDATE = {"scripted": True, "half_solved": True, "num_problems": 8, "max_steps": 6, "save_strategy": "no",
          "per_device_train_batch_size": 16, "first_params": True}  # fmt: skip
SKIP_SOLVED = {"prompt_skip": True, "prompt_skip_initial_keep": 1e-6, "prompt_skip_min_keep": 1e-6}


def _same_update(stock: dict, skipping: dict, atol: float = 1e-6) -> None:
    """The loss and gradient norm at every step, and the final parameters, of the two runs' records agree."""
    rows = [[row for row in record["logs"] if "grad_norm" in row] for record in (stock, skipping)]
    assert len(rows[0]) == len(rows[1]) > 0
    for a, b in zip(*rows, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=atol) and a["grad_norm"] == pytest.approx(b["grad_norm"])
    moved = max((stock["params"][n] - stock["first_params"][n]).abs().max().item() for n in stock["params"])
    assert moved > 1e-3  # the learnable prompts moved the weights
    for name in stock["params"]:
        assert_close(skipping["params"][name], stock["params"][name], atol=atol, rtol=0)


@pytest.mark.parametrize(
    "layout",
    [{}, {"loss_type": "grpo"}, {"loss_type": "bnpo"}, {"loss_type": "dr_grpo"},
     {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2},
     {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "loss_type": "grpo"},
     {"num_iterations": 2, "max_steps": 8}],
    ids=["dapo", "grpo", "bnpo", "dr_grpo", "grad_accum=2", "grpo,grad_accum=2", "num_iterations=2"],
)  # fmt: skip
def test_skipping_only_uninformative_groups_makes_stock_trls_update(tmp_path, tiny_model_dir, layout):
    """A step that does not generate the solved prompts (every completion reward 1: advantage 0) makes the update of
    one that does, trl_grpo_ext's with default settings (stock TRL's, test_equivalence), for each loss type's
    normalizer and with the generation batch split into micro-batches or reused."""
    config = {**UPDATE, **layout}
    stock = run_phase(config, tiny_model_dir, str(tmp_path / "stock"))
    skipping = run_phase({**config, **SKIP_SOLVED}, tiny_model_dir, str(tmp_path / "skip"))
    skipped = [row["prompt_skip/skipped_in_batch"] for row in skipping["logs"] if "prompt_skip/skipped" in row]
    assert sum(skipped) >= 4  # the solved prompts' later visits (2 steps draw all 8 problems once)
    _same_update(stock, skipping)


SKIP_2P = {**UPDATE, "per_device_train_batch_size": 8}


@two_process("prompt_skip_update_stock", SKIP_2P)
@two_process("prompt_skip_update", {**SKIP_2P, **SKIP_SOLVED})
def test_on_two_processes_skipping_only_uninformative_groups_makes_stock_trls_update(two_process_runs):
    """As above on two processes, which decide alike on the gathered draw and each generate for the same number of
    prompts. Scenarios "prompt_skip_update_stock" and "prompt_skip_update" of the suite's shared two-process job
    (tests/two_process.py)."""
    stock = full_records(two_process_runs["prompt_skip_update_stock"])
    skipping = full_records(two_process_runs["prompt_skip_update"])
    for rank in (0, 1):
        logs = skipping[rank]["logs"]
        assert sum(row["prompt_skip/skipped_in_batch"] for row in logs if "prompt_skip/skipped" in row) >= 4
        _same_update(stock[rank], skipping[rank])
    assert_close(stock[0]["params"]["model.norm.weight"], stock[1]["params"]["model.norm.weight"])


def test_the_posterior_rule_skips_solved_prompts_by_their_completions(tmp_path, tiny_model_dir):
    """`prompt_skip_rule: posterior` on 16 prompts, half solved (all completions 1.0) and half informative: a solved
    prompt seen once is kept with 0.44, so later batches hold fewer solved prompts; every completion is counted, at
    the best reward (1.0) or below it; the informative ones are never skipped."""
    trainer, reward = _train(tmp_path, tiny_model_dir, prompt_skip=True, prompt_skip_rule="posterior")
    later = [s for solved, _ in reward.batches[4:] for s in solved[::4]]
    assert sum(later) / len(later) < 0.5
    history = trainer.features["prompt_skip"].skip.history
    visits = torch.zeros(16, dtype=torch.long)
    for _, rows in reward.batches:
        visits[torch.tensor(rows[::4])] += 1
    solved = torch.arange(16) % 2 == 0
    assert history.successes[solved].tolist() == (4 * visits[solved]).tolist()
    assert (history.successes[~solved] == 0).all()
    assert history.failures[~solved].tolist() == (4 * visits[~solved]).tolist()
    assert _skip_logs(trainer)[-1]["prompt_skip/skipped"] > 0
    assert visits[~solved].tolist() == [2] * 8  # TRL's sampler draws each twice in 8 steps; none was skipped


def test_a_config_asks_for_indexed_rows(tmp_path):
    with pytest.raises(ValueError, match=r"prompt_skip=True needs remove_unused_columns=False \(got True\)"):
        GRPOConfig(**small_grpo_kwargs(tmp_path), prompt_skip=True, remove_unused_columns=True)
    with pytest.raises(ValueError, match=r"need prompt_skip_min_keep \(0.5\) <= prompt_skip_initial_keep \(0.3\)"):
        GRPOConfig(**small_grpo_kwargs(tmp_path), prompt_skip_min_keep=0.5, prompt_skip_initial_keep=0.3)
    with pytest.raises(ValueError, match=r"prompt_skip_rule must be one of .*streak.*posterior.*, got 'beta'"):
        GRPOConfig(**small_grpo_kwargs(tmp_path), prompt_skip_rule="beta")
    with pytest.raises(ValueError, match=r"prompt_skip_hopeless=True is a rule of prompt_skip_rule='streak' \(got "):
        GRPOConfig(**small_grpo_kwargs(tmp_path), prompt_skip=True, prompt_skip_hopeless=True,
                   prompt_skip_rule="posterior", remove_unused_columns=False)  # fmt: skip


SKIPPING = {"prompt_skip": True, "prompt_skip_target": 0.0, "half_solved": True, "num_problems": 12}


def test_resume_is_exact(tmp_path, tiny_model_dir):
    assert check_resume(SKIPPING, tmp_path, tiny_model_dir) == 0.0


def test_resume_with_the_posterior_rule_is_exact(tmp_path, tiny_model_dir):
    assert check_resume({**SKIPPING, "prompt_skip_rule": "posterior"}, tmp_path, tiny_model_dir) == 0.0


def test_resume_with_refilling_is_exact(tmp_path, tiny_model_dir):
    assert check_resume({**SKIPPING, "prompt_skip_refill": True}, tmp_path, tiny_model_dir) == 0.0


@two_process("prompt_skip", {**SKIPPING, "per_device_train_batch_size": 6}, resume_step=3)
def test_two_processes_resume_exactly(two_process_runs):
    """Both ranks take their slices of one global draw and keep one history: the resumed 2-process run is the
    uninterrupted one on every rank. Scenario "prompt_skip" of the suite's shared two-process job
    (tests/two_process.py)."""
    assert resume_diff(two_process_runs["prompt_skip"], resume_step=3) == 0.0


@pytest.mark.parametrize(
    ("settings", "feature"),
    [
        ({"prompt_skip": True}, "prompt_skip"),
        ({"policy_group_column": "task"}, "policy_group_column"),
        ({"policy_group_features": "tfidf"}, "policy_group_features"),
        ({}, "policy_group_fn"),
        ({"prompt_skip": True, "policy_group_column": "task"}, "policy_group_column"),
    ],
)
@pytest.mark.parametrize("source", ["to_iterable_dataset", "from_generator"])
def test_an_iterable_dataset_is_refused_before_the_model_loads(tmp_path, settings, feature, source):
    """Issue #32.4: every setting that keeps statistics per row refuses an IterableDataset (with known columns, or
    from a generator: none known) in one line naming the setting and the fix, before the model loads (a model id that
    does not exist would fail the load)."""
    rows = _half_solved(4).to_list()
    dataset = (Dataset.from_list(rows).to_iterable_dataset() if source == "to_iterable_dataset"
               else IterableDataset.from_generator(lambda: iter(rows)))  # fmt: skip
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), remove_unused_columns=False, **settings)
    fn = {"policy_group_fn": lambda row: row["task"]} if feature == "policy_group_fn" else {}
    with pytest.raises(ValueError) as error:
        GRPOTrainer("no-such/model-would-load", [_SeenPrompts()], args, dataset, **fn)
    assert str(error.value) == (
        f"{feature} keeps statistics per dataset row, so it needs a map-style datasets.Dataset as train_dataset, "
        "got IterableDataset: build one with Dataset.from_generator(...) or Dataset.from_list(...), or switch "
        f"{feature} off"
    )


def _reads_the_row(completions, policy_group_row, **kwargs) -> list[float]:
    """A reward function that declares the row index column (no default): 1.0 for even rows."""
    _reads_the_row.rows.extend(policy_group_row)
    return [float(row % 2 == 0) for row in policy_group_row]


@pytest.mark.parametrize("settings", [{"prompt_skip": True}, {"policy_group_column": "task"}])
def test_a_reward_function_may_name_the_row_column(tmp_path, tiny_model_dir, settings):
    """Issue #32.6: the docs say reward functions receive `policy_group_row` while policy grouping or prompt skipping
    is on; one that names it as a parameter trains (before: refused at init, the column check ran before the column
    was added) and gets the dataset rows the prompts came from."""
    _reads_the_row.rows = []
    dataset = _half_solved(8)
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2), remove_unused_columns=False, **settings)
    GRPOTrainer(tiny_model_dir, [_reads_the_row], args, dataset).train()
    rows = _reads_the_row.rows
    assert len(rows) == 2 * 8 and set(rows) <= set(range(len(dataset)))
    assert all(rows[i : i + 4] == [rows[i]] * 4 for i in range(0, len(rows), 4))  # one row per generation group


def test_the_row_column_is_named_as_missing_where_it_is_not_added(tmp_path):
    dataset = _half_solved(4)
    with pytest.raises(ValueError, match=r"needs the dataset column 'policy_group_row', which is added only while "
                       "policy grouping or prompt_skip is on"):  # fmt: skip
        GRPOTrainer("no-such/model-would-load", [_reads_the_row], GRPOConfig(**small_grpo_kwargs(tmp_path)), dataset)
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), prompt_skip=True, remove_unused_columns=False)
    with pytest.raises(ValueError, match=r"which is added to the training dataset only .* give the parameter a "
                       r"default \(policy_group_row=None\)"):  # fmt: skip
        GRPOTrainer("no-such/model-would-load", [_reads_the_row], args, dataset, eval_dataset=dataset)
