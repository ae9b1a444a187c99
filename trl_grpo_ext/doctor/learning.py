"""The run doctor's checks of whether a run is learning: a signal to learn from (overall and per policy group),
generation groups large enough for the pass rate, completions that end, a format learnt without the task, a reward
that has stopped rising."""

import numpy as np

from . import series as S
from .checks import Finding, Run, Skip, check, mean_between, missing, span, too_short
from .thresholds import value

# ----- no learning signal ---------------------------------------------------------------------------------------


def _direction(reward: float, low: float, high: float) -> str:
    """'all-correct', 'all-wrong', 'mixed' or 'constant': where `reward` sits in the run's reward range."""
    if not high - low > 1e-9:
        return "constant"
    position = (reward - low) / (high - low)
    top = value("solved_position")
    return "all-correct" if position >= top else "all-wrong" if position <= 1 - top else "mixed"


NO_SIGNAL_FIX = {
    "all-wrong": "the prompts are too hard for the model as it is: raise num_generations{G} so that some completion "
    "succeeds, start on easier prompts (policy groups by difficulty with policy_group_warmup_steps), raise "
    "temperature{T}, and check the reward function on a correct answer written by hand",
    "best reward, no accuracy": "every completion gets the best total reward the run has seen, but no accuracy: the "
    "other reward functions (format, length) are all the model earns, and the task gives it nothing to learn from: "
    "raise num_generations{G} so that some completion is right, start on easier prompts, and check the accuracy "
    "reward on a correct answer written by hand",
    "all-correct": "the prompts are solved: train on harder ones, set prompt_skip=True to skip the prompts whose "
    "generation groups all agree, or stop the run here",
    "mixed": "set prompt_skip=True (skips, before generation, the prompts whose generation groups all agree: fewer "
    "tokens a step, the same update), or raise num_generations{G}",
    "constant": "every completion has had the same reward since the start: check that the reward functions can "
    "score differently (a parse that always fails, a constant)",
}


@check("no_signal")
def no_signal(run: Run) -> list[Finding] | Skip:
    """Most generation groups give every completion the same reward, so the advantages are 0 and nothing is learnt:
    overall (TRL's `frac_reward_zero_std`) and per policy group (`policy_groups/<name>/zero_std_frac`); each finding
    says whether the group sits at the top of the run's rewards (all-correct) or the bottom (all-wrong)."""
    if not len(run.series("frac_reward_zero_std")[0]):
        return missing("no_signal", "frac_reward_zero_std", "TRL's GRPOTrainer logs it at every logging step")
    steps, frac = run.finite("frac_reward_zero_std")
    width = run.window(steps, "persist_steps")
    threshold, findings = value("zero_std_frac"), []
    found = _window_or_tail(run, frac, width, threshold)
    if len(frac) < width and found is None:
        return too_short("no_signal", "frac_reward_zero_std", len(frac), width)
    reward_steps, reward = run.finite("reward")
    fix = {kind: text.format(G=run.now("num_generations"), T=run.now("temperature"))
           for kind, text in NO_SIGNAL_FIX.items()}  # fmt: skip
    if found is not None:
        end, width, where = found
        at = reward_steps <= steps[end]
        recent = at & (reward_steps >= steps[end - width + 1])
        if recent.any():
            level, low, high = float(np.mean(reward[recent])), float(np.min(reward[at])), float(np.max(reward[at]))
        else:  # no finite reward: TRL logs NaN where no completion had a valid reward
            level = low = high = float("nan")
        kind = _direction(level, low, high)
        first_step, last_step = steps[end - width + 1], steps[end]
        means = {name: mean_between(run, f"rewards/{name}/mean", first_step, last_step)
                 for name in run.keys_like("rewards/", "/mean")}  # fmt: skip
        per_function = [f"{name} {mean:.3g}" for name, mean in means.items()]
        accuracy = [mean for name, mean in means.items() if "accuracy" in name.lower() or "correct" in name.lower()]
        if kind == "all-correct" and accuracy and max(accuracy) < value("accuracy_flat"):
            kind = "best reward, no accuracy"  # the top of the range is made of the other rewards (the CPU demo)
        findings.append(Finding(
            "no_signal", "run",
            f"no learning signal{where} ({kind}): the completions of a prompt all get the same reward",
            f"frac_reward_zero_std {S.fmt(frac[end - width + 1 : end + 1])} over {span(steps, end, width)} "
            + (f"({int(np.sum(frac[-width:] >= threshold))} of the last {width} rows >= {threshold})" if where else
               f"(mean {np.nanmean(frac[end - width + 1 : end + 1]):.3g} >= {threshold})")
            + f"; reward {level:.3g} in the run's range [{low:.3g}, {high:.3g}]"
            + (f"; per reward function: {', '.join(per_function)}" if per_function else ""),
            fix[kind], int(steps[S.onset(end, width, frac >= threshold)]),
        ))  # fmt: skip
    for name in run.keys_like("policy_groups/", "/zero_std_frac"):
        findings += _group_no_signal(run, name, threshold, fix)
    return findings


