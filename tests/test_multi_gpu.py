"""Multi-GPU: every accelerate config in recipes/accelerate/ is one accelerate 1.15 loads and carries a launch command
that parses; the GSM8K recipe launched with ddp.yaml on 2 CPU processes holds the same trl_grpo_ext state on both."""

import json
import math
import shlex
from pathlib import Path

import pytest
import torch
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import launch_command_parser
from accelerate.utils import ComputeEnvironment, DistributedType

from tests.conftest import REPO_ROOT
from tests.test_recipes import load_recipe
from tests.two_process import checked, two_process
from trl_grpo_ext.resume import checkpoint_problem, load_resume_state

ACCELERATE_DIR = REPO_ROOT / "recipes" / "accelerate"
CONFIGS = sorted(ACCELERATE_DIR.glob("*.yaml"))
EXPECTED = {
    "ddp.yaml": (DistributedType.MULTI_GPU, {}),
    "deepspeed_zero2.yaml": (DistributedType.DEEPSPEED, {"zero_stage": 2}),
    "deepspeed_zero3.yaml": (DistributedType.DEEPSPEED, {"zero_stage": 3, "zero3_init_flag": True}),
    "fsdp2.yaml": (DistributedType.FSDP, {"fsdp_version": 2, "fsdp_activation_checkpointing": True}),
}


def test_there_are_the_four_configs():
    assert {p.name for p in CONFIGS} == set(EXPECTED)


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_accelerate_config_loads_as_accelerates_own(config):
    # accelerate's loader rejects an unknown top-level key (ValueError naming it) and fills in the defaults.
    loaded = load_config_from_file(str(config))
    assert isinstance(loaded, ClusterConfig)
    distributed_type, expected_section = EXPECTED[config.name]
    assert loaded.distributed_type == distributed_type
    assert loaded.compute_environment == ComputeEnvironment.LOCAL_MACHINE
    assert (loaded.mixed_precision, loaded.use_cpu, loaded.num_machines) == ("bf16", False, 1)
    assert loaded.num_processes >= 2
    section = {**loaded.deepspeed_config, **loaded.fsdp_config}
    assert {key: section.get(key) for key in expected_section} == expected_section
    # `accelerate launch` turns each key of these sections into its own command-line argument of that name; parsing
    # them as arguments rejects a misspelt key (SystemExit) and a value outside the argument's type or choices.
    argv = [item for key, value in section.items() for item in (f"--{key}", str(value))]
    args = launch_command_parser().parse_args([*argv, "script.py"])
    assert {key: str(getattr(args, key)) for key in section} == {key: str(value) for key, value in section.items()}


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_accelerate_config_header_has_a_launch_command_that_parses(config, monkeypatch):
    header = []
    for line in config.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert len(header) >= 3, "the file opens with a comment header: what, hardware, launch command"
    launches = [line.removeprefix("# Launch: ") for line in header if line.startswith("# Launch: ")]
    assert len(launches) == 1, header
    argv = shlex.split(launches[0])
    assert argv[:4] == ["accelerate", "launch", "--config_file", f"recipes/accelerate/{config.name}"]
    assert argv[4] == "recipes/math_gsm8k.py"
    # The recipe arguments of the command parse (the config it names exists, every flag is a field); --use_cpu: the
    # presets ask for bf16, which TrainingArguments checks against this machine.
    monkeypatch.chdir(REPO_ROOT)
    parser = load_recipe("math_gsm8k").make_parser()
    _, training_args, _ = parser.parse_args_and_config([*argv[5:], "--use_cpu", "true"])
    if load_config_from_file(str(config)).fsdp_config.get("fsdp_activation_checkpointing"):
        # transformers' Trainer refuses FSDP's activation checkpointing together with its own training argument
        assert not training_args.activation_checkpointing and not training_args.gradient_checkpointing


def assert_same(a, b, where: str) -> None:
    """Exactly equal, recursively through dicts, lists and tuples; tensors by dtype, shape and value (NaN == NaN)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{where}: {m}")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), f"{where}: nan != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@two_process("recipe", recipe=[
    "--config", "recipes/configs/demo_cpu.yaml", "--synthetic_problems", "64", "--max_steps", "4",
    "--save_strategy", "steps", "--save_steps", "2", "--policy_group_update_steps", "1", "--entropy_reg", "target",
    "--entropy_target", "7.0", "--entropy_pi_kp", "0.5", "--eval_limit", "0",
])  # fmt: skip
def test_recipe_on_two_processes_holds_the_same_state_on_both(two_process_runs):
    """The GSM8K recipe with ddp.yaml on 2 CPU processes (gloo): policy groups by difficulty, weights updated every
    step, and an entropy target of 7 nats (above the tiny model's ln 512 = 6.2, so the controller acts every step;
    its proportional gain 0.5 keeps the coefficient below its maximum 1, so the integral moves too).
    Checkpoints at steps 2 and 4 hold one state file per process; the policy groups and the entropy controller in
    them must be the same on both processes, bit for bit. The run is scenario "recipe" of the suite's shared
    two-process job (tests/two_process.py), launched with `--config_file recipes/accelerate/ddp.yaml`; each process
    calls the recipe's `cli`, as `accelerate launch recipes/math_gsm8k.py` does."""
    out = Path(checked(two_process_runs["recipe"])[0]["full"]["output_dir"])

    for step in (2, 4):
        checkpoint = str(out / f"checkpoint-{step}")
        assert checkpoint_problem(checkpoint) is None
        states = [load_resume_state(checkpoint, rank) for rank in (0, 1)]
        assert all(state is not None for state in states), "one state file per process"
        for name in ("policy_groups", "entropy_reg"):
            assert_same(states[0][name], states[1][name], f"checkpoint-{step}/{name}")

    # Not equal by being untouched: by step 4 the weights have moved off 1 and the coefficient off its minimum 0,
    # and they are the values the main process logged at step 4.
    groups, controller = states[0]["policy_groups"], states[0]["entropy_reg"]["controller"]
    assert groups["names"] == ["1-2 steps", "3 steps", "4 steps"]
    assert not torch.equal(groups["weights"], torch.ones_like(groups["weights"]))
    assert controller["coef"]["all"] > 0.0 and controller["integral"]["all"] > 0.0
    log = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
    logged = next(row for row in log if row.get("step") == 4 and "entropy_reg/coef" in row)
    assert logged["entropy_reg/coef"] == controller["coef"]["all"]
    assert [logged[f"policy_groups/{name}/weight"] for name in groups["names"]] == groups["weights"].tolist()
