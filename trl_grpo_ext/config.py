"""`GRPOConfig`: TRL's GRPO configuration plus this package's settings, every one of them off by default."""

import dataclasses
from dataclasses import dataclass, field

from trl.trainer.grpo_config import GRPOConfig as TRLGRPOConfig  # TRL's class, also after register()

from .entropy import modes as entropy_modes
from .entropy.modes import ENTROPY_REG_MODES
from .field_checks import Range, check_declarations, check_field
from .grad_reg import modes as grad_reg_modes
from .grad_reg.modes import GRAD_REG_MODES
from .prompt_skip.normalizer import no_refill_problem

POLICY_GROUP_FEATURES = ("tfidf", "embedding")
POLICY_GROUP_WEIGHT_RULES = ("learnability", "progress", "deficit")
POLICY_GROUP_SAMPLING = ("learnability", "uncertainty", "weighted", "uniform")
ADVANTAGE_BASELINES = ("prompt", "policy_group")
GENERATION_LORA_MERGE = ("none", "inplace", "copy")


# TRL's and transformers' count fields checked before TRL's `__post_init__` (`GRPOConfig._check_trl_counts`): the
# least value each allows, and what the message asks for. num_generations 1 is left to TRL's own message.
TRL_COUNTS = {
    "num_generations": (1, "2 or more (completions per prompt: each is scored against the others of its prompt)"),
    "per_device_train_batch_size": (1, ">= 1 (completions per micro-batch)"),
    "gradient_accumulation_steps": (1, ">= 1 (micro-batches per optimizer step)"),
    "steps_per_generation": (1, ">= 1 (micro-batches per generation batch)"),
    "generation_batch_size": (1, ">= 1 (completions generated at once)"),
    "max_completion_length": (1, ">= 1 (tokens)"),
    "num_iterations": (1, ">= 1 (passes over each generation batch)"),
}


def policy_grouping_requested(args) -> bool:
    """Whether a config asks for policy grouping (the trainer's `policy_group_fn` also turns it on)."""
    return args.policy_group_column is not None or args.policy_group_features is not None


def stages_requested(args) -> bool:
    """Whether a config asks for the training stages of policy grouping (a warm-up or a fusion)."""
    return args.policy_group_warmup_steps is not None or args.policy_group_fusion_start is not None


def generation_levers(args) -> list[str]:
    """The fast-generation settings a config turns on, as `name=value` (empty: TRL's own generation)."""
    levers = ["generation_compile=True"] if args.generation_compile else []
    if args.generation_lora_merge != "none":
        levers.append(f"generation_lora_merge={args.generation_lora_merge!r}")
    return levers


