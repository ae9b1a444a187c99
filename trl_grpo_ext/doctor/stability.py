"""The run doctor's checks of a run's stability: the entropy (collapse, explosion), the KL to the reference,
non-finite values, parameters that do not change, gradient-norm spikes."""

import numpy as np

from . import series as S
from .checks import Finding, Run, Skip, check, mean_between, missing, span, too_short
from .thresholds import value

# ----- entropy ----------------------------------------------------------------------------------------------------


def _entropy_windows(run: Run, name: str):
    if not len(run.series("entropy")[0]):
        return missing(name, "entropy", "TRL's GRPOTrainer logs the mean token entropy at every logging step")
    steps, entropy = run.finite("entropy")
    width = run.window(steps)
    if len(entropy) < 2 * width:
        return too_short(name, "entropy", len(entropy), 2 * width)
    means = S.rolling_mean(entropy, width)
    start = means[0]
    later = np.arange(len(means)) >= width  # windows after the first one
    return steps, entropy, width, means, start, later


@check("entropy_collapse")
def entropy_collapse(run: Run) -> list[Finding] | Skip:
    """The mean token entropy fell to a small share of its start: the policy stopped exploring (Cui et al.,
    arXiv:2505.22617)."""
    windows = _entropy_windows(run, "entropy_collapse")
    if isinstance(windows, Skip):
        return windows
    steps, entropy, width, means, _, _ = windows
    # The start is the first few rows' mean, not the first window's: a real model's entropy can collapse within the
    # first window (SmolLM2 at learning rate 1e-3: 2.08 nats at step 1, 0.07 at step 8), which lifts none of it.
    first = S.MIN_WINDOW_ROWS
    start = float(np.nanmean(entropy[:first]))
    ratio = value("entropy_collapse_ratio")
    end = S.first_window((np.arange(len(means)) >= first) & (means <= ratio * start), width)
    if end is None:
        return []
    return [Finding(
        "entropy_collapse", "run", "entropy collapse: the policy has stopped exploring",
        f"entropy {means[end - width + 1]:.3g} nats over {span(steps, end, width)}, "
        f"{means[end - width + 1] / start:.0%} "
        f"of its {start:.3g} over the first {first} rows (<= {ratio:.0%})",
        "entropy_reg=target with entropy_target_ratio=0.15 (trl_grpo_ext keeps the entropy at 0.15 x its first "
        "step's), or "
        f"entropy_reg=clip_cov; a larger upper clip ratio epsilon_high=0.28 (DAPO's clip-higher); temperature"
        f"{run.now('temperature')} at 1.0",
        int(steps[S.onset(end, width, entropy <= ratio * start)]),
    )]  # fmt: skip


@check("entropy_explosion")
def entropy_explosion(run: Run) -> list[Finding] | Skip:
    """The mean token entropy rose far above its start: the completions are turning to noise."""
    windows = _entropy_windows(run, "entropy_explosion")
    if isinstance(windows, Skip):
        return windows
    steps, entropy, width, means, start, later = windows
    ratio, nats = value("entropy_explosion_ratio"), value("entropy_explosion_nats")
    end = S.first_window(later & (means >= ratio * start) & (means - start >= nats), width)
    if end is None:
        return []
    return [Finding(
        "entropy_explosion", "run", "entropy explosion: the completions are turning to noise",
        f"entropy {means[end - width + 1]:.3g} nats over {span(steps, end, width)}, "
        f"{means[end - width + 1] / start:.1f}x its {start:.3g} over the first {width} rows (>= {ratio}x)",
        f"lower the entropy bonus (entropy_coef, entropy_target or entropy_coef_max), the learning_rate"
        f"{run.now('learning_rate')} or the temperature{run.now('temperature')}; grad_reg=zclip bounds the "
        "updates that push it",
        int(steps[S.onset(end, width, (entropy >= ratio * start) & (entropy - start >= nats))]),
    )]  # fmt: skip


# ----- KL ---------------------------------------------------------------------------------------------------------


@check("kl_runaway")
def kl_runaway(run: Run) -> list[Finding] | Skip:
    """The KL to the reference policy is large and still rising (TRL's `kl`, logged with beta > 0)."""
    if not len(run.series("kl")[0]):
        return missing(
            "kl_runaway", "kl", "TRL logs it only with beta > 0: without a KL term there is none to run away"
        )
    steps, kl = run.finite("kl")
    width = run.window(steps)
    if len(kl) < width:
        return too_short("kl_runaway", "kl", len(kl), width)
    means = S.rolling_mean(kl, width)
    rises, se = S.rolling_rise(kl, width)
    end = S.first_window((means >= value("kl_level")) & (rises > 2 * se), width)
    if end is None:
        return []
    return [Finding(
        "kl_runaway", "run", "KL runaway: the policy keeps moving away from the reference",
        f"kl {S.fmt(kl[end - width + 1 : end + 1])} nats/token over {span(steps, end, width)} (mean "
        f"{means[end - width + 1]:.3g} >= {value('kl_level')}, rising {rises[end - width + 1]:.3g} ± "
        f"{se[end - width + 1]:.2g} over the window)",
        f"lower the learning_rate{run.now('learning_rate')}, raise beta{run.now('beta')} or let it adapt "
        "(kl_target, trl_grpo_ext's adaptive KL coefficient), and look for a reward being gamed "
        "(log_completions=True)",
        int(steps[S.onset(end, width, kl >= value("kl_level"))]),
    )]  # fmt: skip


