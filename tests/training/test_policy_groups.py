"""Policy grouping: formulas against hand-computed values, sampling distribution and contract, state, training."""

import math

import pytest
import torch
from datasets import Dataset
from torch.testing import assert_close

from tests.conftest import small_grpo_kwargs
from tests.resume_check import check_resume
from tests.two_process import full_records, resume_diff, two_process
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows
from trl_grpo_ext.policy_groups.advantages import loss_weights, policy_group_advantages
from trl_grpo_ext.policy_groups.sampling import group_uncertainty, informative_share, sampling_probabilities
from trl_grpo_ext.policy_groups.stages import StageSchedule
from trl_grpo_ext.policy_groups.state import CHECKPOINT_FIELDS, PolicyGroupState
from trl_grpo_ext.policy_groups.statistics import ema_update, group_means, progress_z, prompt_statistics
from trl_grpo_ext.policy_groups.weights import (
    PROGRESS_Z,
    deficit_weights,
    learnability_weights,
    normalize_weights,
    progress_weights,
    smooth_weights,
)

D = torch.float64


def test_prompt_statistics():
    # prompt 0: rewards 1, 0 -> mean 0.5, unbiased std sqrt(0.5); prompt 1: 1, 1 -> mean 1, std 0 (zero std);
    # prompt 2: NaN, 3 -> one valid reward: mean 3, std 0
    stats = prompt_statistics(torch.tensor([1.0, 0.0, 1.0, 1.0, math.nan, 3.0], dtype=D), num_generations=2)
    assert_close(stats["mean"], torch.tensor([0.5, 1.0, 3.0], dtype=D))
    assert_close(stats["std"], torch.tensor([math.sqrt(0.5), 0.0, 0.0], dtype=D))
    assert stats["zero_std"].tolist() == [False, True, True]


def test_group_means_and_ema():
    # group 0 gets 1 and 3 -> 2; group 1 gets 5 (the NaN is left out); group 2 gets nothing
    means, counts = group_means(torch.tensor([1.0, 5.0, 3.0, math.nan], dtype=D), torch.tensor([0, 1, 0, 1]), 3)
    assert_close(means, torch.tensor([2.0, 5.0, 0.0], dtype=D))
    assert counts.tolist() == [2.0, 1.0, 0.0]
    # EMA with decay 0.9: group 0 had 1.0 -> 0.9*1 + 0.1*2 = 1.1; group 1 first value -> 5; group 2 unseen -> 7 stays
    old, has = torch.tensor([1.0, 0.0, 7.0], dtype=D), torch.tensor([True, False, True])
    assert_close(ema_update(old, means, counts > 0, has, 0.9), torch.tensor([1.1, 5.0, 7.0], dtype=D))


def test_progress_weights_by_hand():
    # weights 1,1,1; reward changes 0.3, 0.0, 0.0 -> mean 0.1 -> ΔR = 0.2, -0.1, -0.1; eta 0.5:
    # 1.1, 0.95, 0.95 (sum 3.0, mean 1 already; inside [0.2, 5])
    w = progress_weights(torch.ones(3, dtype=D), torch.tensor([0.3, 0.0, 0.0], dtype=D), eta=0.5, w_min=0.2, w_max=5.0,
                            active=torch.ones(3, dtype=torch.bool))  # fmt: skip
    assert_close(w, torch.tensor([1.1, 0.95, 0.95], dtype=D))


def test_deficit_weights_by_hand():
    # rewards 0.2, 0.8 -> mean 0.5 -> factors 1 + 1*(0.3), 1 + 1*(-0.3) = 1.3, 0.7 (mean 1)
    w = deficit_weights(torch.ones(2, dtype=D), torch.tensor([0.2, 0.8], dtype=D), eta=1.0, w_min=0.2, w_max=5.0,
                           active=torch.ones(2, dtype=torch.bool))  # fmt: skip
    assert_close(w, torch.tensor([1.3, 0.7], dtype=D))


def test_normalize_weights_clips_and_keeps_mean_one():
    # 10, 1, 1 with max 2: clip -> 2, 1, 1 -> mean 4/3 -> rescale 1.5, 0.75, 0.75 (inside bounds); group 3 inactive
    w = normalize_weights(torch.tensor([10.0, 1.0, 1.0, 3.0], dtype=D), 0.5, 2.0,
                             torch.tensor([True, True, True, False]))  # fmt: skip
    assert_close(w, torch.tensor([1.5, 0.75, 0.75, 0.0], dtype=D))


def test_sampling_probabilities_with_floor():
    # weights 1,1,1,1 x uncertainty 0.25, 0, 0.25, anything (group 3 has no prompts) -> q = 0.5, 0, 0.5, 0;
    # floor 0.3 over 3 available groups: 0.7 q + 0.1 = 0.45, 0.1, 0.45, 0 (every available group >= 0.3/3)
    p = sampling_probabilities(torch.ones(4, dtype=D), torch.tensor([0.25, 0.0, 0.25, 9.0], dtype=D), 0.3,
                                  torch.tensor([True, True, True, False]))  # fmt: skip
    assert_close(p, torch.tensor([0.45, 0.1, 0.45, 0.0], dtype=D))
    # the floor holds at the default 0.05 too: one group takes all the score, the others get 0.05/4 each
    p = sampling_probabilities(torch.ones(4, dtype=D), torch.tensor([1.0, 0, 0, 0], dtype=D), 0.05,
                                  torch.ones(4, dtype=torch.bool))  # fmt: skip
    assert_close(p, torch.tensor([0.95 + 0.0125, 0.0125, 0.0125, 0.0125], dtype=D))
    assert_close(group_uncertainty(torch.tensor([0.5, 0.9], dtype=D), None, binary=True),
                 torch.tensor([0.25, 0.09], dtype=D))  # fmt: skip
    # Laplace: success 0 over 8 completions -> (0 + 1) / (8 + 2) = 0.1 -> 0.09; over 98 -> 0.01 -> 0.0099
    assert_close(group_uncertainty(torch.zeros(2, dtype=D), None, True, torch.tensor([8.0, 98.0], dtype=D)),
                 torch.tensor([0.09, 0.0099], dtype=D))  # fmt: skip
    # non-binary rewards: the within-prompt std as is
    assert_close(group_uncertainty(None, torch.tensor([0.3], dtype=D), False), torch.tensor([0.3], dtype=D))


