"""Policy grouping: the learnability score on hand-made reward tables, the draw, the state, and training runs."""

import io
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
from trl_grpo_ext.policy_groups import score
from trl_grpo_ext.policy_groups.stages import StageSchedule
from trl_grpo_ext.policy_groups.state import CHECKPOINT_FIELDS, PolicyGroupState

D = torch.float64
nan = math.nan


def test_prompt_sums_by_hand():
    # prompt 0 (group 0): rewards 1, 0, 1 -> mean 2/3, unbiased variance (1/9 + 4/9 + 1/9) / 2 = 1/3;
    #   log-probabilities -1, -3, -2 (mean -2): centred rewards 1/3, -2/3, 1/3 x centred log-probabilities 1, -1, 0
    #   -> rl = 1/3 + 2/3 = 1, rr = 6/9, ll = 2, df = 2
    # prompt 1 (group 0): 1, 1, 1 -> variance 0: counted in prompts and reward, not informative
    # prompt 2 (group 1): NaN, 0, 1 -> 2 scored: mean 0.5, variance 0.5; log-probabilities of the scored -4, -2:
    #   rl = (-0.5)(-1) + (0.5)(1) = 1, rr = 0.5, ll = 2, df = 1
    rewards = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [nan, 0.0, 1.0]])
    logps = torch.tensor([[-1.0, -3.0, -2.0], [-1.0, -1.0, -1.0], [-5.0, -4.0, -2.0]])
    sums = score.prompt_sums(rewards, logps, torch.tensor([0, 0, 1]), 2)
    expected = {"prompts": [2, 1], "reward": [5 / 3, 0.5], "variance": [1 / 3, 0.5], "variance2": [1 / 9, 0.25],
                "informative": [1, 1], "rl": [1, 1], "rr": [2 / 3, 0.5], "ll": [2, 2], "df": [2, 1]}  # fmt: skip
    for name, values in expected.items():
        assert_close(sums[name], torch.tensor(values, dtype=D), msg=name)
    # without log-probabilities the credibility sums are 0; a prompt with one scored completion counts nowhere
    sums = score.prompt_sums(torch.tensor([[nan, 1.0, nan]]), None, torch.tensor([0]), 1)
    assert all(float(sums[name][0]) == 0.0 for name in score.SUMS)


def test_decayed_add_halves_a_group_after_halflife_prompts():
    # half-life 2 prompts: group 0 got 2 prompts (old sums x 0.5), group 1 none (kept as they are)
    sums = {"prompts": torch.tensor([4.0, 3.0], dtype=D)}
    batch = {"prompts": torch.tensor([2.0, 0.0], dtype=D)}
    added = score.decayed_add(sums, batch, batch["prompts"], halflife=2.0, names=("prompts",))
    assert_close(added["prompts"], torch.tensor([4.0, 3.0], dtype=D))  # 4 x 0.5 + 2, 3 x 1 + 0


def test_signal_is_each_groups_variance_shrunk_toward_the_pooled_one_by_hand():
    # group 0: two prompts of variance 0.5; group 1: two of 0. n = 2, 2; m = 0.5, 0; pooled m̄ = 0.25 over N = 4.
    # s² = (Σv² − N·m̄²) / (N − 1) = (0.5 − 0.25) / 3 = 1/12; Q = Σ n_i (m_i − m̄)² = 0.25; τ² = (Q − (K − 1)·s²) /
    # (N − Σn²/N) = (0.25 − 1/12) / 2 = 1/12; B = s² / (s² + n·τ²) = 1/3: W = m̄/3 + 2·m/3 = 5/12 and 1/12
    sums = {"prompts": torch.tensor([2.0, 2.0], dtype=D), "variance": torch.tensor([1.0, 0.0], dtype=D),
            "variance2": torch.tensor([0.5, 0.0], dtype=D)}  # fmt: skip
    assert_close(score.signal(sums), torch.tensor([5 / 12, 1 / 12], dtype=D))
    # one prompt each says nothing of the groups apart from the spread of all prompts: both get the pooled mean
    one = {"prompts": torch.tensor([1.0, 1.0], dtype=D), "variance": torch.tensor([0.5, 0.0], dtype=D),
           "variance2": torch.tensor([0.25, 0.0], dtype=D)}  # fmt: skip
    assert_close(score.signal(one), torch.tensor([0.25, 0.25], dtype=D))
    # many prompts: each group's own mean (100 of 0.5 against 100 of 0 leaves almost nothing to shrink)
    many = {"prompts": torch.tensor([100.0, 100.0], dtype=D), "variance": torch.tensor([50.0, 0.0], dtype=D),
            "variance2": torch.tensor([25.0, 0.0], dtype=D)}  # fmt: skip
    assert_close(score.signal(many), torch.tensor([0.5, 0.0], dtype=D), atol=3e-3, rtol=0)


