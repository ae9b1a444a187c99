"""GSM8K evaluation: greedy pass@1 (strict and lenient) and majority vote over k samples.

Strict accuracy counts an answer only in the required format (a final `\\boxed{}`); lenient accuracy accepts the
answer anywhere in the completion. maj@k (Wang et al., self-consistency, arXiv:2203.11171) samples k completions per
problem and scores the most frequent extracted answer. Lenient accuracy and the vote both read answers with
`rewards.extract_final_answer`, the extraction behind the lenient reward ("$9{,}500$" is 9500, "\\textbf{42}" is 42).

`evaluate_gsm8k` keeps every completion: one record a problem with its question, gold answer, greedy completion and,
with maj@k, its k samples, each with the answer extracted from it and whether that answer is right
(`write_results` saves them as JSON), and the decoding settings it used.

The generation is `eval_generation`'s: every decoding setting given explicitly, none taken from the checkpoint's
`generation_config.json` (greedy is argmax, maj@k samples at the evaluation's temperature only), the problems shared
over processes when there are several (the same results as one process), a progress line a batch.

Prompts are formatted as TRL's trainer formats them for training: the tokenizer's chat template with
`add_generation_prompt=True` and the run's `chat_template_kwargs` (e.g. `{"enable_thinking": False}`). The recipe
saves those in `<output_dir>/chat_template_kwargs.json` (`save_chat_template_kwargs`), where `recipes/eval_gsm8k.py`
finds them for a run folder or one of its checkpoints (`run_chat_template_kwargs`).
"""

import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..resume import write_json_atomically
from .eval_generation import decoding_config, generate, generation_record
from .rewards import answer_is_correct, extract_final_answer, same_answer


def load_model_for_eval(path: str, dtype: str = "auto", device: str | None = None):
    """Load a model folder, a Trainer checkpoint or a LoRA adapter folder (merged into its base) and its tokenizer.

    An adapter folder is one with `adapter_config.json`; its base model is read from there. The tokenizer comes from
    `path` when it has one, else from the base model. Returns `(model in eval mode, tokenizer with left padding)`.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    is_adapter = (Path(path) / "adapter_config.json").is_file()
    if is_adapter:
        from peft import AutoPeftModelForCausalLM, PeftConfig

        model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype).merge_and_unload()
        base = PeftConfig.from_pretrained(path).base_model_name_or_path
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        base = path
    tokenizer_path = path if (Path(path) / "tokenizer_config.json").is_file() else base
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def majority_answer(completions: list[str]) -> str | None:
    """The most frequent lenient answer among `completions`; None if none has one.

    Answers that are the same number ("18", "18.00", "\\$18", "\\frac{1}{2}" and "0.5") count as one, by
    `rewards.same_answer`; on a tie the answer seen first wins.
    """
    return _vote([extract_final_answer(text, strict=False) for text in completions])


def _vote(answers: list[str | None]) -> str | None:
    """The most frequent of the extracted `answers` (None skipped), equal numbers counted as one; ties: first seen."""
    votes: list[list] = []  # [representative answer, count], in order of first appearance
    for answer in answers:
        if answer is None:
            continue
        for vote in votes:
            if same_answer(answer, vote[0]):
                vote[1] += 1
                break
        else:
            votes.append([answer, 1])
    return max(votes, key=lambda vote: vote[1])[0] if votes else None


def question_of(prompt: list[dict]) -> str | None:
    """The question of a chat prompt: the content of its last user message (None without one)."""
    return next((message["content"] for message in reversed(prompt) if message["role"] == "user"), None)


def greedy_record(question: str | None, gold: str, completion: str) -> dict:
    """One problem's greedy completion, both extracted answers and both scores (1.0 or 0.0)."""
    strict_answer = extract_final_answer(completion, strict=True)
    lenient_answer = extract_final_answer(completion, strict=False)
    return {
        "question": question,
        "answer": gold,
        "completion": completion,
        "strict_answer": strict_answer,
        "lenient_answer": lenient_answer,
        "strict": float(answer_is_correct(strict_answer, gold)),
        "lenient": float(answer_is_correct(lenient_answer, gold)),
    }


def vote_record(gold: str, completions: list[str]) -> dict:
    """One problem's maj@k samples, each with its lenient answer and whether it is right, and the vote over them."""
    samples = []
    for completion in completions:
        answer = extract_final_answer(completion, strict=False)
        correct = answer_is_correct(answer, gold)
        samples.append({"completion": completion, "lenient_answer": answer, "correct": correct})
    majority = _vote([sample["lenient_answer"] for sample in samples])
    return {"majority_answer": majority, "correct": answer_is_correct(majority, gold), "samples": samples}


