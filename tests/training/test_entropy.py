"""Entropy regularization: the formulas against hand-computed values, then each mode wired into training."""

import math

import pytest
import torch
from datasets import Dataset
from torch.testing import assert_close
from trl import GRPOConfig as TRLGRPOConfig
from trl import GRPOTrainer as TRLGRPOTrainer

import trl_grpo_ext.entropy.bonus
import trl_grpo_ext.entropy.covariance
from tests.conftest import length_reward, small_grpo_kwargs
from tests.resume_check import check_resume
from tests.two_process import full_records, two_process
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.entropy.bonus import completion_entropy, entropy_advantages, entropy_bonus
from trl_grpo_ext.entropy.controller import EntropyPI
from trl_grpo_ext.entropy.covariance import clip_cov_draw, kl_cov_penalty, kl_cov_top, token_covariance
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows


def _dataset(n=32):
    return Dataset.from_list(to_grpo_rows(synthetic_gsm8k(n, seed=0)))


# ---- formulas ----


def test_pi_controller_step_response_and_anti_windup():
    pi = EntropyPI(target=1.0, kp=0.1, ki=0.05, bounds=(0.0, 0.3), keys=["all"])
    coefs = []
    for _ in range(12):  # entropy held at 0.5 nats: error e = 0.5 every step
        pi.update({"all": 0.5})
        coefs.append(pi.coef["all"])
    # step k (1-based): I = 0.5k, c = 0.1*0.5 + 0.05*0.5k = 0.05 + 0.025k -> 0.075, 0.1, ..., 0.3 at k = 10
    assert_close(coefs[:10], [0.05 + 0.025 * k for k in range(1, 11)])
    # k = 11, 12: 0.325 > 0.3 with e > 0: saturated, the integral stays at 5.0 (no windup)
    assert coefs[10:] == [0.3, 0.3]
    assert pi.integral["all"] == pytest.approx(5.0)
    # entropy overshoots to 1.5 (e = -0.5): I = 4.5, c = -0.05 + 0.225 = 0.175 at once, not after unwinding
    pi.update({"all": 1.5})
    assert pi.coef["all"] == pytest.approx(0.175)


def test_pi_controller_stays_at_its_floor_while_entropy_is_high_and_follows_regroups():
    pi = EntropyPI(target=1.0, kp=0.1, ki=0.05, bounds=(0.01, 1.0), keys=["a", "b", "c"])
    pi.update({"a": 6.0, "b": 0.0})  # a: e = -5, output -0.75 < floor: not integrated; b: e = 1 -> 0.1 + 0.05
    assert pi.coef == {"a": 0.01, "b": pytest.approx(0.15), "c": 0.01}
    assert pi.integral == {"a": 0.0, "b": 1.0, "c": 0.0}
    pi.update({"a": math.nan})  # no measurement: unchanged
    assert pi.coef["a"] == 0.01
    # a+b merged from 30 prompts of a and 10 of b: weighted (0.01*30 + 0.15*10) / 40 = 0.045; I = (0*30 + 1*10) / 40
    # c split into c/lo and c/hi; old keys are dropped
    pi.regroup({"a+b": {"a": 30, "b": 10}, "c/lo": {"c": 5}, "c/hi": {"c": 5}})
    assert pi.coef == {"a+b": pytest.approx(0.045), "c/lo": 0.01, "c/hi": 0.01}
    assert pi.integral["a+b"] == pytest.approx(0.25)
    # a second merge takes its real parents' state, not that of the names it is spelled with
    pi.update({"a+b": 0.0})  # e = 1: I = 1.25, c = 0.1 + 0.05 * 1.25 = 0.1625
    pi.regroup({"a+b+c/lo": {"a+b": 1, "c/lo": 1}, "c/hi": {"c/hi": 1}})
    assert pi.coef["a+b+c/lo"] == pytest.approx((0.1625 + 0.01) / 2)
    assert pi.mean_coefficient() == pytest.approx(((0.1625 + 0.01) / 2 + 0.01) / 2)
    state = pi.state_dict()
    other = EntropyPI(target=1.0, kp=0.1, ki=0.05, bounds=(0.01, 1.0), keys=["a"])
    other.load_state_dict(state)
    assert other.coef == pi.coef and other.integral == pi.integral


def test_relative_target_measures_each_keys_reference_then_holds_a_share_of_it():
    """Issue #33.1: `ratio` r and a `window` of 3 steps: no target and no control while the references are measured,
    then each key is held at r x the mean of its own measured entropies; a key not measured in the window gets r x the
    mean reference of all keys; regroups pass the targets on, weighted; the state survives a checkpoint."""
    pi = EntropyPI(target=None, kp=0.1, ki=0.05, bounds=(0.0, 1.0), keys=["a", "b"], ratio=0.5, window=3)
    for step, (a, b) in enumerate([(2.0, 0.4), (1.8, 0.4), (1.6, None)], start=1):
        pi.update({"a": a, **({"b": b} if b is not None else {})})
        assert pi.coef == {"a": 0.0, "b": 0.0} and pi.integral == {"a": 0.0, "b": 0.0}  # measuring, no control
        assert pi.mean_target() is None if step < 3 else pi.mean_target() is not None
    # references: a (2.0 + 1.8 + 1.6) / 3 = 1.8 -> target 0.9; b (0.4 + 0.4) / 2 = 0.4 -> target 0.2
    assert pi.target_of("a") == pytest.approx(0.9) and pi.target_of("b") == pytest.approx(0.2)
    # an unmeasured key: 0.5 x (2.0 + 1.8 + 1.6 + 0.4 + 0.4) / 5 steps = 0.5 x 1.24 = 0.62
    assert pi.target_of("c") == pytest.approx(0.62)
    state = pi.state_dict()
    # a: e = 0.4 nats, 0.4 / 0.9 of its target -> (0.1 + 0.05) x 4/9 (falling: the horizon is 0) = 1/15; b: e < 0
    pi.update({"a": 0.5, "b": 0.5})
    assert pi.coef["a"] == pytest.approx(1 / 15) and pi.coef["b"] == 0.0
    resumed = EntropyPI(target=None, kp=0.1, ki=0.05, bounds=(0.0, 1.0), keys=["a", "b"], ratio=0.5, window=3)
    resumed.load_state_dict(state)
    resumed.update({"a": 0.5, "b": 0.5})
    assert resumed.state_dict() == pi.state_dict()  # a resumed controller continues exactly
    pi.regroup({"a+b": {"a": 3, "b": 1}, "c": {"c": 2}})  # (0.9*3 + 0.2*1) / 4 = 0.725; c: the mean reference
    assert pi.target_of("a+b") == pytest.approx(0.725) and pi.target_of("c") == pytest.approx(0.62)


