"""GSM8K test accuracy of a model, a training checkpoint or a LoRA adapter folder.

    python recipes/eval_gsm8k.py --model_name_or_path outputs/qwen2.5-1.5b-lora-gsm8k --limit 200
    python recipes/eval_gsm8k.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --maj_k 8   # openai/gsm8k, Hub
    python recipes/eval_gsm8k.py --model_name_or_path outputs/demo_cpu --dataset_path DIR --limit 8   # GSM8K in DIR

Reports greedy pass@1 accuracy, strict (final answer in `\\boxed{}`, the trained format) and lenient (the answer
anywhere in the completion), and with `--maj_k K` the majority vote over K sampled completions. When half the greedy
completions or more are empty or blank, a line says whether the model collapsed in training or gave no answer before
it either (measured on a recipe run of the tiny model, whose starting model it loads; otherwise the line gives the
command that tells). Prints a progress line a batch (problems done, time elapsed and left), then a table, and writes
the figures, every completion and the decoding settings used (`"generation"`) to `--output_file` (default `<model
folder or .>/eval_gsm8k.json`, so the `eval_results.json` a training run writes is kept).

Decoding takes nothing from the model's `generation_config.json` (a Qwen2.5 Instruct checkpoint's repetition penalty,
top-k, top-p and temperature): greedy is argmax, maj@k samples at `--temperature` over the whole vocabulary
(`trl_grpo_ext.gsm8k.eval_generation`).

Errors: the model path and the data are checked before the model is loaded. A user error (a missing model or run
folder, bad data, an unknown option: "did you mean `--max_new_tokens`?") prints one line, `eval_gsm8k.py: error:
<what is wrong, the value, the fix>`, and exits with code 1 (2 for an unknown option); `--debug` (or
`TRL_GRPO_EXT_DEBUG=1`) shows the full traceback instead, and the known harmless start-up warnings the script hides
(`trl_grpo_ext.cli.errors`).
"""

import json
import os
import sys
from pathlib import Path

from trl_grpo_ext.cli import errors
from trl_grpo_ext.error_reports import MissingDependencyError

if __name__ == "__main__":  # before TRL's imports, which log bitsandbytes' CPU-kernel line
    errors.quiet_script_start()
    errors.stop_while_starting("eval_gsm8k.py")  # a stop signal during the imports: one line

from dataclasses import dataclass, field

from transformers import HfArgumentParser, set_seed

from trl_grpo_ext.gsm8k.data import load_gsm8k

try:  # the GSM8K task's reward functions are the `gsm8k` extra (math-verify): one line, not a traceback
    from trl_grpo_ext.gsm8k.evaluation import (
        EMPTY_SHARE,
        collapse_warning,
        evaluate_gsm8k,
        format_table,
        load_model_for_eval,
        run_chat_template_kwargs,
        untrained_empty_share,
        write_results,
    )
except MissingDependencyError as error:
    raise SystemExit(f"eval_gsm8k.py: error: {error}") from None


