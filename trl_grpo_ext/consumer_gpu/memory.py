"""Peak GPU memory of a GRPO run with TRL 1.16, LoRA or QLoRA, estimated from the model's config and the run's config.

    trl-grpo-ext memory --config recipes/configs/gsm8k-8gb.yaml --card-gib 8   # the breakdown as a table

The formulas only; the model architectures known offline, reading a recipe YAML and the warning a recipe gives when a
run will not fit are in `trl_grpo_ext.consumer_gpu.presets`.

`estimate()` adds up the terms below, in bytes, for one process. Notation: L layers, h hidden size, I intermediate
size, a attention heads, k key-value heads, d head dim, V vocabulary, P prompt and C completion tokens, s = P + C, b =
`per_device_train_batch_size` (completions per micro-batch), B = completions generated at once per process
(`generation_batch_size / world_size`), w = 2 bytes (bf16 or fp16: the same bytes, so one formula covers both).

* **weights**: bf16 or fp16 (`dtype`), 2 bytes a parameter. NF4 (`load_in_4bit`): 4 bits per weight of the decoder's
  linear layers plus their quantization constants, one fp32 absmax per block of 64 (0.5 bit a weight), or with double
  quantization 8-bit absmaxes and one fp32 constant per 256 blocks (8/64 + 32/(64·256) = 0.127 bit; QLoRA,
  arXiv:2305.14314, Sec. 3). bitsandbytes converts `nn.Linear` only, and transformers keeps the output embedding and
  anything tied to it in full precision (`get_keys_to_not_convert`), so embeddings, lm_head, norms and biases stay in
  the model's 16-bit dtype. (The forward dequantizes one weight at a time: at most 2·h·I bytes, 45 MB for
  Qwen2.5-3B, left to the overhead term.)
* **adapters**: LoRA adds r·(d_in + d_out) parameters per targeted linear (arXiv:2106.09685, Sec. 4.1). PEFT keeps them
  in fp32 on a bf16 or fp16 model (`autocast_adapter_dtype=True`); TRL casts them to bf16 on a quantized one (QLoRA's
  choice), whatever the mixed precision. torch's fp16 `GradScaler` has no CUDA kernel to unscale bf16 gradients, so
  `estimate` refuses `fp16=True` with 4-bit weights (`precision_problem`); fp16 trains LoRA on fp16 weights.
* **optimizer**: AdamW keeps 2 states of the parameter's dtype (torch; 8 bytes for fp32 parameters) plus, with
  `foreach`, one temporary copy; bitsandbytes' 8-bit AdamW (and its paged variant) keeps 2 one-byte states plus an
  fp32 absmax per block of 256 (arXiv:2110.02861, Sec. 2). **gradients**: one per trainable parameter, of its dtype.
* **activations** of one training micro-batch (b·s tokens): see `layer_activation_bytes` for one layer. Without
  gradient checkpointing every layer's are kept; with it, each layer's input (w·h per token; Korthikanti et al. 2022,
  arXiv:2205.05198, Sec. 4.1 and 5) plus one layer's activations recomputed in its backward. Plus the backward's
  gradients of one layer's largest tensors and the final norm's fp32 input.
* **logits**: TRL 1.16 never builds the (b, s, V) logits in training: its fused LM head (`trl.kernels.chunked_logprob`)
  projects 4096 tokens × 32768 vocabulary entries at a time, only at completion positions (b·C tokens). Kept: that
  bf16 tile, the completion hidden states (w·h a token) and their fp32 gradient (4·h a token). Full fp32 logits for
  b·s tokens, as a plain log-softmax would build them, would be 3.8 GiB for the 8 GB preset.
* **KV cache** of HF generation: 2·L·k·d·w bytes a token for B sequences of P + C tokens, plus one layer's worth while
  `DynamicCache` concatenates. **generation workspace**: the prefill's largest no-grad temporaries (B·P tokens) or,
  while decoding, the last-token logits and their fp32 copies for sampling (B·V·(w + 12) bytes), whichever phase peaks.
* **reference model**: a second copy of the weights when `beta != 0` without PEFT (with PEFT, TRL disables the
  adapter instead).
* **vLLM** (`use_vllm`, `vllm_mode="colocate"`): `vllm_gpu_memory_utilization` of the card, which replaces the KV cache
  and generation workspace. vLLM keeps its own copy of the weights in it (4-bit when the policy is: TRL starts vLLM
  with `quantization="bitsandbytes"`). With `vllm_enable_sleep_mode` TRL puts it to sleep at level 2 (weights and
  cache freed) while training; without, it stays.
* **fast generation** (`trl_grpo_ext.generation`). `generation_lora_merge="copy"`: **generation_copy**, one bf16 copy
  of the LoRA-targeted linear layers (2 bytes a weight; with 4-bit weights every decoder linear, dequantized), always
  resident. `"inplace"` keeps its copy of the base weights in host memory: nothing on the GPU, and
  **host_pinned**, not part of the GPU peak: the targeted linear layers' base weights, 2 bytes a weight, exactly (one
  page-locked buffer, `generation.lora_merge.InplaceMerge`), in every process (per DDP rank). `generation_compile`:
  **static_cache**, B sequences of `generation_max_prompt_length` (else P rounded up to 64) + C tokens, allocated
  whole at the first prefill and kept for the run (its addresses stay fixed for the CUDA graph:
  `generation.static_cache`), so resident rather than in the generation phase; one such cache per batch size that
  generation takes (`StaticCaches`): with `prompt_skip` (without `prompt_skip_refill`) a batch holds all the drawn
  prompts or half of them when half is a whole number of layout quanta (`prompt_skip.skipping.static_cache_quantum`),
  so a second cache of B/2 sequences (`static_cache_batches`); and **compile_workspace**, the
  CUDA-graph pool that stays allocated between generations: the decode step's bf16 logits and one layer's
  intermediates, B·(V + 3I + 4h)·w.
* **continuous batching** (TRL's `use_transformers_continuous_batching`): its paged cache takes `max_memory_percent`
  (TRL's default 0.5) of what the resident terms leave of the card, counted in `kv_cache`.
* **overhead**: `OVERHEAD_GIB` = 1 GiB for the CUDA context (0.3-0.5 GiB), cuBLAS workspaces and the caching
  allocator's fragmentation, none of which `torch.cuda.max_memory_allocated` counts.

* **evaluation** (with `eval_batch_size`: the GSM8K recipe's end-of-run evaluation, `gsm8k.evaluation`): HF
  generation of `eval_batch_size` prompts of P + C tokens with a `DynamicCache` (its KV cache and workspace, as in
  `generation_bytes`; greedy: one sequence a prompt), after training, beside the resident terms (the optimizer state
  and any static caches are still allocated; vLLM in sleep mode is asleep). With compiled generation the training
  generation phase has no KV cache of its own (the static cache is resident), so this phase can be the peak even at
  the training's batch size.

The peak is what is always resident (weights, adapters, optimizer, reference model, overhead) plus the largest of the
training phase (gradients, activations, logits), the generation phase (KV cache, generation workspace) and the
end-of-run evaluation: the KV cache is freed before the backward, and gradients are freed
(`zero_grad(set_to_none=True)`) before the next generation.
"""