@dataclass
class GRPOConfig(TRLGRPOConfig):
    r"""
    Configuration for [`trl_grpo_ext.GRPOTrainer`]: every field of [`trl.GRPOConfig`] keeps its meaning and default.

    This class is a drop-in replacement: `from trl_grpo_ext import GRPOConfig` instead of `from trl import GRPOConfig`
    changes nothing until one of this package's settings is turned on. With every setting at its default, a run is
    numerically identical to stock TRL GRPO (`tests/test_equivalence.py` proves it).

    Every field below is checked when the config is built, its feature on or off, by its type and the range
    `FIELD_RANGES` declares (`field_checks.check_field`; strings are read as TrlParser reads the command line).

    Raises:
        ValueError: a field of this package with a value of the wrong kind or out of its range ("<field> must be
            <what it allows>, got <value>"), or settings that contradict each other, naming the fields.

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
            Global steps between two weight updates of the `progress` and `deficit` rules (the window over which
            reward progress is measured); the `learnability` rule updates every step.
        policy_group_weight_rule (`str`, *optional*, defaults to `"learnability"`):
            `learnability`: α_i = (d_i + 0.05)·s_i, d_i group i's reward deficit over the range of group rewards (1
            for the lowest, 0 for the highest), s_i = 0.2 for a group that looks like noise (no learning progress
            since its start, z < 2, while more than half of its prompts still have completions that disagree: a coin
            flip), else 1; updated every step (`policy_groups.weights` module docstring). `progress`: the design's
            α_i ← α_i·(1 + η·ΔR_i), ΔR_i = group i's change in EMA reward over the window minus the mean change over
            groups. `deficit`: α_i ← α_i·(1 + η·(R̄ − R_i)), favouring groups below the mean reward R̄.
        policy_group_eta (`float`, *optional*, defaults to `0.1`):
            Step size η of the `progress` and `deficit` updates.
        policy_group_progress_halflife (`float`, *optional*, defaults to `48.0`):
            `learnability` rule: a group's start reward is its mean over its first this many completions, its recent
            reward an EMA with this half-life in completions; a group is judged after twice this many.
        policy_group_weight_min (`float`, *optional*, defaults to `0.05`):
            Lower bound of a group weight (weights have mean 1 over groups).
        policy_group_weight_max (`float`, *optional*, defaults to `2.0`):
            Upper bound of a group weight.
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

        > Parameters that control prompt skipping

        Generate only where there is something to learn (after GRESO, Zheng et al. 2025, arXiv:2506.02177): a prompt
        whose last z generation groups were uninformative (every completion the same reward, so every advantage 0)
        is skipped before generation with probability 1 − max(p^z, `prompt_skip_min_keep`), p a base keep
        probability adapted every generation batch towards `prompt_skip_target`. A skipped prompt is not generated
        for and not replaced: the step trains on the completions it generated, and TRL's loss normalizes as if the
        skipped ones were there with zero advantage, so an accurate skip leaves the update as it was.
        `trl_grpo_ext.prompt_skip` says more.

        prompt_skip (`bool`, *optional*, defaults to `False`):
            Turn prompt skipping on. Needs a map-style training dataset (rows are indexed) and
            `remove_unused_columns=False`.
        prompt_skip_target (`float`, *optional*, defaults to `0.25`):
            The share of uninformative generation groups in a generation batch that the base keep probability p is
            steered towards: lowered while the share is above, raised while below.
        prompt_skip_initial_keep (`float`, *optional*, defaults to `0.5`):
            The base keep probability p at the start.
        prompt_skip_adapt_step (`float`, *optional*, defaults to `0.02`):
            The step by which p moves after each generation batch.
        prompt_skip_failing_grace (`int`, *optional*, defaults to `3`):
            Uninformative visits of a *failing* prompt (all its completions got the same reward, below the best
            reward seen in the run) that do not count towards its streak: a hard prompt that is still learnable is
            not skipped at once. A *solved* prompt (all at the best reward) counts from its first visit.
        prompt_skip_hopeless (`bool`, *optional*, defaults to `False`):
            Also skip, from their first visit, failing prompts that were never informative (unsolvable ones, or
            ones whose answer is wrong), at a base keep probability measured on the run: the share of such prompts'
            visits that came out informative over that of the visits after an informative one. For data known to
            hold many such prompts: it saves tokens there, but a learnable prompt that fails at first is skipped
            too, and on a mix with noisy rewards it made more runs collapse (`benchmarks/README.md`).
        prompt_skip_min_keep (`float`, *optional*, defaults to `0.05`):
            The lowest keep probability of any prompt (and the lowest p), so that a skipped prompt is generated for
            now and then: it may have become informative again.
        prompt_skip_first_visit (`bool`, *optional*, defaults to `True`):
            With policy groups, predict a prompt never generated for from its policy group: kept with probability
            max(1 − s, `prompt_skip_min_keep`), s the share of the group's prompts seen so far whose last generation
            group was solved (all completions at the best reward), once 8 of them were seen. Lets a run of less than
            one epoch save too.
        prompt_skip_group_informative (`float`, *optional*, defaults to `0.0`):
            With policy groups, skip the prompts of a group none of whose prompts was ever informative (every
            completion of every generation group failing alike: unsolvable, or mislabelled) on the whole group's
            evidence, first visits included: each is kept with probability max((1 − f)^V, `prompt_skip_min_keep`),
            f this value and V the group's uninformative failing visits so far: the chance of V such visits in a
            row if f of its generation groups were informative. One informative generation group in the group ends
            it. 0 (the default) turns it off. For data known to hold whole groups that cannot be solved: 0.1 saved
            most there, but it also slows a learnable group whose informative share starts below f
            (`benchmarks/README.md`).
        prompt_skip_refill (`bool`, *optional*, defaults to `False`):
            Replace each skipped prompt by the next one of the draw (inside each policy group's draw when policy
            groups are on), so the generation batch keeps its size: as many tokens a step as without skipping.

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
        entropy_target_window (`int`, *optional*, defaults to `5`):
            Optimizer steps whose measured entropy is the reference of `entropy_target_ratio`; the controller acts
            from the step after. Shorter than `max_steps`.
        entropy_target_per_group (`bool`, *optional*, defaults to `False`):
            With `target` and policy groups: one controller and coefficient per policy group, each holding its own
            group's entropy at `entropy_target` (or its own reference times `entropy_target_ratio`).
        entropy_pi_kp (`float`, *optional*, defaults to `0.5`):
            Proportional gain of the `target` controller, in coefficient per nat of entropy error.
        entropy_pi_ki (`float`, *optional*, defaults to `0.02`):
            Integral gain of the `target` controller, in coefficient per nat per optimizer step.
        entropy_pi_horizon (`float`, *optional*, defaults to `12.0`):
            Optimizer steps τ the `target` controller looks ahead while the entropy falls: its proportional term acts
            on H + τ·s, s the filtered per-step change of the entropy when negative (`entropy.EntropyPI`). 0 is the
            plain PI controller.
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

        > Parameters that control fast generation

        TRL's own generation (`model.generate`, no vLLM, no continuous batching) made faster; every setting is off by
        default. `trl_grpo_ext.generation` says how each one acts and what it costs.

        generation_compile (`bool`, *optional*, defaults to `False`):
            Generate with a static KV cache of `generation_max_prompt_length + max_completion_length` tokens and a
            compiled decode step (`torch.compile` through transformers' `CompileConfig`: inductor, with CUDA graphs
            on a GPU) instead of TRL's dynamic cache with compilation disabled. The first generation compiles (about
            25 s for a 2-layer model on 2 CPU cores; not yet timed on a GPU); later ones reuse the graph.
            transformers does not compile bitsandbytes 4-bit models: with 4-bit weights, also set
            `generation_lora_merge="copy"`.
        generation_max_prompt_length (`int`, *optional*):
            Prompt tokens the static cache of `generation_compile` holds (unused without it). Unset: the longest
            prompt of the first generation batch, rounded up to a multiple of 64. A longer prompt later grows the
            cache, which compiles the decode step once more.
        generation_lora_merge (`str`, *optional*, defaults to `"none"`):
            How a LoRA policy generates. `none`: through PEFT's adapter layers (TRL's path). `inplace`: the
            adapters are merged into the base weights for the generation, and the base weights are then restored
            bit for bit from a copy in host memory (no GPU memory; one host-to-device copy of the adapted weights
            per generation). `copy`: a separate generation model whose adapted linear layers hold W + ΔW in the
            compute dtype (for QLoRA, the dequantized base), sharing every other tensor with the policy and refreshed
            once per optimizer step (GPU memory: one compute-dtype copy of the adapted layers). Needs a PEFT LoRA
            model.

        > Parameters that control the run doctor

        run_doctor (`bool`, *optional*, defaults to `False`):
            Check the logged metrics at every log for the known ways a GRPO run wastes its steps (no learning
            signal, overall and per policy group; truncation; entropy collapse or explosion; KL runaway; format-only
            learning; a reward plateau; non-finite values; gradient-norm spikes; generation-bound steps; CUDA memory
            headroom) and warn once per finding with its evidence and the setting to change
            (`trl_grpo_ext.doctor.DoctorCallback`). Also logs `timing/generation` and `timing/scoring` (seconds per
            optimizer step spent in `model.generate` and in scoring: rewards and log-probabilities) and, on CUDA,
            `memory/peak_reserved_gib` and `memory/total_gib`. Training is unchanged. `trl-grpo-ext doctor RUN_DIR`
            runs the same checks on a run's output folder.
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
    prompt_skip: bool = field(
        default=False,
        metadata={
            "help": "Skip, before generation, prompts whose recent generation groups were uninformative (all "
            "completions the same reward), after GRESO (arXiv:2506.02177)."
        },
    )
    prompt_skip_target: float = field(
        default=0.25, metadata={"help": "Share of uninformative generation groups the keep probability is steered to."}
    )
    prompt_skip_initial_keep: float = field(
        default=0.5, metadata={"help": "Base keep probability p at the start (a streak of z keeps with p^z)."}
    )
    prompt_skip_adapt_step: float = field(
        default=0.02, metadata={"help": "Step of the base keep probability after each generation batch."}
    )
    prompt_skip_failing_grace: int = field(
        default=3, metadata={"help": "Uninformative visits of a failing (not solved) prompt that do not count."}
    )
    prompt_skip_hopeless: bool = field(
        default=False,
        metadata={"help": "Also skip failing prompts never informative, at a keep probability measured on the run."},
    )
    prompt_skip_min_keep: float = field(
        default=0.05, metadata={"help": "Lowest keep probability of any prompt, so skipped ones come back."}
    )
    prompt_skip_first_visit: bool = field(
        default=True,
        metadata={"help": "With policy groups, predict a prompt never generated for from its group's solved share."},
    )
    prompt_skip_group_informative: float = field(
        default=0.0,
        metadata={
            "help": "With policy groups, skip prompts of a group never informative as if this share of its "
            "generation groups were informative, at (1 - share)^visits (0: off)."
        },
    )
    prompt_skip_refill: bool = field(
        default=False, metadata={"help": "Replace each skipped prompt by another, keeping the batch's size."}
    )

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
        default=5, metadata={"help": "Optimizer steps whose entropy is the reference of entropy_target_ratio."}
    )
    entropy_target_per_group: bool = field(
        default=False, metadata={"help": "With target and policy groups: one controller per policy group."}
    )
    entropy_pi_kp: float = field(
        default=0.5, metadata={"help": "Proportional gain of the target controller (coefficient per nat)."}
    )
    entropy_pi_ki: float = field(
        default=0.02, metadata={"help": "Integral gain of the target controller (coefficient per nat per step)."}
    )
    entropy_pi_horizon: float = field(
        default=12.0,
        metadata={"help": "Steps ahead the target controller looks when the entropy falls (0: plain PI control)."},
    )
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

    generation_compile: bool = field(
        default=False,
        metadata={
            "help": "Generate with a static KV cache and a torch.compile'd decode step (CUDA graphs on a GPU) instead "
            "of TRL's dynamic cache. 4-bit weights need generation_lora_merge=copy."
        },
    )
    generation_max_prompt_length: int | None = field(
        default=None,
        metadata={
            "help": "Prompt tokens the static cache of generation_compile holds (cache = this + "
            "max_completion_length). Unset: the first batch's longest prompt rounded up to 64."
        },
    )
    generation_lora_merge: str = field(
        default="none",
        metadata={
            "help": "How a LoRA policy generates: none (PEFT's adapter layers), inplace (adapters merged into the "
            "base weights, restored bit for bit from host memory), copy (a separate merged generation model; for "
            "QLoRA the dequantized base).",
            "choices": list(GENERATION_LORA_MERGE),
        },
    )
    run_doctor: bool = field(
        default=False,
        metadata={
            "help": "Check the logged metrics at every log for the known ways a GRPO run wastes its steps and warn "
            "once per finding with the setting to change; also logs timing/generation, timing/scoring and, on CUDA, "
            "memory/peak_reserved_gib and memory/total_gib. Training is unchanged."
        },
    )

    def __post_init__(self):
        self._check_trl_counts()  # before TRL's own __post_init__, which divides by some of them
        super().__post_init__()
        self._check_fields()

    def _check_trl_counts(self) -> None:
        """TRL's and transformers' counts that they take unchecked: 0 divides by zero in TRL's `__post_init__`
        (`num_generations`) or fails only once the model is loaded, naming another field (a batch size of 0 from
        `steps_per_generation=0`). Raises ValueError naming the field and the value; valid values change nothing."""
        for name, (least, wanted) in TRL_COUNTS.items():
            value = getattr(self, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value < least:
                raise ValueError(f"{name} must be {wanted}, got {value}")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (TRL samples completions), got {self.temperature}")

    def _check_fields(self) -> None:
        """This package's checks (also run on a TRL config by `add_defaults`). Raises ValueError naming the field."""
        cls = GRPOConfig  # named, not looked up on `self`: a TRL config has none of these methods
        for f in own_fields():  # each field by its type and declared range (`field_checks`), feature on or off
            meta = f.metadata
            choices = meta.get("choices") or FIELD_MODES.get(f.name)
            annotation = GRPOConfig.__annotations__[f.name]  # not f.type: HfArgumentParser rewrites that in place
            value = check_field(f.name, getattr(self, f.name), annotation, FIELD_RANGES.get(f.name), choices)
            setattr(self, f.name, value)
        for check in (cls._check_trl_fields, cls._check_policy_group_fields, cls._check_stage_fields,
                      cls._check_prompt_skip_fields, cls._check_entropy_reg_fields, cls._check_grad_reg_fields,
                      cls._check_generation_fields):  # fmt: skip
            check(self)

    def _check_trl_fields(self) -> None:
        """Values of transformers' and TRL's own fields that they accept but that cannot mean what was asked."""
        steps = self.max_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < -1:
            raise ValueError(
                f"max_steps must be a number of optimizer steps >= 1, or -1 (or 0) to train for num_train_epochs, "
                f"got {steps!r}"
            )

    def _check_policy_group_fields(self) -> None:
        """Rules between policy-group fields (each field alone is checked by its declaration)."""
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
        if policy_grouping_requested(self) and self.remove_unused_columns:
            raise ValueError(
                "policy grouping needs remove_unused_columns=False (got True): the trainer reads each row's policy "
                "group from the dataset"
            )

    def _check_stage_fields(self) -> None:
        """Rules between the training-stage fields (each field alone is checked by its declaration)."""
        start = self.policy_group_fusion_start
        if self.policy_group_warmup_plateau and self.policy_group_warmup_steps is None:
            raise ValueError(
                "policy_group_warmup_plateau=True ends warm-up when the reward flattens, at the latest at "
                "policy_group_warmup_steps: set policy_group_warmup_steps (got None)"
            )
        warmup = self.policy_group_warmup_steps
        if warmup is not None and start is not None and start >= 1 and warmup >= start:
            raise ValueError(
                f"warm-up must end before fusion starts: policy_group_warmup_steps ({warmup}) must be < "
                f"policy_group_fusion_start ({start:g})"
            )
        if start is not None and start >= 1 and self.max_steps > 0 and start > self.max_steps:
            raise ValueError(
                f"policy_group_fusion_start ({start:g}) is after the run's last step (max_steps={self.max_steps}): "
                "fusion would never start"
            )

    def _check_prompt_skip_fields(self) -> None:
        """Rules between prompt-skipping fields and with TRL's (each field alone is checked by its declaration)."""
        if self.prompt_skip and self.remove_unused_columns:
            raise ValueError(
                "prompt_skip=True needs remove_unused_columns=False (got True): the trainer reads each row's index "
                "from the dataset"
            )
        problem = no_refill_problem(self) if self.prompt_skip and not self.prompt_skip_refill else None
        if problem is not None:
            raise ValueError(problem)
        if self.prompt_skip_initial_keep < self.prompt_skip_min_keep:
            raise ValueError(
                f"need prompt_skip_min_keep ({self.prompt_skip_min_keep}) <= prompt_skip_initial_keep "
                f"({self.prompt_skip_initial_keep})"
            )
        if self.prompt_skip_group_informative > 0 and self.prompt_skip_refill:
            raise ValueError(
                f"prompt_skip_group_informative ({self.prompt_skip_group_informative}) acts without refilling only "
                "(got prompt_skip_refill=True): set one of them off"
            )

    def _check_entropy_reg_fields(self) -> None:
        """Rules between entropy fields and with TRL's: those of `entropy.modes` and each registered mode's."""
        entropy_modes.check_config(self)

    def _check_grad_reg_fields(self) -> None:
        """Rules between gradient-regularization fields and with TRL's: those of `grad_reg.modes` and each registered
        mode's."""
        grad_reg_modes.check_config(self)

    def _check_generation_fields(self) -> None:
        """Rules between fast-generation fields and TRL's (each field of ours alone is checked by its declaration)."""
        levers = generation_levers(self)
        if not levers:
            return
        others = {"use_vllm": self.use_vllm}
        others["use_transformers_continuous_batching"] = self.use_transformers_continuous_batching
        for other, on in others.items():
            if on:
                raise ValueError(
                    f"{', '.join(levers)} act on TRL's model.generate path; {other}=True generates another way: "
                    f"turn off one or the other"
                )
        if self.generation_compile and self.max_completion_length is None:
            raise ValueError(
                "generation_compile=True sizes its static cache by max_completion_length, which must then be set, got "
                "None"
            )
        if self.generation_compile and self.cache_implementation not in (None, "static"):
            raise ValueError(
                f"generation_compile=True uses a static cache: cache_implementation must be unset or 'static', got "
                f"{self.cache_implementation!r}"
            )
        owned = ("cache_implementation", "max_cache_len", "disable_compile", "compile_config")
        clashes = sorted(set(self.generation_kwargs or {}) & set(owned)) if self.generation_compile else []
        if clashes:
            raise ValueError(
                f"generation_compile=True sets the cache and compilation of generation itself: remove {clashes} from "
                f"generation_kwargs (got {self.generation_kwargs!r})"
            )

    @classmethod
    def add_defaults(cls, args: TRLGRPOConfig) -> TRLGRPOConfig:
        """Give a TRL `GRPOConfig` (or a user's subclass of it) this package's settings at their defaults, in place.

        For scripts that pass TRL's config to our trainer: `args` stays the same object, of the same class, with
        every value it had; only the fields this package adds are set, off. Returns `args`.

        Raises:
            TypeError: `args` is not a TRL `GRPOConfig`.
            ValueError: a value of this package's fields already set on `args` is invalid (as in `__post_init__`).
        """
        if not isinstance(args, TRLGRPOConfig):
            raise TypeError(f"args must be a trl.GRPOConfig, got {type(args).__module__}.{type(args).__name__}")
        for f in dataclasses.fields(cls):
            if not hasattr(args, f.name):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                setattr(args, f.name, default)
        GRPOConfig._check_fields(args)  # values a script set on the TRL config itself are checked like ours
        return args


