"""fp16 training on CUDA (skipped without it): the T4 preset's recipe (LoRA on fp16 weights, `fp16=True`) and the
quickstart notebook's fp16 path (a 4-bit model whose adapters go back to fp32 before training), each a few GRPO
steps with a finite loss that move the adapters; and `presets.training_precision` against the card's capability."""

import math

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import BitsAndBytesConfig

from tests.conftest import length_reward, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.consumer_gpu import presets

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DATASET = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} plus {i}?"}]} for i in range(16)])


def test_training_precision_follows_the_compute_capability():
    major, _ = torch.cuda.get_device_capability()
    assert presets.training_precision() == ("bf16" if major >= 8 else "fp16")


def _train_fp16(model_dir, output_dir, quantization=None, adapters_to_fp32=False) -> GRPOTrainer:
    kwargs = small_grpo_kwargs(output_dir, use_cpu=False, bf16=False, fp16=True, max_steps=5, learning_rate=1e-3,
                               model_init_kwargs={"dtype": torch.float16})  # fmt: skip
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[length_reward],
        args=GRPOConfig(**kwargs),
        train_dataset=DATASET,
        peft_config=LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False),
        quantization_config=quantization,
    )
    if adapters_to_fp32:  # the notebook's cell: TRL made a 4-bit model's adapters bf16
        for param in trainer.model.parameters():
            if param.requires_grad:
                param.data = param.data.float()
    return trainer


@pytest.mark.parametrize("quantized", [False, True], ids=["t4_preset_lora_fp16", "notebook_qlora_fp16"])
def test_fp16_grpo_steps_are_finite_and_move_fp32_adapters(tiny_model_dir, tmp_path, quantized):
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16) if quantized else None
    trainer = _train_fp16(tiny_model_dir, tmp_path, quantization, adapters_to_fp32=quantized)
    adapters = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapters and all(p.dtype == torch.float32 for p in adapters.values())  # what fp16's GradScaler unscales
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == 5 and all(math.isfinite(loss) for loss in losses), losses
    moved = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, adapters[n])]
    assert moved, "no adapter weight changed in 5 fp16 steps (each one skipped by the loss scaler?)"
