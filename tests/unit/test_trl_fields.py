"""Issue #71, item 3: TRL's and transformers' own number fields are checked when the config is built (before any model
loads), with one message naming the field and the value; numbers in YAML mappings are read as YAML 1.2 reads them;
values stock TRL takes that only mislead get a warning. The entry points' one line:
`tests/training/test_trl_fields_cli.py`.
"""

import dataclasses
import math
import typing
import warnings

import pytest
import yaml

from trl_grpo_ext import GRPOConfig
from trl_grpo_ext.config import TRLGRPOConfig
from trl_grpo_ext.trl_fields import TRL_FIELD_RANGES, UNCHECKED_FIELDS

BASE = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, num_generations=4, per_device_train_batch_size=4)

# (field, value, what the message says is allowed): the values, then more of the class, written out by hand
REFUSED = [
    ("learning_rate", math.nan, "a finite number >= 0"),
    ("learning_rate", -1e-5, "a finite number >= 0"),
    ("adam_beta1", 1.5, "a finite number in [0, 1)"),
    ("top_k", -1, "an integer >= 0"),
    ("repetition_penalty", 0, "a finite number > 0"),
    ("min_p", 2, "a finite number in [0, 1]"),
    ("beta", -0.1, "a finite number >= 0"),
    ("epsilon", -0.2, "a finite number >= 0"),
    ("weight_decay", -1, "a finite number >= 0"),
    ("top_p", 1.5, "a finite number in (0, 1]"),
    ("max_grad_norm", -1, "a finite number >= 0"),
    ("max_grad_norm", math.nan, "a finite number >= 0"),
    ("max_grad_norm", True, "a finite number >= 0"),
    # more of the class
    ("learning_rate", math.inf, "a finite number >= 0"),
    ("adam_beta2", 1.0, "a finite number in [0, 1)"),
    ("adam_epsilon", -1e-8, "a finite number >= 0"),
    ("temperature", math.inf, "a finite number > 0"),
    ("top_p", 0, "a finite number in (0, 1]"),
    ("top_k", 2.5, "an integer >= 0"),
    ("min_p", -0.1, "a finite number in [0, 1]"),
    ("beta", math.nan, "a finite number >= 0"),
    ("epsilon_high", -1, "a finite number >= 0"),
    ("delta", 0.5, "a finite number > 1"),
    ("num_train_epochs", -1, "a finite number >= 0"),
    ("warmup_steps", math.nan, "a finite number >= 0 (a whole number from 1)"),
    ("logging_steps", -1, "a finite number > 0 (a whole number from 1)"),
    ("save_steps", 0, "a finite number > 0 (a whole number from 1)"),
    ("seed", -1, "an integer in [0, 4294967295]"),
    ("label_smoothing_factor", 1.5, "a finite number in [0, 1)"),
    ("top_entropy_quantile", 1.5, "a finite number in [0, 1]"),
    ("vllm_gpu_memory_utilization", 1.5, "a finite number in (0, 1]"),
    ("ref_model_mixup_alpha", 2, "a finite number in [0, 1]"),
    ("sapo_temperature_neg", 0, "a finite number > 0"),
    ("per_device_eval_batch_size", 0, "an integer >= 1"),
    ("dataloader_num_workers", -1, "an integer >= 0"),
]


@pytest.mark.parametrize(("name", "value", "allowed"), REFUSED, ids=[f"{n}={v}" for n, v, _ in REFUSED])
def test_an_impossible_value_of_a_trl_field_is_refused_at_config_time(name, value, allowed):
    with pytest.raises(ValueError, match=r"^(.*)$") as raised:
        GRPOConfig(**{**BASE, name: value})
    message = str(raised.value)
    assert message.startswith(f"{name} (") and f") must be {allowed}, got {value!r}" in message, message
    with pytest.raises(ValueError):  # the same value on TRL's own config given to our trainer (`add_defaults`)
        GRPOConfig.add_defaults(_trl_config(name, value))


def _trl_config(name, value):
    config = TRLGRPOConfig(**BASE)
    setattr(config, name, value)
    return config


@pytest.mark.parametrize(
    ("name", "value"),
    [("max_grad_norm", 0.0), ("top_k", 0), ("min_p", 0.0), ("min_p", 1.0), ("top_p", 1.0), ("beta", 0.0),
     ("epsilon", 0.0), ("adam_beta1", 0.0), ("seed", 2**32 - 1), ("warmup_steps", 0.1), ("entropy_coef", -0.01)],
)  # fmt: skip
def test_edge_values_trl_takes_are_accepted_unchanged(name, value):
    assert getattr(GRPOConfig(**{**BASE, name: value}), name) == value


