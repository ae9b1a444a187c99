"""Policy grouping with its default settings against stock TRL, on a family of task mixes (issues #4 and #11).

    python benchmarks/policy_groups/policy_groups_learning.py            # every mix, 5 seeds, 2 worker processes
    python benchmarks/policy_groups/policy_groups_learning.py --mixes base4 --seeds 0 1 \\
        --ours '{"policy_group_sampling_floor": 0.05}'

The tiny random-init Qwen2 model (built locally) learns on CPU. Its prompts fall into policy groups, and each
completion is rewarded by its prompt's group (`TASKS`): learnable tasks (short completions, digits), tasks with
nothing to learn (always solved, never solvable, a coin flip or uniform noise from a hash of the text). A mix
(`MIXES`) gives each group its task and its share of the 256 prompts: 2 to 6 groups, shares from 10% to 50%, with and
without a noise group, with and without solved groups, 0/1 and continuous rewards. The widened family of issue #31
(`WIDE_MIXES`) has 640 prompts a mix (160 steps draw about each once): continuous learnable rewards that are 0 for
most completions at the start (their generation groups start uninformative, like a solved group's), noise groups of
20-30%, 3 to 6 groups of unequal size, 0/1 and continuous rewards; `lucky_mix` (issue #60) puts beside two learnable
groups one that is right by luck 1 time in 25 and learns nothing, as SmolLM2's three-digit sums in
`real_model_mix.py`.

Both trainers get the same model, data, seed, batch (16 completions a step) and learning rate. `trl.GRPOTrainer`
draws prompts uniformly; trl_grpo_ext gets `policy_group_column="task"` and nothing else (plus `--ours` overrides).
Every `EVAL_EVERY` steps (`--eval_every`) both generate for a fixed evaluation set (8 prompts of each learnable
group, 4 completions each); the figure is the first step at which the learnable groups' evaluation reward (each group
counted alike), averaged over the last 2 evaluations, reaches the mix's threshold (`None`: not within `--max_steps`).
Also reported: the completion tokens generated until then, and the median step time (evaluation excluded).

The report gives, per mix, both trainers' steps on each seed, the ratio of the medians (target <= 0.7) and each
seed's ratio; then the step-time ratio (target <= 1.05); with `--oracle`, a last table of each variant's share of
the oracle's gain, (1 − ours) / (1 − oracle) of the ratios (issue #31's target: >= 70%, and ours <= 1).
`--coupled` samples with common random numbers (`couple_sampling`), so the variants of one seed can be compared.
`--json` writes every figure. `--oracle` adds a bound: stock TRL trained on the learnable groups' prompts alone (the
same evaluation), i.e. a sampler that knows from the start which groups can be learnt and never draws another; no
sampling rule can do much better than it.
"""

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import add_family_arguments, prepare_runs  # noqa: E402

PROMPTS, EVAL_PER_GROUP, EVAL_EVERY, MAX_LEN = 256, 8, 4, 24
SETTINGS = dict(
    per_device_train_batch_size=16, num_generations=4, max_completion_length=MAX_LEN, learning_rate=3e-3,
    logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False, disable_tqdm=True, beta=0.0,
    per_device_eval_batch_size=16, num_generations_eval=4,
)  # fmt: skip


def _digit_fraction(text: str) -> float:
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def _hash01(text: str) -> float:
    return zlib.crc32(text.encode()) / 2**32