def test_relative_target_acts_alike_on_a_model_that_starts_ten_times_lower():
    """Issue #33: with a relative target the error is in units of the target, so a model whose entropy starts 10x
    lower and falls the same way, 10x lower at every step, gets the same coefficients; in nats (the absolute target,
    here at each run's own target) the low model's would be 10x weaker."""
    fall = [2.0, 2.0, 1.6, 1.2, 0.9, 0.7, 0.6, 0.55, 0.5, 0.5, 0.6]
    runs = {}
    for scale in (1.0, 0.1):
        relative = EntropyPI(target=None, kp=0.5, ki=0.02, bounds=(0.0, 1.0), keys=["all"], horizon=4, ratio=0.5,
                             window=2)  # fmt: skip
        absolute = EntropyPI(target=scale, kp=0.5, ki=0.02, bounds=(0.0, 1.0), keys=["all"], horizon=4)
        runs[scale] = [], []
        for entropy in fall:
            relative.update({"all": scale * entropy})
            absolute.update({"all": scale * entropy})
            runs[scale][0].append(relative.coefficient("all"))
            runs[scale][1].append(absolute.coefficient("all"))
        assert relative.target_of("all") == pytest.approx(scale)  # 0.5 x the first 2 steps' 2.0 x scale
    assert runs[1.0][0] == pytest.approx(runs[0.1][0]) and max(runs[1.0][0]) > 0.3
    assert runs[1.0][1] == pytest.approx(runs[1.0][0])  # at a 1-nat target the relative and absolute laws coincide
    assert runs[0.1][1] == pytest.approx([c / 10 for c in runs[1.0][0]])  # in nats: 10x weaker


def test_relative_target_by_default_holds_a_share_of_the_first_steps_entropy(tmp_path):
    """Issue #33: by default the reference is the entropy of step 1, before any update moved the model, and the
    controller acts from step 2 (a run that collapses in its first steps is met at once, not after a window)."""
    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, entropy_reg=["target"], entropy_target_ratio=0.5
    )
    assert args.entropy_target_window == 1
    pi = EntropyPI(target=None, kp=0.5, ki=0.02, bounds=(0.0, 1.0), keys=["all"], ratio=0.5,
                   window=args.entropy_target_window)  # fmt: skip
    pi.update({"all": 0.8})
    assert pi.target_of("all") == pytest.approx(0.4) and pi.coef["all"] == 0.0
    pi.update({"all": 0.3})  # 0.1 below the 0.4-nat target: a relative error of 0.25 -> (0.5 + 0.02) x 0.25
    assert pi.coef["all"] == pytest.approx(0.13)


def test_pi_controller_integral_stays_within_the_coefficient_range():
    # ki*I is kept in [c_min, c_max] = [0, 0.3]: a long spell above the target leaves I at 0, so a later fall below
    # the target gets its bonus at once (the proportional term plus a fresh integral)
    pi = EntropyPI(target=1.0, kp=0.5, ki=0.1, bounds=(0.0, 0.3), keys=["all"], horizon=10)
    pi.update({"all": 1.2})
    for _ in range(20):  # slowly falling above the target: the projection keeps the output positive, e < 0
        pi.update({"all": 1.15})
    assert pi.integral["all"] == 0.0
    pi.update({"all": 0.8})  # e = 0.2: I = 0.2, trend 0.5^21*(-0.05)... + 0.5*(0.8 - 1.15) ~= -0.175
    trend = pi.trend["all"]
    expected = 0.5 * (1.0 - (0.8 + 10 * trend)) + 0.1 * 0.2
    assert pi.coef["all"] == pytest.approx(min(expected, 0.3))
    integral_only = EntropyPI(target=1.0, kp=0.0, ki=0.1, bounds=(0.0, 0.3), keys=["all"])
    for _ in range(10):  # e = 1 every step: I = 1, 2, 3, then held at c_max / k_i = 3
        integral_only.update({"all": 0.0})
    assert integral_only.integral["all"] == pytest.approx(3.0) and integral_only.coef["all"] == pytest.approx(0.3)


def test_pi_controller_with_a_horizon_acts_before_a_fast_fall_crosses_the_target():
    pi = EntropyPI(target=1.0, kp=0.5, ki=0.02, bounds=(0.0, 1.0), keys=["all"], horizon=4)
    plain = EntropyPI(target=1.0, kp=0.5, ki=0.02, bounds=(0.0, 1.0), keys=["all"])
    for controller in (pi, plain):
        controller.update({"all": 2.0})  # first measurement: no trend yet; e = -1, output < 0: c = 0, I stays 0
        controller.update({"all": 1.6})  # trend s = 0.5*0 + 0.5*(1.6 - 2.0) = -0.2 nats per step
    assert pi.trend["all"] == pytest.approx(-0.2)
    # heading to 1.6 + 4*(-0.2) = 0.8: c = 0.5*(1 - 0.8) + 0.02*I = 0.1 while still above the target; the integral
    # would be 0 + (1 - 1.6) = -0.6, but k_i*I stays within [c_min, c_max] = [0, 1]: I = 0 (no negative windup
    # to unwind once the entropy is below the target)
    assert pi.coef["all"] == pytest.approx(0.1) and pi.integral["all"] == 0.0
    assert plain.coef["all"] == 0.0  # the PI controller waits for the crossing
    # a rising entropy above the target gets no bonus: s = 0.5*(-0.2) + 0.5*(2.4 - 1.6) = 0.3 (rises are not projected)
    pi.update({"all": 2.4})
    assert pi.trend["all"] == pytest.approx(0.3) and pi.coef["all"] == 0.0
    # the trend and the last entropy are in the checkpoint state
    other = EntropyPI(target=1.0, kp=0.5, ki=0.02, bounds=(0.0, 1.0), keys=["all"], horizon=4)
    other.load_state_dict(pi.state_dict())
    assert (other.trend, other.last) == (pi.trend, pi.last)


