"""The memory estimator: hand-computed terms, how it scales, the saved tensors it models, the presets, the command."""

import re

import pytest
import torch
from transformers import Qwen2Config

from tests.conftest import REPO_ROOT
from trl_grpo_ext import GRPOConfig, cli
from trl_grpo_ext.cli import optional_dependencies as dependencies
from trl_grpo_ext.consumer_gpu import memory, presets
from trl_grpo_ext.consumer_gpu.memory import GIB
from trl_grpo_ext.consumer_gpu.presets import MemoryFitWarning

PRESETS = sorted((REPO_ROOT / "recipes" / "configs").glob("gsm8k-*.yaml"))
T4_GIB = 14.75  # what torch reports for a 16 GB T4 (its total_memory, ECC on), as out-of-memory errors on Colab say
# h=64, I=128, 2 layers, 4 heads of 16, 2 kv heads, vocabulary 1000, tied embeddings
SMALL = Qwen2Config(
    vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, tie_word_embeddings=True,
)  # fmt: skip


def small_args(tmp_path, **overrides) -> GRPOConfig:
    """b=2 completions per micro-batch, 8 generated at once (2 x 4 accumulation steps), completions of 8 tokens."""
    kwargs = dict(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=2, num_generations=2,
        gradient_accumulation_steps=4, max_completion_length=8, optim="paged_adamw_8bit", report_to="none",
    )  # fmt: skip
    return GRPOConfig(**{**kwargs, **overrides})


def small_estimate(tmp_path, args_overrides=None, **kwargs):
    kwargs = {"prompt_length": 8, "lora_r": 4, "lora_target_modules": ["q_proj", "v_proj"], **kwargs}
    return memory.estimate(SMALL, small_args(tmp_path, **(args_overrides or {})), **kwargs)


def test_parameter_counts_and_weights_by_hand():
    # Linear weights per layer: q 64·64 + k 64·32 + v 64·32 + o 64·64 + gate, up, down 3·64·128 = 36864; 2 layers.
    # Other: embeddings 1000·64 = 64000 (tied: once) + per layer 2 norms (128), q/k/v biases (64+32+32); final norm.
    assert memory.parameter_counts(SMALL) == (73728, 64000 + 2 * (128 + 128) + 64)
    # LoRA r=4 on q (64 -> 64) and v (64 -> 32): 4·128 + 4·96 = 896 per layer, 1792 in all.
    assert memory.lora_parameters(SMALL, 4, ("q_proj", "v_proj")) == 1792
    # NF4 with double quantization: 4 + 8/64 + 32/(64·256) = 4.127 bits (QLoRA, arXiv:2305.14314, Sec. 3); 0.5 without.
    assert memory.NF4_BITS[True] == pytest.approx(4.127, abs=1e-3) and memory.NF4_BITS[False] == 4.5


def test_estimator_matches_hand_computed_terms(tmp_path):
    """QLoRA r=4 on q_proj/v_proj, b=2, 8 generated at once, prompt 8 + completion 8 tokens, checkpointing on."""
    est = small_estimate(tmp_path, load_in_4bit=True)
    # Weights: 73728 linear weights · 4.126953125 / 8 = 38034 bytes + 64576 bf16 others · 2 = 129152.
    assert est.weights * GIB == pytest.approx(38034 + 129152)
    # Adapters and gradients: 1792 bf16 parameters (TRL casts QLoRA adapters to bf16) = 3584 bytes each.
    assert est.adapters * GIB == pytest.approx(3584) and est.gradients * GIB == pytest.approx(3584)
    # Paged 8-bit AdamW: 2 one-byte states = 3584, plus 7 blocks of 256 · 2 fp32 absmaxes = 56.
    assert est.optimizer * GIB == pytest.approx(3640)
    # One layer, per token (b·s = 2·16 = 32 tokens): 2 RMSNorm fp32 inputs + rsqrt 2·(4·64 + 4) = 520; SwiGLU 3·2·128
    # = 768; SDPA q, repeated k and v, output 2·4·64 = 512, logsumexp 4·4 = 16, bf16 mask bias 2·16 = 32; q/v's shared
    # input 2·64 = 128; LoRA A outputs 2·4·2 = 16. 1992 bytes · 32 tokens = 63744.
    layer = 63744
    # Checkpointing: layer inputs 2 layers · 2·64·32 = 8192 + one layer recomputed 63744 + backward gradients
    # 32·2·(3·128 + 2·64) = 32768 + final norm fp32 input 32·4·64 = 8192.
    assert est.activations * GIB == pytest.approx(8192 + layer + 32768 + 8192)
    # LM head: 16 completion tokens; tile 16 · 1000 · 2 = 32000 + hidden 16·64·2 + its fp32 gradient 16·64·4 = 6144.
    assert est.logits * GIB == pytest.approx(32000 + 6144)
    # KV cache: 2 · 2 layers · 2 kv heads · 16 · 2 bytes = 256 a token. Decoding end: 8 sequences · 16 tokens = 32768
    # + one layer's concatenation copy 16384; logits 8 · 1000 · (2 + 12) = 112000. It beats the prefill's
    # 256·64 + 8·8·2·max(7·64, 2·64 + 3·128) = 16384 + 65536.
    assert est.kv_cache * GIB == pytest.approx(49152) and est.generation_workspace * GIB == pytest.approx(112000)
    assert est.reference_model == 0 and est.vllm == 0 and est.overhead == memory.OVERHEAD_GIB
    # Peak: resident + the generation phase (161152 > training 3584 + 112896 + 38144 = 154624).
    assert est.total == pytest.approx(memory.OVERHEAD_GIB + (167186 + 3584 + 3640 + 161152) / GIB)