def test_credibility_is_the_prior_without_evidence_and_the_estimate_with_much():
    zero = torch.zeros(1, dtype=D)
    prior = score.credibility(zero, zero, zero, zero)
    assert_close(prior, torch.tensor([1 / 3], dtype=D), atol=3e-3, rtol=0)  # E[ρ²] under a uniform prior on ρ
    # r = 0.5 over 1002 degrees of freedom: ρ ≈ 0.5 ± (1 − 0.25) / √1000 = 0.5 ± 0.024 -> E[ρ²] ≈ 0.25 within 0.003
    much = torch.tensor([1002.0], dtype=D)
    assert_close(score.credibility(torch.tensor([0.5], dtype=D), torch.ones(1, dtype=D), torch.ones(1, dtype=D), much),
                 torch.tensor([0.25], dtype=D), atol=3e-3, rtol=0)  # fmt: skip
    # r = 0 over 1002: E[ρ²] ≈ var(ρ) ≈ 1/1000
    assert float(score.credibility(zero, torch.ones(1, dtype=D), torch.ones(1, dtype=D), much)) < 2e-3


def _table(kind: str, prompts: int = 48, generations: int = 4, seed: int = 0):
    """A hand-made reward table (prompts, G) and the completions' mean token log-probabilities (prompts, G):
    `learnable`: each prompt has its own pass rate (some always right, some never, most in between) and the right
    completions are the ones the policy finds likelier (log-probability −1 against −2, plus noise);
    `coin`: every completion paid with probability 1/2 whatever it is (a prompt-blind coin flip);
    `lucky`: 3 completions of the whole table right, at random (a pass rate of 2%, by luck);
    `solved`: every completion right. Log-probabilities of the last three are noise of the same spread."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(prompts, generations, generator=generator, dtype=D) * 0.5
    if kind == "learnable":
        rates = torch.linspace(0, 1, prompts, dtype=D)[:, None]
        rewards = (torch.rand(prompts, generations, generator=generator, dtype=D) < rates).double()
        return rewards, -2.0 + rewards + noise
    if kind == "coin":
        rewards = (torch.rand(prompts, generations, generator=generator, dtype=D) < 0.5).double()
    elif kind == "lucky":
        rewards = torch.zeros(prompts * generations, dtype=D)
        rewards[torch.randperm(prompts * generations, generator=generator)[:3]] = 1.0
        rewards = rewards.view(prompts, generations)
    else:
        rewards = torch.ones(prompts, generations, dtype=D)
    return rewards, -1.5 + noise


def test_score_tells_a_learnable_group_from_luck_a_coin_flip_and_a_solved_group():
    """The score on four hand-made tables, one group each (`_table`): the learnable group's is far above the others;
    the coin flip has the largest reward variance (W 0.25 against the learnable group's 0.15) and still scores a
    fraction of it, luck and the solved group next to nothing."""
    kinds = ("learnable", "coin", "lucky", "solved")
    tables = [_table(kind, seed=i) for i, kind in enumerate(kinds)]
    rewards, logps = torch.cat([t[0] for t in tables]), torch.cat([t[1] for t in tables])
    ids = torch.arange(4).repeat_interleave(48)
    sums = score.prompt_sums(rewards, logps, ids, 4)
    signal = sums["variance"] / sums["prompts"]
    assert signal[1] > 1.5 * signal[0]  # the coin flip's variance is the largest...
    scores = dict(zip(kinds, score.scores(sums).tolist(), strict=True))
    assert scores["coin"] < scores["learnable"] / 8  # ...but not credible
    assert scores["lucky"] < scores["learnable"] / 20
    assert scores["solved"] < scores["learnable"] / 50
    # the draw: 90% by score and 10% spread evenly: the learnable group gets most of it
    drawn = score.draw_probabilities(score.scores(sums), torch.full((4,), 48.0, dtype=D), floor=0.1)
    assert drawn[0] > 0.75 and all(p >= 0.1 / 4 for p in drawn.tolist())


def test_score_acts_on_little_evidence_without_waiting_for_a_test():
    # two prompts of the learnable table against two of the coin flip: nothing is significant yet, and the scores
    # stay within a factor of a few of each other (no group cut off by one batch)
    learnable, coin = _table("learnable", 2, seed=1), _table("coin", 2, seed=2)
    sums = score.prompt_sums(torch.cat([learnable[0], coin[0]]), torch.cat([learnable[1], coin[1]]),
                             torch.tensor([0, 0, 1, 1]), 2)  # fmt: skip
    low, high = sorted(score.scores(sums).tolist())
    assert 0 < low and high < 10 * low


def test_draw_probabilities_by_hand():
    # scores 0.1, 0, 0.3, 5 over groups of 2, 4, 2 and 0 prompts: mass 0.2, 0, 0.6, 0 -> shares 0.25, 0, 0.75, 0;
    # floor 0.2 over the 3 groups with prompts: 0.8 x share + 0.2 / 3
    p = score.draw_probabilities(torch.tensor([0.1, 0.0, 0.3, 5.0], dtype=D), torch.tensor([2, 4, 2, 0]), 0.2)
    assert_close(p, torch.tensor([0.2 + 0.2 / 3, 0.2 / 3, 0.6 + 0.2 / 3, 0.0], dtype=D))
    # equal scores: TRL's draw, in proportion to the groups' prompts
    p = score.draw_probabilities(torch.ones(3, dtype=D), torch.tensor([1, 2, 5]), 0.0)
    assert_close(p, torch.tensor([1 / 8, 2 / 8, 5 / 8], dtype=D))


def test_loss_weights_have_mean_one_over_the_completions_with_an_advantage():
    # group weights 2, 1; completions of groups 0, 0, 1, 1; the second has advantage 0 (not used):
    # w = 2, 2, 1, 1, mean over the used (2 + 1 + 1) / 3 = 4/3 -> 1.5, 1.5, 0.75, 0.75
    used = torch.tensor([True, False, True, True])
    w = score.loss_weights(torch.tensor([2.0, 1.0], dtype=D), torch.tensor([0, 0, 1, 1]), used)
    assert_close(w, torch.tensor([1.5, 1.5, 0.75, 0.75], dtype=D))


class Args:
    policy_group_sampling = "learnability"
    policy_group_sampling_floor = 0.0
    policy_group_update_steps = 1
    policy_group_eta = 1.0


def test_observe_keeps_the_batch_pending_until_its_log_probabilities_are_noted():
    # groups a (rows 0, 1) and b (row 2), 2 generations: a's prompts 1, 0 and 1, 1; b's 0, 0
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 0, 1]), seed=0)
    rows, rewards = torch.tensor([0, 1, 2]), torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    state.observe(rows, rewards, num_generations=2, halflife=1e9)
    assert_close(state.sums["reward"], torch.tensor([1.5, 0.0], dtype=D))  # 0.5 + 1 and 0
    assert_close(state.sums["variance"], torch.tensor([0.5, 0.0], dtype=D))
    assert float(state.sums["df"].sum()) == 0.0 and state.pending is not None
    # the log-probabilities come in two parts (two micro-batches); a second note of a completion is ignored
    state.note_logps(torch.tensor([-1.0, -2.0, 0, 0, 0, 0]), torch.tensor([True, True, False, False, False, False]))
    state.note_logps(torch.tensor([9.0, 9.0, -1, -1, -3, -3]), torch.tensor([True, True, True, True, True, True]))
    assert state.pending["logps"].tolist() == [[-1.0, -2.0], [-1.0, -1.0], [-3.0, -3.0]]
    state.observe(torch.tensor([2]), torch.tensor([1.0, 1.0]), num_generations=2, halflife=1e9)  # folds the first
    # only prompt 0 disagreed: centred rewards 0.5, -0.5 x centred log-probabilities 0.5, -0.5 -> rl 0.5, df 1
    assert_close(torch.stack([state.sums[n] for n in ("rl", "rr", "ll", "df")])[:, 0],
                 torch.tensor([0.5, 0.5, 0.5, 1.0], dtype=D))  # fmt: skip
    assert state.prompt_visits.tolist() == [1, 1, 2] and state.prompt_success.tolist() == [0.5, 1.0, 1.0]


def test_progress_weights_by_hand():
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1]), seed=0)
    args = type("ProgressArgs", (Args,), {"policy_group_sampling": "progress"})()
    state.observe(torch.tensor([0, 1]), torch.tensor([0.0, 1.0, 0.0, 1.0]), num_generations=2, halflife=1e9)
    state.update_progress(1, args)  # first update: the window starts, no change yet
    assert state.alpha.tolist() == [1.0, 1.0]
    state.observe(torch.tensor([1]), torch.tensor([1.0, 1.0]), num_generations=2, halflife=1e9)
    state.update_progress(2, args)
    # rewards 0.5 -> 0.5 for a, 0.5 -> 0.75 for b (the mean of its prompts 0.5 and 1): ΔR minus the mean change
    # -0.125, +0.125; η = 1 -> α = 0.875, 1.125 (mean 1 already)
    assert_close(state.alpha, torch.tensor([0.875, 1.125], dtype=D))
    drawn = state.probabilities(args)  # the score's draw, times α
    plain = score.draw_probabilities(score.scores(state.sums), state.sizes, 0.0)
    assert_close(drawn, plain * state.alpha / (plain * state.alpha).sum())


def test_draws_follow_the_target_distribution():
    """Group draws over 10,000 prompts follow the probabilities (chi-square, 3 degrees of freedom, p 0.001: 16.27)."""
    assignment = torch.arange(400) % 4
    state = PolicyGroupState(["a", "b", "c", "d"], assignment, seed=3)
    args = type("ProgressArgs", (Args,), {"policy_group_sampling": "progress"})()
    state.alpha = torch.tensor([0.4, 0.8, 1.2, 1.6], dtype=D)  # scores all 1 before any batch: the draw follows α
    counts = torch.zeros(4)
    for _ in range(100):
        rows = state.draw_rows(100, args)
        counts += torch.bincount(assignment[rows], minlength=4)
        state.generations += 1
    expected = torch.tensor([0.1, 0.2, 0.3, 0.4]) * 10_000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.27, (counts, expected)


def test_draws_are_seeded_and_cover_a_group_before_repeating():
    assignment = torch.tensor([0] * 6 + [1] * 6)
    args = type("ProgressArgs", (Args,), {"policy_group_sampling": "progress"})()
    state = PolicyGroupState(["a", "b"], assignment, seed=0)
    state.alpha = torch.tensor([2.0, 0.0], dtype=D)  # all draws from group a
    first = state.draw_rows(6, args)
    assert sorted(first.tolist()) == [0, 1, 2, 3, 4, 5]  # no prompt repeats before the group is used up
    again = PolicyGroupState(["a", "b"], assignment, seed=0)
    again.alpha = state.alpha
    assert again.draw_rows(6, args).tolist() == first.tolist()  # same seed, same draws


def _save(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_state_checkpoint_round_trip_and_a_missing_field_loads_its_stated_default():
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1, 0]), seed=0)
    state.observe(torch.tensor([0, 1, 2]), torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0]), num_generations=2,
                  halflife=8.0)  # fmt: skip
    state.note_logps(torch.tensor([-1.0, -2.0, -1.0, -3.0, -1.0, -1.0]), torch.ones(6, dtype=torch.bool))
    saved = torch.load(_save(state.state_dict()), weights_only=True)
    assert tuple(saved) == CHECKPOINT_FIELDS  # exactly the schema, in its order
    copy = PolicyGroupState(["x"], torch.tensor([0]), seed=9)
    copy.load_state_dict(saved)
    assert copy.names == ["a", "b"] and torch.equal(copy.pending["logps"], state.pending["logps"])
    assert copy.metrics(Args()) == state.metrics(Args())
    # a checkpoint without `observed` loads its default for the checkpoint's 2 groups
    older = {key: value for key, value in saved.items() if key != "observed"}
    copy.load_state_dict(older)
    assert copy.observed.tolist() == [False, False]


def test_state_checkpoint_refuses_unknown_fields_missing_required_ones_and_unsaved_attributes():
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 1]), seed=0)
    saved = state.state_dict()
    # a checkpoint of the policy groups before issue #69 (its EMAs and weights) is refused, naming the fields
    with pytest.raises(ValueError, match=r"PolicyGroupState checkpoint .* has unknown fields \['ema', 'weights'\]"):
        PolicyGroupState(["x"], torch.tensor([0]), seed=1).load_state_dict(saved | {"ema": {}, "weights": 1})
    with pytest.raises(ValueError, match=r"lacks \['assignment'\]"):
        PolicyGroupState(["x"], torch.tensor([0]), seed=1).load_state_dict({k: v for k, v in saved.items()
                                                                            if k != "assignment"})  # fmt: skip
    with pytest.raises(ValueError, match=r"StageSchedule checkpoint .* has unknown fields \['rewards'\]"):
        StageSchedule(warmup=False).load_state_dict(saved["stages"] | {"rewards": []})
    state.cache = torch.zeros(2)  # a new attribute is not saved implicitly: saving names it
    with pytest.raises(RuntimeError, match=r"PolicyGroupState has attributes outside .*\['cache'\]"):
        state.state_dict()


def test_regroup_gives_each_new_group_its_share_of_the_old_sums():
    state = PolicyGroupState(["a", "b"], torch.tensor([0, 0, 1, 1]), seed=0)
    state.observe(torch.tensor([0, 2]), torch.tensor([1.0, 0.0, 0.0, 0.0]), num_generations=2, halflife=1e9)
    state.alpha = torch.tensor([1.5, 0.5], dtype=D)
    state.regroup(["a/lo", "b", "a/hi"], torch.tensor([0, 2, 1, 1]), "split a")  # a's rows 0 | 1
    # a's sums (1 prompt, reward 0.5, variance 0.5) halved between its children; b's kept
    assert_close(state.sums["prompts"], torch.tensor([0.5, 1.0, 0.5], dtype=D))
    assert_close(state.sums["variance"], torch.tensor([0.25, 0.0, 0.25], dtype=D))
    assert_close(state.alpha, torch.tensor([1.5, 0.5, 1.5], dtype=D))
    assert state.observed.tolist() == [False, True, False]  # children wait for a batch before any merge
    state.regroup(["a", "b"], torch.tensor([0, 0, 1, 1]), "merge a/lo and a/hi")  # merged: the sums add up again
    assert_close(state.sums["variance"], torch.tensor([0.5, 0.0], dtype=D))
    assert state.totals()["policy_groups/a/count"] == 1.0 and state.events[-1] == "merge a/lo and a/hi"


def _grouped_dataset(n=48):
    return Dataset.from_list(to_grpo_rows(synthetic_gsm8k(n, seed=5)))


def task_reward(completions, task, **kwargs):
    """Learnable per task: length parity for addition, always 1 for multiplication (solved), 0 for the rest."""
    table = {"addition": lambda c: float(len(c) % 2), "multiplication": lambda c: 1.0}
    return [table.get(t, lambda c: 0.0)(c[0]["content"]) for c, t in zip(completions, task, strict=True)]


@pytest.mark.parametrize("sampling", ["learnability", "progress", "uniform"])
def test_end_to_end_logs_every_group(tiny_model_dir, tmp_path, sampling):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=4, per_device_train_batch_size=12),
                      policy_group_column="task", policy_group_update_steps=2, policy_group_sampling=sampling,
                      remove_unused_columns=False)  # fmt: skip
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args,
                          train_dataset=_grouped_dataset())  # fmt: skip
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    names = trainer.policy_groups.names
    assert len(names) == 5 and all(f"policy_groups/{n}/weight" in row for row in rows for n in names)
    last, sizes = rows[-1], trainer.policy_groups.sizes.double() / 48
    # weight = draw probability over the group's share of the prompts: the probabilities sum to 1
    drawn = [last[f"policy_groups/{n}/weight"] * float(s) for n, s in zip(names, sizes, strict=True)]
    assert math.isclose(sum(drawn), 1.0, rel_tol=1e-6)
    rewards = {k: v for k, v in last.items() if k.startswith("policy_groups/") and k.endswith("/reward")}
    assert len(rewards) >= 2 and all(0.0 <= v <= 1.0 for v in rewards.values())  # task_reward is 0 or 1
    if "policy_groups/multiplication/score" in last:  # drawn by then: solved, so its prompts all agree
        assert last["policy_groups/multiplication/zero_std_frac"] == 1.0
        assert last["policy_groups/multiplication/score"] < last.get("policy_groups/addition/score", math.inf)
    assert sum(last[f"policy_groups/{n}/count"] for n in names) == 12.0  # 3 prompts x 4 steps
    # the policy's log-probabilities of the last batch's completions were noted: finite and negative
    assert bool((trainer.policy_groups.pending["logps"] < 0).all())


def _logps_noted(tiny_model_dir, tmp_path, **overrides):
    kwargs = small_grpo_kwargs(tmp_path, max_steps=2, per_device_train_batch_size=12, seed=3) | overrides
    args = GRPOConfig(**kwargs, policy_group_column="task", remove_unused_columns=False)
    trainer = GRPOTrainer(tiny_model_dir, [task_reward], args, _grouped_dataset())
    trainer.train()
    return trainer.policy_groups.pending["logps"]


def test_the_noted_log_probabilities_do_not_depend_on_how_a_step_is_split(tiny_model_dir, tmp_path):
    """The mean token log-probability of each completion, noted inside TRL's loss, is the same with one micro-batch a
    step and with three (gradient accumulation): the statistics follow the completions, not the layout."""
    whole = _logps_noted(tiny_model_dir, tmp_path / "whole")
    split = _logps_noted(tiny_model_dir, tmp_path / "split", per_device_train_batch_size=4,
                         gradient_accumulation_steps=3)  # fmt: skip
    assert whole.shape == (3, 4) and torch.isfinite(whole).all()
    assert_close(split, whole, atol=1e-5, rtol=0)


def test_missing_column_names_it_and_lists_columns(tiny_model_dir, tmp_path):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), policy_group_column="topic", remove_unused_columns=False)
    with pytest.raises(ValueError, match=r"topic.*prompt.*answer"):
        GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=_grouped_dataset())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("policy_group_eta", -1.0, r"policy_group_eta must be a finite number in \(0, 1\], got -1.0"),
        ("policy_group_sampling", "weighted", "policy_group_sampling must be one of"),
        ("policy_group_halflife", 0.0, r"policy_group_halflife must be a finite number in \(0, 1000000000\]"),
        ("min_policy_groups", 9, r"min_policy_groups \(9\) <= max_policy_groups \(8\)"),
        ("policy_group_update_steps", 0, "policy_group_update_steps must be an integer >= 1, got 0"),
    ],
)
def test_config_values_out_of_range_are_named(field, value, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**small_grpo_kwargs(tmp_path), **{field: value})


def test_grouping_needs_the_unused_columns(tmp_path):
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        GRPOConfig(**small_grpo_kwargs(tmp_path), policy_group_column="task", remove_unused_columns=True)


# the README's setting with loss weights, over 2-step generation cycles, so that a checkpoint falls inside one (its
# completions' log-probabilities half noted)
GROUPED = {"policy_group_column": "task", "policy_group_loss_weighting": True, "steps_per_generation": 2,
           "num_problems": 24, "remove_unused_columns": False}  # fmt: skip


def test_grouped_run_resumes_exactly(tmp_path, tiny_model_dir):
    assert check_resume(GROUPED, tmp_path, tiny_model_dir) == 0.0


GROUPED_2P = two_process("grouped", {**GROUPED, "per_device_train_batch_size": 6}, resume_step=3)


@GROUPED_2P
def test_two_processes_hold_identical_statistics_and_see_different_prompts(two_process_runs):
    """The uninterrupted run of scenario "grouped" of the suite's shared two-process job (tests/two_process.py), the
    one `test_two_processes_grouped_run_resumes_exactly` resumes."""
    records = full_records(two_process_runs["grouped"])
    assert records[0]["prompts"] != records[1]["prompts"]  # each rank takes its own slice of the global draw
    keys = {k for row in records[0]["logs"] for k in row if k.startswith("policy_groups/")}
    # the log-probabilities of both processes were noted: a group's credibility moved off the prior's 1/3
    assert any(abs(row[k] - 1 / 3) > 0.01 for row in records[0]["logs"] for k in row if k.endswith("/credibility"))
    assert keys and all(row0.get(k) == row1.get(k) for row0, row1 in zip(records[0]["logs"], records[1]["logs"],
                                                                         strict=True) for k in keys)  # fmt: skip


@GROUPED_2P
def test_two_processes_grouped_run_resumes_exactly(two_process_runs):
    """Scenario "grouped" of the suite's shared two-process job (tests/two_process.py): resumed == uninterrupted."""
    assert resume_diff(two_process_runs["grouped"], resume_step=3) == 0.0


def _trainer(tiny_model_dir, tmp_path, reward=task_reward, dataset=None, **overrides):
    settings = {"policy_group_column": "task", "policy_group_min_size": 2, "remove_unused_columns": False}
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2, per_device_train_batch_size=12), **{**settings,
                      **overrides})  # fmt: skip
    return GRPOTrainer(model=tiny_model_dir, reward_funcs=[reward], args=args,
                       train_dataset=dataset if dataset is not None else _grouped_dataset())  # fmt: skip