def test_policy_group_baseline_by_hand():
    # group 0: rewards 1, 0, 1 -> mean 2/3; group 1: 0, 0 -> mean 0
    rewards, ids = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 1, 1])
    assert_close(policy_group_advantages(rewards, ids, 2, "none"), torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0, 0.0]))
    # "group" scaling: group 0 std (unbiased) of 1,0,1 = sqrt(1/3); group 1 std 0 -> divided by 1e-4, still 0
    expected = torch.tensor([1 / 3, -2 / 3, 1 / 3, 0, 0]) / torch.tensor([math.sqrt(1 / 3) + 1e-4] * 3 + [1e-4] * 2)
    assert_close(policy_group_advantages(rewards, ids, 2, "group"), expected)
    # "batch": TRL's batch std of the rewards. 0,1,0,1,9,10,9,10: mean 5, squared deviations 164, /7 -> std 4.8403;
    # group means 0.5 and 9.5 -> centred +-0.5 -> +-0.5 / (4.8403 + 1e-4)
    rewards = torch.tensor([0.0, 1, 0, 1, 9, 10, 9, 10])
    std = math.sqrt(164 / 7)
    expected = torch.tensor([-0.5, 0.5, -0.5, 0.5, -0.5, 0.5, -0.5, 0.5]) / (std + 1e-4)
    assert_close(policy_group_advantages(rewards, torch.tensor([0] * 4 + [1] * 4), 2, "batch"), expected)


def test_policy_group_baseline_leaves_unscored_completions_at_zero_and_out_of_the_statistics():
    """Issue #13.3: a completion no reward function scored (NaN) gets advantage exactly 0, as TRL gives it, and its
    NaN enters neither its policy group's mean nor its std: the scored ones get what they would get alone."""
    nan = math.nan
    rewards, ids = torch.tensor([1.0, nan, 0.0, 1.0, nan, 0.0]), torch.tensor([0, 0, 0, 0, 1, 1])
    alone = policy_group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 1]), 2, "group")
    for scale in ("none", "group", "batch"):
        advantages = policy_group_advantages(rewards, ids, 2, scale)
        assert advantages[1].item() == 0.0 and advantages[4].item() == 0.0
        assert torch.isfinite(advantages).all()
    # group 0's scored rewards 1, 0, 1: mean 2/3, std sqrt(1/3), as without the NaN; group 1's single 0 -> 0
    assert_close(policy_group_advantages(rewards, ids, 2, "group")[[0, 2, 3, 5]], alone)


def test_loss_weights_have_mean_one():
    # weights 2 and 0.5; completions in groups 0, 0, 1, 1 -> 2, 2, .5, .5 -> mean 1.25 -> 1.6, 1.6, 0.4, 0.4
    w = loss_weights(torch.tensor([2.0, 0.5], dtype=D), torch.tensor([0, 0, 1, 1]))
    assert_close(w, torch.tensor([1.6, 1.6, 0.4, 0.4], dtype=D))


class Args:
    policy_group_sampling = "weighted"
    policy_group_sampling_floor = 0.0
    policy_group_update_steps = 1
    policy_group_weight_rule = "progress"
    policy_group_eta = 1.0
    policy_group_weight_min = 0.1
    policy_group_weight_max = 10.0
    policy_group_weight_smoothing = 1.0
    policy_group_deficit_z = 0.0


def test_learnability_formulas():
    # z = |0.6 - 0.2| / sqrt(0.24 * (0.02 + 1/50)) = 0.4 / sqrt(0.0096) = 4.0825
    z = progress_z(*(torch.tensor([v], dtype=D) for v in (0.6, 0.2, 0.24, 0.02, 50.0)))
    assert_close(z, torch.tensor([0.4 / math.sqrt(0.0096)], dtype=D))
    # deficits 1, .5, 0, .5 (+0.05) -> 1.05, .55, .05, .55; group 1 looks like noise: x0.2 -> .11; mean .44
    w = learnability_weights(torch.tensor([0.0, 0.5, 1.0, 0.5], dtype=D), torch.tensor([False, True, False, False]),
                                w_min=0.05, w_max=5.0, active=torch.ones(4, dtype=torch.bool))  # fmt: skip
    assert_close(w, torch.tensor([1.05, 0.11, 0.05, 0.55], dtype=D) / 0.44)
    # all rewards equal: every deficit is 1, weights stay 1
    w = learnability_weights(torch.full((3,), 0.3, dtype=D), torch.zeros(3, dtype=torch.bool), w_min=0.05, w_max=5.0,
                                active=torch.ones(3, dtype=torch.bool))  # fmt: skip
    assert_close(w, torch.ones(3, dtype=D))
    # 6 of 8 prompts with zero std -> f = (0.25*8 + 1) / 10 = 0.3 -> h = 0.3 / 0.35; unseen -> f = 1/2
    h = informative_share(torch.tensor([0.75, 0.0], dtype=D), torch.tensor([8.0, 0.0], dtype=D))
    assert_close(h, torch.tensor([0.3 / 0.35, 0.5 / 0.55], dtype=D))


class LearnabilityArgs(Args):
    policy_group_sampling = "learnability"
    policy_group_weight_rule = "learnability"
    policy_group_progress_halflife = 8.0
    policy_group_weight_min = 0.05
    policy_group_weight_max = 5.0


def test_progress_statistics_start_recent_and_their_weights():
    # one group, one prompt, 4 completions a batch, half-life 8 completions
    state = PolicyGroupState(["a"], torch.tensor([0]), seed=0)
    lengths = torch.ones(4, dtype=torch.long)
    state.observe(
        torch.tensor([0]),
        torch.tensor([0.0, 0.0, 0.0, 1.0]),
        lengths,
        num_generations=4,
        decay=0.5,
        progress_halflife=8.0,
    )
    # first batch sets both: start 0.25 over 4 completions, recent 0.25 with sum of squared weights 4 * (1/4)^2
    assert_close(state.ema["progress_start"], torch.tensor([0.25], dtype=D))
    assert_close(state.ema["progress_recent"], torch.tensor([0.25], dtype=D))
    assert_close(state.progress_moments, torch.tensor([[0.25], [4.0]], dtype=D))
    state.observe(
        torch.tensor([0]),
        torch.tensor([1.0, 1.0, 0.0, 1.0]),
        lengths,
        num_generations=4,
        decay=0.5,
        progress_halflife=8.0,
    )
    # start: running mean of 8 completions (0.25 + 0.75) / 2 = 0.5; recent: k = 1 - 2^(-4/8) = 0.29289
    k = 1 - 0.5**0.5
    assert_close(state.ema["progress_start"], torch.tensor([0.5], dtype=D))
    assert_close(state.ema["progress_recent"], torch.tensor([0.25 + k * 0.5], dtype=D))
    assert_close(state.ema["progress_second"], torch.tensor([0.25 + k * 0.5], dtype=D))  # 0/1 rewards: r^2 = r
    assert_close(state.progress_moments, torch.tensor([[(1 - k) ** 2 * 0.25 + k**2 / 4], [8.0]], dtype=D))
    state.observe(torch.tensor([0]), torch.ones(4), lengths, num_generations=4, decay=0.5, progress_halflife=8.0)
    assert_close(state.ema["progress_start"], torch.tensor([0.5], dtype=D))  # frozen after 8 completions
    assert state.progress_moments[1].item() == 8.0