def test_look_ahead_ignores_a_fall_within_the_entropys_own_noise_but_not_a_steady_one():
    """SmolLM2-135M's first steps (benchmarks/entropy/results/entropy_target_smollm2_30.json): the entropy moves
    +-0.3 nats about 2 nats, far above a 0.33-nat target; with band 0 the filtered fall of step 5 (-0.15/step) looks
    like a fall to 0 within 12 steps and sets off a 0.39 bonus; within the default band of 2 standard errors it is
    noise."""
    noisy = [2.194, 1.964, 2.132, 2.211, 1.860]
    band = GRPOConfig.entropy_pi_noise_band
    assert band == 2.0

    def coefficients(series, band):
        pi = EntropyPI(
            None, kp=0.5, ki=0.02, bounds=(0.0, 1.0), keys=["all"], horizon=12, ratio=0.15, window=1, band=band
        )
        return [pi.update({"all": h}) or pi.coef["all"] for h in series]

    # band 0, step 5: s = -0.1491, target 0.15*2.194 = 0.3291, Ĥ = 1.860 - 12*0.1491 = 0.0705, so
    # c = 0.5*(0.3291 - 0.0705)/0.3291 = 0.393
    assert coefficients(noisy, band=0)[4] == pytest.approx(0.393, abs=1e-3)
    assert coefficients(noisy, band=1) == coefficients(noisy, band=band) == [0.0] * 5
    # by hand, step 5: the changes -0.230, 0.168, 0.079, -0.351 against the trend before each give v = 0.0955 and
    # s = -0.1491, so sigma_s = sqrt(v/3) = 0.178 and s + sigma_s > 0: no look-ahead even within 1 standard error
    pi = EntropyPI(None, kp=0.5, ki=0.02, bounds=(0.0, 1.0), keys=["all"], horizon=12, ratio=0.15, window=1, band=band)
    for h in noisy:
        pi.update({"all": h})
    assert pi.trend["all"] == pytest.approx(-0.1491, abs=1e-4) and pi.noise["all"] == pytest.approx(0.0955, abs=1e-4)
    # a steady fall of 0.3 nats a step from 2.0: each change closer to the trend than the one before, so the band
    # shrinks (step 4: s = -0.2625, v = 0.0197, s + 2*sigma_s = -0.10) and the look-ahead acts before the crossing:
    # Ĥ = 1.1 - 12*0.10 = -0.1, c = 0.5*(0.3 + 0.1)/0.3 = 0.68 with the entropy still 3.7x the 0.3-nat target
    steady = coefficients([2.0 - 0.3 * k for k in range(5)], band=band)
    assert steady[:3] == [0.0, 0.0, 0.0] and steady[3] == pytest.approx(0.676, abs=1e-3) and steady[4] == 1.0
    # one standard error acts a step earlier; no band at all acts on the first change
    assert coefficients([2.0 - 0.3 * k for k in range(5)], band=1)[2] == pytest.approx(0.545, abs=1e-3)
    assert coefficients([2.0 - 0.3 * k for k in range(5)], band=0)[1] > 0
    # the band's noise is in the checkpoint state, and a regroup carries it to the new keys
    other = EntropyPI(
        None, kp=0.5, ki=0.02, bounds=(0.0, 1.0), keys=["all"], horizon=12, ratio=0.15, window=1, band=band
    )
    other.load_state_dict(pi.state_dict())
    assert other.noise == pi.noise
    pi.regroup({"x": {"all": 1}})
    assert pi.noise["x"] == pytest.approx(0.0955, abs=1e-4)


