"""The settings of adaptive gradient regularization: the fields `GRPOConfig` adds for it (`GradRegFields`, each
documented in its docstring), their ranges, the modes `grad_reg` takes and the rules between fields (`GRAD_REG_CONFIG`,
composed into `GRPOConfig` by `trl_grpo_ext.config`; the rules are those of `modes.check_config` and each mode's)."""

from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

from packaging.version import Version

from ..field_checks import ConfigPart, Range
from ..launch_engine import deepspeed_flag_off as off
from ..launch_engine import deepspeed_launch
from . import modes
from .modes import GRAD_REG_MODES


@dataclass
class GradRegFields:
    r"""
    > Parameters that control adaptive gradient regularization

    grad_reg (`list[str]`, *optional*, defaults to `[]`):
        Any of the modes registered in `grad_reg.modes.GRAD_REG_MODES` (a string may list several,
        comma-separated):
        {GRAD_REG_MODES}
        Any entry turns on the non-finite guard: an optimizer step whose gradient norm is NaN or Inf is skipped
        (parameters and optimizer state unchanged; the learning-rate schedule still advances). Applied where the
        Trainer clips gradients; needs `max_grad_norm > 0`, which stays the upper bound.
    zclip_alpha (`float`, *optional*, defaults to `0.97`):
        Decay of ZClip's moving mean and variance of the gradient norm.
    zclip_z_threshold (`float`, *optional*, defaults to `2.5`):
        z-score above which ZClip clips.
    zclip_warmup_steps (`int`, *optional*, defaults to `25`):
        Optimizer steps whose norms start ZClip's statistics (an integer >= 2; 10 or more gives a usable variance);
        only `max_grad_norm` clips during them.
    agc_clip (`float`, *optional*, defaults to `0.01`):
        AGC's λ: a unit's gradient norm is kept at most λ·max(‖W_unit‖, `agc_eps`). LoRA factors that PEFT
        initializes to zero (`lora_B`, `lora_embedding_A`) are exempt, since their bound would be λ·ε; the global
        norm clip still bounds them.
    agc_eps (`float`, *optional*, defaults to `0.001`):
        AGC's ε, the smallest weight norm used in the bound.
    grad_reg_max_skips (`int`, *optional*, defaults to `10`):
        After this many consecutive skipped (non-finite) steps, save a checkpoint and stop with an error.
    kl_target (`float`, *optional*):
        Adaptive KL (Ziegler et al. 2019, arXiv:1909.08593, Sec. 2.2): the KL to the reference policy, in nats
        per token, that β is steered towards. Needs `beta > 0`.
    kl_horizon (`int`, *optional*, defaults to `10000`):
        Adaptive KL's horizon, in completions: β ← β·(1 + clip(KL/kl_target − 1, −0.2, 0.2)·n/kl_horizon), n
        the completions of one optimizer step.
    """

    grad_reg: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Gradient-regularization modes, comma-separated: " + GRAD_REG_MODES.help() + ". Any entry skips "
            "optimizer steps whose gradient norm is NaN or Inf. Needs max_grad_norm > 0.",
        },
    )
    zclip_alpha: float = field(default=0.97, metadata={"help": "Decay of ZClip's moving mean and variance."})
    zclip_z_threshold: float = field(default=2.5, metadata={"help": "z-score above which ZClip clips."})
    zclip_warmup_steps: int = field(
        default=25, metadata={"help": "Optimizer steps whose norms start ZClip's statistics."}
    )
    agc_clip: float = field(default=0.01, metadata={"help": "AGC's lambda: unit gradient norm <= lambda ||W||."})
    agc_eps: float = field(default=0.001, metadata={"help": "AGC's epsilon, the smallest weight norm used."})
    grad_reg_max_skips: int = field(
        default=10, metadata={"help": "Consecutive skipped steps after which training saves a checkpoint and stops."}
    )
    kl_target: float | None = field(
        default=None, metadata={"help": "Adaptive KL (arXiv:1909.08593): target KL in nats per token. Needs beta > 0."}
    )
    kl_horizon: int = field(default=10000, metadata={"help": "Adaptive KL's horizon, in completions."})


# The docstring lists the modes as registered (`Registry.describe`), so a new mode is documented by its summary: at 8
# columns here and 12 in `GRPOConfig`'s docstring, wrapped at 119 there.
GradRegFields.__doc__ = GradRegFields.__doc__.replace(
    "        {GRAD_REG_MODES}", GRAD_REG_MODES.describe(" " * 8, width=115)
)

