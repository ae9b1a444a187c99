"""Issue #14: every field this package adds to `GRPOConfig` is checked by its type and declared range, feature on or
off. Nine values of the wrong kind or out of range go to every field: each that the field cannot take is refused with
a `ValueError` naming the field, the value and what is allowed; the edge values each field can take are accepted.

The expectations below are written out by hand for each field (not derived from the declarations they check)."""

import dataclasses
import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig
from trl_grpo_ext.composition import FeatureFields
from trl_grpo_ext.config import FEATURE_CONFIGS, TRLGRPOConfig, own_fields
from trl_grpo_ext.field_checks import ConfigPart, Range, allowed, check_field

# the nine values, by name
WRONG = {
    "nan": math.nan,
    "inf": math.inf,
    "-1": -1,
    "-0.5": -0.5,
    "1e12": 1e12,
    "string": "abc",
    "2.5": 2.5,
    "list": [1],
    "dict": {"a": 1},
}
# field -> (names of the nine values the field can take, edge values it takes, settings of other fields those need,
#           what the error says is allowed)
INT_1 = "an integer >= 1"
FIELDS = {
    "policy_group_column": (["string"], [None, "task"], {"remove_unused_columns": False},
                            "a non-empty string, or None"),
    "policy_group_features": ([], [None, "tfidf"], {"remove_unused_columns": False}, "one of ['tfidf'], or None"),
    "num_policy_groups": ([], [2, 8], {}, INT_1),
    "policy_group_sampling": ([], ["learnability", "progress", "uniform"], {},
                              "one of ['learnability', 'progress', 'uniform']"),
    "policy_group_sampling_floor": ([], [0.0, 1.0], {}, "a finite number in [0, 1]"),
    "policy_group_halflife": (["2.5"], [1e-3, 1e9], {}, "a finite number in (0, 1000000000]"),
    "policy_group_loss_weighting": ([], [True, False, "true", "no"], {}, "true or false"),
    "policy_group_eta": ([], [1e-6, 1.0], {}, "a finite number in (0, 1]"),
    "policy_group_update_steps": ([], [1], {}, INT_1),
    "policy_group_regroup_steps": ([], [None, 1], {}, INT_1 + ", or None"),
    "policy_group_merge_tol": (["2.5"], [0.0, 1e6], {}, "a finite number in [0, 1000000]"),
    "policy_group_split_gap": ([], [1e-6, 1.0], {}, "a finite number in (0, 1]"),
    "policy_group_min_size": ([], [1], {}, INT_1),
    "max_policy_groups": ([], [4, 1000], {}, INT_1),
    "min_policy_groups": ([], [1, 4], {}, INT_1),
    "policy_group_warmup_steps": ([], [None, 1], {}, INT_1 + ", or None"),
    "policy_group_fusion_start": ([], [None, 1e-9, 0.999, 1, 1e9], {},
                                  "a finite number in (0, 1000000000] (a whole number from 1), or None"),
    "policy_group_fusion_anneal_steps": ([], [0], {}, "an integer >= 0"),
    "prompt_skip": ([], [True, False, "true", "no"], {"remove_unused_columns": False}, "true or false"),
    "prompt_skip_rule": ([], ["streak", "posterior"], {}, "one of ['streak', 'posterior']"),
    "prompt_skip_target": ([], [0.0, 0.999], {}, "a finite number in [0, 1)"),
    "prompt_skip_initial_keep": ([], [1e-6, 1.0], {"prompt_skip_min_keep": 1e-6}, "a finite number in (0, 1]"),
    "prompt_skip_adapt_step": ([], [1e-6, 1.0], {}, "a finite number in (0, 1]"),
    "prompt_skip_failing_grace": ([], [0, 100], {}, "an integer >= 0"),
    "prompt_skip_hopeless": ([], [True, False, "true", "no"], {}, "true or false"),
    "prompt_skip_min_keep": ([], [1e-6, 0.5], {}, "a finite number in (0, 1]"),
    "prompt_skip_first_visit": ([], [True, False, "true", "no"], {}, "true or false"),
    "prompt_skip_group_informative": ([], [0.0, 0.999], {}, "a finite number in [0, 1)"),
    "prompt_skip_refill": ([], [True, False, "true", "no"], {}, "true or false"),
    "entropy_reg": ([], [[], "target", ["advantage", "clip_cov"], "kl_cov,target"], {}, "entropy_reg "),
    "entropy_target_ratio": ([], [1e-6, 1.0], {"entropy_reg": "target"}, "a finite number in (0, 1], or None"),
    "entropy_target_window": ([], [1], {}, INT_1),
    "entropy_target_per_group": ([], [False, True], {"entropy_reg": "target"}, "true or false"),
    "entropy_pi_kp": (["2.5"], [0.0, 1000.0], {}, "a finite number in [0, 1000]"),
    "entropy_pi_ki": (["2.5"], [0.0, 1000.0], {}, "a finite number in [0, 1000]"),
    "entropy_pi_horizon": (["2.5"], [0.0, 1e4], {}, "a finite number in [0, 10000]"),
    "entropy_pi_noise_band": (["2.5"], [0.0, 100.0], {}, "a finite number in [0, 100]"),
    "clip_cov_ratio": ([], [1e-6, 1.0], {}, "a finite number in (0, 1]"),
    "clip_cov_lb": (["-1", "-0.5", "2.5"], [-1e9, 4.99], {}, "a finite number in [-1000000000, 1000000000]"),
    "clip_cov_ub": (["-1", "-0.5", "2.5"], [1e9, -0.99], {"clip_cov_lb": -1.0 - 1e-6},
                    "a finite number in [-1000000000, 1000000000]"),
    "kl_cov_ratio": ([], [1e-6, 1.0], {}, "a finite number in (0, 1]"),
    "kl_cov_coef": (["2.5"], [0.0, 1000.0], {}, "a finite number in [0, 1000]"),
    "entropy_advantage_coef": (["2.5"], [0.0, 1000.0], {}, "a finite number in [0, 1000]"),
    "entropy_advantage_kappa": (["2.5"], [1.0, 1e6], {}, "a finite number in [1, 1000000]"),
    "grad_reg": ([], [[], "zclip", ["agc", "skip_nonfinite"]], {}, "grad_reg "),
    "zclip_alpha": ([], [1e-6, 0.999], {}, "a finite number in (0, 1)"),
    "zclip_z_threshold": (["2.5"], [1e-6, 1000.0], {}, "a finite number in (0, 1000]"),
    "zclip_warmup_steps": ([], [2], {}, "an integer >= 2"),
    "agc_clip": (["2.5"], [1e-6, 1000.0], {}, "a finite number in (0, 1000]"),
    "agc_eps": ([], [1e-9, 1.0], {}, "a finite number in (0, 1]"),
    "grad_reg_max_skips": ([], [1], {}, INT_1),
    "kl_target": (["2.5"], [None, 1e-6, 1000.0], {"beta": 0.04}, "a finite number in (0, 1000], or None"),
    "kl_horizon": ([], [1], {}, INT_1),
    "generation_compile": ([], [True, False, "false", "1"], {}, "true or false"),
    "generation_max_prompt_length": ([], [None, 1], {}, INT_1 + ", or None"),
    "generation_lora_merge": ([], ["none", "inplace", "copy"], {}, "one of ['none', 'inplace', 'copy']"),
    "generation_fallback": ([], [True, False, "false", "1"], {}, "true or false"),
    "vllm_lora_sync": ([], ["merge"], {}, "one of ['merge', 'adapter']"),
    "run_doctor": ([], [True, False, "true", "0"], {}, "true or false"),
}  # fmt: skip

