"""Evaluation: majority vote and accuracy figures against hand-computed values; adapters really are applied."""

import json
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

import trl_grpo_ext.gsm8k.evaluation as evaluation
from trl_grpo_ext.gsm8k.evaluation import (
    collapse_warning,
    evaluate_gsm8k,
    format_table,
    load_model_for_eval,
    majority_answer,
)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    """The tiny model and tokenizer, for the evaluations whose generation a test fixes (its token ids are recorded)."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize(
    ("completions", "expected"),
    [
        (["\\boxed{\\frac{1}{2}}"] * 3 + ["\\boxed{3}"] * 2, "\\frac{1}{2}"),  # equal LaTeX answers are one answer
        (["\\boxed{0.5}", "\\boxed{\\frac{1}{2}}", "\\boxed{3}", "\\boxed{3}", "\\boxed{1/2}"], "0.5"),  # 3 vs 2
        (["\\boxed{\\$18}", "\\boxed{18.00}", "so 18 dollars", "\\boxed{5}", "\\boxed{5}"], "\\$18"),
        (["\\boxed{1\\,234}", "\\boxed{1234}", "\\boxed{7}"], "1\\,234"),
        (["\\boxed{7}", "\\boxed{8}"], "7"),  # a tie: the answer seen first
        (["no number here", ""], None),
    ],
)
def test_majority_answer(completions, expected):
    assert majority_answer(completions) == expected


def test_evaluate_gsm8k_figures_by_hand(monkeypatch, tiny):
    """4 problems with fixed completions. Greedy: boxed right, unboxed right, boxed wrong, nothing.
    strict = 1/4 (only the first), lenient = 2/4. maj@3 votes: 5 (right), 2 (right), 9 (wrong), none -> 2/4."""
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": a} for i, a in
                                 enumerate(["5", "2", "7", "1"])])  # fmt: skip
    greedy = [["so \\boxed{5}"], ["the answer is 2"], ["\\boxed{6}"], ["hmm"]]
    sampled = [["\\boxed{5}", "\\boxed{5}", "\\boxed{4}"], ["2", "\\boxed{2.0}", "3"], ["\\boxed{9}"] * 3, ["?"] * 3]

    def fake_generate(model, tokenizer, prompts, max_new_tokens, batch_size, num_samples=1, *sampling, **options):
        assert [p[0]["content"] for p in prompts] == ["q0", "q1", "q2", "q3"]
        return greedy if num_samples == 1 else sampled

    monkeypatch.setattr(evaluation, "generate", fake_generate)
    results = evaluate_gsm8k(*tiny, dataset, maj_k=3)
    assert (results["strict_accuracy"], results["lenient_accuracy"], results["maj@3"]) == (0.25, 0.5, 0.5)
    assert [s["strict"] for s in results["samples"]] == [1.0, 0.0, 0.0, 0.0]
    assert [s["lenient"] for s in results["samples"]] == [1.0, 1.0, 0.0, 0.0]
    table = dict(line.split() for line in format_table(results).splitlines()[2:])
    assert (table["strict_accuracy"], table["maj@3"], table["problems"]) == ("25.0%", "50.0%", "4")
    assert results["empty_completions"] == 0.0 and collapse_warning(results) is None


def test_an_evaluation_of_empty_completions_warns_that_the_model_collapsed(monkeypatch, tiny):
    """Issue #30: a model wrecked by its training answers with nothing; 3 of 4 empty (one blank) is a warning that
    names the learning rate, 1 of 4 is not. Issue #72: an untrained model gives no answer either, so the line tells
    the two apart by the model before training, or says how to when that was not measured."""
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": "1"} for i in range(4)])
    for greedy, share in (([[""], [" \n"], [""], ["1"]], 0.75), ([[""], ["2"], ["3"], ["\boxed{1}"]], 0.25)):
        monkeypatch.setattr(evaluation, "generate", lambda *args, greedy=greedy, **kwargs: greedy)
        results = evaluate_gsm8k(*tiny, dataset)
        assert results["empty_completions"] == share
        assert dict(line.split() for line in format_table(results).splitlines()[2:])["empty_completions"] == (
            f"{100 * share:.1f}%"
        )
        warning = collapse_warning(results, learning_rate=0.003)
        assert (warning is not None) is (share >= 0.5)
    assert collapse_warning({"empty_completions": 0.75}, 0.003, base="HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "Warning: 75% of the evaluation's completions are empty or blank: the model has collapsed in training, or "
        "gave no answer before it either (python recipes/eval_gsm8k.py --model_name_or_path "
        "HuggingFaceTB/SmolLM2-135M-Instruct --limit 8 tells which, BASE being the model training started from); if "
        "it collapsed, lower learning_rate (now 0.003) (a pretrained model: about 1e-5 at most in full fine-tuning, "
        "2e-4 with LoRA), or train with LoRA; `trl-grpo-ext doctor` on the run folder shows when it happened"
    )
    collapsed = {"empty_completions": 1.0, "untrained": {"empty_completions": 0.0, "num_problems": 8}}
    assert collapse_warning(collapsed, 0.003).startswith(
        "Warning: 100% of the evaluation's completions are empty or blank, against 0% of the untrained model's on 8 "
        "of these problems: the model has collapsed in training; lower learning_rate (now 0.003)"
    )
    untrained = {"empty_completions": 1.0, "untrained": {"empty_completions": 0.75, "num_problems": 8}}
    assert collapse_warning(untrained, 0.003) == (
        "Note: 100% of the evaluation's completions are empty or blank, and so were 75% of the untrained model's on 8 "
        "of these problems: the model gave no answer before training either, so this is no collapse of training, and "
        "the evaluation cannot show what it learned"
    )


def test_results_keep_every_completion_with_its_question_answer_and_score(monkeypatch, tmp_path, tiny):
    """The same 4 problems: each record holds the question, the gold answer, the greedy completion with what was read
    from it, and the 3 maj@3 samples, each with its lenient answer and whether it is right; the JSON keeps it all."""
    dataset = Dataset.from_list([{"prompt": [{"role": "system", "content": "Think."}, {"role": "user", "content":
                                 f"q{i}"}], "answer": a} for i, a in enumerate(["5", "2", "7", "1"])])  # fmt: skip
    greedy = [["so \\boxed{5}"], ["the answer is 2"], ["\\boxed{6}"], ["hmm"]]
    sampled = [["\\boxed{5}", "\\boxed{5}", "\\boxed{4}"], ["2", "\\boxed{2.0}", "3"], ["\\boxed{9}"] * 3, ["?"] * 3]

    def fake_generate(model, tokenizer, prompts, max_new_tokens, batch_size, num_samples=1, *sampling, **options):
        return greedy if num_samples == 1 else sampled

    monkeypatch.setattr(evaluation, "generate", fake_generate)
    results = evaluate_gsm8k(*tiny, dataset, maj_k=3)

    records = results["samples"]
    assert [r["question"] for r in records] == ["q0", "q1", "q2", "q3"]  # the user message, not the system prompt
    assert [r["answer"] for r in records] == ["5", "2", "7", "1"]
    assert [r["completion"] for r in records] == [texts[0] for texts in greedy]
    # Greedy: "\\boxed{5}" is read by both; "the answer is 2" only leniently; "\\boxed{6}" by both, wrong; "hmm": none.
    assert [r["strict_answer"] for r in records] == ["5", None, "6", None]
    assert [r["lenient_answer"] for r in records] == ["5", "2", "6", None]
    votes = [r["maj@3"] for r in records]
    assert [[s["completion"] for s in v["samples"]] for v in votes] == sampled  # every sample, in order
    assert [[s["lenient_answer"] for s in v["samples"]] for v in votes] == [
        ["5", "5", "4"], ["2", "2.0", "3"], ["9", "9", "9"], [None, None, None]
    ]  # fmt: skip
    assert [[s["correct"] for s in v["samples"]] for v in votes] == [
        [True, True, False], [True, True, False], [False] * 3, [False] * 3
    ]  # fmt: skip
    assert [v["majority_answer"] for v in votes] == ["5", "2", "9", None]
    assert [v["correct"] for v in votes] == [True, True, False, False]
    # maj@3 is the share of problems whose vote is right, as the records say: 2 of 4.
    assert results["maj@3"] == sum(v["correct"] for v in votes) / 4

    path = evaluation.write_results(results, str(tmp_path), "eval_gsm8k.json")
    assert json.loads(Path(path).read_text()) == results  # nothing is dropped on the way to the file


def test_results_without_maj_k_have_no_vote_records(monkeypatch, tiny):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "q"}], "answer": "3"}])
    monkeypatch.setattr(evaluation, "generate", lambda *args, **kwargs: [["\\boxed{3}"]])
    (record,) = evaluate_gsm8k(*tiny, dataset)["samples"]
    assert record == {
        "question": "q", "answer": "3", "completion": "\\boxed{3}", "strict_answer": "3", "lenient_answer": "3",
        "strict": 1.0, "lenient": 1.0,
    }  # fmt: skip


def test_generate_is_batched_and_greedy(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [[{"role": "user", "content": f"What is {i} + {i}?" + " pad" * i}] for i in range(5)]
    one_batch = evaluation.generate(model, tokenizer, prompts, max_new_tokens=6, batch_size=8)
    small_batches = evaluation.generate(model, tokenizer, prompts, max_new_tokens=6, batch_size=2)
    assert len(one_batch) == 5 and all(len(texts) == 1 for texts in one_batch)
    assert one_batch == small_batches  # left padding: a prompt's greedy completion does not depend on its batch
    with pytest.raises(ValueError, match="num_samples=2 needs temperature > 0"):
        evaluation.generate(model, tokenizer, prompts, num_samples=2, temperature=0.0)


THINKING_TEMPLATE = (  # a Qwen3-style switch: thinking off opens the answer with an empty think block
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
)


def test_prompts_are_formatted_with_the_runs_chat_template_kwargs(tiny_model_dir, monkeypatch):
    """Issue #32.5 (TRL PR #4350): training renders prompts with `GRPOConfig.chat_template_kwargs`; the evaluation's
    greedy and maj@k prompts are rendered with the same ones, token for token as TRL's own rendering."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    tokenizer.chat_template = THINKING_TEMPLATE
    prompts = [[{"role": "user", "content": "What is 2 + 2?"}]]
    seen = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: seen.append(kw["input_ids"][0].tolist()) or generate(**kw))
    dataset = Dataset.from_list([{"prompt": prompts[0], "answer": "4"}])

    results = evaluate_gsm8k(model, tokenizer, dataset, max_new_tokens=2, maj_k=2, temperature=1.0,
                             chat_template_kwargs={"enable_thinking": False})  # fmt: skip
    evaluate_gsm8k(model, tokenizer, dataset, max_new_tokens=2)

    trained_on = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True,
                                               enable_thinking=False)["input_ids"][0]  # fmt: skip
    assert seen[0] == seen[1] == list(trained_on)  # greedy and maj@k, as TRL's trainer renders it
    assert tokenizer.decode(seen[0]).endswith("<|assistant|><think></think>")
    assert not tokenizer.decode(seen[2]).endswith("</think>")  # without the kwargs: thinking on
    assert results["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_runs_chat_template_kwargs_are_found_from_the_run_or_a_checkpoint(tmp_path):
    assert evaluation.save_chat_template_kwargs({}, str(tmp_path)) is None  # nothing to say: no file
    assert evaluation.run_chat_template_kwargs(str(tmp_path)) is None
    path = evaluation.save_chat_template_kwargs({"enable_thinking": False}, str(tmp_path))
    (tmp_path / "checkpoint-4").mkdir()
    for folder in (tmp_path, tmp_path / "checkpoint-4"):
        assert evaluation.run_chat_template_kwargs(str(folder)) == ({"enable_thinking": False}, path)
    Path(path).write_text("[1]")
    with pytest.raises(ValueError, match="holds list, not a JSON object: fix or delete it"):
        evaluation.run_chat_template_kwargs(str(tmp_path))


def test_adapter_folder_is_merged_into_its_base(tiny_model_dir, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    merged, tokenizer = load_model_for_eval(str(tmp_path / "adapter"), dtype="float32", device="cpu")

    ids = tokenizer("What is 2 + 2?", return_tensors="pt").input_ids
    with torch.no_grad():
        base_logits = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(ids).logits
        adapter_logits = peft_model.eval()(ids).logits
        merged_logits = merged(ids).logits
    assert (adapter_logits - base_logits).abs().max() > 1e-3  # the adapter changes the model...
    torch.testing.assert_close(merged_logits, adapter_logits, atol=1e-5, rtol=1e-5)  # ...and the eval model has it


@pytest.mark.parametrize(
    ("completions", "expected"),
    [
        (["The answer is $9{,}500$."] * 3 + ["\\boxed{9}"] * 2, "9500"),  # was "9": all five voted for 9
        (["The answer is $9{,}500$.", "\\boxed{9\\,500}", "so 9,500", "\\boxed{9}", "\\boxed{9}"], "9500"),  # 3 vs 2
        (["We have 5 apples, so the total is $$42$$"] * 2 + ["\\boxed{5}"], "42"),  # was "5" (3 votes)
        (["5 apples, total \\(\\mathbf{42}\\)", "5 apples, total **42**", "\\boxed{5}"], "42"),  # was "5"
    ],
)
def test_majority_answer_reads_numbers_in_latex_and_markdown(completions, expected):
    assert majority_answer(completions) == expected


def test_lenient_accuracy_reads_latex_thousands(monkeypatch, tiny):
    """Greedy completions with the answer only in running text: strict 0/2, lenient 2/2 (was 0/2: "9" and "5")."""
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": a} for i, a in
                                 enumerate(["9500", "42"])])  # fmt: skip
    greedy = [["The answer is $9{,}500$."], ["We have 5 apples, so the total is $$42$$"]]
    monkeypatch.setattr(evaluation, "generate", lambda *args, **kwargs: greedy)
    results = evaluate_gsm8k(*tiny, dataset)
    assert (results["strict_accuracy"], results["lenient_accuracy"]) == (0.0, 1.0)
