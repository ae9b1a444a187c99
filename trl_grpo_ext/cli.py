"""The `trl-grpo-ext` command.

    trl-grpo-ext grpo [TRL grpo arguments] [--config file.yaml]   # TRL's `trl grpo` script on trl_grpo_ext's classes
    trl-grpo-ext tiny-model OUTPUT_DIR [--seed N]                  # a tiny random-init Qwen2 model, no download
    trl-grpo-ext memory --config file.yaml [--card-gib 8]          # estimated peak GPU memory, term by term

`grpo` takes every argument of TRL's `trl grpo` (script arguments, `GRPOConfig` with this package's fields, and
`ModelConfig`); for several processes run it as `accelerate launch -m trl_grpo_ext.cli grpo ...`.
"""

import argparse
import sys


def _grpo(argv: list[str]) -> int:
    from . import register

    register()  # before TRL's script imports GRPOConfig / GRPOTrainer inside its functions
    from trl.scripts import grpo

    parser = grpo.make_parser(prog="trl-grpo-ext grpo")
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(argv)
    grpo.main(script_args, training_args, model_args, dataset_args)
    return 0


def _tiny_model(argv: list[str]) -> int:
    from .tiny_model import save_tiny_model

    parser = argparse.ArgumentParser(
        prog="trl-grpo-ext tiny-model", description="Write a tiny random-init Qwen2 model."
    )
    parser.add_argument("output_dir", help="folder to write the model and tokenizer into")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights (default 0)")
    args = parser.parse_args(argv)
    path = save_tiny_model(args.output_dir, seed=args.seed)
    print(f"Wrote a tiny Qwen2 model and tokenizer to {path}")
    return 0


def _positive(kind):
    """An argparse type: `kind` (int or float) > 0, else a usage error naming the value."""

    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _memory(argv: list[str]) -> int:
    from pathlib import Path

    from . import memory, presets

    parser = argparse.ArgumentParser(
        prog="trl-grpo-ext memory",
        description="Estimated peak GPU memory of a recipe config, term by term (trl_grpo_ext.memory); no download. "
        "Any other --field value pair overrides the config. Exit code 1 when the peak is above 90%% of --card-gib.",
    )
    parser.add_argument("--config", required=True, help="recipe YAML (GRPOConfig and ModelConfig fields)")
    parser.add_argument(
        "--card-gib", type=_positive(float), help="the card's memory in GiB: says whether the run fits"
    )
    parser.add_argument(
        "--prompt-length",
        type=_positive(int),
        default=memory.DEFAULT_PROMPT_LENGTH,
        help="longest prompt in a batch, tokens",
    )
    parser.add_argument("--model-config", help="the model's config.json (default: known models, local folders)")
    args, overrides = parser.parse_known_args(argv)
    if not Path(args.config).is_file():
        parser.error(f"--config {args.config}: no such file")
    try:
        training_args, model_args = presets.load_config(args.config, *overrides)
        if not (args.model_config or model_args.model_name_or_path):
            raise ValueError(
                f"{args.config} sets no model_name_or_path (a tiny_model config builds its model at run time): pass "
                "--model-config with a config.json or a model folder"
            )
        model_config = presets.architecture_config(args.model_config or model_args.model_name_or_path)
        result = memory.estimate_for(
            model_config, training_args, model_args, prompt_length=args.prompt_length, card_gib=args.card_gib
        )
    except ValueError as error:
        parser.error(str(error))
    method = "full fine-tuning"
    if model_args.use_peft:
        method = f"{'QLoRA (NF4)' if model_args.load_in_4bit else 'LoRA (bf16)'} rank {model_args.lora_r}"
    print(
        f"{args.model_config or model_args.model_name_or_path}, {method}: {training_args.per_device_train_batch_size} "
        f"completions per micro-batch, {training_args.generation_batch_size} generated at once, prompt <= "
        f"{args.prompt_length} + "
        f"completion {training_args.max_completion_length} tokens, gradient checkpointing "
        f"{'on' if training_args.gradient_checkpointing else 'off'}\n"
    )
    print(result.as_table(args.card_gib))
    return 1 if args.card_gib is not None and presets.fit_warning(result, args.card_gib) else 0


COMMANDS = {"grpo": _grpo, "tiny-model": _tiny_model, "memory": _memory}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(COMMANDS)
        print(f"usage: trl-grpo-ext {{{names}}} ...\n\n{__doc__}", file=sys.stderr if argv else sys.stdout)
        return 2 if argv and argv[0] not in ("-h", "--help") else 0
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
