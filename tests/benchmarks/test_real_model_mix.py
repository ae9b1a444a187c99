"""The real-model task mix of issue #60 (benchmarks/real_model/real_model_mix.py): its groups and rewards, the
steps-to-threshold arithmetic of its report, and the 2-step smoke of the script on the tiny model (the grid itself runs
SmolLM2-135M, outside CI)."""

import importlib.util
import json
import statistics
from collections import Counter

import pytest

from tests.conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("real_model_mix", REPO_ROOT / "benchmarks/real_model/real_model_mix.py")
mix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mix)


def test_the_arithmetic_mix_has_five_unequal_policy_groups_with_right_answers():
    arithmetic = mix.MIXES["arithmetic"]
    rows = arithmetic.rows()
    sizes = Counter(row["task"] for row in rows)
    assert sizes == {"product": 72, "sum": 45, "sum3": 40, "repeat": 30, "noisy": 24}
    assert rows == arithmetic.rows()  # fixed
    for row in rows:
        text = row["prompt"][0]["content"]
        operands = [int(n) for n in mix._INTEGER.findall(text)]
        if row["task"] == "product":
            expected = operands[0] * operands[1]
        else:  # a sum, or the number to repeat
            expected = sum(operands)
        assert row["answer"] == str(expected), text
    assert {row["task"] for row in mix.rows_for("oracle_groups", arithmetic)} == set(arithmetic.learnable)
    assert {row["task"] for row in mix.rows_for("oracle_skip", arithmetic)} == {"product", "sum", "noisy"}


def test_the_words_mix_has_a_lucky_a_coin_and_a_nearly_solved_group_beside_two_learnable_ones():
    words = mix.MIXES["words"]
    rows = words.rows()
    assert Counter(row["task"] for row in rows) == {"capital": 40, "antonym": 40, "next_letter": 25, "coin": 30,
                                                    "plain": 30}  # fmt: skip
    first = {row["task"]: row for row in reversed(rows)}  # each group's first prompt
    assert (first["capital"]["answer"], first["next_letter"]["answer"]) == ("Paris", "B")

    def score(task, text, gold=None):
        row = first[task]
        return words.score(task, row["prompt"][0]["content"], text, row["answer"] if gold is None else gold)

    assert score("capital", "The capital of France is Paris.") == (1.0, 1.0)
    assert score("antonym", "Cold.") == (1.0, 1.0) and score("antonym", "Warm.") == (0.0, 0.0)
    # the letter must stand alone: "B" in "Bee" is no answer
    assert score("next_letter", "It is B.")[0] == 1.0 and score("next_letter", "Bee")[0] == 0.0
    assert score("plain", "White and cold.")[0] == 1.0 and score("plain", "About 3 feet deep.")[0] == 0.0
    # the coin pays about half of all texts, whatever they say, the same text always alike
    coins = [score("coin", f"A sentence, take {i}.")[0] for i in range(2000)]
    assert coins[:20] == [score("coin", f"A sentence, take {i}.")[0] for i in range(20)]
    assert statistics.fmean(coins) == pytest.approx(0.5, abs=0.03)


def test_the_reward_pays_the_last_integer_and_the_noisy_judge_pays_at_its_rates(tmp_path):
    reward = mix.MixReward(tmp_path / "log.jsonl", mix.MIXES["arithmetic"])
    prompts = [[{"role": "user", "content": "What is 2 times 3?"}]] * 2
    completions = [[{"content": "2 times 3 is 6"}], [{"content": "6, no, 7"}]]
    assert reward(prompts, completions, ["6", "6"], ["product", "product"]) == [1.0, 0.0]
    # the repeat group pays the number anywhere in the completion
    repeat = [[{"role": "user", "content": "Repeat the number 47."}]] * 2
    said = [[{"content": "47 is the number, 12"}], [{"content": "74"}]]
    assert reward(repeat, said, ["47", "47"], ["repeat", "repeat"]) == [1.0, 0.0]
    # the same text always gets the same score; over many texts, right answers are paid 60% and wrong ones 20%
    right = [mix.noisy_judge("What is 12 plus 30?", f"42 #{i}", True) for i in range(4000)]
    wrong = [mix.noisy_judge("What is 12 plus 30?", f"41 #{i}", False) for i in range(4000)]
    assert right[:50] == [mix.noisy_judge("What is 12 plus 30?", f"42 #{i}", True) for i in range(50)]
    assert statistics.fmean(right) == pytest.approx(mix.NOISY_PAY_RIGHT, abs=0.03)
    assert statistics.fmean(wrong) == pytest.approx(mix.NOISY_PAY_WRONG, abs=0.03)


