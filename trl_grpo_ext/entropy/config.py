"""The settings of entropy regularization: the fields `GRPOConfig` adds for it (`EntropyRegFields`, each documented in
its docstring), their ranges, the modes `entropy_reg` takes and the rules between fields (`ENTROPY_REG_CONFIG`,
composed into `GRPOConfig` by `trl_grpo_ext.config`; the rules are those of `modes.check_config` and each mode's)."""

from dataclasses import dataclass, field

from ..field_checks import ConfigPart, Range
from . import modes
from .modes import ENTROPY_REG_MODES


@dataclass
class EntropyRegFields:
    r"""
    > Parameters that control entropy regularization

    Built on TRL's entropy fields (`entropy_target`, `entropy_coef_min`, `entropy_coef_max`), off unless
    `entropy_reg` names a mode. Entropy is that of the full next-token distribution, in nats.

    entropy_reg (`list[str]`, *optional*, defaults to `[]`):
        Any of the modes registered in `entropy.modes.ENTROPY_REG_MODES` (a string may list several,
        comma-separated; of the modes that pick tokens, `clip_cov` and `kl_cov`, one at most):
        {ENTROPY_REG_MODES}
        Needs TRL's `entropy_coef=0` and `use_adaptive_entropy=False`; `clip_cov` needs a PPO-clipped
        `loss_type` with `importance_sampling_level="token"`. The `target` bonus acts on all completion tokens,
        also when `top_entropy_quantile < 1`; `clip_cov` and `kl_cov` pick among the tokens it keeps.
    entropy_target_ratio (`float`, *optional*):
        The `target` mode's target as a share of the model's own mean token entropy over the run's first
        `entropy_target_window` optimizer steps (per policy group with `entropy_target_per_group`), in (0, 1]:
        "do not let the entropy fall below this share of where the model started". Instead of TRL's absolute
        `entropy_target` (nats), which must then stay at its default.
    entropy_target_window (`int`, *optional*, defaults to `1`):
        Optimizer steps whose measured entropy is the reference of `entropy_target_ratio`; the controller acts
        from the step after. Shorter than `max_steps`. 1: the entropy of the first step, before any update moved
        the model (a longer window averages more tokens, but a run that collapses inside it has no target until
        it ends).
    entropy_target_per_group (`bool`, *optional*, defaults to `False`):
        With `target` and policy groups: one controller and coefficient per policy group, each holding its own
        group's entropy at `entropy_target` (or its own reference times `entropy_target_ratio`).
    entropy_pi_kp (`float`, *optional*, defaults to `2.0`):
        Proportional gain of the `target` controller, in coefficient per nat of entropy error (with
        `entropy_target_ratio`: per unit of error relative to the target, (target − H) / target).
    entropy_pi_ki (`float`, *optional*, defaults to `0.02`):
        Integral gain of the `target` controller, in coefficient per nat per optimizer step (with
        `entropy_target_ratio`: per unit of relative error per step).
    entropy_pi_horizon (`float`, *optional*, defaults to `12.0`):
        Optimizer steps τ the `target` controller looks ahead while the entropy falls: its proportional term acts
        on H + τ·s, s the filtered per-step change of the entropy when negative (`entropy.EntropyPI`). 0 is the
        plain PI controller.
    entropy_pi_noise_band (`float`, *optional*, defaults to `2.0`):
        How many standard errors of the trend s the look-ahead discounts: it acts on min(s + z·σ_s, 0), σ_s
        estimated from the step-to-step changes (`entropy.EntropyPI`), so a fall no larger than the entropy's own
        noise does not set it off. 0: the look-ahead takes every filtered fall at face value.
    clip_cov_ratio (`float`, *optional*, defaults to `0.0002`):
        Clip-Cov: fraction of completion tokens whose gradient is detached (reference implementation's value).
    clip_cov_lb (`float`, *optional*, defaults to `1.0`):
        Clip-Cov: lower bound ω_low of the covariance range tokens are drawn from.
    clip_cov_ub (`float`, *optional*, defaults to `5.0`):
        Clip-Cov: upper bound ω_high of the covariance range tokens are drawn from.
    kl_cov_ratio (`float`, *optional*, defaults to `0.002`):
        KL-Cov: fraction of completion tokens, the top ones by covariance, that get the penalty.
    kl_cov_coef (`float`, *optional*, defaults to `1.0`):
        KL-Cov: coefficient β of the penalty β·|log π − log π_old| on those tokens.
    entropy_advantage_coef (`float`, *optional*, defaults to `0.05`):
        τ of the `advantage` mode, in advantage units per nat.
    entropy_advantage_kappa (`float`, *optional*, defaults to `2.0`):
        κ of the `advantage` mode: the shift is at most |A|/κ (arXiv:2506.14758 uses 2), so it never flips an
        advantage's sign and a zero advantage stays zero.
    """

    entropy_reg: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Entropy-regularization modes, comma-separated: " + ENTROPY_REG_MODES.help() + ".",
        },
    )
    entropy_target_ratio: float | None = field(
        default=None,
        metadata={"help": "target mode: the target as a share of the model's own entropy over the first "
                  "entropy_target_window steps, in (0, 1]; instead of entropy_target (nats)."},
    )  # fmt: skip
    entropy_target_window: int = field(
        default=1, metadata={"help": "Optimizer steps whose entropy is the reference of entropy_target_ratio."}
    )
    entropy_target_per_group: bool = field(
        default=False, metadata={"help": "With target and policy groups: one controller per policy group."}
    )
    entropy_pi_kp: float = field(
        default=2.0,
        metadata={"help": "Proportional gain of the target controller (coefficient per nat; with "
                  "entropy_target_ratio, per unit of error relative to the target)."},
    )  # fmt: skip
    entropy_pi_ki: float = field(
        default=0.02,
        metadata={"help": "Integral gain of the target controller (coefficient per nat per step; with "
                  "entropy_target_ratio, per unit of relative error per step)."},
    )  # fmt: skip
    entropy_pi_horizon: float = field(
        default=12.0,
        metadata={"help": "Steps ahead the target controller looks when the entropy falls (0: plain PI control)."},
    )
    entropy_pi_noise_band: float = field(
        default=2.0,
        metadata={"help": "Standard errors of the entropy's trend the target controller's look-ahead discounts "
                  "(0: every filtered fall at face value)."},
    )  # fmt: skip
    clip_cov_ratio: float = field(
        default=0.0002, metadata={"help": "Clip-Cov: fraction of completion tokens whose gradient is detached."}
    )
    clip_cov_lb: float = field(default=1.0, metadata={"help": "Clip-Cov: lower bound of the covariance range."})
    clip_cov_ub: float = field(default=5.0, metadata={"help": "Clip-Cov: upper bound of the covariance range."})
    kl_cov_ratio: float = field(
        default=0.002, metadata={"help": "KL-Cov: fraction of completion tokens (top by covariance) penalized."}
    )
    kl_cov_coef: float = field(
        default=1.0, metadata={"help": "KL-Cov: coefficient of the penalty |log pi - log pi_old|."}
    )
    entropy_advantage_coef: float = field(
        default=0.05, metadata={"help": "tau of the advantage mode, in advantage units per nat."}
    )
    entropy_advantage_kappa: float = field(
        default=2.0, metadata={"help": "kappa of the advantage mode: the shift is at most |A|/kappa."}
    )


