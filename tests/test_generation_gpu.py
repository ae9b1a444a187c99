"""Fast generation on CUDA (skipped without it): the pinned host copy of the in-place merge, the bf16 generation copy,
and training with a compiled decode step (CUDA graphs) that compiles once."""

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from tests.conftest import length_reward, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.generation.lora_merge import GenerationCopy, InplaceMerge

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def cuda_peft_model(model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))


def test_inplace_merge_on_cuda_keeps_a_pinned_copy_and_restores_bf16_weights_exactly(tiny_model_dir):
    model = cuda_peft_model(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    merge = InplaceMerge(model)
    assert all(t.is_pinned() for t in merge.backup.values())
    for _ in range(20):
        with torch.no_grad():
            for p in (p for n, p in model.named_parameters() if "lora_" in n):
                p.add_(0.01 * torch.randn_like(p))
        with merge.merged():
            pass
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if "lora_" not in n)


def test_generation_copy_on_cuda_gives_the_policy_logits_within_bf16_rounding(tiny_model_dir):
    model = cuda_peft_model(tiny_model_dir)
    copy = GenerationCopy(model)
    ids = torch.randint(5, 400, (4, 12), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(copy.model(ids).logits, model(ids).logits, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("quantized", [False, True], ids=["lora", "qlora"])
def test_compiled_copy_training_on_cuda_compiles_the_decode_step_once(tiny_model_dir, tmp_path, quantized):
    from torch._dynamo.utils import counters

    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} plus {i}?" + " more" * (i % 5)}]} for i in range(16)]
    )
    kwargs = small_grpo_kwargs(tmp_path, use_cpu=False, bf16=True, max_steps=4, generation_compile=True,
                               generation_lora_merge="copy", model_init_kwargs={"dtype": torch.bfloat16})  # fmt: skip
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16) if quantized else None
    trainer = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=[length_reward],
        args=GRPOConfig(**kwargs),
        train_dataset=dataset,
        peft_config=LoraConfig(r=4, target_modules="all-linear"),
        quantization_config=quantization,
    )
    assert trainer.generation_config.compile_config.mode == "reduce-overhead"  # CUDA graphs
    counters.clear()
    trainer.train()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    lengths = [r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r]
    assert len(lengths) == 4 and all(0 < n <= 16 for n in lengths)
