"""What adapter-only LoRA sync (`trl_grpo_ext.vllm_lora`, `vllm_lora_sync="adapter"`) uses of TRL's colocated vLLM
(`trl.generation.vllm_generation`, written against trl 1.16.0) and of vLLM (written against 0.30.0).

TRL builds the engine inside `VLLMGeneration._init_vllm` with a fixed argument list (`self.llm = LLM(...)`, the
module's name `LLM`), syncs by merging the adapter into the base weights (`VLLMGeneration.sync_weights`, which
`GRPOTrainer._generate_single_turn` calls as `self.vllm_generation.sync_weights()`), and generates with
`self.llm.generate(...)` without a `lora_request`. So, for the trainer that asks for it:

- `engine_arguments`: the module's `LLM` wrapped while TRL's `__init__` runs, the engine built with extra arguments
  (`enable_lora`, `max_lora_rank`, `max_loras`);
- `adapter_generation`: for the duration of one of TRL's generations, the trainer's `VLLMGeneration` gets another
  `sync_weights` (an instance attribute over TRL's method) and an `llm` whose `generate` passes the adapter's
  `LoRARequest` (`LoRAEngine`); both are put back after it.

The TRL side is checked when this package is imported (`missing_vllm_internals`, from the source of TRL's methods:
vLLM itself is optional and absent from the main environment); vLLM's side is public API (`LLM.generate`'s
`lora_request`, `LLMEngine.add_lora`, `LLM.reset_prefix_cache`, `vllm.lora.request.LoRARequest`) but for the ranks
vLLM accepts as `max_lora_rank` (`vllm_lora_ranks`, read from `vllm.config.lora.MaxLoRARanks`).
"""

import contextlib
import inspect
import typing

from trl.generation import vllm_generation as _trl_vllm
from trl.trainer.grpo_trainer import GRPOTrainer as TRLGRPOTrainer

# what of TRL's source adapter-only sync relies on, by (where, the text that must be in it)
VLLM_INTERNALS = (
    ("VLLMGeneration._init_vllm", "self.llm = LLM("),  # the engine built from the module's name `LLM`
    ("VLLMGeneration.generate", "self.llm.generate("),  # generation through `self.llm`
    ("GRPOTrainer._generate_single_turn", "self.vllm_generation.sync_weights()"),  # the sync, as an attribute call
    ("GRPOTrainer.__init__", "self.vllm_generation = VLLMGeneration("),
)


def missing_vllm_internals(trainer_class: type = TRLGRPOTrainer, generation_class: type | None = None) -> list[str]:
    """The entries of `VLLM_INTERNALS` that the source of `trainer_class` / `generation_class` (TRL's `GRPOTrainer`
    and `VLLMGeneration`) no longer holds, as problems."""
    owners = {"GRPOTrainer": trainer_class, "VLLMGeneration": generation_class or _trl_vllm.VLLMGeneration}
    problems = []
    for where, text in VLLM_INTERNALS:
        owner, method = where.split(".")
        # the method as TRL defines it (a subclass from elsewhere, a test's, may override it and call super())
        defining = next((c for c in owners[owner].__mro__ if method in vars(c) and c.__module__.startswith("trl.")),
                        None)  # fmt: skip
        source = inspect.getsource(vars(defining)[method]) if defining is not None else ""
        if text not in source:
            problems.append(f"trl {where} no longer has `{text}` (written against 1.16.0; vllm_lora_sync='adapter')")
    return problems


@contextlib.contextmanager
def engine_arguments(extra: dict):
    """Inside the block, TRL's colocated engine is built with `extra` over TRL's arguments (`LLM(**TRL's, **extra)`);
    nothing changes with `extra` empty. The name is put back on exit."""
    if not extra:
        yield
        return
    build = _trl_vllm.LLM

    def with_extra(**kwargs):
        return build(**{**kwargs, **extra})

    _trl_vllm.LLM = with_extra
    try:
        yield
    finally:
        _trl_vllm.LLM = build


class LoRAEngine:
    """A vLLM `LLM` whose `generate` passes `lora_request` (every generation through the adapter); every other
    attribute is the engine's."""

    def __init__(self, engine, lora_request):
        self.engine, self.lora_request = engine, lora_request

    def generate(self, *args, **kwargs):
        return self.engine.generate(*args, lora_request=self.lora_request, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@contextlib.contextmanager
def adapter_generation(generation, sync, lora_request):
    """Inside the block TRL's `generation` (its `VLLMGeneration`) syncs with `sync()` instead of merging and generates
    through `lora_request`; put back on exit, also on error. Returns (yields) the engine itself."""
    engine = generation.llm
    generation.llm = LoRAEngine(engine, lora_request)
    generation.sync_weights = sync  # over TRL's method, on this instance only
    try:
        yield engine
    finally:
        generation.llm = engine
        del generation.sync_weights


def vllm_lora_ranks() -> tuple[int, ...]:
    """The values vLLM accepts as `max_lora_rank` (`vllm.config.lora.MaxLoRARanks`: 1, 8, 16, ... in 0.30)."""
    from vllm.config.lora import MaxLoRARanks

    return tuple(sorted(typing.get_args(MaxLoRARanks)))
