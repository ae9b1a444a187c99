"""Plots of a GRPO run's logged rows (`trainer.state.log_history`, or the rows `MetricsTableCallback` keeps), each
written to a PNG with matplotlib's Agg backend (no display needed): `plot_curves` (reward, completion length and
entropy against the step, and a small panel for each feature that acted: its coefficient, weights, thresholds or
events, from its own logged metrics) and `plot_policy_groups` (each policy group's weight share and EMA reward, with
the training stages shaded from `stage_spans`)."""

import math

import numpy as np

from ..error_reports import needs_extra


def _series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps (n,), values (n,)) of the rows that log `key` (None, TRL's value where no reward was valid, is NaN)."""
    found = [(row["step"], np.nan if row[key] is None else row[key]) for row in rows
             if "step" in row and key in row and (row[key] is None or isinstance(row[key], int | float))]  # fmt: skip
    if not found:
        return np.empty(0, dtype=np.int64), np.empty(0)
    steps, values = zip(*found, strict=True)
    return np.asarray(steps), np.asarray(values, dtype=float)


def _logged(rows: list[dict], key: str) -> bool:
    """Whether some row logs `key` as a number (not only as None)."""
    return bool(np.isfinite(_series(rows, key)[1]).any())


def _keys(rows: list[dict], prefix: str, suffix: str = "") -> list[str]:
    """The middle parts of the logged keys `<prefix><middle><suffix>`, sorted."""
    keys = {key for row in rows for key in row if key.startswith(prefix) and key.endswith(suffix)}
    return sorted(key[len(prefix) : len(key) - len(suffix)] for key in keys if len(key) > len(prefix) + len(suffix))


def _line(ax, rows: list[dict], key: str, **kwargs) -> bool:
    steps, values = _series(rows, key)
    if np.isfinite(values).any():
        ax.plot(steps, values, marker="o", markersize=2, linewidth=1, **kwargs)
        return True
    return False


def _events(ax, steps, label: str, color: str) -> None:
    """Mark `steps` (where a feature acted once: a clip, a skipped step, a fallback) as thin vertical lines."""
    for i, step in enumerate(steps):
        ax.axvline(step, color=color, linewidth=0.8, alpha=0.6, label=label if i == 0 else None)


def _rose(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, increases) of a running total `key` where it rose since the previous logged row."""
    steps, totals = _series(rows, key)
    keep = np.isfinite(totals)
    steps, totals = steps[keep], totals[keep]
    rise = np.diff(totals, prepend=0.0)
    return steps[rise > 0], rise[rise > 0]


def _entropy_bonus(ax, rows) -> bool:
    drawn = _line(ax, rows, "entropy_reg/coef", color="tab:orange", label="coefficient")
    for name in ("clipped_frac", "penalized_frac"):  # Clip-Cov / KL-Cov: the share of tokens picked
        drawn |= _line(ax, rows, f"entropy_reg/{name}", color="tab:brown", label=name.replace("_", " "))
    ax.set(title="Entropy regularization (entropy_reg)", ylabel="coefficient / share")
    return drawn


def _group_weights(ax, rows) -> bool:
    drawn, names = False, _keys(rows, "policy_groups/", "/weight")
    title, labels = group_labels(names)
    for i, (name, label) in enumerate(zip(names, labels, strict=True)):
        drawn |= _line(ax, rows, f"policy_groups/{name}/weight", color=f"C{i % 10}", label=label)
    ax.set(title="Policy group weights (policy_group_column)", ylabel="weight")
    if drawn:
        ax.legend(fontsize=7, title=title, title_fontsize=7)
    return drawn


def _grad_reg(ax, rows) -> bool:
    drawn = _line(ax, rows, "grad_reg/threshold", color="tab:red", label="clip threshold")
    if drawn:
        _line(ax, rows, "grad_norm", color="gray", alpha=0.6, label="grad_norm")
    steps, clipped = _series(rows, "grad_reg/clipped")
    if (clipped > 0).any():
        _events(ax, steps[clipped > 0], "clipped", "tab:red")
        drawn = True
    drawn |= _line(ax, rows, "grad_reg/agc_clipped_frac", color="tab:purple", label="AGC: share of units clipped")
    for key, label in (("grad_reg/skipped_steps", "step skipped (non-finite)"),
                       ("grad_reg/scaler_overflows", "fp16 scaler overflow")):  # fmt: skip
        at, _ = _rose(rows, key)
        if len(at):
            _events(ax, at, label, "black" if "skipped" in key else "tab:olive")
            drawn = True
    ax.set(title="Gradient regularization (grad_reg)", ylabel="gradient norm")
    return drawn


def _kl_coef(ax, rows) -> bool:
    drawn = _line(ax, rows, "kl_coef", color="tab:purple", label="beta")
    ax.set(title="Adaptive KL coefficient (kl_target)", ylabel="beta")
    return drawn


def _prompt_skip(ax, rows) -> bool:
    steps, skipped = _series(rows, "prompt_skip/skipped_in_batch")
    if not np.isfinite(skipped).any():
        steps, skipped = _rose(rows, "prompt_skip/skipped")
    if len(steps):
        ax.bar(steps, skipped, width=0.8, color="tab:green", label="prompts skipped")
    ax.set(title="Prompt skipping (prompt_skip)", ylabel="prompts skipped")
    return bool(len(steps))


def _fast_generation(ax, rows) -> bool:
    drawn = _line(ax, rows, "fast_generation/merge_time", color="tab:blue", label="LoRA merge time (s)")
    for i, cause in enumerate(_keys(rows, "fast_generation/fell_back/")):
        steps, _ = _series(rows, f"fast_generation/fell_back/{cause}")
        _events(ax, steps[:1], f"fell back to TRL's generation: {cause}", f"C{(i + 3) % 10}")
        drawn = True
    for kind in ("recompile_limit_hits", "cudagraph_skips"):
        steps, counts = _series(rows, f"fast_generation/{kind}")
        if (counts > 0).any():
            _events(ax, steps[counts > 0], kind.replace("_", " "), "tab:red")
            drawn = True
    ax.set(title="Fast generation", ylabel="seconds")
    return drawn


# each feature's panel, in this order, drawn only where the run logged its metrics (it acted)
FEATURE_PANELS = (_entropy_bonus, _group_weights, _grad_reg, _kl_coef, _prompt_skip, _fast_generation)


def plot_curves(rows: list[dict], path: str) -> str:
    """Plot `curves_figure(rows)` into a PNG at `path` and return the path."""
    curves_figure(rows).savefig(path, dpi=110)
    return path


def curves_figure(rows: list[dict]):
    """The training curves against the step (a matplotlib `Figure`, no pyplot state): the mean reward (± the mean
    within-group reward std), the completion length (mean, min-max band, and the share cut at max_completion_length
    on a second axis: what the length penalty of the CPU demo pays for) and the entropy (nats per token; with
    entropy_reg=target its target), then one small panel for each feature whose metrics the run logged, showing when
    it acted: the entropy bonus coefficient (`entropy_reg/coef`) and the share of tokens Clip-Cov/KL-Cov picked, the
    policy group weights, grad_reg's clip threshold with the clipped and skipped steps marked, the adaptive KL
    coefficient, the prompts skipped per step, and fast generation's merge time, fallback and compile trouble."""
    with needs_extra("the plots"):
        from matplotlib.figure import Figure

    panels = [panel for panel in FEATURE_PANELS if _draws(panel, rows)]
    rows_of_panels = 1 + math.ceil(len(panels) / 3)
    fig = Figure(figsize=(15, 3.8 * rows_of_panels))
    axes = fig.subplots(rows_of_panels, 3, squeeze=False)
    ax_reward, ax_length, ax_entropy = axes[0]
    steps, reward = _series(rows, "reward")
    std_steps, std = _series(rows, "reward_std")
    ax_reward.plot(steps, reward, marker="o", markersize=3, label="mean reward")
    if len(std_steps) == len(steps) and (std_steps == steps).all():
        ax_reward.fill_between(steps, reward - std, reward + std, alpha=0.2, label="± std within groups")
    ax_reward.set(ylabel="reward", title="Reward")
    _line(ax_length, rows, "completions/mean_length", color="tab:blue", label="mean")
    low_steps, low = _series(rows, "completions/min_length")
    high_steps, high = _series(rows, "completions/max_length")
    if len(low_steps) and len(low_steps) == len(high_steps) and (low_steps == high_steps).all():
        ax_length.fill_between(low_steps, low, high, alpha=0.15, color="tab:blue", label="min-max")
    ax_length.set(ylabel="tokens", title="Completion length")
    if _logged(rows, "completions/clipped_ratio"):
        twin = ax_length.twinx()
        _line(twin, rows, "completions/clipped_ratio", color="tab:red", linestyle=":", label="share truncated")
        twin.set(ylabel="share truncated", ylim=(-0.05, 1.05))
        twin.legend(fontsize=7, loc="center right")
    _line(ax_entropy, rows, "entropy", color="tab:orange", label="entropy")
    _line(ax_entropy, rows, "entropy_reg/target", color="black", linestyle="--", label="target (entropy_reg)")
    ax_entropy.set(ylabel="nats / token", title="Entropy of the policy")
    for ax, panel in zip(axes[1:].flatten(), panels, strict=False):
        panel(ax, rows)
    for ax in axes[1:].flatten()[len(panels) :]:
        ax.set_visible(False)
    every = np.concatenate([_series(rows, key)[0] for key in ("reward", "loss")])
    for ax in axes.flatten():
        if ax.get_visible():
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
            if len(every) and every.max() > every.min():  # one step range for all, however few steps a feature acted
                ax.set_xlim(every.min() - 0.5, every.max() + 0.5)
            if ax.get_legend_handles_labels()[0] and ax.get_legend() is None:
                ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _draws(panel, rows: list[dict]) -> bool:
    """Whether `panel` has something of this run to draw (drawn on a throwaway axis)."""
    with needs_extra("the plots"):
        from matplotlib.figure import Figure

    return panel(Figure().add_subplot(), rows)


def stage_spans(log_history: list[dict]) -> list[tuple[str, int, int]]:
    """The training stages of a run as (stage name, first step, last step), in order, from the logged
    `policy_groups/stage` (the index into `policy_groups.stages.STAGES`); [] when the run had no stages."""
    from ..policy_groups.stages import STAGES

    spans: list[tuple[str, int, int]] = []
    for row in log_history:
        if "step" not in row or row.get("policy_groups/stage") is None:
            continue
        stage = STAGES[round(row["policy_groups/stage"])]
        if spans and spans[-1][0] == stage:
            spans[-1] = (stage, spans[-1][1], row["step"])
        else:
            spans.append((stage, row["step"], row["step"]))
    return spans


STAGE_COLOURS = {"warmup": "tab:gray", "competition": "white", "fusion": "tab:green"}


# what a unit word the policy groups' names share is a count of (gsm8k.data's difficulty bins: "1-2 steps", "3 steps")
GROUP_UNITS = {"steps": "calculation steps"}


def group_labels(names: list[str]) -> tuple[str, list[str]]:
    """The legend title and entries of policy groups `names`: a unit word all of them end in ("1-2 steps", "3 steps")
    moves to the title ("policy group (calculation steps)", entries "1-2", "3"), so that a group's name does not read
    as a training step; other names are kept ("policy group", the names)."""
    words = {name.rpartition(" ")[2] for name in names}
    if len(words) == 1 and all(" " in name for name in names):
        word = words.pop()
        return f"policy group ({GROUP_UNITS.get(word, word)})", [name.rpartition(" ")[0] for name in names]
    return "policy group", list(names)


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")


def plot_policy_groups(log_history: list[dict], path: str) -> str:
    """Plot each policy group's share of the draw (stacked: `policy_groups/<name>/draw`, the probability of drawing
    the group for a prompt; a log without it, each group's weight as its share of the weights' sum) and its reward
    (one dash and marker per group) against the step into a PNG at `path`, one legend to the right of both; return
    the path.

    `log_history` is `trainer.state.log_history` (or the rows `MetricsTableCallback` keeps): dicts with a `step`
    and `policy_groups/<name>/draw` (or `/weight`) and `policy_groups/<name>/reward` keys. Groups that appear later
    (a split) start where they first appear; merged-away groups stop. With training stages (`policy_groups/stage`
    logged), warm-up is shaded grey and fusion green, each span named at the top (`stage_spans`).
    """
    with needs_extra("the plots"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    prefix = "policy_groups/"
    suffix = (
        "/draw" if any(k.startswith(prefix) and k.endswith("/draw") for row in log_history for k in row) else "/weight"
    )
    names = sorted(
        {
            key[len(prefix) : -len(suffix)]
            for row in log_history
            for key in row
            if key.startswith(prefix) and key.endswith(suffix)
        }
    )
    fig, (ax_weight, ax_reward) = plt.subplots(1, 2, figsize=(11, 3.8))
    # weights stacked as shares of their sum, so equal weights are equal bands (lines on top of each other would hide
    # all but one); a group absent at a step (before a split made it, after a merge ended it) takes no share there
    steps = sorted({row["step"] for row in log_history if "step" in row and any(f"{prefix}{n}{suffix}" in row
                                                                                  for n in names)})  # fmt: skip
    by_step = {}
    for row in log_history:
        if "step" in row:
            by_step.setdefault(row["step"], {}).update(row)
    stacked = [[by_step[step].get(f"{prefix}{name}{suffix}", 0.0) for step in steps] for name in names]
    totals = [sum(column) or 1.0 for column in zip(*stacked, strict=True)] if stacked else []
    shares = [[value / total for value, total in zip(series, totals, strict=True)] for series in stacked]
    title, labels = group_labels(names)
    if steps:
        ax_weight.stackplot(steps, *shares, labels=labels, colors=[f"C{i % 10}" for i in range(len(names))],
                            alpha=0.85, edgecolor="white", linewidth=0.5)  # fmt: skip
    ax_weight.set_ylim(0, 1)
    for i, name in enumerate(names):
        points = [(row["step"], row[f"{prefix}{name}/reward"]) for row in log_history
                  if "step" in row and f"{prefix}{name}/reward" in row]  # fmt: skip
        if points:  # each group its own dash and marker, so equal rewards stay readable
            ax_reward.plot(*zip(*points, strict=True), linestyle=LINE_STYLES[i % len(LINE_STYLES)],
                           marker=MARKERS[i % len(MARKERS)], markersize=3, markevery=max(1, len(points) // 20),
                           linewidth=1.4, color=f"C{i % 10}")  # fmt: skip
    what = "share of the draw" if suffix == "/draw" else "share of the summed weights"
    ax_weight.set(xlabel="training step", ylabel=what, title=f"Policy groups: {what} (stacked)")
    ax_reward.set(xlabel="training step", ylabel="reward", title="Policy group rewards")
    spans = stage_spans(log_history)
    for ax in (ax_weight, ax_reward):
        for i, (stage, first, last) in enumerate(spans):
            end = spans[i + 1][1] if i + 1 < len(spans) else last  # shaded up to where the next stage starts
            ax.axvspan(first, end, color=STAGE_COLOURS[stage], alpha=0.15, lw=0, zorder=3)  # over the stacked bands
            ax.text((first + end) / 2, 0.99, stage, transform=ax.get_xaxis_transform(), ha="center", va="top",
                    fontsize=7, color="dimgray")  # fmt: skip
        ax.grid(alpha=0.3)
    # one legend, off the lines: to the right of both panels
    fig.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, title=title, title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