def test_completion_entropy_bonus_and_advantage_shift():
    entropies = torch.tensor([[1.0, 3.0, 9.0], [2.0, 4.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert_close(completion_entropy(entropies, mask), torch.tensor([2.0, 4.0]))  # (1+3)/2, (2+4+6)/3
    # (0.1*(1+3) + 0.2*(2+4+6)) / 5 tokens = (0.4 + 2.4) / 5 = 0.56
    assert_close(entropy_bonus(entropies, mask, torch.tensor([0.1, 0.2])), torch.tensor(0.56))
    # A + min(tau*H, |A|/kappa): tau*H = [0.5*2, 0.5*4] = [1, 2]
    # kappa 2: [1 + min(1, 0.5), -1 + min(2, 0.5)] = [1.5, -0.5]; kappa 1e-6 (no clip): [1 + 1, -1 + 2] = [2, 1]
    assert_close(entropy_advantages(torch.tensor([1.0, -1.0]), entropies, mask, tau=0.5), torch.tensor([1.5, -0.5]))
    assert_close(entropy_advantages(torch.tensor([4.0, -1.0]), entropies, mask, tau=0.5, kappa=1.0),
                 torch.tensor([5.0, 0.0]))  # min(1, 4) = 1; min(2, 1) = 1: the sign never flips  # fmt: skip
    unclipped = entropy_advantages(torch.tensor([1.0, -1.0]), entropies, mask, tau=0.5, kappa=1e-6)
    assert_close(unclipped, torch.tensor([2.0, 1.0]), atol=1e-5, rtol=0)
    # (B, T) advantages: |A| per token; the same shift on every token where |A| is the same
    shifted = entropy_advantages(torch.tensor([[1.0] * 3, [-1.0, -1.0, 0.0]]), entropies, mask, tau=0.5)
    assert_close(shifted, torch.tensor([[1.5] * 3, [-0.5, -0.5, 0.0]]))


def test_an_all_equal_generation_group_keeps_advantage_zero():
    """Issue #33.3: GRPO gives every completion of a prompt whose completions all got the same reward advantage 0;
    the shift min(tau*H, |A|/kappa) is 0 there (before: tau*H, up to 0.5*9 = 4.5 here, raising the likelihood of
    failed completions in proportion to their entropy). The other group's shift is clipped at |A|/2."""
    entropies = torch.tensor([[9.0, 9.0], [8.0, 6.0], [1.0, 1.0], [3.0, 1.0]])
    mask = torch.ones(4, 2)
    advantages = torch.tensor([0.0, 0.0, 0.7071, -0.7071])  # groups of 2: all equal, then one right, one wrong
    shifted = entropy_advantages(advantages, entropies, mask, tau=0.5)
    # [0, 0, 0.7071 + min(0.5, 0.3536), -0.7071 + min(1.0, 0.3536)]
    assert shifted[:2].tolist() == [0.0, 0.0]
    assert_close(shifted[2:], torch.tensor([1.0607, -0.3536]), atol=1e-4, rtol=0)


def test_advantage_shift_leaves_unscored_completions_at_zero():
    entropies = torch.tensor([[1.0, 3.0], [2.0, 4.0], [5.0, 5.0]])
    mask = torch.tensor([[1, 1], [1, 1], [0, 0]])  # the third completion is masked as truncated: no tokens
    scored = torch.tensor([True, False, True])  # every reward function returned None for the second
    # kappa 1e-6 (no clip): [0.5 + 0.5*2, TRL's 0 kept, 0.25 + 0.5*0 (no tokens)]: the unscored one stays exactly 0
    shifted = entropy_advantages(torch.tensor([0.5, 0.0, 0.25]), entropies, mask, tau=0.5, scored=scored, kappa=1e-6)
    assert_close(shifted, torch.tensor([1.5, 0.0, 0.25]))
    assert shifted[1] == 0.0
    # without the mark the clip at |A|/kappa keeps it at 0 too (unclipped it got 0.5*3 = 1.5: issue #13.3)
    assert entropy_advantages(torch.tensor([0.5, 0.0, 0.25]), entropies, mask, tau=0.5)[1] == 0.0


# The masks of one batch by `ratio` (the feature counts per optimizer step: `window_token_count`, then the draw).


def clip_cov_mask(
    cov: torch.Tensor,
    candidates: torch.Tensor,
    num_valid: int,
    ratio: float,
    bounds: tuple[float, float],
    generator: torch.Generator,
) -> torch.Tensor:
    """Clip-Cov's tokens (arXiv:2505.22617, Clip-Cov): `ratio` of the `num_valid` completion tokens (at least one),
    drawn at random among the `candidates` (B, T) bool whose covariance `cov` (B, T) lies strictly inside `bounds` =
    (ω_low, ω_high). Returns a (B, T) bool mask of the tokens whose gradient is detached; the draw uses `generator`
    (CPU). The count is taken over all valid tokens, as in the reference implementation.
    """
    return clip_cov_draw(cov, candidates, max(int(ratio * num_valid), 1), bounds, generator)


def kl_cov_mask(cov: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """KL-Cov's tokens (arXiv:2505.22617, KL-Cov): the top `ratio` of valid tokens (at least one) by
    covariance `cov` (B, T) among `mask` (B, T). Returns a (B, T) bool mask of the tokens that get the penalty."""
    return kl_cov_top(cov, mask, max(int(ratio * int(mask.bool().sum())), 1))


def test_token_covariance_and_the_two_masks():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -9.0]])
    advantages = torch.tensor([2.0, -2.0])
    cov = token_covariance(logps, advantages, means=(-1.5, 0.0))
    # (logp + 1.5) * A: row 0: 0.5*2, -0.5*2, -1.5*2; row 1: 1*-2, 0*-2, -7.5*-2
    assert_close(cov, torch.tensor([[1.0, -1.0, -3.0], [-2.0, 0.0, 15.0]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # KL-Cov: top max(int(0.4 * 5), 1) = 2 valid tokens by covariance: 1.0 and 0.0 (15.0 is padding)
    chosen = kl_cov_mask(cov, mask, 0.4)
    assert chosen.tolist() == [[True, False, False], [False, True, False]]
    # Clip-Cov: a random max(int(0.2 * 5), 1) = 1 token among those with lb < cov < ub: only (0, 0) has 1 > 0.5
    chosen = clip_cov_mask(cov, mask.bool(), 5, 0.2, (0.5, 5.0), torch.Generator().manual_seed(0))
    assert chosen.tolist() == [[True, False, False], [False, False, False]]
    # with wide bounds, 2 of the 5 valid tokens are drawn, never padding, and the same seed draws the same ones
    draws = [clip_cov_mask(cov, mask.bool(), 5, 0.4, (-100, 100), torch.Generator().manual_seed(1)) for _ in "ab"]
    assert draws[0].equal(draws[1]) and int(draws[0].sum()) == 2 and not (draws[0] & ~mask.bool()).any()
    # the count is over all valid tokens (the reference's): int(0.4 * 5) = 2 of the 4 candidates with cov > -2.5,
    # where counting the candidates would give int(0.4 * 4) = 1
    few = clip_cov_mask(cov, mask.bool() & (cov > -2.5), 5, 0.4, (-100, 100), torch.Generator().manual_seed(2))
    assert int(few.sum()) == 2


def test_kl_cov_penalty_value_and_gradient():
    logps = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0], [-2.0, -4.0]])
    chosen = torch.tensor([[True, False], [True, False]])
    mask = torch.ones(2, 2)
    penalty = kl_cov_penalty(logps, old, chosen, mask, 2.0)
    assert_close(penalty, torch.tensor(2.0 * (0.5 + 1.0) / 4))  # beta * (|0.5| + |-1|) / 4 tokens = 0.75
    penalty.backward()
    # d/dlogp of beta*|logp - old|/4 = 0.5*sign: +0.5 at (0, 0), -0.5 at (1, 0), 0 where not chosen
    assert_close(logps.grad, torch.tensor([[0.5, 0.0], [-0.5, 0.0]]))


# ---- wired into training ----


def test_target_mode_at_its_floor_equals_trls_static_bonus(tmp_path, tiny_model_dir):
    """With the entropy far above a low target the controller sits at entropy_coef_min; the run must then be TRL's
    run with the same static `entropy_coef`: our bonus is TRL's term, computed the same way."""
    common = small_grpo_kwargs(tmp_path / "a", max_steps=3)
    stock = TRLGRPOTrainer(tiny_model_dir, length_reward, TRLGRPOConfig(**common, entropy_coef=0.05), _dataset())
    stock.train()
    ours_args = GRPOConfig(**{**common, "output_dir": str(tmp_path / "b")}, entropy_reg="target",
                           entropy_target=0.01, entropy_coef_min=0.05)  # fmt: skip
    ours = GRPOTrainer(tiny_model_dir, length_reward, ours_args, _dataset())
    ours.train()
    assert [row["entropy_reg/coef"] for row in ours.state.log_history[:-1]] == [0.05] * 3
    for (name, p), q in zip(stock.model.named_parameters(), ours.model.parameters(), strict=True):
        assert_close(p, q, atol=1e-6, rtol=0, msg=name)
    assert (stock.state.log_history[-2]["loss"] - ours.state.log_history[-2]["loss"]) == pytest.approx(0, abs=1e-6)


def test_target_mode_raises_the_coefficient_by_the_pi_law(tmp_path, tiny_model_dir):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2), entropy_reg="target", entropy_target=8.0,
                      entropy_pi_kp=0.02, entropy_pi_ki=0.005, entropy_pi_noise_band=0.5)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())
    trainer.train()
    rows = trainer.state.log_history[:-1]
    # one micro-batch per step, so TRL's logged entropy is the controller's measurement
    e1, e2 = 8.0 - rows[0]["entropy"], 8.0 - rows[1]["entropy"]
    assert e1 > 1  # the random model's entropy (~6.2 nats) is below the 8-nat target
    assert rows[0]["entropy_reg/coef"] == pytest.approx(0.02 * e1 + 0.005 * e1)
    # step 2 also looks 12 steps (the default horizon) along the entropy's trend s = 0.5*d, d = H2 - H1, if it falls
    # by more than half a standard error (the band set above): v = 0.5*d**2, sigma_s = sqrt(v/3)
    change = rows[1]["entropy"] - rows[0]["entropy"]
    trend = min(0.5 * change + 0.5 * math.sqrt(0.5 * change**2 / 3), 0.0)
    # (TRL logs the entropy in float32: 1e-6 absolute)
    assert rows[1]["entropy_reg/coef"] == pytest.approx(0.02 * (e2 - 12 * trend) + 0.005 * (e1 + e2), abs=1e-6)
    assert trainer.entropy_reg_state.controller.integral["all"] == pytest.approx(e1 + e2)