CASES = [(name, label) for name in FIELDS for label in WRONG]


def _config(tmp_path, **fields) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **fields)


def test_the_table_covers_every_field_of_this_package():
    """Each row of the table names a field of this package, and each field of the package when the table was last
    written has a row; a new field needs none: `test_every_declared_range_is_enforced_at_its_edges` tries it from
    its declaration (issue #61: a feature is its folder plus its lines in `STEP`)."""
    assert set(FIELDS) <= {f.name for f in own_fields()}
    assert len(CASES) == 9 * len(FIELDS)


def _edges(spec, integer: bool) -> list[tuple[float, bool]]:
    """(value, accepted) at and just beyond each finite end of `spec` (a `field_checks.Range`): an integer field's
    least value and the one below it; a number field's ends (accepted unless open) and a value just outside each."""
    if integer:
        return [(spec.low, True), (spec.low - 1, False)] if spec.low is not None else []
    edges = []
    for end, is_open, outward in ((spec.low, spec.low_open, -1), (spec.high, spec.high_open, 1)):
        if end is not None:
            edges += [(end, not is_open), (end + outward * max(abs(end), 1.0) * 1e-6, False)]
    return edges


@pytest.mark.parametrize("part", FEATURE_CONFIGS, ids=[part.fields.__name__ for part in FEATURE_CONFIGS])
def test_every_declared_range_is_enforced_at_its_edges(tmp_path, part):
    """Every number field of every part (`GRPOConfig`'s bases), from its declared `Range` alone: each finite end is
    taken (`field_checks.check_field`) unless open, and a config holding a value just beyond it is refused before
    anything loads, with "<field> must be <what it allows>, got <value>"."""
    tried = 0
    for f in dataclasses.fields(part.fields):
        spec = part.ranges.get(f.name)
        if spec is None:
            continue
        annotation = part.hints()[f.name]
        integer = allowed(annotation, spec, None).startswith("an integer")
        for value, accepted in _edges(spec, integer):
            value = int(value) if integer else float(value)
            if accepted:
                assert check_field(f.name, value, annotation, spec) == value
                continue
            with pytest.raises(ValueError) as error:
                _config(tmp_path, **{f.name: value})
            assert str(error.value) == f"{f.name} must be {allowed(annotation, spec, None)}, got {value!r}"
            tried += 1
    assert tried >= len(part.ranges)  # every declared range has an end