def _window_or_tail(run: Run, values: np.ndarray, width: int, threshold: float) -> tuple[int, int, str] | None:
    """Where `values` (n,) sit at or above `threshold`: the first window of `width` rows whose mean does (its last
    row, `width`, ""), else the last rows of a run that ended so (`Run.tail`: one noisy row let pass; the last row,
    their count, " at the end of the run"), else None."""
    end = S.first_window(S.rolling_mean(values, width) >= threshold, width)
    if end is not None:
        return end, width, ""
    tail = run.tail(values >= threshold)
    return (len(values) - 1, tail, " at the end of the run") if tail else None


def _group_no_signal(run: Run, name: str, threshold: float, fix: dict) -> list[Finding]:
    """`no_signal` for one policy group: its `zero_std_frac` at or above `threshold` over a window, or over the
    last rows of a run that ended so (`Run.tail`, as for the run itself). A group first drawn after the run's first
    step has no row before it (and no signal either): its window is its rows, once they end a window after the
    run's first step (so a group first drawn at step 2 of a 40-step run is judged over steps 2-40)."""
    steps, frac = run.finite(f"policy_groups/{name}/zero_std_frac")
    width = run.window(steps, "persist_steps")
    run_steps, _ = run.finite("frac_reward_zero_std")
    if 0 < len(frac) < width and steps[-1] - run_steps[0] + 1 >= value("persist_steps"):
        width = len(frac)
    found = _window_or_tail(run, frac, width, threshold)
    if found is None:
        return []
    end, width, where = found
    group_steps, reward = run.finite(f"policy_groups/{name}/reward")
    rewards = [run.finite(f"policy_groups/{other}/reward") for other in run.keys_like("policy_groups/", "/reward")]
    rewards.append(run.finite("reward"))
    seen = np.concatenate([values[at <= steps[end]] for at, values in rewards])
    mine = reward[(group_steps <= steps[end]) & (group_steps >= steps[end - width + 1])]
    level = float(np.mean(mine)) if len(mine) else float("nan")
    low, high = (float(seen.min()), float(seen.max())) if len(seen) else (float("nan"), float("nan"))
    kind = _direction(level, low, high)
    group_fix = {
        "all-correct": f"policy group {name!r} is solved: prompt_skip=True skips its prompts (with policy grouping "
        "its weight also falls by itself), or take it out of the data",
        "all-wrong": f"policy group {name!r} is out of reach for now: raise num_generations"
        f"{run.now('num_generations')}, "
        "leave it for later (a curriculum, or policy grouping's weights, which put the steps elsewhere), and check "
        "its reward function on a correct answer",
    }.get(kind, fix[kind])
    return [Finding(
        "no_signal", f"policy group {name!r}", f"no learning signal{where} in policy group {name!r} ({kind})",
        f"policy_groups/{name}/zero_std_frac {S.fmt(frac[end - width + 1 : end + 1])} over {span(steps, end, width)}"
        f" (mean {np.nanmean(frac[end - width + 1 : end + 1]):.3g}); its reward {level:.3g} in the run's range "
        f"[{low:.3g}, {high:.3g}]",
        group_fix, int(steps[S.onset(end, width, frac >= threshold)]),
    )]  # fmt: skip


# ----- small generation groups -----------------------------------------------------------------------------------


def degenerate_share(p: np.ndarray, group: int) -> np.ndarray:
    """p^G + (1 − p)^G: the share of generation groups of G completions that all pass or all fail when each passes
    with probability p (n,), so that the group's advantages are 0 (DAPO, arXiv:2503.14476 §3.2). With the pass rate
    varying over the prompts, the mean pass rate gives a lower bound (the function is convex in p)."""
    return p**group + (1 - p) ** group