def test_the_logged_loss_is_split_into_its_policy_and_entropy_parts(tmp_path, tiny_model_dir):
    """Under `target` the logged loss is TRL's loss plus the bonus −c·H, mostly the bonus here (c ≈ 0.06 at 8 − 6.2
    nats of error, H ≈ 6.2 nats): both parts are logged, and they add up to it (one micro-batch a step, so the logged
    loss is that micro-batch's; transformers rounds it to 4 decimals)."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2), entropy_reg="target", entropy_target=8.0,
                      entropy_pi_kp=0.02, entropy_pi_ki=0.005)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())
    trainer.train()
    for row in trainer.state.log_history[:-1]:
        bonus = -row["entropy_reg/coef"] * row["entropy"]  # the bonus at the step's coefficient, in nats
        assert row["loss/entropy_reg"] == pytest.approx(bonus, rel=1e-4)
        assert abs(row["loss/entropy_reg"]) > abs(row["loss/policy"])
        assert row["loss"] == pytest.approx(row["loss/policy"] + row["loss/entropy_reg"], abs=1e-4)
    plain = GRPOTrainer(tiny_model_dir, length_reward, GRPOConfig(**small_grpo_kwargs(tmp_path / "b", max_steps=1),
                        entropy_reg="clip_cov"), _dataset())  # fmt: skip
    plain.train()
    assert not any(key.startswith("loss/") for key in plain.state.log_history[0])  # no term added: no parts


def test_a_steps_coefficient_is_set_from_its_own_entropy_before_its_loss(tmp_path, tiny_model_dir):
    """The controller measures an optimizer step's entropy before the step's bonus enters the loss (here in the
    loss's own forward pass: one micro-batch a step), so step 1 already carries the coefficient its entropy sets: the
    run is TRL's with that coefficient as a static `entropy_coef`. Set from the step before, step 1's bonus would be
    0. With accumulation the step is measured in a pass without gradient over its window, before its first
    micro-batch: `test_split_invariance` holds those runs to this one's."""
    common = small_grpo_kwargs(tmp_path / "a", max_steps=1)
    ours_args = GRPOConfig(**{**common, "output_dir": str(tmp_path / "b")}, entropy_reg="target",
                           entropy_target=8.0, entropy_pi_kp=0.02, entropy_pi_ki=0.005)  # fmt: skip
    ours = GRPOTrainer(tiny_model_dir, length_reward, ours_args, _dataset())
    ours.train()
    row = ours.state.log_history[0]
    coef = row["entropy_reg/coef"]
    assert coef == pytest.approx(0.025 * (8.0 - row["entropy"]), abs=1e-6) and coef > 0.04  # ~6.2 nats: e ~1.8
    stock = TRLGRPOTrainer(tiny_model_dir, length_reward, TRLGRPOConfig(**common, entropy_coef=coef), _dataset())
    stock.train()
    for (name, p), q in zip(stock.model.named_parameters(), ours.model.parameters(), strict=True):
        assert_close(p, q, atol=1e-6, rtol=0, msg=name)


def test_per_group_controllers_see_only_their_groups_entropy(tmp_path, tiny_model_dir):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=1), entropy_reg="target", entropy_target=1.0,
                      entropy_target_per_group=True, policy_group_column="difficulty",
                      remove_unused_columns=False)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())
    low, high = trainer.policy_groups.names[:2]
    # one completion of each group: the low one's mean entropy is 0.75 nats (below target), the high one's 3.0
    names = trainer.policy_groups.names
    ids = torch.tensor([names.index(low), names.index(high)])
    target = trainer.features["entropy_reg"].modes[0]  # the one mode, `target`
    target.observe(names, ids, torch.tensor([[0.7, 0.8], [3.0, 3.0]]), torch.ones(2, 2))
    controller = trainer.entropy_reg_state.controller
    assert controller.coef[low] == pytest.approx(2.0 * 0.25 + 0.02 * 0.25)  # default gains, e = 0.25
    assert controller.coef[high] == 0.0  # entropy above target: it is not pushed
    metrics = trainer._metrics["train"]
    assert metrics[f"entropy_reg/{low}/entropy"] == [pytest.approx(0.75)]
    assert metrics[f"entropy_reg/{high}/entropy"] == [pytest.approx(3.0)]


def test_relative_target_is_a_share_of_the_entropy_measured_in_the_first_steps(tmp_path, tiny_model_dir):
    """`entropy_target_ratio` 0.9 over a window of 2 steps: the coefficient stays at its floor for 2 steps, then the
    logged target is 0.9 x the mean of the entropy TRL logged in them (one micro-batch a step: the same tokens)."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=4), entropy_reg="target", entropy_target_ratio=0.9,
                      entropy_target_window=2)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())
    trainer.train()
    rows = trainer.state.log_history[:-1]
    assert [row["entropy_reg/coef"] for row in rows[:2]] == [0.0, 0.0] and "entropy_reg/target" not in rows[0]
    reference = (rows[0]["entropy"] + rows[1]["entropy"]) / 2
    assert [row["entropy_reg/target"] for row in rows[1:]] == [pytest.approx(0.9 * reference, rel=1e-5)] * 3
    assert trainer.entropy_reg_state.controller.targets == {"all": pytest.approx(0.9 * reference, rel=1e-5)}


def test_relative_target_per_group_measures_each_groups_own_reference(tmp_path, tiny_model_dir):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2), entropy_reg="target", entropy_target_ratio=0.5,
                      entropy_target_window=1, entropy_target_per_group=True, policy_group_column="difficulty",
                      remove_unused_columns=False)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())
    names = trainer.policy_groups.names
    low, high = names[:2]
    target = trainer.features["entropy_reg"].modes[0]
    ids = torch.tensor([names.index(low), names.index(high)])
    target.observe(names, ids, torch.tensor([[0.4, 0.6], [3.0, 3.0]]), torch.ones(2, 2))  # the window's one step
    controller = trainer.entropy_reg_state.controller
    assert controller.targets == {low: pytest.approx(0.25), high: pytest.approx(1.5)}  # 0.5 x 0.5, 0.5 x 3.0
    target.observe(names, ids, torch.tensor([[0.1, 0.1], [3.0, 3.0]]), torch.ones(2, 2))
    assert controller.coef[low] > 0 and controller.coef[high] == 0.0  # low fell below its target, high did not


def test_per_group_target_evaluates_with_the_mean_coefficient(tmp_path, tiny_model_dir):
    """An evaluation batch has no policy groups: it gets the mean of the groups' coefficients, and evaluation leaves
    the controllers alone."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2), entropy_reg="target", entropy_target=8.0,
                      entropy_target_per_group=True, policy_group_column="difficulty", remove_unused_columns=False,
                      eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset(), eval_dataset=_dataset(8))
    trainer.train()
    evals = [row for row in trainer.state.log_history if "eval_loss" in row]
    assert len(evals) == 2 and all(math.isfinite(row["eval_loss"]) for row in evals)
    state = trainer.entropy_reg_state.controller.state_dict()
    trainer.evaluate()
    assert trainer.entropy_reg_state.controller.state_dict() == state


