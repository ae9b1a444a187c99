"""The learnability score of a policy group and the draw it gives (pure functions on tensors). Shapes: K policy
groups, P prompts of a generation batch (over all processes), G = `num_generations` completions per prompt.

The score of group i is s_i = W_i · κ²_i:

- W_i, the signal: the mean over the group's recent prompts of the within-prompt variance of the reward (unbiased,
  over each prompt's completions), the part of the reward GRPO's advantage is made of (it centres each reward on its
  prompt's mean, DeepSeekMath arXiv:2402.03300, eq. 3). For 0/1 rewards it is the mean of p_j(1 − p_j) over the
  prompts j, p_j a prompt's pass rate: the learnability that LILO ranks prompts by (Foster & Foerster,
  arXiv:2502.12272, §3) and the variance VCRL samples by (arXiv:2509.19803). It is 0 for prompts always right or
  always wrong, and small for a group right only by luck (p = 0.02 gives 0.02; p = 0.16 gives 0.13).
- κ²_i, the credibility: the share of that variance explained by the policy's own log-likelihood of the
  completion, the squared correlation r between a completion's reward and its mean token log-probability, pooled
  within prompts (over the prompts whose completions disagree). A reward that does not depend on the completion
  (a noisy judge, a coin flip) has ρ = 0 whatever its variance; one the policy can learn tracks what the policy
  already does more or less of (on SmolLM2-135M-Instruct at temperature 1: r = 0.33-0.47 on three arithmetic tasks,
  0.05 under a judge that pays a wrong answer 20% of the time and a right one 60%). The covariance of log-probability
  and advantage is the quantity Clip-Cov and KL-Cov act on (Cui et al., arXiv:2505.22617, entropy dynamics). κ² is the
  posterior mean of ρ² under a uniform prior on ρ, with Fisher's z likelihood, atanh(r) ~ N(atanh(ρ), 1/(df − 2))
  for df within-prompt degrees of freedom: a group with no evidence has κ² = 1/3, and its own estimate takes over as
  evidence comes in, with no test to pass first.

Where it departs from LILO and VCRL: they rank by the variance alone, which judge noise inflates (GRPO's std
normalisation turns it into full-size advantages); κ² discounts it. And it scores groups, not prompts: a prompt is
drawn through its group, in proportion to the group's score (`draw_probabilities`).

Each group's statistics are sums over its prompts. Those of W weigh a prompt 2^(−m/H) after m later prompts of the
group (`policy_group_halflife` = H), so that W follows a group as it learns, and W is shrunk toward the mean over
all groups by as much as the group's own prompts leave uncertain (`signal`), so that one prompt all wrong does not
score a group 0. Those of κ² are kept over the whole run: whether a reward tracks the completions is a property of
the reward, and the longer the evidence, the closer a noisy judge's κ² comes to 0.
"""

import torch

# the sums kept per group (K,): prompts, their rewards', variances' and squared variances' sums, those whose
# completions disagreed;
# over those, the within-prompt sums of reward × log-probability, their squares, and the degrees of freedom
SUMS = ("prompts", "reward", "variance", "variance2", "informative", "rl", "rr", "ll", "df")
_RHO = torch.linspace(-0.995, 0.995, 399, dtype=torch.float64)  # the grid of the posterior of ρ


def prompt_sums(rewards: torch.Tensor, logps: torch.Tensor | None, group_ids: torch.Tensor, num_groups: int):
    """Per-group sums (`SUMS`, each (K,)) of one generation batch: `rewards` and `logps` (P, G), a completion's reward
    and mean token log-probability (NaN: unscored, or no log-probability), `group_ids` (P,) each prompt's group.
    A prompt with fewer than 2 scored completions counts nowhere; without `logps` the last four sums are 0."""
    valid = ~torch.isnan(rewards)
    count = valid.sum(1)
    kept = count >= 2
    r = torch.where(valid, rewards.double(), 0.0)
    mean = r.sum(1) / count.clamp(min=1)
    centred = torch.where(valid, r - mean[:, None], 0.0)  # (P, G)
    variance = (centred**2).sum(1) / (count - 1).clamp(min=1)
    informative = kept & (variance > 1e-12)
    per_prompt = {"prompts": kept.double(), "reward": mean, "variance": variance, "variance2": variance**2,
                  "informative": informative.double()}  # fmt: skip
    if logps is not None:
        both = valid & ~torch.isnan(logps) & informative[:, None]
        n = both.sum(1)
        lp = torch.where(both, logps.double(), 0.0)
        c = torch.where(both, r - (r * both).sum(1, keepdim=True) / n.clamp(min=1)[:, None], 0.0)
        lc = torch.where(both, lp - lp.sum(1, keepdim=True) / n.clamp(min=1)[:, None], 0.0)
        per_prompt |= {"rl": (c * lc).sum(1), "rr": (c**2).sum(1), "ll": (lc**2).sum(1), "df": (n - 1).clamp(min=0)}
    sums = {}
    for name in SUMS:
        values = torch.where(kept, per_prompt[name].double(), 0.0) if name in per_prompt else torch.zeros(len(kept))
        sums[name] = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_ids, values.double())
    return sums