def pass_fail_reward(run: Run) -> str | None:
    """The reward function whose pass rate decides the run's learning signal: one named `*accuracy*` or `*correct*`
    (or the run's only reward function) that scores each completion 0 or 1: its logged mean in [0, 1] and, where the
    mean is strictly between, its variance at least `pass_fail_variance` of m(1 − m) (the most a reward in [0, 1]
    can vary; 0 where the mean is 0 or 1). None when there is none."""
    names = run.keys_like("rewards/", "/mean")
    named = [name for name in names if "accuracy" in name.lower() or "correct" in name.lower()]
    for name in named or (names if len(names) == 1 else []):
        _, (mean, std) = run.aligned(f"rewards/{name}/mean", f"rewards/{name}/std")
        if not len(mean) or mean.min() < 0 or mean.max() > 1:
            continue
        inside = (mean > 0) & (mean < 1)
        share = std[inside] ** 2 / (mean[inside] * (1 - mean[inside]))
        if (std[~inside] < 1e-6).all() and (not inside.any() or np.median(share) >= value("pass_fail_variance")):
            return name
    return None


@check("small_groups")
def small_groups(run: Run) -> list[Finding] | Skip:
    """At the run's pass rate p (its pass/fail reward's mean, `pass_fail_reward`) and `num_generations` G, most
    generation groups are expected to pass or fail as a whole, p^G + (1 − p)^G (`degenerate_share`), over a window:
    at least `small_group_share`, and a G of at most `small_group_max` would bring it to `small_group_target` (else
    the prompts are too hard or too easy for any G: no_signal's finding)."""
    group = run.settings.get("num_generations")
    if not group:
        return Skip("small_groups", "needs num_generations, which the log does not hold: the callback knows it "
                    "during training (run_doctor=True), `trl-grpo-ext doctor RUN_DIR` does not")  # fmt: skip
    name = pass_fail_reward(run)
    if name is None:
        return Skip("small_groups", "needs a pass/fail reward (0 or 1 per completion, named *accuracy* or *correct*, "
                    "or the only one; rewards/<name>/mean and /std); this run logs "
                    f"{run.keys_like('rewards/', '/mean')}")  # fmt: skip
    steps, p = run.finite(f"rewards/{name}/mean")
    width = run.window(steps)
    if len(p) < width:
        return too_short("small_groups", f"rewards/{name}/mean", len(p), width)
    expected = S.rolling_mean(degenerate_share(p, group), width)
    most = int(value("small_group_max"))
    fixable = S.rolling_mean(degenerate_share(p, most), width) <= value("small_group_target")
    end = S.first_window((expected >= value("small_group_share")) & (expected < value("zero_std_frac")) & fixable,
                         width)  # fmt: skip
    if end is None:
        return []
    i, within = end - width + 1, p[end - width + 1 : end + 1]
    larger = next(
        g for g in range(group + 1, most + 1) if degenerate_share(within, g).mean() <= value("small_group_target")
    )
    measured = mean_between(run, "frac_reward_zero_std", steps[i], steps[end])
    return [Finding(
        "small_groups", "run", f"generation groups too small for the pass rate: {expected[i]:.0%} are expected to "
        "pass or fail as a whole",
        f"{name} (pass/fail) mean {np.mean(within):.3g} over {span(steps, end, width)} with num_generations {group}: "
        f"p^G + (1 − p)^G = {expected[i]:.0%} of the generation groups all pass or all fail (>= "
        f"{value('small_group_share'):.0%}); frac_reward_zero_std measured {measured:.2f}",
        f"raise num_generations (now {group}) to {larger} or more (p^G + (1 − p)^G then "
        f"{degenerate_share(within, larger).mean():.0%}), keeping the generation batch a multiple of it; or train "
        "on prompts the model passes about half the time (p = 0.5 gives 2^(1 − G)); prompt_skip=True skips the "
        "prompts whose groups agreed",
        int(steps[S.onset(end, width, degenerate_share(p, group) >= value("small_group_share"))]),
    )]  # fmt: skip


# ----- completions ------------------------------------------------------------------------------------------------


