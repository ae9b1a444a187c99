"""Issue #57.5: `--features off` runs a preset as stock TRL GRPO: every trl_grpo_ext setting back to its default,
every TRL, transformers and model setting the preset's."""

import dataclasses

import pytest

from tests.conftest import REPO_ROOT
from tests.training.test_recipes import load_recipe
from trl_grpo_ext import GRPOConfig
from trl_grpo_ext.config import own_fields

PRESET = str(REPO_ROOT / "recipes/configs/gsm8k-24gb.yaml")
DEMO = str(REPO_ROOT / "recipes/configs/demo_cpu.yaml")
# what gsm8k-24gb.yaml turns on: policy groups, the entropy target, ZClip, fast generation, the run doctor
PRESET_FEATURES = {
    "policy_group_column": "difficulty",
    "entropy_reg": ["target"],
    "entropy_target_ratio": 0.15,
    "grad_reg": ["zclip"],
    "generation_compile": True,
    "generation_max_prompt_length": 320,
    "generation_lora_merge": "copy",
    "run_doctor": True,
}


def default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def test_features_off_resets_every_setting_of_ours_and_keeps_the_presets_own():
    recipe = load_recipe("math_gsm8k")
    argv = ["--config", PRESET, "--use_cpu", "true"]  # --use_cpu: the preset's bf16 is checked against this machine
    preset_script, preset, preset_model = recipe.make_parser().parse_args_and_config(argv)
    script_args, training_args, model_args = recipe.make_parser().parse_args_and_config([*argv, "--features", "off"])
    assert (preset_script.features, script_args.features) == ("on", "off")

    assert recipe.features_off(training_args) == PRESET_FEATURES
    ours = {f.name: default(f) for f in own_fields()}
    assert set(PRESET_FEATURES) <= set(ours) and "num_generations" not in ours
    for f in dataclasses.fields(GRPOConfig):
        expected = ours[f.name] if f.name in ours else getattr(preset, f.name)
        assert getattr(training_args, f.name) == expected, f.name
    assert model_args == preset_model
    assert dataclasses.replace(script_args, features="on") == preset_script
    assert recipe.features_off(training_args) == {}  # already stock


@pytest.mark.parametrize(("value", "expected"), [("off", "off"), ("on", "on"), ("false", "off")])
def test_features_reads_yaml_and_command_line_values(tmp_path, value, expected):
    config = tmp_path / "demo.yaml"
    config.write_text(f"{(REPO_ROOT / 'recipes/configs/demo_cpu.yaml').read_text()}\nfeatures: {value}\n")
    script_args, _, _ = load_recipe("math_gsm8k").make_parser().parse_args_and_config(["--config", str(config)])
    assert script_args.features == expected  # YAML reads a bare off / on as false / true


def test_features_refuses_another_value():
    with pytest.raises(ValueError, match="features must be on or off .*, got 'of'"):
        load_recipe("math_gsm8k").make_parser().parse_args_and_config(["--config", DEMO, "--features", "of"])


def test_a_demo_run_with_features_off_trains_with_no_feature(tmp_path, monkeypatch, capsys):
    recipe = load_recipe("math_gsm8k")
    built = []

    class RecordedTrainer(recipe.GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(recipe, "GRPOTrainer", RecordedTrainer)
    out = tmp_path / "run"
    argv = ["--config", DEMO, "--output_dir", str(out), "--synthetic_problems", "16", "--max_steps", "2",
            "--eval_limit", "0", "--features", "off"]  # fmt: skip
    recipe.main(*recipe.make_parser().parse_args_and_config(argv))
    printed = capsys.readouterr().out
    # the demo turns policy groups and the run doctor on
    assert (
        "features off: stock TRL GRPO; trl_grpo_ext settings reset to their defaults: "
        "policy_group_column='difficulty', run_doctor=True\n" in printed
    )
    (trainer,) = built
    assert trainer.features == {} and trainer.state.global_step == 2
    assert not (out / "policy_groups.png").exists() and (out / "training_metrics.jsonl").is_file()