def test_advantage_mode_feeds_trl_the_shifted_advantages(tmp_path, tiny_model_dir, monkeypatch):
    seen = []
    original = entropy_advantages

    def spy(advantages, entropies, mask, *, tau, scored=None, kappa=2.0):
        shifted = original(advantages, entropies, mask, tau=tau, scored=scored, kappa=kappa)
        seen.append((advantages.clone(), completion_entropy(entropies.detach(), mask), shifted))
        return shifted

    monkeypatch.setattr(trl_grpo_ext.entropy.bonus, "entropy_advantages", spy)
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=1), loss_type="grpo", entropy_reg="advantage",
                      entropy_advantage_coef=0.3)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())
    trainer.train()
    ((advantages, entropy, shifted),) = seen
    assert_close(shifted, advantages + torch.minimum(0.3 * entropy, advantages.abs() / 2))
    # loss_type grpo, on-policy (ratio 1), beta 0: TRL's loss is -mean_b(A_b), so it must be -mean(A + 0.3 H)
    assert trainer.state.log_history[0]["loss"] == pytest.approx(-shifted.mean().item(), abs=1e-5)
    # TRL reuses its buffered batch (num_iterations): it must keep the unshifted advantages (TRL got a copy)
    assert_close(trainer._buffered_inputs[0]["advantages"], advantages)


def _first_prompt_constant(completions, **kwargs) -> list[float]:
    """1.0 for every completion of the first prompt of each 8 (its generation group of 4 all equal: advantage 0),
    `length_reward` for the others."""
    return [1.0 if i % 8 < 4 else r for i, r in enumerate(length_reward(completions))]


def test_the_advantage_mode_leaves_an_all_equal_generation_group_at_zero_in_training(tmp_path, tiny_model_dir):
    """Issue #33.3 in a training step: TRL's loss reads advantage exactly 0 for the group whose completions all got
    the same reward, and a shift clipped at |A|/2 for the others."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=1), entropy_reg="advantage", entropy_advantage_coef=0.3)
    trainer = _LossSpy(tiny_model_dir, _first_prompt_constant, args, _dataset())
    trainer.seen = []
    trainer.train()
    ((shifted, _, _, _),) = trainer.seen
    original = trainer._buffered_inputs[0]["advantages"]  # TRL shuffled the batch: find the group by its zeros
    equal = original == 0
    assert int(equal.sum()) == 4 and shifted[equal].tolist() == [0.0] * 4
    moved = shifted[~equal] - original[~equal]
    assert (moved > 0).all() and (moved <= original[~equal].abs() / 2 + 1e-6).all()


def test_clip_cov_detaches_the_chosen_tokens_and_logs_their_fraction(tmp_path, tiny_model_dir, monkeypatch):
    chosen_masks = []
    original = clip_cov_draw

    def spy(*args, **kwargs):
        chosen_masks.append(original(*args, **kwargs))
        return chosen_masks[-1]

    monkeypatch.setattr(trl_grpo_ext.entropy.covariance, "clip_cov_draw", spy)
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=2), entropy_reg="clip_cov", clip_cov_lb=-1e9,
                      clip_cov_ub=1e9, clip_cov_ratio=0.1)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())
    trainer.train()
    rows = trainer.state.log_history[:-1]
    for chosen, row in zip(chosen_masks, rows, strict=True):
        assert 0 < chosen.sum() <= 0.1 * chosen.numel() + 1
        assert row["entropy_reg/clipped_frac"] > 0
    # the draws depend on the optimizer step, not on a shared random stream: two steps draw differently
    assert not chosen_masks[0].equal(chosen_masks[1])


def test_kl_cov_penalty_enters_the_loss_once_the_policy_has_moved(tmp_path, tiny_model_dir):
    kwargs = small_grpo_kwargs(tmp_path, max_steps=2, num_iterations=2)
    plain = GRPOTrainer(tiny_model_dir, length_reward, GRPOConfig(**kwargs), _dataset())
    plain.train()
    args = GRPOConfig(**{**kwargs, "output_dir": str(tmp_path / "kl")}, entropy_reg="kl_cov", kl_cov_ratio=0.5,
                      kl_cov_coef=10.0)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())
    trainer.train()
    rows, plain_rows = trainer.state.log_history[:-1], plain.state.log_history[:-1]
    # step 1 is the first pass over the generation batch: log pi = log pi_old, no penalty, identical loss
    assert rows[0]["loss"] == pytest.approx(plain_rows[0]["loss"], abs=1e-7)
    # step 2 is the second pass: the policy moved, the penalty (>= 0) is added
    assert rows[1]["loss"] > plain_rows[1]["loss"] + 1e-6
    assert rows[1]["entropy_reg/penalized_frac"] == pytest.approx(0.5, abs=0.02)


def test_command_line_lists_and_comma_strings_give_the_same_modes(tmp_path):
    from trl import TrlParser

    base = ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false"]
    for argv in (["--entropy_reg", "clip_cov,advantage"], ["--entropy_reg", "clip_cov", "advantage"]):
        (args,) = TrlParser((GRPOConfig,)).parse_args_and_config([*base, *argv, "--grad_reg", "zclip,agc"])
        assert args.entropy_reg == ["clip_cov", "advantage"] and args.grad_reg == ["zclip", "agc"]


def test_per_group_controllers_follow_merges(tmp_path, tiny_model_dir):
    """Regrouping every step with a wide merge tolerance merges policy groups during training: the controllers must
    then be exactly the current groups (old ones dropped), on the way and at the end."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=4), entropy_reg="target", entropy_target=8.0,
                      entropy_target_per_group=True, policy_group_column="difficulty", remove_unused_columns=False,
                      policy_group_regroup_steps=1, policy_group_merge_tol=10.0, policy_group_min_size=1,
                      min_policy_groups=1, num_policy_groups=1)  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())
    start = len(trainer.policy_groups.names)
    trainer.train()
    assert len(trainer.policy_groups.names) < start, "no merge happened: the test does not test anything"
    controller = trainer.entropy_reg_state.controller
    assert list(controller.coef) == list(trainer.policy_groups.names)
    assert all(c > 0 for c in controller.coef.values())  # 8 nats target: every group's controller acted