def test_smoothed_weights_move_part_of_the_way_to_the_rules():
    assert_close(smooth_weights(torch.tensor([2.0, 0.0], dtype=D), torch.tensor([0.0, 2.0], dtype=D), 0.25),
                 torch.tensor([1.5, 0.5], dtype=D))  # fmt: skip
    new = torch.tensor([0.5, 1.5], dtype=D)
    assert smooth_weights(torch.ones(2, dtype=D), new, 1.0) is new  # λ = 1: the rule's weights, untouched

    class Smoothed(LearnabilityArgs):
        policy_group_weight_smoothing = 0.5

    # a group that always fails and one that always succeeds: the rule gives the failing one all the deficit
    state = PolicyGroupState(["fails", "solved"], torch.arange(2), seed=0)
    rule = learnability_weights(
        torch.tensor([0.0, 1.0], dtype=D),
        torch.zeros(2, dtype=torch.bool),
        w_min=0.05,
        w_max=5.0,
        active=torch.ones(2, dtype=torch.bool),
    )
    expected = torch.ones(2, dtype=D)
    for step in range(3):
        state.observe(
            torch.arange(2),
            torch.tensor([0.0] * 4 + [1.0] * 4),
            torch.ones(8, dtype=torch.long),
            num_generations=4,
            decay=0.9,
        )
        state.maybe_update_weights(step, Smoothed())
        expected = 0.5 * expected + 0.5 * rule  # mean 1 already: renormalising leaves it
        assert_close(state.weights, expected)
    assert state.weights[0] < rule[0]  # after 3 updates, 7/8 of the way


def test_deficit_floor_keeps_groups_within_noise_near_equal():
    active = torch.ones(3, dtype=torch.bool)
    alike, noise_like = torch.tensor([0.50, 0.52, 0.51], dtype=D), torch.zeros(3, dtype=torch.bool)
    # over the range 0.02 alone: deficits 1, 0, 0.5 -> alpha 1.05, 0.05, 0.55 -> x 3 / 1.65
    assert_close(learnability_weights(alike, noise_like, w_min=0.05, w_max=5.0, active=active),
                 torch.tensor([1.05, 0.05, 0.55], dtype=D) * 3 / 1.65)  # fmt: skip
    # over the floor 0.1: deficits 1, 0.8, 0.9 -> alpha 1.05, 0.85, 0.95 -> x 3 / 2.85
    assert_close(learnability_weights(alike, noise_like, w_min=0.05, w_max=5.0, active=active, spread_floor=0.1),
                 torch.tensor([1.05, 0.85, 0.95], dtype=D) * 3 / 2.85)  # fmt: skip
    apart = torch.tensor([0.0, 1.0, 0.5], dtype=D)  # a spread above the floor: the rule unchanged
    assert_close(learnability_weights(apart, noise_like, w_min=0.05, w_max=5.0, active=active, spread_floor=0.1),
                 learnability_weights(apart, noise_like, w_min=0.05, w_max=5.0, active=active))  # fmt: skip


def test_deficit_floor_from_the_groups_standard_errors():
    """One batch of 4 completions per group, rewards 1 in 4 and 3 in 4 (half-life 8): each group's recent reward has
    Σw² = 4 · (1/4)² = 1/4 and variance max(0.25 − 0.25², Laplace's p(1 − p) = 1/3 · 2/3) = 2/9, so the
    difference's standard error is √(2 · 2/9 · 1/4) = 1/3 and z = 2 puts the floor at 2/3, above the 0.5 spread."""
    state = PolicyGroupState(["low", "high"], torch.arange(2), seed=0)
    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    state.observe(
        torch.arange(2), rewards, torch.ones(8, dtype=torch.long), num_generations=4, decay=0.9, progress_halflife=8.0
    )
    assert state.spread_standard_error(state.ema["reward"], torch.ones(2, dtype=torch.bool)) == pytest.approx(1 / 3)

    class Floored(LearnabilityArgs):
        policy_group_deficit_z = 2.0

    state.maybe_update_weights(1, Floored())
    # deficits 1 and 1 − 0.5 / (2/3) = 0.25 -> alpha 1.05, 0.30 -> x 2 / 1.35; without the floor 1.05, 0.05
    assert_close(state.weights, torch.tensor([1.05, 0.30], dtype=D) * 2 / 1.35)
    state.maybe_update_weights(2, LearnabilityArgs())
    assert_close(state.weights, torch.tensor([1.05, 0.05], dtype=D) * 2 / 1.1)


def test_learnability_tells_a_coin_flip_from_a_learnable_group():
    """A coin-flip group (completions always disagree, no progress) is scaled down; a group that learns, one that
    never succeeds and one not yet moving keep their deficit weight."""
    state = PolicyGroupState(["coin", "learns", "hopeless", "late"], torch.arange(4), seed=0)
    lengths = torch.ones(16, dtype=torch.long)
    for step in range(12):
        learns = [0.0, 0.0, 0.0, 0.0] if step < 3 else [1.0, 1.0, 1.0, 0.0]
        rewards = torch.tensor([0.0, 1.0, 0.0, 1.0, *learns, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0 * (step % 4 == 0)])
        state.observe(torch.arange(4), rewards, lengths, num_generations=4, decay=0.9, progress_halflife=8.0)
        state.maybe_update_weights(step, LearnabilityArgs())
    assert state.noise_like(LearnabilityArgs()).tolist() == [True, False, False, False]
    z = state._progress_z()
    assert z[0] < 1 and z[1] > PROGRESS_Z and z[3] < PROGRESS_Z, z
    reward = state.ema["reward"]
    expected = learnability_weights(reward, torch.tensor([True, False, False, False]), w_min=0.05, w_max=5.0,
                                       active=torch.ones(4, dtype=torch.bool))  # fmt: skip
    assert_close(state.weights, expected)
    # the coin (reward 0.5, deficit about 0.5) weighs less than the hopeless group's 1.05 / 0.2 times its own
    assert state.weights[0] < 0.2 * state.weights[2]