# The docstring lists the modes as registered (`Registry.describe`), so a new mode is documented by its summary: at 8
# columns here and 12 in `GRPOConfig`'s docstring, wrapped at 119 there.
EntropyRegFields.__doc__ = EntropyRegFields.__doc__.replace(
    "        {ENTROPY_REG_MODES}", ENTROPY_REG_MODES.describe(" " * 8, width=115)
)

ENTROPY_REG_CONFIG = ConfigPart(
    EntropyRegFields,
    ranges={
        "entropy_pi_kp": Range(0, 1000),
        "entropy_pi_ki": Range(0, 1000),
        "entropy_pi_horizon": Range(0, 10000),
        "entropy_pi_noise_band": Range(0, 100),
        "clip_cov_ratio": Range(0, 1, low_open=True),
        "clip_cov_lb": Range(-1e9, 1e9),
        "clip_cov_ub": Range(-1e9, 1e9),
        "kl_cov_ratio": Range(0, 1, low_open=True),
        "kl_cov_coef": Range(0, 1000),
        "entropy_advantage_coef": Range(0, 1000),
        "entropy_advantage_kappa": Range(1, 1e6),
        "entropy_target_ratio": Range(0, 1, low_open=True),
        "entropy_target_window": Range(1),
    },
    # read when a config is checked, so a mode registered later (a plugin, a test) is accepted
    modes={"entropy_reg": ENTROPY_REG_MODES},
    checks=(modes.check_config,),
)
