"""The policy-group family benchmark's widened mixes and its report of the oracle's gain
(`benchmarks/policy_groups_learning.py`, issue #31); the entropy-target family's verdict
(`benchmarks/entropy_target_family.py`, issue #33)."""

import math

import pytest

from tests.test_benchmark_sampling import harness


def test_widened_mixes_hold_640_prompts_in_their_shares():
    module = harness()
    for mix, (groups, _) in module.WIDE_MIXES.items():
        assert sum(share for _, share in groups.values()) == pytest.approx(1.0), mix
        rows = module.group_rows(mix, prompts=module.MIX_PROMPTS[mix])
        assert len(rows) == 640
        for group, (_, share) in groups.items():
            assert rows.count(group) == round(share * 640), (mix, group)


def test_gated_rewards_start_at_zero_and_grow_with_the_completion():
    tasks = harness().TASKS
    brevity, _ = tasks["brevity_gate"]
    assert brevity("x", 24) == 0.0 and brevity("x", 18) == 0.0 and brevity("x", 9) == 0.5
    digits, _ = tasks["digit_gate"]
    assert digits("ab", 2) == 0.0 and digits("1a", 2) == pytest.approx((0.5 - 0.3) / 0.7) and digits("12", 2) == 1.0


def test_share_of_the_oracles_gain():
    share = harness().share_captured
    assert share(0.8, 0.6) == pytest.approx(0.5)  # half of the oracle's 0.4
    assert share(0.6, 0.6) == pytest.approx(1.0)
    assert share(1.1, 0.6) == pytest.approx(-0.25)  # slower than stock TRL
    assert share(0.9, 1.0) == math.inf and share(1.1, 1.0) == -math.inf and share(1.0, 1.2) == 0.0


def test_summary_compares_the_seeds_every_variant_ran():
    module = harness()
    run = lambda variant, seed, steps: {"mix": "base4", "seed": seed, "variant": variant, "steps": steps}  # noqa: E731
    results = [run("trl", 0, 100), run("trl", 1, 80), run("trl", 2, 60), run("oracle", 0, 50), run("oracle", 1, 40),
               run("ours", 0, 75), run("ours", 1, 60)]  # fmt: skip
    lines = module.summary(results, ["trl", "oracle", "ours"]).splitlines()
    # seeds 0 and 1: medians 90 (TRL), 45 (oracle, 0.50), 67.5 (ours, 0.75): half of the oracle's gain
    assert lines[1] == "base4 | ours | 2 | 90.0 | 0.50 | 0.75 (50%)"


def test_entropy_family_verdict_leaves_the_stress_tasks_out():
    module = harness("entropy_target_family")
    assert module.STRESS < set(module.TASKS) and not module.STRESS & {"digits8", "digits8_pretrained"}

    def run(task, variant, lowest_share, final_reward):
        return {"task": task, "seed": 0, "variant": variant, "entropy": [6.6, 1.0], "lowest_share": lowest_share,
                "final_reward": final_reward, "final_entropy": 1.0, "target": 1.0}  # fmt: skip

    held = [run("digits8", "trl", None, 0.90), run("digits8", "relative", 0.90, 0.89),
            run("digits8_t013", "trl", None, 0.90), run("digits8_t013", "relative", 0.10, 0.90)]  # fmt: skip
    lines = module.report(held, ["trl", "relative", "absolute"]).splitlines()
    assert lines[-1] == "relative: every task and seed passes: True (the stress tasks: False)"
    assert not any(line.startswith("absolute") for line in lines)  # named, never run: no verdict, not "True"
    assert "digits8_t013 (stress task, outside the target)" in lines[2]
    # 0.84 of the target after the crossing, and a final reward 0.03 below stock TRL's: each fails the task alone
    for lowest, final in ((0.84, 0.90), (0.90, 0.87)):
        failed = [run("digits8", "trl", None, 0.90), run("digits8", "relative", lowest, final)]
        assert (
            module.report(failed, ["trl", "relative"])
            .splitlines()[-1]
            .startswith("relative: every task and seed passes: False")
        )
    # a task run without stock TRL's runs cannot be judged, and the verdict says so rather than passing it silently
    alone = [run("digits8", "trl", None, 0.90), run("digits8", "relative", 0.90, 0.90),
             run("letters16", "relative", 0.10, 0.50)]  # fmt: skip
    assert module.report(alone, ["trl", "relative"]).splitlines()[-1] == (
        "relative: every task and seed passes: True (the stress tasks: not run); not judged, no stock TRL runs: "
        "['letters16']"
    )


def test_entropy_family_bound_takes_the_best_static_bonus_per_seed():
    """The bound: a seed passes if any static bonus (`fixed<c>`) both held its entropy (>= 0.85 of the target) and
    ended within 0.02 of stock TRL's reward on it; one that held only by losing reward does not count."""
    module = harness("entropy_target_family")

    def run(seed, variant, lowest_share, final_reward):
        return {
            "task": "digits8_pretrained",
            "seed": seed,
            "variant": variant,
            "entropy": [0.9, 0.1],
            "lowest_share": lowest_share,
            "final_reward": final_reward,
            "final_entropy": 0.1,
            "target": 0.135,
        }

    results = [run(0, "trl", None, 1.0), run(1, "trl", None, 1.0), run(2, "trl", None, 1.0),
               run(0, "fixed0.03", 0.40, 0.99), run(0, "fixed0.1", None, 0.985),  # seed 0: 0.1 does both
               run(1, "fixed0.03", 0.84, 0.99), run(1, "fixed0.1", None, 0.97),  # seed 1: neither does both
               run(2, "fixed0.03", None, 0.995)]  # fmt: skip
    lines = module.report(results, ["trl", "fixed0.03", "fixed0.1"]).splitlines()
    assert lines[3] == (
        "  bound, the best static bonus of ['fixed0.03', 'fixed0.1'] per seed in hindsight: passes seeds [0, 2] of "
        "[0, 1, 2]"
    )