@pytest.mark.parametrize(("name", "label"), CASES, ids=[f"{n}={label}" for n, label in CASES])
def test_each_field_refuses_each_value_it_cannot_take(tmp_path, name, label):
    takes, _, companions, allowed = FIELDS[name]
    value = WRONG[label]
    if label in takes:
        assert getattr(_config(tmp_path, **companions, **{name: value}), name) == value
        return
    with pytest.raises(ValueError) as error:
        _config(tmp_path, **companions, **{name: value})
    message = str(error.value)
    assert message.startswith(name), message
    if name in ("entropy_reg", "grad_reg"):  # "must be a list of modes among [...]" or "entries must be among"
        assert "among ['" in message and (repr(value) in message or repr("abc") in message), message
    else:
        assert message == f"{name} must be {allowed}, got {value!r}"


@pytest.mark.parametrize("name", list(FIELDS))
def test_each_field_takes_its_edge_values(tmp_path, name):
    _, edges, companions, _ = FIELDS[name]
    for value in edges:
        config = _config(tmp_path, **companions, **{name: value})
        if isinstance(value, str) and name in (
            "policy_group_loss_weighting",
            "generation_compile",
            "generation_fallback",
            "prompt_skip",
            "prompt_skip_first_visit",
            "prompt_skip_refill",
            "prompt_skip_hopeless",
            "run_doctor",
        ):
            assert getattr(config, name) is (value in ("true", "1"))  # read as TrlParser reads a bool
        elif name in ("entropy_reg", "grad_reg"):
            assert getattr(config, name) == [m.strip() for m in ([value] if isinstance(value, str) else value)
                                             for m in m.split(",")]  # fmt: skip
        else:
            assert getattr(config, name) == value


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("policy_group_update_steps", "3", 3),
        ("policy_group_eta", "0.5", 0.5),
        ("entropy_pi_ki", "1e-3", 1e-3),
        ("kl_target", "0.02", 0.02),
        ("generation_compile", "true", True),
        ("policy_group_loss_weighting", "False", False),
        ("generation_max_prompt_length", " 320 ", 320),
    ],
)
def test_strings_from_yaml_or_the_command_line_are_read_as_trl_parser_reads_them(tmp_path, name, text, value):
    companions = {"beta": 0.04} if name == "kl_target" else {}
    converted = getattr(_config(tmp_path, **companions, **{name: text}), name)
    assert converted == value and type(converted) is type(value)


