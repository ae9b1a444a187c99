"""One PNG of a GRPO run at a glance (`plot_dashboard`): eight panels of the logged metrics against the step, each
finding of the run doctor marked on the panel of its metric."""

import numpy as np

from . import series as S
from .checks import Diagnosis

# the panel each check's findings are marked on
PANEL_OF = {"no_signal": "zero_std", "truncation": "clipped", "entropy_collapse": "entropy",
            "entropy_explosion": "entropy", "kl_runaway": "kl", "format_only": "functions",
            "reward_plateau": "reward", "nonfinite": "grad_norm", "grad_spikes": "grad_norm",
            "generation_bound": "time", "memory": "time"}  # fmt: skip
PANELS = ("reward", "functions", "entropy", "kl", "clipped", "zero_std", "time", "grad_norm")


def _plot(ax, rows, key, **kwargs) -> bool:
    steps, values = S.series(rows, key)
    if len(steps):
        ax.plot(steps, values, marker="o", markersize=2, linewidth=1, **kwargs)
    return bool(len(steps))


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="gray", wrap=True)


def plot_dashboard(rows: list[dict], diagnosis: Diagnosis, path: str, title: str = "") -> str:
    """Plot the run's rows (`series.training_rows` of its log) into a PNG at `path` and return it: reward (± the
    mean within-group std), each reward function's mean (accuracy, format, ...), entropy (nats per token), KL to
    the reference (nats per token), the share of truncated completions and of PPO-clipped tokens, the share of
    generation groups without signal overall and per policy group, the step-time split (generation, scoring,
    the rest: training), and the gradient norm. Each finding of `diagnosis` is a red dashed line at its step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = S.training_rows(rows)
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5))
    ax = dict(zip(PANELS, axes.flatten(), strict=True))
    steps, reward = S.series(rows, "reward")
    _, std = S.series(rows, "reward_std")
    ax["reward"].plot(steps, reward, marker="o", markersize=2, linewidth=1, label="mean reward")
    if len(std) == len(reward):
        ax["reward"].fill_between(steps, reward - std, reward + std, alpha=0.2, label="± std within groups")
    ax["reward"].set(title="Reward", ylabel="reward")
    for name in S.keys_like(rows, "rewards/", "/mean"):
        _plot(ax["functions"], rows, f"rewards/{name}/mean", label=name)
    ax["functions"].set(title="Reward functions (accuracy, format, ...)", ylabel="mean reward")
    _plot(ax["entropy"], rows, "entropy", color="tab:orange")
    ax["entropy"].set(title="Entropy of the policy", ylabel="nats / token")
    if not _plot(ax["kl"], rows, "kl", color="tab:purple"):
        _empty(ax["kl"], "kl not logged\n(beta = 0: no KL term)")
    ax["kl"].set(title="KL to the reference", ylabel="nats / token")
    _plot(ax["clipped"], rows, "completions/clipped_ratio", label="completions truncated")
    _plot(ax["clipped"], rows, "clip_ratio/region_mean", label="tokens PPO-clipped")
    ax["clipped"].set(title="Clipped ratio", ylabel="fraction", ylim=(-0.05, 1.05))
    _plot(ax["zero_std"], rows, "frac_reward_zero_std", color="black", label="all generation groups")
    for name in S.keys_like(rows, "policy_groups/", "/zero_std_frac"):
        _plot(ax["zero_std"], rows, f"policy_groups/{name}/zero_std_frac", label=f"policy group {name}")
    ax["zero_std"].set(title="No signal: generation groups with one reward", ylabel="fraction", ylim=(-0.05, 1.05))
    _plot_time(ax["time"], rows)
    if _plot(ax["grad_norm"], rows, "grad_norm", color="tab:red"):
        _, norm = S.series(rows, "grad_norm")
        positive = norm[np.isfinite(norm) & (norm > 0)]
        if len(positive):  # logarithmic above the smallest norm, linear down to 0 (a step without signal has 0)
            ax["grad_norm"].set_yscale("symlog", linthresh=float(positive.min()))
    else:
        _empty(ax["grad_norm"], "grad_norm not logged")
    ax["grad_norm"].set(title="Gradient norm (before clipping)")
    marked: dict[str, int] = {}
    for finding in diagnosis.findings:
        name = PANEL_OF.get(finding.check, "reward")
        panel, row = ax[name], marked.get(name, 0)
        marked[name] = row + 1
        panel.axvline(finding.step, color="red", linestyle="--", linewidth=1)
        label = finding.check if finding.subject == "run" else f"{finding.check}: {finding.subject}"
        panel.text(finding.step, 0.98 - 0.07 * row, f" {label}", transform=panel.get_xaxis_transform(),
                   color="red", fontsize=7, va="top")  # fmt: skip
    for panel in ax.values():
        panel.set_xlabel("step")
        panel.grid(alpha=0.3)
        if panel.get_legend_handles_labels()[0]:
            panel.legend(fontsize=7)
    checks = sorted({finding.check for finding in diagnosis.findings})
    verdict = f"{len(diagnosis.findings)} finding(s): {', '.join(checks)}" if checks else "no finding"
    fig.suptitle(f"{title + ': ' if title else ''}run doctor, {verdict}", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_time(ax, rows: list[dict]) -> None:
    """Seconds per step: stacked generation / scoring / the rest where the run logged `timing/*`, else step time."""
    kept = [row for row in rows if row.get("step_time") is not None]
    ax.set(title="Step time split", ylabel="seconds / step")
    if not kept:
        _empty(ax, "step_time not logged")
        return
    steps = [row["step"] for row in kept]
    total = np.array([row["step_time"] for row in kept], dtype=np.float64)
    if not any(row.get("timing/generation") is not None for row in kept):
        ax.plot(steps, total, marker="o", markersize=2, linewidth=1, label="step (no timing/*: run_doctor off)")
        return
    generation = np.array([row.get("timing/generation") or 0.0 for row in kept])
    scoring = np.array([row.get("timing/scoring") or 0.0 for row in kept])
    rest = np.maximum(total - generation - scoring, 0.0)
    ax.stackplot(steps, generation, scoring, rest, labels=["generation", "scoring", "training"], alpha=0.8)
