"""The `trl-grpo-ext` command.

    trl-grpo-ext grpo [TRL grpo arguments] [--config file.yaml]   # TRL's `trl grpo` script on trl_grpo_ext's classes
    trl-grpo-ext tiny-model OUTPUT_DIR [--seed N]                  # a tiny random-init Qwen2 model, no download

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


COMMANDS = {"grpo": _grpo, "tiny-model": _tiny_model}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(COMMANDS)
        print(f"usage: trl-grpo-ext {{{names}}} ...\n\n{__doc__}", file=sys.stderr if argv else sys.stdout)
        return 2 if argv and argv[0] not in ("-h", "--help") else 0
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