# task -> (reward of one completion from (its text, its length in tokens), learnable)
TASKS = {
    "short": (lambda text, n: float(n <= 12), True),  # 0/1; about 5% at the start
    "shorter": (lambda text, n: float(n <= 5), True),  # 0/1; about 2% at the start
    "digits": (lambda text, n: float(_digit_fraction(text) >= 0.4), True),  # 0/1: at least 40% digit characters
    "brevity": (lambda text, n: 1.0 - n / MAX_LEN, True),  # continuous, about 0.05 at the start
    "digit_share": (lambda text, n: _digit_fraction(text), True),  # continuous, about 0.24 at the start
    # continuous, and 0 for most completions at the start: a generation group starts uninformative, like a solved one's
    "brevity_gate": (lambda text, n: max(0.0, 1.0 - n / 18), True),
    "digit_gate": (lambda text, n: max(0.0, (_digit_fraction(text) - 0.3) / 0.7), True),
    "solved": (lambda text, n: 1.0, False),
    "hopeless": (lambda text, n: 0.0, False),
    "coin": (lambda text, n: float(zlib.crc32(text.encode()) % 2), False),  # 0/1 noise
    "uniform_noise": (lambda text, n: _hash01(text), False),  # continuous noise
    "constant": (lambda text, n: 0.7, False),  # continuous, solved
    "easy": (lambda text, n: float(zlib.crc32(text.encode()) % 8 != 0), False),  # 0/1, right 7 times in 8
    # 0/1, right by luck 1 time in 25: a generation group of 4 is informative 15% of the time, and nothing is learnt
    # (a hard problem a real model solves now and then, like SmolLM2's three-digit sums, issue #60)
    "lucky": (lambda text, n: float(zlib.crc32(text.encode()) % 25 == 0), False),
}
# mix -> ({group: (task, share of the prompts)}, threshold of the learnable groups' evaluation reward)
MIXES = {
    "base4": ({"short": ("short", 0.25), "shorter": ("shorter", 0.25), "solved": ("solved", 0.25),
               "noise": ("coin", 0.25)}, 0.8),
    "five_noise20": ({"short": ("short", 0.3), "shorter": ("shorter", 0.1), "digits": ("digits", 0.2),
                      "solved": ("solved", 0.2), "noise": ("coin", 0.2)}, 0.7),
    "two_solved": ({"short": ("short", 0.4), "solved_a": ("solved", 0.2), "solved_b": ("solved", 0.2),
                    "noise": ("coin", 0.1), "shorter": ("shorter", 0.1)}, 0.8),
    "two_groups": ({"shorter": ("shorter", 0.5), "solved": ("solved", 0.5)}, 0.8),
    "six_groups": ({"short": ("short", 0.1), "shorter": ("shorter", 0.2), "digits": ("digits", 0.2),
                    "solved": ("solved", 0.2), "noise": ("coin", 0.2), "hopeless": ("hopeless", 0.1)}, 0.6),
    "continuous": ({"brevity": ("brevity", 0.3), "digit_share": ("digit_share", 0.3),
                    "noise": ("uniform_noise", 0.2), "constant": ("constant", 0.2)}, 0.6),
    "no_noise": ({"short": ("short", 0.2), "digits": ("digits", 0.3), "solved": ("solved", 0.5)}, 0.6),
    # GSM8K-like (issue #17): easy problems (nearly always right), learnable ones of two difficulties, impossible ones
    "gsm8k_like": ({"easy": ("easy", 0.4), "medium": ("short", 0.2), "hard": ("shorter", 0.2),
                    "impossible": ("hopeless", 0.2)}, 0.7),
}  # fmt: skip
# The widened family (issue #31): 640 prompts, so 160 steps of 4 prompts draw about each prompt once, not many times
WIDE_MIXES = {
    # the mix: two continuous learnable groups that start uninformative, two solved groups, 20% uniform noise
    "cont_uninformative": ({"brevity": ("brevity_gate", 0.2), "digits": ("digit_gate", 0.2), "solved": ("solved", 0.2),
                            "constant": ("constant", 0.2), "noise": ("uniform_noise", 0.2)}, 0.4),
    "noise30": ({"short": ("short", 0.35), "shorter": ("shorter", 0.15), "noise": ("coin", 0.3),
                 "solved": ("solved", 0.2)}, 0.7),
    "three_unequal": ({"shorter": ("shorter", 0.6), "short": ("short", 0.1), "solved": ("solved", 0.3)}, 0.8),
    "six_unequal": ({"brevity": ("brevity_gate", 0.1), "short": ("short", 0.25), "digits": ("digits", 0.05),
                     "noise": ("uniform_noise", 0.25), "solved": ("solved", 0.15),
                     "hopeless": ("hopeless", 0.2)}, 0.5),
    # issue #60's real-model mix in tiny-model tasks, in about its shares (34/21/19/14/11%): two learnable groups, one
    # right now and then by luck only, a nearly solved one and a noise group
    "lucky_mix": ({"short": ("short", 0.35), "shorter": ("shorter", 0.2), "lucky": ("lucky", 0.2),
                   "easy": ("easy", 0.15), "noise": ("coin", 0.1)}, 0.7),
}  # fmt: skip
MIXES |= WIDE_MIXES
MIX_PROMPTS = {mix: 640 for mix in WIDE_MIXES}  # the others: PROMPTS