import math
from dataclasses import dataclass, fields

from ..generation.checks import model_setting_problem
from ..generation.device_memory import copy_weight_bytes
from ..generation.static_cache import prompt_budget
from ..prompt_skip.skipping import layout_quantum, static_cache_quantum

GIB = 2**30
OVERHEAD_GIB = 1.0
DEFAULT_PROMPT_LENGTH = 320  # GSM8K: system prompt + chat template + question; the longest train question gives ~290
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# PEFT's default LoRA targets for llama and qwen2 (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
PEFT_DEFAULT_TARGETS = ("q_proj", "v_proj")
NF4_BITS = {True: 4 + 8 / 64 + 32 / (64 * 256), False: 4 + 32 / 64}  # double quantization on / off
TOKEN_TILE, VOCAB_TILE = 4096, 32768  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE, _CHUNKED_LOGPROB_CHUNK_SIZE


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated peak GPU memory of one process, by term, in GiB (see the module docstring for each formula)."""

    weights: float
    adapters: float
    optimizer: float
    reference_model: float
    overhead: float
    gradients: float
    activations: float
    logits: float
    kv_cache: float
    generation_workspace: float
    vllm: float = 0.0
    generation_copy: float = 0.0
    compile_workspace: float = 0.0
    static_cache: float = 0.0
    vllm_persistent: bool = False  # vLLM without sleep mode stays resident through training
    host_pinned: float = 0.0  # page-locked host memory of one process (the in-place merge's copy): not GPU memory
    evaluation: float = 0.0  # the end-of-run evaluation's generation (KV cache and workspace), when estimated

    @property
    def persistent(self) -> float:
        extra = (self.vllm if self.vllm_persistent else 0.0) + self.generation_copy + self.compile_workspace
        extra += self.static_cache
        return self.weights + self.adapters + self.optimizer + self.reference_model + self.overhead + extra

    @property
    def training(self) -> float:
        return self.gradients + self.activations + self.logits

    @property
    def generation(self) -> float:
        return self.kv_cache + self.generation_workspace + (0.0 if self.vllm_persistent else self.vllm)

    @property
    def total(self) -> float:
        """Peak GiB: the resident terms plus the largest phase (training, generation, end-of-run evaluation)."""
        return self.persistent + max(self.training, self.generation, self.evaluation)

    def terms(self) -> dict[str, float]:
        """Every term of the GPU peak by name, in GiB."""
        left_out = ("vllm_persistent", "host_pinned")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in left_out}

    def largest(self, n: int = 3) -> list[tuple[str, float]]:
        """The `n` largest terms, largest first."""
        return sorted(self.terms().items(), key=lambda item: -item[1])[:n]

    def as_table(self, card_gib: float | None = None) -> str:
        """The breakdown as a fixed-width table; with `card_gib`, whether the peak is within 90% of the card."""
        phases = {"gradients": "training", "activations": "training", "logits": "training"}
        phases |= {"kv_cache": "generation", "generation_workspace": "generation"}
        phases["vllm"] = "always" if self.vllm_persistent else "generation"
        phases["evaluation"] = "evaluation"
        lines = [f"{'term':<22}{'GiB':>8}  phase", "-" * 42]
        for name, gib in self.terms().items():
            lines.append(f"{name:<22}{gib:>8.2f}  {phases.get(name, 'always')}")
        phase_gib = {"training": self.training, "generation": self.generation, "evaluation": self.evaluation}
        peak = max(phase_gib, key=phase_gib.get)  # the first of equals: training
        lines += ["-" * 42, f"{'peak':<22}{self.total:>8.2f}  (resident + {peak} phase)"]
        if card_gib is not None:
            verdict = "fits" if self.total <= 0.9 * card_gib else "DOES NOT FIT"
            lines.append(f"{'card':<22}{card_gib:>8.2f}  {verdict} (limit 90% = {0.9 * card_gib:.2f} GiB)")
        if self.host_pinned:
            lines.append(
                f"{'host_pinned':<22}{self.host_pinned:>8.2f}  host RAM per process (per DDP rank), page-locked: the "
                f"in-place merge's copy of the adapted base weights, {round(self.host_pinned * GIB)} bytes"
            )
        return "\n".join(lines)


def linear_shapes(config) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each linear layer of one decoder layer of a Llama/Qwen2-style config."""
    h, i = config.hidden_size, config.intermediate_size
    d = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    return shapes | {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def parameter_counts(config) -> tuple[int, int]:
    """(decoder linear weights, everything else: embeddings, lm_head when untied, norms, q/k/v biases)."""
    shapes = linear_shapes(config)
    linear = config.num_hidden_layers * sum(d_in * d_out for d_in, d_out in shapes.values())
    qkv_bias = config.model_type == "qwen2" or getattr(config, "attention_bias", False)
    bias = sum(shapes[n][1] for n in ("q_proj", "k_proj", "v_proj")) if qkv_bias else 0
    per_layer = 2 * config.hidden_size + bias  # two RMSNorm weights
    embeddings = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    return linear, embeddings + config.num_hidden_layers * per_layer + config.hidden_size


def lora_targets(target_modules) -> tuple[str, ...]:
    """LoRA target names as PEFT resolves them: None → PEFT's default for Llama/Qwen2, "all-linear" → every linear.

    Raises:
        ValueError: a name that is not one of the decoder's linear layers.
    """
    if target_modules is None:
        return PEFT_DEFAULT_TARGETS
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    if names == ["all-linear"]:
        return LINEARS
    unknown = sorted(set(names) - set(LINEARS))
    if unknown:
        raise ValueError(f"lora_target_modules: {unknown} are not decoder linear layers {list(LINEARS)}")
    return tuple(n for n in LINEARS if n in names)


def lora_parameters(config, r: int, targets: tuple[str, ...]) -> int:
    """r·(d_in + d_out) per targeted linear, over every layer (arXiv:2106.09685, Sec. 4.1)."""
    shapes = linear_shapes(config)
    return config.num_hidden_layers * sum(r * sum(shapes[n]) for n in targets)


def layer_activation_bytes(
    config, tokens: int, seq_len: int, *, targets, r=0, shared_inputs=True, dropout=0.0, padded=True, eager=False
) -> int:
    """Bytes one bf16 decoder layer keeps for its backward over `tokens` = b·s tokens, without checkpointing.

    Korthikanti et al. 2022 (arXiv:2205.05198, Sec. 4.1) count s·b·h·(34 + 5·a·s/h) bytes for a GPT layer. Adapted to
    a Llama/Qwen2 layer as transformers 5 and PyTorch 2 run it, per token (w = 2): each RMSNorm keeps its fp32 input
    and rsqrt (4h + 4, twice); SDPA keeps q, k, v (k and v repeated to a heads when a padding mask is passed), its
    output (which is also o_proj's input), its fp32 logsumexp (4a) and, when padded, the bf16 mask bias (w·s); eager
    attention keeps q, k, v and the fp32 softmax with its bf16 copy (6·a·s) instead; SwiGLU keeps the gate output, its
    SiLU and the up output (3·w·I); then each linear input needed for a weight gradient (w·d_in: once per input when
    shared; once per targeted linear, plus a 1-byte dropout mask, when PEFT casts the input to fp32 adapters or drops
    it out, `shared_inputs=False`) and each LoRA A output (w·r). A frozen base weight needs no saved input; `targets`
    None means full fine-tuning (every input, and both norms' normalized input). Checked against the tensors autograd
    saves for one layer on CPU (`tests/training/test_memory.py`); CUDA's dropout mask is 1 byte, CPU's is the input's
    dtype.
    """
    w, h, i, a = 2, config.hidden_size, config.intermediate_size, config.num_attention_heads
    shapes = linear_shapes(config)
    q_dim, kv_dim = shapes["q_proj"][1], shapes["k_proj"][1]
    per_token = 2 * (4 * h + 4) + 3 * w * i
    if eager:
        per_token += 3 * w * q_dim + 6 * a * seq_len
    else:
        per_token += w * (2 * q_dim + 2 * (q_dim if padded else kv_dim)) + 4 * a + (w * seq_len if padded else 0)
    groups = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "mlp", "up_proj": "mlp"}
    if targets is None or (shared_inputs and dropout == 0):  # one saved input per group of linears that share it
        first = {groups.get(n, n): n for n in (LINEARS if targets is None else targets)}
        first.pop("o_proj" if not eager else "", None)  # SDPA's output is o_proj's input, counted above
        per_token += sum(w * shapes[n][0] for n in first.values())
        per_token += 2 * w * h if targets is None else 0
    else:
        per_token += sum((w + (1 if dropout > 0 else 0)) * shapes[n][0] for n in targets)
    if targets is not None:
        per_token += w * r * len(targets)
    return tokens * per_token