@check("collapse")
def collapse(run: Run) -> list[Finding] | Skip:
    """The completions collapsed to (almost) nothing: TRL's `completions/mean_length` at or below `collapsed_length`
    tokens over `window_steps`, or over the last rows of a run that ended so (`Run.tail`). A model wrecked by its
    updates (most often a learning rate far above what it was pretrained at) answers with the end-of-sequence token
    at once."""
    if not len(run.series("completions/mean_length")[0]):
        return missing("collapse", "completions/mean_length", "TRL's GRPOTrainer logs it at every logging step")
    steps, length = run.finite("completions/mean_length")
    width, limit = run.window(steps), value("collapsed_length")
    tail = run.tail(length <= limit)
    if len(length) < width and not tail:
        return too_short("collapse", "completions/mean_length", len(length), width)
    end = S.first_window(S.rolling_mean(length, width) <= limit, width)
    where = ""
    if end is None and tail:
        end, width, where = len(length) - 1, tail, " at the end of the run"
    if end is None:
        return []
    return [Finding(
        "collapse", "run", f"the completions collapsed to (almost) nothing{where}",
        f"completions/mean_length {S.fmt(length[end - width + 1 : end + 1])} tokens over {span(steps, end, width)} "
        + (f"({int(np.sum(length[-width:] <= limit))} of the last {width} rows <= {limit:g})" if where else
           f"(<= {limit:g})")
        + f", from {length[0]:.3g} at step {steps[0]}",
        f"lower learning_rate{run.now('learning_rate')}: a pretrained model is trained with at most about 1e-5 in "
        "full fine-tuning and 2e-4 with LoRA (in the recipes --use_peft true, or "
        "--config recipes/configs/smollm2_cpu.yaml for a small model); check that no reward function pays for "
        "an empty answer",
        int(steps[S.onset(end, width, length <= limit)]),
    )]  # fmt: skip


@check("truncation")
def truncation(run: Run) -> list[Finding] | Skip:
    """Many completions are cut at `max_completion_length` (TRL's `completions/clipped_ratio`) over the second half
    of `persist_steps`, and no fewer than in the first half."""
    if not len(run.series("completions/clipped_ratio")[0]):
        return missing("truncation", "completions/clipped_ratio", "TRL's GRPOTrainer logs it at every logging step")
    steps, clipped = run.finite("completions/clipped_ratio")
    width = run.window(steps, "persist_steps")
    half = width // 2
    if len(clipped) < width:
        return too_short("truncation", "completions/clipped_ratio", len(clipped), width)
    first = S.rolling_mean(clipped, half)[: len(clipped) - width + 1]  # (n − W + 1,) each window's first half
    second = S.rolling_mean(clipped, width - half)[half:]  # and its second half
    kept = (second >= value("truncated_frac")) & (second >= (1 - value("truncated_fall")) * first)
    end = S.first_window(kept, width)
    if end is None:
        return []
    i = end - width + 1
    length = run.settings.get("max_completion_length")
    if length is None:  # a truncated completion is exactly max_completion_length long
        _, longest = run.finite("completions/max_length")
        length = int(longest.max()) if len(longest) else None
    raise_to = f" to about {2 * length}" if length else ""
    return [Finding(
        "truncation", "run", "completions are cut at max_completion_length and the share is not falling",
        f"completions/clipped_ratio {S.fmt(clipped[i : end + 1])} over {span(steps, end, width)} (mean "
        f"{first[i]:.2f} in the first half, {second[i]:.2f} in the second >= {value('truncated_frac')})",
        f"raise max_completion_length{f' (now {length})' if length else ''}{raise_to}, or teach the model to end "
        "sooner: a length penalty (reward_funcs with soft_overlong_punishment, DAPO's overlong shaping), or "
        "mask_truncated_completions=True so that cut completions do not count in the loss",
        int(steps[S.onset(end, width, clipped >= value("truncated_frac"))]),
    )]  # fmt: skip


# ----- rewards ----------------------------------------------------------------------------------------------------


