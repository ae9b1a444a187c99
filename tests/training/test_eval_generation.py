"""The evaluation's generation (issue #58): nothing decoded with the checkpoint's generation settings, greedy is the
argmax computed by hand, sampling is exactly the settings given; problems shared over processes give one process's
results; a progress line a batch."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from tests.conftest import REPO_ROOT
from tests.two_process import run_distributed
from trl_grpo_ext.gsm8k import eval_generation
from trl_grpo_ext.gsm8k.eval_generation import decoding_settings, progress_line, shard_batches
from trl_grpo_ext.gsm8k.evaluation import evaluate_gsm8k, write_results
from trl_grpo_ext.reporting.progress import duration

PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Tom has 4 apples and more"}]]
NEW_TOKENS = 10
# What issue #58 found: a Qwen2.5-Instruct-like generation_config.json, with a strong repetition penalty
CHECKPOINT_SAMPLING = {"repetition_penalty": 2.0, "top_k": 3, "top_p": 0.5, "temperature": 0.1}


def with_generation_config(tiny_model_dir: str, tmp_path: Path, settings: dict) -> str:
    """A copy of the tiny model whose generation_config.json also sets `settings`."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, **settings}))
    return str(folder)


def load(folder: str):
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def prompt_ids(tokenizer, prompt) -> list[int]:
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def argmax_by_hand(model, ids: list[int], eos: int, new_tokens: int = NEW_TOKENS) -> list[int]:
    """Greedy decoding as its definition: the whole sequence through the model, the argmax of the last logits."""
    ids, new = list(ids), []
    for _ in range(new_tokens):
        token = model(torch.tensor([ids])).logits[0, -1].argmax().item()
        new.append(token)
        ids.append(token)
        if token == eos:
            break
    return new


@pytest.fixture(scope="module")
def argmax_tokens(tiny_model_dir):
    model, tokenizer = load(tiny_model_dir)
    return [argmax_by_hand(model, prompt_ids(tokenizer, p), model.generation_config.eos_token_id) for p in PROMPTS]


def checkpoint_cases(argmax_tokens) -> dict[str, dict]:
    first = argmax_tokens[0][0]  # the argmax's first token: each setting below changes what greedy picks
    return {
        "sampling": CHECKPOINT_SAMPLING,
        # n-gram blocking, and settings whose "off" is None, which a generation_config given to generate() leaves
        # to the checkpoint: suppressed, banned and biased tokens, min-p
        "none_by_default": {
            "no_repeat_ngram_size": 2,
            "suppress_tokens": [first],
            "bad_words_ids": [[first]],
            "sequence_bias": [[[first], -50.0]],
            "min_p": 0.5,
        },
    }