# ----- values and gradients ------------------------------------------------------------------------------------


@check("nonfinite")
def nonfinite(run: Run) -> list[Finding] | Skip:
    """A reward, loss or gradient norm that is not finite, or optimizer steps skipped for non-finite gradients
    (`grad_reg/skipped_steps`).

    Under fp16 loss scaling an infinite gradient norm is usually the scaler's calibration (torch.amp's GradScaler
    skips that step and halves its scale): not a finding at a step whose logged `loss_scale` is at least 1, or where
    `grad_reg/scaler_overflows` rose. A loss scale below 1 is one: the gradients overflow unscaled. The advice names
    bf16 only where the card has it (`device/bf16_supported`, logged on CUDA)."""
    evidence, first = [], None
    names = ["reward", *(f"rewards/{name}/mean" for name in run.keys_like("rewards/", "/mean")), "loss",
             "grad_norm"]  # fmt: skip
    for key in names:
        steps, values = run.series(key)
        bad = steps[~np.isfinite(values)]
        if key == "reward":  # NaN is TRL's "no completion had a valid reward" only where every function was None
            bad = steps[np.isinf(values)] if len(steps) else bad
        if key == "grad_norm":
            bad = bad[~np.isin(bad, _scaler_overflow_steps(run))]
        if len(bad):
            evidence.append(f"{key} not finite at steps {S.fmt(bad)}")
            first = min(first if first is not None else bad[0], bad[0])
    steps, skipped = run.series("grad_reg/skipped_steps")
    if len(steps) and np.nanmax(skipped) > 0:
        at = steps[np.argmax(skipped > 0)]
        evidence.append(f"grad_reg/skipped_steps {int(np.nanmax(skipped))} by step {steps[-1]}")
        first = min(first if first is not None else at, at)
    values_bad = bool(evidence)  # a reward, the loss or a gradient norm (before the loss scale is looked at)
    steps, scale = run.finite("loss_scale")
    if len(steps) and scale.min() < 1:
        at, lowest = steps[np.argmax(scale < 1)], steps[np.argmin(scale)]
        evidence.append(f"the fp16 loss scale fell below 1 at step {at}, to {scale.min():.3g} by step {lowest}: the "
                        "gradients overflow fp16 even unscaled")  # fmt: skip
        first = min(first if first is not None else at, at)
    if not evidence:
        return []
    bf16 = run.finite("device/bf16_supported")[1]
    advice = ["make reward functions return finite numbers (None leaves a completion out)"] if values_bad else []
    if not (len(bf16) and bf16[-1] == 0):  # a card without bf16 (a T4) logs 0: no advice it cannot follow
        advice.append("train in bf16=True rather than fp16")
    if values_bad:
        advice.append("grad_reg=skip_nonfinite skips such an optimizer step without touching the weights")
    advice.append(f"lower the learning_rate{run.now('learning_rate')}")
    return [Finding(
        "nonfinite", "run", "non-finite values: a reward, the loss or the gradients", "; ".join(evidence),
        "; ".join(advice), int(first),
    )]  # fmt: skip


def _scaler_overflow_steps(run: Run) -> np.ndarray:
    """The steps whose non-finite gradient norm was the fp16 loss scaler's overflow: a logged `loss_scale` of at
    least 1, or a rise of `grad_reg/scaler_overflows` (a running total) at that step."""
    steps, scale = run.finite("loss_scale")
    found = steps[scale >= 1]
    count_steps, counts = run.finite("grad_reg/scaler_overflows")
    if len(counts):
        rose = np.diff(counts, prepend=0.0) > 0
        found = np.union1d(found, count_steps[rose])
    return found


FROZEN_FIX = (
    "make the parameters trainable: a LoRA adapter loaded with PeftModel.from_pretrained(base, adapter_dir) is "
    "frozen unless is_trainable=True is passed (or pass the base model with peft_config); a full model needs "
    "requires_grad=True on its parameters"
)