@check("format_only")
def format_only(run: Run) -> list[Finding] | Skip:
    """A format reward rose and, `plateau_steps` later, every accuracy reward is still where it started: the model
    learnt the format, not the task (a healthy run learns the format first too, and its accuracy follows)."""
    names = run.keys_like("rewards/", "/mean")
    formats = [name for name in names if "format" in name.lower()]
    accuracies = [name for name in names if "accuracy" in name.lower() or "correct" in name.lower()]
    if not formats or not accuracies:
        return Skip("format_only", "needs a format reward and an accuracy reward, reward functions named *format* and "
                    f"*accuracy* or *correct* (rewards/<name>/mean); this run logs {names or 'none'}")  # fmt: skip
    steps, _ = run.aligned(*(f"rewards/{name}/mean" for name in formats + accuracies))
    width = run.window(steps)
    if len(steps) < width + run.window(steps, "plateau_steps"):
        return too_short("format_only", f"rewards/{formats[0]}/mean", len(steps),
                          width + run.window(steps, "plateau_steps"))  # fmt: skip
    _, values = run.aligned(*(f"rewards/{name}/mean" for name in formats + accuracies))
    start_of = {name: S.rolling_mean(v, width) for name, v in zip(formats + accuracies, values, strict=True)}
    n = len(steps) - width + 1
    flat = np.ones(n, dtype=bool)
    for name in accuracies:
        flat &= np.abs(start_of[name][:n] - start_of[name][0]) < value("accuracy_flat")
    flat = np.logical_and.accumulate(flat)  # flat from the start up to each window
    wait = run.window(steps, "plateau_steps")
    for name in formats:
        rose = start_of[name][:n] - start_of[name][0] >= value("format_rise")
        if not rose.any():
            continue
        learnt = np.arange(n) >= np.argmax(rose) + wait  # the format learnt `plateau_steps` ago, accuracy still flat
        end = S.first_window(learnt & flat, width)
        if end is not None:
            i = end - width + 1
            accuracy = ", ".join(f"{a} {start_of[a][0]:.3g} -> {start_of[a][i]:.3g}" for a in accuracies)
            return [Finding(
                "format_only", "run", f"format-only learning: {name} rises, accuracy does not",
                f"{name} {start_of[name][0]:.3g} -> {start_of[name][i]:.3g} (first window -> "
                f"{span(steps, end, width)}, rise >= {value('format_rise')}, reached at step "
                f"{steps[np.argmax(rose) + width - 1]}); {accuracy} (moved < {value('accuracy_flat')} since the "
                "start)",
                "check the accuracy reward on a correct completion (does it parse the answer the model writes?); give "
                "the format reward a smaller weight (reward_weights) or only together with a correct answer (as "
                "open-instruct does), and make sure the model can solve some prompts (num_generations"
                f"{run.now('num_generations')})",
                int(steps[end - width + 1]),
            )]  # fmt: skip
    return []


@check("reward_plateau")
def reward_plateau(run: Run) -> list[Finding] | Skip:
    """The reward has not risen for `plateau_steps` steps (flat or falling with 95% confidence), in each of the
    windows ending over `window_steps` steps in a row, although the completions still disagree (so there is a
    signal, and it is not being learnt)."""
    steps, (reward, reward_std, frac) = run.aligned("reward", "reward_std", "frac_reward_zero_std")
    width = run.window(steps, "plateau_steps")
    if len(reward) < width:
        return too_short("reward_plateau", "reward, reward_std and frac_reward_zero_std", len(reward), width)
    rises, se = S.rolling_rise(reward, width)
    spread = S.rolling_mean(reward_std, width)
    short = run.window(steps)  # the completions still disagree at the end of the window (else: no_signal's)
    recent = S.rolling_mean(frac, short)[width - short :] if width >= short else S.rolling_mean(frac, width)
    signal = recent < value("zero_std_frac")
    seen = np.fmax.accumulate(reward)[width - 1 :] - np.fmin.accumulate(reward)[width - 1 :]  # the range so far
    disagree = (spread > 0) & (spread >= value("plateau_spread") * seen)
    flat = (rises + 2 * se < value("plateau_tol") * spread) & disagree & signal  # (n − W + 1,) per window
    # and for `window_steps` windows in a row: a run that rises is not called flat on one unlucky window
    run_of = run.window(steps)
    held = S.rolling_mean(flat.astype(np.float64), run_of) == 1.0 if len(flat) >= run_of else np.zeros(0, dtype=bool)
    start = S.first_window(held, run_of)
    if start is None:
        return []
    end = start + width - 1  # the last row of the last window of the run of flat ones
    i = start - run_of + 1  # the first flat window
    how = "fell" if rises[i] + 2 * se[i] < 0 else "does not rise"
    return [Finding(
        "reward_plateau", "run", f"reward plateau: the completions still disagree, but the reward {how}",
        f"reward {S.fmt(reward[i : i + width])} over {span(steps, i + width - 1, width)} and the windows "
        f"after it to step {steps[end]}: rise {rises[i]:.3g} + 2 x "
        f"{se[i]:.2g} (its standard error) under {value('plateau_tol')} x the mean reward std {spread[i]:.3g}",
        f"raise the learning_rate{run.now('learning_rate')} (LoRA usually wants 1e-5 to 1e-4), lower beta"
        f"{run.now('beta')}; with several kinds of prompts, policy grouping (policy_group_column) puts the steps "
        "where the reward still moves; at the task's ceiling, stop here",
        int(steps[i]),
    )]  # fmt: skip