def test_learnability_sampling_is_size_times_weight_times_informative_share():
    state = PolicyGroupState(["big", "small"], torch.tensor([0, 0, 0, 1]), seed=0)
    # nothing seen: informative shares equal, so the draw is TRL's prompt-proportional one
    assert_close(state.probabilities(LearnabilityArgs()), torch.tensor([0.75, 0.25], dtype=D))
    # 8 prompts of "big", all solved: f = 1/10, h = 0.1 / 0.15; "small" unseen: h = 0.5 / 0.55
    state.has_ema["zero_std_frac"][0], state.ema["zero_std_frac"][0], state.prompts_seen[0] = True, 1.0, 8.0
    score = torch.tensor([0.75 * 0.1 / 0.15, 0.25 * 0.5 / 0.55], dtype=D)
    assert_close(state.probabilities(LearnabilityArgs()), score / score.sum())


def test_draws_follow_the_target_distribution():
    """Chi-square goodness of fit over 10,000 draws (3 degrees of freedom; 16.27 is the 0.1% critical value)."""
    assignment = torch.arange(400) % 4
    state = PolicyGroupState(["a", "b", "c", "d"], assignment, seed=3)
    state.weights = torch.tensor([0.4, 0.8, 1.2, 1.6], dtype=D)
    target = torch.tensor([0.1, 0.2, 0.3, 0.4])  # weights / 4 (floor 0, `weighted`)
    counts = torch.zeros(4)
    for _ in range(100):
        rows = state.draw_rows(100, Args())
        counts += torch.bincount(assignment[rows], minlength=4)
        state.generations += 1
    expected = target * 10_000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.27, (counts, expected)


def test_draws_are_seeded_and_cover_a_group_before_repeating():
    assignment = torch.tensor([0] * 6 + [1] * 6)
    state = PolicyGroupState(["a", "b"], assignment, seed=0)
    state.weights = torch.tensor([2.0, 0.0], dtype=D)  # all draws from group a
    first = state.draw_rows(6, Args())
    assert sorted(first.tolist()) == [0, 1, 2, 3, 4, 5]  # no prompt repeats before the group is used up
    again = PolicyGroupState(["a", "b"], assignment, seed=0)
    again.weights = state.weights
    assert again.draw_rows(6, Args()).tolist() == first.tolist()  # same seed, same draws


def test_observe_weights_and_state_round_trip():
    # 2 groups, 1 prompt each, 2 generations: group a rewards 1, 1; group b rewards 0, 1
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1]), seed=0)
    state.observe(
        torch.tensor([0, 1]),
        torch.tensor([1.0, 1.0, 0.0, 1.0]),
        torch.tensor([4, 6, 8, 2]),
        num_generations=2,
        decay=0.5,
    )
    assert_close(state.ema["reward"], torch.tensor([1.0, 0.5], dtype=D))
    assert_close(state.ema["zero_std_frac"], torch.tensor([1.0, 0.0], dtype=D))
    assert_close(state.ema["length"], torch.tensor([5.0, 5.0], dtype=D))
    assert state.binary and state.maybe_update_weights(1, Args())  # first window: no change yet -> weights 1
    assert_close(state.weights, torch.ones(2, dtype=D))
    # next batch: a 1,1 (EMA stays 1, change 0), b 1,1 (EMA 0.5*0.5 + 0.5*1 = 0.75, change 0.25)
    state.observe(
        torch.tensor([0, 1]),
        torch.tensor([1.0, 1.0, 1.0, 1.0]),
        torch.tensor([1, 1, 1, 1]),
        num_generations=2,
        decay=0.5,
    )
    state.maybe_update_weights(2, Args())
    # ΔR = 0 - 0.125, 0.25 - 0.125 -> factors 0.875, 1.125 (eta 1), mean 1
    assert_close(state.weights, torch.tensor([0.875, 1.125], dtype=D))
    copy = PolicyGroupState(["x"], torch.tensor([0]), seed=9)
    copy.load_state_dict(torch.load(_save(state.state_dict()), weights_only=True))
    assert copy.names == ["a", "b"] and torch.equal(copy.weights, state.weights)
    assert copy.metrics() == state.metrics()


def test_state_checkpoint_holds_its_schema_and_a_missing_field_loads_with_its_stated_default():
    # 2 groups (a: rows 0, 2; b: row 1), 2 generations: a's prompts 1,1 and 0,0; b's 0,1
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1, 0]), seed=0)
    state.observe(
        torch.tensor([0, 1, 2]),
        torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]),
        torch.ones(6),
        num_generations=2,
        decay=0.5,
    )
    state.refined = True
    saved = torch.load(_save(state.state_dict()), weights_only=True)
    assert tuple(saved) == CHECKPOINT_FIELDS  # exactly the schema, in its order
    assert saved["prompt_visits"].tolist() == [1, 1, 1] and saved["observed"].tolist() == [True, True]
    # a checkpoint from before `prompt_visits`, `observed` and `refined` existed, loaded into a state of other groups:
    # each takes its stated default for the checkpoint's 3 rows and 2 groups (never visited, unobserved, not refined)
    older = {key: value for key, value in saved.items() if key not in ("prompt_visits", "observed", "refined")}
    loaded = PolicyGroupState(["x"], torch.tensor([0]), seed=9)
    loaded.refined, loaded.prompt_visits = True, torch.tensor([7])  # what was there before must not survive
    loaded.load_state_dict(older)
    assert loaded.prompt_visits.tolist() == [0, 0, 0] and loaded.prompt_visits.dtype == torch.long
    assert loaded.observed.tolist() == [False, False] and loaded.refined is False
    assert loaded.names == ["a", "b"] and torch.equal(loaded.ema["reward"], state.ema["reward"])
    # (1 + 1 + 0 + 0) / 2 prompts = 0.5 for a (its EMA started at the first batch), 0.5 for b
    assert_close(loaded.ema["reward"], torch.tensor([0.5, 0.5], dtype=D))


def test_state_checkpoint_refuses_unknown_fields_missing_required_ones_and_unsaved_attributes():
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1]), seed=0)
    saved = state.state_dict()
    with pytest.raises(ValueError, match=r"PolicyGroupState checkpoint .* has unknown fields \['from_the_future'\]"):
        PolicyGroupState(["x"], torch.tensor([0]), seed=1).load_state_dict(saved | {"from_the_future": 1})
    with pytest.raises(ValueError, match=r"lacks \['assignment'\]"):
        PolicyGroupState(["x"], torch.tensor([0]), seed=1).load_state_dict({k: v for k, v in saved.items()
                                                                            if k != "assignment"})  # fmt: skip
    with pytest.raises(ValueError, match=r"StageSchedule checkpoint .* has unknown fields \['plateau'\]"):
        StageSchedule(warmup=False).load_state_dict(saved["stages"] | {"plateau": True})
    state.cache = torch.zeros(2)  # a new attribute is not saved implicitly: saving names it
    with pytest.raises(RuntimeError, match=r"PolicyGroupState has attributes outside .*\['cache'\]"):
        state.state_dict()


