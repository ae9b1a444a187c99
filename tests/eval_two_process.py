"""A worker of `tests/training/test_eval_generation.py`'s two-process evaluation: `python -m tests.eval_two_process
MODEL OUT` under `accelerate launch`. Each process evaluates its share of the problems (`evaluate`) and writes the
results it returns, with how many times it called `generate`, to `OUT/rank<i>.json`."""

import json
import os
import sys
from pathlib import Path

from datasets import Dataset

from trl_grpo_ext.gsm8k.evaluation import evaluate_gsm8k

# 5 problems of different lengths (left padding), in batches of 2: 3 batches, 2 on process 0, 1 + a repeat on process 1
QUESTIONS = ["What is 2 + 3?", "Tom has 4 apples and buys 3 more. How many?", "7 - 2?", "Half of 10?", "3 times 3?"]


def evaluate(model, tokenizer, accelerator) -> dict:
    """The evaluation both processes and the one-process reference run: greedy and maj@3 at temperature 1."""
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "answer": "5"} for q in QUESTIONS])
    return evaluate_gsm8k(model, tokenizer, dataset, max_new_tokens=6, batch_size=2, maj_k=3, temperature=1.0,
                          seed=11, accelerator=accelerator)  # fmt: skip


def main(model_dir: str, out_dir: str) -> None:
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer

    state = PartialState(cpu=True)  # gloo, as the suite's other two-process runs (use_cpu=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    calls = []
    generate = model.generate
    model.generate = lambda **kwargs: calls.append(1) or generate(**kwargs)
    results = evaluate(model, tokenizer, state)
    os.makedirs(out_dir, exist_ok=True)
    record = {"results": results, "generate_calls": len(calls)}
    Path(out_dir, f"rank{state.process_index}.json").write_text(json.dumps(record))
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