def test_per_group_target_without_policy_groups_is_an_error(tmp_path, tiny_model_dir):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path), entropy_reg="target", entropy_target_per_group=True)
    with pytest.raises(ValueError, match="entropy_target_per_group=True needs policy groups"):
        GRPOTrainer(tiny_model_dir, length_reward, args, _dataset())


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"entropy_reg": "target,foo"}, "entropy_reg entries must be among .* got 'foo'"),
        ({"entropy_reg": ["target", "target"]}, r"entropy_reg lists a mode twice: \['target', 'target'\]"),
        ({"entropy_reg": "target", "use_adaptive_entropy": True}, "use_adaptive_entropy=False \\(got True\\)"),
        ({"entropy_reg": "advantage", "entropy_coef": 0.01}, "entropy_coef=0.0 \\(got 0.01\\)"),
        ({"entropy_reg": "clip_cov,kl_cov"}, "choose one of clip_cov and kl_cov"),
        ({"entropy_target_per_group": True}, "needs 'target' in entropy_reg \\(got \\[\\]\\)"),
        ({"entropy_reg": "target", "entropy_target": 0.0}, "entropy_target > 0 nats, got 0.0"),
        (
            {"entropy_reg": "target", "entropy_pi_kp": -0.1},
            r"entropy_pi_kp must be a finite number in \[0, 1000\], got -0.1",
        ),
        ({"entropy_reg": "target", "entropy_pi_kp": 0.0, "entropy_pi_ki": 0.0}, "cannot both be 0"),
        ({"entropy_reg": "target", "entropy_coef_max": 0.0}, r"entropy_coef_min \(0.0\) < entropy_coef_max \(0.0\)"),
        ({"clip_cov_ratio": 0.0}, r"clip_cov_ratio must be a finite number in \(0, 1\], got 0.0"),
        ({"clip_cov_lb": 5.0}, r"clip_cov_lb \(5.0\) < clip_cov_ub \(5.0\)"),
        ({"kl_cov_coef": -1.0}, r"kl_cov_coef must be a finite number in \[0, 1000\], got -1.0"),
        ({"entropy_advantage_coef": -0.5}, r"entropy_advantage_coef must be a finite number in \[0, 1000\], got -0.5"),
        (
            {"entropy_advantage_coef": float("inf")},
            r"entropy_advantage_coef must be a finite number in \[0, 1000\], got inf",
        ),
        (  # TRL's own field, checked first (`trl_fields`)
            {"entropy_reg": "target", "entropy_target": float("nan")},
            r"entropy_target \(the entropy target in nats\) must be a finite number >= 0, got nan",
        ),
        ({"clip_cov_lb": float("nan")}, "clip_cov_lb must be a finite number in .*, got nan"),
        ({"entropy_reg": 5}, "entropy_reg must be a list of modes .* got 5"),
        ({"entropy_reg": "clip_cov", "loss_type": "cispo"}, "clip_cov.* loss_type \\(got 'cispo'\\)"),
        ({"entropy_reg": "clip_cov", "importance_sampling_level": "sequence"}, "importance_sampling_level='token'"),
        (  # issue #33: two targets, a ratio out of (0, 1], a window with no step after it, a ratio without the mode
            {"entropy_reg": "target", "entropy_target": 0.6, "entropy_target_ratio": 0.3},
            r"entropy_target=0.6 \(nats\) and entropy_target_ratio=0.3 \(of the model's own entropy\) are two "
            "targets: set one of them",
        ),
        ({"entropy_reg": "target", "entropy_target_ratio": 1.5}, r"entropy_target_ratio must be .* \(0, 1\].* 1.5"),
        ({"entropy_reg": "target", "entropy_target_ratio": 0.0}, r"entropy_target_ratio must be .* \(0, 1\].* 0.0"),
        (
            {"entropy_reg": "target", "entropy_target_ratio": 0.3, "entropy_target_window": 3},
            r"entropy_target_window=3 steps measure the reference entropy, which leaves none of max_steps=3",
        ),
        ({"entropy_target_ratio": 0.3}, r"entropy_target_ratio=0.3 needs 'target' in entropy_reg \(got \[\]\)"),
        ({"entropy_advantage_kappa": 0.5}, r"entropy_advantage_kappa must be a finite number in \[1, 1000000\]"),
    ],
)
def test_bad_entropy_settings_name_the_field_and_value(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**small_grpo_kwargs(tmp_path), **overrides)


RESUME_CONFIGS = {
    "target+clip_cov": {"entropy_reg": ["target", "clip_cov"], "entropy_target": 7.0, "clip_cov_lb": -1e9,
                        "clip_cov_ub": 1e9, "clip_cov_ratio": 0.05},
    "kl_cov+advantage": {"entropy_reg": ["kl_cov", "advantage"], "num_iterations": 2},
    "relative_target": {"entropy_reg": ["target"], "entropy_target_ratio": 1.0, "entropy_target_window": 3},
}  # fmt: skip


@pytest.mark.parametrize("config", RESUME_CONFIGS.values(), ids=RESUME_CONFIGS.keys())
def test_resume_restores_the_entropy_controllers_exactly(config, tmp_path, tiny_model_dir):
    check_resume(config, tmp_path, tiny_model_dir)


ENTROPY_2P = {"entropy_reg": ["target", "clip_cov"], "entropy_target_ratio": 1.0, "entropy_target_window": 1,
              "per_device_train_batch_size": 6, "max_steps": 3, "save_steps": 3}  # fmt: skip


@two_process("entropy", ENTROPY_2P)
def test_two_processes_hold_the_same_controller(two_process_runs):
    """Under 2 processes each rank logs its own controller's coefficient: they must agree at every step. The run is
    scenario "entropy" of the suite's shared two-process job (tests/two_process.py)."""
    ranks = full_records(two_process_runs["entropy"])
    coefs = [[row["entropy_reg/coef"] for row in rank["logs"] if "entropy_reg/coef" in row] for rank in ranks]
    assert len(coefs[0]) == 3 and coefs[0] == coefs[1]
    assert coefs[0][-1] > 0
    # the relative target's reference is gathered over both ranks: the same target on each, the first step's
    # entropy (ratio 1, a window of 1 step) as TRL logged it over both
    targets = [[row["entropy_reg/target"] for row in rank["logs"] if "entropy_reg/target" in row] for rank in ranks]
    first = [row["entropy"] for row in ranks[0]["logs"] if "entropy" in row][0]
    assert len(targets[0]) == 3 and targets[0] == targets[1] == [pytest.approx(first, rel=1e-5)] * 3


def _third_unscored(completions, **kwargs) -> list[float | None]:
    """`length_reward` for two completions in three; None (no reward function can score it) for the others."""
    return [None if i % 3 == 0 else r for i, r in enumerate(length_reward(completions))]


class _LossSpy(GRPOTrainer):
    """Records, at each loss computation, what TRL's loss sees after our hooks: advantages, the scored mark, the loss
    mask and Clip-Cov's/KL-Cov's tokens."""

    def hook_get_per_token_logps_and_entropies(self, **kwargs):
        batch = self._loss_batch  # the copy TRL's loss reads, set while it computes the policy's log-probs
        result = super().hook_get_per_token_logps_and_entropies(**kwargs)
        if batch is not None and kwargs.get("compute_entropy"):  # after the features: advantages shifted
            chosen = self.features["entropy_reg"]._capture[2]
            self.seen.append((batch["advantages"].clone(), batch["completion_scored"].clone(),
                              batch["completion_mask"].clone(), chosen))  # fmt: skip
        return result


