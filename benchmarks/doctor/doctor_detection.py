"""The run doctor on a labelled set of logs (issue #19): every failure kind detected, no false alarm on healthy runs.

    python benchmarks/doctor/doctor_detection.py [--workers 2] [--runs FILE.json] [--synthetic-only]

Labelled logs:
  * real runs of the tiny model on 2 CPU cores, each labelled by how it was made (before the doctor saw it):
      demo, demo_seed{1,2},   the CPU demo (recipes/configs/demo_cpu.yaml) as shipped, with two other seeds, and
      demo_kl                 with beta=0.04: the first three end with 5-9 steps without an informative generation
                              group (relabelled from their logs in issue #30): no_signal; demo_kl's KL rises to 1.05
                              nats/token (relabelled from its log in issue #58): kl_runaway
      no_noise_trl[_s1,_s2]   benchmarks/policy_groups/policy_groups_learning.py's `no_noise` mix, stock TRL (seeds
                              0-2), and
      continuous_trl          its `continuous` mix: learning runs whose completions run to max_completion_length (24
                              tokens; the random model rarely ends one and only some groups reward shortness):
                              truncation
      no_noise_groups         `no_noise` with policy groups: the same, and its `solved` policy group gives every
                              completion reward 1: truncation, no_signal in that group
      collapse_trl_s{0,2}     benchmarks/entropy/entropy_collapse.py, stock TRL: entropy collapses (by that benchmark's
                              criterion), the task is solved (final reward 1.000: every completion all digits), and
                              its completions are 8 tokens by design: entropy_collapse, no_signal, truncation
      spikes_trl              benchmarks/grad_reg/gradient_spikes.py, stock TRL with a ×1000 gradient every 50 steps,
                              8-token completions: grad_spikes, truncation
      truncated               the demo with max_completion_length=12 and no length penalty: every completion of the
                              random model is cut, none scores, in any policy group: truncation, no_signal (overall
                              and per group)
      nonfinite               the demo's length penalty (TRL's soft overlong punishment, 48 tokens) returning inf for
                              the 15th generation batch, with grad_reg=skip_nonfinite: nonfinite
  * real runs of SmolLM2-135M-Instruct with LoRA (issue #70): the committed result files of
    benchmarks/real_model/real_model_mix.py (both mixes) and of issue #70's regime benchmarks where they exist,
    each labelled from what its own reward log and metrics show by the definitions the doctor's page gives, applied
    to the whole run (`real_model_labels`), not from the doctor's findings; a policy group whose generation groups
    agreed in 90-95% of cases is accepted either way
  * synthetic logs: a healthy GRPO run's metrics with noise (5 seeds × logging every step or every 5 steps × with or
    without beta and policy groups) and, on that base, each failure kind injected (3 seeds each; a collapse to empty
    completions also leaves no signal). Every log is read as a whole run (`diagnose(..., ended=True)`), as
    `trl-grpo-ext doctor` reads a run folder; the synthetic ones with the `num_generations` the callback would know
    (16, or 2 for `small_groups`), the real ones without (as the command reads them, which skips `small_groups`).
A finding counts as a detection when its kind is among the log's labels, as a false alarm otherwise. The real runs take
about 6 minutes; `--runs FILE` reuses their logs from an earlier `--save-runs FILE` (`--rerun NAME ...` makes those
again). `demo_seed{1,2}` and `no_noise_trl_s{1,2}` were added after the thresholds were set, as a check on them.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from trl_grpo_ext.doctor import diagnose  # noqa: E402
from trl_grpo_ext.doctor.run_dir import load_run  # noqa: E402

RESULTS = ROOT / "benchmarks" / "doctor" / "results"
GROUP = "no_signal_group"  # the kind of a no_signal finding about one policy group


def kind_of(finding) -> str:
    return GROUP if finding.check == "no_signal" and finding.subject != "run" else finding.check


# ----- synthetic logs ---------------------------------------------------------------------------------------------


def synthetic_log(failure: str | None, seed: int, steps: int = 150, every: int = 1, beta: float = 0.0,
                  groups: bool = False) -> list[dict]:  # fmt: skip
    """A healthy GRPO run's logged rows with noise, every `every` steps, with `failure` (a check's name, or
    `no_signal_group`) injected from step 40 on (`no_update`, `small_groups`: from the start). The accuracy reward
    is pass/fail (its std that of 0s and 1s over 64 completions)."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    late = t >= 40
    accuracy = 0.1 + 0.5 / (1 + np.exp(-(t - 90) / 25)) + rng.normal(0, 0.03, steps)  # still rising at the end
    format_ = 0.3 + 0.6 / (1 + np.exp(-(t - 30) / 10)) + rng.normal(0, 0.03, steps)
    frac = np.clip(0.3 + rng.normal(0, 0.08, steps), 0, 1)
    entropy = 0.8 - 0.3 * t / steps + rng.normal(0, 0.02, steps)
    kl = 0.03 * t / steps + np.abs(rng.normal(0, 0.003, steps))
    clipped = np.clip(0.05 + rng.normal(0, 0.02, steps), 0, 1)
    grad = 0.3 * np.exp(rng.normal(0, 0.35, steps))
    step_time = 30 + rng.normal(0, 2, steps)
    generation = 0.7 * step_time
    peak = np.minimum.accumulate(np.full(steps, 14.0)) + 0.1 * np.arange(steps) / steps
    length = 150 + rng.normal(0, 10, steps)
    reward_std = np.full(steps, 0.45)
    group_frac = {name: np.clip(0.3 + rng.normal(0, 0.08, steps), 0, 1) for name in ("easy", "medium", "hard")}
    group_reward = {"easy": 0.8 + 0.1 * accuracy, "medium": accuracy, "hard": accuracy / 2}
    if failure == "no_signal":  # all-wrong: nothing solved from the start
        accuracy, frac = (
            np.clip(rng.normal(0.005, 0.005, steps), 0, 1),
            np.clip(0.97 + rng.normal(0, 0.02, steps), 0, 1),
        )
        format_ = np.clip(rng.normal(0.005, 0.005, steps), 0, 1)
        group_frac = {name: np.clip(0.97 + rng.normal(0, 0.02, steps), 0, 1) for name in group_frac}
    elif failure == GROUP:
        group_frac["hard"] = np.where(late, 1.0, group_frac["hard"])
        group_reward["hard"] = np.where(late, 0.0, group_reward["hard"])
    elif failure == "truncation":
        clipped = np.where(late, np.clip(0.35 + rng.normal(0, 0.05, steps), 0, 1), clipped)
    elif failure == "entropy_collapse":
        entropy = np.where(late, 0.75 * np.exp(-(t - 40) / 12) + 0.01, entropy)
    elif failure == "entropy_explosion":
        entropy = np.where(late, entropy + 3 * (1 - np.exp(-(t - 40) / 20)), entropy)
    elif failure == "kl_runaway":
        beta = beta or 0.04
        kl = np.where(late, 0.02 * np.exp((t - 40) / 15), kl)
    elif failure == "format_only":
        accuracy = 0.05 + rng.normal(0, 0.005, steps)
        format_ = 0.1 + 0.85 / (1 + np.exp(-(t - 50) / 10)) + rng.normal(0, 0.02, steps)  # learnt by ~85
    elif failure == "reward_plateau":
        accuracy, format_ = 0.3 + rng.normal(0, 0.03, steps), 0.9 + rng.normal(0, 0.02, steps)
    elif failure == "nonfinite":
        grad[55], accuracy[56] = np.nan, np.inf
    elif failure == "grad_spikes":
        grad[[64, 99, 134]] *= 40  # steps whose norm is logged also every 5 steps
    elif failure == "generation_bound":
        generation = 0.95 * step_time
    elif failure == "memory":
        peak = np.where(late, 23.4, peak)
    elif failure == "no_update":  # a frozen model: a zero gradient (beta 0) or a policy equal to the reference
        if seed % 2:
            beta, kl = 0.04, np.zeros(steps)
        else:
            grad = np.zeros(steps)
    elif failure == "small_groups":  # num_generations 2 (`settings_of`) at these pass rates: p² + (1 − p)² >= 0.52
        frac = np.clip(accuracy**2 + (1 - accuracy) ** 2 + rng.normal(0, 0.04, steps), 0, 1)
    elif failure == "collapse":  # a learning rate that wrecks the model: empty answers, all scored alike
        length = np.where(late, np.abs(rng.normal(0.3, 0.2, steps)), length)
        accuracy, format_ = np.where(late, 0.0, accuracy), np.where(late, 0.0, format_)
        frac, reward_std = np.where(late, 1.0, frac), np.where(late, 0.0, reward_std)
    reward = accuracy + format_
    binary_std = np.sqrt(np.clip(accuracy, 0, 1) * (1 - np.clip(accuracy, 0, 1)) * 64 / 63)
    rows = []
    for i in range(every - 1, steps, every):
        window = slice(i - every + 1, i + 1)
        row = {"step": int(t[i]), "loss": 0.01, "grad_norm": float(grad[i]), "learning_rate": 1e-5,
               "reward": float(reward[window].mean()), "reward_std": float(reward_std[window].mean()),
               "frac_reward_zero_std": float(frac[window].mean()),
               "rewards/accuracy_reward/mean": float(accuracy[window].mean()),
               "rewards/accuracy_reward/std": float(binary_std[window].mean()),
               "rewards/format_reward/mean": float(format_[window].mean()),
               "entropy": float(entropy[window].mean()), "completions/clipped_ratio": float(clipped[window].mean()),
               "completions/max_length": 512.0, "completions/mean_length": float(length[window].mean()),
               "step_time": float(step_time[window].mean()),
               "timing/generation": float(generation[window].mean()), "timing/scoring": 2.0,
               "memory/peak_reserved_gib": float(peak[i]), "memory/total_gib": 24.0}  # fmt: skip
        if beta:
            row["kl"] = float(kl[window].mean())
        if groups or failure == GROUP:
            for name in group_frac:
                row[f"policy_groups/{name}/zero_std_frac"] = float(group_frac[name][window].mean())
                row[f"policy_groups/{name}/reward"] = float(np.asarray(group_reward[name])[window].mean())
        rows.append(row)
    return rows


