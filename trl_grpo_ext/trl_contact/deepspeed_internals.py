"""What gradient regularization reads and writes of a DeepSpeed engine (`accelerate` prepares it; the Trainer holds it
as `trainer.deepspeed`): the engine's count of optimizer steps it skipped (`skipped_steps`, which it also saves in its
checkpoints) and its ZeRO optimizer's clip threshold (`optimizer.clip_grad`, which it clips the gradients to inside
the `backward` that steps). Neither has a setter or getter in DeepSpeed's API. And, to tell whether the engine will
skip a non-finite step itself (`deepspeed_guard_problem`), its parsed config: its public `zero_optimization_stage()`,
`fp16_enabled()`, `bfloat16_enabled()` and `zero_compute_grad_norm()`, and the private
`_config.bfloat16_config.check_grad_overflow`. DeepSpeed is optional, so these are checked when the trainer first
meets an engine (`check_deepspeed_engine`), not at import. Written against DeepSpeed 0.19.8 (ZeRO-1/2's
`DeepSpeedZeroOptimizer`, ZeRO-3's `DeepSpeedZeroOptimizer_Stage3`)."""

from importlib.metadata import PackageNotFoundError, version

from .surface import TRLCompatibilityError

DEEPSPEED_ATTRIBUTES = (
    ("engine", "skipped_steps"),
    ("engine", "zero_optimization_stage"),
    ("engine", "fp16_enabled"),
    ("engine", "bfloat16_enabled"),
    ("engine", "zero_compute_grad_norm"),
    ("engine._config.bfloat16_config", "check_grad_overflow"),
    ("engine.optimizer", "clip_grad"),
)


def check_deepspeed_engine(engine) -> None:
    """Raise if `engine` lacks an attribute of `DEEPSPEED_ATTRIBUTES` (its optimizer's, from ZeRO stage 1 on).

    Raises:
        TRLCompatibilityError: the attribute and the installed DeepSpeed's version.
    """
    config = getattr(engine, "_config", None)
    owners = {
        "engine": engine,
        "engine._config.bfloat16_config": getattr(config, "bfloat16_config", None),
        "engine.optimizer": getattr(engine, "optimizer", None),
    }
    stage_zero = getattr(engine, "zero_optimization_stage", lambda: None)() == 0  # a plain optimizer, refused apart
    for owner, name in DEEPSPEED_ATTRIBUTES:
        if owner == "engine.optimizer" and stage_zero:
            continue
        if not hasattr(owners[owner], name):
            try:
                installed = version("deepspeed")
            except PackageNotFoundError:
                installed = "(not installed)"
            raise TRLCompatibilityError(
                f"DeepSpeed {installed}'s {owner} has no `{name}`, which grad_reg reads (written against DeepSpeed "
                "0.19.8): run without grad_reg, or with a DeepSpeed that has it"
            )


def deepspeed_guard_problem(engine) -> str | None:
    """Why `engine` would not skip a step whose gradient is NaN or infinite by itself, with its clip at grad_reg's
    bound, or would count a loss-scale overflow as such a skip, as a key of `grad_reg.config.UNGUARDED` ("zero_0",
    "fp16", "no_grad_norm", "bf16_unchecked"); None when it does (DeepSpeed 0.19.8: ZeRO-1/2 skip on their overflow
    check or an invalid norm, ZeRO-3 on an invalid norm, in fp32 and bf16)."""
    stage = engine.zero_optimization_stage()
    if stage == 0:
        return "zero_0"
    if engine.fp16_enabled():
        return "fp16"
    if stage < 3 and not engine.zero_compute_grad_norm():
        return "no_grad_norm"
    if stage < 3 and engine.bfloat16_enabled() and not engine._config.bfloat16_config.check_grad_overflow:
        return "bf16_unchecked"
    return None


def deepspeed_skipped_steps(engine) -> int:
    """The optimizer steps `engine` has skipped for a non-finite gradient (or a loss-scale overflow) so far."""
    return int(engine.skipped_steps)


def deepspeed_clip(engine) -> float:
    """The gradient norm `engine` clips to at its next step."""
    return float(engine.optimizer.clip_grad)


def set_deepspeed_clip(engine, value: float) -> None:
    """Make `engine` clip the gradients of its next step to norm `value`."""
    engine.optimizer.clip_grad = value
