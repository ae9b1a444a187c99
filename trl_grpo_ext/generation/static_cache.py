"""A static KV cache, kept for the run, and a compiled decode step for TRL's `model.generate`
(`GRPOConfig.generation_compile`).

TRL 1.16 builds its `GenerationConfig` with `disable_compile=True` and, unless `cache_implementation` is set, a
dynamic cache that grows by one token per step. transformers compiles a model's forward for decoding
(`get_compiled_call`, `torch.compile` with its `CompileConfig`: inductor and CUDA graphs by default) when a
generation uses a compileable cache and `disable_compile` is False. So this module turns compilation back on in the
trainer's public `generation_config` (`compile_config`: transformers' defaults on CUDA; elsewhere transformers
compiles only when its `CompileConfig` has its private compile-on-all-devices flag set, which `compile_config_for`
does through `trl_contact.compile_config_all_devices`, mode "default": CUDA graphs are CUDA-only) and hands
`generate` a static cache of its own (`StaticCaches`):

* **one cache per (batch size, cache length), for the whole run.** Given `cache_implementation="static"`,
  transformers builds a new `StaticCache` in every `generate` call, so its key/value tensors sit at new addresses in
  every generation. CUDA-graph trees take those addresses as static inputs: each generation would record the decode
  graph again (until torch stops using CUDA graphs for it after `cudagraph_unexpected_rerecord_limit` re-records). A
  cache passed to `generate` is the caller's (transformers' "user-defined cache"): it is reset in place (zeroed, its
  length set to 0) before each generation and its tensors keep their addresses for the run. It stays allocated
  between generations (the memory estimate counts it as resident: `consumer_gpu.memory`, `static_cache`).
* **a fixed cache length** (`StaticCacheSizer`): prompt budget + `max_new_tokens`, whatever the prompts' lengths, so
  a decode step has the same shapes at every token of every step and its compiled graph (and CUDA graph) is
  replayed, not retraced (`tests/training/test_generation.py` counts the graphs and the caches).

Not compiled: the prefill (one forward per generation). Generations of another batch size (evaluation) get a cache
of their own and compile once more. transformers refuses to compile bitsandbytes-quantized models (their quantizer
is not compileable), which is why 4-bit weights need the bf16 generation copy of `lora_merge.GenerationCopy`.
"""

import logging
import math

logger = logging.getLogger(__name__)

PROMPT_BUCKET = 64  # prompt budgets are rounded up to a multiple of this many tokens


def compile_config_for(device_type: str):
    """transformers' `CompileConfig` for generation on `device_type` ("cuda", "cpu", ...).

    Raises:
        RuntimeError: transformers' `CompileConfig` lacks `_compile_all_devices`, needed to compile off CUDA.
    """
    from transformers.generation.configuration_utils import CompileConfig  # here: `memory` imports this module

    if device_type == "cuda":
        return CompileConfig()
    from ..trl_contact import compile_config_all_devices  # private transformers API: only through trl_contact

    return compile_config_all_devices()


def prompt_budget(longest_prompt: int) -> int:
    """The prompt tokens a static cache is sized for: `longest_prompt` rounded up to a multiple of `PROMPT_BUCKET`."""
    return PROMPT_BUCKET * max(1, math.ceil(longest_prompt / PROMPT_BUCKET))


class StaticCacheSizer:
    """Sizes the static cache before each generation: `prompt budget + max_new_tokens` tokens a sequence, grown (to
    the next multiple of `PROMPT_BUCKET`) only when a prompt is longer than the budget.

    Args:
        generation_config: the trainer's `GenerationConfig`, changed in place: compilation on, no
            `cache_implementation` (the cache is handed to `generate`, `StaticCaches`).
        device_type: where the model runs ("cuda", "cpu", ...).
        prompt_length: the prompt budget in tokens (`GRPOConfig.generation_max_prompt_length`); None: set by the
            first generation.
    """

    def __init__(self, generation_config, device_type: str, prompt_length: int | None = None):
        self.max_new_tokens = generation_config.max_new_tokens
        self.prompt_length = prompt_length
        generation_config.cache_implementation = None  # transformers refuses it next to a cache of the caller's
        generation_config.disable_compile = False
        generation_config.compile_config = compile_config_for(device_type)
        self.grown = 0  # how many times a longer prompt grew the cache after the first generation
        self.fitted = False  # whether a generation was sized (the first batch sets the budget, or grows it, freely)

    def fit(self, longest_prompt: int) -> int:
        """Make the cache hold prompts of `longest_prompt` tokens (the padded prompt length of the next batch); return
        the cache length in tokens a sequence (prompt budget + `max_new_tokens`)."""
        if self.prompt_length is None:
            self.prompt_length = prompt_budget(longest_prompt)
        elif longest_prompt > self.prompt_length:
            again = " and the decode step compiles once more" if self.fitted else ""
            self.grown += self.fitted
            logger.warning(
                "A prompt of %d tokens is longer than the static cache's %d prompt tokens: the cache grows to %d "
                "prompt tokens%s. Set generation_max_prompt_length to at least the longest prompt to avoid it.",
                longest_prompt,
                self.prompt_length,
                prompt_budget(longest_prompt),
                again,
            )
            self.prompt_length = prompt_budget(longest_prompt)
        self.fitted = True
        return self.prompt_length + self.max_new_tokens


class StaticCaches:
    """The static KV caches of a run: one transformers `StaticCache` per (batch size, cache length), built once and
    reset in place before each generation that uses it, so that its key/value tensors keep their addresses.

    A cache of a new length (the sizer grew it) replaces those of the old length, which are freed.
    """

    def __init__(self):
        self.caches: dict[tuple[int, int], object] = {}  # (batch size, cache length) -> StaticCache
        self.built = 0  # caches built so far

    def for_generation(self, model, batch_size: int, length: int):
        """The cache for one `generate` call of `model` on `batch_size` sequences (prompts x returned sequences) of
        up to `length` tokens: the one built before for these sizes, reset (zeroed, length 0), or a new one. Its
        tensors are allocated at the first forward, on the device and in the dtype of the model's key states."""
        from transformers import StaticCache

        key = (batch_size, length)
        cache = self.caches.get(key)
        if cache is not None:
            cache.reset()
            return cache
        self.caches = {k: c for k, c in self.caches.items() if k[1] == length}
        cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=length)
        self.caches[key] = cache
        self.built += 1
        return cache