@pytest.mark.parametrize("case", ["sampling", "none_by_default"])
def test_greedy_evaluation_is_the_argmax_whatever_the_checkpoint_sets(case, tiny_model_dir, tmp_path, argmax_tokens):
    settings = checkpoint_cases(argmax_tokens)[case]
    model, tokenizer = load(with_generation_config(tiny_model_dir, tmp_path, settings))
    tokenizer.padding_side = "left"
    expected = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in argmax_tokens]
    # Before (issue #58): generate() with do_sample=False only, as the evaluation called it, took the checkpoint's
    # settings and was not the argmax. (The random tiny model's argmax repeats one token, which each case changes.)
    batch = tokenizer([tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in PROMPTS],
                      return_tensors="pt", padding=True, add_special_tokens=False)  # fmt: skip
    stock = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, top_k=None)
    stock = tokenizer.batch_decode(stock[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert stock != expected

    greedy = eval_generation.generate(model, tokenizer, PROMPTS, max_new_tokens=NEW_TOKENS, batch_size=2)
    assert [texts[0] for texts in greedy] == expected
    assert all(getattr(model.generation_config, name) == value for name, value in settings.items())  # restored


def test_sampling_is_exactly_the_settings_given(tiny_model_dir, tmp_path):
    """maj@k samples with temperature 0.7 over the whole vocabulary, seeded with seed + the batch's first problem:
    the same as generate() given exactly those settings under that seed, not as generate() with the checkpoint's."""
    model, tokenizer = load(with_generation_config(tiny_model_dir, tmp_path, CHECKPOINT_SAMPLING))
    tokenizer.padding_side = "left"
    batch = tokenizer([tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in PROMPTS],
                      return_tensors="pt", padding=True, add_special_tokens=False)  # fmt: skip

    def sampled(**settings):
        torch.manual_seed(5)  # seed 5 + first problem 0
        out = model.generate(**batch, max_new_tokens=NEW_TOKENS, num_return_sequences=3, do_sample=True, **settings)
        texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        return [texts[:3], texts[3:]]

    ours = eval_generation.generate(
        model, tokenizer, PROMPTS, max_new_tokens=NEW_TOKENS, batch_size=2, num_samples=3, temperature=0.7, seed=5
    )
    assert ours == sampled(temperature=0.7, top_k=0, top_p=1.0, repetition_penalty=1.0)
    assert ours != sampled()  # the checkpoint's temperature 0.1, top-k 3, top-p 0.5, repetition penalty 2.0
    assert ours != eval_generation.generate(
        model, tokenizer, PROMPTS, max_new_tokens=NEW_TOKENS, batch_size=2, num_samples=3, temperature=0.7, seed=6
    )  # seeded
    assert ours == eval_generation.generate(
        model, tokenizer, PROMPTS, max_new_tokens=NEW_TOKENS, batch_size=2, num_samples=3, temperature=0.7, seed=5
    )


def test_every_default_transformers_fills_is_set_and_written_to_the_results(tiny_model_dir, tmp_path):
    """The settings are derived from transformers' defaults (every one it would fill from the checkpoint or its own
    defaults), then the evaluation's; eval_results.json records them."""
    defaults = GenerationConfig._get_default_generation_params()
    greedy, sampling = decoding_settings(7, 0.0), decoding_settings(7, 0.7, 4)
    for settings in (greedy, sampling):
        assert set(settings) == (set(defaults) - {"max_length"}) | {"max_new_tokens"}
        assert settings["repetition_penalty"] == 1.0 and settings["num_beams"] == 1
        assert settings["no_repeat_ngram_size"] == 0 and settings["max_new_tokens"] == 7
    assert greedy["do_sample"] is False and greedy["num_return_sequences"] == 1
    assert [sampling[name] for name in ("do_sample", "temperature", "top_k", "top_p")] == [True, 0.7, 0, 1.0]
    assert sampling["num_return_sequences"] == 4
    with pytest.raises(ValueError, match="num_samples=2 needs temperature > 0"):
        decoding_settings(7, 0.0, 2)

    model, tokenizer = load(with_generation_config(tiny_model_dir, tmp_path, CHECKPOINT_SAMPLING))
    dataset = Dataset.from_list([{"prompt": p, "answer": "5"} for p in PROMPTS])
    results = evaluate_gsm8k(model, tokenizer, dataset, max_new_tokens=7, maj_k=4, seed=3, progress=False)
    recorded = results["generation"]
    assert set(recorded) == {"greedy", "maj@4"} and recorded["maj@4"]["seed"] == 3
    for record, settings in ((recorded["greedy"], greedy), (recorded["maj@4"], sampling)):
        assert {name: record[name] for name in settings} == settings
        # issue #71: all that generate is given, the token ids and the settings left at None too
        assert record["eos_token_id"] == eval_generation.stop_token_ids(model, tokenizer)
        assert record["pad_token_id"] == tokenizer.pad_token_id
        assert record["bos_token_id"] == model.generation_config.bos_token_id
        assert {name: record[name] for name in ("min_p", "stop_strings", "top_h")} == dict.fromkeys(
            ("min_p", "stop_strings", "top_h")
        )
        assert record == {**eval_generation.generation_record(GenerationConfig(**record)), **record}
    saved = json.loads(Path(write_results(results, str(tmp_path / "out"))).read_text())
    assert saved["generation"] == recorded
    assert saved["generation"]["greedy"]["repetition_penalty"] == 1.0  # not the checkpoint's 2.0


def test_stop_ids_are_the_models_and_the_tokenizers(tiny_model_dir):
    model, tokenizer = load(tiny_model_dir)
    assert eval_generation.stop_token_ids(model, tokenizer) == [model.generation_config.eos_token_id]
    model.generation_config.eos_token_id = [7, 8]  # Qwen2.5 Instruct: <|im_end|> and <|endoftext|>
    assert eval_generation.stop_token_ids(model, tokenizer) == [7, 8, tokenizer.eos_token_id]


@pytest.mark.parametrize(
    ("num_items", "batch_size", "world", "expected"),
    [
        # 5 problems in batches of 2: [0, 2), [2, 4), [4, 5); process 0 takes the 1st and 3rd, process 1 the 2nd and
        # its repeat (not kept), so both run 2 generate calls.
        (5, 2, 2, [[(0, 2, True), (4, 5, True)], [(2, 4, True), (2, 4, False)]]),
        # 4 problems, 2 batches, 3 processes: process 2 has none of its own and repeats batch 0
        (4, 2, 3, [[(0, 2, True)], [(2, 4, True)], [(0, 2, False)]]),
        (6, 3, 1, [[(0, 3, True), (3, 6, True)]]),
        (0, 4, 2, [[], []]),
    ],
)
def test_shard_batches_by_hand(num_items, batch_size, world, expected):
    shards = [shard_batches(num_items, batch_size, rank, world) for rank in range(world)]
    assert shards == expected
    kept = sorted((start, stop) for shard in shards for start, stop, keep in shard if keep)
    assert kept == [(s, min(s + batch_size, num_items)) for s in range(0, num_items, batch_size)]  # each once


def test_progress_lines_by_hand():
    # 32 of 200 problems in 41 s: 41 / 32 · 168 = 215.25 s left
    assert progress_line("E", 32, 200, elapsed=41.0) == "E: 32/200 problems, 41s elapsed, about 3m35s left"
    assert progress_line("E", 0, 200, elapsed=0.0) == "E: 0/200 problems, started"
    # process 0's 125 of 250 (500 on 2 processes) in 3725 s: as long again left
    assert progress_line("E", 125, 250, elapsed=3725.0, num_processes=2, all_problems=500) == (
        "E: 125/250 problems on process 0 of 2 (500 in all), 1h02m elapsed, about 1h02m left"
    )
    assert (duration(59.4), duration(60), duration(3599), duration(7200)) == ("59s", "1m00s", "59m59s", "2h00m")


class FakeProcess:
    def __init__(self, rank, world):
        self.process_index, self.num_processes = rank, world


def test_progress_is_printed_a_batch_by_process_zero_only(tiny_model_dir, capsys, monkeypatch):
    model, tokenizer = load(tiny_model_dir)
    prompts = PROMPTS + PROMPTS[:1]
    eval_generation.generate(model, tokenizer, prompts, max_new_tokens=2, batch_size=1, label="Evaluation, greedy")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[1] for line in lines] == [f" greedy: {i}/3 problems" for i in range(4)]
    assert lines[0] == "Evaluation, greedy: 0/3 problems, started" and lines[-1].endswith(" left")

    monkeypatch.setattr("accelerate.utils.gather_object", lambda objects: objects)  # one process plays two ranks
    eval_generation.generate(
        model, tokenizer, prompts, max_new_tokens=2, batch_size=1, accelerator=FakeProcess(1, 2), label="E"
    )
    assert capsys.readouterr().out == ""
    eval_generation.generate(
        model, tokenizer, prompts, max_new_tokens=2, batch_size=1, accelerator=FakeProcess(0, 2), label="E"
    )
    assert capsys.readouterr().out.splitlines()[1].startswith("E: 1/2 problems on process 0 of 2 (3 in all), ")


def test_evaluation_shared_over_two_processes_equals_one_process(tiny_model_dir, tmp_path):
    """`accelerate launch` of 2 CPU processes (gloo), each calling evaluate_gsm8k with its process state on the same
    5 problems in batches of 2 with maj@3: both return the one-process results (greedy and sampled completions,
    figures), each process generated only its share (3 batches: 2 and 1 + a repeat), and process 1 printed nothing."""
    model_dir = with_generation_config(tiny_model_dir, tmp_path, CHECKPOINT_SAMPLING)
    out = tmp_path / "two"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate/ddp.yaml",
        "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", "0", "-m", "tests.eval_two_process", model_dir, str(out),
    ]  # fmt: skip
    proc = run_distributed(cmd, timeout=600, output_dir=str(out))
    from tests.eval_two_process import evaluate

    model, tokenizer = load(model_dir)
    one = evaluate(model, tokenizer, None)
    for rank in (0, 1):
        record = json.loads((out / f"rank{rank}.json").read_text())
        assert record["results"] == json.loads(json.dumps(one))
        assert record["generate_calls"] == 2 * 2  # greedy and maj@3, 2 batches each (process 1: 1 + a repeat)
    assert any(len({s["completion"] for s in r["maj@3"]["samples"]}) > 1 for r in one["samples"])  # sampled
    lines = [line for line in proc.stdout.splitlines() if line.startswith("Evaluation, ")]
    assert "Evaluation, greedy: 3/3 problems on process 0 of 2 (5 in all), " in "\n".join(lines)  # 0-1 and 4
    assert len(lines) == 2 * 3  # process 0 only: "started" and 2 batches, greedy and maj@3