def evaluate_gsm8k(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset,
    *,
    max_new_tokens: int = 512,
    batch_size: int = 16,
    maj_k: int = 0,
    temperature: float = 0.7,
    chat_template_kwargs: dict | None = None,
    seed: int = 0,
    accelerator=None,
    progress: bool = True,
) -> dict:
    """Greedy pass@1 (strict and lenient) and, when `maj_k > 1`, maj@k accuracy on GSM8K rows.

    Decoding is set in full, nothing taken from the checkpoint's `generation_config.json` (`eval_generation`):
    greedy is argmax; maj@k samples at `temperature` over the whole vocabulary (no top-k, top-p or repetition
    penalty), each batch of `batch_size` problems seeded with `seed` + the index of its first problem.

    Args:
        dataset: rows with `prompt` (chat messages) and `answer` (gold number string), as `data.load_gsm8k` gives.
        maj_k: samples per problem for the majority vote, at `temperature`; 0 or 1 skips it.
        chat_template_kwargs: what the chat template is rendered with, as in training (`GRPOConfig`'s field): a
            thinking-off model (`{"enable_thinking": False}`) is evaluated thinking off.
        accelerator: an accelerate `Accelerator` or `PartialState`: with several processes, every process calls this
            with the same rows, generates its share of the batches and returns the whole results (the same as one
            process's, `eval_generation.shard_batches`).
        progress: print a progress line a batch (problems done, time elapsed and left), from process 0 only.

    Returns:
        `{"num_problems", "strict_accuracy", "lenient_accuracy", "empty_completions", "chat_template_kwargs",
        "generation", ["maj@k"], "samples": [...]}`;
        accuracies and `empty_completions` (the greedy completions that are empty or blank) are fractions in [0, 1]
        (the recipe adds `untrained`, `untrained_empty_share`'s figures, when that share is `EMPTY_SHARE` or more).
        `generation` holds every setting `generate` was given, `{"greedy": {...}, ["maj@k": {..., "seed"}]}`
        (`eval_generation.generation_record`: the decoding settings, the eos, pad and bos ids, and those left at
        None such as `min_p`, `stop_strings`, `top_h`). `samples` keeps every completion, one record a problem:
        `question`, `answer` (gold), the greedy `completion` with its `strict_answer` (a final `\\boxed{}`) and
        `lenient_answer` (None when there is none) and their scores `strict` and `lenient` (1.0 or 0.0); with
        maj@k, `"maj@k"`: `{"majority_answer", "correct", "samples": [{"completion", "lenient_answer", "correct"},
        ...]}`, the k sampled completions in the order they were generated.
    """
    prompts, answers = list(dataset["prompt"]), list(dataset["answer"])
    n = max(len(prompts), 1)
    shared = dict(seed=seed, accelerator=accelerator)
    greedy = [
        texts[0]
        for texts in generate(
            model,
            tokenizer,
            prompts,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            chat_template_kwargs=chat_template_kwargs,
            label="Evaluation, greedy" if progress else None,
            **shared,
        )
    ]
    questions = [question_of(prompt) for prompt in prompts]
    records = [greedy_record(*row) for row in zip(questions, answers, greedy, strict=True)]
    results = {
        "num_problems": len(prompts),
        "strict_accuracy": sum(record["strict"] for record in records) / n,
        "lenient_accuracy": sum(record["lenient"] for record in records) / n,
        "empty_completions": sum(not text.strip() for text in greedy) / n,
        "chat_template_kwargs": dict(chat_template_kwargs or {}),
        "generation": {"greedy": generation_record(decoding_config(model, tokenizer, max_new_tokens, 0.0))},
    }
    if maj_k > 1:
        label = f"Evaluation, maj@{maj_k}" if progress else None
        sampled = generate(
            model,
            tokenizer,
            prompts,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            num_samples=maj_k,
            temperature=temperature,
            chat_template_kwargs=chat_template_kwargs,
            label=label,
            **shared,
        )
        for record, texts in zip(records, sampled, strict=True):
            record[f"maj@{maj_k}"] = vote_record(record["answer"], texts)
        results[f"maj@{maj_k}"] = sum(record[f"maj@{maj_k}"]["correct"] for record in records) / n
        config = decoding_config(model, tokenizer, max_new_tokens, temperature, maj_k)
        results["generation"][f"maj@{maj_k}"] = {**generation_record(config), "seed": seed}
    results["samples"] = records
    return results


CHAT_TEMPLATE_KWARGS_FILE = "chat_template_kwargs.json"


def save_chat_template_kwargs(chat_template_kwargs: dict | None, output_dir: str) -> str | None:
    """Write a run's `chat_template_kwargs` to `<output_dir>/chat_template_kwargs.json` (nothing when empty), so that
    an evaluation of the run formats its prompts as training did. Returns the path written, or None."""
    if not chat_template_kwargs:
        return None
    path = os.path.join(output_dir, CHAT_TEMPLATE_KWARGS_FILE)
    os.makedirs(output_dir, exist_ok=True)
    Path(path).write_text(json.dumps(chat_template_kwargs, indent=1) + "\n")
    return path


