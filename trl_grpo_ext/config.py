"""`GRPOConfig`: TRL's GRPO configuration plus this package's settings, every one of them off by default."""

import dataclasses
from dataclasses import dataclass, field

from trl.trainer.grpo_config import GRPOConfig as TRLGRPOConfig  # TRL's class, also after register()

POLICY_GROUP_FEATURES = ("tfidf", "embedding")
POLICY_GROUP_WEIGHT_RULES = ("progress", "deficit")
POLICY_GROUP_SAMPLING = ("uniform", "weighted", "uncertainty")
ADVANTAGE_BASELINES = ("prompt", "policy_group")


def policy_grouping_requested(args) -> bool:
    """Whether a config asks for policy grouping (the trainer's `policy_group_fn` also turns it on)."""
    return args.policy_group_column is not None or args.policy_group_features is not None


@dataclass
class GRPOConfig(TRLGRPOConfig):
    r"""
    Configuration for [`trl_grpo_ext.GRPOTrainer`]: every field of [`trl.GRPOConfig`] keeps its meaning and default.

    This class is a drop-in replacement: `from trl_grpo_ext import GRPOConfig` instead of `from trl import GRPOConfig`
    changes nothing until one of this package's settings is turned on. With every setting at its default, a run is
    numerically identical to stock TRL GRPO (`tests/test_equivalence.py` proves it).

    Parameters:
        > Parameters that control dynamic policy grouping

        A *policy group* is a set of prompts sharing a task, data source, difficulty or cluster; it is not GRPO's
        generation group (the `num_generations` completions of one prompt). Grouping is on when
        `policy_group_column` or `policy_group_features` is set, or the trainer gets `policy_group_fn`.

        policy_group_column (`str`, *optional*):
            Dataset column whose values name each prompt's policy group (e.g. `task`, `source`, `difficulty`).
        policy_group_features (`str`, *optional*):
            Cluster prompts by k-means into `num_policy_groups` groups over these features: `tfidf` (TF-IDF of the
            prompt text) or `embedding` (mean-pooled input embeddings of the policy model). Used alone, or with
            `policy_group_refine_step` to split column groups into sub-clusters.
        num_policy_groups (`int`, *optional*, defaults to `4`):
            Number of k-means clusters when grouping by `policy_group_features` alone.
        policy_group_refine_step (`int`, *optional*):
            Coarse to fine: at this global step, split each group into `policy_group_refine_parts` k-means
            sub-clusters (features: `policy_group_features`, else `tfidf`), keeping at most `max_policy_groups`.
        policy_group_refine_parts (`int`, *optional*, defaults to `2`):
            Sub-clusters per group at `policy_group_refine_step`.
        max_policy_groups (`int`, *optional*, defaults to `8`):
            Upper bound on the number of policy groups (refining and splitting stop there).
        min_policy_groups (`int`, *optional*, defaults to `2`):
            Lower bound on the number of policy groups (merging stops there).
        policy_group_min_size (`int`, *optional*, defaults to `8`):
            Fewest prompts a group may have; smaller groups are merged into the nearest one, and a split must leave
            both halves at least this size.
        policy_group_ema (`float`, *optional*, defaults to `0.9`):
            Decay of the exponential moving averages of each group's statistics (0 keeps only the last batch).
        policy_group_update_steps (`int`, *optional*, defaults to `10`):
            Global steps between two weight updates (the window over which reward progress is measured).
        policy_group_weight_rule (`str`, *optional*, defaults to `"progress"`):
            `progress`: α_i ← α_i·(1 + η·ΔR_i), ΔR_i = group i's change in EMA reward over the window minus the
            mean change over groups. `deficit`: α_i ← α_i·(1 + η·(R̄ − R_i)), favouring groups below the mean
            reward R̄.
        policy_group_eta (`float`, *optional*, defaults to `0.1`):
            Step size η of the weight update.
        policy_group_weight_min (`float`, *optional*, defaults to `0.2`):
            Lower bound of a group weight (weights have mean 1 over groups).
        policy_group_weight_max (`float`, *optional*, defaults to `5.0`):
            Upper bound of a group weight.
        policy_group_loss_weighting (`bool`, *optional*, defaults to `True`):
            Multiply each completion's advantage by its group's weight, normalised to mean 1 over the batch so the
            loss scale is unchanged.
        policy_group_sampling (`str`, *optional*, defaults to `"uniform"`):
            Which prompts a generation batch holds: `uniform` (TRL's order), `weighted` (groups drawn in proportion
            to weight), `uncertainty` (weight × uncertainty: p(1−p) of the group's success rate for binary rewards,
            else its mean within-prompt reward std).
        policy_group_sampling_floor (`float`, *optional*, defaults to `0.05`):
            Every group with prompts is drawn with probability at least `floor / number of groups`.
        advantage_baseline (`str`, *optional*, defaults to `"prompt"`):
            `prompt`: GRPO's baseline, the mean reward of the prompt's generation group. `policy_group`: the mean
            reward of the completion's policy group in the batch (R_i − R̄_G), scaled as `scale_rewards` says.
        policy_group_regroup_steps (`int`, *optional*):
            Every this many global steps, merge two groups whose EMA reward and reward std both differ by less than
            `policy_group_merge_tol`, and split a group whose per-prompt success rates are bimodal.
        policy_group_merge_tol (`float`, *optional*, defaults to `0.05`):
            Tolerance of the merge rule, in reward units.
        policy_group_split_gap (`float`, *optional*, defaults to `0.6`):
            Smallest gap between the two 2-means centres of per-prompt success rates that counts as bimodal (success
            rates spread evenly over [0, 1] give a gap of 0.5, so keep it above that).
    """

    policy_group_column: str | None = field(
        default=None,
        metadata={"help": "Dataset column whose values name each prompt's policy group (e.g. task, difficulty)."},
    )
    policy_group_features: str | None = field(
        default=None,
        metadata={
            "help": "Cluster prompts by k-means into num_policy_groups groups over these features: tfidf (TF-IDF of "
            "the prompt text) or embedding (mean-pooled input embeddings of the policy model).",
            "choices": list(POLICY_GROUP_FEATURES),
        },
    )
    num_policy_groups: int = field(
        default=4, metadata={"help": "Number of k-means clusters when grouping by policy_group_features alone."}
    )
    policy_group_refine_step: int | None = field(
        default=None,
        metadata={
            "help": "Coarse to fine: at this global step, split each group into policy_group_refine_parts k-means "
            "sub-clusters, keeping at most max_policy_groups."
        },
    )
    policy_group_refine_parts: int = field(
        default=2, metadata={"help": "Sub-clusters per group at policy_group_refine_step."}
    )
    max_policy_groups: int = field(default=8, metadata={"help": "Upper bound on the number of policy groups."})
    min_policy_groups: int = field(default=2, metadata={"help": "Lower bound on the number of policy groups."})
    policy_group_min_size: int = field(
        default=8,
        metadata={"help": "Fewest prompts a policy group may have; smaller groups merge into the nearest one."},
    )
    policy_group_ema: float = field(
        default=0.9, metadata={"help": "Decay of the moving averages of each group's statistics."}
    )
    policy_group_update_steps: int = field(
        default=10, metadata={"help": "Global steps between two weight updates (the progress window)."}
    )
    policy_group_weight_rule: str = field(
        default="progress",
        metadata={
            "help": "progress: a_i <- a_i (1 + eta dR_i), dR_i = the group's EMA reward change over the window minus "
            "the mean change; deficit: a_i <- a_i (1 + eta (mean R - R_i)).",
            "choices": list(POLICY_GROUP_WEIGHT_RULES),
        },
    )
    policy_group_eta: float = field(default=0.1, metadata={"help": "Step size eta of the weight update."})
    policy_group_weight_min: float = field(default=0.2, metadata={"help": "Lower bound of a group weight."})
    policy_group_weight_max: float = field(default=5.0, metadata={"help": "Upper bound of a group weight."})
    policy_group_loss_weighting: bool = field(
        default=True,
        metadata={"help": "Multiply each advantage by its group's weight, normalised to mean 1 over the batch."},
    )
    policy_group_sampling: str = field(
        default="uniform",
        metadata={
            "help": "uniform (TRL's order), weighted (groups in proportion to weight) or uncertainty (weight x "
            "uncertainty).",
            "choices": list(POLICY_GROUP_SAMPLING),
        },
    )
    policy_group_sampling_floor: float = field(
        default=0.05, metadata={"help": "Every group is drawn with probability at least floor / number of groups."}
    )
    advantage_baseline: str = field(
        default="prompt",
        metadata={
            "help": "prompt (GRPO: the generation group's mean reward) or policy_group (the policy group's batch "
            "mean), scaled as scale_rewards says.",
            "choices": list(ADVANTAGE_BASELINES),
        },
    )
    policy_group_regroup_steps: int | None = field(
        default=None, metadata={"help": "Global steps between two merge/split checks; unset: no regrouping."}
    )
    policy_group_merge_tol: float = field(
        default=0.05, metadata={"help": "Merge two groups whose EMA reward and reward std differ by less than this."}
    )
    policy_group_split_gap: float = field(
        default=0.6, metadata={"help": "Gap between 2-means centres of per-prompt success rates that is bimodal."}
    )

    def __post_init__(self):
        super().__post_init__()
        self._check_policy_group_fields()

    def _check_policy_group_fields(self) -> None:
        choices = {
            "policy_group_features": (self.policy_group_features, (None, *POLICY_GROUP_FEATURES)),
            "policy_group_weight_rule": (self.policy_group_weight_rule, POLICY_GROUP_WEIGHT_RULES),
            "policy_group_sampling": (self.policy_group_sampling, POLICY_GROUP_SAMPLING),
            "advantage_baseline": (self.advantage_baseline, ADVANTAGE_BASELINES),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
        at_least_one = {
            "num_policy_groups": self.num_policy_groups,
            "policy_group_refine_parts": self.policy_group_refine_parts,
            "min_policy_groups": self.min_policy_groups,
            "policy_group_min_size": self.policy_group_min_size,
            "policy_group_update_steps": self.policy_group_update_steps,
            "policy_group_refine_step": self.policy_group_refine_step,
            "policy_group_regroup_steps": self.policy_group_regroup_steps,
        }
        for name, value in at_least_one.items():
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.policy_group_refine_parts < 2:
            raise ValueError(f"policy_group_refine_parts must be >= 2, got {self.policy_group_refine_parts}")
        if self.advantage_baseline == "policy_group" and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "advantage_baseline='policy_group' works on the weighted sum of rewards: it needs "
                f"multi_objective_aggregation='sum_then_normalize', got {self.multi_objective_aggregation!r}"
            )
        if not self.min_policy_groups <= self.num_policy_groups <= self.max_policy_groups:
            raise ValueError(
                f"need min_policy_groups ({self.min_policy_groups}) <= num_policy_groups ({self.num_policy_groups}) "
                f"<= max_policy_groups ({self.max_policy_groups})"
            )
        if not 0.0 <= self.policy_group_ema < 1.0:
            raise ValueError(f"policy_group_ema must be in [0, 1), got {self.policy_group_ema}")
        if not 0.0 < self.policy_group_eta <= 10.0:
            raise ValueError(f"policy_group_eta must be in (0, 10], got {self.policy_group_eta}")
        if not 0.0 <= self.policy_group_sampling_floor <= 1.0:
            raise ValueError(f"policy_group_sampling_floor must be in [0, 1], got {self.policy_group_sampling_floor}")
        if not 0.0 < self.policy_group_weight_min <= 1.0 <= self.policy_group_weight_max:
            raise ValueError(
                f"need 0 < policy_group_weight_min ({self.policy_group_weight_min}) <= 1 <= policy_group_weight_max "
                f"({self.policy_group_weight_max}): weights have mean 1"
            )
        if self.policy_group_merge_tol < 0 or not 0 < self.policy_group_split_gap <= 1:
            raise ValueError(
                f"need policy_group_merge_tol >= 0 (got {self.policy_group_merge_tol}) and 0 < policy_group_split_gap "
                f"<= 1 (got {self.policy_group_split_gap})"
            )
        if policy_grouping_requested(self) and self.remove_unused_columns:
            raise ValueError(
                "policy grouping needs remove_unused_columns=False (got True): the trainer reads each row's policy "
                "group from the dataset"
            )

    @classmethod
    def add_defaults(cls, args: TRLGRPOConfig) -> TRLGRPOConfig:
        """Give a TRL `GRPOConfig` (or a user's subclass of it) this package's settings at their defaults, in place.

        For scripts that pass TRL's config to our trainer: `args` stays the same object, of the same class, with
        every value it had; only the fields this package adds are set, off. Returns `args`.

        Raises:
            TypeError: `args` is not a TRL `GRPOConfig`.
        """
        if not isinstance(args, TRLGRPOConfig):
            raise TypeError(f"args must be a trl.GRPOConfig, got {type(args).__module__}.{type(args).__name__}")
        for f in dataclasses.fields(cls):
            if not hasattr(args, f.name):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                setattr(args, f.name, default)
        return args
