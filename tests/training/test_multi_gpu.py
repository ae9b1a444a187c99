"""Multi-GPU: every accelerate config in recipes/accelerate/ is one accelerate 1.15 loads and carries a launch command
whose config builds under the environment `accelerate launch` sets for that file; fast generation under FSDP or
ZeRO-3 is refused at config time; the GSM8K recipe launched with ddp.yaml on 2 CPU processes holds the same
trl_grpo_ext state on both."""

import importlib.util
import json
import math
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import ComputeEnvironment, DeepSpeedPlugin, DistributedType
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

from tests.conftest import REPO_ROOT
from tests.training.test_recipes import load_recipe
from tests.two_process import checked, two_process
from trl_grpo_ext import GRPOConfig
from trl_grpo_ext.generation import config as generation_config
from trl_grpo_ext.generation.config import check_generation_engine, sharding_engine
from trl_grpo_ext.policy_groups.score import credibility
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


FAST_GENERATION_OFF = ["--generation_compile", "false", "--generation_lora_merge", "none"]
# What `accelerate launch --config_file <file>` tells the processes it starts about sharding (from accelerate's code,
# `launcher_environment`), and the engine the config check then names.
SHARDING = {
    "ddp.yaml": ({"ACCELERATE_USE_FSDP": None, "ACCELERATE_USE_DEEPSPEED": None}, None),
    "deepspeed_zero2.yaml": ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}, None),
    "deepspeed_zero3.yaml": (
        {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"},
        "DeepSpeed ZeRO-3, from accelerate launch's ACCELERATE_DEEPSPEED_ZERO_STAGE=3",
    ),
    "fsdp2.yaml": ({"ACCELERATE_USE_FSDP": "true"}, "FSDP, from accelerate launch's ACCELERATE_USE_FSDP"),
}


def launch_line(config: Path) -> list[str]:
    """The one `# Launch: ` command of an accelerate config's comment header, split as a shell splits it."""
    header = []
    for line in config.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert len(header) >= 3, "the file opens with a comment header: what, hardware, launch command"
    launches = [line.removeprefix("# Launch: ") for line in header if line.startswith("# Launch: ")]
    assert len(launches) == 1, header
    return shlex.split(launches[0])


def launcher_environment(launch_args: list[str]) -> dict[str, str]:
    """The variables `accelerate launch <launch_args> script.py` sets for the processes it starts, where they differ
    from this process's: accelerate's own `launch_command` (its defaults from the config file, its choice of
    launcher) up to the environment that launcher hands to torchrun or DeepSpeed."""
    args = launch_command_parser().parse_args([*launch_args, "script.py"])
    args, defaults, mixed_precision_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = [*defaults.deepspeed_config, *(["mixed_precision"] if mixed_precision_from_config else [])]
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, environ = prepare_deepspeed_cmd_env(args)
    else:  # MULTI_GPU and FSDP: torchrun through multi_gpu_launcher
        environ = prepare_multi_gpu_env(args)
    return {key: value for key, value in environ.items() if os.environ.get(key) != value}


