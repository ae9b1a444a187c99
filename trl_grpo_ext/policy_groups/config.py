"""The settings of dynamic policy grouping and of its training stages: the fields `GRPOConfig` adds for them
(`PolicyGroupFields`, each documented in its docstring), their ranges and the rules between them
(`POLICY_GROUP_CONFIG`, composed into `GRPOConfig` by `trl_grpo_ext.config`)."""

from dataclasses import dataclass, field

from ..field_checks import ConfigPart, Range

POLICY_GROUP_SAMPLING = ("learnability", "progress", "uniform")


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
    `policy_group_column` or `policy_group_features` is set, or the trainer gets `policy_group_fn`. Each group gets
    a learnability score from what its completions showed, s = W·κ²: W the mean within-prompt reward variance of its
    recent prompts, κ² the share of it that the policy's log-likelihood of the completions explains
    (`trl_grpo_ext.policy_groups.score`); prompts are drawn in proportion to their group's score.

    policy_group_column (`str`, *optional*):
        Dataset column whose values name each prompt's policy group (e.g. `task`, `source`, `difficulty`).
    policy_group_features (`str`, *optional*):
        Group prompts by k-means into `num_policy_groups` clusters over these features: `tfidf` (TF-IDF of the
        prompt text).
    num_policy_groups (`int`, *optional*, defaults to `4`):
        Number of k-means clusters when grouping by `policy_group_features`.
    policy_group_sampling (`str`, *optional*, defaults to `"learnability"`):
        Which prompts a generation batch holds: `learnability` (each group drawn in proportion to its prompts ×
        its score), `progress` (the same, times the weight α_i ← α_i·(1 + η·ΔR_i) every `policy_group_update_steps`
        steps, ΔR_i the change of the group's reward over those steps minus the mean change over groups) or
        `uniform` (TRL's order; the groups' statistics are still logged).
    policy_group_sampling_floor (`float`, *optional*, defaults to `0.1`):
        A share of every draw spread evenly over the groups, so that each group with prompts is drawn with
        probability at least `floor / number of groups` and its statistics keep coming in.
    policy_group_halflife (`float`, *optional*, defaults to `32.0`):
        Half-life of a group's reward statistics, in its own prompts: a prompt counts half after this many later
        prompts of its group, so the score follows the group as it learns (the credibility's are kept over the run).
    policy_group_loss_weighting (`bool`, *optional*, defaults to `False`):
        Also multiply each completion's advantage by its group's score, normalised to mean 1 over the completions
        whose advantage is not 0 (those that carry a gradient), so the loss scale is unchanged.
    policy_group_eta (`float`, *optional*, defaults to `0.1`):
        Step size η of the `progress` weights.
    policy_group_update_steps (`int`, *optional*, defaults to `10`):
        Global steps between two updates of the `progress` weights (the window ΔR is measured over).
    policy_group_regroup_steps (`int`, *optional*):
        Every this many global steps, merge two groups whose reward and within-prompt reward std both differ by less
        than `policy_group_merge_tol`, else split a group whose prompts' success rates are bimodal.
    policy_group_merge_tol (`float`, *optional*, defaults to `0.05`):
        Tolerance of the merge rule, in reward units.
    policy_group_split_gap (`float`, *optional*, defaults to `0.6`):
        Smallest gap between the two 2-means centres of per-prompt success rates that counts as bimodal (success
        rates spread evenly over [0, 1] give a gap of 0.5, so keep it above that).
    policy_group_min_size (`int`, *optional*, defaults to `8`):
        Fewest prompts each half of a split may have.
    max_policy_groups (`int`, *optional*, defaults to `8`):
        Upper bound on the number of policy groups (splitting stops there).
    min_policy_groups (`int`, *optional*, defaults to `2`):
        Lower bound on the number of policy groups (merging stops there).

    > Parameters that control the training stages of policy grouping

    Off unless `policy_group_warmup_steps` or `policy_group_fusion_start` is set; then a run goes through
    warm-up (every policy group treated alike: prompts drawn as TRL draws them, statistics gathered, no merge or
    split), competition (the draw follows the scores) and fusion (the groups that did well merged by the merge rule,
    the draw and the loss weights annealed back to TRL's). `trl_grpo_ext.policy_groups.stages` says more.

    policy_group_warmup_steps (`int`, *optional*):
        Warm-up lasts until this global step.
    policy_group_fusion_start (`float`, *optional*):
        Fusion starts at this global step (a whole number >= 1) or at this fraction of the run's steps (0 < x < 1,
        of `max_steps` or of the steps `num_train_epochs` comes to), as transformers' `save_steps` reads a ratio.
    policy_group_fusion_anneal_steps (`int`, *optional*, defaults to `10`):
        Global steps over which fusion moves the draw and the loss weights linearly back to TRL's (0: at once).
    """

    policy_group_column: str | None = field(
        default=None, metadata={"help": "Dataset column whose values name each prompt's policy group (e.g. task)."}
    )
    policy_group_features: str | None = field(
        default=None, metadata={"help": "Group prompts by k-means over tfidf features.", "choices": ["tfidf"]}
    )
    num_policy_groups: int = field(default=4, metadata={"help": "Number of k-means clusters."})
    policy_group_sampling: str = field(
        default="learnability",
        metadata={"help": "learnability (groups drawn by prompts x score), progress (also x the weight a_i <- a_i (1 "
                  "+ eta dR_i)) or uniform (TRL's order).", "choices": list(POLICY_GROUP_SAMPLING)},
    )  # fmt: skip
    policy_group_sampling_floor: float = field(default=0.1, metadata={"help": "Share of every draw spread evenly."})
    policy_group_halflife: float = field(
        default=32.0, metadata={"help": "Half-life of a group's statistics, prompts."}
    )
    policy_group_loss_weighting: bool = field(default=False, metadata={"help": "Also weight advantages by score."})
    policy_group_eta: float = field(default=0.1, metadata={"help": "Step size eta of the progress weights."})
    policy_group_update_steps: int = field(default=10, metadata={"help": "Steps between progress weight updates."})
    policy_group_regroup_steps: int | None = field(
        default=None, metadata={"help": "Steps between merge/split checks."}
    )
    policy_group_merge_tol: float = field(default=0.05, metadata={"help": "Merge groups within this, reward units."})
    policy_group_split_gap: float = field(default=0.6, metadata={"help": "Success-rate gap that splits a group."})
    policy_group_min_size: int = field(default=8, metadata={"help": "Fewest prompts each half of a split may have."})
    max_policy_groups: int = field(default=8, metadata={"help": "Upper bound on the number of policy groups."})
    min_policy_groups: int = field(default=2, metadata={"help": "Lower bound on the number of policy groups."})
    policy_group_warmup_steps: int | None = field(default=None, metadata={"help": "Warm-up until this global step."})
    policy_group_fusion_start: float | None = field(
        default=None, metadata={"help": "Fusion from this global step (>= 1) or fraction of the run (0 < x < 1)."}
    )
    policy_group_fusion_anneal_steps: int = field(default=10, metadata={"help": "Steps fusion anneals the draw over."})


def check_policy_group_fields(args) -> None:
    """Rules between policy-group fields (each field alone is checked by its declaration)."""
    if not args.min_policy_groups <= args.max_policy_groups:
        raise ValueError(f"need min_policy_groups ({args.min_policy_groups}) <= max_policy_groups "
                         f"({args.max_policy_groups})")  # fmt: skip
    if policy_grouping_requested(args) and args.remove_unused_columns:
        raise ValueError("policy grouping needs remove_unused_columns=False (got True): the trainer reads each row's "
                         "policy group from the dataset")  # fmt: skip
    start, warmup = args.policy_group_fusion_start, args.policy_group_warmup_steps
    if warmup is not None and start is not None and start >= 1 and warmup >= start:
        raise ValueError(f"warm-up must end before fusion starts: policy_group_warmup_steps ({warmup}) must be < "
                         f"policy_group_fusion_start ({start:g})")  # fmt: skip
    if start is not None and start >= 1 and args.max_steps > 0 and start > args.max_steps:
        raise ValueError(f"policy_group_fusion_start ({start:g}) is after the run's last step (max_steps="
                         f"{args.max_steps}): fusion would never start")  # fmt: skip


POLICY_GROUP_CONFIG = ConfigPart(
    PolicyGroupFields,
    ranges={
        "num_policy_groups": Range(1),
        "policy_group_sampling_floor": Range(0, 1),
        "policy_group_halflife": Range(0, 1e9, low_open=True),
        "policy_group_eta": Range(0, 1, low_open=True),
        "policy_group_update_steps": Range(1),
        "policy_group_regroup_steps": Range(1),
        "policy_group_merge_tol": Range(0, 1e6),
        "policy_group_split_gap": Range(0, 1, low_open=True),
        "policy_group_min_size": Range(1),
        "max_policy_groups": Range(1),
        "min_policy_groups": Range(1),
        "policy_group_warmup_steps": Range(1),
        "policy_group_fusion_start": Range(0, 1e9, low_open=True, whole_from=1),
        "policy_group_fusion_anneal_steps": Range(0),
    },
    checks=(check_policy_group_fields,),
)
