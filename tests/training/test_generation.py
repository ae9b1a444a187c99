"""Fast generation (`trl_grpo_ext.generation`): merged LoRA weights without drift, a static cache with a compiled
decode step, the checks that refuse a setting that cannot apply, and training runs with each setting on that match a
run without it (CPU, fp32)."""

import inspect
import logging
import math

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, GenerationConfig
from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer

from tests.conftest import length_reward, small_grpo_kwargs
from tests.resume_check import check_resume
from tests.two_process import full_records, two_process
from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.consumer_gpu import memory
from trl_grpo_ext.generation import device_memory
from trl_grpo_ext.generation import feature as generation_hooks
from trl_grpo_ext.generation.device_memory import copy_weight_bytes, generation_copy_bytes
from trl_grpo_ext.generation.feature import padded_prompt_length
from trl_grpo_ext.generation.lora_merge import GenerationCopy, InplaceMerge, lora_linears, merged_weight
from trl_grpo_ext.generation.static_cache import StaticCaches, StaticCacheSizer, prompt_budget
from trl_grpo_ext.trl_contact import generate_cache_argument

LORA = dict(r=4, lora_alpha=8, target_modules="all-linear")
TIMING_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}
TIMING_KEYS |= {"fast_generation/merge_time"}


def own_bytes(copy: GenerationCopy, policy: torch.nn.Module) -> int:
    """Bytes of the tensors of the generation copy that are its own (merged and dequantized linear weights), measured
    on the tensors: those of `copy.model` that share no storage with a parameter or buffer of `policy`."""
    shared = {t.untyped_storage().data_ptr() for t in [*policy.parameters(), *policy.buffers()]}
    tensors = {t.untyped_storage().data_ptr(): t for t in [*copy.model.parameters(), *copy.model.buffers()]}
    return sum(t.numel() * t.element_size() for address, t in tensors.items() if address not in shared)


def peft_model(model_dir, dtype=torch.float32, seed=0):
    """The tiny model with LoRA on every linear layer and random (non-zero) A and B, so that ΔW != 0."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return get_peft_model(model, LoraConfig(**LORA, init_lora_weights=False))


def base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def greedy(model, input_ids, attention_mask, new_tokens=24):
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)


def merged_greedy(model, mode, input_ids, attention_mask):
    """Greedy completions from `model`'s merged weights: merged in place, or from a generation copy."""
    if mode == "inplace":
        with InplaceMerge(model).merged():
            return greedy(model, input_ids, attention_mask)
    return greedy(GenerationCopy(model).model, input_ids, attention_mask)


def left_padded_prompts(lengths, vocab=400, seed=1):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (len(lengths), max(lengths)), generator=generator)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, max(lengths) - length :] = 1
    return ids * mask, mask


# --- pure functions, against hand-computed values ---


def test_merged_weight_is_base_plus_scaled_lora_product():
    layer = get_peft_model(torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False)), LoraConfig(r=1, lora_alpha=2,
                           target_modules=["0"]))  # fmt: skip
    lora = lora_linears(layer)["base_model.model.0"]
    with torch.no_grad():
        lora.get_base_layer().weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        lora.lora_A["default"].weight.copy_(torch.tensor([[1.0, -1.0]]))  # A: (r=1, d_in=2)
        lora.lora_B["default"].weight.copy_(torch.tensor([[0.5], [2.0]]))  # B: (d_out=2, r=1)
    # W0 + (alpha / r)·B·A = [[1, 2], [3, 4]] + 2·[[0.5, -0.5], [2, -2]] = [[2, 1], [7, 0]]
    torch.testing.assert_close(merged_weight(lora, torch.float32), torch.tensor([[2.0, 1.0], [7.0, 0.0]]))


def test_prompt_budget_rounds_up_to_64_tokens():
    assert [prompt_budget(n) for n in (1, 64, 65, 300)] == [64, 64, 128, 320]


def test_padded_prompt_length_follows_pad_to_multiple_of():
    prompts = [[1] * 5, [1] * 13]
    assert padded_prompt_length(prompts, None) == 13
    assert padded_prompt_length(prompts, 8) == 16


def test_static_cache_sizer_holds_the_budget_and_grows_only_for_a_longer_prompt(caplog):
    config = GenerationConfig(max_new_tokens=16, cache_implementation="static")
    sizer = StaticCacheSizer(config, "cpu")
    # the cache is the caller's (handed to generate), so transformers must not build one of its own
    assert (config.cache_implementation, config.disable_compile, config.max_cache_len) == (None, False, None)
    assert sizer.fit(70) == 128 + 16  # first batch: 70 prompt tokens -> budget 128
    assert (sizer.fit(100), sizer.grown) == (144, 0)
    with caplog.at_level(logging.WARNING):
        assert sizer.fit(129) == 192 + 16
    assert sizer.grown == 1 and "generation_max_prompt_length" in caplog.text
    assert StaticCacheSizer(GenerationConfig(max_new_tokens=16), "cpu", prompt_length=320).fit(10) == 336
    # a budget smaller than the first batch grows before anything was compiled: not counted, not said to recompile
    small = StaticCacheSizer(GenerationConfig(max_new_tokens=16), "cpu", prompt_length=64)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert small.fit(100) == 128 + 16
    assert small.grown == 0 and "grows to 128" in caplog.text and "compiles once more" not in caplog.text
    with caplog.at_level(logging.WARNING):
        assert small.fit(200) == 256 + 16
    assert small.grown == 1 and "compiles once more" in caplog.text