def build_under_launcher(config: Path, recipe_args: list[str], monkeypatch) -> GRPOConfig:
    """The GRPOConfig the recipe parses from `recipe_args` in a process `accelerate launch --config_file <config>`
    started (its environment set here); --use_cpu: the presets ask for bf16, which TrainingArguments checks against
    this machine. Without deepspeed installed, TrainingArguments' DeepSpeed plugin skips registering transformers'
    ZeRO-3 loading hook (`set_deepspeed_weakref`, the one step that imports deepspeed; it only acts when a model
    loads)."""
    for key, value in launcher_environment(["--config_file", str(config)]).items():
        monkeypatch.setenv(key, value)
    if importlib.util.find_spec("deepspeed") is None:
        monkeypatch.setattr(DeepSpeedPlugin, "set_deepspeed_weakref", lambda self: None)
    monkeypatch.chdir(REPO_ROOT)
    parser = load_recipe("math_gsm8k").make_parser()
    _, training_args, _ = parser.parse_args_and_config([*recipe_args, "--use_cpu", "true"])
    return training_args


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_accelerate_config_header_has_a_launch_command_that_builds_under_its_launcher(config, monkeypatch):
    argv = launch_line(config)
    assert argv[:4] == ["accelerate", "launch", "--config_file", f"recipes/accelerate/{config.name}"]
    assert argv[4] == "recipes/math_gsm8k.py"
    # accelerate's launcher really tells the processes about the sharding (else the build below proves nothing)
    expected_environ, engine = SHARDING[config.name]
    environ = launcher_environment(["--config_file", str(config)])
    assert {key: environ.get(key) for key in expected_environ} == expected_environ
    # The recipe arguments of the command build the config in that environment: the config it names exists, every
    # flag is a field, and the config's checks pass (among them fast generation under sharding).
    training_args = build_under_launcher(config, argv[5:], monkeypatch)
    assert sharding_engine(training_args) == engine
    if engine is not None:  # the preset's fast generation is turned off by the launch line itself
        assert argv[-4:] == FAST_GENERATION_OFF
        assert not training_args.generation_compile and training_args.generation_lora_merge == "none"
    if load_config_from_file(str(config)).fsdp_config.get("fsdp_activation_checkpointing"):
        # transformers' Trainer refuses FSDP's activation checkpointing together with its own training argument
        assert not training_args.gradient_checkpointing  # transformers 5.20+ keeps activation_checkpointing equal


@pytest.mark.parametrize("name", ["deepspeed_zero3.yaml", "fsdp2.yaml"])
def test_sharded_launch_of_an_unchanged_preset_is_refused_at_config_time(name, monkeypatch):
    # The launch line as it was: gsm8k-24gb.yaml's compiled generation from a merged copy, under ZeRO-3 / FSDP.
    argv = launch_line(ACCELERATE_DIR / name)
    assert argv[-4:] == FAST_GENERATION_OFF
    with pytest.raises(ValueError) as refused:
        build_under_launcher(ACCELERATE_DIR / name, argv[5:-4], monkeypatch)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"generation_compile=True, generation_lora_merge='copy': the weights are sharded over processes "
        f"({SHARDING[name][1]}), so no process holds a whole layer to merge or compile; use DDP or ZeRO-1/2"
    )
    assert message.endswith("(--generation_compile false --generation_lora_merge none)")


