"""Fast generation without vLLM: TRL's own `model.generate` path, made faster with what transformers and PEFT offer.
Every setting is off by default (`GRPOConfig.generation_compile`, `generation_max_prompt_length`,
`generation_lora_merge`), and then a run is TRL's, bit for bit; `generation_fallback` (on) says what a failure of
the fast path does.

* `config`: the settings (`FastGenerationFields`), their ranges and the rules with TRL's generation settings
  (`FAST_GENERATION_CONFIG`); `generation_levers`.
* `static_cache`: a static KV cache of fixed length, one per batch size kept for the run (fixed addresses for the CUDA
  graph), and a `torch.compile`d decode step (CUDA graphs on a GPU).
* `lora_merge`: generating from W₀ + ΔW instead of PEFT's adapter layers, without drift: merged into the policy and
  restored bit for bit (`InplaceMerge`), or a separate generation copy, dequantized for QLoRA (`GenerationCopy`).
* `checks`: which settings a model (LoRA or not, 4-bit or not) or a multi-turn run refuses, asked by the trainer, the
  memory estimate and the recipe alike.
* `device_memory`: whether the generation copy fits beside training, checked at the first generation.
* `feature`: the trainer wiring (`FastGenerationFeature`: what the settings need, built at the first generation where
  the model then is and tried there on a short probe generation, and entered around each of TRL's generations), the
  init-time checks that refuse a setting that cannot apply, and those for TRL's continuous batching.
* `fallback`: when the fast path fails (`generation_fallback`, on by default): the cause in words, the random state
  a retry with TRL's generation needs, and torch's counts of recompile-limit hits and CUDA-graph skips.

The memory each setting adds is in `trl_grpo_ext.consumer_gpu.memory` (`generation_copy`, the static cache); the
speed of each is measured by `benchmarks/generation/gpu_throughput.py`.
"""
