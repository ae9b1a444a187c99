"""ZClip and the non-finite guard where a real model's gradient norm spikes (issue #70): SmolLM2-135M-Instruct with
LoRA at learning rates that make stock TRL's gradient norm jump, against stock TRL and without clipping.

    trl-grpo-ext smollm2 /work/smollm2
    python benchmarks/grad_reg/spikes_smollm2.py run --model /work/smollm2 --mix lr3e-3 --variants stock --seeds 0
    python benchmarks/grad_reg/spikes_smollm2.py run --model /work/smollm2 --mix lr3e-3 --seeds 0 1 2
    python benchmarks/grad_reg/spikes_smollm2.py report --mix lr3e-3
    python benchmarks/grad_reg/spikes_smollm2.py smoke            # 2 steps on the tiny model (CI)

The task: the `arithmetic` mix of `benchmarks/real_model/real_model_mix.py` (five policy groups, reward by the last
integer, one group through a noisy judge), run as there (LoRA r 16, 8 prompts x 4 completions x 16 tokens at
temperature 1, 40 steps, resumable, a final evaluation of every group) with a higher learning rate (`REGIMES`).
Variants: `stock` (TRL's fixed clip, `max_grad_norm` 1.0), `zclip` (`grad_reg: zclip`, the README setting, its
25-step warm-up), `zclip_warm5` (its warm-up 5 steps) and `no_clip` (`max_grad_norm` 0: every spike reaches the
update). Reported per variant over seeds (`spike_report`): the largest gradient norm over the run's median one (of
the steps with a gradient: a step none of whose generation groups gave signal has a norm of 0), the step of the
largest, the steps whose norm is more than 5 times the median, the steps without a gradient (`silent`), runs that
diverged (a non-finite loss or gradient norm, or the last 5 steps' mean reward below half the best 5-step mean
before it), the worst drop of the 5-step mean reward from its best earlier value, the final reward (mean of the last
5 steps) and the final evaluation's mean reward over the groups.
"""

import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.real_model.real_model_mix import MIXES as MIX_RUNS  # noqa: E402
from benchmarks.real_model.real_model_mix import main  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "spikes_smollm2"
VARIANTS = {"stock": {}, "zclip": {"grad_reg": "zclip"}, "zclip_warm5": {"grad_reg": "zclip", "zclip_warmup_steps": 5},
            "no_clip": {"max_grad_norm": 0.0}}  # fmt: skip
REGIMES = {"lr3e-3": {"learning_rate": 3e-3}, "lr1e-3": {"learning_rate": 1e-3}}
MIXES = {name: dataclasses.replace(MIX_RUNS["arithmetic"], variants=VARIANTS, results=RESULTS / name, base=settings)
         for name, settings in REGIMES.items()}  # fmt: skip
SPIKE = 5.0  # a step whose gradient norm is this many times the run's median one


def spike_figures(result: dict) -> dict:
    """A run's spike figures (module docstring) from its logged rows and its final evaluation."""
    rows = result["steps"]
    norms = [row.get("grad_norm", math.nan) for row in rows]
    finite = [n for n in norms if math.isfinite(n)]
    moving = [n for n in finite if n > 0]  # a norm of 0: no generation group gave signal, nothing to scale against
    median = statistics.median(moving) if moving else math.nan
    means = [statistics.fmean(row["reward"] for row in rows[i : i + 5]) for i in range(len(rows) - 4)]
    best, drop = -math.inf, 0.0
    for value in means:
        best = max(best, value)
        drop = max(drop, best - value)
    nonfinite = any(not math.isfinite(row.get("loss", 0.0)) for row in rows) or len(finite) < len(norms)
    collapsed = bool(means) and means[-1] < max(means) / 2
    evaluated = result.get("eval", {})
    return {"max_over_median": max(moving) / median if moving else math.nan,
            "peak_step": norms.index(max(moving)) + 1 if moving else None,  # one logged row a step, from step 1
            "spikes": sum(n > SPIKE * median for n in moving), "silent": len(finite) - len(moving),
            "diverged": float(nonfinite or collapsed), "worst_drop": drop,
            "final_reward": statistics.fmean(row["reward"] for row in rows[-5:]),
            "evaluated": statistics.fmean(g["reward"] for g in evaluated.values()) if evaluated else None}  # fmt: skip