FAILURES = ("no_signal", GROUP, "collapse", "truncation", "entropy_collapse", "entropy_explosion", "kl_runaway",
            "format_only", "reward_plateau", "nonfinite", "no_update", "grad_spikes", "generation_bound", "memory",
            "small_groups")  # fmt: skip


def settings_of(failure: str | None) -> dict:
    """The settings the callback would know of a synthetic log: num_generations 16, or 2 where groups are too small."""
    return {"num_generations": 2 if failure == "small_groups" else 16}


def synthetic_set() -> list[dict]:
    logs = []
    for seed in range(5):
        for every in (1, 5):
            for beta, groups in ((0.0, False), (0.04, True)):
                name = f"healthy_s{seed}_every{every}{'_kl_groups' if groups else ''}"
                logs.append({"name": name, "source": "synthetic", "labels": [], "settings": settings_of(None),
                             "rows": synthetic_log(None, seed, every=every, beta=beta, groups=groups)})  # fmt: skip
    for failure in FAILURES:
        for seed in range(3):
            # a format-only run's reward stops rising once the format is learnt: it plateaus too
            # a collapsed run's completions all score alike: no signal either
            labels = {"format_only": [failure, "reward_plateau"], "collapse": [failure, "no_signal"]}.get(
                failure, [failure]
            )
            logs.append({"name": f"{failure}_s{seed}", "source": "synthetic", "labels": labels,
                         "settings": settings_of(failure),
                         "rows": synthetic_log(failure, 100 + seed, every=1 + 4 * (seed == 2))})  # fmt: skip
    return logs


