"""The settings of dynamic policy grouping and of its training stages: the fields `GRPOConfig` adds for them
(`PolicyGroupFields`, each documented in its docstring), their ranges and the rules between them
(`POLICY_GROUP_CONFIG`, composed into `GRPOConfig` by `trl_grpo_ext.config`)."""

from dataclasses import dataclass, field

from ..field_checks import ConfigPart, Range

POLICY_GROUP_FEATURES = ("tfidf", "embedding")
POLICY_GROUP_WEIGHT_RULES = ("learnability", "progress", "deficit")
POLICY_GROUP_SAMPLING = ("learnability", "uncertainty", "weighted", "uniform")
ADVANTAGE_BASELINES = ("prompt", "policy_group")


def policy_grouping_requested(args) -> bool:
    """Whether a config asks for policy grouping (the trainer's `policy_group_fn` also turns it on)."""
    return args.policy_group_column is not None or args.policy_group_features is not None


def stages_requested(args) -> bool:
    """Whether a config asks for the training stages of policy grouping (a warm-up or a fusion)."""
    return args.policy_group_warmup_steps is not None or args.policy_group_fusion_start is not None


@dataclass
class PolicyGroupFields:
    r"""
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
        Global steps between two weight updates of the `progress` and `deficit` rules (the window over which
        reward progress is measured); the `learnability` rule updates every step.
    policy_group_weight_rule (`str`, *optional*, defaults to `"learnability"`):
        `learnability`: α_i = (d_i + 0.05)·s_i, d_i group i's reward deficit over the range of group rewards (1
        for the lowest, 0 for the highest; the range floored by `policy_group_deficit_z`), s_i = 0.2 for a group
        that looks like noise (no learning progress since its start, z < 2, while more than half of its prompts
        still have completions that disagree: a coin flip), else 1; updated every step (`policy_groups.weights`
        module docstring). `progress`: the design's α_i ← α_i·(1 + η·ΔR_i), ΔR_i = group i's change in EMA
        reward over the window minus the mean change over groups. `deficit`: α_i ← α_i·(1 + η·(R̄ − R_i)),
        favouring groups below the mean reward R̄.
    policy_group_eta (`float`, *optional*, defaults to `0.1`):
        Step size η of the `progress` and `deficit` updates.
    policy_group_progress_halflife (`float`, *optional*, defaults to `48.0`):
        `learnability` rule: a group's start reward is its mean over its first this many completions, its recent
        reward an EMA with this half-life in completions; a group is judged after twice this many.
    policy_group_weight_min (`float`, *optional*, defaults to `0.05`):
        Lower bound of a group weight (weights have mean 1 over groups).
    policy_group_weight_max (`float`, *optional*, defaults to `2.0`):
        Upper bound of a group weight.
    policy_group_weight_smoothing (`float`, *optional*, defaults to `1.0`):
        λ, the share of the rule's new weights taken at each update: w ← (1 − λ)·w + λ·w_rule, renormalised (an
        exponential moving average of the rule's weights over about 1/λ updates, so that a weight follows the
        rule's trend, not its step-to-step noise); 1: the rule's weights as they are.
    policy_group_deficit_z (`float`, *optional*, defaults to `2.0`):
        `learnability` rule: the reward deficit is measured over max(R_max − R_min, z·SE), SE the standard error of
        the difference between the highest and the lowest group's recent reward, so groups whose rewards differ by
        less than the noise get nearly equal weights instead of the rule's full swing (which noise flips from step
        to step); 0: over the range alone, no floor.
    policy_group_loss_weighting (`bool`, *optional*, defaults to `True`):
        Multiply each completion's advantage by its group's weight, normalised to mean 1 over the batch so the
        loss scale is unchanged.
    policy_group_sampling (`str`, *optional*, defaults to `"learnability"`):
        Which prompts a generation batch holds: `learnability` (groups drawn in proportion to size × weight ×
        informative share f/(f + 0.05), f the share of the group's prompts whose completions disagree, so solved
        and hopeless groups fade out), `uniform` (TRL's order), `weighted` (groups drawn in proportion to
        weight), `uncertainty` (weight × uncertainty: p(1−p) of the group's success rate for binary rewards,
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

    > Parameters that control the training stages of policy grouping

    Off unless `policy_group_warmup_steps` or `policy_group_fusion_start` is set; then a run goes through
    warm-up (every policy group treated alike: weights 1, prompts drawn uniformly, statistics gathered, no merge
    or split), competition (the weight and sampling rules act) and fusion (the groups that did well merged by the
    merge rule, weights and draw annealed back to uniform). `trl_grpo_ext.policy_groups.stages` says more.

    policy_group_warmup_steps (`int`, *optional*):
        Warm-up lasts until this global step (with `policy_group_warmup_plateau`: at most until it).
    policy_group_warmup_plateau (`bool`, *optional*, defaults to `False`):
        End warm-up earlier, once the overall reward's trend flattens: the rise of the least-squares line through
        the last `policy_group_plateau_window` generation batches' mean rewards, plus its standard error, is below
        `policy_group_plateau_tol` × the mean within-batch reward std.
    policy_group_plateau_window (`int`, *optional*, defaults to `16`):
        Generation batches the reward's trend is fitted over (at least 3).
    policy_group_plateau_tol (`float`, *optional*, defaults to `0.1`):
        A rise below this many reward stds over the window is flat.
    policy_group_fusion_start (`float`, *optional*):
        Fusion starts at this global step (a whole number >= 1) or at this fraction of the run's steps (0 < x < 1,
        of `max_steps` or of the steps `num_train_epochs` comes to), as transformers' `save_steps` reads a ratio.
    policy_group_fusion_anneal_steps (`int`, *optional*, defaults to `10`):
        Global steps over which fusion moves the weights and the draw linearly back to uniform (0: at once).
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
        default="learnability",
        metadata={
            "help": "learnability: (reward deficit + 0.05) x 0.2 for groups that look like noise; progress: a_i <- "
            "a_i (1 + eta dR_i), dR_i = the group's EMA reward change over the window minus the mean change; "
            "deficit: a_i <- a_i (1 + eta (mean R - R_i)).",
            "choices": list(POLICY_GROUP_WEIGHT_RULES),
        },
    )
    policy_group_eta: float = field(default=0.1, metadata={"help": "Step size eta of the weight update."})
    policy_group_progress_halflife: float = field(
        default=48.0,
        metadata={"help": "learnability rule: completions in a group's start reward, half-life in completions of its "
                  "recent reward EMA."},
    )  # fmt: skip
    policy_group_weight_min: float = field(default=0.05, metadata={"help": "Lower bound of a group weight."})
    policy_group_weight_max: float = field(default=2.0, metadata={"help": "Upper bound of a group weight."})
    policy_group_weight_smoothing: float = field(
        default=1.0, metadata={"help": "Share of the rule's new weights taken at each update (1: no smoothing)."}
    )
    policy_group_deficit_z: float = field(
        default=2.0,
        metadata={"help": "learnability rule: the deficit is over max(reward range, z x its standard error); 0: the "
                  "range alone."},
    )  # fmt: skip
    policy_group_loss_weighting: bool = field(
        default=True,
        metadata={"help": "Multiply each advantage by its group's weight, normalised to mean 1 over the batch."},
    )
    policy_group_sampling: str = field(
        default="learnability",
        metadata={
            "help": "learnability (size x weight x informative share), uniform (TRL's order), weighted (groups in "
            "proportion to weight) or uncertainty (weight x uncertainty).",
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
    policy_group_warmup_steps: int | None = field(
        default=None,
        metadata={"help": "Warm-up (all policy groups alike) until this global step; with the plateau rule, at most."},
    )
    policy_group_warmup_plateau: bool = field(
        default=False, metadata={"help": "End warm-up earlier, once the overall reward's trend flattens."}
    )
    policy_group_plateau_window: int = field(
        default=16, metadata={"help": "Generation batches the reward's trend is fitted over (at least 3)."}
    )
    policy_group_plateau_tol: float = field(
        default=0.1, metadata={"help": "A rise below this many reward stds over the window is flat."}
    )
    policy_group_fusion_start: float | None = field(
        default=None,
        metadata={"help": "Fusion from this global step (>= 1) or this fraction of the run's steps (0 < x < 1)."},
    )
    policy_group_fusion_anneal_steps: int = field(
        default=10, metadata={"help": "Steps over which fusion moves weights and draw back to uniform (0: at once)."}
    )


def check_policy_group_fields(args) -> None:
    """Rules between policy-group fields (each field alone is checked by its declaration)."""
    if args.advantage_baseline == "policy_group" and args.multi_objective_aggregation != "sum_then_normalize":
        raise ValueError(
            "advantage_baseline='policy_group' works on the weighted sum of rewards: it needs "
            f"multi_objective_aggregation='sum_then_normalize', got {args.multi_objective_aggregation!r}"
        )
    if not args.min_policy_groups <= args.num_policy_groups <= args.max_policy_groups:
        raise ValueError(
            f"need min_policy_groups ({args.min_policy_groups}) <= num_policy_groups ({args.num_policy_groups}) "
            f"<= max_policy_groups ({args.max_policy_groups})"
        )
    if policy_grouping_requested(args) and args.remove_unused_columns:
        raise ValueError(
            "policy grouping needs remove_unused_columns=False (got True): the trainer reads each row's policy "
            "group from the dataset"
        )


def check_stage_fields(args) -> None:
    """Rules between the training-stage fields (each field alone is checked by its declaration)."""
    start = args.policy_group_fusion_start
    if args.policy_group_warmup_plateau and args.policy_group_warmup_steps is None:
        raise ValueError(
            "policy_group_warmup_plateau=True ends warm-up when the reward flattens, at the latest at "
            "policy_group_warmup_steps: set policy_group_warmup_steps (got None)"
        )
    warmup = args.policy_group_warmup_steps
    if warmup is not None and start is not None and start >= 1 and warmup >= start:
        raise ValueError(
            f"warm-up must end before fusion starts: policy_group_warmup_steps ({warmup}) must be < "
            f"policy_group_fusion_start ({start:g})"
        )
    if start is not None and start >= 1 and args.max_steps > 0 and start > args.max_steps:
        raise ValueError(
            f"policy_group_fusion_start ({start:g}) is after the run's last step (max_steps={args.max_steps}): "
            "fusion would never start"
        )


POLICY_GROUP_CONFIG = ConfigPart(
    PolicyGroupFields,
    ranges={
        "num_policy_groups": Range(1),
        "policy_group_refine_step": Range(1),
        "policy_group_refine_parts": Range(2),
        "max_policy_groups": Range(1),
        "min_policy_groups": Range(1),
        "policy_group_min_size": Range(1),
        "policy_group_ema": Range(0, 1, high_open=True),
        "policy_group_update_steps": Range(1),
        "policy_group_eta": Range(0, 10, low_open=True),
        "policy_group_progress_halflife": Range(0, 1e6, low_open=True),
        "policy_group_weight_min": Range(0, 1, low_open=True),
        "policy_group_weight_max": Range(1, 1000),
        "policy_group_weight_smoothing": Range(0, 1, low_open=True),
        "policy_group_deficit_z": Range(0, 100),
        "policy_group_sampling_floor": Range(0, 1),
        "policy_group_regroup_steps": Range(1),
        "policy_group_merge_tol": Range(0, 1e6),
        "policy_group_split_gap": Range(0, 1, low_open=True),
        "policy_group_warmup_steps": Range(1),
        "policy_group_plateau_window": Range(3),
        "policy_group_plateau_tol": Range(0, 1e6),
        "policy_group_fusion_start": Range(0, 1e9, low_open=True, whole_from=1),
        "policy_group_fusion_anneal_steps": Range(0),
    },
    checks=(check_policy_group_fields, check_stage_fields),
)
