"""With default settings our GRPOTrainer is stock trl.GRPOTrainer: same losses, rewards, grad norms and weights."""

import math
from dataclasses import dataclass

import pytest
import torch
import trl
from datasets import Dataset
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    TrainerCallback,
)

from tests.conftest import length_reward, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows
from trl_grpo_ext.gsm8k.rewards import gsm8k_format

# Timing keys differ between any two runs; every other logged value must match exactly.
TIMING_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def _train(trainer_cls, config_cls, model_dir, output_dir, **overrides):
    # 5 problems, 2 prompts a step: every run crosses epochs, where the prompt order is drawn anew
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(5, seed=3)))
    args = config_cls(**small_grpo_kwargs(output_dir, **overrides))
    trainer = trainer_cls(
        model=model_dir, reward_funcs=[length_reward, gsm8k_format], args=args, train_dataset=dataset
    )
    trainer.train()
    logs = [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in trainer.state.log_history]
    params = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    return logs, params


def _max_abs_diff(logs_a, logs_b, params_a, params_b) -> float:
    assert [sorted(row) for row in logs_a] == [sorted(row) for row in logs_b]
    diffs = [
        abs(a[k] - b[k])
        for a, b in zip(logs_a, logs_b, strict=True)
        for k in a
        if not (math.isnan(a[k]) and math.isnan(b[k]))
    ]
    assert params_a.keys() == params_b.keys()
    diffs += [(params_a[n] - params_b[n]).abs().max().item() for n in params_a]
    return max(diffs)


@pytest.mark.parametrize(
    "overrides", [{}, {"beta": 0.04, "num_iterations": 2, "loss_type": "grpo"}], ids=["default", "kl"]
)
def test_default_settings_reproduce_stock_trl_exactly(tiny_model_dir, tmp_path, overrides):
    logs_trl, params_trl = _train(trl.GRPOTrainer, trl.GRPOConfig, tiny_model_dir, tmp_path / "trl", **overrides)
    logs_ext, params_ext = _train(GRPOTrainer, GRPOConfig, tiny_model_dir, tmp_path / "ext", **overrides)

    # Training happened and moved the weights, so the comparison below is not between two untouched models.
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    assert max((params_ext[n] - initial[n]).abs().max().item() for n in initial) > 1e-4
    assert all(row["reward_std"] > 0 for row in logs_ext if "reward_std" in row)

    max_diff = _max_abs_diff(logs_trl, logs_ext, params_trl, params_ext)
    print(f"max abs difference, trl vs trl_grpo_ext ({overrides or 'defaults'}): {max_diff}")
    assert max_diff == 0.0  # CPU, same seed: every op is deterministic, so the runs are bit for bit the same
    for row_trl, row_ext in zip(logs_trl, logs_ext, strict=True):
        for key in ("loss", "reward", "grad_norm"):
            if key in row_trl:
                assert row_trl[key] == row_ext[key]


def test_trainer_accepts_plain_trl_config(tiny_model_dir, tmp_path):
    """A script that swapped only the trainer import keeps working, with identical results."""
    logs_ext, params_ext = _train(GRPOTrainer, GRPOConfig, tiny_model_dir, tmp_path / "ext", max_steps=2)
    logs_mix, params_mix = _train(GRPOTrainer, trl.GRPOConfig, tiny_model_dir, tmp_path / "mix", max_steps=2)
    assert _max_abs_diff(logs_ext, logs_mix, params_ext, params_mix) == 0.0


@dataclass
class UserConfig(trl.GRPOConfig):
    """A user's own TRL config subclass, with a field and a property."""

    my_weight: float = 2.0

    @property
    def doubled(self) -> float:
        return 2 * self.my_weight


def test_trl_config_and_user_subclass_are_kept_as_they_are(tiny_model_dir, tmp_path):
    args = UserConfig(**small_grpo_kwargs(tmp_path), beta=0.1, scale_rewards=False)
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(8)))
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=[length_reward], args=args, train_dataset=dataset)
    assert trainer.args is args and type(args) is UserConfig
    assert (args.beta, args.scale_rewards, args.doubled) == (0.1, "none", 4.0)
    with pytest.raises(TypeError, match="trl.GRPOConfig"):
        GRPOConfig.add_defaults({"output_dir": "x"})


def test_trl_config_imported_before_register_still_works(tiny_model_dir, tmp_path):
    """README: a name imported before register() keeps TRL's class; our trainer must accept it."""
    from trl import GRPOConfig as TRLConfig

    import trl_grpo_ext

    trl_grpo_ext.register()
    try:
        from trl import GRPOTrainer as RegisteredTrainer

        args = TRLConfig(**small_grpo_kwargs(tmp_path, max_steps=1))
        dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(8)))
        trainer = RegisteredTrainer(
            model=tiny_model_dir, reward_funcs=[length_reward], args=args, train_dataset=dataset
        )
        assert type(trainer) is GRPOTrainer and trainer.args is args
        trainer.train()
        assert trainer.state.global_step == 1
    finally:
        trl_grpo_ext.unregister()


def test_trainer_is_a_trl_grpo_trainer(tiny_model_dir, tmp_path):
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(8)))
    args = GRPOConfig(**small_grpo_kwargs(tmp_path))
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=[length_reward], args=args, train_dataset=dataset)
    assert isinstance(trainer, trl.GRPOTrainer)
    assert isinstance(trainer.args, GRPOConfig)


async def async_length_reward(completions, **kwargs):
    return [len(c[0]["content"]) % 3 / 3 for c in completions]


class RecordingCallback(TrainerCallback):
    def __init__(self):
        self.logged_steps = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logged_steps.append(state.global_step)


def test_every_reward_form_and_callbacks_match_stock_trl(tiny_model_dir, tmp_path):
    """A reward model (path), a sync and an async reward function with weights, and a callback, in both trainers."""
    reward_model_dir = tmp_path / "reward-model"
    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=1)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(reward_model_dir)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(reward_model_dir)
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16, seed=4)))

    runs = []
    for trainer_cls, config_cls in [(trl.GRPOTrainer, trl.GRPOConfig), (GRPOTrainer, GRPOConfig)]:
        callback = RecordingCallback()
        args = config_cls(**small_grpo_kwargs(tmp_path / trainer_cls.__module__, reward_weights=[0.5, 1.0, 2.0]))
        trainer = trainer_cls(
            model=tiny_model_dir,
            reward_funcs=[str(reward_model_dir), length_reward, async_length_reward],
            args=args,
            train_dataset=dataset,
            callbacks=[callback],
        )
        trainer.train()
        logs = [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in trainer.state.log_history]
        runs.append((logs, dict(trainer.model.named_parameters()), callback.logged_steps))

    (logs_trl, params_trl, steps_trl), (logs_ext, params_ext, steps_ext) = runs
    assert steps_trl == steps_ext == [1, 2, 3]
    reward_model_key = "rewards/reward-model/mean"
    assert all(reward_model_key in row and "rewards/async_length_reward/mean" in row for row in logs_ext[:-1])
    assert _max_abs_diff(logs_trl, logs_ext, params_trl, params_ext) == 0.0
