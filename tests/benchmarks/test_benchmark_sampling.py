"""The benchmarks' common random numbers (`benchmarks/policy_groups/policy_groups_learning.couple_sampling`): a
draw from the model's distribution, the same completion for a prompt whatever else its batch holds."""

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from tests.conftest import REPO_ROOT


def benchmark_module(path: str = "policy_groups/policy_groups_learning"):
    """The benchmark script `benchmarks/{path}.py` as a module (it imports `benchmarks.harness` itself)."""
    spec = importlib.util.spec_from_file_location(path.rsplit("/", 1)[-1], REPO_ROOT / "benchmarks" / f"{path}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keyed_gumbel_draws_from_the_softmax_at_the_temperature():
    module = benchmark_module()
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(20_000, 1)
    temperature = 0.7
    processor = module.KeyedGumbel(
        [f"key{row}" for row in range(len(logits))], prompt_length=3, temperature=temperature
    )
    picked = processor(torch.zeros(len(logits), 3, dtype=torch.long), logits.clone()).argmax(dim=1)
    frequency = torch.bincount(picked, minlength=5).double() / len(logits)
    expected = torch.softmax(logits[0].double() / temperature, dim=0)
    assert torch.allclose(frequency, expected, atol=0.012), (frequency, expected)
    # a key draws the same noise every time, another key other noise
    again = processor(torch.zeros(len(logits), 3, dtype=torch.long), logits.clone()).argmax(dim=1)
    assert torch.equal(picked, again)
    moved = module.KeyedGumbel([f"other{row}" for row in range(len(logits))], 3, temperature)
    assert (moved(torch.zeros(len(logits), 3, dtype=torch.long), logits.clone()).argmax(dim=1) != picked).any()


def test_a_prompt_gets_the_same_completions_whatever_else_the_batch_holds(tiny_model_dir):
    module = benchmark_module()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    trainer = SimpleNamespace(model=model, state=SimpleNamespace(global_step=3))
    module.couple_sampling(trainer, seed=11)
    config = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=1.0, pad_token_id=tokenizer.pad_token_id)

    def completions(prompts):  # each prompt twice in a row, as TRL lays out a generation group
        batch = tokenizer([p for p in prompts for _ in range(2)], return_tensors="pt", padding=True)
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             generation_config=config)  # fmt: skip
        return [tokenizer.decode(ids) for ids in out[:, batch["input_ids"].shape[1] :]]

    both = completions(["a long first prompt of several words", "two"])
    alone = completions(["two"])
    assert both[2:] == alone  # the prompt "two" draws alike beside another prompt (longer: more padding) or alone
    assert both[2] != both[3]  # a generation group's completions are distinct draws
    trainer.state.global_step = 4
    assert completions(["two"]) != alone  # another step, other draws
    config.top_k = 50  # a truncated distribution is not what the Gumbel noise draws from: refused
    with pytest.raises(ValueError, match=r"draws from softmax\(z/T\) only; got \['top_k'\]"):
        completions(["two"])