def group_rows(mix: str, spec: tuple | None = None, prompts: int = PROMPTS) -> list[str]:
    """The group of each of the `prompts` training prompts of `spec` (default `MIXES[mix]`): shares rounded, spread
    by a fixed stride."""
    groups, _ = spec or MIXES[mix]
    names = [g for g, (_, share) in groups.items() for _ in range(round(share * prompts))][:prompts]
    names += [names[-1]] * (prompts - len(names))
    stride = next(k for k in (97, 89, 83, 79, 73) if math.gcd(k, prompts) == 1)  # prime to `prompts`: a permutation
    return [names[(i * stride) % prompts] for i in range(prompts)]


class MixReward:
    """Rewards each completion by its group's task; records, per evaluation, each learnable group's mean reward and,
    per training step, the completion tokens."""

    __name__ = "mix_reward"

    def __init__(self, mix: str, spec: tuple | None = None):
        self.groups, _ = spec or MIXES[mix]
        self.trainer = None
        self.evals: dict[int, dict[str, list[float]]] = {}
        self.tokens: dict[int, int] = {}

    def __call__(self, completions, completion_ids, task, **kwargs):
        rewards = []
        for completion, ids, group in zip(completions, completion_ids, task, strict=True):
            score, _ = TASKS[self.groups[group][0]]
            rewards.append(score(completion[0]["content"], len(ids)))
        step = self.trainer.state.global_step
        if self.trainer.model.training:
            self.tokens[step] = self.tokens.get(step, 0) + sum(len(ids) for ids in completion_ids)
        else:
            per_group = self.evals.setdefault(step, {})
            for reward, group in zip(rewards, task, strict=True):
                per_group.setdefault(group, []).append(reward)
        return rewards


def datasets(mix: str, spec: tuple | None = None, prompts: int = PROMPTS):
    from datasets import Dataset

    from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows

    groups, _ = spec or MIXES[mix]
    rows = to_grpo_rows(synthetic_gsm8k(prompts, seed=7))
    for row, group in zip(rows, group_rows(mix, spec, prompts), strict=True):
        row["task"] = group
    learnable = [g for g, (task, _) in groups.items() if TASKS[task][1]]
    eval_rows = to_grpo_rows(synthetic_gsm8k(EVAL_PER_GROUP * len(learnable), seed=99))
    for i, row in enumerate(eval_rows):
        row["task"] = learnable[i % len(learnable)]
    return Dataset.from_list(rows), Dataset.from_list(eval_rows), learnable


ORACLE = "oracle"  # the `--oracle` variant: stock TRL on the learnable groups' prompts alone


