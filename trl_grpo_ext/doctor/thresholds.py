"""Every threshold of the run doctor's checks, with where it comes from (`THRESHOLDS`, name -> `Threshold`).

"Our measurement" means `benchmarks/doctor/doctor_detection.py` on its labelled logs
(`benchmarks/doctor/results/doctor_detection.*`, the CPU demo, the benchmarks' own runs, real runs made to fail, and
synthetic logs of each failure) or the benchmark named.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Threshold:
    """One threshold: its value, the unit, what it means, and its source (a paper with its arXiv id, a TRL or verl
    issue, or our own measurement)."""

    value: float
    unit: str
    meaning: str
    source: str


THRESHOLDS: dict[str, Threshold] = {
    "window_steps": Threshold(
        20, "optimizer steps",
        "the span a condition must hold over (the mean of the rows logged in it) before a check reports it, so a "
        "few noisy steps are not a finding",
        "our measurement: healthy runs stay below the thresholds below over any 20 steps",
    ),
    "persist_steps": Threshold(
        40, "optimizer steps",
        "the longer span of the checks of a state a run can pass through and leave by itself (no signal while the "
        "first successes are rare; truncation while a length penalty is learnt)",
        "our measurement: the benchmarks' sparse-reward runs (policy_groups_learning.py, 4 completions per prompt) "
        "go up to 20 steps without one informative generation group before they learn; the CPU demo's truncation "
        "falls from 94% to 0 within 30 steps",
    ),
    "zero_std_frac": Threshold(
        0.95, "fraction of generation groups",
        "no learning signal: over `persist_steps`, at least this share of the generation groups gave every "
        "completion the same reward (TRL's `frac_reward_zero_std`, or a policy group's `zero_std_frac`), so their "
        "advantages are all 0",
        "DAPO, arXiv:2503.14476 §3.2 (groups of all-0 or all-1 accuracy have zero advantage and no gradient); TRL "
        "issues huggingface/trl#3452 and #3857 (loss 0 with frac_reward_zero_std 1.0); our measurement: the "
        "sparse-reward benchmark runs (policy_groups_learning.py's no_noise mix, 4 completions per prompt) peak at "
        "0.89-0.94 over 40 steps, but for stock TRL's seed 1 (0.98), which never reaches the mix's threshold in 160 "
        "steps",
    ),
    "solved_position": Threshold(
        0.75, "fraction of the run's reward range",
        "a generation group without signal counts as all-correct when its reward is in the top quarter of the "
        "rewards the run has logged, all-wrong in the bottom quarter, mixed in between",
        "our choice: the midpoint ± a quarter of the range, so binary and shaped rewards both classify",
    ),
    "tail_rows": Threshold(
        5, "logged rows",
        "at the end of a run, a state its last rows are all in is reported though it lasted less than a window: "
        "over this many rows, or over the last half of a run shorter than twice that (2 rows at least)",
        "our choice: the CPU demo ends with 9 steps (31-39) without signal, which its dashboard shows and a window "
        "missed",
    ),
    "tail_outliers": Threshold(
        1, "logged rows",
        "the rows of a run's end that may be out of the state it ended in (the last row included): one noisy step "
        "does not clear a state the run ended in",
        "issue #58: the CPU demo of then, without signal from step 30 to 39 and one noisy last step (40: 3 of its 4 "
        "generation groups without signal), which cleared it; our measurement: a share of one row in five instead "
        "reports a stock TRL benchmark run (no_noise_trl) as ending solved over its last 31 steps, 6 of which had a "
        "signal",
    ),
    "collapsed_length": Threshold(
        2.0, "tokens",
        "collapsed completions: the mean completion length (TRL's `completions/mean_length`) at or below this, "
        "over a window or the run's last rows (`tail_rows`): empty or near-empty completions, nothing to score",
        "issue #30 (a user's run): SmolLM2-135M-Instruct full fine-tuned at the CPU demo's learning rate (0.003) "
        "answers with the empty string (1 token: the end of sequence) after one update; our measurement: the CPU "
        "demo's tiny model, which learns to end early, is at 2.1-5.3 tokens over its last 10 steps",
    ),
    "small_group_share": Threshold(
        0.5, "fraction of generation groups",
        "small generation groups: over a window, p^G + (1 - p)^G, the share of generation groups whose G "
        "completions all pass or all fail at the run's pass rate p, is at least this (and below `zero_std_frac`, "
        "where it is `no_signal`'s finding): most groups have no advantage because G is small for p",
        "DAPO, arXiv:2503.14476 §3.2 (all-pass and all-fail groups give no gradient); issue #58: num_generations=2 "
        "at a 20% pass rate, 0.2^2 + 0.8^2 = 68% expected (72% measured), which the doctor missed; our choice of "
        "half",
    ),
    "small_group_target": Threshold(
        0.25, "fraction of generation groups",
        "the share of all-pass or all-fail groups the num_generations a `small_groups` finding suggests brings "
        "the expected share down to",
        "our choice: three groups in four with a learning signal",
    ),
    "small_group_max": Threshold(
        64, "completions per prompt",
        "the largest num_generations a `small_groups` finding suggests: where even this many would leave more than "
        "`small_group_target` of the groups all-pass or all-fail, the prompts are too hard or too easy for the "
        "model, not the groups too small (`no_signal`'s advice), and there is no finding",
        "our choice: 4x the 16 completions per prompt of DAPO (arXiv:2503.14476 §4.1); our measurement: the "
        "synthetic all-wrong logs (pass rate 0.5%) would need about 280",
    ),
    "pass_fail_variance": Threshold(
        0.8, "fraction of m(1 - m)",
        "a reward function is pass/fail (each completion 0 or 1) when its logged variance (`rewards/<name>/std` "
        "squared) is at least this share of m(1 - m), m its logged mean: the most a reward in [0, 1] can vary, "
        "reached only when every value is 0 or 1",
        "Bhatia and Davis, Amer. Math. Monthly 107(4), 2000 (the variance of values in [0, 1] with mean m is at "
        "most m(1 - m)); our choice of 0.8, for rows that average several steps",
    ),
    "truncated_frac": Threshold(
        0.2, "fraction of completions",
        "truncation: over the second half of `persist_steps`, at least this share of the completions hit "
        "`max_completion_length` (TRL's `completions/clipped_ratio`), and the share is not falling",
        "DAPO, arXiv:2503.14476 §3.4 (truncated samples are reward noise; overlong filtering and punishment)",
    ),
    "truncated_fall": Threshold(
        0.25, "fraction of the first half's mean",
        "truncation whose second-half mean is more than this share below its first-half mean is being learnt "
        "away (a length penalty at work) and is not reported",
        "our measurement: the CPU demo's clipped ratio falls from 0.94 to 0.13 over its first 20 steps",
    ),
    "entropy_collapse_ratio": Threshold(
        0.1, "fraction of the starting entropy",
        "entropy collapse: the mean token entropy, over a window, fell to at most this share of its mean over "
        "the first 3 rows",
        "Cui et al., arXiv:2505.22617 §2 (entropy drops by an order of magnitude early, and performance saturates "
        "with it); our measurement on benchmarks/entropy/entropy_collapse.py: stock TRL ends at 2-8% of its start",
    ),
    "entropy_explosion_ratio": Threshold(
        2.0, "times the starting entropy",
        "entropy explosion: the mean token entropy rose to at least this multiple of its first window's value, "
        "and by at least `entropy_explosion_nats`",
        "Skywork-OR1, arXiv:2505.22312 §4 (entropy blows up with a too large entropy coefficient, and accuracy "
        "falls); our choice of factor",
    ),
    "entropy_explosion_nats": Threshold(
        0.5, "nats per token", "the least rise in entropy an explosion needs (a tiny entropy doubling is noise)",
        "our choice",
    ),
    "kl_level": Threshold(
        0.5, "nats per token",
        "KL runaway: the mean KL to the reference (TRL's `kl`, with beta > 0) is above this and still rising over "
        "the window (its least-squares rise more than two standard errors above 0)",
        "open-r1 issue huggingface/open-r1#257 and ms-swift modelscope/ms-swift#6550 (KL grows without bound "
        "while the rewards fall); healthy runs in our measurement stay below 0.1",
    ),
    "format_rise": Threshold(
        0.2, "reward units",
        "format-only learning: a format reward (a reward function named `*format*`) rose by at least this since the "
        "first window",
        "TRL issues huggingface/trl#3903 and #5298, open-r1 huggingface/open-r1#255 (format reward to 1, accuracy "
        "flat near 0)",
    ),
    "accuracy_flat": Threshold(
        0.02, "reward units",
        "…while every accuracy reward (named `*accuracy*` or `*correct*`) moved by less than this",
        "our choice: 2 points of accuracy, under the noise of a few hundred completions",
    ),
    "plateau_steps": Threshold(
        40, "optimizer steps",
        "reward plateau: the span over which the reward must be flat (two windows), with the completions still "
        "disagreeing (no `zero_std_frac` finding)",
        "our measurement (issue #18): a 16-batch trend window is enough to end warm-up; a warning waits longer",
    ),
    "plateau_tol": Threshold(
        0.1, "times the mean within-group reward std",
        "flat: the least-squares rise of the reward over the span, plus two standard errors (flat with 95% "
        "confidence, not merely too noisy to tell), is below this times the mean `reward_std`",
        "our measurement (issue #18: the policy groups' warm-up, until issue #69, ended on one standard error)",
    ),
    "plateau_spread": Threshold(
        0.05, "fraction of the run's reward range",
        "the completions still disagree: the mean `reward_std` over the span is at least this share of the range "
        "of rewards the run has logged (a solved task's last few disagreements are not a plateau to fix)",
        "our measurement: solved benchmark runs (entropy_collapse.py) end with a reward std of 0.2-0.3% of their "
        "range",
    ),
    "no_update_rows": Threshold(
        5, "logged rows",
        "parameters that did not change: this many logged rows in a row, among those with a learning signal "
        "(`frac_reward_zero_std` < 1), with a gradient norm of exactly 0 (or, with beta > 0, a KL to the reference "
        "of exactly 0 after the first row), or with a learning rate of 0",
        "issue #58: a model whose parameters are all frozen (a PEFT adapter loaded without is_trainable=True) logs "
        "grad_norm 0 at every step (beta 0) or kl 0 (beta > 0, a fresh adapter); a run that learns has a norm of 0 "
        "only where no generation group has a signal (the CPU demo's steps 27, 29 and 31-40) and a KL above 0 after "
        "its first update",
    ),
    "grad_spike_ratio": Threshold(
        10.0, "times the median",
        "gradient-norm spike: a logged `grad_norm` at least this multiple of the median of the "
        "`grad_spike_history` rows before it",
        "ZClip, arXiv:2504.02507 §3 (spikes are outliers against the recent norm; it clips at z > 2.5, a warning "
        "waits for far larger ones); our benchmarks/grad_reg/gradient_spikes.py: stock TRL's norm moves within 3x of "
        "its median between injected spikes",
    ),
    "grad_spike_history": Threshold(10, "logged rows", "the rows a spike is measured against (at least 5 logged)",
                                    "ZClip's warm-up, arXiv:2504.02507 §3"),
    "generation_share": Threshold(
        0.9, "fraction of step time",
        "generation-bound: at least this share of the step time (TRL's `step_time`) went to `model.generate` "
        "(`timing/generation`, logged with `run_doctor`)",
        "an H200 measurement of the earlier presets (benchmarks/generation/gpu_throughput.py; today's presets have "
        "not run on a GPU): their 40-58 s steps were almost all generation; TRL's docs on vLLM for the same reason",
    ),
    "memory_high": Threshold(
        0.95, "fraction of the card",
        "memory: the peak reserved CUDA memory is at least this share of the card (an out-of-memory error or "
        "allocator thrashing is near)",
        "PyTorch's CUDA caching-allocator notes (fragmentation near the limit; `expandable_segments`); our "
        "benchmarks/generation/gpu_memory.py",
    ),
    "memory_low": Threshold(
        0.4, "fraction of the card",
        "memory: the peak reserved CUDA memory stays below this share of the card over the run (room for larger "
        "generation batches, which make steps faster)",
        "our measurement: the consumer-GPU presets use 55-90% of their card (trl_grpo_ext.consumer_gpu.memory)",
    ),
}  # fmt: skip


def value(name: str) -> float:
    """The value of threshold `name` (a KeyError names a threshold that does not exist)."""
    return THRESHOLDS[name].value