@check("no_update")
def no_update(run: Run) -> list[Finding] | Skip:
    """The parameters did not change: none required gradients at the start of training (the callback's
    `trainable_parameters`), or over `no_update_rows` logged rows in a row the learning rate was 0, or, at rows with a
    learning signal (`frac_reward_zero_std` < 1), the gradient norm was exactly 0, or with beta > 0 the KL to the
    reference was exactly 0 after the first row (the policy never left it). A frozen model trains silently: the
    loss, the rewards and, with PEFT and beta > 0, even the gradient norm move as if it learnt (issue #58)."""
    first = int(run.rows[0]["step"]) if run.rows else 0
    if run.settings.get("trainable_parameters") == 0:
        return [Finding("no_update", "run", "the parameters do not change: none is trainable",
                        "no parameter required gradients at the start of training, so the optimizer holds none",
                        FROZEN_FIX, first)]  # fmt: skip
    need = int(value("no_update_rows"))
    steps, rate = run.finite("learning_rate")
    end = S.first_window(S.rolling_mean((rate == 0).astype(np.float64), need) == 1.0, need)
    if end is not None:
        return [Finding(
            "no_update", "run", "the parameters do not change: the learning rate is 0",
            f"learning_rate 0 at {span(steps, end, need)} ({need} logged rows in a row)",
            f"set learning_rate above 0{run.now('learning_rate')}; with a warm-up, check warmup_steps against "
            "max_steps", int(steps[end - need + 1]),
        )]  # fmt: skip
    key = "kl" if len(run.finite("kl")[0]) else "grad_norm"  # with beta > 0 the KL says whether the policy moved
    steps, (moved, frac) = run.aligned(key, "frac_reward_zero_std")
    signal = (frac < 1) & (steps > first if key == "kl" else True)  # the first row's KL is 0 in any run
    steps, moved = steps[signal], moved[signal]
    if not len(rate) and not len(moved):
        return missing("no_update", "grad_norm", "transformers logs it when it clips gradients, max_grad_norm > 0")
    if len(moved) < need and len(rate) < need:
        return too_short("no_update", f"{key} at rows with frac_reward_zero_std < 1", len(moved), need)
    end = S.first_window(S.rolling_mean((moved == 0).astype(np.float64), need) == 1.0, need)
    if end is None:
        return []
    clipped = mean_between(run, "completions/clipped_ratio", steps[end - need + 1], steps[end])
    masked = ("; with mask_truncated_completions=True and every completion cut, no token is left to train on: raise "
              "max_completion_length" if clipped >= 0.99 else "")  # fmt: skip
    logging = "" if key == "kl" else "; an old DeepSpeed can log a gradient norm of 0 (modelscope/ms-swift#5890)"
    return [Finding(
        "no_update", "run", "the parameters do not change: " + ("the policy never leaves the reference" if key == "kl"
                                                                 else "the gradient is 0 where there is a signal"),
        f"{key} exactly 0 at {need} logged rows in a row with a learning signal ({span(steps, end, need)}, "
        f"frac_reward_zero_std {S.fmt(frac[signal][end - need + 1 : end + 1])} < 1)",
        FROZEN_FIX + masked + logging, int(steps[end - need + 1]),
    )]  # fmt: skip


@check("grad_spikes")
def grad_spikes(run: Run) -> list[Finding] | Skip:
    """A logged gradient norm many times the median of the ones before it (ZClip, arXiv:2504.02507)."""
    history = int(value("grad_spike_history"))
    if not len(run.series("grad_norm")[0]):
        return missing("grad_spikes", "grad_norm", "transformers logs it when it clips gradients, max_grad_norm > 0")
    steps, norm = run.finite("grad_norm")  # a non-finite norm is `nonfinite`'s
    if len(norm) <= history:
        return too_short("grad_spikes", "grad_norm", len(norm), history + 1)
    before = np.lib.stride_tricks.sliding_window_view(norm[:-1], history)  # (n − H, H): the H rows before each
    usable = np.isfinite(before).all(1) & (before > 0).all(1)  # steps without signal have a zero norm
    median = np.where(usable, np.median(np.where(usable[:, None], before, 1.0), axis=1), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = norm[history:] / median
    spikes = np.flatnonzero(np.isfinite(ratio) & (ratio >= value("grad_spike_ratio")))
    if not len(spikes):
        return []
    at = steps[history:][spikes]
    return [Finding(
        "grad_spikes", "run", f"gradient-norm spikes at {len(at)} step(s)",
        f"grad_norm at steps {S.fmt(at)} was {S.fmt(ratio[spikes])}x the median of the {history} rows before it "
        f"(>= {value('grad_spike_ratio')}x)",
        f"grad_reg=zclip clips a spike against the recent norms (ZClip); keep max_grad_norm{run.now('max_grad_norm')} "
        "at 1.0; log_completions=True shows the batch that caused it",
        int(at[0]),
    )]  # fmt: skip