def decayed_add(sums: dict, batch: dict, prompts: torch.Tensor, halflife: float, names=SUMS) -> dict:
    """`sums` + `batch` (dicts of (K,)), each group's old sums weighted 2^(−m/H) for its m = `prompts` (K,) prompts in
    the batch, H = `halflife` prompts: an exponential moving sum over each group's own prompts."""
    keep = torch.pow(0.5, prompts.double() / halflife)
    return {name: sums[name] * keep + batch[name] for name in names}


def credibility(rl: torch.Tensor, rr: torch.Tensor, ll: torch.Tensor, df: torch.Tensor) -> torch.Tensor:
    """κ² (K,): the posterior mean of ρ² given the pooled within-prompt correlation r = rl / √(rr·ll) over df degrees
    of freedom (module docstring); 1/3, the uniform prior's, where df <= 2 or either variance is 0."""
    known = (df > 2) & (rr > 0) & (ll > 0)
    r = torch.where(known, rl / (rr * ll).clamp(min=1e-300).sqrt(), 0.0).clamp(-0.995, 0.995)
    precision = torch.where(known, df - 2, 0.0)  # 1 / var(atanh r)
    log_like = -0.5 * precision[:, None] * (torch.atanh(r)[:, None] - torch.atanh(_RHO)[None, :]) ** 2  # (K, R)
    return (torch.softmax(log_like, dim=1) * _RHO**2).sum(1)  # the posterior mean of ρ²


def signal(sums: dict) -> torch.Tensor:
    """W (K,): each group's mean within-prompt reward variance, shrunk toward the mean over all groups by how much its
    own prompts say (empirical Bayes for a one-way random-effects model, Morris 1983, JASA 78(381); the between-group
    variance τ² by the method of moments, as DerSimonian & Laird 1986): W_i = B_i·m̄ + (1 − B_i)·m_i, m_i the group's
    mean over its n_i recent prompts, m̄ the mean over all, B_i = s² / (s² + n_i·τ²), s² the variance of one prompt's
    variance around m̄ (over all prompts: it holds the between-group part too, which errs toward shrinking, and it is
    known from the first prompts on). A group seen little, or groups that do not differ, get m̄ alike; a group whose
    prompts say it differs gets its own mean."""
    n, total = sums["prompts"], sums["prompts"].sum()
    seen = n > 0
    m = torch.where(seen, sums["variance"] / n.clamp(min=1e-12), 0.0)
    pooled = sums["variance"].sum() / total
    within = ((sums["variance2"].sum() - total * pooled**2) / (total - 1).clamp(min=1)).clamp(min=1e-12)
    between = (n * (m - pooled) ** 2).sum() - (seen.sum() - 1).clamp(min=0) * within
    tau2 = (between / (total - (n**2).sum() / total).clamp(min=1e-12)).clamp(min=0)
    shrink = within / (within + n * tau2)
    return shrink * pooled + (1 - shrink) * m


def scores(sums: dict) -> torch.Tensor:
    """s_i = W_i · κ²_i (K,) from a run's per-group `sums` (module docstring); all 1 before any prompt was scored."""
    if sums["prompts"].sum() <= 0:
        return torch.ones_like(sums["prompts"])
    return signal(sums) * credibility(sums["rl"], sums["rr"], sums["ll"], sums["df"])


def draw_probabilities(scores: torch.Tensor, sizes: torch.Tensor, floor: float) -> torch.Tensor:
    """The probability (K,) of drawing each group for a prompt of the next generation batch: (1 − φ)·n_i·s_i / Σ_j
    n_j·s_j + φ / K_a, φ = `floor` (`policy_group_sampling_floor`), n_i the group's prompts (`sizes`), K_a the groups
    that have prompts. So a prompt is drawn in proportion to its group's score (TRL's uniform draw when all scores
    are equal), and no group with prompts gets less than φ / K_a."""
    available, sizes = sizes > 0, sizes.double()
    mass = sizes * scores.clamp(min=0)
    share = mass / mass.sum() if mass.sum() > 0 else sizes / sizes.sum()  # nothing to learn anywhere: TRL's draw
    return torch.where(available, (1 - floor) * share + floor / available.sum(), 0.0)


def loss_weights(group_weights: torch.Tensor, group_ids: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """Each completion's group weight (N,) from `group_weights` (K,) and its group id `group_ids` (N,), rescaled to
    mean 1 over the completions `used` (N,) bool, those whose advantage is not 0 (the ones that carry a gradient), so
    that the loss scale is unchanged; the weights as they are when none is used."""
    w = group_weights[group_ids]
    return w / w[used].mean() if used.any() and w[used].mean() > 0 else w