def test_stage_schedule_checkpoint_without_a_field_loads_its_stated_default():
    schedule = StageSchedule(warmup=True)
    schedule.fusion_at = 40
    saved = schedule.state_dict()
    assert list(saved) == ["stage", "since", "uniform_mix", "fusion_at", "rewards", "reward_stds", "events"]
    loaded = StageSchedule(warmup=False)
    loaded.fusion_at = 7
    loaded.load_state_dict({key: value for key, value in saved.items() if key != "fusion_at"})
    assert loaded.fusion_at is None and loaded.stage == "warmup" and loaded.uniform_mix == 1.0


def _save(obj):
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_regroup_children_inherit_parent_statistics_and_weight():
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 0, 1, 1]), seed=0)
    state.observe(
        torch.tensor([0, 2]), torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.ones(4), num_generations=2, decay=0.0
    )
    state.weights = torch.tensor([1.5, 0.5], dtype=D)
    state.regroup(["a/lo", "b", "a/hi"], torch.tensor([0, 2, 1, 1]), "split a")  # split a into rows 0 | 1
    assert_close(state.ema["reward"], torch.tensor([1.0, 0.0, 1.0], dtype=D))
    # weights 1.5, 0.5, 1.5 rescaled to mean 1: x 3/3.5
    assert_close(state.weights, torch.tensor([1.5, 0.5, 1.5], dtype=D) * 3 / 3.5)
    # a had seen 1 prompt over its 2 rows: each child took half; b keeps its 1
    assert_close(state.prompts_seen, torch.tensor([0.5, 1.0, 0.5], dtype=D))
    assert state.observed.tolist() == [False, True, False]  # children wait for a batch before any merge
    assert state.events == ["split a"]


def test_counts_stay_whole_draws_of_the_rows_a_group_holds_after_a_split_and_a_merge():
    """`policy_groups/<g>/count` counts draws per dataset row: a split child counts exactly its own rows' draws (the
    statistic `prompts_seen` is apportioned, 0.5 and 0.5 here; a logged count is never a fraction)."""
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 0, 1, 1]), seed=0)
    state.observe(
        torch.tensor([0, 2, 0]),
        torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
        torch.ones(6),
        num_generations=2,
        decay=0.0,
    )
    state.regroup(["a/lo", "b", "a/hi"], torch.tensor([0, 2, 1, 1]), "split a")  # row 0 was drawn twice, row 1 never
    counts = state.totals()
    assert [counts[f"policy_groups/{g}/count"] for g in ("a/lo", "a/hi", "b")] == [2.0, 0.0, 1.0]
    assert_close(state.prompts_seen, torch.tensor([1.0, 1.0, 1.0], dtype=D))  # a's 2 draws apportioned 1 | 1
    state.observe(torch.tensor([1]), torch.tensor([1.0, 0.0]), torch.ones(2), num_generations=2, decay=0.0)
    state.regroup(["a", "b"], torch.tensor([0, 0, 1, 1]), "merge a/lo, a/hi")
    counts = state.totals()
    assert [counts["policy_groups/a/count"], counts["policy_groups/b/count"]] == [3.0, 1.0]


def test_split_children_start_from_their_own_success_rates():
    # group a: rows 0-3 succeeded (1), rows 4-7 failed (0): its EMA reward is 0.5; the children start at 1 and 0
    state = PolicyGroupState(["a"], torch.zeros(8, dtype=torch.long), seed=0)
    state.observe(torch.arange(8), torch.tensor([1.0] * 8 + [0.0] * 8), torch.ones(16), num_generations=2, decay=0.0)
    state.regroup(["a/lo", "a/hi"], torch.tensor([1, 1, 1, 1, 0, 0, 0, 0]), "split a")
    assert_close(state.ema["reward"], torch.tensor([0.0, 1.0], dtype=D))


def _grouped_dataset(n=48):
    rows = to_grpo_rows(synthetic_gsm8k(n, seed=5))
    return Dataset.from_list(rows)


def task_reward(completions, task, **kwargs):
    """Learnable per task: length parity for addition, always 1 for multiplication (solved), 0 for the rest."""
    table = {"addition": lambda c: float(len(c) % 2), "multiplication": lambda c: 1.0}
    return [table.get(t, lambda c: 0.0)(c[0]["content"]) for c, t in zip(completions, task, strict=True)]


@pytest.mark.parametrize(
    "overrides",
    [
        {"policy_group_sampling": "uncertainty", "advantage_baseline": "policy_group"},
        {"policy_group_sampling": "weighted", "policy_group_weight_rule": "deficit"},
        {"policy_group_sampling": "uniform"},
    ],
    ids=["uncertainty+group-baseline", "weighted+deficit", "uniform"],
)
def test_end_to_end_logs_every_group(tiny_model_dir, tmp_path, overrides):
    args = GRPOConfig(
        **small_grpo_kwargs(tmp_path, max_steps=4, per_device_train_batch_size=12),
        policy_group_column="task", policy_group_update_steps=2, policy_group_min_size=4, **overrides,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=_grouped_dataset()
    )
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    for name in ("addition", "multiplication", "two-step"):
        assert all(f"policy_groups/{name}/weight" in row for row in rows)
        assert all(f"policy_groups/{name}/count" in row for row in rows)
    last = rows[-1]
    weights = [value for key, value in last.items() if key.startswith("policy_groups/") and key.endswith("/weight")]
    assert len(weights) == 5  # addition, multiplication, two-step, three-step, four-step
    low, high = args.policy_group_weight_min, args.policy_group_weight_max  # the defaults: 0.05, 2.0
    assert math.isclose(sum(weights) / 5, 1.0, rel_tol=1e-9) and all(low - 1e-12 <= w <= high + 1e-12 for w in weights)
    rewards = {k: v for k, v in last.items() if k.startswith("policy_groups/") and k.endswith("/reward")}
    assert len(rewards) >= 2 and all(0.0 <= v <= 1.0 for v in rewards.values())  # task_reward is 0 or 1
    assert all(0.0 <= v <= 1.0 for k, v in last.items() if k.endswith("/zero_std_frac"))
    assert 0.0 < last["policy_groups/addition/entropy"] <= math.log(512) + 1e-6  # nats per token, vocabulary 512