# the other SmolLM2 benchmarks' runs (issue #70): (regime named in the report, results folder under benchmarks/)
CENSUS = (("the arithmetic mix, learning rate 1e-4", "real_model/results"),
          ("the words mix, learning rate 1e-4", "real_model/results/words"),
          ("the narrow task, learning rate 1e-3", "entropy/results/collapse_smollm2/lr1e-3"),
          ("5 epochs of 64 prompts, learning rate 1e-4", "prompt_skip/results/epochs_smollm2"))  # fmt: skip


def spike_census(root: Path = RESULTS.parents[2]) -> list[str]:
    """One line per regime of `CENSUS` that has runs: how many, the largest gradient norm over its run's median one
    (`spike_figures`) among them, and the steps over `SPIKE` times the median, all runs together: whether stock TRL's
    gradient norm spikes anywhere on SmolLM2 (it need not, where Adam's step is what diverges)."""
    lines = []
    for name, folder in CENSUS:
        figures = [
            spike_figures(json.loads(path.read_text())) for path in sorted((root / folder).glob("*_seed*.json"))
        ]
        figures = [f for f in figures if not math.isnan(f["max_over_median"])]
        if figures:
            largest, spikes = max(f["max_over_median"] for f in figures), sum(f["spikes"] for f in figures)
            lines.append(f"{name}: {len(figures)} runs, largest norm {largest:.2f}x its run's median, {spikes} steps "
                         f"over {SPIKE:g}x")  # fmt: skip
    return lines


def zclip_first_clip(result: dict, warmup: int) -> int | None:
    """The first step at which ZClip (the README's alpha 0.97 and z-threshold 2.5, `warmup` steps of warm-up) would
    clip a run's logged gradient norms, or None: up to that step a ZClip run makes that run's updates, so a run it
    never clips is the run ZClip would make (each SmolLM2 run here is deterministic)."""
    from trl_grpo_ext.grad_reg.clipping import ZClip

    zclip = ZClip(0.97, 2.5, warmup)
    for step, row in enumerate(result["steps"], start=1):
        if zclip.step(row["grad_norm"])[0] is not None:
            return step
    return None


def spike_report(regime: str) -> str:
    """One line per variant of `regime` over the seeds it ran: each figure's mean±SE (diverged: a count; the step of
    the largest norm: each seed's), then `spike_census`."""
    runs: dict[str, list[dict]] = {}
    for path in sorted(MIXES[regime].results.glob("*_seed*.json")):
        data = json.loads(path.read_text())
        runs.setdefault(data["variant"], []).append(spike_figures(data))
    lines = [f"# gradient spikes, regime {regime} {REGIMES[regime]}: mean±SE over seeds (diverged: runs)"]
    keys = ("max_over_median", "peak_step", "spikes", "silent", "diverged", "worst_drop", "final_reward", "evaluated")
    lines.append("variant | seeds | " + " | ".join(keys))
    for variant, figures in runs.items():
        cells = []
        for key in keys:
            values = [f[key] for f in figures if f[key] is not None and not math.isnan(f[key])]
            if key == "diverged":
                cells.append(f"{int(sum(values))} of {len(figures)}")
            elif key == "peak_step":
                cells.append(", ".join(str(v) for v in values) or "-")
            elif len(values) > 1:
                cells.append(f"{statistics.fmean(values):.3f}±{statistics.stdev(values) / len(values) ** 0.5:.3f}")
            else:
                cells.append(f"{values[0]:.3f}" if values else "-")
        lines.append(f"{variant} | {len(figures)} | " + " | ".join(cells))
    for path in sorted(MIXES[regime].results.glob("stock_seed*.json")):
        data = json.loads(path.read_text())
        steps = {warmup: zclip_first_clip(data, warmup) for warmup in (25, 5)}
        first = {warmup: "never" if step is None else f"step {step}" for warmup, step in steps.items()}
        lines.append(f"ZClip replayed on stock TRL's seed {data['seed']} norms: first clip {first[25]} with 25 "
                     f"warm-up steps, {first[5]} with 5")  # fmt: skip
    census = spike_census()
    if census:
        lines += ["# the gradient norms of the other SmolLM2 benchmarks' runs (every variant)", *census]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], MIXES, extra=spike_report))