@pytest.mark.parametrize(
    ("name", "text", "allowed"),
    [
        ("policy_group_update_steps", "2.5", INT_1),  # argparse: invalid int value
        ("zclip_warmup_steps", "3.0", "an integer >= 2"),
        ("generation_compile", "maybe", "true or false"),
        ("policy_group_eta", "fast", "a finite number in (0, 1]"),
        ("policy_group_halflife", "nan", "a finite number in (0, 1000000000]"),
        ("policy_group_column", "", "a non-empty string, or None"),
    ],
)
def test_strings_trl_parser_would_refuse_are_refused(tmp_path, name, text, allowed):
    with pytest.raises(ValueError, match=re.escape(f"{name} must be {allowed}, got {text!r}")):
        _config(tmp_path, **{name: text})


def test_the_issues_examples_are_refused_with_grouping_on(tmp_path):
    grouping = {"policy_group_column": "task", "remove_unused_columns": False}
    examples = {
        "policy_group_update_steps": 2.5,
        "policy_group_merge_tol": math.nan,
        "policy_group_loss_weighting": "abc",
        "policy_group_column": ["a"],
    }
    for name, value in examples.items():
        with pytest.raises(ValueError, match=f"^{name} must be .*, got {re.escape(repr(value))}$"):
            _config(tmp_path, **{**grouping, name: value, **({"policy_group_regroup_steps": 10})})


def test_a_trl_config_gets_the_same_checks(tmp_path):
    """A TRL `GRPOConfig` passed to our trainer is given our fields by `add_defaults`, which checks what a script set
    on it itself."""
    import trl

    args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    args.policy_group_eta = 0.5
    args.kl_horizon = "10"
    assert GRPOConfig.add_defaults(args) is args and args.kl_horizon == 10
    args.policy_group_sampling_floor = 1.5
    with pytest.raises(ValueError, match=r"policy_group_sampling_floor must be a finite number in \[0, 1\], got 1.5"):
        GRPOConfig.add_defaults(args)


def test_a_yaml_through_trl_parser_is_read_and_checked_like_the_command_line(tmp_path):
    """TrlParser makes YAML values argparse defaults: a quoted number or "yes" is converted by the field's type, and
    a value YAML itself types (`.nan`, a list) reaches the field check."""
    from trl import TrlParser

    base = ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false", "--report_to", "none"]
    good = tmp_path / "good.yaml"
    good.write_text('policy_group_eta: "0.5"\npolicy_group_loss_weighting: "yes"\nkl_horizon: "20"\n')
    (args,) = TrlParser((GRPOConfig,)).parse_args_and_config([*base, "--config", str(good)])
    assert (args.policy_group_eta, args.policy_group_loss_weighting, args.kl_horizon) == (0.5, True, 20)
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy_group_merge_tol: .nan\n")
    with pytest.raises(
        ValueError, match=r"^policy_group_merge_tol must be a finite number in \[0, 1000000\], got nan"
    ):
        TrlParser((GRPOConfig,)).parse_args_and_config([*base, "--config", str(bad)])