def run(job: dict) -> dict:
    """One training run (in a worker process): `job` = mix, seed, variant name, overrides (None: stock TRL)."""
    import torch

    torch.set_num_threads(1)
    import trl
    from transformers import PrinterCallback

    from trl_grpo_ext import GRPOConfig, GRPOTrainer

    mix, seed, overrides, max_steps = job["mix"], job["seed"], job["overrides"], job["max_steps"]
    spec = job.get("spec")  # (groups, threshold) of a mix outside MIXES
    _, threshold = spec or MIXES[mix]
    train, evaluation, learnable = datasets(mix, spec, job.get("prompts", PROMPTS))
    reward = MixReward(mix, spec)
    with tempfile.TemporaryDirectory() as out:
        settings = dict(SETTINGS, output_dir=out, max_steps=max_steps, seed=seed, eval_strategy="steps",
                        eval_steps=job.get("eval_every", EVAL_EVERY))  # fmt: skip
        if overrides is None or overrides == ORACLE:
            config_cls, trainer_cls = trl.GRPOConfig, trl.GRPOTrainer
            if overrides == ORACLE:  # what no sampling rule can beat: only the learnable groups' prompts
                train = train.filter(lambda row: row["task"] in learnable)
        else:
            config_cls, trainer_cls = GRPOConfig, GRPOTrainer
            settings |= {"policy_group_column": "task", "remove_unused_columns": False, **overrides}
        trainer = trainer_cls(model=job["model_dir"], reward_funcs=[reward], args=config_cls(**settings),
                              train_dataset=train, eval_dataset=evaluation)  # fmt: skip
        trainer.remove_callback(PrinterCallback)
        if job.get("coupled"):  # common random numbers across variants (prompt_skip_family.py)
            couple_sampling(trainer, seed)
        if job.get("skip_oracle"):  # prompt skipping told which prompts give all-equal rewards (prompt_skip_family.py)
            skip_oracle(trainer, train, (spec or MIXES[mix])[0], job["skip_oracle"])
        if job.get("stop", True):  # `stop=False`: train all `max_steps` (final rewards, not only steps to threshold)
            trainer.add_callback(StopAtThreshold(reward, learnable, threshold))
        reward.trainer = trainer
        trainer.train()
        step_times = [row["step_time"] for row in trainer.state.log_history if "step_time" in row]
        # TRL's share of generation groups whose rewards all agree, per training step (`frac_reward_zero_std`)
        zero_std = [(row["step"], row["frac_reward_zero_std"]) for row in trainer.state.log_history
                    if "frac_reward_zero_std" in row and "eval_loss" not in row]  # fmt: skip
        final = trainer.state.global_step
        counts = [row for row in trainer.state.log_history if any(k.endswith("/count") for k in row)]
        prompts = {k.split("/")[1]: v for k, v in (counts[-1] if counts else {}).items() if k.endswith("/count")}
        # `keep_log`: the policy-group metrics of every row; "all": every row as logged (doctor_detection.py)
        logs = [{k: v for k, v in row.items() if k == "step" or k.startswith("policy_groups/")}
                for row in trainer.state.log_history] if job.get("keep_log") else None  # fmt: skip
        logs = trainer.state.log_history if job.get("keep_log") == "all" else logs
    curve = learnable_curve(reward.evals, learnable)
    reached = steps_to(curve, threshold)
    tokens = sum(n for step, n in reward.tokens.items() if reached is None or step < reached)
    return {"mix": mix, "seed": seed, "variant": job["variant"], "steps": reached,
            "eval_every": job.get("eval_every", EVAL_EVERY), "tokens": tokens if reached else None,
            "step_time": statistics.median(step_times), "curve": curve,
            "prompts_per_group": prompts, "zero_std": zero_std, "final_step": final, "log": logs,
            "tokens_per_step": dict(reward.tokens),
            "group_evals": {step: {g: statistics.mean(v) for g, v in per_group.items()}
                            for step, per_group in sorted(reward.evals.items())}}  # fmt: skip


class KeyedGumbel:
    """A logits processor that makes `do_sample=False` draw a sample: Gumbel noise added to the logits / temperature
    (the Gumbel-max trick: argmax(z/T + g), g ~ Gumbel(0, 1), is a draw from softmax(z/T)), the noise of each row
    and position seeded by the row's key, so a completion depends only on its prompt, its place in its generation
    group, the step and the weights, not on which other prompts the batch holds."""

    def __init__(self, keys: list[str], prompt_length: int, temperature: float):
        self.keys, self.prompt_length, self.temperature = keys, prompt_length, temperature

    def __call__(self, input_ids, scores):
        import torch

        position = input_ids.shape[1] - self.prompt_length
        noise = torch.empty_like(scores, dtype=torch.float32)
        for row, key in enumerate(self.keys):
            generator = torch.Generator().manual_seed(zlib.crc32(f"{key}:{position}".encode()))
            uniform = torch.rand(scores.shape[1], generator=generator).clamp(1e-12, 1 - 1e-7)
            noise[row] = -torch.log(-torch.log(uniform))
        return scores / self.temperature + noise.to(scores.dtype)


