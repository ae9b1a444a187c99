"""Plots of a GRPO run's logged rows (`trainer.state.log_history`, or the rows `MetricsTableCallback` keeps), each
written to a PNG with matplotlib's Agg backend (no display needed): `plot_curves` (reward and entropy against the
step) and `plot_policy_groups` (each policy group's weight share and EMA reward, with the training stages shaded from
`stage_spans`)."""

import numpy as np


def plot_curves(rows: list[dict], path: str) -> str:
    """Plot mean reward (with ± one reward std band) and entropy against the step into a PNG at `path`; return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key: str) -> np.ndarray:  # a missing value (TRL logs None when no reward was valid) is a gap
        return np.array([np.nan if row.get(key) is None else row[key] for row in rows], dtype=float)

    steps, reward, std = [row["step"] for row in rows], series("reward"), series("reward_std")
    fig, (ax_reward, ax_entropy) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_reward.plot(steps, reward, marker="o", markersize=3, label="mean reward")
    ax_reward.fill_between(steps, reward - std, reward + std, alpha=0.2, label="± std")
    ax_reward.set(xlabel="step", ylabel="reward", title="Reward")
    ax_reward.legend()
    ax_entropy.plot(steps, series("entropy"), color="tab:orange", marker="o", markersize=3)
    ax_entropy.set(xlabel="step", ylabel="nats / token", title="Entropy of the policy")
    for ax in (ax_reward, ax_entropy):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")


def plot_policy_groups(log_history: list[dict], path: str) -> str:
    """Plot each policy group's weight (stacked, as its share of the weights' sum: equal weights are equal bands) and
    EMA reward (one dash and marker per group) against the step into a PNG at `path`, one legend to the right of
    both; return the path.

    `log_history` is `trainer.state.log_history` (or the rows `MetricsTableCallback` keeps): dicts with a `step`
    and `policy_groups/<name>/weight` / `policy_groups/<name>/reward` keys. Groups that appear later (a split)
    start where they first appear; merged-away groups stop. With training stages (`policy_groups/stage` logged),
    warm-up is shaded grey and fusion green, each span named at the top (`stage_spans`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prefix, suffix = "policy_groups/", "/weight"
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
    if steps:
        ax_weight.stackplot(steps, *shares, labels=names, colors=[f"C{i % 10}" for i in range(len(names))],
                            alpha=0.85, edgecolor="white", linewidth=0.5)  # fmt: skip
    ax_weight.set_ylim(0, 1)
    for i, name in enumerate(names):
        points = [(row["step"], row[f"{prefix}{name}/reward"]) for row in log_history
                  if "step" in row and f"{prefix}{name}/reward" in row]  # fmt: skip
        if points:  # each group its own dash and marker, so equal rewards stay readable
            ax_reward.plot(*zip(*points, strict=True), linestyle=LINE_STYLES[i % len(LINE_STYLES)],
                           marker=MARKERS[i % len(MARKERS)], markersize=3, markevery=max(1, len(points) // 20),
                           linewidth=1.4, color=f"C{i % 10}")  # fmt: skip
    ax_weight.set(xlabel="step", ylabel="share of the summed weights", title="Policy group weights (stacked)")
    ax_reward.set(xlabel="step", ylabel="EMA reward", title="Policy group rewards")
    spans = stage_spans(log_history)
    for ax in (ax_weight, ax_reward):
        for i, (stage, first, last) in enumerate(spans):
            end = spans[i + 1][1] if i + 1 < len(spans) else last  # shaded up to where the next stage starts
            ax.axvspan(first, end, color=STAGE_COLOURS[stage], alpha=0.15, lw=0, zorder=3)  # over the stacked bands
            ax.text((first + end) / 2, 0.99, stage, transform=ax.get_xaxis_transform(), ha="center", va="top",
                    fontsize=7, color="dimgray")  # fmt: skip
        ax.grid(alpha=0.3)
    # one legend, off the lines: to the right of both panels
    fig.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, title="policy group", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