def test_static_caches_keep_one_cache_per_batch_size_and_length_and_reset_it_in_place(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    caches = StaticCaches()
    ids, mask = left_padded_prompts([5, 9])
    config = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)

    def generate(cache):
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                  **{generate_cache_argument(model): cache})  # fmt: skip

    cache = caches.for_generation(model, 2, 32)
    first = generate(cache)  # fills the cache (allocated at the first forward)
    assert torch.equal(first, greedy(model, ids, mask, new_tokens=8))  # what a fresh dynamic cache gives
    keys = [layer.keys.data_ptr() for layer in cache.layers]
    assert all(layer.keys.abs().sum() > 0 for layer in cache.layers)
    again = caches.for_generation(model, 2, 32)
    assert again is cache and caches.built == 1
    assert all(int(layer.cumulative_length) == 0 and layer.keys.abs().sum() == 0 for layer in cache.layers)
    assert torch.equal(generate(again), first)  # the reused cache generates the same tokens
    assert [layer.keys.data_ptr() for layer in cache.layers] == keys  # in place: the same addresses
    other = caches.for_generation(model, 4, 32)  # another batch size: a cache of its own, the first one kept
    assert other is not cache and set(caches.caches) == {(2, 32), (4, 32)}
    longer = caches.for_generation(model, 2, 64)  # a longer cache replaces those of the old length
    assert longer is not cache and set(caches.caches) == {(2, 64)} and caches.built == 3
    assert torch.equal(generate(longer), first)


# --- merging without drift ---


def test_inplace_merge_restores_bf16_base_weights_bit_for_bit_after_100_cycles(tiny_model_dir):
    model = peft_model(tiny_model_dir, dtype=torch.bfloat16)
    before = base_weights(model)
    merge = InplaceMerge(model)
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    for cycle in range(100):
        with torch.no_grad():  # the adapters change between generations, as in training
            for p in adapters:
                p.add_(0.01 * torch.randn_like(p))
        with merge.merged():
            if cycle == 0:  # inside the block the base weights hold W0 + dW
                layer = next(iter(merge.layers.values()))
                assert not torch.equal(layer.get_base_layer().weight, before[_base_name(model, layer)])
    after = base_weights(model)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_inplace_merge_keeps_one_flat_host_buffer_of_exactly_the_adapted_base_weights(tiny_model_dir):
    model = peft_model(tiny_model_dir, dtype=torch.bfloat16)
    merge = InplaceMerge(model)
    weights = [layer.get_base_layer().weight for layer in merge.layers.values()]
    # the tiny model's 2 layers x 7 adapted projections in bf16: q, o 64x64; k, v 32x64 (2 heads of 16); gate, up
    # 128x64; down 64x128: 2 * (2*4096 + 2*2048 + 3*8192) = 73728 elements, 147456 bytes, no block rounded up
    exact = sum(w.numel() * w.element_size() for w in weights)
    assert len(weights) == 14 and exact == 147456 and merge.backup_bytes() == exact
    (buffer,) = merge.buffers  # one dtype: one buffer, (n,)
    assert buffer.dtype == torch.bfloat16 and buffer.dim() == 1 and buffer.untyped_storage().nbytes() == exact
    assert not buffer.is_pinned()  # the model is on the CPU
    # each layer's copy is a view of its weight's shape into the buffer, back to back in layer order
    offset = 0
    for backup, weight in zip(merge.backup.values(), weights, strict=True):
        assert backup.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        assert backup.shape == weight.shape and backup.storage_offset() == offset
        assert torch.equal(backup, weight)
        offset += weight.numel()
    assert offset == buffer.numel()


