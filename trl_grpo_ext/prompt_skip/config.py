"""The settings of prompt skipping: the fields `GRPOConfig` adds for it (`PromptSkipFields`, each documented in its
docstring), their ranges and the rules between them and with TRL's (`PROMPT_SKIP_CONFIG`, composed into `GRPOConfig`
by `trl_grpo_ext.config`)."""

from dataclasses import dataclass, field

from ..field_checks import ConfigPart, Range
from .normalizer import no_refill_problem


@dataclass
class PromptSkipFields:
    r"""
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
    prompt_skip_rule (`str`, *optional*, defaults to `"streak"`):
        How a prompt's own history gives its keep probability. `"streak"`: GRESO's, p^z as above, with the
        failing grace, the target and `prompt_skip_hopeless`. `"posterior"`: from all its scored completions so far,
        s at the best reward and f below it, the chance its next generation group gives signal, max(1 − q,
        `prompt_skip_min_keep`), q = E[p^G + (1 − p)^G] under p ~ Beta(1 + s, 1 + f) (a prompt whose last visit
        was informative is kept): no grace, target or adapted base, and a visit weighs by its completions
        (`skipping.posterior_keep`).
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
        hold many such prompts. A learnable prompt that fails at first is never informative yet either, so it is
        skipped too, and while noisy rewards move the policy it loses its signal
        (benchmarks/prompt_skip/prompt_skip_family.py, `benchmarks/prompt_skip/README.md`).
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
        it. The test waits for the run's first informative generation group: until then every group looks alike
        and the policy does not move, so testing would only slow the search for a first signal. 0 (the default)
        turns it off. For data known to hold whole groups that cannot be solved, e.g. 0.2 (chosen on
        benchmarks/prompt_skip/prompt_skip_family.py, `benchmarks/prompt_skip/README.md`). A group with noisy rewards,
        informative from the start, starts the test at once, and learnable groups that fail at first are then
        starved.
    prompt_skip_refill (`bool`, *optional*, defaults to `False`):
        Replace each skipped prompt by the next one of the draw (inside each policy group's draw when policy
        groups are on), so the generation batch keeps its size: as many tokens a step as without skipping.
    """

    prompt_skip: bool = field(
        default=False,
        metadata={
            "help": "Skip, before generation, prompts whose recent generation groups were uninformative (all "
            "completions the same reward), after GRESO (arXiv:2506.02177)."
        },
    )
    prompt_skip_rule: str = field(
        default="streak",
        metadata={
            "help": "Keep probability from a prompt's history: streak (GRESO's p^z) or posterior (its chance of "
            "signal from all its completions so far).",
            "choices": ["streak", "posterior"],
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


def check_prompt_skip_fields(args) -> None:
    """Rules between prompt-skipping fields and with TRL's (each field alone is checked by its declaration)."""
    if args.prompt_skip and args.remove_unused_columns:
        raise ValueError(
            "prompt_skip=True needs remove_unused_columns=False (got True): the trainer reads each row's index "
            "from the dataset"
        )
    problem = no_refill_problem(args) if args.prompt_skip and not args.prompt_skip_refill else None
    if problem is not None:
        raise ValueError(problem)
    if args.prompt_skip_initial_keep < args.prompt_skip_min_keep:
        raise ValueError(
            f"need prompt_skip_min_keep ({args.prompt_skip_min_keep}) <= prompt_skip_initial_keep "
            f"({args.prompt_skip_initial_keep})"
        )
    if args.prompt_skip_hopeless and args.prompt_skip_rule != "streak":
        raise ValueError(
            f"prompt_skip_hopeless=True is a rule of prompt_skip_rule='streak' (got {args.prompt_skip_rule!r}): the "
            "posterior rule judges failing prompts from their completions already"
        )
    if args.prompt_skip_group_informative > 0 and args.prompt_skip_refill:
        raise ValueError(
            f"prompt_skip_group_informative ({args.prompt_skip_group_informative}) acts without refilling only "
            "(got prompt_skip_refill=True): set one of them off"
        )


PROMPT_SKIP_CONFIG = ConfigPart(
    PromptSkipFields,
    ranges={
        "prompt_skip_target": Range(0, 1, high_open=True),
        "prompt_skip_group_informative": Range(0, 1, high_open=True),
        "prompt_skip_initial_keep": Range(0, 1, low_open=True),
        "prompt_skip_adapt_step": Range(0, 1, low_open=True),
        "prompt_skip_failing_grace": Range(0),
        "prompt_skip_min_keep": Range(0, 1, low_open=True),
    },
    checks=(check_prompt_skip_fields,),
)