def test_the_noisy_judges_clean_scores_are_logged_and_reported_beside_its_rewards(tmp_path):
    from types import SimpleNamespace

    reward = mix.MixReward(tmp_path / "log.jsonl", mix.MIXES["arithmetic"])
    reward.trainer = SimpleNamespace(model=SimpleNamespace(training=True), state=SimpleNamespace(global_step=0))
    prompts = [[{"role": "user", "content": "What is 12 plus 30?"}]] * 3 + [[{"role": "user", "content": "2 x 3?"}]]
    texts = ["42", "41", "It is 42", "6"]
    paid = reward(prompts, [[{"content": t}] for t in texts], ["42", "42", "42", "6"], ["noisy"] * 3 + ["product"])
    (entry,) = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert entry["step"] == 1 and entry["rewards"] == {"noisy": paid[:3], "product": [1.0]}
    # the clean scores (right, wrong, right) are kept where they differ from the judge's: the noisy group only
    right = [1.0, 0.0, 1.0]
    assert entry["clean"] == ({} if paid[:3] == right else {"noisy": right})
    result = {"max_steps": 2, "rewards": [
        {"step": 1, "rewards": {"noisy": [1.0, 0.0]}, "clean": {"noisy": [0.0, 0.0]}},
        {"step": 2, "rewards": {"noisy": [1.0, 1.0], "sum": [1.0]}, "clean": {"noisy": [1.0, 0.0]}},
    ]}  # fmt: skip
    assert mix.final_rewards(result)["noisy"] == pytest.approx(0.75)  # steps' means 0.5 and 1.0
    assert mix.final_rewards(result, key="clean")["noisy"] == pytest.approx(0.25)  # 0.0 and 0.5
    assert mix.final_rewards(result, key="clean")["sum"] == 1.0  # no clean scores: its rewards


def test_steps_to_the_threshold_follow_the_learnable_groups_counted_alike():
    # product scored 0.0, 0.2, ..., 1.0 over 6 steps (one completion a step), sum 0.0 twice a step from step 2
    rewards = [
        {"step": s, "rewards": {"product": [0.2 * (s - 1)], "sum3": [0.0], **({"sum": [0.0, 0.0]} if s > 1 else {})}}
        for s in range(1, 7)
    ]
    result = {"max_steps": 6, "rewards": rewards, "steps": [{"completions/mean_length": 10.0}] * 6}
    # product's 5-step pooled means .1, .2, .3, .4, .6 from step 2 (none of sum at step 1), sum's 0: half of them;
    # pooling both groups' completions would give sum twice product's say
    assert mix.learnable_curve(result) == pytest.approx([None, 0.05, 0.1, 0.15, 0.2, 0.3])
    assert mix.to_threshold(result, 0.18) == (5, 5 * 10.0 * mix.COMPLETIONS)
    assert mix.to_threshold(result, 0.9) == (None, None)
    assert mix.final_rewards(result)["product"] == pytest.approx(0.6) and mix.final_rewards(result)["noisy"] is None


def test_the_script_runs_two_steps_on_the_tiny_model(capsys):
    assert mix.main(["smoke"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and set(summary["groups"]) <= {"product", "sum", "sum3", "repeat", "noisy"}
    # the final evaluation scores every group from the last checkpoint, whichever the draw held
    assert summary["evaluated"] == sorted(mix.MIXES["arithmetic"].groups)
    assert len(summary["groups"]) >= 2


def test_variants_are_compared_with_stock_trl_on_the_seeds_both_ran():
    reached = {
        "stock": {0: (30, 3000.0), 1: (20, 2000.0), 2: (40, 4000.0)},
        "oracle_groups": {0: (20, 2000.0), 1: (10, 1000.0)},
        "policy_groups": {0: (25, 2500.0), 1: (20, 1000.0)},  # seed 2 not run yet
    }
    # seeds 0 and 1: medians 25 / 22.5 steps (x0.9 of stock's 25), 1750 / 2500 tokens; the oracle's gain 10 steps
    line = mix.comparison(reached, "policy_groups")
    assert line == (
        "policy_groups (seeds [0, 1]): steps x0.90, tokens x0.70; 25% of oracle_groups's gain (seeds [0, 1])"
    )
    assert mix.comparison(reached, "stock") == "stock (seeds [0, 1, 2]): steps x1.00, tokens x1.00"


def test_the_spread_is_read_from_the_learnable_groups_final_evaluation():
    def evaluated(product: float, sum_: float) -> dict:
        groups = {"product": product, "sum": sum_, "sum3": 0.0, "repeat": 1.0, "noisy": 0.3}
        return {"eval": {g: {"reward": r, "clean": r} for g, r in groups.items()}}

    # spreads 0.4 and 0.1 (sum3 and repeat are not learnable: not counted), worst groups 0.4 and 0.7
    runs = {1: evaluated(0.8, 0.4), 0: evaluated(0.7, 0.8), 2: {"rewards": [], "max_steps": 1}}  # seed 2: no eval
    expected = "spread 0.250 ([0.1, 0.4]), worst group 0.550 ([0.7, 0.4])"
    assert mix.spread_line(runs, mix.MIXES["arithmetic"]) == expected
    assert mix.spread_line({2: runs[2]}, mix.MIXES["arithmetic"]) is None