def couple_sampling(trainer, seed: int) -> None:
    """Common random numbers across variants (a variance reduction: every variant's run of one seed draws the same
    completion for the same prompt, place in its generation group, step and weights). The model's `generate` draws
    through `KeyedGumbel`, keyed by the seed, the step, training or evaluation, the prompt's tokens and its place
    among the batch's copies of that prompt (TRL repeats each prompt of a generation group consecutively). Then a
    variant whose update is stock TRL's (the no-refill oracle) follows stock TRL's run, but for float rounding, and
    a skipping rule differs from it only where it changed the update, so a few seeds compare rules."""
    import copy

    from transformers import LogitsProcessorList

    model = trainer.model
    original = model.generate

    def generate(*args, generation_config=None, **kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        step, mode = trainer.state.global_step, "train" if trainer.model.training else "eval"
        seen: dict[int, int] = {}
        keys = []
        for row in range(ids.shape[0]):
            prompt = zlib.crc32(ids[row][mask[row].bool()].numpy().tobytes())
            seen[prompt] = seen.get(prompt, -1) + 1
            keys.append(f"{seed}:{step}:{mode}:{prompt}:{seen[prompt]}")
        config = copy.deepcopy(generation_config)
        truncated = {"top_p": config.top_p not in (None, 1.0), "top_k": config.top_k not in (None, 0),
                     "min_p": config.min_p is not None}  # fmt: skip
        if any(truncated.values()):  # the Gumbel noise draws from the full softmax(z/T) only
            raise ValueError(
                f"couple_sampling draws from softmax(z/T) only; got {[k for k, v in truncated.items() if v]}"
            )
        temperature = config.temperature or 1.0
        config.do_sample, config.temperature, config.top_p, config.top_k = False, 1.0, 1.0, None
        processor = KeyedGumbel(keys, ids.shape[1], temperature)
        return original(*args, generation_config=config, logits_processor=LogitsProcessorList([processor]), **kwargs)

    model.generate = generate


# tasks whose generation groups always get one reward: every advantage 0, nothing a step can learn from them
ALL_EQUAL_TASKS = {"solved", "hopeless", "constant"}


def skip_oracle(trainer, train, groups: dict, kind="never") -> None:
    """Make the trainer's prompt skipping an oracle: a prompt of an `ALL_EQUAL_TASKS` group is never generated for
    (but for the layout's floor), every other one always; the loss normalized as for any skip. `kind="history"`:
    the bound of a rule that reads only each prompt's history, an uninformative prompt generated for on its first
    visit and never after; `kind="signal"`: the bound of a rule that cannot skip before the run's first informative
    generation group (every prompt generated until then, as the oracle after it)."""
    import torch

    from trl_grpo_ext.prompt_skip.history import NEVER

    uninformative = torch.tensor([groups[task][0] in ALL_EQUAL_TASKS for task in train["task"]])
    feature = trainer.features["prompt_skip"]
    history = feature.skip.history
    if kind == "history":
        feature.keep_probabilities = lambda rows: (~uninformative[rows] | (history.last_step[rows] == NEVER)).double()
    elif kind == "signal":  # the bound of a rule that waits for the run's first informative generation group
        feature.keep_probabilities = lambda rows: (~uninformative[rows] | ~history.informed.any()).double()
    else:
        feature.keep_probabilities = lambda rows: (~uninformative[rows]).double()


class StopAtThreshold(TrainerCallback):
    """Ends training at the evaluation where the threshold is reached: the figure is known, the remaining steps would
    only cost time."""

    def __init__(self, reward: MixReward, learnable: list[str], threshold: float):
        self.reward, self.learnable, self.threshold = reward, learnable, threshold

    def on_evaluate(self, args, state, control, **kwargs):
        if steps_to(learnable_curve(self.reward.evals, self.learnable), self.threshold) is not None:
            control.should_training_stop = True


def learnable_curve(evals: dict, learnable: list[str]) -> list[tuple[int, float]]:
    """(step, the learnable groups' mean evaluation reward, each group counted alike), in step order."""
    return [
        (step, statistics.mean(statistics.mean(g[name]) for name in learnable)) for step, g in sorted(evals.items())
    ]


def steps_to(curve: list[tuple[int, float]], threshold: float) -> int | None:
    """The first evaluated step at which the mean of the last 2 evaluations reaches `threshold`, or None."""
    for i in range(1, len(curve)):
        if (curve[i][1] + curve[i - 1][1]) / 2 >= threshold:
            return curve[i][0]
    return None


def median_steps(results: list[dict]) -> float:
    return statistics.median(r["steps"] if r["steps"] is not None else float("inf") for r in results)


def share_captured(ratio: float, oracle_ratio: float) -> float:
    """The share of the oracle's gain a variant captures, (1 − ratio) / (1 − oracle's ratio), both ratios of median
    steps to stock TRL's (issue #31): 1 at the oracle, 0 at stock TRL, negative when slower than stock TRL; inf/-inf
    where the oracle gains nothing (ratio >= 1) and the variant does better/worse than stock TRL."""
    if oracle_ratio >= 1:
        return math.inf if ratio < 1 else (-math.inf if ratio > 1 else 0.0)
    return (1 - ratio) / (1 - oracle_ratio)


def summary(results: list[dict], variants: list[str]) -> str:
    """One line per mix and variant (other than stock TRL and the oracle): the seeds that stock TRL, the oracle and
    the variant all ran, stock TRL's median steps over them, the oracle's ratio, the variant's ratio and its share of
    the oracle's gain (`share_captured`). Empty without `ORACLE` results."""
    if ORACLE not in variants:
        return ""
    lines = ["mix | variant | seeds | trl median steps | oracle | ratio (share of the oracle's gain)"]
    for mix in MIXES:
        for v in [v for v in variants if v not in ("trl", ORACLE)]:
            rows = {u: [r for r in results if r["mix"] == mix and r["variant"] == u] for u in ("trl", ORACLE, v)}
            seeds = set.intersection(*({r["seed"] for r in found} for found in rows.values()))
            if not seeds:
                continue
            trl, oracle, ours = (median_steps([r for r in found if r["seed"] in seeds]) for found in rows.values())
            ratio, oracle = ours / trl, oracle / trl
            share = "at or past the oracle" if ratio <= oracle else f"{share_captured(ratio, oracle):.0%}"
            lines.append(f"{mix} | {v} | {len(seeds)} | {trl} | {oracle:.2f} | {ratio:.2f} ({share})")
    return "\n".join(lines)


def report(results: list[dict], variants: list[str]) -> str:
    results = list({(r["mix"], r["seed"], r["variant"]): r for r in results}.values())  # a run in two files: once
    for r in results:  # against the current thresholds, also for results read from an earlier --json
        r["steps"] = steps_to(r["curve"], MIXES[r["mix"]][1])
    lines = []
    for mix in MIXES:
        rows = {v: sorted((r for r in results if r["mix"] == mix and r["variant"] == v), key=lambda r: r["seed"])
                for v in variants}  # fmt: skip
        if not rows["trl"] or not all(rows[v] for v in variants[1:]):
            continue
        seeds = set.intersection(*({r["seed"] for r in rows[v]} for v in variants))  # a family stopped mid-mix
        if not seeds:
            continue
        rows = {v: [r for r in rows[v] if r["seed"] in seeds] for v in variants}
        trl_median = median_steps(rows["trl"])
        lines.append(f"{mix} (threshold {MIXES[mix][1]}): trl steps {[r['steps'] for r in rows['trl']]}, "
                     f"median {trl_median}")  # fmt: skip
        for v in variants[1:]:
            ours = rows[v]
            ratio = median_steps(ours) / trl_median
            per_seed = [
                round((o["steps"] or float("inf")) / (t["steps"] or float("inf")), 2) if t["steps"] else None
                for o, t in zip(ours, rows["trl"], strict=True)
            ]
            times = statistics.median(r["step_time"] for r in ours) / statistics.median(
                r["step_time"] for r in rows["trl"]
            )
            lines.append(f"  {v}: steps {[r['steps'] for r in ours]}, median {median_steps(ours)}, ratio {ratio:.2f} "
                         f"(target <= 0.70), per seed {per_seed}, step time ratio {times:.2f}")  # fmt: skip
    return "\n".join([*lines, summary(results, variants)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    add_family_arguments(parser, seeds=[0, 1, 2, 3, 4], max_steps=160)
    parser.add_argument("--oracle", action="store_true", help="also run stock TRL on the learnable prompts alone")
    parser.add_argument("--eval_every", type=int, default=EVAL_EVERY,
                        help=f"steps between two evaluations (default {EVAL_EVERY}); a finer grid for mixes whose "
                        "gains are a few steps")  # fmt: skip
    parser.add_argument("--coupled", action="store_true",
                        help="common random numbers across variants (couple_sampling)")  # fmt: skip
    args = parser.parse_args()
    prepared = prepare_runs(args, report)
    if prepared is None:
        return
    variants, previous = prepared
    if args.oracle:
        variants[ORACLE] = ORACLE
    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(save_tiny_model(f"{tmp}/tiny"))
        jobs = [{"mix": m, "seed": s, "variant": v, "overrides": o, "max_steps": args.max_steps,
                 "model_dir": model_dir, "coupled": args.coupled, "prompts": MIX_PROMPTS.get(m, PROMPTS),
                 "eval_every": args.eval_every}
                for m in args.mixes for s in args.seeds for v, o in variants.items()]  # fmt: skip
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
            results = list(previous)
            for result in pool.map(run, jobs):
                print(f"{result['mix']} seed {result['seed']} {result['variant']}: steps {result['steps']}, "
                      f"step time {result['step_time']:.3f} s", flush=True)  # fmt: skip
                results.append(result)
                if args.json:  # after every run: a long family keeps what it measured if it is stopped
                    Path(args.json).write_text(json.dumps(results, indent=1))
    print(report(results, ["trl", *[v for v in variants if v != "trl"]]))


if __name__ == "__main__":
    main()