def activation_bytes(config, batch: int, seq_len: int, *, gradient_checkpointing: bool, **layer_kwargs) -> int:
    """Activations of one training micro-batch of `batch` sequences of `seq_len` tokens, in bytes.

    Checkpointing keeps each layer's input (w·h a token, arXiv:2205.05198, Sec. 5) and recomputes one layer at a time;
    both cases add the backward's gradients of one layer's largest tensors (w·(3I + 2h) a token) and the final norm's
    fp32 input (4h a token).
    """
    tokens, h, layers = batch * seq_len, config.hidden_size, config.num_hidden_layers
    layer = layer_activation_bytes(config, tokens, seq_len, **layer_kwargs)
    kept = layers * 2 * h * tokens + layer if gradient_checkpointing else layers * layer
    return kept + tokens * (2 * (3 * config.intermediate_size + 2 * h) + 4 * h)


def lm_head_bytes(config, completion_tokens: int) -> int:
    """TRL 1.16's fused LM head in training: a bf16 tile, the completion hidden states (w·h), their fp32 gradient."""
    tile = min(completion_tokens, TOKEN_TILE) * min(config.vocab_size, VOCAB_TILE) * 2
    return tile + completion_tokens * config.hidden_size * (2 + 4)


def kv_cache_bytes(config, sequences: int, seq_len: int) -> int:
    """2 (K and V) · layers · kv heads · head dim · 2 bytes (bf16) per token, for `sequences` of `seq_len` tokens."""
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * d * 2 * sequences * seq_len


