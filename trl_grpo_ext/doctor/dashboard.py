"""One PNG of a GRPO run at a glance (`plot_dashboard`): nine panels of the logged metrics against the step, each
finding of the run doctor marked on the panel of its metric."""

import numpy as np

from ..error_reports import needs_extra
from . import series as S
from .checks import Diagnosis, Run

# the panel each check's findings are marked on
PANEL_OF = {"no_signal": "zero_std", "small_groups": "zero_std", "truncation": "clipped",
            "entropy_collapse": "entropy", "entropy_explosion": "entropy", "kl_runaway": "kl",
            "format_only": "functions", "reward_plateau": "reward", "nonfinite": "grad_norm",
            "no_update": "grad_norm", "grad_spikes": "grad_norm",
            "fast_generation": "time", "generation_bound": "time", "memory": "time"}  # fmt: skip
PANELS = ("reward", "functions", "entropy", "kl", "clipped", "zero_std", "time", "grad_norm", "tokens")


def _plot(ax, run: Run, key, **kwargs) -> bool:
    steps, values = run.series(key)
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
    the rest: training), the gradient norm, and (with prompt skipping) the completion tokens generated and left out
    since the previous log. Each finding of `diagnosis` is a red dashed line at its step."""
    with needs_extra("the run doctor's dashboard"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    run = Run(S.training_rows(rows))
    fig, axes = plt.subplots(3, 3, figsize=(15, 10.5))
    ax = dict(zip(PANELS, axes.flatten(), strict=True))
    _plot(ax["reward"], run, "reward", label="mean reward")
    steps, (reward, std) = run.aligned("reward", "reward_std")
    ax["reward"].fill_between(steps, reward - std, reward + std, alpha=0.2, label="± std within groups")
    ax["reward"].set(title="Reward", ylabel="reward")
    for name in run.keys_like("rewards/", "/mean"):
        _plot(ax["functions"], run, f"rewards/{name}/mean", label=name)
    ax["functions"].set(title="Reward functions (accuracy, format, ...)", ylabel="mean reward")
    _plot(ax["entropy"], run, "entropy", color="tab:orange")
    ax["entropy"].set(title="Entropy of the policy", ylabel="nats / token")
    if not _plot(ax["kl"], run, "kl", color="tab:purple"):
        _empty(ax["kl"], "kl not logged\n(beta = 0: no KL term)")
    ax["kl"].set(title="KL to the reference", ylabel="nats / token")
    _plot(ax["clipped"], run, "completions/clipped_ratio", label="completions truncated")
    _plot(ax["clipped"], run, "clip_ratio/region_mean", label="tokens PPO-clipped")
    ax["clipped"].set(title="Clipped ratio", ylabel="fraction", ylim=(-0.05, 1.05))
    _plot(ax["zero_std"], run, "frac_reward_zero_std", color="black", label="all generation groups")
    for name in run.keys_like("policy_groups/", "/zero_std_frac"):
        _plot(ax["zero_std"], run, f"policy_groups/{name}/zero_std_frac", label=f"policy group {name}")
    ax["zero_std"].set(title="No signal: generation groups with one reward", ylabel="fraction", ylim=(-0.05, 1.05))
    _plot_time(ax["time"], run)
    if _plot(ax["grad_norm"], run, "grad_norm", color="tab:red"):
        grad_norm_scale(ax["grad_norm"], run.finite("grad_norm")[1])
    else:
        _empty(ax["grad_norm"], "grad_norm not logged")
    ax["grad_norm"].set(title="Gradient norm (before clipping)")
    _plot_tokens(ax["tokens"], run)
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
    fig.suptitle(f"{title + ': ' if title else ''}run doctor, {diagnosis.verdict()}", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def grad_norm_scale(ax, norm: np.ndarray) -> None:
    """The gradient-norm axis: logarithmic above the smallest positive norm and linear down to 0 (a step without
    signal has 0) where the positive norms span a decade or more; linear otherwise, as a logarithmic axis over less
    than a decade can hold no labelled tick."""
    positive = norm[norm > 0]
    if len(positive) and positive.max() >= 10 * positive.min():
        ax.set_yscale("symlog", linthresh=float(positive.min()))


def _plot_time(ax, run: Run) -> None:
    """Seconds per step: stacked generation / scoring / the rest where the run logged `timing/*`, else step time."""
    ax.set(title="Step time split", ylabel="seconds / step")
    if not len(run.finite("step_time")[0]):
        _empty(ax, "step_time not logged")
        return
    steps, (total, generation, scoring) = run.aligned("step_time", "timing/generation", "timing/scoring")
    if not len(steps):
        _plot(ax, run, "step_time", label="step (no timing/*: run_doctor off)")
        return
    rest = np.maximum(total - generation - scoring, 0.0)
    ax.stackplot(steps, generation, scoring, rest, labels=["generation", "scoring", "training"], alpha=0.8)


def _plot_tokens(ax, run: Run) -> None:
    """Completion tokens since the previous logged step: generated (the increase of `prompt_skip/
    completion_tokens_total`) and left out by prompt skipping (of `prompt_skip/tokens_saved`, an estimate)."""
    ax.set(title="Completion tokens since the last log", ylabel="tokens")
    drawn = False
    for key, label in (("prompt_skip/completion_tokens_total", "generated"),
                       ("prompt_skip/tokens_saved", "left out by prompt skipping")):  # fmt: skip
        steps, totals = run.finite(key)
        if len(steps):
            ax.plot(steps, np.diff(totals, prepend=0.0), marker="o", markersize=2, linewidth=1, label=label)
            drawn = True
    if not drawn:
        _empty(ax, "logged with prompt_skip=True")
