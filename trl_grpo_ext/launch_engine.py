"""The distributed engine a run will train under, read from its settings before accelerate or transformers builds a
plugin (so that a config check can refuse a combination before any model loads): FSDP, or DeepSpeed with its config
and ZeRO stage. Read as accelerate and transformers read them:

- `args.fsdp` (TrainingArguments': any value turns FSDP on), or `ACCELERATE_USE_FSDP=true` (or 1, yes, on:
  accelerate's `parse_flag_from_env` and transformers' `strtobool` read those as true too), which `accelerate launch`
  sets for a `distributed_type: FSDP` config (`accelerate.utils.launch`'s `prepare_multi_gpu_env`).
- `args.deepspeed` (a dict or a JSON file); else, with `ACCELERATE_USE_DEEPSPEED=true` (`prepare_deepspeed_cmd_env`,
  for a `distributed_type: DEEPSPEED` config), the JSON in `ACCELERATE_DEEPSPEED_CONFIG_FILE`, or the stage in
  `ACCELERATE_DEEPSPEED_ZERO_STAGE` (accelerate builds the rest of the config itself). A stage "auto" is the
  environment's stage, 2 when unset (accelerate's `DeepSpeedPlugin`); a missing one is DeepSpeed's 0.

A DeepSpeed config that is not a dict or a readable file (transformers also takes base64) is left to the trainer.

`engine_fallback` compares what the settings ask for with the engine accelerate set up: accelerate 1.16 takes its
FSDP branch only for GPU-like devices, so FSDP asked for on CPU processes (`use_cpu`, or a machine without CUDA)
trains as plain DDP over gloo, silently.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DeepSpeedLaunch:
    """DeepSpeed as a run's settings ask for it: `config`, its JSON config when readable here (None when accelerate
    builds it from its own keys, or it cannot be read); `stage`, the ZeRO stage ("0".."3", None when unknown);
    `where`, the setting both come from, for messages ("accelerate launch's ACCELERATE_DEEPSPEED_ZERO_STAGE=3")."""

    config: dict | None
    stage: str | None
    where: str


def flag_on(value: str | None) -> bool:
    """An environment flag as accelerate (`str_to_bool`) and transformers (`strtobool`) read it: 1, true, yes, y, on
    or t, in any case, is on."""
    return value is not None and value.strip().lower() in ("1", "true", "yes", "y", "on", "t")


def fsdp_source(args) -> str | None:
    """Where FSDP is turned on ("the fsdp argument", "accelerate launch's ACCELERATE_USE_FSDP"), or None."""
    if args.fsdp:
        return "the fsdp argument"
    if flag_on(os.environ.get("ACCELERATE_USE_FSDP")):
        return "accelerate launch's ACCELERATE_USE_FSDP"
    return None


def deepspeed_launch(args) -> DeepSpeedLaunch | None:
    """DeepSpeed as `args` and accelerate launch's environment ask for it, or None when DeepSpeed is off."""
    environ = os.environ
    launch_stage = environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    file = environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")  # "none": accelerate's unset
    if args.deepspeed:
        where = "the deepspeed config" + (f" {args.deepspeed}" if isinstance(args.deepspeed, str) else "")
        config = _read(args.deepspeed)
    elif not flag_on(environ.get("ACCELERATE_USE_DEEPSPEED")):
        return None
    elif file != "none":
        where, config = f"accelerate launch's ACCELERATE_DEEPSPEED_CONFIG_FILE {file}", _read(file)
    else:
        where = f"accelerate launch's ACCELERATE_DEEPSPEED_ZERO_STAGE={launch_stage}"
        return DeepSpeedLaunch(None, launch_stage, where)
    if config is None:
        return DeepSpeedLaunch(None, None, where)
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    return DeepSpeedLaunch(config, launch_stage if stage == "auto" else str(stage), where)


def sharding_engine(args) -> str | None:
    """The engine that will shard the model's weights over processes, with the setting it comes from ("FSDP, from
    accelerate launch's ACCELERATE_USE_FSDP"), or None (one process, DDP, DeepSpeed ZeRO-0/1/2); read before either
    accelerate or transformers builds a plugin."""
    fsdp = fsdp_source(args)
    if fsdp is not None:
        return f"FSDP, from {fsdp}"
    deepspeed = deepspeed_launch(args)
    if deepspeed is None or deepspeed.stage != "3":
        return None
    return f"DeepSpeed ZeRO-3, from {deepspeed.where}"


# accelerate's `DistributedType` values, as a run trains under them
ENGINE_NAMES = {
    "NO": "one process, nothing sharded",
    "MULTI_CPU": "DDP over gloo on CPU processes (each holds the whole model, nothing sharded)",
    "MULTI_GPU": "DDP on GPUs (each holds the whole model, nothing sharded)",
}


def engine_fallback(args, distributed_type) -> str | None:
    """One line when the settings ask for FSDP (`fsdp_source`) but accelerate set up `distributed_type` (its
    `DistributedType`, or the value's name) instead, naming the engine the run trains under; None otherwise."""
    source = fsdp_source(args)
    name = getattr(distributed_type, "value", distributed_type)
    if source is None or name == "FSDP":
        return None
    used = ENGINE_NAMES.get(name, name)
    return (
        f"FSDP is asked for ({source}) but accelerate trains this run as {name}: {used}. accelerate takes FSDP only "
        "on GPUs; on a CPU use recipes/accelerate/ddp.yaml, or launch on CUDA devices for FSDP"
    )


def deepspeed_flag_off(value) -> bool:
    """A DeepSpeed config flag read as off, as DeepSpeed's pydantic config reads it (False, 0, "false", "no", ...)."""
    return value is False or str(value).strip().lower() in ("0", "false", "no", "off", "f", "n")


def _read(config: dict | str) -> dict | None:
    """A DeepSpeed config given as a dict or a JSON file's path; None when it cannot be read here."""
    if isinstance(config, str):
        try:
            config = json.loads(Path(config).read_text())
        except (OSError, ValueError):
            return None
    return config if isinstance(config, dict) else None
