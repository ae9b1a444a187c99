"""The plots a run leaves (issue #58): `training_curves.png` shows the completion length and, for each feature that
acted, its own logged metrics; `policy_groups.png` names difficulty groups apart from the training step; the run
doctor's gradient-norm panel always has labelled y ticks."""

import numpy as np
import pytest
from matplotlib.figure import Figure

from trl_grpo_ext.doctor.dashboard import grad_norm_scale
from trl_grpo_ext.reporting.plots import curves_figure, group_labels, plot_curves


def rows(steps: int = 20, **extra) -> list[dict]:
    """Logged rows of a run (the CPU demo's shape: the length penalty shortens the completions), with `extra` (name ->
    a function of the step, None where not logged) added."""
    out = []
    for t in range(1, steps + 1):
        row = {"step": t, "reward": -1 + t / steps, "reward_std": 0.2, "entropy": 6 - t / 10, "loss": 0.01,
               "grad_norm": 0.3, "completions/mean_length": 48.0 - 2 * t, "completions/min_length": 20.0,
               "completions/max_length": 48.0, "completions/clipped_ratio": max(0.0, 0.9 - 0.05 * t)}  # fmt: skip
        for key, fn in extra.items():
            if (value := fn(t)) is not None:
                row[key] = value
        out.append(row)
    return out


def visible(fig: Figure) -> dict:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_visible() and ax.get_title()}


def test_the_curves_show_the_completion_length_and_no_feature_panel_without_features(tmp_path):
    fig = curves_figure(rows())
    panels = visible(fig)
    assert list(panels) == ["Reward", "Completion length", "Entropy of the policy"]
    [mean] = [line for line in panels["Completion length"].get_lines() if line.get_label() == "mean"]
    np.testing.assert_allclose(mean.get_ydata(), [48.0 - 2 * t for t in range(1, 21)])
    twin = [ax for ax in fig.axes if ax.get_ylabel() == "share truncated"]
    assert len(twin) == 1  # the share cut at max_completion_length, on its own axis
    assert all(ax.get_xlabel() == "training step" for ax in panels.values())
    png = plot_curves(rows(), str(tmp_path / "curves.png"))
    assert open(png, "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_feature_that_acted_gets_a_panel_marking_when():
    logged = rows(
        **{
            "entropy_reg/coef": lambda t: 0.01 * t,
            "entropy_reg/target": lambda t: 4.0,
            "policy_groups/1-2 steps/weight": lambda t: 1.0 + t / 20,
            "policy_groups/3 steps/weight": lambda t: 1.0 - t / 40,
            "grad_reg/threshold": lambda t: 0.5,
            "grad_reg/clipped": lambda t: float(t in (7, 14)),
            "grad_reg/skipped_steps": lambda t: float(t >= 11),  # a running total: one step skipped, at 11
            "prompt_skip/skipped_in_batch": lambda t: float(t % 3 == 0),
            "fast_generation/fell_back/compile_error": lambda t: 1.0 if t == 5 else None,
        }
    )
    panels = visible(curves_figure(logged))
    assert list(panels)[3:] == ["Entropy regularization (entropy_reg)", "Policy group weights (policy_group_column)",
                                "Gradient regularization (grad_reg)", "Prompt skipping (prompt_skip)",
                                "Fast generation"]  # fmt: skip
    assert "target (entropy_reg)" in [line.get_label() for line in panels["Entropy of the policy"].get_lines()]
    marks = {}  # label -> the steps of its vertical lines (axvline: x constant, y over the axis)
    for ax in panels.values():
        for line in ax.get_lines():
            x = np.asarray(line.get_xdata(), dtype=float)
            if len(x) == 2 and x[0] == x[1]:
                marks.setdefault(ax.get_title(), []).append(x[0])
    assert marks["Gradient regularization (grad_reg)"] == [7.0, 14.0, 11.0]  # clipped, then skipped
    assert marks["Fast generation"] == [5.0]
    weights = panels["Policy group weights (policy_group_column)"]
    assert [text.get_text() for text in weights.get_legend().get_texts()] == ["1-2", "3"]
    assert weights.get_legend().get_title().get_text() == "policy group (calculation steps)"
    # the same step range on every panel, however few steps a feature acted at
    assert {ax.get_xlim() for ax in panels.values()} == {(0.5, 20.5)}


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["1-2 steps", "3 steps", "4 steps"], ("policy group (calculation steps)", ["1-2", "3", "4"])),
        (["easy", "hard"], ("policy group", ["easy", "hard"])),
        (["2 apples", "3 pears"], ("policy group", ["2 apples", "3 pears"])),
        (["short words", "long words"], ("policy group (words)", ["short", "long"])),
    ],
)
def test_policy_group_names_do_not_read_as_training_steps(names, expected):
    assert group_labels(names) == expected


@pytest.mark.parametrize(
    "norm",
    [np.array([0.21, 0.35, 0.5, 0.28, 0.4]), np.array([0.0, 0.0, 0.02, 0.3, 0.9, 0.05]), np.array([0.3] * 5)],
    ids=["narrow", "a decade and zeros", "constant"],
)
def test_the_gradient_norm_axis_always_has_labelled_ticks(norm):
    """A logarithmic axis over less than a decade (0.21-0.5) holds no labelled tick: such a panel is linear."""
    ax = Figure().add_subplot()
    ax.plot(np.arange(len(norm)), norm)
    grad_norm_scale(ax, norm)
    ax.figure.canvas.draw()
    low, high = ax.get_ylim()
    labels = [tick.get_text() for tick, at in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)
              if low <= at <= high and tick.get_text()]  # fmt: skip
    assert len(labels) >= 2, (ax.get_yscale(), labels)
    assert ax.get_yscale() == ("symlog" if norm.max() >= 10 * norm[norm > 0].min() else "linear")