def test_fast_generation_terms_by_hand(tmp_path):
    """The same run with each fast-generation setting (LoRA r=4 on q_proj/v_proj, 8 sequences, prompt 8 + 8)."""
    stock = small_estimate(tmp_path)
    assert (stock.generation_copy, stock.compile_workspace) == (0, 0)
    # A bf16 generation copy of q (64·64) and v (64·32) in 2 layers: 2 · 6144 · 2 bytes = 24576, always resident.
    copy = small_estimate(tmp_path, {"generation_lora_merge": "copy"})
    assert copy.generation_copy * GIB == pytest.approx(24576)
    assert copy.total - stock.total == pytest.approx(24576 / GIB)
    # With 4-bit weights every decoder linear is dequantized into the copy: 2 · 36864 · 2 = 147456.
    qcopy = small_estimate(tmp_path, {"generation_lora_merge": "copy"}, load_in_4bit=True)
    assert qcopy.generation_copy * GIB == pytest.approx(147456)
    # In place: the copy of the base weights is in host memory, nothing on the GPU. On the host, per process: q (64·64)
    # and v (64·32) base weights in 2 layers at 2 bytes, 2 · 6144 · 2 = 24576 bytes exactly, outside the GPU terms.
    inplace = small_estimate(tmp_path, {"generation_lora_merge": "inplace"})
    assert inplace.total == stock.total and inplace.terms() == stock.terms()
    assert inplace.host_pinned * GIB == 24576 and stock.host_pinned == copy.host_pinned == 0
    (line,) = [line for line in inplace.as_table().splitlines() if line.startswith("host_pinned")]
    assert "host RAM per process (per DDP rank), page-locked" in line and line.endswith(" 24576 bytes")
    assert "host_pinned" not in stock.as_table()
    # Compiled: a static cache of 8 sequences · (prompt 8 rounded up to 64, + 8) tokens · 256 bytes = 147456, whole
    # from the first prefill and kept for the run (resident, no KV cache in the generation phase); the workspace is
    # the larger of prefill 65536 and decode 112000; the CUDA-graph pool 8 · (1000 + 3·128 + 4·64) · 2 = 26240,
    # always resident.
    compiled = small_estimate(tmp_path, {"generation_compile": True})
    assert compiled.static_cache * GIB == pytest.approx(147456) and compiled.kv_cache == 0
    assert compiled.generation_workspace * GIB == 112000
    assert compiled.compile_workspace * GIB == pytest.approx(26240)
    resident = stock.persistent + (147456 + 26240) / GIB
    assert compiled.persistent == pytest.approx(resident)
    assert compiled.total == pytest.approx(resident + max(compiled.training, 112000 / GIB))
    # A fixed prompt budget sizes the cache: (100 + 8) · 8 · 256 = 221184.
    budget = small_estimate(tmp_path, {"generation_compile": True, "generation_max_prompt_length": 100})
    assert budget.static_cache * GIB == pytest.approx(221184)
    # A prompt longer than the budget grows the cache to the next multiple of 64, as the trainer does: 128 + 8.
    fixed = {"generation_compile": True, "generation_max_prompt_length": 64}
    longer = small_estimate(tmp_path, fixed, prompt_length=70)
    assert longer.static_cache * GIB == pytest.approx(8 * 136 * 256)
    # What the trainer refuses, the estimate refuses too, in the same words.
    for overrides, kwargs, match in (
        ({"generation_lora_merge": "copy"}, {"lora_r": None}, "merges LoRA adapters, but the model has none"),
        ({"generation_lora_merge": "inplace"}, {"load_in_4bit": True}, "cannot merge into bitsandbytes-quantized"),
        ({"generation_compile": True}, {"load_in_4bit": True}, "does not compile bitsandbytes-quantized"),
    ):
        with pytest.raises(ValueError, match=match):
            small_estimate(tmp_path, overrides, **kwargs)


