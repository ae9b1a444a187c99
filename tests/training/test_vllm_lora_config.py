"""Issue #59.5: `vllm_lora_sync="adapter"` is refused, in one line naming the field and the value, where it cannot
act: without vLLM, in server mode, with sleep mode, under FSDP, without a PEFT LoRA model, with an adapter vLLM
cannot load. Its default is TRL's merge (`merge`), for which nothing changes. These need no vLLM: the refusals come
before TRL builds an engine (tests/engines/test_vllm.py runs the setting for real)."""

import pytest
from datasets import Dataset
from peft import LoraConfig

from tests.conftest import length_reward, small_grpo_kwargs
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.gsm8k.data import synthetic_gsm8k, to_grpo_rows
from trl_grpo_ext.vllm_lora.adapter import adapter_problem, max_lora_rank

ADAPTER = {"use_vllm": True, "vllm_mode": "colocate", "vllm_lora_sync": "adapter"}


def test_the_default_is_trls_merge(tmp_path):
    assert GRPOConfig(**small_grpo_kwargs(tmp_path)).vllm_lora_sync == "merge"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"use_vllm": False}, r"vllm_lora_sync='adapter' hands the LoRA adapter to vLLM: set use_vllm=True"),
        ({"vllm_mode": "server"}, r"vllm_lora_sync='adapter' needs vllm_mode='colocate', got 'server': .*NCCL"),
        ({"vllm_enable_sleep_mode": True}, r"vllm_lora_sync='adapter' .*vllm_enable_sleep_mode=True"),
        ({"fsdp": "full_shard"}, r"vllm_lora_sync='adapter' .*sharded under FSDP, from the fsdp argument"),
    ],
    ids=["no-vllm", "server", "sleep", "fsdp"],
)
def test_the_config_refuses_adapter_sync_where_it_cannot_act(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**small_grpo_kwargs(tmp_path, **{**ADAPTER, **settings}))


def test_the_trainer_refuses_adapter_sync_without_a_peft_lora_model(tmp_path, tiny_model_dir):
    args = GRPOConfig(**small_grpo_kwargs(tmp_path, **ADAPTER))
    dataset = Dataset.from_list(to_grpo_rows(synthetic_gsm8k(8, seed=0)))
    with pytest.raises(ValueError, match=r"vllm_lora_sync='adapter' syncs a LoRA adapter: pass peft_config=.*got str"):
        GRPOTrainer(tiny_model_dir, length_reward, args, dataset)
    dora = LoraConfig(r=8, target_modules=["q_proj"], use_dora=True)
    with pytest.raises(
        ValueError, match=r"vllm_lora_sync='adapter': the LoRA adapter cannot be loaded by vLLM: .*DoRA"
    ):
        GRPOTrainer(tiny_model_dir, length_reward, args, dataset, peft_config=dora)


@pytest.mark.parametrize(
    ("config", "cause"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save=['lm_head']"),
        ({"bias": "lora_only"}, "bias='lora_only'"),
        ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"),
    ],
)
def test_what_vllm_cannot_load_is_named(config, cause):
    assert cause in adapter_problem(LoraConfig(r=8, target_modules=["q_proj"], **config))
    assert adapter_problem(LoraConfig(r=8, target_modules=["q_proj"])) is None


def test_max_lora_rank_is_the_smallest_vllm_allows_above_r():
    ranks = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm 0.30's MaxLoRARanks
    assert [max_lora_rank(r, ranks) for r in (1, 4, 8, 9, 300, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(ValueError, match="r=513 is above vLLM's largest max_lora_rank"):
        max_lora_rank(513, ranks)