@pytest.mark.parametrize("modes", [["advantage", "clip_cov"], ["advantage", "kl_cov", "target"]])
def test_unscored_completions_keep_advantage_zero_and_are_never_chosen(tmp_path, tiny_model_dir, modes):
    """Issue #13.3: TRL sets the advantage of a completion no reward function scored to exactly 0; the `advantage`
    mode must not shift it (it added τ·H, +0.35 in the issue's run), and Clip-Cov/KL-Cov must not pick its tokens."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=1), entropy_reg=modes, entropy_advantage_coef=0.05,
                      clip_cov_lb=-1e9, clip_cov_ub=1e9, clip_cov_ratio=0.2, kl_cov_ratio=0.2)  # fmt: skip
    trainer = _LossSpy(tiny_model_dir, _third_unscored, args, _dataset())
    trainer.seen = []
    trainer.train()
    ((advantages, scored, mask, chosen),) = trainer.seen
    assert 0 < int((~scored).sum()) < len(scored)  # 8 completions: 3 unscored (0, 3, 6 of the reward call)
    assert advantages[~scored].tolist() == [0.0] * int((~scored).sum())  # exactly TRL's 0
    assert (advantages[scored] != trainer._buffered_inputs[0]["advantages"][scored]).all()  # the others are shifted
    assert int(chosen.sum()) > 0 and not chosen[~scored].any()
    row = trainer.state.log_history[0]
    # the fraction is over the scored completions' tokens: int(0.2 * n) of n (KL-Cov: the top ones, all of them)
    scored_tokens = int(mask[scored].sum())
    if "kl_cov" in modes:
        assert row["entropy_reg/penalized_frac"] == pytest.approx(int(0.2 * scored_tokens) / scored_tokens)
    # the logged mean shift is over the scored completions only (before: diluted by the unscored ones' 0)
    shift = (advantages - trainer._buffered_inputs[0]["advantages"])[scored]
    assert row["entropy_reg/advantage_shift"] == pytest.approx(shift.mean().item(), rel=1e-5)


@pytest.mark.parametrize("modes", [["advantage", "clip_cov"], ["advantage", "kl_cov"]])
def test_completions_masked_as_truncated_stay_out_of_every_entropy_term(tmp_path, tiny_model_dir, modes):
    """Issue #13.3 for `mask_truncated_completions`: TRL's loss gives a truncated completion no token, so Clip-Cov and
    KL-Cov never pick its tokens, KL-Cov's fraction counts only the tokens left in, and the advantage mode's logged
    shift is the mean over the completions the loss uses (one value per completion with tokens)."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=1), entropy_reg=modes, entropy_advantage_coef=0.05,
                      clip_cov_lb=-1e9, clip_cov_ub=1e9, clip_cov_ratio=0.5, kl_cov_ratio=0.5,
                      mask_truncated_completions=True)  # fmt: skip
    trainer = _LossSpy(tiny_model_dir, length_reward, args, _dataset())
    trainer.seen = []
    trainer.train()
    ((advantages, _, mask, chosen),) = trainer.seen
    truncated = mask.sum(1) == 0
    assert 0 < int(truncated.sum()) < len(mask)  # most completions of the random tiny model reach the length limit
    assert int(chosen.sum()) > 0 and not chosen[truncated].any()
    row = trainer.state.log_history[0]
    tokens = int(mask.sum())  # the tokens TRL's loss counts: none of a truncated completion's
    if "kl_cov" in modes:
        assert row["entropy_reg/penalized_frac"] == pytest.approx(int(0.5 * tokens) / tokens)
    shift = (advantages - trainer._buffered_inputs[0]["advantages"])[~truncated]
    assert row["entropy_reg/advantage_shift"] == pytest.approx(shift.mean().item(), rel=1e-5)


class _EntropyMaskSpy(GRPOTrainer):
    """Records, at each training loss computation, Clip-Cov's/KL-Cov's tokens and the tokens TRL's policy loss keeps
    under `top_entropy_quantile` (its `get_high_entropy_mask`, on the same entropies)."""

    def hook_get_per_token_logps_and_entropies(self, **kwargs):
        batch = self._loss_batch
        result = super().hook_get_per_token_logps_and_entropies(**kwargs)
        if batch is not None and kwargs.get("compute_entropy") and self.model.training:
            mask = batch["completion_mask"]
            kept = self.get_high_entropy_mask(result[1], mask, 1 - self.top_entropy_quantile)
            self.seen.append((self.features["entropy_reg"]._capture[2].clone(), kept, mask.clone()))
        return result


@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("mode", ["kl_cov", "clip_cov"])
def test_clip_cov_and_kl_cov_pick_only_tokens_the_entropy_quantile_keeps(tmp_path, tiny_model_dir, mode, accumulation):
    """Issue #32.7: with `top_entropy_quantile` < 1, TRL's policy loss keeps only the tokens at or above the entropy
    quantile (arXiv:2506.01939); Clip-Cov and KL-Cov pick among those, their ratio of those (before: 25 of 30
    penalized tokens lay outside), chosen over the accumulation window as without the quantile."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, max_steps=1, per_device_train_batch_size=8 // accumulation,
                                          gradient_accumulation_steps=accumulation),
                      entropy_reg=[mode], top_entropy_quantile=0.2, clip_cov_lb=-1e9, clip_cov_ub=1e9,
                      clip_cov_ratio=0.5, kl_cov_ratio=0.5)  # fmt: skip
    trainer = _EntropyMaskSpy(tiny_model_dir, length_reward, args, _dataset())
    trainer.seen = []
    trainer.train()
    assert len(trainer.seen) == accumulation
    chosen = torch.cat([c for c, _, _ in trainer.seen])
    kept = torch.cat([k for _, k, _ in trainer.seen])
    tokens = int(torch.cat([m for _, _, m in trainer.seen]).sum())
    assert int(chosen.sum()) > 0 and not (chosen & ~kept).any()  # every picked token is one the policy loss keeps
    # half of the kept tokens (a fifth of all): an unrestricted pick of half of all tokens could not fit inside
    assert int(kept.sum()) < 0.5 * tokens
    if mode == "kl_cov":  # the top half of the kept tokens, and the logged fraction is over the scored tokens
        assert int(chosen.sum()) == int(0.5 * int(kept.sum()))
        assert trainer.state.log_history[0]["entropy_reg/penalized_frac"] == pytest.approx(int(chosen.sum()) / tokens)
