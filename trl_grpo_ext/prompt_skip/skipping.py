"""The keep probability of a prompt before generation, the online adaptation of its base, the prediction for a first
visit from its policy group, and the generation batch's layout after skipping (pure functions).

After GRESO (Zheng et al. 2025, arXiv:2506.02177, Sec. 4, "probabilistic pre-rollout filtering"): a prompt whose
last z visits were all uninformative is kept (generated for) with probability p^z, p the base keep probability; a
prompt with an informative last visit, or never seen, is always kept. p is adapted once per generation batch by a
fixed step towards a target share of uninformative generation groups: lowered (more skipping) while the observed
share is above the target, raised while below. A floor on the keep probability makes every skipped prompt come back
now and then, as it may have become informative again.

Solved and failing prompts are told apart by the reward all their completions got: a prompt is *solved* when that
reward is the best one seen in the run, else *failing*. A failing prompt may be learnable but not yet learnt (at the
start most completions of a hard but learnable prompt fail together), so its first `grace` uninformative visits in a
row do not count: it is skipped on the streak z − grace. Ours, not GRESO's: GRESO treats both alike.

Optionally (`prompt_skip_hopeless`), a failing prompt that was never informative (possibly hopeless: unsolvable,
or its answer wrong) gets no grace and a base measured on the run instead (`hopeless_base`): the share of such
prompts' visits that came out informative, over the share of the visits after an informative one, so that a run
whose never-informative prompts do turn informative keeps generating them, and one whose stay failing stops.

With policy groups, a prompt can also be predicted from its group's evidence, where its own history is too short (a
first visit, or the few visits of a run): a first visit from the group's solved share (`first_visit_keep`), and a
prompt of a group none of whose prompts was ever informative from the group's failing visits (`failing_group_keep`),
which tells a hopeless group from a hard but learnable one within a few batches, where one prompt's visits cannot.
"""

import math

import torch

from .history import NEVER


def keep_probability(streak: torch.Tensor, base: float, floor: float) -> torch.Tensor:
    """max(base^z, floor) for streaks `streak` (any shape, integer): 1 for z = 0."""
    return torch.clamp(torch.pow(torch.as_tensor(base, dtype=torch.float64), streak.double()), min=floor).where(
        streak > 0, torch.ones((), dtype=torch.float64)
    )


def skip_streak(streak: torch.Tensor, value: torch.Tensor, best: float, grace: int, tol: float = 1e-6):
    """The streak the keep probability uses, (any shape, int64): `streak` for solved prompts (`value`, the reward
    of their last uninformative visit, within `tol` of `best`, the best reward seen), max(streak − `grace`, 0) for
    failing ones (a NaN value, no uninformative visit, is failing)."""
    streak = streak.long()
    solved = value.double() >= best - tol
    return torch.where(solved, streak, (streak - grace).clamp(min=0))


def streak_keep(
    streak,
    value,
    *,
    informed,
    best: float,
    base: float,
    hopeless: float | None,
    grace: int,
    floor: float,
    tol: float = 1e-6,
) -> torch.Tensor:
    """The keep probability from a prompt's history (any shape, float64): max(b^z, `floor`), 1 for z = 0. A solved
    prompt (`value`, the reward all completions of its last uninformative visit got, within `tol` of `best`): b =
    `base`, z its `streak`. A failing prompt: b = `base`, z = max(`streak` − `grace`, 0); with `hopeless` (a
    `hopeless_base`; None: off) one never `informed` (no informative visit yet) gets b = `hopeless`, z its streak."""
    solved = value.double() >= best - tol
    if hopeless is None:
        return keep_probability(skip_streak(streak, value, best, grace, tol), base, floor)
    measured = ~solved & ~informed
    z = torch.where(measured, streak.long(), skip_streak(streak, value, best, grace, tol))
    bases = torch.where(measured, torch.as_tensor(hopeless, dtype=torch.float64),
                        torch.as_tensor(base, dtype=torch.float64))  # fmt: skip
    return keep_probability(z, bases, floor)


