"""The trainer wiring of adapter-only LoRA sync: `vllm_lora_engine`, entered around TRL's `__init__` (the engine is
built there, with a fixed argument list), and `VLLMLoRASync`, entered around each of TRL's generations (the
`generation` point of `composition.STEP`, TRL's `_generate_single_turn`, which syncs when the step changed and then
generates through its `VLLMGeneration`).

With `vllm_lora_sync="adapter"`:

1. At `__init__`, before the model loads: the LoRA config TRL will train with is checked for what vLLM cannot load
   (`adapter.adapter_problem`), and TRL's engine is built with `enable_lora=True`, `max_loras=1` and
   `max_lora_rank` the smallest rank vLLM allows at or above the adapter's `r` (`trl_contact.engine_arguments`).
   After TRL's `__init__`: LoRA on the embeddings is refused (`adapter.embedding_lora_problem`).
2. Around each generation (`trl_contact.adapter_generation`): TRL's sync saves the adapter to the run's temporary
   folder and loads it into vLLM in place (`adapter.AdapterSync`), and TRL's `generate` passes the adapter's
   `LoRARequest`. vLLM's base weights are the checkpoint's from start to end.
"""

import contextlib
import tempfile

from ..feature_api import Feature
from ..trl_contact import adapter_generation, engine_arguments, vllm_lora_ranks
from .adapter import AdapterSync, adapter_problem, embedding_lora_problem, lora_config_of, max_lora_rank


@contextlib.contextmanager
def vllm_lora_engine(args, model, given: dict):
    """Around TRL's `__init__`: with `vllm_lora_sync="adapter"`, TRL's colocated engine built with LoRA enabled;
    nothing otherwise. `model` and `given` (the trainer's other arguments by name: `peft_config`, `rollout_func`) are
    as the trainer received them.

    Raises:
        ValueError: one line naming `vllm_lora_sync='adapter'` and the cause: no PEFT LoRA model (neither a
            `LoraConfig` as `peft_config` nor a `PeftModel` with a LoRA adapter), an adapter vLLM cannot load, a
            rank above vLLM's largest, or a `rollout_func` (which calls vLLM itself, without the adapter).
    """
    if args.vllm_lora_sync != "adapter":
        yield
        return
    head = "vllm_lora_sync='adapter'"
    if given.get("rollout_func") is not None:
        raise ValueError(f"{head}: a rollout_func generates with vLLM itself, without the adapter; use "
                         "vllm_lora_sync='merge' with it")  # fmt: skip
    config = lora_config_of(model, given.get("peft_config"))
    if config is None:
        got = type(given.get("peft_config")).__name__ if given.get("peft_config") is not None else type(model).__name__
        raise ValueError(f"{head} syncs a LoRA adapter: pass peft_config=LoraConfig(...) or a PeftModel with a LoRA "
                         f"adapter (got {got})")  # fmt: skip
    problem = adapter_problem(config)
    if problem is not None:
        raise ValueError(f"{head}: the LoRA adapter cannot be loaded by vLLM: {problem}; use vllm_lora_sync='merge'")
    extra = {"enable_lora": True, "max_loras": 1, "max_lora_rank": max_lora_rank(config.r, vllm_lora_ranks())}
    with engine_arguments(extra):
        yield


class VLLMLoRASync(Feature):
    """Adapter-only LoRA sync to colocated vLLM (module docstring); on with `vllm_lora_sync="adapter"`.

    Attributes:
        sync: the `AdapterSync` (its `folder`, its `request`, the `syncs` done so far).
    """

    name = "vllm_lora"

    @classmethod
    def build(cls, trainer) -> "VLLMLoRASync | None":
        if trainer.args.vllm_lora_sync != "adapter":
            return None
        problem = embedding_lora_problem(trainer.model)
        if problem is not None:
            raise ValueError(f"vllm_lora_sync='adapter': the LoRA adapter cannot be loaded by vLLM: {problem}; use "
                             "vllm_lora_sync='merge'")  # fmt: skip
        return cls(trainer)

    def __init__(self, trainer):
        super().__init__(trainer)
        self.folder = tempfile.TemporaryDirectory(prefix="trl-grpo-ext-vllm-lora-")  # removed with the feature
        self.sync = AdapterSync(trainer.model, trainer.vllm_generation.llm, self.folder.name)

    def generation(self, prompt_ids, generate):
        return adapter_generation(self.trainer.vllm_generation, self.sync, self.sync.request)