def test_inplace_merge_keeps_one_host_buffer_per_weight_dtype_and_restores_each_exactly(tiny_model_dir):
    model = peft_model(tiny_model_dir, dtype=torch.bfloat16)
    down = [m.get_base_layer() for n, m in lora_linears(model).items() if n.endswith("down_proj")]
    for linear in down:  # 2 of the 14 adapted layers in fp32, the others bf16
        linear.weight.data = linear.weight.data.float()
    before = base_weights(model)
    merge = InplaceMerge(model)
    assert sorted(str(b.dtype) for b in merge.buffers) == ["torch.bfloat16", "torch.float32"]
    # 2 down_proj of 64x128 in fp32: 2 * 8192 * 4 = 65536 bytes; the other 12 weights in bf16 at 2 bytes each
    fp32 = next(b for b in merge.buffers if b.dtype == torch.float32)
    assert fp32.untyped_storage().nbytes() == 2 * 64 * 128 * 4
    assert merge.backup_bytes() == 2 * 8192 * 4 + (73728 - 2 * 8192) * 2  # 65536 + 114688 = 180224
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    down_name = next(n for n, p in model.named_parameters() if p is down[0].weight)
    for _ in range(3):
        with torch.no_grad():
            for p in adapters:
                p.add_(0.01 * torch.randn_like(p))
        with merge.merged():  # W0 + dW in the fp32 weight too
            assert down[0].weight.dtype == torch.float32 and not torch.equal(down[0].weight, before[down_name])
    after = base_weights(model)
    assert all(torch.equal(before[n], after[n]) and before[n].dtype == after[n].dtype for n in before)


def test_peft_merge_and_unmerge_in_bf16_drift(tiny_model_dir):
    """What the test above guards against: PEFT's own merge_adapter/unmerge_adapter changes bf16 base weights."""
    model = peft_model(tiny_model_dir, dtype=torch.bfloat16)
    before = base_weights(model)
    for _ in range(10):
        model.merge_adapter()
        model.unmerge_adapter()
    after = base_weights(model)
    assert sum(not torch.equal(before[n], after[n]) for n in before) > 0


def _base_name(model, layer) -> str:
    return next(n for n, p in model.named_parameters() if p is layer.get_base_layer().weight)


def test_inplace_merge_restores_the_base_weights_when_generation_fails(tiny_model_dir):
    model = peft_model(tiny_model_dir)
    before = base_weights(model)
    merge = InplaceMerge(model)
    with pytest.raises(RuntimeError, match="boom"), merge.merged():
        raise RuntimeError("boom")
    after = base_weights(model)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert not any(layer.disable_adapters for layer in merge.layers.values())  # adapters are on again


@pytest.mark.parametrize("mode", ["inplace", "copy"])
def test_merged_greedy_completions_equal_the_unmerged_model_token_for_token(tiny_model_dir, mode):
    model = peft_model(tiny_model_dir)
    ids, mask = left_padded_prompts([9, 14, 5, 14])
    unmerged, merged = greedy(model, ids, mask), merged_greedy(model, mode, ids, mask)
    assert torch.equal(merged, unmerged)
    assert merged.shape == (4, 14 + 24)