def test_prompt_skip_keeps_a_second_static_cache_for_the_half_batch(tmp_path):
    """b=2, G=2, 4 accumulation steps: 8 sequences of 4 prompts a generation; static cache (64 + 8) tokens."""
    fields = {"generation_compile": True, "prompt_skip": True, "remove_unused_columns": False}
    # The skipping layout's quantum: 1 process x 4 micro-batches = 4 slots, 4 / gcd(G=2, 4) = 2 prompts; half of the 4
    # drawn prompts is 2, a multiple of it, so a batch holds 4 or 2 prompts: caches of 8 and 4 sequences, both kept
    # for the run. 256 bytes a token: 8 · 72 · 256 = 147456 and 4 · 72 · 256 = 73728.
    skipping = small_estimate(tmp_path, fields)
    assert skipping.static_cache * GIB == pytest.approx(147456 + 73728)
    assert memory.static_cache_batches(small_args(tmp_path, **fields), 8) == [8, 4]
    compiled = small_estimate(tmp_path, {"generation_compile": True})
    assert compiled.static_cache * GIB == pytest.approx(147456)
    assert skipping.total - compiled.total == pytest.approx(73728 / GIB)  # resident: the peak grows by the second
    # Refilling keeps every batch whole: one cache.
    refill = small_estimate(tmp_path, {**fields, "prompt_skip_refill": True})
    assert refill.static_cache * GIB == pytest.approx(147456)
    # 3 accumulation steps: 6 sequences of 3 prompts; quantum 3 / gcd(2, 3) = 3 prompts, and half of 3 is no multiple
    # of it, so the batch keeps all 3 prompts (skipped ones put back): one cache of 6 · 72 · 256 = 110592.
    odd = small_estimate(tmp_path, {**fields, "gradient_accumulation_steps": 3})
    assert odd.static_cache * GIB == pytest.approx(110592)
    # Without compilation there is no static cache to keep.
    assert small_estimate(tmp_path, {"prompt_skip": True, "remove_unused_columns": False}).static_cache == 0


def test_continuous_batching_takes_its_share_of_what_is_left(tmp_path):
    args = {"use_transformers_continuous_batching": True}
    with pytest.raises(ValueError, match="continuous batching needs card_gib"):
        small_estimate(tmp_path, args)
    est = small_estimate(tmp_path, args, card_gib=4)
    resident = est.weights + est.adapters + est.optimizer  # the model and optimizer TRL has loaded by then
    assert est.kv_cache == pytest.approx(0.5 * (4 - resident - memory.OVERHEAD_GIB))


def test_plain_lora_keeps_fp32_adapters_and_torch_adamw_three_copies(tmp_path):
    est = small_estimate(tmp_path, args_overrides={"optim": "adamw_torch"})
    assert est.weights * GIB == pytest.approx((73728 + 64576) * 2)  # bf16
    assert est.adapters * GIB == pytest.approx(1792 * 4)  # PEFT upcasts adapters on a bf16 model
    assert est.optimizer * GIB == pytest.approx(1792 * 3 * 4)  # exp_avg, exp_avg_sq, one foreach temporary


@pytest.mark.parametrize(
    ("field", "small", "large"),
    [("max_completion_length", 8, 32), ("per_device_train_batch_size", 2, 4), ("generation_batch_size", 8, 16)],
)
def test_estimate_grows_with_lengths_and_batches(tmp_path, field, small, large):
    a = small_estimate(tmp_path, args_overrides={field: small})
    b = small_estimate(tmp_path, args_overrides={field: large})
    assert b.total > a.total
    assert b.kv_cache + b.generation_workspace > a.kv_cache + a.generation_workspace or b.training > a.training