def test_a_number_field_without_a_declared_range_cannot_be_imported():
    """`check_declarations` runs when `trl_grpo_ext.config` is imported: a new int/float field with no entry in
    FIELD_RANGES (or a list field with no modes, or an entry naming no field) is a TypeError, not an unchecked
    field."""
    import dataclasses

    from trl_grpo_ext.config import FIELD_MODES, FIELD_RANGES
    from trl_grpo_ext.field_checks import check_declarations

    @dataclasses.dataclass
    class WithNewFields:
        new_rate: float = 0.1
        new_modes: list[str] = dataclasses.field(default_factory=list)

    fields = dataclasses.fields(WithNewFields)
    with pytest.raises(TypeError, match="'new_rate' .* has no declared range in FIELD_RANGES"):
        check_declarations(fields, {}, {"new_modes": ("a",)})
    with pytest.raises(TypeError, match="'new_modes' .* has no declared modes in FIELD_MODES"):
        check_declarations(fields, {"new_rate": FIELD_RANGES["policy_group_eta"]}, {})
    with pytest.raises(TypeError, match=r"declare fields GRPOConfig does not have: \['entropy_reg'"):
        check_declarations(
            fields, {"new_rate": FIELD_RANGES["policy_group_eta"]}, {"new_modes": ("a",), **FIELD_MODES}
        )


def test_numpy_numbers_are_numbers_and_huge_ones_are_refused_by_name(tmp_path):
    """A value computed with numpy (np.float32, np.int64) is read as the number it is; an integer too large for the
    64-bit counters it ends up in, or a float field given one, is a ValueError with the value shortened."""
    import numpy as np

    config = _config(tmp_path, policy_group_sampling_floor=np.float32(0.5), kl_horizon=np.int64(3))
    assert (config.policy_group_sampling_floor, config.kl_horizon) == (0.5, 3) and type(config.kl_horizon) is int
    huge = 10**400
    with pytest.raises(ValueError, match=r"^kl_horizon must be an integer >= 1 of at most 2\*\*63 - 1, got 1000.*"
                                         r"\(401 characters\)$"):  # fmt: skip
        _config(tmp_path, kl_horizon=huge)
    with pytest.raises(ValueError, match=r"^policy_group_merge_tol must be a finite number in \[0, 1000000\]"):
        _config(tmp_path, policy_group_merge_tol=huge)


@pytest.mark.parametrize("name", ["entropy_reg", "grad_reg"])
def test_none_is_not_a_list_of_modes(tmp_path, name):
    with pytest.raises(ValueError, match=f"^{name} must be a list of modes among .*, got None$"):
        _config(tmp_path, **{name: None})


@pytest.mark.parametrize(
    "name", ["num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
             "generation_batch_size", "max_completion_length", "num_iterations"],
)  # fmt: skip
def test_trl_counts_of_zero_are_refused_before_trl_divides_by_them(name):
    """0 made TRL's __post_init__ divide by zero (num_generations) or failed only once the model was loaded, naming
    another field; now a ValueError names the field and the value at config time."""
    with pytest.raises(ValueError, match=rf"^{name} must be .*, got 0$"):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **{name: 0})
    with pytest.raises(
        ValueError, match=r"^temperature \(the sampling temperature\) must be a finite number > 0, got 0.0$"
    ):
        GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, temperature=0.0)


def test_a_temperature_in_generation_kwargs_warns_that_log_probabilities_use_temperature(tmp_path):
    """TRL samples at generation_kwargs' temperature but computes the log-probabilities and the entropy at its own
    `temperature`: a different one is a warning at config time; the same one, or none, is not."""
    with pytest.warns(UserWarning, match=r"generation_kwargs temperature=0\.7 samples the completions, but the log-pro"
                      r"babilities, the entropy and the entropy target are computed at temperature=1\.0"):  # fmt: skip
        GRPOConfig(**small_grpo_kwargs(tmp_path, generation_kwargs={"temperature": 0.7}))
    with pytest.warns(UserWarning, match=r"generation_kwargs do_sample=False makes every completion of a prompt"):
        GRPOConfig(**small_grpo_kwargs(tmp_path, generation_kwargs={"do_sample": False}))
    for kwargs in ({"temperature": 1.0}, {"top_p": 0.9}, None):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            GRPOConfig(**small_grpo_kwargs(tmp_path, generation_kwargs=kwargs))
        assert not [w for w in caught if "generation_kwargs temperature" in str(w.message)], kwargs