def test_missing_column_names_it_and_lists_columns(tiny_model_dir, tmp_path):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), policy_group_column="topic")
    with pytest.raises(ValueError, match=r"topic.*prompt.*answer"):
        GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=_grouped_dataset())


def test_callable_assignment_and_small_groups_merge(tiny_model_dir, tmp_path, caplog):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), policy_group_min_size=10)
    dataset = _grouped_dataset(24)
    trainer = GRPOTrainer(
        model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=dataset,
        policy_group_fn=lambda row: "first" if row["policy_group_row"] < 3 else "rest",
    )  # fmt: skip
    # "first" has 3 < 10 prompts, but merging it would leave fewer than min_policy_groups=2 groups: it stays
    assert trainer.policy_groups.names == ["first", "rest"] and not trainer.policy_groups.events
    args = GRPOConfig(
        **small_grpo_kwargs(tmp_path), policy_group_min_size=10, min_policy_groups=1, num_policy_groups=1
    )
    trainer = GRPOTrainer(
        model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=dataset,
        policy_group_fn=lambda row: "first" if row["policy_group_row"] < 3 else "rest",
    )  # fmt: skip
    assert trainer.policy_groups.names == ["rest+first"] and "'first' (3 prompts)" in trainer.policy_groups.events[0]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("policy_group_eta", -1.0, r"policy_group_eta must be a finite number in \(0, 10\], got -1.0"),
        ("policy_group_sampling", "greedy", "policy_group_sampling must be one of"),
        ("policy_group_weight_min", 1.5, "policy_group_weight_min"),
        ("num_policy_groups", 20, r"num_policy_groups \(20\) <= max_policy_groups \(8\)"),
        ("policy_group_update_steps", 0, "policy_group_update_steps must be an integer >= 1, got 0"),
        ("advantage_baseline", "batch", "advantage_baseline must be one of"),
        ("policy_group_refine_parts", 1, "policy_group_refine_parts must be an integer >= 2, got 1"),
    ],
)
def test_config_values_out_of_range_are_named(field, value, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**small_grpo_kwargs(tmp_path), **{field: value})


def test_grouping_needs_the_unused_columns(tmp_path):
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        GRPOConfig(**small_grpo_kwargs(tmp_path), policy_group_column="task", remove_unused_columns=True)


GROUPED = {
    "policy_group_column": "task",
    "policy_group_update_steps": 2,
    "policy_group_min_size": 2,
    "policy_group_sampling": "uncertainty",
    "advantage_baseline": "policy_group",
    "num_problems": 24,
}


def test_grouped_run_resumes_exactly(tmp_path, tiny_model_dir):
    assert check_resume(GROUPED, tmp_path, tiny_model_dir) == 0.0


GROUPED_2P = two_process("grouped", {**GROUPED, "per_device_train_batch_size": 6}, resume_step=3)


@GROUPED_2P
def test_two_processes_hold_identical_weights_and_see_different_prompts(two_process_runs):
    """The uninterrupted run of scenario "grouped" of the suite's shared two-process job (tests/two_process.py), the
    one `test_two_processes_grouped_run_resumes_exactly` resumes."""
    records = full_records(two_process_runs["grouped"])
    assert records[0]["prompts"] != records[1]["prompts"]  # each rank takes its own slice of the global draw
    keys = [k for k in records[0]["logs"][-2] if k.startswith("policy_groups/")]
    assert keys and all(row0.get(k) == row1.get(k) for row0, row1 in zip(records[0]["logs"], records[1]["logs"],
                                                                         strict=True) for k in keys)  # fmt: skip


def _trainer(tiny_model_dir, tmp_path, reward=task_reward, dataset=None, **overrides):
    settings = {"policy_group_column": "task", "policy_group_min_size": 2, "policy_group_update_steps": 1}
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2, per_device_train_batch_size=12), **{**settings,
                      **overrides})  # fmt: skip
    return GRPOTrainer(model=tiny_model_dir, reward_funcs=[reward], args=args,
                       train_dataset=dataset if dataset is not None else _grouped_dataset())  # fmt: skip


def test_loss_weights_have_mean_one_over_the_completions_the_loss_uses():
    # group weights 2, 1; completions of groups 0, 0, 1, 1; the second is unscored (or masked as truncated):
    # w = 2, 2, 1, 1, mean over the used ones (2 + 1 + 1) / 3 = 4/3 -> 1.5, 1.5, 0.75, 0.75
    # (over all four, as before issue #13, the mean 1.5 gave 4/3, 4/3, 2/3, 2/3: the used ones' mean was 8/9)
    weights, ids = torch.tensor([2.0, 1.0], dtype=D), torch.tensor([0, 0, 1, 1])
    used = torch.tensor([True, False, True, True])
    assert_close(loss_weights(weights, ids, used), torch.tensor([1.5, 1.5, 0.75, 0.75], dtype=D))
    assert_close(loss_weights(weights, ids), torch.tensor([4 / 3, 4 / 3, 2 / 3, 2 / 3], dtype=D))


def test_unscored_completions_keep_advantage_zero_and_counts_stay_counts(tiny_model_dir, tmp_path):
    """Issue #13.3 and 6a: with the policy-group baseline, loss weighting and the entropy `advantage` shift, a
    completion no reward function scored still reaches TRL's loss with advantage exactly 0; with logging_steps=2,
    `count` (prompts seen) and `nan_rewards` are the totals at the logged step, not the mean of two totals."""

    def sometimes_none(completions, task, **kwargs):
        lengths = [len(c[0]["content"]) for c in completions]
        return [None if t == "addition" else float(n % 3) for n, t in zip(lengths, task, strict=True)]

    seen = []

    class Spy(GRPOTrainer):
        def hook_get_per_token_logps_and_entropies(self, **kwargs):
            batch = self._loss_batch  # the copy TRL's loss reads, set while it computes the policy's log-probs
            result = super().hook_get_per_token_logps_and_entropies(**kwargs)
            if batch is not None and kwargs.get("compute_entropy"):  # after the features: advantages shifted
                seen.append((batch["advantages"].clone(), batch["completion_scored"]))
            return result

    rows = to_grpo_rows(synthetic_gsm8k(24, seed=5))
    for i, row in enumerate(rows):
        row["task"] = "addition" if i % 2 else "multiplication"
    settings = {"policy_group_column": "task", "policy_group_min_size": 2, "policy_group_update_steps": 1,
                "advantage_baseline": "policy_group", "policy_group_loss_weighting": True,
                "entropy_reg": "advantage", "entropy_advantage_coef": 0.05, "logging_steps": 2}  # fmt: skip
    args = GRPOConfig(**{**small_grpo_kwargs(tmp_path, max_steps=2, per_device_train_batch_size=12), **settings})
    trainer = Spy(tiny_model_dir, [sometimes_none], args, Dataset.from_list(rows))
    trainer.train()
    assert len(seen) == 2
    for advantages, scored in seen:
        assert (~scored).any()
        assert advantages[~scored].tolist() == [0.0] * int((~scored).sum())
    state = trainer.policy_groups
    (logged,) = [row for row in trainer.state.log_history if "loss" in row]
    counts = {name: logged[f"policy_groups/{name}/count"] for name in state.names}
    # 3 prompts a step, 2 steps: 6 prompts seen at step 2 (the mean of the totals 3 and 6 summed to 4.5 before)
    assert counts == {name: float(state.prompts_seen[i]) for i, name in enumerate(state.names)}
    assert sum(counts.values()) == 6.0 and all(c == int(c) for c in counts.values())
    assert logged["policy_groups/nan_rewards"] == float(state.nan_rewards) == 4.0 * counts["addition"]


