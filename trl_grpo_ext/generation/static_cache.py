"""A static KV cache and a compiled decode step for TRL's `model.generate` (`GRPOConfig.generation_compile`).

TRL 1.16 builds its `GenerationConfig` with `disable_compile=True` and, unless `cache_implementation` is set, a
dynamic cache that grows by one token per step. transformers compiles a model's forward for decoding
(`get_compiled_call`, `torch.compile` with its `CompileConfig`: inductor and CUDA graphs by default) when a
generation uses a compileable cache and `disable_compile` is False. So this module turns compilation back on in the
trainer's public `generation_config` and sets three of its fields:

* `cache_implementation="static"`: K and V for every layer preallocated at full length, so a decode step has the same
  shapes at every token and the compiled graph (and its CUDA graph) is replayed, not retraced;
* `max_cache_len`: transformers sizes the cache max(prompt + `max_new_tokens`, `max_cache_len`), so a fixed length
  (prompt budget + `max_completion_length`) gives the same cache shape in every step, whatever the prompts' lengths,
  and hence no recompilation across steps (`tests/test_generation.py` counts the graphs);
* `compile_config`: transformers' defaults on CUDA. Elsewhere transformers compiles only when its
  `CompileConfig` has its private compile-on-all-devices flag set, which `compile_config_for` does through
  `trl_contact.compile_config_all_devices` (mode "default": CUDA graphs are CUDA-only). That private attribute is
  checked, so a transformers release without it fails at init, loudly.

Not compiled: the prefill (one forward per generation) and generations of another batch size (evaluation) compile
once more. transformers refuses to compile bitsandbytes-quantized models (their quantizer is not compileable), which
is why 4-bit weights need the bf16 generation copy of `lora_merge.GenerationCopy`.
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
    """Sizes the static cache of a `GenerationConfig` before each generation: `prompt budget + max_new_tokens`,
    grown (to the next multiple of `PROMPT_BUCKET`) only when a prompt is longer than the budget.

    Args:
        generation_config: the trainer's `GenerationConfig`, changed in place (compilation on, static cache).
        device_type: where the model runs ("cuda", "cpu", ...).
        prompt_length: the prompt budget in tokens (`GRPOConfig.generation_max_prompt_length`); None: set by the
            first generation.
    """

    def __init__(self, generation_config, device_type: str, prompt_length: int | None = None):
        self.generation_config = generation_config
        self.prompt_length = prompt_length
        generation_config.cache_implementation = "static"
        generation_config.disable_compile = False
        generation_config.compile_config = compile_config_for(device_type)
        self.grown = 0  # how many times a longer prompt grew the cache after the first generation
        if prompt_length is not None:
            self._set(prompt_length)

    def fit(self, longest_prompt: int) -> None:
        """Make the cache hold prompts of `longest_prompt` tokens (the padded prompt length of the next batch)."""
        if self.prompt_length is None:
            self._set(prompt_budget(longest_prompt))
        elif longest_prompt > self.prompt_length:
            self.grown += 1
            logger.warning(
                "A prompt of %d tokens is longer than the static cache's %d prompt tokens: the cache grows to %d "
                "prompt tokens and the decode step compiles once more. Set generation_max_prompt_length to at least "
                "the longest prompt to avoid it.",
                longest_prompt,
                self.prompt_length,
                prompt_budget(longest_prompt),
            )
            self._set(prompt_budget(longest_prompt))

    def _set(self, prompt_length: int) -> None:
        self.prompt_length = prompt_length
        self.generation_config.max_cache_len = prompt_length + self.generation_config.max_new_tokens

    @property
    def cache_length(self) -> int | None:
        """Tokens per sequence the static cache holds (prompt budget + completion), None before the first batch."""
        return self.generation_config.max_cache_len