# ----- real runs ----------------------------------------------------------------------------------------------------


def _recipe(out: str, *extra: str) -> list[dict]:
    command = [sys.executable, str(ROOT / "recipes/math_gsm8k.py"),
               "--config", str(ROOT / "recipes/configs/demo_cpu.yaml"),
               "--output_dir", out, "--eval_limit", "0", *extra]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
    return load_run(out).rows


def real_run(name: str) -> dict:
    import torch

    torch.set_num_threads(1)
    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        if name == "demo":
            rows = _recipe(f"{tmp}/out")
        elif name.startswith("demo_seed"):
            rows = _recipe(f"{tmp}/out", "--seed", name.removeprefix("demo_seed"))
        elif name == "demo_kl":
            rows = _recipe(f"{tmp}/out", "--beta", "0.04")
        elif name == "truncated":
            rows = _recipe(f"{tmp}/out", "--max_completion_length", "12", "--reward_funcs", "gsm8k_accuracy",
                           "gsm8k_format")  # fmt: skip
        elif name.startswith(("no_noise", "continuous")):  # <mix>_<trl|groups>[_s<seed>]
            from benchmarks.policy_groups import policy_groups_learning as pgl

            base, _, seed = name.partition("_s")
            mix, variant = base.rsplit("_", 1)
            job = {"mix": mix, "seed": int(seed or 0), "variant": name,
                   "overrides": {} if variant == "groups" else None, "max_steps": 160,
                   "model_dir": str(save_tiny_model(f"{tmp}/tiny")), "keep_log": "all"}  # fmt: skip
            rows = pgl.run(job)["log"]
        elif name.startswith("collapse_trl"):
            from benchmarks.entropy import entropy_collapse

            model = str(save_tiny_model(f"{tmp}/tiny", vocab_size=1024))
            rows = entropy_collapse.run("trl", model, int(name[-1]), 200, f"{tmp}/out", keep_log=True)["log"]
        elif name == "spikes_trl":
            from benchmarks.grad_reg import gradient_spikes

            model = str(save_tiny_model(f"{tmp}/tiny", vocab_size=1024))
            rows = gradient_spikes.run("trl", model, 0, 200, 1000.0, f"{tmp}/out", keep_log=True)["log"]
        elif name == "nonfinite":
            rows = _nonfinite_run(tmp)
        else:
            raise ValueError(f"unknown real run {name!r}")
    return {"name": name, "source": "real", "labels": REAL_RUNS[name], "rows": rows}