def beta_moment(alpha: torch.Tensor, beta: torch.Tensor, order: int) -> torch.Tensor:
    """E[p^`order`] for p ~ Beta(`alpha`, `beta`) (elementwise, float64): the product over i < order of (alpha + i) /
    (alpha + beta + i)."""
    alpha, beta = alpha.double(), beta.double()
    moment = torch.ones_like(alpha)
    for i in range(order):
        moment = moment * (alpha + i) / (alpha + beta + i)
    return moment


def posterior_keep(successes: torch.Tensor, failures: torch.Tensor, generations: int, floor: float) -> torch.Tensor:
    """The keep probability of a prompt whose last visit was uninformative, from all of its scored completions so far
    (any shape, float64): max(1 − q, `floor`), q = E[p^G] + E[(1 − p)^G] the chance that its next generation group of
    G = `generations` completions is uninformative again (all at the best reward, or all below it), p its success rate
    under the posterior Beta(1 + `successes`, 1 + `failures`) of a uniform prior.

    Keeping each prompt with its chance of giving signal spends the tokens of a batch where the signal is expected,
    in proportion, and reads every completion seen, those of informative visits too: a prompt solved on 4
    completions of 4 once, after 2 of 4 and 3 of 4 before, is kept with 0.68 (GRESO's streak with an adapted base
    keeps it with that base, down to the floor); one that failed every completion of 3 visits of 4, with 0.23; a
    prompt whose one visit agreed, with 0.44 at G = 4, 0.48 at G = 16 (no grace is needed: a failing prompt comes
    back). Ours: GRESO's streak (arXiv:2506.02177, Sec. 4) read as the posterior of the prompt's success rate; the
    signal it predicts is the one DAPO's dynamic sampling (arXiv:2503.14476, Sec. 3.2) filters for after generation.
    """
    alpha, beta = 1.0 + successes.double(), 1.0 + failures.double()
    repeat = beta_moment(alpha, beta, generations) + beta_moment(beta, alpha, generations)
    return torch.clamp(1.0 - repeat, min=floor)


EVIDENCE_DECAY = 0.95  # each generation batch, the visits counted before weigh this much less: the run moves on
HOPELESS_PRIOR = 8.0  # visits at the reference rate a never-informative prompt's measured rate starts from


def count_evidence(
    evidence: torch.Tensor,
    failing: torch.Tensor,
    after_informative: torch.Tensor,
    informative: torch.Tensor,
    decay: float = EVIDENCE_DECAY,
) -> torch.Tensor:
    """The (4,) float64 counts `hopeless_base` reads, after one generation batch: the old ones times `decay`, plus the
    batch's visits of a failing prompt never informative (`failing` (P,) bool: its last visit uninformative and below
    the best reward, none informative) and of a prompt whose last visit was informative (`after_informative` (P,)
    bool), each with how many came out `informative` (P,) bool."""
    batch = torch.stack([failing.sum(), (failing & informative).sum(), after_informative.sum(),
                         (after_informative & informative).sum()]).double()  # fmt: skip
    return evidence * decay + batch


def hopeless_base(evidence: torch.Tensor, prior: float = HOPELESS_PRIOR) -> float:
    """The base keep probability of a failing prompt never informative: min(r_f / r_a, 1), r_a = (i_a + 1) / (n_a + 2)
    the share of visits after an informative one that came out informative, r_f = (i_f + `prior`·r_a) / (n_f +
    `prior`) the share of the never-informative failing prompts' visits that did, shrunk towards r_a by `prior`
    visits (so 1 until such visits were seen).
    `evidence`: (4,) the decayed counts n_f, i_f, n_a, i_a of `count_evidence`. The expected informative generation
    groups per generated token of a failing prompt, relative to a prompt that was informative: skipping it in that
    proportion leaves the informative groups per token of the batch as high as the evidence allows."""
    n_f, i_f, n_a, i_a = evidence.tolist()
    r_a = (i_a + 1.0) / (n_a + 2.0)
    r_f = (i_f + prior * r_a) / (n_f + prior)
    return min(r_f / r_a, 1.0)