def test_generation_copy_shares_every_other_tensor_and_follows_the_adapters(tiny_model_dir):
    model = peft_model(tiny_model_dir)
    grad_flags = {n: p.requires_grad for n, p in model.named_parameters()}
    copy = GenerationCopy(model)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grad_flags  # the policy is left as it was
    base = model.get_base_model()
    assert copy.model.get_input_embeddings().weight is base.get_input_embeddings().weight
    assert copy.model.model.norm.weight is base.model.norm.weight
    assert copy.model.model.layers[0].self_attn.q_proj.bias is base.model.layers[0].self_attn.q_proj.base_layer.bias
    # its own weights: every adapted linear layer (7 per layer, 2 layers) in fp32, d_out·d_in each
    assert len(copy.owned) == 14 and own_bytes(copy, model) == generation_copy_bytes(model)
    ids, mask = left_padded_prompts([6, 6])
    with torch.no_grad():
        for p in (p for n, p in model.named_parameters() if "lora_B" in n):
            p.mul_(3.0)
        stale = copy.model(ids, attention_mask=mask).logits
        copy.refresh()
        torch.testing.assert_close(copy.model(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
    assert not torch.allclose(stale, model(ids, attention_mask=mask).logits)


def test_generation_copy_of_a_4bit_model_is_the_dequantized_base_plus_the_adapters(tiny_model_dir):
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, quantization_config=quantization)
    model = get_peft_model(model, LoraConfig(**LORA, init_lora_weights=False))
    copy = GenerationCopy(model)
    assert all(type(m).__name__ != "Linear4bit" for m in copy.model.modules())
    from bitsandbytes.functional import dequantize_4bit

    layer = model.get_base_model().model.layers[1].mlp.down_proj
    expected = dequantize_4bit(layer.base_layer.weight.data, layer.base_layer.weight.quant_state).float()
    expected += layer.get_delta_weight("default")
    torch.testing.assert_close(copy.model.model.layers[1].mlp.down_proj.weight, expected)
    assert own_bytes(copy, model) == generation_copy_bytes(model)


@pytest.mark.parametrize("mode", ["inplace", "copy"])
def test_layers_that_no_active_adapter_adapts_keep_their_base_weight(tiny_model_dir, mode):
    """Two adapters on different layers, one active: the other's layers generate from W0."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["v_proj"], init_lora_weights=False), "old")
    model.add_adapter("new", LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    model.set_adapter("new")
    ids, mask = left_padded_prompts([8, 11])
    assert torch.equal(merged_greedy(model, mode, ids, mask), greedy(model, ids, mask))


def test_inplace_merge_refuses_a_weight_tied_to_the_embeddings(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # the tiny model ties lm_head to the embeddings
    model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ValueError, match="lm_head shares its weight with the embeddings"):
        InplaceMerge(model)
    GenerationCopy(model)  # the copy owns its merged lm_head and leaves the embeddings alone


def test_generation_copy_of_4bit_weights_is_in_bitsandbytes_compute_dtype(tiny_model_dir):
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, quantization_config=quantization)  # fp32 embeddings
    model = get_peft_model(model, LoraConfig(**LORA))
    copy = GenerationCopy(model)
    assert {w.dtype for w in copy.owned.values()} == {torch.bfloat16}
    # 14 adapted linear layers of the tiny model (2 layers x 7) in bf16: q, o 64x64; k, v 64x32; gate, up, down 64x128
    assert own_bytes(copy, model) == generation_copy_bytes(model) == 2 * (2 * 4096 + 2 * 2048 + 3 * 8192) * 2


def test_the_copys_size_is_one_formula_for_the_trainer_and_for_the_estimate(tiny_model_dir):
    # Σ d_in·d_out · bytes: a 64x128 and a 128x64 weight in bf16, (8192 + 8192) · 2 = 32768
    assert copy_weight_bytes([(64, 128), (128, 64)], 2) == 32768
    # The estimate from the config (every decoder linear targeted, bf16) is the trainer's size of the bf16 model's
    # copy and what the copy allocates: 2 layers x (q, o 64x64; k, v 64x32; gate, up, down 64x128) x 2 bytes
    model = peft_model(tiny_model_dir, dtype=torch.bfloat16)
    estimate = memory.generation_copy_bytes(model.get_base_model().config, memory.LINEARS, load_in_4bit=False)
    assert estimate == generation_copy_bytes(model) == 2 * (2 * 4096 + 2 * 2048 + 3 * 8192) * 2
    assert own_bytes(GenerationCopy(model), model) == estimate


def test_unsupported_lora_layers_are_refused_by_name(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    dora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(ValueError, match=r"q_proj uses DoRA"):
        lora_linears(dora)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="no LoRA layer"):
        lora_linears(plain)


# --- the trainer: settings checked, training unchanged ---


def _dataset(n=16):
    # prompts of different lengths, so that the static cache sees several padded lengths
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} plus {i}?" + " and more" * (i % 6)}]} for i in range(n)]
    )


def _trainer(model_dir, output_dir, lora=True, quantized=False, **overrides):
    quantization = None
    if quantized:
        quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    return GRPOTrainer(
        model=model_dir,
        reward_funcs=[length_reward],
        args=GRPOConfig(**small_grpo_kwargs(output_dir, **overrides)),
        train_dataset=_dataset(),
        peft_config=LoraConfig(**LORA) if lora else None,
        quantization_config=quantization,
    )


def _logs(trainer):
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in trainer.state.log_history]


def _assert_same_training(logs_a, logs_b, params_a, params_b, atol=1e-5):
    assert [sorted(r) for r in logs_a] == [sorted(r) for r in logs_b]
    for row_a, row_b in zip(logs_a, logs_b, strict=True):
        for key, value in row_a.items():
            if not (math.isnan(value) and math.isnan(row_b[key])):
                assert abs(value - row_b[key]) <= atol, (row_a.get("step"), key, value, row_b[key])
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], rtol=0, atol=atol)


@pytest.fixture(scope="module")
def baseline_run(tiny_model_dir, tmp_path_factory):
    """Stock generation: 4 steps of LoRA training; logs, the adapters, the completions lengths."""
    trainer = _trainer(tiny_model_dir, tmp_path_factory.mktemp("baseline"), max_steps=4)
    trainer.train()
    return _logs(trainer), {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(
    "levers",
    [
        pytest.param({"generation_lora_merge": "inplace"}, id="inplace"),
        pytest.param({"generation_lora_merge": "copy"}, id="copy"),
        pytest.param({"generation_compile": True}, id="compile"),
        pytest.param({"generation_compile": True, "generation_lora_merge": "inplace"}, id="inplace+compile"),
        pytest.param({"generation_compile": True, "generation_lora_merge": "copy"}, id="copy+compile"),
    ],
)
def test_training_with_a_lever_matches_stock_generation(tiny_model_dir, tmp_path, baseline_run, levers, monkeypatch):
    """Seeded sampling: the same completions, so the same rewards, losses and final adapters, up to the last bits of
    merged vs unmerged matmuls (fp32). With compilation, one static cache serves every generation, at fixed addresses,
    and the decode step compiles once, over prompts of several padded lengths (with the CPU tests' backend,
    tests/cpu_compile.py: dynamo traces the same graphs as with inductor)."""
    import transformers
    from torch._dynamo.utils import counters

    built, seen = [], []  # transformers StaticCaches constructed; (cache, its key addresses) at each generation

    class CountedStaticCache(transformers.StaticCache):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    def for_generation(self, model, batch_size, length):
        cache = StaticCaches_for_generation(self, model, batch_size, length)
        seen.append((id(cache), [layer.keys.data_ptr() for layer in cache.layers if layer.is_initialized]))
        return cache

    StaticCaches_for_generation = StaticCaches.for_generation
    monkeypatch.setattr(transformers, "StaticCache", CountedStaticCache)
    monkeypatch.setattr(StaticCaches, "for_generation", for_generation)
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=4, **levers)
    assert trainer.fast_generation is None  # built at the first generation, where the model then is
    policy_base = base_weights(trainer.model)
    counters.clear()
    trainer.train()
    logs, params = (
        _logs(trainer),
        {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad},
    )
    _assert_same_training(logs, baseline_run[0], params, baseline_run[1])
    after = base_weights(trainer.model)
    assert all(torch.equal(policy_base[n], after[n]) for n in policy_base)  # base weights: bit for bit
    merge_times = [
        row["fast_generation/merge_time"] for row in trainer.state.log_history if "fast_generation/merge_time" in row
    ]
    assert len(merge_times) == (4 if "generation_lora_merge" in levers else 0) and all(t >= 0 for t in merge_times)
    if levers.get("generation_compile"):
        # 4 generations, prompts of several padded lengths: the decode step was compiled once and never again
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
        assert trainer.fast_generation.sizer.grown == 0
        # the probe and 4 generations, one cache: built once, then reset in place with its tensors at the same
        # addresses
        assert len(built) == 1 and trainer.fast_generation.caches.built == 1
        assert len(seen) == 5 and len({cache for cache, _ in seen}) == 1
        assert seen[0][1] == [] and len(seen[1][1]) == 2 and all(keys == seen[1][1] for _, keys in seen[1:]), seen
    else:
        assert built == [] and seen == []  # TRL's dynamic cache, as in stock generation


def test_a_generation_with_each_merge_leaves_the_policy_log_probabilities_unchanged(tiny_model_dir, tmp_path):
    for mode in ("inplace", "copy"):
        trainer = _trainer(tiny_model_dir, tmp_path / mode, generation_lora_merge=mode)
        ids, mask = left_padded_prompts([7, 10])
        with torch.no_grad():
            for p in (p for n, p in trainer.model.named_parameters() if "lora_B" in n):
                p.add_(0.05)  # a trained adapter: dW != 0
            before = trainer.model(ids, attention_mask=mask).logits.log_softmax(-1)
        state = {n: p.detach().clone() for n, p in trainer.model.state_dict().items()}
        trainer._generate_single_turn([[5, 6, 7], [8, 9, 10, 11]], None, {}, 2)
        with torch.no_grad():
            after = trainer.model(ids, attention_mask=mask).logits.log_softmax(-1)
        assert torch.equal(before, after), mode
        assert all(torch.equal(state[n], p) for n, p in trainer.model.state_dict().items()), mode


def test_a_trl_that_no_longer_generates_through_generate_fails_loudly(tiny_model_dir, tmp_path, monkeypatch):
    trainer = _trainer(tiny_model_dir, tmp_path, generation_lora_merge="copy")
    monkeypatch.setattr(TRLGRPOTrainer, "_generate_single_turn", lambda self, *a, **k: ([[1]], None))
    with pytest.raises(RuntimeError, match="no longer generates through unwrapped_model.generate"):
        trainer._generate_single_turn([[5, 6, 7]], None, {}, 1)
    assert "generate" not in vars(trainer.accelerator.unwrap_model(trainer.model))  # the routing was removed


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"generation_lora_merge": "merge"}, r"generation_lora_merge must be one of \['none', 'inplace', 'copy'\]"),
        ({"generation_compile": "maybe"}, "generation_compile must be true or false, got 'maybe'"),
        ({"generation_max_prompt_length": 2.5},
         "generation_max_prompt_length must be an integer >= 1, or None, got 2.5"),
        ({"generation_compile": True, "generation_max_prompt_length": 0}, "must be an integer >= 1, or None, got 0"),
        ({"generation_compile": True, "use_transformers_continuous_batching": True},
         "use_transformers_continuous_batching=True generates another way"),
        ({"generation_lora_merge": "copy", "use_vllm": True}, "use_vllm=True generates another way"),
        ({"generation_compile": True, "cache_implementation": "dynamic"}, "cache_implementation must be unset or"),
        ({"generation_compile": True, "max_completion_length": None},
         "sizes its static cache by max_completion_length, which must then be set, got None"),
        ({"generation_compile": True, "generation_kwargs": {"cache_implementation": "dynamic"}},
         r"remove \['cache_implementation'\] from generation_kwargs"),
    ],
)  # fmt: skip
def test_generation_settings_are_checked_at_config_time(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(**small_grpo_kwargs(tmp_path, **overrides))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lora": False, "generation_lora_merge": "inplace"}, "merges LoRA adapters, but the model has none"),
        ({"quantized": True, "generation_lora_merge": "inplace"}, "cannot merge into bitsandbytes-quantized weights"),
        ({"quantized": True, "generation_compile": True}, "transformers does not compile bitsandbytes"),
        ({"quantized": True, "use_transformers_continuous_batching": True}, "do not survive"),
    ],
)
def test_settings_that_cannot_apply_to_the_model_are_refused_at_init(tiny_model_dir, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _trainer(tiny_model_dir, tmp_path, **kwargs)


def test_a_plain_trl_config_with_a_bad_value_of_ours_is_refused(tiny_model_dir, tmp_path):
    import trl

    args = trl.GRPOConfig(**small_grpo_kwargs(tmp_path))
    args.generation_lora_merge = "bogus"
    with pytest.raises(ValueError, match="generation_lora_merge must be one of"):
        GRPOTrainer(model=tiny_model_dir, reward_funcs=[length_reward], args=args, train_dataset=_dataset())


def test_compile_with_lora_dropout_warns_that_completions_differ(tiny_model_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.generation.feature"):
        GRPOTrainer(
            model=tiny_model_dir,
            reward_funcs=[length_reward],
            args=GRPOConfig(**small_grpo_kwargs(tmp_path, generation_compile=True)),
            train_dataset=_dataset(),
            peft_config=LoraConfig(r=4, target_modules=["q_proj"], lora_dropout=0.1),
        )
    assert "lora_dropout > 0" in caplog.text


def test_a_run_with_compiled_copy_generation_resumes_exactly(tiny_model_dir, tmp_path):
    config = {"lora": 4, "generation_lora_merge": "copy", "generation_compile": True, "num_iterations": 2}
    assert check_resume(config, tmp_path, tiny_model_dir) <= 1e-6


def test_a_generation_copy_that_does_not_fit_beside_training_is_refused_at_the_first_generation(
    tiny_model_dir, tmp_path, monkeypatch
):
    trainer = _trainer(tiny_model_dir, tmp_path, generation_lora_merge="copy", generation_compile=True,
                       generation_fallback=False)  # fmt: skip
    policy = trainer.accelerator.unwrap_model(trainer.model)
    copy_bytes = generation_copy_bytes(policy)
    # gradients and AdamW's two moments of the fp32 adapters, and the static cache: 8 sequences of (64 + 16) tokens,
    # K and V of 2 layers, 2 heads of 16 fp32 numbers each
    adapters = sum(p.numel() * 4 for p in policy.parameters() if p.requires_grad)
    upcoming = 3 * adapters + 8 * 80 * 2 * 2 * 2 * 16 * 4
    assert device_memory.training_still_allocates(trainer, policy, 80) == upcoming
    monkeypatch.setattr(device_memory, "free_device_memory", lambda device: copy_bytes + upcoming - 1)  # bytes
    with pytest.raises(ValueError, match=r"needs 0\.00 GiB for the generation copy, and training will allocate at"):
        trainer._generate_single_turn([[5, 6, 7], [8, 9, 10, 11]], None, {}, 2)  # padded to 4 tokens: budget 64
    monkeypatch.setattr(device_memory, "free_device_memory", lambda device: copy_bytes + upcoming)
    trainer._generate_single_turn([[5, 6, 7], [8, 9, 10, 11]], None, {}, 2)


def test_fast_generation_is_built_where_the_model_is_at_the_first_generation(tiny_model_dir, tmp_path):
    """As under DeepSpeed (which moves the model in `train()`), the model changes after `__init__`: here its dtype,
    to bf16. What fast generation builds follows the model at the first generation: the in-place merge's host copy
    and the generation copy in bf16, the compile settings set then and not before."""
    for mode in ("inplace", "copy"):
        trainer = _trainer(tiny_model_dir, tmp_path / mode, generation_lora_merge=mode, generation_compile=True)
        assert trainer.fast_generation is None and trainer.generation_config.disable_compile  # TRL's, untouched
        trainer.model.to(torch.bfloat16)  # moved after __init__
        policy = trainer.accelerator.unwrap_model(trainer.model)
        fast = generation_hooks.FastGeneration.setup(trainer, policy, longest_prompt=10)
        assert fast.device == next(policy.parameters()).device and fast.sizer is not None
        assert not trainer.generation_config.disable_compile and trainer.generation_config.cache_implementation is None
        if mode == "inplace":
            assert all(t.dtype == torch.bfloat16 for t in fast.merge.backup.values())
            for name, layer in fast.merge.layers.items():
                assert torch.equal(fast.merge.backup[name], layer.get_base_layer().weight.detach())
        else:
            assert all(w.dtype == torch.bfloat16 for w in fast.merge.owned.values())
            assert next(fast.merge.model.parameters()).dtype == torch.bfloat16


def test_the_generation_copy_is_of_the_policys_own_class(tiny_model_dir):
    """A subclass's forward is the model the user trains: the copy generates through it too."""
    from transformers import Qwen2ForCausalLM

    class Boosted(Qwen2ForCausalLM):
        def forward(self, *args, **kwargs):
            output = super().forward(*args, **kwargs)
            output.logits[..., 100] += 1e4  # token 100 always wins
            return output

    torch.manual_seed(0)
    model = get_peft_model(Boosted.from_pretrained(tiny_model_dir), LoraConfig(**LORA, init_lora_weights=False))
    copy = GenerationCopy(model)
    assert type(copy.model) is Boosted
    ids, mask = left_padded_prompts([4, 6])
    completions = greedy(copy.model, ids, mask, new_tokens=4)[:, -4:]
    assert completions.eq(100).all(), completions


def test_a_generate_the_user_set_on_the_policy_is_put_back(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, generation_lora_merge="copy")
    policy = trainer.accelerator.unwrap_model(trainer.model)
    original = policy.generate

    def users_generate(*args, **kwargs):
        return original(*args, **kwargs)

    policy.generate = users_generate
    trainer._generate_single_turn([[5, 6, 7], [8, 9, 10, 11]], None, {}, 2)
    assert vars(policy)["generate"] is users_generate


def test_the_cache_keyword_is_the_models_or_transformers(tiny_model_dir):
    from transformers.generation.utils import GenerationMixin

    keyword = generate_cache_argument(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    assert keyword in inspect.signature(AutoModelForCausalLM.from_pretrained(tiny_model_dir).forward).parameters

    class TakesKwargs(torch.nn.Module):  # a forward that passes the cache on through **kwargs
        def forward(self, input_ids=None, **kwargs):
            return input_ids

    assert (
        generate_cache_argument(TakesKwargs())
        in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    )


def test_compile_with_tools_is_refused_at_init(tiny_model_dir, tmp_path):
    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    with pytest.raises(ValueError, match=r"generation_compile=True with tools or environment_factory \(multi-turn\)"):
        GRPOTrainer(
            model=tiny_model_dir,
            reward_funcs=[length_reward],
            args=GRPOConfig(**small_grpo_kwargs(tmp_path, generation_compile=True)),
            train_dataset=_dataset(),
            tools=[add],
        )


def test_continuous_batching_warns_that_fp32_adapters_become_bf16(tiny_model_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_grpo_ext.generation.feature"):
        _trainer(tiny_model_dir, tmp_path, use_transformers_continuous_batching=True, bf16=True)
    assert "fp32 trainable parameters" in caplog.text and "lora_A" in caplog.text


def test_qlora_trains_with_the_generation_copy_and_compiled_decoding(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, quantized=True, generation_lora_merge="copy", generation_compile=True)
    trainer.train()
    assert all(type(m).__name__ != "Linear4bit" for m in trainer.fast_generation.merge.model.modules())
    lengths = [row["completions/mean_length"] for row in trainer.state.log_history if "completions/mean_length" in row]
    assert len(lengths) == 3 and all(0 < n <= 16 for n in lengths)


# --- two processes ---


TWO_PROCESS_BASE = {"lora": 4, "max_steps": 3, "save_steps": 3, "per_device_train_batch_size": 4}
TWO_PROCESS_LEVERS = {
    "inplace-compile": {"generation_lora_merge": "inplace", "generation_compile": True},
    "copy": {"generation_lora_merge": "copy"},
}


@two_process("generation_stock", TWO_PROCESS_BASE)
@two_process("generation_inplace-compile", {**TWO_PROCESS_BASE, **TWO_PROCESS_LEVERS["inplace-compile"]})
@two_process("generation_copy", {**TWO_PROCESS_BASE, **TWO_PROCESS_LEVERS["copy"]})
def test_each_lever_on_two_processes_matches_stock_generation(two_process_runs):
    """DDP on 2 CPU processes (gloo): the in-place merge with a compiled decode step, and the generation copy, each
    train as stock generation does, on both ranks. The three runs are scenarios "generation_*" of the suite's shared
    two-process job (tests/two_process.py)."""
    stock = full_records(two_process_runs["generation_stock"])
    for name in TWO_PROCESS_LEVERS:
        fast = full_records(two_process_runs[f"generation_{name}"])
        for rank in (0, 1):
            logs = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in fast[rank]["logs"]]
            stock_logs = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in stock[rank]["logs"]]
            _assert_same_training(logs, stock_logs, fast[rank]["params"], stock[rank]["params"])
            assert fast[rank]["prompts"] == stock[rank]["prompts"]


def test_repeated_input_grad_hooks_are_cut_with_fast_generation_and_pile_up_without(tiny_model_dir, tmp_path):
    """Stock TRL 1.16 + transformers 5 add two identical hooks to the input embeddings per step (gradient
    checkpointing re-enabled around each generation and no-grad pass); with a lever on, one is kept per generation."""
    counts = {}
    for name, levers in (("stock", {}), ("copy", {"generation_lora_merge": "copy"})):
        trainer = _trainer(tiny_model_dir, tmp_path / name, max_steps=4, gradient_checkpointing=True, **levers)
        trainer.train()
        hooks = trainer.model.get_input_embeddings()._forward_hooks.values()
        counts[name] = sum(getattr(fn, "__name__", "") == "make_inputs_require_grads" for fn in hooks)
    assert counts["stock"] >= 2 * 4, counts
    assert counts["copy"] <= 3, counts  # the one kept, plus the two added after the last generation


# --- the GPU throughput benchmark, in its CPU smoke mode ---


def load_throughput_benchmark():
    import importlib.util

    from tests.conftest import REPO_ROOT

    path = REPO_ROOT / "benchmarks" / "generation" / "gpu_throughput.py"
    spec = importlib.util.spec_from_file_location("gpu_throughput", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def results_snapshot(folder) -> tuple[dict, str | None]:
    """(every file under `folder` with its size and mtime, `git status --porcelain` of it or None without git)."""
    import shutil
    import subprocess

    from tests.conftest import REPO_ROOT

    files = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        return files, None
    cmd = ["git", "status", "--porcelain", "--untracked-files=all", "--", str(folder)]
    return files, subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout


def test_gpu_throughput_benchmark_runs_in_cpu_smoke_mode(tmp_path, monkeypatch):
    """`benchmarks/generation/gpu_throughput.py --device cpu --tiny`: four configurations of the 8 GB preset (stock,
    the preset, in-place merge, QLoRA with copy and compile; every configuration's training is checked against stock
    generation above), each in its own process, with timings, tokens and the estimate; the table and JSON written, by
    default into the temp directory: a smoke run leaves the tracked benchmarks/generation/results/ as it was."""
    import json
    import tempfile

    from tests.conftest import REPO_ROOT

    benchmark = load_throughput_benchmark()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the system's temp directory, for this run
    results = REPO_ROOT / "benchmarks" / "generation" / "results"
    before = results_snapshot(results)
    configs = ["stock", "preset", "inplace", "qlora_copy_compile"]
    argv = ["--device", "cpu", "--tiny", "--steps", "2", "--presets", "8gb", "--configs", *configs]  # no --output-dir
    assert benchmark.main(argv) == 0
    # Nothing written, changed or added under benchmarks/generation/results/ (other work may have left it dirty:
    # compared with before the run), and git sees no file of this benchmark there as changed.
    after = results_snapshot(results)
    assert after == before
    assert after[1] is None or "gpu_throughput" not in after[1], after[1]
    out = tmp_path / "trl-grpo-ext-benchmarks"
    rows = json.loads((out / "gpu_throughput_tiny.json").read_text())["rows"]
    assert [r["config"] for r in rows] == [config for _, config in benchmark.plan(["8gb"], configs)]
    assert sorted(r["config"] for r in rows) == sorted(configs)
    by_config = {r["config"]: r for r in rows}
    for row in rows:
        assert "error" not in row, row
        # 8 completions × 16 tokens a step (forced to full length), a measured step after the first
        assert row["completion_tokens_per_step"] == 8 * 16 and row["tokens_per_s"] > 0
        assert 0 < row["generation_s"] < row["step_s"] and row["estimate_gib"] > 0
    assert by_config["stock"]["speedup"] == 1.0 and by_config["stock"]["generation"] == "dynamic cache, adapter layers"
    assert by_config["preset"]["generation"] == "compiled static cache, merged in place"
    assert by_config["qlora_copy_compile"]["method"] == "QLoRA r=16"
    assert by_config["inplace"]["merge_s"] > 0 and by_config["stock"]["merge_s"] == 0
    table = (out / "gpu_throughput_tiny.md").read_text()
    row = "| 8gb | preset | Qwen/Qwen2.5-1.5B-Instruct (tiny: 2 layers), LoRA r=16 | compiled static cache, merged in "
    assert row in table


def test_gpu_benchmarks_write_only_measurements_into_the_tracked_results(monkeypatch, tmp_path):
    import tempfile

    load_throughput_benchmark()  # puts the repository root on sys.path
    from benchmarks import harness

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert harness.results_dir(None, tiny=True) == tmp_path / "trl-grpo-ext-benchmarks"  # a smoke run
    assert harness.results_dir(None, tiny=False) == harness.REPO_ROOT / "benchmarks" / "generation" / "results"
    assert harness.results_dir("somewhere", tiny=True) == harness.Path("somewhere")  # --output-dir wins


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given on a machine without CUDA")
def test_gpu_throughput_benchmark_without_cuda_says_so_with_exit_code_2(capsys):
    assert load_throughput_benchmark().main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