def test_the_config_bases_are_the_parts_in_reverse_order():
    """Issue #61: `GRPOConfig`'s bases are named (for type checkers): `composition.FeatureFields`, whose bases are each
    part's fields in reverse `FEATURE_CONFIGS` order, then TRL's config: the order in which dataclasses collect TRL's
    fields first."""
    assert GRPOConfig.__bases__ == (FeatureFields, TRLGRPOConfig)
    assert FeatureFields.__bases__ == tuple(part.fields for part in reversed(FEATURE_CONFIGS))


def test_a_type_checker_reports_a_misspelt_and_a_wrong_typed_field(tmp_path):
    """Issue #61: a type checker (basedpyright, standard mode) run on a user's script sees every field of
    `GRPOConfig`: it reports a misspelt field and a string for a float field, and nothing in a correct call."""
    script = tmp_path / "train.py"
    script.write_text(
        "from trl_grpo_ext import GRPOConfig\n"
        "\n"
        'misspelt = GRPOConfig(output_dir="out", policy_group_colum="task")\n'
        'wrong_type = GRPOConfig(output_dir="out", policy_group_merge_tol="two")\n'
        'fine = GRPOConfig(output_dir="out", policy_group_column="task", policy_group_merge_tol=0.1, beta=0.1)\n'
    )
    (tmp_path / "pyrightconfig.json").write_text(
        json.dumps({"extraPaths": [str(REPO_ROOT)], "typeCheckingMode": "standard"})
    )
    checker = Path(sys.executable).parent / "basedpyright"
    done = subprocess.run(
        [str(checker), "--outputjson", "--pythonpath", sys.executable, str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = json.loads(done.stdout)
    found = [(d["range"]["start"]["line"] + 1, d.get("rule"), d["message"]) for d in report["generalDiagnostics"]]
    assert [(line, rule) for line, rule, _ in found] == [(3, "reportCallIssue"), (4, "reportArgumentType")], found
    assert 'No parameter named "policy_group_colum"' in found[0][2]
    assert '"policy_group_merge_tol" of type "float"' in found[1][2]


@dataclasses.dataclass
class _StringAnnotated:
    """
    > Parameters that control a test part written with `from __future__ import annotations` (string annotations)

    my_scale (`float`, *optional*, defaults to `1.0`):
        A factor.
    """

    my_scale: "float" = dataclasses.field(default=1.0, metadata={"help": "A factor."})


_STRING_PART = ConfigPart(_StringAnnotated, ranges={"my_scale": Range(0.0, 10.0, low_open=True)})


@dataclasses.dataclass
class _StringConfig(_StringAnnotated, GRPOConfig):
    pass


def test_a_part_with_string_annotations_is_checked_by_its_types_on_every_path(tmp_path):
    """A user's fields class with string annotations (`from __future__ import annotations`) added as a base of a
    `GRPOConfig` subclass: its default and a string from the command line are taken, an out-of-range value refused,
    by the constructor and by `add_defaults` on a TRL config alike."""
    assert _config_class(tmp_path, _StringConfig).my_scale == 1.0
    assert _config_class(tmp_path, _StringConfig, my_scale="2.5").my_scale == 2.5
    with pytest.raises(ValueError, match=r"my_scale must be a finite number in \(0, 10\], got 0.0"):
        _config_class(tmp_path, _StringConfig, my_scale=0.0)
    trl_args = TRLGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    trl_args.my_scale = 0.0
    with pytest.raises(ValueError, match=r"my_scale must be a finite number in \(0, 10\], got 0.0"):
        _StringConfig.add_defaults(trl_args)
    fresh = TRLGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    assert _StringConfig.add_defaults(fresh).my_scale == 1.0


def _config_class(tmp_path, config_class, **fields):
    return config_class(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **fields)