def run_chat_template_kwargs(model_path: str) -> tuple[dict, str] | None:
    """The `chat_template_kwargs` a run was trained with, for a run folder or a checkpoint in one: (kwargs, the file
    they were read from), or None when neither `model_path` nor its parent folder has the file (a model that was not
    trained by the recipe, or trained without them).

    Raises:
        ValueError: the file is not a JSON object."""
    for folder in (Path(model_path), Path(model_path).parent):
        path = folder / CHAT_TEMPLATE_KWARGS_FILE
        if path.is_file():
            try:
                kwargs = json.loads(path.read_text())
            except json.JSONDecodeError as error:
                raise ValueError(f"{path} is not JSON ({error}): fix or delete it") from None
            if not isinstance(kwargs, dict):
                raise ValueError(f"{path} holds {type(kwargs).__name__}, not a JSON object: fix or delete it")
            return kwargs, str(path)
    return None


def write_results(results: dict, output_dir: str, name: str = "eval_results.json") -> str:
    """Write `results` as indented JSON to `<output_dir>/<name>`, atomically (a write cut short leaves no partial
    file); return the path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, name)
    write_json_atomically(path, results, indent=2)
    return path


EMPTY_SHARE = 0.5  # evaluation completions empty or blank at least this often: no answer, collapsed or untrained
BEFORE_PROBLEMS = 8  # problems the model before training answers, to tell an untrained model from a collapsed one


def untrained_empty_share(model, tokenizer, dataset, *, max_new_tokens: int, chat_template_kwargs=None,
                          accelerator=None) -> dict:  # fmt: skip
    """The greedy completions of `model` (the model before training) on the first `BEFORE_PROBLEMS` problems of
    `dataset` that are empty or blank, as `evaluate_gsm8k` counts them (same decoding, no progress lines).

    Returns:
        `{"empty_completions": share in [0, 1], "num_problems": n}`, what `collapse_warning` reads as
        `results["untrained"]`.
    """
    rows = dataset.select(range(min(BEFORE_PROBLEMS, len(dataset))))
    settings = dict(chat_template_kwargs=chat_template_kwargs, accelerator=accelerator, progress=False)
    before = evaluate_gsm8k(model, tokenizer, rows, max_new_tokens=max_new_tokens, batch_size=len(rows), **settings)
    return {"empty_completions": before["empty_completions"], "num_problems": before["num_problems"]}


def collapse_warning(results: dict, learning_rate: float | None = None, base: str | None = None) -> str | None:
    """One line when at least `EMPTY_SHARE` of the evaluation's greedy completions are empty or blank; None otherwise.

    Such a model is either untrained for the task or wrecked by its training (answering with the end-of-sequence
    token at once): `results["untrained"]` (`untrained_empty_share` of the model before training), when measured,
    tells which. A collapse names the setting to change; without the measurement the line says how to take it
    (`base`: the model training started from, when known, for the command)."""
    share = results.get("empty_completions", 0.0)
    if share < EMPTY_SHARE:
        return None
    now = f" (now {learning_rate:g})" if learning_rate is not None else ""
    fix = (f"lower learning_rate{now} (a pretrained model: about 1e-5 at most in full fine-tuning, 2e-4 with LoRA), "
           "or train with LoRA; `trl-grpo-ext doctor` on the run folder shows when it happened")  # fmt: skip
    head = f"{share:.0%} of the evaluation's completions are empty or blank"
    before = results.get("untrained")
    if before is None:
        compare = f"python recipes/eval_gsm8k.py --model_name_or_path {base or 'BASE'} --limit {BEFORE_PROBLEMS}"
        return (f"Warning: {head}: the model has collapsed in training, or gave no answer before it either ({compare} "
                f"tells which, BASE being the model training started from); if it collapsed, {fix}")  # fmt: skip
    then = f"{before['empty_completions']:.0%} of the untrained model's on {before['num_problems']} of these problems"
    if before["empty_completions"] >= EMPTY_SHARE:
        return (f"Note: {head}, and so were {then}: the model gave no answer before training either, so this is no "
                "collapse of training, and the evaluation cannot show what it learned")  # fmt: skip
    return f"Warning: {head}, against {then}: the model has collapsed in training; {fix}"


def format_table(results: dict) -> str:
    """A printable table of the accuracy figures in `results` (percentages), and the share of empty completions."""
    rows = [(key, value) for key, value in results.items()
            if key.endswith("accuracy") or key.startswith("maj@") or key == "empty_completions"]  # fmt: skip
    width = max(len(key) for key, _ in rows)
    lines = [f"{'metric'.ljust(width)}  value", f"{'-' * width}  ------"]
    lines += [f"{key.ljust(width)}  {100 * value:5.1f}%" for key, value in rows]
    lines.append(f"{'problems'.ljust(width)}  {results['num_problems']}")
    return "\n".join(lines)
