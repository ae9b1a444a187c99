"""What gradient regularization reads and writes of a DeepSpeed engine (`accelerate` prepares it; the Trainer holds it
as `trainer.deepspeed`): the engine's count of optimizer steps it skipped (`skipped_steps`, which it also saves in its
checkpoints) and its ZeRO optimizer's clip threshold (`optimizer.clip_grad`, which it clips the gradients to inside
the `backward` that steps). Neither has a setter or getter in DeepSpeed's API. DeepSpeed is optional, so these are
checked when the trainer first meets an engine (`check_deepspeed_engine`), not at import. Written against DeepSpeed
0.19.8 (ZeRO-1/2's `DeepSpeedZeroOptimizer`, ZeRO-3's `DeepSpeedZeroOptimizer_Stage3`)."""

from importlib.metadata import PackageNotFoundError, version

from .surface import TRLCompatibilityError

DEEPSPEED_ATTRIBUTES = (("engine", "skipped_steps"), ("engine.optimizer", "clip_grad"))


def check_deepspeed_engine(engine) -> None:
    """Raise if `engine` lacks an attribute of `DEEPSPEED_ATTRIBUTES`.

    Raises:
        TRLCompatibilityError: the attribute and the installed DeepSpeed's version.
    """
    owners = {"engine": engine, "engine.optimizer": getattr(engine, "optimizer", None)}
    for owner, name in DEEPSPEED_ATTRIBUTES:
        if not hasattr(owners[owner], name):
            try:
                installed = version("deepspeed")
            except PackageNotFoundError:
                installed = "(not installed)"
            raise TRLCompatibilityError(
                f"DeepSpeed {installed}'s {owner} has no `{name}`, which grad_reg reads (written against DeepSpeed "
                "0.19.8): run without grad_reg, or with a DeepSpeed that has it"
            )


def deepspeed_skipped_steps(engine) -> int:
    """The optimizer steps `engine` has skipped for a non-finite gradient (or a loss-scale overflow) so far."""
    return int(engine.skipped_steps)


def deepspeed_clip(engine) -> float:
    """The gradient norm `engine` clips to at its next step."""
    return float(engine.optimizer.clip_grad)


def set_deepspeed_clip(engine, value: float) -> None:
    """Make `engine` clip the gradients of its next step to norm `value`."""
    engine.optimizer.clip_grad = value