def adapt_base(base: float, observed: float, *, target: float, step: float, low: float, high: float = 1.0) -> float:
    """The base keep probability after a generation batch whose share of uninformative generation groups was
    `observed` (NaN: nothing was measured, no change): base − step if above `target`, base + step if below, within
    [`low`, `high`]."""
    if observed != observed:
        return base
    if observed > target:
        base -= step
    elif observed < target:
        base += step
    return min(max(base, low), high)


def solved_share(assignment: torch.Tensor, solved: torch.Tensor, seen: torch.Tensor, groups: int, least: int):
    """(K,) float64 per policy group: the share of its prompts seen so far whose last visit was solved (all
    completions at the best reward), NaN for a group with fewer than `least` prompts seen. `assignment` (R,) int64
    group ids, `solved` and `seen` (R,) bool."""
    seen_count = torch.bincount(assignment[seen], minlength=groups).double()
    solved_count = torch.bincount(assignment[seen & solved], minlength=groups).double()
    share = solved_count / seen_count.clamp(min=1)
    return share.where(seen_count >= least, torch.full_like(share, torch.nan))


def first_visit_keep(share: torch.Tensor, floor: float) -> torch.Tensor:
    """The keep probability of a prompt never generated for, from its policy group's solved share s (any shape):
    max(1 − s, floor), 1 where s is NaN (too few of the group seen). Skipping a share s of a group whose prompts are
    solved with probability s leaves its informative prompts per generated token as they were, and moves the
    generated tokens towards the groups with more to learn."""
    keep = torch.clamp(1.0 - share.double(), min=floor)
    return keep.where(~torch.isnan(share), torch.ones((), dtype=torch.float64))


def layout_quantum(num_generations: int, num_processes: int, steps_per_generation: int) -> int:
    """The fewest prompts a generation batch may hold, and the step its size moves by: q·G completions split evenly
    over the processes and, on each, into `steps_per_generation` micro-batches (TRL's `split_tensor_dict` drops a
    remainder), q = n·s / gcd(G, n·s)."""
    slots = num_processes * steps_per_generation
    return slots // math.gcd(num_generations, slots)


def static_cache_quantum(drawn: int, quantum: int) -> int:
    """The layout's quantum where generation uses a static KV cache (`generation_compile`), which is built, and the
    decode step compiled, once per batch size: half of the `drawn` prompts when that is a multiple of `quantum`, else
    all of them, so that a generation batch takes two sizes at most."""
    half = drawn // 2
    return half if half > 0 and half % quantum == 0 else drawn