# The oldest DeepSpeed that skips a step whose gradient is NaN or infinite in fp32 and bf16 under every ZeRO stage:
# 0.19.0-0.19.7 apply such a step under ZeRO-2 in fp32, and their ZeRO-3 checks for overflow in fp16 only
# (docs/features/grad-reg.md gives the measurement).
DEEPSPEED_FLOOR = "0.19.8"


def check_deepspeed(args) -> None:
    """The non-finite guard under DeepSpeed, which steps inside `backward` before the guard can look: refused where
    DeepSpeed itself would apply a NaN or infinite step, or count fp16 loss-scale overflows as skipped steps (a
    release older than `DEEPSPEED_FLOOR`, or what `_unguarded` reads in its config), before the model loads
    (`launch_engine`).

    Raises:
        ValueError: one line naming `grad_reg`, the DeepSpeed setting or version and the way out.
    """
    if not args.grad_reg:
        return
    deepspeed = deepspeed_launch(args)
    if deepspeed is None:
        return
    try:
        installed = version("deepspeed")
    except PackageNotFoundError:  # transformers refuses a DeepSpeed config without it
        return
    if Version(installed) < Version(DEEPSPEED_FLOOR):
        raise ValueError(
            f"grad_reg={args.grad_reg} under DeepSpeed ({deepspeed.where}) needs deepspeed>={DEEPSPEED_FLOOR}, found "
            f"{installed}: older releases write a step whose gradient is NaN or infinite into the weights (fp32 and "
            "bf16), before any guard can skip it; upgrade DeepSpeed, or drop grad_reg"
        )
    problem = _unguarded(deepspeed.config or {}, deepspeed.stage)
    if problem is not None:
        raise ValueError(f"grad_reg={args.grad_reg} under DeepSpeed ({deepspeed.where}): {UNGUARDED[problem]}; drop "
                         "grad_reg or change that setting")  # fmt: skip


# Why DeepSpeed would not skip a step whose gradient is NaN or infinite by itself, or would count its fp16 loss-scale
# overflows as such skips, by the key `_unguarded` (from the config read here) and
# `trl_contact.deepspeed_guard_problem` (from the config DeepSpeed parsed, at the first step) return
UNGUARDED = {
    "zero_0": "ZeRO stage 0 steps with the plain optimizer, which neither clips at grad_reg's bound nor skips a step",
    "fp16": "fp16 loss scaling counts each loss-scale overflow as a skipped step, which grad_reg cannot tell apart",
    "no_grad_norm": "zero_optimization.compute_grad_norm is off, so DeepSpeed neither reports the norm nor checks it",
    "bf16_unchecked": "bf16.check_grad_overflow is off, so DeepSpeed applies a step whose gradient is NaN or infinite",
}


def _unguarded(config: dict, stage: str | None) -> str | None:
    """The key of `UNGUARDED` that DeepSpeed with `config` (its JSON, as far as it can be read here) at ZeRO `stage`
    falls under; None when nothing read here says so."""
    bf16 = config.get("bf16") or config.get("bfloat16") or {}  # "bfloat16": DeepSpeed's older name
    if stage == "0":
        return "zero_0"
    if not off((config.get("fp16") or {}).get("enabled", False)):
        return "fp16"
    if stage in ("1", "2") and off((config.get("zero_optimization") or {}).get("compute_grad_norm", True)):
        return "no_grad_norm"
    if stage in ("1", "2") and not off(bf16.get("enabled", False)) and off(bf16.get("check_grad_overflow", True)):
        return "bf16_unchecked"
    return None


def check_grad_reg_engine(args) -> None:
    """The rules of `grad_reg` that read the launch's engine (`check_deepspeed`, and each mode's `check`: `agc` under
    DeepSpeed or FSDP), for `GRPOConfig.__post_init__` to run before TrainingArguments builds the DeepSpeed plugin
    (which needs DeepSpeed installed). They run again with the other rules.

    Raises:
        ValueError: what `check_deepspeed` or a mode's `check` refuses.
    """
    check_deepspeed(args)
    for mode in GRAD_REG_MODES.values():
        mode.check(args)


GRAD_REG_CONFIG = ConfigPart(
    GradRegFields,
    ranges={
        "zclip_alpha": Range(0, 1, low_open=True, high_open=True),
        "zclip_z_threshold": Range(0, 1000, low_open=True),
        "zclip_warmup_steps": Range(2),
        "agc_clip": Range(0, 1000, low_open=True),
        "agc_eps": Range(0, 1, low_open=True),
        "grad_reg_max_skips": Range(1),
        "kl_target": Range(0, 1000, low_open=True),
        "kl_horizon": Range(1),
    },
    # read when a config is checked, so a mode registered later (a plugin, a test) is accepted
    modes={"grad_reg": GRAD_REG_MODES},
    checks=(modes.check_config, check_deepspeed),
)