def test_policy_group_entropy_is_trls_entropy_with_truncated_completions_masked(tiny_model_dir, tmp_path):
    """Issue #13.4: with `mask_truncated_completions` a truncated completion has no tokens in TRL's loss mask; the
    group's entropy must be TRL's `entropy` metric (a token mean over that mask), not diluted by 0s for the masked
    completions, and its mean length that of the completions left in (TRL's mean terminated length)."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=1), mask_truncated_completions=True,
                      remove_unused_columns=False)  # fmt: skip
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16, seed=0)))
    trainer = GRPOTrainer(tiny_model_dir, [_length_reward], args, dataset, policy_group_fn=lambda row: "all")
    trainer.train()
    masked = int((trainer._buffered_inputs[0]["completion_mask"].sum(1) == 0).sum())
    assert 0 < masked < 8  # 7 of the 8 completions reach max_completion_length on the random tiny model
    row = trainer.state.log_history[0]
    # one group, one micro-batch: the group's first entropy is TRL's (6.22 nats; 6.22 / 8 = 0.78 before the fix)
    assert float(trainer.policy_groups.ema["entropy"][0]) == pytest.approx(row["entropy"], rel=1e-6)
    assert float(trainer.policy_groups.ema["length"][0]) == pytest.approx(row["completions/mean_terminated_length"])


def _length_reward(completions, **kwargs) -> list[float]:
    return [(len(c[0]["content"]) % 5) / 5 for c in completions]


def test_evaluation_reports_unseen_groups_as_unassigned(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path)
    rows = to_grpo_rows(synthetic_gsm8k(8, seed=9))
    for i, row in enumerate(rows):
        row["task"] = "addition" if i < 4 else "geometry"  # no training prompt is about geometry
    metrics = trainer.evaluate(eval_dataset=Dataset.from_list(rows))
    assert "eval_policy_groups/addition/reward" in metrics and "eval_policy_groups/unassigned/reward" in metrics
    assert "eval_policy_groups/geometry/reward" not in metrics


def test_nan_rewards_are_left_out_and_counted(tiny_model_dir, tmp_path):
    def sometimes_none(completions, task, **kwargs):
        return [None if t == "addition" else 1.0 for t in task]

    rows = to_grpo_rows(synthetic_gsm8k(24, seed=5))
    for i, row in enumerate(rows):
        row["task"] = "addition" if i % 2 else "multiplication"
    trainer = _trainer(tiny_model_dir, tmp_path, reward=sometimes_none, dataset=Dataset.from_list(rows))
    trainer.train()
    last = [row for row in trainer.state.log_history if "loss" in row][-1]
    assert last["policy_groups/nan_rewards"] > 0
    assert "policy_groups/addition/reward" not in last  # every addition reward was None: no statistic yet
    assert last["policy_groups/multiplication/reward"] == 1.0


def test_kmeans_tfidf_assignment(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_column=None, policy_group_features="tfidf",
                       num_policy_groups=2)  # fmt: skip
    assert trainer.policy_groups.names == ["cluster0", "cluster1"]
    again = _trainer(tiny_model_dir, tmp_path / "again", policy_group_column=None, policy_group_features="tfidf",
                     num_policy_groups=2)  # fmt: skip
    assert torch.equal(trainer.policy_groups.assignment, again.policy_groups.assignment)  # deterministic


def test_refine_step_splits_groups_into_sub_clusters(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_refine_step=1, policy_group_refine_parts=2,
                       max_policy_groups=7)  # fmt: skip
    assert trainer.policy_groups.num_groups == 5
    trainer.train()
    assert trainer.policy_groups.num_groups == 7 and trainer.policy_groups.refined  # capped at max_policy_groups
    assert any("refined 5 groups into 7" in event for event in trainer.policy_groups.events)
    assert sum("/" in name for name in trainer.policy_groups.names) == 4  # two groups split in two


def _set_observed_statistics(state, reward: list[float], reward_std: list[float]) -> None:
    """Constructed EMA reward and reward std for every group, as if every group had been observed."""
    state.ema["reward"], state.ema["reward_std"] = torch.tensor(reward, dtype=D), torch.tensor(reward_std, dtype=D)
    for stat in ("reward", "reward_std"):
        state.has_ema[stat][:] = True
    state.observed[:] = True


def test_regroup_merges_groups_with_the_same_statistics(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_regroup_steps=1, policy_group_merge_tol=0.05)
    state = trainer.policy_groups  # addition, four-step, multiplication, three-step, two-step (sorted)
    _set_observed_statistics(state, [0.1, 0.5, 0.9, 0.52, 0.2], [0.3, 0.4, 0.1, 0.41, 0.3])
    trainer.features["policy_groups"].maybe_regroup(step=1)
    # four-step and three-step differ by 0.02 and 0.01 (< 0.05); addition and two-step by 0.1: only one merge
    assert state.names == ["addition", "four-step+three-step", "multiplication", "two-step"]
    assert_close(state.ema["reward"][1], torch.tensor(0.51, dtype=D))  # parents averaged (equal prompts seen)
    assert "four-step" in state.events[-1] and "three-step" in state.events[-1]


def test_drawn_generation_batch_keeps_trls_repeat_contract(tiny_model_dir, tmp_path):
    """Each drawn prompt fills `num_generations` consecutive slots; two processes' slices tile one global draw."""
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_sampling="weighted")
    # 12 completions on this process = 3 prompts x 4 generations
    batch = trainer.features["policy_groups"].draw_generation_batch(12)
    rows = [row["policy_group_row"] for row in batch]
    assert all(len(set(rows[i : i + 4])) == 1 for i in range(0, 12, 4))
    # a 2-process run draws 6 prompts at once; rank r takes completions [12r, 12r + 12) of the same draw
    state = trainer.policy_groups
    saved = {key: (value.clone() if torch.is_tensor(value) else value) for key, value in vars(state).items()}
    saved["queues"] = [q.clone() for q in state.queues]
    global_rows = state.draw_rows(6, trainer.args).repeat_interleave(4)
    vars(state).update(saved)
    trainer.accelerator.state.num_processes = 2  # what draw_generation_batch reads
    try:
        first = [row["policy_group_row"] for row in trainer.features["policy_groups"].draw_generation_batch(12)]
    finally:
        trainer.accelerator.state.num_processes = 1
    assert first == global_rows[:12].tolist()


