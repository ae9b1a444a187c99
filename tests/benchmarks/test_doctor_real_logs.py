"""The run doctor's real-model logs (issue #70, benchmarks/doctor/doctor_detection.py): each SmolLM2 run labelled
from its own reward log and metrics, by the doctor page's definitions applied to the whole run."""

import importlib.util

from tests.conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("doctor_detection", REPO_ROOT / "benchmarks/doctor/doctor_detection.py")
detection = importlib.util.module_from_spec(spec)
spec.loader.exec_module(detection)


def result(lucky: int, clipped: tuple[float, float], groups: bool = True) -> dict:
    """40 steps; per step two prompts of 'hard' (4 completions each, all 0 but `lucky` of the 80 generation groups
    with one right answer) and two of 'easy' (always split); the clipped ratio of each half of the run."""
    rewards = []
    for step in range(1, 41):
        hard = [0.0] * 8
        if step <= lucky:
            hard[0] = 1.0
        rewards.append({"step": step, "rewards": {"hard": hard, "easy": [0.0, 1.0, 0.0, 1.0] * 2}})
    steps = [{"completions/clipped_ratio": clipped[step > 20], "entropy": 1.0,
              **({"policy_groups/hard/zero_std_frac": 1.0} if groups else {})} for step in range(1, 41)]  # fmt: skip
    return {"rewards": rewards, "steps": steps}


def test_a_group_whose_generation_groups_agree_is_labelled_without_signal_and_a_lucky_one_either_way():
    assert detection.real_model_labels(result(lucky=0, clipped=(0.1, 0.1))) == (["no_signal_group"], [])
    # 4 lucky answers in 80 generation groups: 95% agreed, still none
    assert detection.real_model_labels(result(lucky=4, clipped=(0.1, 0.1))) == (["no_signal_group"], [])
    # 6 in 80: 92.5%, either verdict; 10 in 80: 87.5%, a group with signal
    assert detection.real_model_labels(result(lucky=6, clipped=(0.1, 0.1))) == ([], ["no_signal_group"])
    assert detection.real_model_labels(result(lucky=10, clipped=(0.1, 0.1))) == ([], [])
    # without policy groups in the log, the doctor cannot name a group: no label
    assert detection.real_model_labels(result(lucky=0, clipped=(0.1, 0.1), groups=False)) == ([], [])


def test_truncation_is_labelled_where_the_share_cut_stays_and_not_where_it_is_learnt_away():
    assert detection.real_model_labels(result(10, clipped=(0.7, 0.65), groups=False)) == (["truncation"], [])
    assert detection.real_model_labels(result(10, clipped=(0.6, 0.41), groups=False)) == ([], [])  # fell 32%
    assert detection.real_model_labels(result(10, clipped=(0.15, 0.15), groups=False)) == ([], [])  # under 20%


def test_a_run_that_ends_solved_is_labelled_without_signal_from_its_last_steps():
    def ends(solved_from: int) -> dict:
        rewards = [{"step": step, "rewards": {"easy": [1.0] * 16 if step >= solved_from else [0.0, 1.0, 1.0, 1.0] * 4}}
                   for step in range(1, 41)]  # fmt: skip
        return {"rewards": rewards, "steps": [{"completions/clipped_ratio": 0.0, "entropy": 1.0}] * 40}

    # every generation group agreed over steps 36-40 (12% of the run): the run ends without signal
    assert detection.real_model_labels(ends(36)) == (["no_signal"], [])
    # over steps 37-40 only, and step 36 split: the last 5 steps are not all in the state
    assert detection.real_model_labels(ends(37)) == ([], [])


def test_an_entropy_near_the_collapse_line_is_accepted_either_way():
    """The last 5 steps' mean entropy over the first 3 steps': at most 8% (0.8 x the 10% line) a collapse, 8-12%
    either verdict (the doctor's window mean differs from the last 5 steps' by up to that much), above 12% none."""

    def ends_at(share: float) -> dict:
        entropy = [2.0] * 3 + [1.0] * 32 + [2.0 * share] * 5
        return {"rewards": [{"step": step, "rewards": {"easy": [0.0, 1.0, 0.0, 1.0]}} for step in range(1, 41)],
                "steps": [{"completions/clipped_ratio": 0.0, "entropy": e} for e in entropy]}  # fmt: skip

    assert detection.real_model_labels(ends_at(0.07)) == (["entropy_collapse"], [])
    assert detection.real_model_labels(ends_at(0.09)) == ([], ["entropy_collapse"])
    assert detection.real_model_labels(ends_at(0.115)) == ([], ["entropy_collapse"])
    assert detection.real_model_labels(ends_at(0.13)) == ([], [])
