"""The real engines on 2 CPU processes (gloo): DeepSpeed ZeRO-2 and ZeRO-3 and PyTorch FSDP2, each launched with the
shipped `recipes/accelerate/<engine>.yaml` and the CPU overrides of docs/multi-gpu.md. Under each, a run with every
feature on (policy groups, prompt skipping, the entropy target, ZClip, LoRA) trains, checkpoints at step 2 and
resumes to step 4 exactly, with the feature state of both processes equal in every checkpoint; a NaN loss at a chosen
step is skipped and training goes on with finite weights; and the engine is asserted real from the prepared model
(every fallback of accelerate on CPU is silent). Under ZeRO-3, policy groups by embedding k-means are computed from
the gathered embedding table.

Needs the engines' environment (`make test-engines`: DeepSpeed beside this suite's versions); without DeepSpeed
installed the module is skipped, unless TRL_GRPO_EXT_ENGINES=1 (the CI stage), where that fails."""

import math

import pytest
import torch

from tests.engines.conftest import require
from tests.training.test_multi_gpu import assert_same
from tests.two_process import checked, full_records, resume_diff, two_process
from trl_grpo_ext.resume import checkpoint_problem, load_resume_state

require("deepspeed")

ENGINES = ("deepspeed_zero2", "deepspeed_zero3", "fsdp2")
# Every feature on: policy groups by task, scored and weighting the loss, drawn uniformly (their default draw fades
# out solved groups, which would leave prompt skipping nothing to skip); prompt skipping (every other problem is solved
# by every completion, so it gives no signal and is skipped once seen: 6 problems, 3 prompts a step, so steps 3-4
# revisit them); the entropy target at the model's own entropy; ZClip after 2 warm-up steps; LoRA rank 8.
# 2 processes x 6 completions = 3 prompts x 4 completions a step.
FEATURES = {
    "lora": 8,
    "policy_group_column": "task",
    "policy_group_loss_weighting": True,
    "policy_group_sampling": "uniform",
    "prompt_skip": True,
    "prompt_skip_target": 0.0,
    "half_solved": True,
    "num_problems": 6,
    "entropy_reg": ["target"],
    "entropy_target_ratio": 1.0,
    "entropy_target_window": 1,
    "grad_reg": ["zclip"],
    "zclip_warmup_steps": 2,
    "per_device_train_batch_size": 6,
    "max_steps": 4,
    "save_steps": 2,
}
FEATURE_STATES = ("policy_groups", "prompt_skip", "entropy_reg", "grad_reg")
NAN_STEP = 2
NAN = {"lora": 8, "grad_reg": ["zclip"], "zclip_warmup_steps": 2, "nan_step": NAN_STEP,
       "per_device_train_batch_size": 6, "max_steps": 3, "first_params": True}  # fmt: skip

# what the documented launch line of each engine adds to a preset (recipes/accelerate/<engine>.yaml's header): FSDP2
# checkpoints activations itself, so the Trainer's own activation checkpointing (on in TRL's GRPOConfig) goes off
LAUNCH_LINE = {"deepspeed_zero2": {}, "deepspeed_zero3": {}, "fsdp2": {"gradient_checkpointing": False}}
for engine in ENGINES:
    two_process(f"{engine}_features", {**FEATURES, **LAUNCH_LINE[engine]}, resume_step=2, engine=engine)
    two_process(f"{engine}_nan", {**NAN, **LAUNCH_LINE[engine]}, engine=engine)


def engine_marks(name: str):
    return [pytest.param(engine, marks=pytest.mark.two_process(f"{engine}_{name}")) for engine in ENGINES]


def assert_real_engine(facts: dict, engine: str) -> None:
    """`facts` (tests.two_process.engine_facts) show `engine` itself, on 2 processes, with its weights sharded as it
    shards them."""
    assert facts["num_processes"] == 2
    if engine.startswith("deepspeed"):
        assert (facts["distributed_type"], facts["model_class"]) == ("DEEPSPEED", "DeepSpeedEngine")
        assert facts["zero_stage"] == int(engine[-1])
        partitioned = facts["zero3_partitioned_params"]
        # ZeRO-3 keeps the large parameters as partitions between uses (the widened model's embedding table and MLP
        # weights: tests.two_process.ENGINES); ZeRO-2 keeps whole weights
        assert partitioned >= 5 if engine.endswith("3") else partitioned == 0
        assert facts["dtensor_params"] == 0
    else:
        assert facts["distributed_type"] == "FSDP"
        assert facts["dtensor_params"] == facts["params"] > 0  # fully_shard made every parameter a DTensor shard