def test_recipe_refuses_fast_generation_under_fsdp_in_one_line_before_loading_a_model(monkeypatch, capsys):
    from transformers import AutoModelForCausalLM, PreTrainedModel

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", loaded)
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", loaded)
    for key, value in launcher_environment(["--config_file", str(ACCELERATE_DIR / "fsdp2.yaml")]).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(REPO_ROOT)
    argv = ["--config", "recipes/configs/gsm8k-24gb.yaml", "--optim", "adamw_torch", "--gradient_checkpointing",
            "false", "--use_cpu", "true"]  # fmt: skip
    assert load_recipe("math_gsm8k").cli(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("math_gsm8k.py: error: generation_compile=True, "), err
    assert "(FSDP, from accelerate launch's ACCELERATE_USE_FSDP)" in err[0]


def fast_config(**kwargs) -> GRPOConfig:
    return GRPOConfig("out", use_cpu=True, report_to="none", **kwargs)


def test_fast_generation_is_refused_with_the_fsdp_argument():
    with pytest.raises(ValueError, match=r"^generation_compile=True: .* \(FSDP, from the fsdp argument\), .*"
                       r"\(--generation_compile false\)$"):  # fmt: skip
        fast_config(fsdp="full_shard", generation_compile=True)
    assert fast_config(fsdp="full_shard").fsdp  # FSDP alone builds


@pytest.mark.parametrize("as_file", [False, True], ids=["dict", "file"])
def test_fast_generation_is_refused_with_a_zero3_deepspeed_config(as_file, tmp_path, monkeypatch):
    def deepspeed(stage):
        config = {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto"}
        if not as_file:
            return config
        path = tmp_path / f"ds_zero{stage}.json"
        path.write_text(json.dumps(config))
        return str(path)

    where = f"the deepspeed config {tmp_path / 'ds_zero3.json'}" if as_file else "the deepspeed config"
    engine = re.escape(f"(DeepSpeed ZeRO-3, from {where})")
    with pytest.raises(ValueError, match=rf"^generation_lora_merge='inplace': .*{engine}"):
        fast_config(deepspeed=deepspeed(3), generation_lora_merge="inplace")
    # ZeRO-2 keeps whole weights on every process: allowed (the check alone: TrainingArguments needs deepspeed
    # installed to build any DeepSpeed config); "auto" is accelerate launch's stage, 2 when unset.
    args = fast_config(generation_lora_merge="inplace")
    cases = [(2, None, False), ("auto", None, False), ("auto", "3", True), (0, "3", False)]  # 0: a missing stage too
    for stage, launch_stage, refused in cases:
        args.deepspeed = deepspeed(stage)
        if launch_stage is not None:
            monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", launch_stage)
        assert (sharding_engine(args) is not None) == refused, (stage, launch_stage)
        if not refused:
            check_generation_engine(args)


def test_fast_generation_is_refused_with_accelerates_deepspeed_config_file(tmp_path, monkeypatch):
    # accelerate launch with `deepspeed_config_file:` in its config passes the JSON's path on, not a stage
    # (the check alone, on a config built before: TrainingArguments needs deepspeed installed to build this one)
    args = fast_config(generation_compile=True)
    path = tmp_path / "ds.json"
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(path))
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    engine = f"(DeepSpeed ZeRO-3, from accelerate launch's ACCELERATE_DEEPSPEED_CONFIG_FILE {path})"
    with pytest.raises(ValueError, match=re.escape(engine)):
        check_generation_engine(args)
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    check_generation_engine(args)


@pytest.mark.parametrize("flag", ["1", "yes", "TRUE"])
def test_a_launch_flag_is_read_as_accelerate_and_transformers_read_it(monkeypatch, flag):
    """transformers' `strtobool` takes ACCELERATE_USE_DEEPSPEED=1 as on (and builds the DeepSpeed plugin), accelerate's
    `parse_flag_from_env` ACCELERATE_USE_FSDP=1: the refusal reads them the same way."""
    args = fast_config(generation_compile=True)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", flag)
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    with pytest.raises(
        ValueError, match=re.escape("(DeepSpeed ZeRO-3, from accelerate launch's ACCELERATE_DEEPSPEED")
    ):
        check_generation_engine(args)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", flag)
    with pytest.raises(ValueError, match=re.escape("(FSDP, from accelerate launch's ACCELERATE_USE_FSDP)")):
        check_generation_engine(args)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "0")
    check_generation_engine(args)