def test_every_number_field_of_trl_has_a_range_or_a_reason():
    """The class, not the cases: a number field TRL adds (or one this list forgets) fails here until it is declared."""
    hints = typing.get_type_hints(TRLGRPOConfig)
    numeric = set()
    for f in dataclasses.fields(TRLGRPOConfig):
        kinds = typing.get_args(hints[f.name]) or (hints[f.name],)
        kinds = {typing.get_origin(kind) or kind for kind in kinds}
        if kinds & {int, float} or hints[f.name] == list[float] | None:
            numeric.add(f.name)
    assert numeric == set(TRL_FIELD_RANGES) | set(UNCHECKED_FIELDS), (
        f"undeclared: {sorted(numeric - set(TRL_FIELD_RANGES) - set(UNCHECKED_FIELDS))}, "
        f"not fields: {sorted((set(TRL_FIELD_RANGES) | set(UNCHECKED_FIELDS)) - numeric)}"
    )
    assert not set(TRL_FIELD_RANGES) & set(UNCHECKED_FIELDS)


def test_yaml_numbers_in_mappings_and_lists_are_read_as_numbers():
    """PyYAML reads YAML 1.1, where `9e-1` is the string '9e-1'; TRL handed it to generate, which failed after the
    model loaded (TRL PR #1450)."""
    loaded = yaml.safe_load("generation_kwargs: {top_p: 9e-1, top_k: 20}\nlr_scheduler_kwargs: {min_lr: 1e-6}\n"
                            "reward_weights: [1e-1, 2]\n")  # fmt: skip
    assert loaded["generation_kwargs"]["top_p"] == "9e-1"  # what YAML 1.1 gives
    config = GRPOConfig(**BASE, **loaded)
    assert config.generation_kwargs == {"top_p": 0.9, "top_k": 20}
    assert config.lr_scheduler_kwargs == {"min_lr": 1e-6}
    assert config.reward_weights == [0.1, 2]
    assert GRPOConfig(**BASE, generation_kwargs={"top_p": "0.9"}).generation_kwargs == {"top_p": 0.9}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"top_p": "9e0"}, "generation_kwargs top_p (nucleus sampling's probability mass; 1 keeps every token) must be "
                        "a finite number in (0, 1], got 9.0"),
     ({"top_p": "ninety"}, "generation_kwargs top_p (nucleus sampling's probability mass; 1 keeps every token) must "
                           "be a finite number in (0, 1], got 'ninety'"),
     ({"top_k": -1}, "generation_kwargs top_k (tokens top-k sampling keeps; 0 keeps every token) must be an integer "
                     ">= 0, got -1")],
)  # fmt: skip
def test_sampling_settings_in_generation_kwargs_are_checked_as_trls_fields(kwargs, message):
    with pytest.raises(ValueError) as raised:
        GRPOConfig(**BASE, generation_kwargs=kwargs)
    assert str(raised.value) == message


def test_reward_weights_must_be_finite_numbers():
    for weights, shown in (([1.0, math.nan], "nan"), ([True], "True"), (["heavy"], "'heavy'")):
        with pytest.raises(ValueError) as raised:
            GRPOConfig(**BASE, reward_weights=weights)
        index = weights.index(next(w for w in weights if not isinstance(w, float) or math.isnan(w)))
        assert str(raised.value).startswith(f"reward_weights[{index}] must be a finite number") and shown in str(
            raised.value
        )


@pytest.mark.parametrize(
    ("settings", "warning"),
    [({"learning_rate": 0.0}, "learning_rate=0 trains nothing"),
     ({"epsilon_high": 0.1}, "epsilon_high=0.1 is below epsilon=0.2"),
     ({"delta": 1.1}, "delta=1.1 is at most 1 + epsilon (1.2)"),
     ({"save_total_limit": 0, "save_strategy": "steps"}, "save_total_limit=0 keeps every checkpoint")],
)  # fmt: skip
def test_values_stock_trl_takes_that_only_mislead_warn(settings, warning):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOConfig(**BASE, **settings)
    assert any(str(w.message).startswith(warning) for w in caught), [str(w.message) for w in caught]
    with warnings.catch_warnings(record=True) as caught:  # the defaults: no such warning
        warnings.simplefilter("always")
        GRPOConfig(**BASE)
    assert not any(str(w.message).startswith(warning.split("=")[0] + "=") for w in caught)