def test_more_generations_per_prompt_grow_the_generation_batch_only(tmp_path):
    # TRL counts completions, not prompts: 4 prompts x G generations are generated at once; the micro-batch stays 2.
    two = small_estimate(tmp_path, args_overrides={"num_generations": 2, "generation_batch_size": 4 * 2})
    four = small_estimate(tmp_path, args_overrides={"num_generations": 4, "generation_batch_size": 4 * 4})
    assert four.kv_cache == pytest.approx(2 * two.kv_cache)
    assert four.generation_workspace == pytest.approx(2 * two.generation_workspace)
    assert four.training == pytest.approx(two.training) and four.total > two.total


def test_estimate_grows_with_lora_rank(tmp_path):
    r4, r8 = small_estimate(tmp_path, lora_r=4), small_estimate(tmp_path, lora_r=8)
    assert r8.adapters == pytest.approx(2 * r4.adapters) and r8.gradients == pytest.approx(2 * r4.gradients)
    assert r8.activations > r4.activations and r8.total > r4.total


def test_checkpointing_keeps_fewer_activations(tmp_path):
    on = small_estimate(tmp_path, args_overrides={"gradient_checkpointing": True}, load_in_4bit=True)
    off = small_estimate(tmp_path, args_overrides={"gradient_checkpointing": False}, load_in_4bit=True)
    assert on.activations < off.activations
    # Without checkpointing: 2 layers · 63744 + backward gradients 32768 + final norm 8192 (see the hand computation).
    assert off.activations * GIB == pytest.approx(2 * 63744 + 32768 + 8192)


@pytest.mark.parametrize(("beta", "lora_r", "expected"), [(0.0, None, False), (0.04, None, True), (0.04, 4, False)])
def test_reference_model_only_with_beta_and_no_peft(tmp_path, beta, lora_r, expected):
    est = small_estimate(tmp_path, args_overrides={"beta": beta}, lora_r=lora_r)
    assert est.reference_model == (pytest.approx(est.weights) if expected else 0.0)