def test_a_config_without_fast_generation_does_not_read_the_launch(monkeypatch):
    def read(args):
        raise AssertionError("the launch was read")

    monkeypatch.setattr(generation_config, "sharding_engine", read)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    fast_config()
    fast_config(fsdp="full_shard")
    with pytest.raises(AssertionError, match="the launch was read"):  # the check does read it with a lever on
        fast_config(generation_compile=True)


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
    "--save_strategy", "steps", "--save_steps", "2", "--entropy_reg", "target",
    "--entropy_target", "7.0", "--entropy_pi_kp", "0.5", "--eval_limit", "0",
])  # fmt: skip
def test_recipe_on_two_processes_holds_the_same_state_on_both(two_process_runs):
    """The GSM8K recipe with ddp.yaml on 2 CPU processes (gloo): policy groups by difficulty, scored from both
    processes' completions and log-probabilities, and an entropy target of 7 nats (above the tiny model's ln 512 = 6.2,
    so the controller acts every step; its proportional gain 0.5 keeps the coefficient below its maximum 1, so the
    integral moves too). Checkpoints at steps 2 and 4 hold one state file per process; the policy groups and the
    entropy controller in them must be the same on both processes, bit for bit. The run is scenario "recipe" of the
    suite's shared two-process job (tests/two_process.py), launched with `--config_file recipes/accelerate/ddp.yaml`;
    each process calls the recipe's `cli`, as `accelerate launch recipes/math_gsm8k.py` does."""
    out = Path(checked(two_process_runs["recipe"])[0]["full"]["output_dir"])

    for step in (2, 4):
        checkpoint = str(out / f"checkpoint-{step}")
        assert checkpoint_problem(checkpoint) is None
        states = [load_resume_state(checkpoint, rank) for rank in (0, 1)]
        assert all(state is not None for state in states), "one state file per process"
        for name in ("policy_groups", "entropy_reg"):
            assert_same(states[0][name], states[1][name], f"checkpoint-{step}/{name}")

    # Not equal by being untouched: by step 4 the groups hold statistics of both processes' log-probabilities and the
    # coefficient is off its minimum 0, and they are the values the main process logged at step 4.
    groups, controller = states[0]["policy_groups"], states[0]["entropy_reg"]["controller"]
    assert groups["names"] == ["1-2 steps", "3 steps", "4 steps"]
    assert bool((groups["sums"]["df"] > 0).any()) and bool(torch.isfinite(groups["pending"]["logps"]).all())
    assert controller["coef"]["all"] > 0.0 and controller["integral"]["all"] > 0.0
    log = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
    logged = next(row for row in log if row.get("step") == 4 and "entropy_reg/coef" in row)
    assert logged["entropy_reg/coef"] == controller["coef"]["all"]
    kappa = credibility(*(groups["sums"][key] for key in ("rl", "rr", "ll", "df")))
    logged_kappa = [logged.get(f"policy_groups/{name}/credibility") for name in groups["names"]]
    assert logged_kappa == pytest.approx(kappa.tolist())


def test_fsdp_asked_for_where_accelerate_sets_up_ddp_is_a_warning_naming_the_engine(tiny_model_dir, tmp_path,
                                                                                    monkeypatch, caplog):  # fmt: skip
    """Issue #72: `accelerate launch --config_file recipes/accelerate/fsdp2.yaml` on CPU processes trained as plain
    DDP with no word said (accelerate 1.16 takes FSDP only on GPUs). The trainer now compares the launch's FSDP with
    the engine accelerate set up and warns, naming it: here one CPU process under the launch's environment."""
    import logging

    from datasets import Dataset

    from tests.conftest import length_reward, small_grpo_kwargs
    from trl_grpo_ext import GRPOTrainer
    from trl_grpo_ext.launch_engine import engine_fallback

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` sets for a distributed_type: FSDP
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say {i}"}]} for i in range(8)])
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.trainer"):
        trainer = GRPOTrainer(tiny_model_dir, length_reward, GRPOConfig(**small_grpo_kwargs(tmp_path)), dataset)
    assert trainer.accelerator.distributed_type == DistributedType.NO
    assert (
        "FSDP is asked for (accelerate launch's ACCELERATE_USE_FSDP) but accelerate trains this run as NO: one "
        "process, nothing sharded" in caplog.text
    )
    assert "recipes/accelerate/ddp.yaml" in caplog.text
    # the two CPU processes of fsdp2.yaml with use_cpu: DDP over gloo; FSDP set up, or not asked for: nothing
    args = trainer.args
    assert "as MULTI_CPU: DDP over gloo on CPU processes" in engine_fallback(args, DistributedType.MULTI_CPU)
    assert engine_fallback(args, DistributedType.FSDP) is None
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    assert engine_fallback(args, DistributedType.MULTI_CPU) is None