@dataclass
class EvalArguments:
    model_name_or_path: str = field(metadata={"help": "Hub id or folder: model, checkpoint or LoRA adapter."})
    dataset_path: str | None = field(default=None, metadata={"help": "Local GSM8K-format folder; default: Hub."})
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N test problems."})
    batch_size: int = field(default=16, metadata={"help": "Prompts generated at once."})
    max_new_tokens: int = field(default=512, metadata={"help": "Longest completion, in tokens."})
    maj_k: int = field(default=0, metadata={"help": "Also report maj@k over K sampled completions (K > 1)."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature for maj@k."})
    dtype: str = field(default="auto", metadata={"help": "Weights dtype: auto, bfloat16, float16, float32."})
    seed: int = field(default=42, metadata={"help": "maj@k sampling seed: a batch's is seed + its first index."})
    output_file: str | None = field(default=None, metadata={"help": "JSON results path."})
    chat_template_kwargs: str | None = field(
        default=None,
        metadata={"help": "JSON object the chat template is rendered with, as training's GRPOConfig field, e.g. "
                  "'{\"enable_thinking\": false}'. Default: the run's chat_template_kwargs.json, else none."},
    )  # fmt: skip

    def __post_init__(self):
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or unset for the whole test split), got {self.limit}")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(f"batch_size ({self.batch_size}) and max_new_tokens ({self.max_new_tokens}) must be >= 1")
        if self.maj_k > 1 and self.temperature <= 0:
            raise ValueError(f"maj_k={self.maj_k} samples completions, so temperature must be > 0: {self.temperature}")
        if self.chat_template_kwargs is not None:
            try:
                parsed = json.loads(self.chat_template_kwargs)
            except json.JSONDecodeError as error:
                raise ValueError(f"chat_template_kwargs={self.chat_template_kwargs!r} is not JSON ({error})") from None
            if not isinstance(parsed, dict):
                raise ValueError(f"chat_template_kwargs={self.chat_template_kwargs!r} must be a JSON object")


def chat_template_kwargs_of(args: EvalArguments) -> dict:
    """The chat template's keyword arguments: `--chat_template_kwargs`, else the run's, else none; says which."""
    if args.chat_template_kwargs is not None:
        return json.loads(args.chat_template_kwargs)
    found = run_chat_template_kwargs(args.model_name_or_path)
    if found is None:
        return {}
    kwargs, path = found
    print(f"Prompts formatted as in training, with chat_template_kwargs {kwargs} (from {path})")
    return kwargs


def starting_model(path: str) -> tuple[str | None, bool]:
    """The model a run at `path` started from, and whether it is the recipe's tiny model (small enough to load beside
    the evaluated one): the run's `tiny-model/` folder (in a run folder, or beside a checkpoint), the base model of a
    LoRA adapter folder, else (None, False)."""
    for folder in (Path(path), Path(path).parent):
        if (folder / "tiny-model" / "config.json").is_file():
            return str(folder / "tiny-model"), True
    adapter = Path(path) / "adapter_config.json"
    if adapter.is_file():
        return json.loads(adapter.read_text()).get("base_model_name_or_path"), False
    return None, False


def main(args: EvalArguments) -> dict:
    errors.check_model_path("model_name_or_path", args.model_name_or_path)  # a missing folder fails here
    dataset = load_gsm8k("test", args.dataset_path, limit=args.limit)  # fails on bad data before loading the model
    chat_template_kwargs = chat_template_kwargs_of(args)
    set_seed(args.seed)
    model, tokenizer = load_model_for_eval(args.model_name_or_path, dtype=args.dtype)
    results = evaluate_gsm8k(
        model,
        tokenizer,
        dataset,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        maj_k=args.maj_k,
        temperature=args.temperature,
        chat_template_kwargs=chat_template_kwargs,
        seed=args.seed,
    )
    results["model"] = args.model_name_or_path
    base, tiny = starting_model(args.model_name_or_path)
    if results["empty_completions"] >= EMPTY_SHARE and tiny:  # an untrained model, or one its training wrecked?
        before, _ = load_model_for_eval(base, dtype=args.dtype)
        results["untrained"] = untrained_empty_share(before, tokenizer, dataset, max_new_tokens=args.max_new_tokens,
                                                     chat_template_kwargs=chat_template_kwargs)  # fmt: skip
    output_file = args.output_file
    if output_file is None:
        folder = args.model_name_or_path if os.path.isdir(args.model_name_or_path) else "."
        output_file = os.path.join(folder, "eval_gsm8k.json")
    path = write_results(results, os.path.dirname(output_file) or ".", os.path.basename(output_file))
    print(format_table(results))
    print(f"Saved {path}")
    warning = collapse_warning(results, base=base)
    if warning:
        print(warning)
    return results


PROG = "eval_gsm8k.py"


def make_parser() -> HfArgumentParser:
    # allow_abbrev=False: a typo'd option is an error with "did you mean", not the option it is the start of
    return HfArgumentParser(EvalArguments, prog=PROG, epilog=errors.DEBUG_HELP, allow_abbrev=False)


def _cli(argv: list[str]) -> None:
    (eval_args,) = errors.parse_command_line(make_parser(), argv)
    main(eval_args)


def cli(argv: list[str] | None = None) -> int:
    """The script run from the command line (`argv` defaults to `sys.argv[1:]`); returns the exit code, 1 or 2 for a
    user error printed as one line (`trl_grpo_ext.cli.errors.run`)."""
    return errors.run(_cli, sys.argv[1:] if argv is None else argv, prog=PROG)


if __name__ == "__main__":
    raise SystemExit(cli())