class _OneOfTwoProcesses:
    """Stands for the accelerator of process 1 of 2 (the rows given are already the gathered, global ones)."""

    process_index, num_processes = 1, 2

    @staticmethod
    def gather(tensor):
        return torch.cat([tensor, tensor])


def test_loss_weights_scale_this_processs_advantages(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_loss_weighting=True)
    state = trainer.policy_groups  # groups: addition, four-step, multiplication, three-step, two-step
    first_row = {name: int((state.assignment == i).nonzero()[0]) for i, name in enumerate(state.names)}
    # addition credible (rl, rr, ll, df: r = 0.5 over 1002), multiplication a coin flip (r = 0 over 1002): before the
    # batch folds in, each has 10 prompts of variance 0.2
    for i, rl in ((0, 0.5), (2, 0.0)):
        for name, value in {"prompts": 10, "variance": 2.0, "rl": rl, "rr": 1, "ll": 1, "df": 1002}.items():
            state.sums[name][i] = value
    rows = torch.tensor([first_row["multiplication"]] * 2 + [first_row["addition"]] * 2)
    trainer.features["policy_groups"]._batch = (torch.tensor([[1.0], [0.0], [1.0], [0.0]]), rows)
    output = {"advantages": torch.tensor([0.3, -0.3]), "completion_mask": torch.ones(2, 3)}
    trainer.accelerator, accelerator = _OneOfTwoProcesses(), trainer.accelerator
    try:
        trainer.features["policy_groups"].apply_policy_groups(output)
    finally:
        trainer.accelerator = accelerator
    weights = state.loss_weights(trainer.args)
    # the 4 gathered completions (2 of multiplication, then 2 of addition) all have an advantage: mean-1 weights
    expected = weights[0] / ((2 * weights[0] + 2 * weights[2]) / 4)
    assert_close(output["advantages"], torch.tensor([0.3, -0.3]) * float(expected))
    assert output["policy_group_ids"].tolist() == [0, 0] and output["policy_group_completion"].tolist() == [2, 3]
    assert weights[0] > 20 * weights[2]  # the credible group's weight, far above the coin flip's


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
    assert last["policy_groups/nan_rewards"] == 4.0 * last["policy_groups/addition/count"] > 0
    assert "policy_groups/addition/reward" not in last  # every addition reward was None: no statistic yet
    assert last["policy_groups/multiplication/reward"] == 1.0