@pytest.mark.parametrize("engine", engine_marks("features"))
def test_every_feature_trains_and_resumes_exactly(two_process_runs, engine):
    ranks = checked(two_process_runs[f"{engine}_features"])
    for record in ranks:
        assert_real_engine(record["full"]["inspected"], engine)
        assert_real_engine(record["resumed"]["inspected"], engine)
    assert resume_diff(ranks, 2) == 0.0

    logs = [row for row in ranks[0]["full"]["logs"] if "loss" in row]
    assert [row["step"] for row in logs] == [1, 2, 3, 4]
    # each feature acted: prompts skipped once seen, the groups scored apart (the log-probabilities of both processes
    # noted), the entropy coefficient and ZClip's threshold logged, and every weight finite
    assert sum(row["prompt_skip/skipped_in_batch"] for row in logs) > 0
    credibility = [value for key, value in logs[-1].items() if key.endswith("/credibility")]
    assert credibility and len(set(credibility)) > 1
    assert all("entropy_reg/coef" in row and "grad_reg/threshold" in row for row in logs)
    assert all(torch.isfinite(p).all() for p in ranks[0]["full"]["params"].values())
    # both processes hold the same weights, and wrote the same feature state into each checkpoint
    for name, param in ranks[0]["full"]["params"].items():
        assert torch.equal(param, ranks[1]["full"]["params"][name]), name
    for step in (2, 4):
        checkpoint = f"{ranks[0]['full']['output_dir']}/checkpoint-{step}"
        assert checkpoint_problem(checkpoint) is None
        states = [load_resume_state(checkpoint, rank) for rank in (0, 1)]
        assert set(FEATURE_STATES) <= set(states[0])
        for feature in FEATURE_STATES:
            assert_same(states[0][feature], states[1][feature], f"checkpoint-{step}/{feature}")


@pytest.mark.parametrize("engine", engine_marks("nan"))
def test_a_nan_step_is_skipped_and_training_goes_on(two_process_runs, engine):
    """A NaN loss at step 2 makes every gradient NaN: the guard counts the step as skipped (under DeepSpeed, from the
    engine's own count), the step changes no weight, and step 3 trains on finite weights."""
    records = full_records(two_process_runs[f"{engine}_nan"])
    for record in records:
        assert_real_engine(record["inspected"], engine)
        logs = {row["step"]: row for row in record["logs"] if "loss" in row}
        assert sorted(logs) == [1, 2, 3]
        assert [logs[step]["grad_reg/skipped_steps"] for step in (1, 2, 3)] == [0.0, 1.0, 1.0]
        assert not math.isfinite(logs[NAN_STEP]["grad_norm"]) and math.isfinite(logs[3]["grad_norm"])
        if engine.startswith("deepspeed"):
            assert record["inspected"]["skipped_steps"] == 1  # DeepSpeed skipped it itself
        params, first = record["params"], record["first_params"]
        assert all(torch.isfinite(p).all() for p in params.values())
        assert any(not torch.equal(params[name], first[name]) for name in params)  # steps 1 and 3 trained
    assert all(torch.equal(records[0]["params"][n], records[1]["params"][n]) for n in records[0]["params"])


# The CPU form of each file's documented launch line (docs/multi-gpu.md, "Trying the launch lines without a GPU"):
# the CPU demo's config in place of a GPU preset, the file's own additions to the preset kept but for fast generation
# (compiled for CUDA), 2 steps with a checkpoint at step 2 and no evaluation, to keep the stage short.
CPU_LAUNCH = {
    "deepspeed_zero2": ["--optim", "adamw_torch"],
    "deepspeed_zero3": ["--optim", "adamw_torch"],
    "fsdp2": ["--optim", "adamw_torch", "--gradient_checkpointing", "false"],
}
for engine, extra in CPU_LAUNCH.items():
    two_process(
        f"{engine}_recipe",
        recipe=["--config", "recipes/configs/demo_cpu.yaml", *extra, "--max_steps", "2", "--save_strategy", "steps",
                "--save_steps", "2", "--eval_limit", "0", "--run_doctor", "false"],
        engine=engine,
    )  # fmt: skip


@pytest.mark.parametrize("engine", engine_marks("recipe"))
def test_the_documented_launch_line_runs_on_cpu(two_process_runs, engine):
    """`accelerate launch --config_file recipes/accelerate/<engine>.yaml --num_processes 2 --mixed_precision no
    recipes/math_gsm8k.py --config recipes/configs/demo_cpu.yaml ...`: the recipe exits 0 on both processes and saves
    a complete checkpoint of 2 steps with the policy-group state of both processes equal."""
    out = checked(two_process_runs[f"{engine}_recipe"])[0]["full"]["output_dir"]
    checkpoint = f"{out}/checkpoint-2"
    assert checkpoint_problem(checkpoint) is None
    states = [load_resume_state(checkpoint, rank) for rank in (0, 1)]
    assert_same(states[0]["policy_groups"], states[1]["policy_groups"], "checkpoint-2/policy_groups")