def generation_bytes(
    config, sequences: int, prompt_length: int, completion_length: int, static_cache_length: int | None = None
) -> tuple[int, int]:
    """(KV cache, workspace) of HF generation at its peak: the prefill or the end of decoding, whichever is larger.

    Prefill (no grad, B·P tokens): the larger of attention (residual, norm output, q, repeated k and v, SDPA output,
    o_proj input: 7·w·h a token) and SwiGLU (residual, norm output, SiLU, up, product: w·(2h + 3I)). Decoding: the
    cache at P + C tokens plus one layer's concatenation copy, and the sampled step's logits (bf16, then fp32 copies
    for the processors and softmax: B·V·(2 + 3·4)). A static cache (`static_cache_length` tokens a sequence) is
    allocated whole at the prefill and never copied.
    """
    h, i = config.hidden_size, config.intermediate_size
    prefill_workspace = sequences * prompt_length * 2 * max(7 * h, 2 * h + 3 * i)
    decode_workspace = sequences * config.vocab_size * (2 + 3 * 4)
    if static_cache_length is not None:
        return kv_cache_bytes(config, sequences, static_cache_length), max(prefill_workspace, decode_workspace)
    prefill = (kv_cache_bytes(config, sequences, prompt_length), prefill_workspace)
    kv_end = kv_cache_bytes(config, sequences, prompt_length + completion_length)
    decode = (kv_end + kv_end // config.num_hidden_layers, decode_workspace)
    return max(prefill, decode, key=sum)


def generation_copy_bytes(config, targets: tuple[str, ...], load_in_4bit: bool) -> int:
    """A bf16 generation copy (`generation_lora_merge="copy"`): every targeted linear layer, or with 4-bit weights
    every decoder linear layer (dequantized), 2 bytes a weight (`generation.device_memory.copy_weight_bytes`, the
    size the trainer checks against the free memory)."""
    shapes = linear_shapes(config)
    names = LINEARS if load_in_4bit else targets
    return copy_weight_bytes([shapes[n] for n in names] * config.num_hidden_layers, 2)


def static_cache_batches(args, sequences: int) -> list[int]:
    """The batch sizes (sequences a process) training generates at with `generation_compile`, each with a static cache
    of its own for the run: `sequences`, and with `prompt_skip` (no refill, which keeps the batch whole) half of them
    when the skipping layout lets a batch shrink to half of the drawn prompts (`static_cache_quantum`)."""
    if not getattr(args, "prompt_skip", False) or args.prompt_skip_refill:
        return [sequences]
    drawn = args.generation_batch_size // args.num_generations  # prompts of a generation batch, over all processes
    quantum = layout_quantum(args.num_generations, max(args.world_size, 1), args.steps_per_generation)
    return [sequences] if static_cache_quantum(drawn, quantum) == drawn else [sequences, sequences // 2]


def compile_workspace_bytes(config, sequences: int) -> int:
    """The CUDA-graph pool of a compiled decode step: its bf16 logits and one layer's intermediates,
    B·(V + 3I + 4h)·2 bytes."""
    return sequences * (config.vocab_size + 3 * config.intermediate_size + 4 * config.hidden_size) * 2


def optimizer_bytes(trainable: int, optim: str, param_bytes: int) -> int:
    """AdamW's state: 8-bit bitsandbytes (2 bytes + fp32 absmax per 256), 32-bit bitsandbytes (8), torch (2 states of
    the parameter's dtype plus one `foreach` temporary); SGD without momentum keeps none."""
    if "8bit" in optim:
        return trainable * 2 + math.ceil(trainable / 256) * 2 * 4
    if "32bit" in optim or "bnb" in optim:
        return trainable * 8
    if optim.startswith("sgd"):
        return 0
    return trainable * 3 * param_bytes


def precision_problem(args, load_in_4bit: bool) -> str | None:
    """Why a run's mixed precision cannot train its weights, or None.

    `fp16=True` with 4-bit weights: TRL 1.16 casts QLoRA adapters to bf16 (`GRPOTrainer.__init__`, for any
    quantized model), and the fp16 `GradScaler` fails at the first optimizer step on CUDA (no BFloat16 kernel for
    `_amp_foreach_non_finite_check_and_unscale_`). LoRA on fp16 weights keeps fp32 adapters, which it unscales.
    """
    if getattr(args, "fp16", False) and load_in_4bit:
        return (
            "fp16=True with load_in_4bit: TRL casts QLoRA adapters to bf16 and torch's fp16 GradScaler cannot unscale "
            "bf16 gradients on CUDA, so the first optimizer step fails. On a card without bf16 (a T4) train LoRA on "
            "float16 weights (--load_in_4bit false --dtype float16; recipes/configs/gsm8k-t4.yaml), or cast the "
            "adapters back to fp32 after building the trainer (recipes/notebooks/gsm8k_qlora_quickstart.ipynb)"
        )
    return None


def estimate(
    model_config,
    args,
    *,
    prompt_length: int = DEFAULT_PROMPT_LENGTH,
    lora_r: int | None = None,
    lora_target_modules=None,
    lora_dropout: float = 0.0,
    load_in_4bit: bool = False,
    nested_quant: bool = True,
    attn_implementation: str | None = "sdpa",
    card_gib: float | None = None,
    eval_batch_size: int | None = None,
) -> MemoryEstimate:
    """Estimated peak GPU memory of one GRPO process (module docstring: every term, its formula and source).

    Args:
        model_config: a transformers `PretrainedConfig` of a Llama/Qwen2-style model (hidden_size, intermediate_size,
            num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size, tie_word_embeddings).
        args: the run's `GRPOConfig` (batch sizes, `max_completion_length`, `gradient_checkpointing`, `optim`, `beta`,
            the vLLM fields), after `__post_init__`, which sets `generation_batch_size`.
        prompt_length: tokens of the longest prompt in a batch (TRL 1.16 does not truncate prompts).
        lora_r: LoRA rank; None trains every weight (full fine-tuning, bf16).
        lora_target_modules: as in `peft.LoraConfig` (a list of names, "all-linear", or None for PEFT's default).
        lora_dropout: LoRA dropout; above 0 each targeted linear keeps its own dropped-out input and mask.
        load_in_4bit: NF4 weights (QLoRA); `nested_quant` is bitsandbytes' double quantization.
        attn_implementation: "sdpa" (default), "flash_attention_2" (no mask bias, no repeated k/v) or "eager".
        card_gib: the card's memory, needed only for colocated vLLM and continuous batching.
        eval_batch_size: prompts the end-of-run evaluation generates at once (the GSM8K recipe's field); None leaves
            the evaluation out.

    Returns:
        A `MemoryEstimate` in GiB.

    Raises:
        ValueError: an unknown LoRA target, 4-bit weights without LoRA or with fp16 (`precision_problem`), colocated
            vLLM without `card_gib` or with a share of the card smaller than the weights, continuous batching without
            `card_gib`, a fast-generation setting that cannot apply to this model
            (`generation.checks.model_setting_problem`).
    """
    if load_in_4bit and lora_r is None:
        raise ValueError("load_in_4bit needs LoRA (lora_r): 4-bit weights cannot be trained directly")
    problem = precision_problem(args, load_in_4bit)
    if problem is not None:
        raise ValueError(problem)
    linear, other = parameter_counts(model_config)
    weights = linear * NF4_BITS[nested_quant] / 8 + other * 2 if load_in_4bit else (linear + other) * 2
    targets = None if lora_r is None else lora_targets(lora_target_modules)
    trainable = linear + other if lora_r is None else lora_parameters(model_config, lora_r, targets)
    param_bytes = 2 if lora_r is None or load_in_4bit else 4  # LoRA on a bf16 model: PEFT keeps adapters in fp32
    optim = str(getattr(args.optim, "value", args.optim))

    b, completion = args.per_device_train_batch_size, args.max_completion_length
    seq_len = prompt_length + completion
    layer_kwargs = dict(targets=targets, r=lora_r or 0, shared_inputs=param_bytes == 2, dropout=lora_dropout)
    layer_kwargs |= dict(padded=attn_implementation != "flash_attention_2", eager=attn_implementation == "eager")
    activations = activation_bytes(
        model_config, b, seq_len, gradient_checkpointing=args.gradient_checkpointing, **layer_kwargs
    )

    vllm, vllm_persistent, kv, workspace, copy, compiled, static_kv, host = 0.0, False, 0, 0, 0, 0, 0, 0
    sequences = args.generation_batch_size // max(args.world_size, 1)
    if hasattr(args, "generation_lora_merge"):  # a TRL GRPOConfig has none of this package's fields
        problem = model_setting_problem(args, lora=targets is not None, quantized=load_in_4bit)
        if problem is not None:
            raise ValueError(problem)
        if args.generation_lora_merge == "copy":
            copy = generation_copy_bytes(model_config, targets, load_in_4bit)
        elif args.generation_lora_merge == "inplace":  # never 4-bit (refused above): 2 bytes a weight
            shapes = linear_shapes(model_config)
            host = copy_weight_bytes([shapes[n] for n in targets] * model_config.num_hidden_layers, 2)
    if args.use_vllm:
        if args.vllm_mode == "colocate":
            if card_gib is None:
                raise ValueError(
                    "use_vllm with vllm_mode='colocate' needs card_gib (--card-gib): vLLM takes a fraction of the card"
                )
            vllm, vllm_persistent = args.vllm_gpu_memory_utilization * card_gib, not args.vllm_enable_sleep_mode
            if vllm * GIB <= weights:
                raise ValueError(
                    f"vllm_gpu_memory_utilization={args.vllm_gpu_memory_utilization} gives vLLM {vllm:.2f} GiB of the "
                    f"card, not enough for its copy of the weights ({weights / GIB:.2f} GiB) and a KV cache"
                )
    elif args.use_transformers_continuous_batching:
        if card_gib is None:
            raise ValueError("continuous batching needs card_gib (--card-gib): its cache takes a share of the card")
        share = (args.transformers_continuous_batching_config or {}).get("max_memory_percent", 0.5)
        resident = weights + (trainable * param_bytes) + optimizer_bytes(trainable, optim, param_bytes) + copy
        kv = share * max(card_gib * GIB - resident - OVERHEAD_GIB * GIB, 0)
        workspace = sequences * model_config.vocab_size * (2 + 3 * 4)
    else:
        static = None
        if getattr(args, "generation_compile", False):
            budget = args.generation_max_prompt_length or prompt_budget(prompt_length)
            if prompt_length > budget:  # the trainer grows the cache to the next bucket, as StaticCacheSizer.fit does
                budget = prompt_budget(prompt_length)
            static = budget + completion
            compiled = compile_workspace_bytes(model_config, sequences)
        kv, workspace = generation_bytes(model_config, sequences, prompt_length, completion, static)
        if static is not None:  # kept for the run, one per batch size: resident
            batches = static_cache_batches(args, sequences)
            static_kv, kv = sum(kv_cache_bytes(model_config, n, static) for n in batches), 0

    evaluation = 0 if eval_batch_size is None else sum(generation_bytes(model_config, eval_batch_size, prompt_length,
                                                                        completion))  # fmt: skip
    return MemoryEstimate(
        weights=weights / GIB,
        adapters=(0 if lora_r is None else trainable * param_bytes) / GIB,
        optimizer=optimizer_bytes(trainable, optim, param_bytes) / GIB,
        reference_model=weights / GIB if args.beta != 0 and lora_r is None else 0.0,
        overhead=OVERHEAD_GIB,
        gradients=trainable * param_bytes / GIB,
        activations=activations / GIB,
        logits=lm_head_bytes(model_config, b * completion) / GIB,
        kv_cache=kv / GIB,
        generation_workspace=workspace / GIB,
        vllm=vllm,
        generation_copy=copy / GIB,
        compile_workspace=compiled / GIB,
        static_cache=static_kv / GIB,
        vllm_persistent=vllm_persistent,
        host_pinned=host / GIB,
        evaluation=evaluation / GIB,
    )


def estimate_for(model_config, args, model_args, **kwargs) -> MemoryEstimate:
    """`estimate()` with the LoRA/QLoRA settings of TRL's `ModelConfig` (`use_peft`, `lora_*`, `load_in_4bit`, ...).

    Raises:
        ValueError: weights that are not bf16/fp16 (`dtype`), which the formulas do not model.
    """
    if model_args.dtype not in ("bfloat16", "float16"):
        raise ValueError(
            f"the estimate models bf16/fp16 weights: set dtype to bfloat16 or float16, got {model_args.dtype!r}"
        )
    return estimate(
        model_config,
        args,
        lora_r=model_args.lora_r if model_args.use_peft else None,
        lora_target_modules=model_args.lora_target_modules,
        lora_dropout=model_args.lora_dropout,
        load_in_4bit=model_args.load_in_4bit,
        nested_quant=model_args.use_bnb_nested_quant,
        attn_implementation=model_args.attn_implementation or "sdpa",
        **kwargs,
    )
