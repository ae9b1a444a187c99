"""The real-model benchmarks of issue #70 (each safeguard in the regime it exists for): their figures on hand-made
logs and a 2-step smoke of each script on the tiny model (the grids themselves run SmolLM2-135M, outside CI)."""

import importlib.util
import json
import math

import pytest

from tests.conftest import REPO_ROOT


def _load(path: str):
    spec = importlib.util.spec_from_file_location(path.rsplit("/", 1)[-1].removesuffix(".py"), REPO_ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


collapse = _load("benchmarks/entropy/collapse_smollm2.py")
spikes = _load("benchmarks/grad_reg/spikes_smollm2.py")
epochs = _load("benchmarks/prompt_skip/epochs_smollm2.py")


def test_the_narrow_task_holds_out_42_of_its_162_prompts_for_every_variant_alike():
    trained, held_out = collapse.narrow_rows(), collapse.narrow_rows(held_out=True)
    assert (len(trained), len(held_out)) == (120, 42)
    texts = {row["prompt"][0]["content"] for row in trained}
    assert not texts & {row["prompt"][0]["content"] for row in held_out}
    assert held_out == collapse.narrow_rows(held_out=True)  # seeded: the same for every run
    for regime in collapse.MIXES.values():
        assert regime.eval_rows() == held_out and regime.base == collapse.REGIMES[regime.results.name]


def test_entropy_figures_read_the_lowest_five_step_mean_against_the_target():
    # entropy 2.0 at step 1 (target 0.3), falling to 0.2 over steps 6-10, then back up: lowest 5-step mean 0.2
    entropy = [2.0, 1.5, 1.0, 0.6, 0.4, 0.2, 0.2, 0.2, 0.2, 0.2, 0.5, 0.6, 0.7, 0.8, 0.9]
    rows = [{"entropy": e, "reward": 0.1 * i} for i, e in enumerate(entropy)]
    result = {"steps": rows, "eval": {"arith": {"pass@4": 0.5, "reward": 0.25, "distinct": 0.75}}}
    figures = collapse.entropy_figures(result)
    assert figures["target"] == pytest.approx(0.3)
    assert figures["lowest_share"] == pytest.approx(0.2 / 0.3)
    assert figures["final_entropy"] == pytest.approx(0.7) and figures["final_reward"] == pytest.approx(1.2)
    assert (figures["pass@4"], figures["held_out"], figures["distinct"]) == (0.5, 0.25, 0.75)
    assert collapse.entropy_figures({"steps": rows})["pass@4"] is None  # not evaluated yet


def test_spike_figures_count_spikes_drops_and_divergence():
    norms = [1.0] * 10 + [8.0] + [1.0] * 9
    rewards = [0.1 * i for i in range(10)] + [0.9] * 5 + [0.2] * 5  # best 5-step mean 0.9, then down to 0.2
    rows = [{"grad_norm": n, "reward": r, "loss": 0.0} for n, r in zip(norms, rewards, strict=True)]
    figures = spikes.spike_figures({"steps": rows, "eval": {"a": {"reward": 0.4}, "b": {"reward": 0.2}}})
    assert figures["max_over_median"] == pytest.approx(8.0) and figures["spikes"] == 1
    assert figures["peak_step"] == 11 and figures["silent"] == 0
    assert figures["worst_drop"] == pytest.approx(0.7) and figures["final_reward"] == pytest.approx(0.2)
    assert figures["diverged"] == 1.0  # the last 5 steps' mean is below half the best
    assert figures["evaluated"] == pytest.approx(0.3)
    healthy = [{"grad_norm": 1.0, "reward": 0.5, "loss": 0.0}] * 10
    assert spikes.spike_figures({"steps": healthy})["diverged"] == 0.0
    nan = healthy[:5] + [{"grad_norm": math.nan, "reward": 0.5, "loss": math.nan}] + healthy[:4]
    assert spikes.spike_figures({"steps": nan})["diverged"] == 1.0  # a non-finite loss or norm diverges
    # a collapsed run: every group alike from step 6, its norm 0; the median is of the steps with a gradient
    norms, rewards = [0.2, 0.4, 0.3, 1.6, 0.5] + [0.0] * 5, [0.3] * 5 + [0.0] * 5
    silent = [{"grad_norm": n, "reward": r, "loss": 0.0} for n, r in zip(norms, rewards, strict=True)]
    figures = spikes.spike_figures({"steps": silent})
    assert figures["max_over_median"] == pytest.approx(1.6 / 0.4) and figures["peak_step"] == 4
    assert (figures["silent"], figures["spikes"], figures["diverged"]) == (5, 0, 1.0)


def test_zclip_replayed_on_logged_norms_clips_where_a_zclip_run_first_would():
    # 10 steady norms then one 5x: the z-score passes 2.5 only once the warm-up has ended before it
    rows = [{"grad_norm": 1.0 + 0.01 * (i % 2)} for i in range(10)] + [{"grad_norm": 5.0}]
    assert spikes.zclip_first_clip({"steps": rows}, 5) == 11
    assert spikes.zclip_first_clip({"steps": rows}, 25) is None  # still warming up


def test_the_spike_census_reads_each_regimes_runs_and_skips_an_empty_one(tmp_path):
    folder = tmp_path / spikes.CENSUS[2][1]
    folder.mkdir(parents=True)
    for seed, peak in enumerate([2.0, 6.0]):
        rows = [{"grad_norm": n, "reward": 0.5, "loss": 0.0} for n in [1.0] * 9 + [peak]]
        (folder / f"stock_seed{seed}.json").write_text(json.dumps({"steps": rows}))
    (folder / "stock.txt").write_text("not a run")
    assert spikes.spike_census(tmp_path) == [f"{spikes.CENSUS[2][0]}: 2 runs, largest norm 6.00x its run's median, "
                                             "1 steps over 5x"]  # fmt: skip


def test_the_epochs_set_brings_its_64_prompts_back_five_times_in_40_steps():
    rows = epochs.epoch_rows()
    assert len(rows) == 64 and len({row["prompt"][0]["content"] for row in rows}) == 64
    counts = {task: sum(row["task"] == task for row in rows) for task in epochs.EPOCHS.groups}
    assert counts == {"single": 32, "two_digit": 16, "three_digit": 16}
    assert epochs.EPOCHS.max_steps * 8 == 5 * len(rows)  # 8 prompts a step


def test_the_skip_bound_keeps_only_the_tokens_of_groups_that_disagreed():
    # one completion of `single` a step, right from step 3; 10 tokens a completion; half the groups disagree
    rewards = [{"step": s, "rewards": {"single": [1.0 if s >= 3 else 0.0]}} for s in range(1, 7)]
    rows = [{"completions/mean_length": 10.0, "frac_reward_zero_std": 0.5}] * 6
    result = {"max_steps": 6, "rewards": rewards, "steps": rows}
    # the 5-step pooled mean reaches 0.6 at step 5 (3 of 5 right): 5 steps x 10 tokens x 32 completions x 0.5
    assert epochs.bound_tokens(result, 0.6) == pytest.approx(5 * 10 * epochs.COMPLETIONS * 0.5)
    assert epochs.bound_tokens(result, 1.1) is None
    # a rule that must see each prompt once: the first 2 steps whole, steps 3-5 halved
    assert epochs.bound_tokens(result, 0.6, seen_first=2) == pytest.approx((2 + 3 * 0.5) * 10 * epochs.COMPLETIONS)


def test_the_epochs_variants_are_stock_trl_the_readme_setting_the_group_test_and_the_posterior_rule():
    assert epochs.EPOCHS.variants["prompt_skip"] == {"prompt_skip": True}
    assert epochs.EPOCHS.variants["posterior"] == {"prompt_skip": True, "prompt_skip_rule": "posterior"}
    groups = epochs.EPOCHS.variants["groups"]
    assert groups["policy_group_column"] == "task" and groups["policy_group_sampling"] == "uniform"
    assert groups["prompt_skip_group_informative"] == 0.2
    assert len(epochs.epoch_rows()) == epochs.EPOCH_STEPS * 8  # the first epoch: every prompt once


@pytest.mark.parametrize(
    ("module", "mix", "variant"),
    [
        (collapse, "lr1e-3", "entropy"),
        (spikes, "lr3e-3", "zclip"),
        (epochs, "epochs", "prompt_skip"),
        (epochs, "epochs", "groups"),
        (epochs, "epochs", "posterior"),
    ],
    ids=["entropy_collapse", "zclip_spikes", "prompt_skip_epochs", "prompt_skip_epochs_groups", "posterior_epochs"],
)
def test_each_script_runs_two_steps_of_its_readme_setting_on_the_tiny_model(module, mix, variant, capsys):
    mixes = {"epochs": epochs.EPOCHS} if module is epochs else module.MIXES
    assert module.main(["smoke", "--mix", mix, "--variant", variant], mixes) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2
    assert summary["evaluated"] == sorted(mixes[mix].groups)  # every group evaluated from the last checkpoint


def test_the_phases_count_the_groups_generated_and_the_share_that_agreed():
    # 40 steps of 10-token completions: stock TRL's 8 groups a step; from step 25 a skipping rule generates half of
    # them (16 completions), with the share of agreeing groups 0.5 before and 0.25 after
    def row(step: int) -> dict:
        skipping = step > 24
        return {"completions/mean_length": 10.0, "frac_reward_zero_std": 0.25 if skipping else 0.5,
                "prompt_skip/completion_tokens": 10.0 * (16 if skipping else 32)}  # fmt: skip

    figures = epochs.phase_figures({"steps": [row(step) for step in range(1, 41)]})
    assert figures == [pytest.approx((64, 0.5)), pytest.approx((128, 0.5)), pytest.approx((64, 0.25))]