def _nonfinite_run(tmp: str) -> list[dict]:
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl.rewards import get_soft_overlong_punishment

    from trl_grpo_ext import GRPOConfig, GRPOTrainer
    from trl_grpo_ext.cli.tiny_model import save_tiny_model
    from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows

    calls = []
    overlong = get_soft_overlong_punishment(max_completion_len=48, soft_punish_cache=24)  # the demo's length penalty

    def length_reward(completions, completion_ids, **kwargs):  # and inf for the 15th generation batch
        calls.append(1)
        rewards = overlong(completion_ids=completion_ids)
        return [float("inf")] * len(rewards) if len(calls) == 15 else rewards

    args = GRPOConfig(output_dir=f"{tmp}/out", per_device_train_batch_size=16, num_generations=4,
                      max_completion_length=48, learning_rate=3e-3, max_steps=40, logging_steps=1, report_to="none",
                      save_strategy="no", use_cpu=True, bf16=False, disable_tqdm=True, beta=0.0,
                      grad_reg=["skip_nonfinite"], seed=0)  # fmt: skip
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(128, seed=0)))
    trainer = GRPOTrainer(str(save_tiny_model(f"{tmp}/tiny")), length_reward, args, dataset)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trainer.state.log_history


REAL_RUNS = {
    # the demo as shipped ends without signal (its last 5-9 steps: frac_reward_zero_std 1, as its dashboard shows),
    # but with beta 0.04 (its last 2 only): labelled from their logs in issue #30, when a state a run ends in
    # became a finding. Rerun in issue #58, demo_kl's KL rises from 0.28 to 1.05 nats/token over steps 21-40, which
    # kl_runaway reports (with the doctor before that changes too): relabelled from its log, as it is
    "demo": ["no_signal"], "demo_seed1": ["no_signal"], "demo_seed2": ["no_signal"], "demo_kl": ["kl_runaway"],
    "no_noise_trl": ["truncation"], "no_noise_trl_s1": ["truncation"], "no_noise_trl_s2": ["truncation"],
    "continuous_trl": ["truncation"],
    "no_noise_groups": [GROUP, "truncation"], "collapse_trl_s0": ["entropy_collapse", "no_signal", "truncation"],
    "collapse_trl_s2": ["entropy_collapse", "no_signal", "truncation"], "spikes_trl": ["grad_spikes", "truncation"],
    "truncated": ["truncation", "no_signal", GROUP], "nonfinite": ["nonfinite"],
}  # fmt: skip


# ----- real-model logs ----------------------------------------------------------------------------------------------

# the result files of SmolLM2-135M-Instruct runs (issue #70): both mixes of benchmarks/real_model, and the regime runs
# of issue #70's benchmarks where they exist
REAL_MODEL_RESULTS = ("benchmarks/real_model/results", "benchmarks/real_model/results/words",
                      "benchmarks/entropy/results/collapse_smollm2/*", "benchmarks/grad_reg/results/spikes_smollm2/*",
                      "benchmarks/prompt_skip/results/epochs_smollm2")  # fmt: skip
AMBIGUOUS = 0.90  # a share of agreeing generation groups in [this, zero_std_frac): no signal or not, either verdict
ENTROPY_BAND = 0.2  # an end entropy within this share of the collapse threshold, either side: collapsed or not