def test_kmeans_tfidf_assignment(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_column=None, policy_group_features="tfidf",
                       num_policy_groups=2)  # fmt: skip
    assert trainer.policy_groups.names == ["cluster0", "cluster1"]
    again = _trainer(tiny_model_dir, tmp_path / "again", policy_group_column=None, policy_group_features="tfidf",
                     num_policy_groups=2)  # fmt: skip
    assert torch.equal(trainer.policy_groups.assignment, again.policy_groups.assignment)  # deterministic


def test_regroup_merges_groups_that_behave_alike_and_not_a_group_just_made(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, policy_group_regroup_steps=1, policy_group_merge_tol=0.05)
    state = trainer.policy_groups  # addition, four-step, multiplication, three-step, two-step (sorted)
    # rewards 0.1, 0.5, 0.9, 0.52, 0.2 and within-prompt stds 0.3, 0.4, 0.1, 0.41, 0.3 over one prompt each
    state.sums["prompts"][:] = 1.0
    state.sums["reward"] = torch.tensor([0.1, 0.5, 0.9, 0.52, 0.2], dtype=D)
    state.sums["variance"] = torch.tensor([0.3, 0.4, 0.1, 0.41, 0.3], dtype=D) ** 2
    state.observed[:] = True
    trainer.features["policy_groups"].maybe_regroup(step=1)
    # four-step and three-step differ by 0.02 and 0.01 (< 0.05); addition and two-step by 0.1: one merge
    assert state.names == ["addition", "four-step+three-step", "multiplication", "two-step"]
    assert_close(state.sums["reward"][1] / state.sums["prompts"][1], torch.tensor(0.51, dtype=D))
    assert "four-step" in state.events[-1] and "three-step" in state.events[-1]


