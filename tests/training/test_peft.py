"""LoRA and QLoRA (bitsandbytes NF4) training on CPU: only adapter weights change; gradient checkpointing works."""

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import BitsAndBytesConfig

from tests.conftest import length_reward, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().float().clone() for name, p in model.named_parameters()}


def _train_and_diff(trainer) -> tuple[set[str], set[str]]:
    before = _snapshot(trainer.model)
    trainer.train()
    after = _snapshot(trainer.model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    return changed, set(before) - changed


@pytest.mark.parametrize("gradient_checkpointing", [False, True], ids=["plain", "grad-ckpt"])
def test_qlora_nf4_trains_only_the_adapter(tiny_model_dir, tmp_path, gradient_checkpointing):
    args = GRPOConfig(
        **small_grpo_kwargs(tmp_path, gradient_checkpointing=gradient_checkpointing, learning_rate=5e-2),
        model_init_kwargs={"dtype": torch.float32},
    )
    trainer = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=[length_reward],
        args=args,
        train_dataset=Dataset.from_list(to_grpo_rows(synthetic_gsm8k(24))),
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        ),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    )
    linear4bit = [m for m in trainer.model.modules() if type(m).__name__ == "Linear4bit"]
    assert linear4bit and all(m.weight.quant_type == "nf4" for m in linear4bit)
    base_4bit = {
        n: m.weight.data.clone() for n, m in trainer.model.named_modules() if type(m).__name__ == "Linear4bit"
    }

    changed, unchanged = _train_and_diff(trainer)

    assert changed, "no parameter changed"
    assert all("lora_" in n for n in changed), sorted(changed - {n for n in changed if "lora_" in n})
    assert any("lora_B" in n for n in changed)  # B starts at zero, so a change proves a real update
    for name, module in trainer.model.named_modules():
        if name in base_4bit:
            assert torch.equal(module.weight.data, base_4bit[name])  # the quantized base weights stay as they were


def test_lora_with_gradient_checkpointing(tiny_model_dir, tmp_path):
    """The 'element 0 of tensors does not require grad' failure class: frozen embeddings + checkpointing + LoRA."""
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, gradient_checkpointing=True, learning_rate=5e-2, max_steps=2))
    trainer = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=[length_reward],
        args=args,
        train_dataset=Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16))),
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    changed, _ = _train_and_diff(trainer)
    assert changed and all("lora_" in n for n in changed)
    assert all(row["grad_norm"] > 0 for row in trainer.state.log_history if "grad_norm" in row)


def test_an_adapter_loaded_frozen_is_refused_with_the_cause_and_the_fix(tiny_model_dir, tmp_path):
    """PEFT's `PeftModel.from_pretrained(base, adapter_dir)` loads the adapters with `is_trainable=False`: stock TRL
    trains such a model for as many steps as asked, its optimizer holding no parameter (huggingface/trl#6700). The
    trainer refuses it at init; loaded with `is_trainable=True`, the same adapter trains."""
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter_dir = tmp_path / "adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=4)).save_pretrained(adapter_dir)
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(16)))
    args = GRPOConfig(**small_grpo_kwargs(tmp_path / "run", max_steps=1))

    frozen = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir)
    assert not any(p.requires_grad for p in frozen.parameters())
    with pytest.raises(ValueError, match=r"loaded without is_trainable=True .* is_trainable=True\), or pass the base"):
        GRPOTrainer(model=frozen, reward_funcs=[length_reward], args=args, train_dataset=dataset)

    frozen.base_model.model.lm_head.requires_grad_(True)  # another part trainable: the adapters still never train
    with pytest.raises(ValueError, match=r"LoRA adapters are frozen: they were loaded without is_trainable=True"):
        GRPOTrainer(model=frozen, reward_funcs=[length_reward], args=args, train_dataset=dataset)

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).requires_grad_(False)
    with pytest.raises(ValueError, match=r"\(Qwen2ForCausalLM\) has no trainable parameter"):
        GRPOTrainer(model=plain, reward_funcs=[length_reward], args=args, train_dataset=dataset)

    trainable = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir,
                                          is_trainable=True)  # fmt: skip
    changed, _ = _train_and_diff(
        GRPOTrainer(model=trainable, reward_funcs=[length_reward], args=args, train_dataset=dataset)
    )
    assert changed and all("lora_" in n for n in changed)