def generation_groups_agreeing(result: dict, num_generations: int = 4) -> dict[str, list[bool]]:
    """Per policy group (the mix's `task`), whether each generation group's completions all got the same reward,
    read from the benchmark's own reward log (`result["rewards"]`: each step's rewards by group, a prompt's
    `num_generations` completions side by side, as TRL scores them), not from the metrics the doctor reads."""
    agree: dict[str, list[bool]] = {}
    for entry in result["rewards"]:
        for group, rewards in entry["rewards"].items():
            for i in range(0, len(rewards), num_generations):
                agree.setdefault(group, []).append(len(set(rewards[i : i + num_generations])) == 1)
    return agree


def real_model_labels(result: dict) -> tuple[list[str], list[str]]:
    """(labels, kinds accepted either way) of a SmolLM2 run from what its log shows, each by the definition the
    doctor's page gives, applied to the whole run: `no_signal` where at least `zero_std_frac` of all its generation
    groups agreed (from the reward log), or of each of its last `tail_rows` steps' (a run that ends in the state);
    `no_signal_group` where the run logs policy groups and one group's did (a group at `AMBIGUOUS` or more, below
    that, is accepted either way: one lucky answer in 20 tells little);
    `truncation` where at least `truncated_frac` of the completions were cut over the run's second half, no fewer
    than (1 - `truncated_fall`) x the first half's share; `entropy_collapse` where the mean entropy of the last 5
    steps is at most `entropy_collapse_ratio` of the first 3 steps' (the doctor's start), accepted either way within
    `ENTROPY_BAND` of that threshold (the doctor judges a window's mean, not the last 5 steps'); healthy otherwise."""
    from trl_grpo_ext.doctor.thresholds import value

    labels, maybe = [], []
    agree = generation_groups_agreeing(result)
    every = [a for group in agree.values() for a in group]
    per_step = [np.mean([a for group in generation_groups_agreeing({"rewards": [entry]}).values() for a in group])
                for entry in result["rewards"]]  # fmt: skip
    tail = int(value("tail_rows"))
    ends_without = len(per_step) >= tail and min(per_step[-tail:]) >= value("zero_std_frac")
    if (every and np.mean(every) >= value("zero_std_frac")) or ends_without:
        labels.append("no_signal")
    if any(key.startswith("policy_groups/") for row in result["steps"] for key in row):
        shares = [np.mean(a) for a in agree.values()]
        if any(share >= value("zero_std_frac") for share in shares):
            labels.append(GROUP)
        elif any(share >= AMBIGUOUS for share in shares):
            maybe.append(GROUP)
    clipped = [row["completions/clipped_ratio"] for row in result["steps"]]
    first, second = np.mean(clipped[: len(clipped) // 2]), np.mean(clipped[len(clipped) // 2 :])
    if second >= value("truncated_frac") and second >= (1 - value("truncated_fall")) * first:
        labels.append("truncation")
    entropy = [row["entropy"] for row in result["steps"] if "entropy" in row]
    if len(entropy) >= 10:
        share = np.mean(entropy[-5:]) / (value("entropy_collapse_ratio") * np.mean(entropy[:3]))
        if share <= 1 - ENTROPY_BAND:
            labels.append("entropy_collapse")
        elif share <= 1 + ENTROPY_BAND:
            maybe.append("entropy_collapse")
    return labels, maybe


def real_model_logs() -> list[dict]:
    """Every SmolLM2 run's log (`REAL_MODEL_RESULTS`), labelled by `real_model_labels`; named by its folder and file
    (the arithmetic mix's `policy_groups_seed0`, `words/stock_seed1`, ...)."""
    logs = []
    for pattern in REAL_MODEL_RESULTS:
        for path in sorted(ROOT.glob(f"{pattern}/*_seed*.json")):
            result = json.loads(path.read_text())
            labels, maybe = real_model_labels(result)
            name = str(path.relative_to(ROOT / "benchmarks")).removesuffix(".json").replace("/results", "")
            logs.append({"name": name, "source": "smollm2", "labels": labels, "maybe": maybe,
                         "rows": result["steps"]})  # fmt: skip
    return logs


# ----- scoring ------------------------------------------------------------------------------------------------------


def score(logs: list[dict]) -> tuple[str, dict]:
    per_log, kinds = [], {kind: {"labelled": 0, "detected": 0} for kind in FAILURES}
    false_alarms = []
    for log in logs:
        diagnosis = diagnose(log["rows"], log.get("settings"), ended=True)  # a whole run, as the command reads it
        found = sorted({kind_of(f) for f in diagnosis.findings})
        for kind in log["labels"]:
            kinds[kind]["labelled"] += 1
            kinds[kind]["detected"] += kind in found
        extra = [kind for kind in found if kind not in log["labels"] + log.get("maybe", [])]
        false_alarms += [(log["name"], kind) for kind in extra]
        per_log.append({"name": log["name"], "source": log["source"], "labels": log["labels"],
                        "maybe": log.get("maybe", []), "found": found,
                        "missed": [k for k in log["labels"] if k not in found], "false_alarms": extra,
                        "skipped": [s.check for s in diagnosis.skipped], "rows": diagnosis.rows,
                        "findings": [f.text() for f in diagnosis.findings]})  # fmt: skip
    healthy = [log for log in per_log if not log["labels"] and not log["maybe"]]
    lines = ["kind               labelled logs  detected", "-----------------  -------------  --------"]
    lines += [f"{kind:17s}  {v['labelled']:13d}  {v['detected']:8d}" for kind, v in kinds.items()]
    lines.append("")
    sources = {source: sum(log["source"] == source for log in healthy) for source in ("real", "smollm2")}
    lines.append(f"healthy logs: {len(healthy)} ({sources['real']} real runs of the tiny model, {sources['smollm2']} "
                 f"of SmolLM2), with a finding: {sum(bool(log['found']) for log in healthy)}")  # fmt: skip
    lines.append(f"false alarms over all {len(per_log)} logs (a finding of a kind not in the log's labels): "
                 f"{len(false_alarms)} {false_alarms if false_alarms else ''}")  # fmt: skip
    lines.append("")
    for source, title in (
        ("real", "real runs of the tiny model:"),
        ("smollm2", "real runs of SmolLM2-135M-Instruct (labels read from each log):"),
    ):
        lines.append(title)
        width = max([16] + [len(log["name"]) for log in per_log if log["source"] == source])
        for log in per_log:
            if log["source"] == source:
                either = f" (either way: {log['maybe']})" if log["maybe"] else ""
                lines.append(f"  {log['name']:{width}s} {log['rows']:4d} rows  labels {log['labels']}{either}  found "
                             f"{log['found']}  skipped {log['skipped']}")  # fmt: skip
    every_kind = all(v["detected"] == v["labelled"] > 0 for v in kinds.values())
    healthy_alarms = sum(bool(log["found"]) for log in healthy)
    lines.append(f"\nevery failure kind detected on every log labelled with it: {every_kind}; "
                 f"zero false alarms on the healthy logs: {healthy_alarms == 0}; "
                 f"findings outside their log's labels on the others: {len(false_alarms)}")  # fmt: skip
    return "\n".join(lines), {"kinds": kinds, "false_alarms": false_alarms, "logs": per_log}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", help="reuse the real runs' logs saved by --save-runs")
    parser.add_argument("--save-runs", help="save the real runs' logs here (JSON)")
    parser.add_argument("--rerun", nargs="+", default=[], choices=list(REAL_RUNS),
                        help="with --runs: run these again (and save them with --save-runs)")  # fmt: skip
    parser.add_argument("--synthetic-only", action="store_true")
    parser.add_argument("--out", default=str(RESULTS))
    cli = parser.parse_args()
    logs = synthetic_set() + ([] if cli.synthetic_only else real_model_logs())
    if cli.runs:
        real = [run for run in json.loads(Path(cli.runs).read_text()) if run["name"] not in cli.rerun]
        real = sorted(
            real + [real_run(name) for name in cli.rerun], key=lambda run: list(REAL_RUNS).index(run["name"])
        )
        for run in real:  # the labels as this file now gives them
            run["labels"] = REAL_RUNS[run["name"]]
        if cli.save_runs:
            Path(cli.save_runs).write_text(json.dumps(real))
        logs += real
    elif not cli.synthetic_only:
        import multiprocessing

        with ProcessPoolExecutor(cli.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            real = list(pool.map(real_run, REAL_RUNS))
        if cli.save_runs:
            Path(cli.save_runs).write_text(json.dumps(real))
        logs += real
    table, result = score(logs)
    print(table)
    out = Path(cli.out)
    (out / "doctor_detection.txt").write_text(table + "\n")
    (out / "doctor_detection.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'doctor_detection.txt'} and {out / 'doctor_detection.json'}")


if __name__ == "__main__":
    main()