def test_colocated_vllm(tmp_path):
    vllm = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3}
    with pytest.raises(ValueError, match="needs card_gib"):
        small_estimate(tmp_path, args_overrides=vllm)
    asleep = small_estimate(tmp_path, args_overrides={**vllm, "vllm_enable_sleep_mode": True}, card_gib=8)
    awake = small_estimate(tmp_path, args_overrides=vllm, card_gib=8)
    assert asleep.vllm == pytest.approx(2.4) and asleep.kv_cache == 0 and asleep.generation == pytest.approx(2.4)
    assert awake.persistent == pytest.approx(asleep.persistent + 2.4)  # not put to sleep: it stays through training
    with pytest.raises(ValueError, match="not enough for its copy of the weights"):
        small_estimate(tmp_path, args_overrides=vllm, card_gib=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lora_r": None, "load_in_4bit": True}, "load_in_4bit needs LoRA"),
        ({"lora_target_modules": ["q_proj", "lm_head"]}, r"\['lm_head'\] are not decoder linear layers"),
    ],
)
def test_bad_estimate_settings_are_named(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        small_estimate(tmp_path, **kwargs)


def test_lora_targets_resolve_as_peft_does():
    assert memory.lora_targets(None) == ("q_proj", "v_proj")
    assert memory.lora_targets("all-linear") == memory.LINEARS
    assert memory.lora_targets(["v_proj", "q_proj"]) == ("q_proj", "v_proj")


LAYER_CASES = {
    "qlora all-linear (bf16 adapters)": ("all-linear", torch.bfloat16, "sdpa"),
    "lora all-linear (fp32 adapters)": ("all-linear", torch.float32, "sdpa"),
    "qlora q_proj v_proj": (["q_proj", "v_proj"], torch.bfloat16, "sdpa"),
    "full fine-tuning": (None, None, "sdpa"),
    "qlora all-linear, eager attention": ("all-linear", torch.bfloat16, "eager"),
}


@pytest.mark.parametrize("case", LAYER_CASES)
def test_layer_formula_equals_what_autograd_saves(case):
    """Bytes saved for the backward by decoder layer 0 of a bf16 Qwen2 under bf16 autocast, padded batch, on CPU."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM

    target_modules, adapter_dtype, attn = LAYER_CASES[case]
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation=attn,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    if target_modules is not None:
        model = get_peft_model(model, LoraConfig(r=8, target_modules=target_modules))
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(adapter_dtype)
        model.enable_input_require_grads()
    layer = model.get_decoder().layers[0]
    shared = {p.untyped_storage().data_ptr() for p in model.parameters()}  # weights are kept anyway
    saved, recording = {}, []

    def pack(tensor):
        ptr = tensor.untyped_storage().data_ptr()
        if recording and ptr not in shared and tensor.grad_fn.__class__.__name__ != "TBackward0":  # weight views
            saved[ptr] = tensor.untyped_storage().nbytes()
        return tensor

    def capture_shared(module, args, kwargs):  # cos/sin are computed once for every layer
        shared.update(t.untyped_storage().data_ptr() for t in kwargs["position_embeddings"])
        recording.append(True)

    layer.register_forward_pre_hook(capture_shared, with_kwargs=True)
    layer.register_forward_hook(lambda *_: recording.clear())
    batch, seq_len = 4, 96
    input_ids = torch.randint(0, 300, (batch, seq_len))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :10] = 0  # left padding: SDPA gets a mask and repeated k/v
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=input_ids, attention_mask=attention_mask)

    targets = None if target_modules is None else memory.lora_targets(target_modules)
    expected = memory.layer_activation_bytes(
        config, batch * seq_len, seq_len, targets=targets, r=0 if targets is None else 8,
        shared_inputs=adapter_dtype != torch.float32, eager=attn == "eager",
    )  # fmt: skip
    assert sum(saved.values()) == expected


def test_known_models_load_offline_with_their_real_sizes():
    sizes = {
        "Qwen/Qwen2.5-0.5B-Instruct": (896, 4864, 24, 14, 0.494),
        "Qwen/Qwen2.5-1.5B-Instruct": (1536, 8960, 28, 12, 1.544),
        "Qwen/Qwen2.5-3B-Instruct": (2048, 11008, 36, 16, 3.086),
    }
    for name, (hidden, intermediate, layers, heads, billions) in sizes.items():
        config = presets.architecture_config(name)
        assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (
            hidden,
            intermediate,
            layers,
        )
        assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (heads, 2, 151936)
        assert config.tie_word_embeddings and config.model_type == "qwen2"
        assert sum(memory.parameter_counts(config)) / 1e9 == pytest.approx(
            billions, abs=1e-3
        )  # the model cards' sizes
    with pytest.raises(ValueError, match="without a download"):
        presets.architecture_config("Qwen/Qwen2.5-72B-Instruct")


@pytest.mark.parametrize("config", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_preset_fits_its_card_with_ten_percent_to_spare(config):
    card = 16 if config.name == "gsm8k-t4.yaml" else int(re.search(r"gsm8k-(\d+)gb", config.name).group(1))
    training_args, model_args = presets.load_config(config)
    # One mixed precision, with weights of its dtype: fp16 on the T4 (no bf16 there), bf16 on every other card.
    assert training_args.fp16 == (config.name == "gsm8k-t4.yaml") != training_args.bf16
    assert model_args.dtype == ("float16" if training_args.fp16 else "bfloat16")
    est = memory.estimate_for(presets.architecture_config(model_args.model_name_or_path), training_args, model_args)
    assert est.total <= 0.9 * card
    assert presets.fit_warning(est, card) is None
    # The header states this estimate, for this card, and the launch command.
    text = config.read_text()
    header = "\n".join(text.splitlines()[:5])
    assert f"Expected peak memory (estimate): {est.total:.2f} GiB of {card} GiB" in header
    assert f"accelerate launch recipes/math_gsm8k.py --config recipes/configs/{config.name}" in header
    assert model_args.use_peft and training_args.gradient_checkpointing and training_args.optim == "paged_adamw_8bit"
    assert 1e-4 <= training_args.learning_rate <= 2e-4  # a LoRA learning rate
    # The fastest path that fits: a static cache with a compiled decode step, generating from merged LoRA weights.
    assert training_args.generation_compile and training_args.generation_max_prompt_length == 320
    assert training_args.generation_lora_merge in ("inplace", "copy") and not model_args.load_in_4bit
    assert (est.generation_copy > 0) == (training_args.generation_lora_merge == "copy")
    # The in-place merge's host memory the comment states is the estimate's host_pinned line.
    assert (est.host_pinned > 0) == (training_args.generation_lora_merge == "inplace")
    comments = " ".join(line.removeprefix("#").strip() for line in text.splitlines() if line.startswith("#"))
    if est.host_pinned:
        assert f"{est.host_pinned:.2f} GiB of page-locked RAM per process" in comments
    # The commented vLLM option, with the fast-generation settings removed as it says, fits too: its share of the
    # card holds vLLM's copy of the weights.
    block = text[text.index("# Generation with vLLM instead") :].split("\n\n")[0]
    options = re.findall(r"^# (\w+): (\S+)$", block, re.M)
    assert [k for k, _ in options][:4] == [
        "use_vllm",
        "vllm_mode",
        "vllm_enable_sleep_mode",
        "vllm_gpu_memory_utilization",
    ]
    overrides = ["--generation_compile", "false", "--generation_lora_merge", "none"]
    training_args, model_args = presets.load_config(
        config, *overrides, *(a for k, v in options for a in (f"--{k}", v))
    )
    model_config = presets.architecture_config(model_args.model_name_or_path)
    with_vllm = memory.estimate_for(model_config, training_args, model_args, card_gib=card)
    assert with_vllm.vllm > 0 and with_vllm.total <= 0.9 * card
    # The estimate command in that comment makes the same changes (vllm_mode colocate and the 4-bit quant type and
    # double quantization are already the defaults of the estimate).
    command = " ".join(
        line.removeprefix("#").strip().rstrip("\\") for line in block.splitlines() if line.startswith("#   ")
    )
    named = dict(options)
    expected = ["use_vllm", "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization"] + ["load_in_4bit"] * (
        "load_in_4bit" in named
    )
    assert command.split() == [*overrides, *(a for k in expected for a in (f"--{k}", named[k]))]


def test_there_are_presets_for_four_cards_and_the_t4():
    assert [p.name for p in PRESETS] == sorted([*(f"gsm8k-{gb}gb.yaml" for gb in (8, 12, 16, 24)), "gsm8k-t4.yaml"])


def test_t4_preset_trains_lora_in_fp16_within_what_a_t4_shows_torch():
    config = REPO_ROOT / "recipes/configs/gsm8k-t4.yaml"
    training_args, model_args = presets.load_config(config)
    model_config = presets.architecture_config(model_args.model_name_or_path)
    est = memory.estimate_for(model_config, training_args, model_args)
    assert est.total <= 0.9 * T4_GIB and presets.fit_warning(est, T4_GIB) is None  # 16 GB marketed, 14.75 GiB usable
    assert est.total <= 0.9 * 12  # headroom: it would fit a 12 GB card too
    # A T4 has no flash-attention-2 and no bf16; LoRA on fp16 weights, not QLoRA (fp16 with 4-bit is refused).
    assert model_args.attn_implementation == "sdpa" and not model_args.load_in_4bit
    # PEFT keeps the adapters in fp32 on fp16 weights: 4 bytes a trainable parameter, as the fp16 GradScaler needs.
    targets = memory.lora_targets(model_args.lora_target_modules)
    assert est.adapters * GIB == pytest.approx(4 * memory.lora_parameters(model_config, model_args.lora_r, targets))
    # fp16 and bf16 weights take the same bytes: the same run in bf16 has the same estimate, term by term.
    bf16 = presets.load_config(config, "--fp16", "false", "--bf16", "true", "--dtype", "bfloat16")
    assert memory.estimate_for(model_config, *bf16) == est


def test_fp16_with_4bit_weights_is_refused_before_a_model_loads(tmp_path):
    # TRL casts QLoRA adapters to bf16; the fp16 GradScaler cannot unscale bf16 gradients on CUDA.
    with pytest.raises(ValueError, match="fp16=True with load_in_4bit"):
        small_estimate(tmp_path, {"fp16": True}, load_in_4bit=True)
    assert small_estimate(tmp_path, {"fp16": True}).adapters * GIB == pytest.approx(1792 * 4)  # LoRA: fp32 adapters
    # A recipe on a GPU checks the estimate before it loads the model, so it stops there, saying why.
    config = REPO_ROOT / "recipes/configs/gsm8k-t4.yaml"
    training_args, model_args = presets.load_config(config, "--load_in_4bit", "true", "--generation_compile", "false")
    with pytest.raises(ValueError, match="train LoRA on float16 weights"):
        presets.warn_if_too_big(model_args, training_args, card_gib=T4_GIB)


@pytest.mark.parametrize(
    ("cuda", "hardware_bf16", "expected"), [(False, False, "fp32"), (True, False, "fp16"), (True, True, "bf16")]
)
def test_training_precision_asks_for_bf16_in_hardware(monkeypatch, cuda, hardware_bf16, expected):
    def is_bf16_supported(including_emulation=True):  # a T4 says True with emulation (torch's default), False without
        return hardware_bf16 or including_emulation

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert presets.training_precision() == expected


def test_memory_command_prints_the_breakdown(capsys):
    config = str(REPO_ROOT / "recipes/configs/gsm8k-8gb.yaml")
    assert cli.main(["memory", "--config", config, "--card-gib", "8"]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Qwen2.5-1.5B-Instruct, LoRA (bf16) rank 16" in out
    for term in ("weights", "adapters", "optimizer", "gradients", "activations", "logits", "kv_cache", "overhead"):
        assert re.search(rf"^{term}\s+\d+\.\d\d\s+\w+", out, re.MULTILINE), term
    assert re.search(r"^peak\s+\d+\.\d\d", out, re.MULTILINE) and "fits (limit 90% = 7.20 GiB)" in out
    # The in-place merge's host copy, per process: Qwen2.5-1.5B's 28 layers of q, o (1536·1536), k, v (1536·256) and
    # gate, up, down (1536·8960) in bf16: 28 · 46792704 · 2 = 2620391424 bytes = 2.44 GiB.
    assert re.search(r"^host_pinned\s+2\.44  host RAM per process \(per DDP rank\).* 2620391424 bytes$", out, re.M)
    # Overrides go through, and a card that is too small gives exit code 1.
    assert cli.main(["memory", "--config", config, "--card-gib", "4", "--max_completion_length", "2048"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_fit_warning_names_the_largest_terms():
    training_args, model_args = presets.load_config(REPO_ROOT / "recipes/configs/gsm8k-24gb.yaml")
    with pytest.warns(MemoryFitWarning) as record:
        est = presets.warn_if_too_big(model_args, training_args, card_gib=8)
    message = str(record[0].message)
    names = [name for name, _ in est.largest(3)]
    assert names == ["weights", "generation_copy", "activations"]
    assert all(f"{name} {est.terms()[name]:.2f} GiB" in message for name in names), message
    assert "Qwen/Qwen2.5-3B-Instruct is estimated to peak at" in message and "8.0 GiB card" in message
    assert presets.warn_if_too_big(model_args, training_args, card_gib=None) is None  # no GPU: nothing to check


def test_missing_optional_package_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(dependencies, "is_installed", lambda package: False)
    with pytest.raises(dependencies.MissingDependencyError, match=r"use_vllm=True needs .*'vllm'.*: pip install vllm"):
        dependencies.check_optional_dependencies(use_vllm=True)
    with pytest.raises(dependencies.MissingDependencyError, match="DeepSpeed config .*: pip install deepspeed"):
        dependencies.check_optional_dependencies(deepspeed=True)
    dependencies.check_optional_dependencies()  # nothing requested: nothing needed

    assert dependencies.deepspeed_requested([], {"ACCELERATE_USE_DEEPSPEED": "true"})  # accelerate launch
    assert dependencies.deepspeed_requested(["--deepspeed", "ds.json"], {})
    yaml = tmp_path / "ds.yaml"
    yaml.write_text("deepspeed: ds_zero2.json\n")
    assert dependencies.deepspeed_requested(["--config", str(yaml)], {})
    assert not dependencies.deepspeed_requested(["--config", str(REPO_ROOT / "recipes/configs/gsm8k-8gb.yaml")], {})


def test_recipe_refuses_vllm_without_vllm_before_building_a_model(monkeypatch, tmp_path):
    from tests.training.test_recipes import load_recipe

    monkeypatch.setattr(dependencies, "is_installed", lambda package: package != "vllm")
    recipe = load_recipe("math_gsm8k")
    argv = ["--config", str(REPO_ROOT / "recipes/configs/demo_cpu.yaml"), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(dependencies.MissingDependencyError, match="pip install vllm"):
        recipe.main(*recipe.make_parser().parse_args_and_config(argv + ["--use_vllm", "true"]))
    assert not (tmp_path / "out" / "tiny-model").exists()


def load_benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_memory", REPO_ROOT / "benchmarks/generation/gpu_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given on a machine without CUDA")
def test_gpu_benchmark_without_cuda_says_so_with_exit_code_2(capsys):
    assert load_benchmark().main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_gpu_benchmark_table_shows_estimates_next_to_measurements_and_errors():
    row = {"preset": "8gb", "model": "Qwen/Qwen2.5-1.5B-Instruct", "method": "QLoRA r=16", "prompt_length": 320}
    row |= {"completion_length": 512, "micro_batch": 8, "generation_batch": 64, "estimate_gib": 4.04}
    row |= {"estimate_allocator_gib": 3.04, "peak_allocated_gib": 3.5, "step_time_s": 12.3}
    table = load_benchmark().markdown([row, {"preset": "24gb", "error": "timed out after 30 s"}], "header")
    lines = table.splitlines()
    assert lines[4].startswith(
        "| 8gb | Qwen/Qwen2.5-1.5B-Instruct | QLoRA r=16 | 320 + 512 | 8 / 64 | 4.04 (3.04) | 3.50 |"
    )
    assert lines[5].startswith("| 24gb | - |") and "- 24gb: timed out after 30 s" in table


def test_memory_command_errors_are_one_line(tmp_path, capsys):
    """A config that is not YAML, a missing one and a rejected value: one line each, exit 2 (the file) or 1 (a
    value), no traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: [Qwen\n")
    config = str(REPO_ROOT / "recipes/configs/gsm8k-8gb.yaml")
    cases = [
        (["--config", str(bad)], 2, f"trl-grpo-ext memory: error: --config {bad}: not valid YAML at line 2, column 1"),
        (["--config", str(tmp_path / "none.yaml")], 2, f"trl-grpo-ext memory: error: --config {tmp_path}/none.yaml: "
         "no such file"),
        (["--config", config, "--num_generations", "0"], 1, "trl-grpo-ext memory: error: num_generations must be 2 "
         "or more (completions per prompt: each is scored against the others of its prompt), got 0"),
    ]  # fmt: skip
    for argv, code, start in cases:
        assert cli.main(["memory", *argv]) == code
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(start), err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_two_resident_static_caches_take_what_the_estimate_counts(tiny_model_dir):
    """With `prompt_skip` and `generation_compile` a run keeps two static caches, of the full generation batch and of
    half of it (`static_cache_batches`): each allocated whole at its first prefill and kept. The CUDA memory they
    hold is the estimate's `kv_cache_bytes` of each, up to the caching allocator's 512-byte rounding per tensor."""
    from transformers import AutoModelForCausalLM

    from trl_grpo_ext.generation.static_cache import StaticCaches
    from trl_grpo_ext.trl_contact import generate_cache_argument

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).cuda().eval()
    keyword, caches, length = generate_cache_argument(model), StaticCaches(), 64 + 16
    layers = model.config.num_hidden_layers
    for sequences in (8, 4):  # the full batch, then prompt skipping's half batch
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        cache = caches.for_generation(model, sequences, length)
        with torch.no_grad():
            model(input_ids=torch.randint(5, 400, (sequences, 10), device="cuda"), **{keyword: cache}, use_cache=True)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before  # the logits are freed with the output
        expected = memory.kv_cache_bytes(model.config, sequences, length)
        assert expected <= held <= expected + 2 * layers * 512, (sequences, held, expected)
    assert len(caches.caches) == 2  # both kept for the run


def test_the_memory_command_counts_the_recipes_end_of_run_evaluation():
    """`trl-grpo-ext memory --config` and the recipe's fit warning estimate the evaluation at the YAML's
    `eval_batch_size` (the command line over the file over the recipe's default of 16), none with `eval_limit` 0."""
    configs = REPO_ROOT / "recipes" / "configs"
    assert presets.recipe_eval_batch_size(configs / "gsm8k-24gb.yaml") == 32
    assert presets.recipe_eval_batch_size(configs / "gsm8k-24gb.yaml", "--eval_batch_size", "8") == 8
    assert presets.recipe_eval_batch_size(configs / "gsm8k-24gb.yaml", "--eval_limit", "0") is None
    assert presets.recipe_eval_batch_size(configs / "demo_cpu.yaml") == 16  # eval_limit 16, the default batch