def keep_for_layout(kept: torch.Tensor, probability: torch.Tensor, quantum: int) -> torch.Tensor:
    """`kept` (P,) bool with skipped prompts put back until the count is a multiple of `quantum`, and at least one
    quantum (the floor: a batch is never empty): those with the highest keep `probability` (P,) first, ties in draw
    order. P is a multiple of `quantum` (TRL's generation batch is)."""
    count = int(kept.sum())
    wanted = min(max(-(-count // quantum) * quantum, quantum), len(kept))
    if wanted == count:
        return kept
    # the skipped prompts, the most likely to be kept first
    order = torch.argsort(torch.where(kept, torch.inf, -probability.double()), stable=True)
    kept = kept.clone()
    kept[order[: wanted - count]] = True
    return kept


FIRST_VISIT_LEAST_SEEN = 8  # prompts of a policy group seen before its solved share predicts a first visit


def failing_group_keep(
    assignment, failing_visits, *, informed, groups: int, floor: float, least: float
) -> torch.Tensor:
    """(K,) float64 per policy group: the keep probability of its prompts never informative, from the whole group's
    evidence. A group none of whose prompts was ever informative, after V uninformative failing visits over all its
    prompts: max((1 − `least`)^V, `floor`), the chance that V visits in a row give nothing if the group's share of
    informative generation groups were `least`; a group with any prompt ever informative: 1 (each prompt then keeps
    its own grace). A hard but learnable group (a failing one whose completions succeed 2-5% of the time gives 8-19%
    informative generation groups of 4) is soon told from a hopeless one, which never turns informative; one prompt
    cannot tell them apart in the few visits a run makes. Ours, after GRESO's streak (arXiv:2506.02177, Sec. 4) taken
    over a policy group.

    Args:
        assignment: (R,) int64 policy group ids of the dataset's rows.
        failing_visits: (R,) the uninformative failing visits of each row never informative (0 for the others).
        informed: (R,) bool, the rows with an informative visit.
        groups: K, the number of policy groups.
        least: f, the share of informative generation groups tested for (`prompt_skip_group_informative`).
    """
    visits = torch.bincount(assignment, weights=failing_visits.double(), minlength=groups)
    ever_informed = torch.bincount(assignment[informed], minlength=groups) > 0
    keep = torch.clamp(torch.pow(torch.as_tensor(1.0 - least, dtype=torch.float64), visits), min=floor)
    return keep.where(~ever_informed, torch.ones((), dtype=torch.float64))


def history_keep(history, rows, *, base, hopeless, best, grace, floor, generations=0, tol=1e-6) -> torch.Tensor:
    """(P,) float64 the keep probability of each dataset row of `rows` (P,) from its own `history` (a
    `PromptHistory`), 1 for a prompt never uninformative or never seen: with the completion counts (`prompt_skip_rule:
    posterior`), `posterior_keep` for a prompt whose last visit was uninformative (`generations` completions a
    prompt); else `streak_keep` (`base` the solved and failing prompts' base, `hopeless` that of failing prompts never
    informative (None: off), `best` the reward a solved prompt's completions all got, `grace` a failing prompt's
    visits that do not count)."""
    streak = history.streak[rows]
    if len(history.successes) > 0:
        keep = posterior_keep(history.successes[rows], history.failures[rows], generations, floor)
        return keep.where(streak > 0, torch.ones((), dtype=torch.float64))
    return streak_keep(streak, history.value[rows], informed=history.informed[rows], best=best, base=base,
                       hopeless=hopeless, grace=grace, floor=floor, tol=tol)  # fmt: skip


def prompt_keep_probability(history, rows, *, base, hopeless, best, grace, floor, groups=None, first_visit=True,
                            group_informative=0.0, generations=0, tol=1e-6) -> torch.Tensor:  # fmt: skip
    """(P,) float64 the keep probability of each dataset row of `rows` (P,), from the `history` (a `PromptHistory`):
    `history_keep` (the arguments up to `floor`, and `generations`, are its). With `groups` = (assignment (R,) int64
    policy group ids, K groups) and `first_visit`, a prompt never generated for gets `first_visit_keep` of its
    group's `solved_share` instead; with `group_informative` f > 0, a prompt never informative (never generated for,
    or failing at every visit) keeps at most its group's `failing_group_keep` at f, once some prompt of the run was
    informative (before that, every group looks alike, never informative, and the policy does not move: the test
    would throttle all of them alike, which saves no token per informative generation group found and spends more
    steps finding the first)."""
    keep = history_keep(history, rows, base=base, hopeless=hopeless, best=best, grace=grace, floor=floor,
                        generations=generations, tol=tol)  # fmt: skip
    first = history.last_step[rows] == NEVER
    if groups is None:
        return keep
    assignment, count = groups
    seen = history.last_step != NEVER
    if first_visit and first.any():
        solved = seen & (history.streak > 0) & (history.value.double() >= best - tol)
        share = solved_share(assignment, solved, seen, count, FIRST_VISIT_LEAST_SEEN)
        keep = torch.where(first, first_visit_keep(share[assignment[rows]], floor), keep)
    if group_informative > 0 and bool(history.informed.any()):
        failing = history.failing_never_informative(best, tol=tol)
        group_keep = failing_group_keep(
            assignment,
            torch.where(failing, history.streak.long(), 0),
            informed=history.informed,
            groups=count,
            floor=floor,
            least=group_informative,
        )[assignment[rows]]
        applies = first | failing[rows]  # never generated for, or failing at every visit so far
        keep = torch.where(applies, torch.minimum(keep, group_keep), keep)
    return keep