@GROUPED_2P
def test_two_processes_grouped_run_resumes_exactly(two_process_runs):
    """Scenario "grouped" of the suite's shared two-process job (tests/two_process.py): resumed == uninterrupted."""
    assert resume_diff(two_process_runs["grouped"], resume_step=3) == 0.0


class _OneOfTwoProcesses:
    """Stands for the accelerator of process 1 of 2 (the rows given are already the gathered, global ones)."""

    process_index, num_processes = 1, 2

    @staticmethod
    def gather(tensor):
        return torch.cat([tensor, tensor])


def _apply_as_process_one(trainer, rewards, rows, advantages=None):
    trainer.features["policy_groups"]._batch = (rewards, rows)
    output = {"advantages": torch.zeros(2) if advantages is None else advantages, "completion_mask": torch.ones(2, 3)}
    trainer.accelerator, accelerator = _OneOfTwoProcesses(), trainer.accelerator
    try:
        trainer.features["policy_groups"].apply_policy_groups(output)
    finally:
        trainer.accelerator = accelerator
    return output


def test_advantages_get_the_policy_group_baseline_and_weights_for_this_process(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, advantage_baseline="policy_group", policy_group_update_steps=100)
    trainer.scale_rewards = "none"
    state = trainer.policy_groups  # groups: addition, four-step, multiplication, three-step, two-step
    first_row = {name: int((state.assignment == i).nonzero()[0]) for i, name in enumerate(state.names)}
    state.weights = torch.tensor([2.0, 1.0, 0.5, 1.0, 0.5], dtype=D)
    # 2 prompts x 2 generations over 2 processes; process 1 holds completions 2-3.
    # multiplication (rewards 1, 1) then addition (1, 0): baseline -> 0, 0, 0.5, -0.5; loss weights 0.5, 0.5, 2, 2
    # -> mean 1.25 -> 0.4, 0.4, 1.6, 1.6; process 1: (0.5, -0.5) x 1.6 = 0.8, -0.8
    rows = torch.tensor([first_row["multiplication"]] * 2 + [first_row["addition"]] * 2)
    output = _apply_as_process_one(trainer, torch.tensor([[1.0], [1.0], [1.0], [0.0]]), rows)
    assert_close(output["advantages"], torch.tensor([0.8, -0.8]))
    assert output["policy_group_ids"].tolist() == [0, 0]  # addition


def test_loss_weighting_alone_scales_trls_advantages(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_update_steps=100)
    state = trainer.policy_groups
    first_row = {name: int((state.assignment == i).nonzero()[0]) for i, name in enumerate(state.names)}
    state.weights = torch.tensor([2.0, 1.0, 0.5, 1.0, 0.5], dtype=D)
    rows = torch.tensor([first_row["multiplication"]] * 2 + [first_row["addition"]] * 2)
    rewards = torch.tensor([[1.0], [1.0], [1.0], [0.0]])
    output = _apply_as_process_one(trainer, rewards, rows, advantages=torch.tensor([0.3, -0.3]))
    assert_close(output["advantages"], torch.tensor([0.3 * 1.6, -0.3 * 1.6]))  # TRL's own advantages x weight


def test_refine_then_regroup_does_not_merge_the_children_back(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_refine_step=2, policy_group_regroup_steps=2,
                       max_policy_groups=8)  # fmt: skip
    state = trainer.policy_groups
    _set_observed_statistics(state, [0.1, 0.3, 0.5, 0.7, 0.9], [0.1, 0.2, 0.3, 0.4, 0.45])
    trainer.features["policy_groups"].maybe_regroup(step=2)
    trainer.features["policy_groups"].maybe_regroup(step=4)
    assert state.num_groups == 8 and len(state.events) == 1  # refined; no child merged back before being observed


def test_evaluation_after_a_refine_maps_column_values_to_the_new_groups(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_refine_step=1, max_policy_groups=6)
    trainer.train()
    assert any("/" in name for name in trainer.policy_groups.names)
    metrics = trainer.evaluate(eval_dataset=Dataset.from_list(to_grpo_rows(synthetic_gsm8k(8, seed=9))))
    assert [k for k in metrics if k.startswith("eval_policy_groups/")]
    assert "eval_policy_groups/unassigned/reward" not in metrics


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy_group_sampling": "uncertainty"}, "policy_group_sampling='uncertainty' needs policy groups"),
        ({"advantage_baseline": "policy_group"}, "advantage_baseline='policy_group' needs policy groups"),
    ],
)
def test_grouping_settings_without_groups_are_an_error(tiny_model_dir, tmp_path, overrides, message):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), **overrides)
    with pytest.raises(ValueError, match=message):
        GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=_grouped_dataset())


def test_uniform_sampling_without_groups_is_trls_order(tiny_model_dir, tmp_path):
    """`uniform` (TRL's order, the default before issue #11) does nothing without groups, so a saved config that
    spells it out still loads."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), policy_group_sampling="uniform")
    trainer = GRPOTrainer(tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=_grouped_dataset())
    assert trainer.policy_groups is None


def test_callable_groups_need_the_unused_columns(tiny_model_dir, tmp_path):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), remove_unused_columns=True)
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=_grouped_dataset(),
                    policy_group_fn=lambda row: row["task"])  # fmt: skip


def test_column_with_missing_values_is_an_error(tiny_model_dir, tmp_path):
    rows = to_grpo_rows(synthetic_gsm8k(8))
    rows[3]["task"] = None
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), policy_group_column="task")
    with pytest.raises(ValueError, match="is None in row 3"):
        GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=Dataset.from_list(rows))
