"""Adapter-only LoRA sync to TRL's colocated vLLM (`vllm_lora_sync="adapter"`): vLLM keeps the base weights it
loaded (in its dtype, or its own quantization) and each sync hands it only the LoRA A/B, which every generation then
uses through vLLM's LoRA support; nothing is merged into the base weights (TRL merges, lossy on quantized bases:
huggingface/trl#3466, #5975).

    `config`   the field (`VLLMLoRAFields`) and its rules against TRL's vLLM settings (`VLLM_LORA_CONFIG`)
    `adapter`  what vLLM can load of a PEFT model (`adapter_problem`, `max_lora_rank`), and `AdapterSync`: the
               adapter saved to a folder and loaded into the engine in place
    `feature`  `VLLMLoRASync`, the trainer wiring (the `generation` point), and `vllm_lora_engine`, which the trainer
               enters around TRL's `__init__` so that the engine is built with LoRA enabled
"""