# What each number field of this package accepts beyond its type (`field_checks`): a new int or float field needs an
# entry (`field_checks.check_declarations` refuses to import without one). HfArgumentParser hands a field's metadata to
# argparse as keyword arguments, so the ranges live here rather than in the metadata.
FIELD_RANGES = {
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
    "policy_group_sampling_floor": Range(0, 1),
    "policy_group_regroup_steps": Range(1),
    "policy_group_merge_tol": Range(0, 1e6),
    "policy_group_split_gap": Range(0, 1, low_open=True),
    "policy_group_warmup_steps": Range(1),
    "policy_group_plateau_window": Range(3),
    "policy_group_plateau_tol": Range(0, 1e6),
    "policy_group_fusion_start": Range(0, 1e9, low_open=True, whole_from=1),
    "policy_group_fusion_anneal_steps": Range(0),
    "prompt_skip_target": Range(0, 1, high_open=True),
    "prompt_skip_group_informative": Range(0, 1, high_open=True),
    "prompt_skip_initial_keep": Range(0, 1, low_open=True),
    "prompt_skip_adapt_step": Range(0, 1, low_open=True),
    "prompt_skip_failing_grace": Range(0),
    "prompt_skip_min_keep": Range(0, 1, low_open=True),
    "entropy_pi_kp": Range(0, 1000),
    "entropy_pi_ki": Range(0, 1000),
    "entropy_pi_horizon": Range(0, 10000),
    "clip_cov_ratio": Range(0, 1, low_open=True),
    "clip_cov_lb": Range(-1e9, 1e9),
    "clip_cov_ub": Range(-1e9, 1e9),
    "kl_cov_ratio": Range(0, 1, low_open=True),
    "kl_cov_coef": Range(0, 1000),
    "entropy_advantage_coef": Range(0, 1000),
    "entropy_advantage_kappa": Range(1, 1e6),
    "entropy_target_ratio": Range(0, 1, low_open=True),
    "entropy_target_window": Range(1),
    "zclip_alpha": Range(0, 1, low_open=True, high_open=True),
    "zclip_z_threshold": Range(0, 1000, low_open=True),
    "zclip_warmup_steps": Range(2),
    "agc_clip": Range(0, 1000, low_open=True),
    "agc_eps": Range(0, 1, low_open=True),
    "grad_reg_max_skips": Range(1),
    "kl_target": Range(0, 1000, low_open=True),
    "kl_horizon": Range(1),
    "generation_max_prompt_length": Range(1),
}
# The modes each list field takes (one or more, comma-separated on the command line): the registries, read when a
# config is checked, so a mode registered later (a plugin, a test) is accepted
FIELD_MODES = {"entropy_reg": ENTROPY_REG_MODES, "grad_reg": GRAD_REG_MODES}


def own_fields() -> list[dataclasses.Field]:
    """The fields this package adds to TRL's `GRPOConfig`, in declaration order."""
    trl_fields = {f.name for f in dataclasses.fields(TRLGRPOConfig)}
    return [f for f in dataclasses.fields(GRPOConfig) if f.name not in trl_fields]


check_declarations(own_fields(), FIELD_RANGES, FIELD_MODES)
# The docstring lists the modes as registered (`Registry.describe`), so a new mode is documented by its summary.
GRPOConfig.__doc__ = GRPOConfig.__doc__.replace(
    "            {ENTROPY_REG_MODES}", ENTROPY_REG_MODES.describe(" " * 12)
).replace("            {GRAD_REG_MODES}", GRAD_REG_MODES.describe(" " * 12))