def test_recipe_end_of_run_evaluation_prints_progress_and_its_settings(tmp_path, capsys):
    """The recipe's evaluation after training (one process): a progress line a batch, the settings in the file."""
    from tests.training.test_recipes import load_recipe

    recipe = load_recipe("math_gsm8k")
    out = tmp_path / "run"
    argv = [
        "--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(out),
        "--synthetic_problems", "8", "--max_steps", "1", "--eval_limit", "3", "--eval_batch_size", "2",
    ]  # fmt: skip
    results = recipe.main(*recipe.make_parser().parse_args_and_config(argv))
    printed = capsys.readouterr().out
    assert "Evaluation, greedy: 0/3 problems, started" in printed and "Evaluation, greedy: 2/3 problems, " in printed
    assert "Evaluation, greedy: 3/3 problems, " in printed
    saved = json.loads((out / "eval_results.json").read_text())
    max_new_tokens = recipe.make_parser().parse_args_and_config(argv)[1].max_completion_length  # the recipe's
    assert saved["generation"] == results["generation"]
    greedy = saved["generation"]["greedy"]
    assert {name: greedy[name] for name in decoding_settings(max_new_tokens, 0.0)} == decoding_settings(
        max_new_tokens, 0.0
    )
    assert greedy["eos_token_id"] and "pad_token_id" in greedy and "stop_strings" in greedy