def test_drawn_generation_batch_keeps_trls_repeat_contract(tiny_model_dir, tmp_path):
    """Each drawn prompt fills `num_generations` consecutive slots; two processes' slices tile one global draw."""
    trainer = _trainer(tiny_model_dir, tmp_path)
    feature = trainer.features["policy_groups"]
    batch = feature.draw_generation_batch(12)  # 12 completions on this process = 3 prompts x 4 generations
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
        first = [row["policy_group_row"] for row in feature.draw_generation_batch(12)]
    finally:
        trainer.accelerator.state.num_processes = 1
    assert first == global_rows[:12].tolist()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy_group_sampling": "progress"}, "policy_group_sampling='progress' needs policy groups"),
        ({"policy_group_loss_weighting": True}, "policy_group_loss_weighting=True needs policy groups"),
    ],
)
def test_grouping_settings_without_groups_are_an_error(tiny_model_dir, tmp_path, overrides, message):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), **overrides)
    with pytest.raises(ValueError, match=message):
        GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=_grouped_dataset())


def test_uniform_sampling_without_groups_is_trls_order(tiny_model_dir, tmp_path):
    """`uniform` (TRL's order) does nothing without groups, so a saved config that spells it out still loads."""
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
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), policy_group_column="task", remove_unused_columns=False)
    with pytest.raises(ValueError, match="is None in row 3"):
        GRPOTrainer(model=tiny_model_dir, reward_funcs=[task_reward], args=args, train_dataset=Dataset.from_list(rows))
