"""GRPO on GSM8K math word problems with `trl_grpo_ext`, then an evaluation on held-out problems.

Launch (any `GRPOConfig`, `ModelConfig` or script field can be overridden on the command line):

    accelerate launch recipes/math_gsm8k.py --config recipes/configs/gsm8k-24gb.yaml   # or gsm8k-{8,12,16}gb.yaml
    python recipes/math_gsm8k.py --config recipes/configs/demo_cpu.yaml            # CPU demo, no download
    python recipes/math_gsm8k.py --config recipes/configs/demo_cpu.yaml --dataset_path DIR   # GSM8K in DIR

Data: the Hub dataset `openai/gsm8k` (config `main`) by default; `--dataset_path DIR` reads GSM8K-format
`train.jsonl` / `test.jsonl` from a local folder; `--synthetic_problems N` uses N seeded generated problems instead
(the CPU demo). While a step runs longer than 30 s (the first step; 5 minutes for later ones), progress lines say
what it is doing (`trl_grpo_ext.reporting.progress`: generating, how many tokens so far; scoring; the update). After
training, the model is evaluated on `--eval_limit` test problems (greedy pass@1, strict and lenient: argmax decoding,
whatever the checkpoint's generation_config.json sets; `--eval_limit 0` skips it, and a run of fewer than 10 steps
takes at most 8 problems, saying so), its batches of `--eval_batch_size` shared over the processes, a progress line a
batch; `eval_results.json` (with the decoding settings used) is written to `output_dir`. Relaunching a run whose
last step is done with `--resume_from_checkpoint true` (a requeued job) trains nothing and does only the end-of-run
work it still owes (the final model, the evaluation), or says there is none. SIGTERM (a scheduler stopping the
job) and Ctrl-C are handled wherever they arrive: one line at receipt; in training the step in progress finishes and
its checkpoint is saved, in the final save the model is saved (and the step's checkpoint kept) before stopping; a
second signal stops at once. One line then says what was saved, what was
not, and the command that resumes or finishes the run.

Errors: everything that needs no model is checked before one is built or loaded (the config file and every key in it
or on the command line, with "did you mean `policy_group_column`?", the values, the packages, the reward names, the
model path, the data). A user error prints one line, `math_gsm8k.py: error: <what is wrong, the value, the fix>`, and
exits with code 1 (2 for an unknown key or a missing config file); `--debug` (or `TRL_GRPO_EXT_DEBUG=1`) shows the
full traceback instead, and the known harmless start-up warnings the recipe hides (`trl_grpo_ext.cli.errors`). An
error raised once training has started (a reward function's, hours in) or in the evaluation after it also writes its
full traceback and the versions to `<output_dir>/error.log`, which the line names (`... (full traceback:
<output_dir>/error.log)`); a bug's traceback is printed too, ending with that path.

Stock baseline: `--features off` runs the same preset as stock TRL GRPO: every setting trl_grpo_ext adds to TRL's
`GRPOConfig` (policy groups, prompt skipping, entropy and gradient regularization, fast generation, the run doctor) is
reset to its default before the trainer is built, and one line names those the config had set; the model, LoRA, batch
sizes, learning rate, rewards, dtype and memory settings stay the preset's (docs/recipes/presets.md):

    accelerate launch recipes/math_gsm8k.py --config recipes/configs/gsm8k-24gb.yaml --features off
"""

import contextlib
import dataclasses
import json
import sys

from trl_grpo_ext.cli import errors
from trl_grpo_ext.error_reports import MissingDependencyError

if __name__ == "__main__":  # before TRL's imports, which log bitsandbytes' CPU-kernel line
    errors.quiet_script_start()
    errors.stop_while_starting("math_gsm8k.py", trains=True)  # a stop signal during the imports: one line

from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, PrinterCallback, ProgressCallback
from trl import ModelConfig, TrlParser, get_peft_config, get_quantization_config
from trl.models import unwrap_model_for_generation
from trl.rewards import get_soft_overlong_punishment

from trl_grpo_ext import GRPOConfig, GRPOTrainer
from trl_grpo_ext.cli.optional_dependencies import check_optional_dependencies, deepspeed_requested
from trl_grpo_ext.cli.tiny_model import save_tiny_model
from trl_grpo_ext.config import own_fields
from trl_grpo_ext.consumer_gpu import presets
from trl_grpo_ext.generation.checks import model_setting_problem
from trl_grpo_ext.gsm8k.data import load_gsm8k, synthetic_gsm8k, to_grpo_rows

try:  # the GSM8K task's reward functions are the `gsm8k` extra (math-verify): one line, not a traceback
    from trl_grpo_ext.gsm8k.evaluation import (
        EMPTY_SHARE,
        collapse_warning,
        evaluate_gsm8k,
        format_table,
        save_chat_template_kwargs,
        untrained_empty_share,
        write_results,
    )
    from trl_grpo_ext.gsm8k.rewards import REWARD_FUNCS
except MissingDependencyError as error:
    raise SystemExit(f"math_gsm8k.py: error: {error}") from None
from trl_grpo_ext.reporting.callbacks import MetricsTableCallback
from trl_grpo_ext.reporting.progress import StepProgress
from trl_grpo_ext.resume import Stopped, last_complete_checkpoint, saved_model_step


@dataclass
class GSM8KScriptArguments:
    """Data, reward and evaluation settings of the GSM8K recipe (model and training settings are TRL's)."""

    dataset_path: str | None = field(
        default=None,
        metadata={
            "help": "Folder with GSM8K-format train.jsonl/test.jsonl (a copy of openai/gsm8k). Default: the Hub."
        },
    )
    synthetic_problems: int = field(
        default=0,
        metadata={"help": "When > 0 and no dataset_path: train on this many seeded generated problems (no download)."},
    )
    train_limit: int | None = field(default=None, metadata={"help": "Use only the first N training problems."})
    eval_limit: int = field(
        default=200,
        metadata={"help": "Test problems to evaluate after training (at most 8 after a run of fewer than 10 steps, "
                  "said in a line); 0 skips it."},
    )  # fmt: skip
    eval_batch_size: int = field(default=16, metadata={"help": "Prompts generated at once in the evaluation."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["gsm8k_accuracy", "gsm8k_format"],
        metadata={"help": f"Reward functions by name: {', '.join(REWARD_FUNCS)}, soft_overlong_punishment."},
    )
    tiny_model: bool = field(
        default=False,
        metadata={
            "help": "Build a tiny random-init Qwen2 model in <output_dir>/tiny-model and train it (no download); "
            "a model named with model_name_or_path is trained instead."
        },
    )
    features: str = field(
        default="on",
        metadata={
            "help": "on: the config's trl_grpo_ext settings as given. off: a stock TRL GRPO baseline of the same "
            "config: every trl_grpo_ext setting (policy groups, prompt skipping, entropy and gradient regularization, "
            "fast generation, the run doctor) reset to its default; TRL's and the model's settings kept."
        },
    )

    def __post_init__(self):
        if isinstance(self.features, bool):  # YAML reads a bare `on` / `off` as true / false
            self.features = "on" if self.features else "off"
        if self.features not in ("on", "off"):
            raise ValueError(f"features must be on or off (off: a stock TRL GRPO baseline), got {self.features!r}")
        if self.train_limit is not None and self.train_limit < 1:
            raise ValueError(f"train_limit must be >= 1 (or unset), got {self.train_limit}")
        if self.eval_limit < 0:
            raise ValueError(f"eval_limit must be >= 0 (0 skips the evaluation), got {self.eval_limit}")
        if self.synthetic_problems < 0:
            raise ValueError(f"synthetic_problems must be >= 0, got {self.synthetic_problems}")
        if self.eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be >= 1, got {self.eval_batch_size}")


# the highest learning rate GRPO usually trains a pretrained model with: full fine-tuning, LoRA (TRL's GRPO examples
# and the Open-R1 / DeepSeekMath recipes use 1e-6 to 3e-6 in full and 1e-5 to 2e-4 with LoRA)
PRETRAINED_LEARNING_RATE = {False: 1e-5, True: 2e-4}


def pretrained_learning_rate_warning(learning_rate: float, lora: bool) -> str | None:
    """One line when `learning_rate` is above what a pretrained model is trained with (`PRETRAINED_LEARNING_RATE`),
    as when the tiny model's config (the CPU demo's 0.003) is given a real model; None otherwise."""
    bound = PRETRAINED_LEARNING_RATE[lora]
    if learning_rate <= bound:
        return None
    how = "with LoRA" if lora else "in full fine-tuning"
    return (
        f"Warning: learning_rate={learning_rate:g} is above {bound:g}, the most a pretrained model is trained with "
        f"{how}; it can wreck the model in one update (the CPU demo's rate suits its tiny random model): for a small "
        f"pretrained model use --config recipes/configs/smollm2_cpu.yaml, or lower --learning_rate"
    )


# A run of fewer optimizer steps than this is a trial of the pipeline: its evaluation takes at most SHORT_RUN_EVAL test
# problems (the SmolLM2 CPU config's 50 took 18 minutes on busy cores after a 3-step run)
SHORT_RUN_STEPS, SHORT_RUN_EVAL = 10, 8


def short_run_evaluation(max_steps: int, eval_limit: int, output_dir: str) -> tuple[int, str | None]:
    """The test problems the end-of-run evaluation takes, and the line that says so when a short run (`max_steps`
    between 1 and `SHORT_RUN_STEPS` - 1) takes fewer than `eval_limit` (`SHORT_RUN_EVAL`); else `eval_limit`, None."""
    if not 0 < max_steps < SHORT_RUN_STEPS or eval_limit <= SHORT_RUN_EVAL:
        return eval_limit, None
    return SHORT_RUN_EVAL, (
        f"max_steps={max_steps} is a short run (under {SHORT_RUN_STEPS} steps): its evaluation takes {SHORT_RUN_EVAL} "
        f"of eval_limit={eval_limit} test problems; --eval_limit 0 skips it, and `python recipes/eval_gsm8k.py "
        f"--model_name_or_path {output_dir} --limit {eval_limit}` evaluates the saved model on all {eval_limit}"
    )


@contextlib.contextmanager
def model_before_training(model, tiny_dir: Path | None):
    """The model as it was before training, to tell an untrained model from a collapsed one (`untrained_empty_share`):
    the tiny model from its folder, a LoRA model with its adapter disabled; None for a named model fine-tuned in full
    (the evaluation's warning then says how to evaluate it)."""
    if tiny_dir is not None:
        yield AutoModelForCausalLM.from_pretrained(tiny_dir).to(model.device).eval()
    elif hasattr(model, "disable_adapter"):  # a PEFT model
        with model.disable_adapter():
            yield model
    else:
        yield None


def features_off(training_args: GRPOConfig) -> dict:
    """Stock TRL GRPO: every field trl_grpo_ext adds to TRL's `GRPOConfig` (`own_fields`) set back to its default,
    in place; TRL's and transformers' fields keep their values. Returns the fields changed, with their former values.
    """
    changed = {}
    for f in own_fields():
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if getattr(training_args, f.name) != default:
            changed[f.name] = getattr(training_args, f.name)
            setattr(training_args, f.name, default)
    return changed


def main(script_args: GSM8KScriptArguments, training_args: GRPOConfig, model_args: ModelConfig) -> dict:
    if script_args.features == "off":  # before every check: what runs is stock TRL GRPO with this config
        changed = features_off(training_args)
        values = ", ".join(f"{name}={value!r}" for name, value in changed.items()) or "none was set"
        print(f"features off: stock TRL GRPO; trl_grpo_ext settings reset to their defaults: {values}")
    # Everything that can be checked is checked before a model is built or loaded: packages, reward names, then data.
    check_optional_dependencies(
        use_vllm=training_args.use_vllm, quantized=model_args.load_in_4bit or model_args.load_in_8bit
    )
    reward_registry = {
        **REWARD_FUNCS,
        "soft_overlong_punishment": get_soft_overlong_punishment(
            max_completion_len=training_args.max_completion_length,
            soft_punish_cache=training_args.max_completion_length // 2,
        ),
    }
    unknown = [name for name in script_args.reward_funcs if name not in reward_registry]
    if unknown:
        raise ValueError(f"reward_funcs: unknown name(s) {unknown}; known: {sorted(reward_registry)}")
    if script_args.tiny_model and model_args.model_name_or_path is not None:  # a named model wins
        print(f"Training model_name_or_path={model_args.model_name_or_path!r}, not the tiny model (tiny_model: true)")
        script_args.tiny_model = False
        warning = pretrained_learning_rate_warning(training_args.learning_rate, model_args.use_peft)
        if warning:
            print(warning)
    if not script_args.tiny_model and model_args.model_name_or_path is None:
        raise ValueError(
            "model_name_or_path is required: a Hub id or a local folder (e.g. --model_name_or_path "
            "HuggingFaceTB/SmolLM2-135M-Instruct), or --tiny_model true for the tiny random model of the CPU demo"
        )
    errors.check_model_path("model_name_or_path", model_args.model_name_or_path)
    quantized = model_args.load_in_4bit or model_args.load_in_8bit
    problem = model_setting_problem(training_args, lora=model_args.use_peft, quantized=quantized)
    if problem is not None:
        raise ValueError(problem)

    script_args.eval_limit, shortened = short_run_evaluation(
        training_args.max_steps, script_args.eval_limit, training_args.output_dir
    )
    if shortened is not None:
        print(shortened)
    eval_dataset = None
    if script_args.dataset_path is None and script_args.synthetic_problems > 0:
        train_rows = to_grpo_rows(synthetic_gsm8k(script_args.synthetic_problems, seed=0))[: script_args.train_limit]
        train_dataset = Dataset.from_list(train_rows)
        if script_args.eval_limit > 0:  # held-out problems: a different seed, minus any that also appear in training
            seen = {row["prompt"][-1]["content"] for row in train_rows}
            candidates = to_grpo_rows(synthetic_gsm8k(4 * script_args.eval_limit, seed=1))
            held_out = [row for row in candidates if row["prompt"][-1]["content"] not in seen]
            eval_dataset = Dataset.from_list(held_out[: script_args.eval_limit])
    else:
        train_dataset = load_gsm8k("train", script_args.dataset_path, limit=script_args.train_limit)
        if script_args.eval_limit > 0:
            eval_dataset = load_gsm8k("test", script_args.dataset_path, limit=script_args.eval_limit)

    # Model: a local tiny one for the demo and tests, else model_name_or_path (Hub id or folder). On a GPU, a warning
    # first if the run is estimated not to fit the card (`trl-grpo-ext memory --config ...` prints the breakdown).
    card = None if training_args.use_cpu else presets.cuda_card_gib()
    evaluated = script_args.eval_batch_size if script_args.eval_limit > 0 else None
    presets.warn_if_too_big(model_args, training_args, card, eval_batch_size=evaluated)
    tiny_dir = None
    if script_args.tiny_model:
        tiny_dir = Path(training_args.output_dir).resolve() / "tiny-model"  # absolute: adapters record this path
        with training_args.main_process_first(desc="build tiny model"):
            if not (tiny_dir / "config.json").is_file():
                save_tiny_model(tiny_dir, seed=training_args.seed)
        model_args.model_name_or_path = str(tiny_dir)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }

    progress = StepProgress()  # lines while a slow step runs: nothing else prints before it ends
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=[reward_registry[name] for name in script_args.reward_funcs],
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        callbacks=[MetricsTableCallback(), progress],
    )
    # The table replaces the raw dict of every logged value that these print (the tqdm bar prints them too).
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    resume = training_args.resume_from_checkpoint
    if not resume and trainer.accelerator.is_main_process:
        clear_earlier_run(training_args.output_dir)
    if trainer.accelerator.is_main_process:  # for recipes/eval_gsm8k.py: prompts as training formats them
        save_chat_template_kwargs(training_args.chat_template_kwargs, training_args.output_dir)
    # An error in the training loop (a reward function's, hours in) keeps its traceback in <output_dir>/error.log.
    with errors.training_errors(training_args.output_dir):
        try:
            trainer.train(resume_from_checkpoint=True if str(resume).lower() == "true" else resume)
        except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM (the step's checkpoint saved, unless a second
            # signal stopped it at once): the entry point says which checkpoint is complete and how to resume
            raise errors.Interrupted(training_args.output_dir, trainer.state.global_step, interrupt) from None
        finally:
            progress.close()  # an error skips the end of training, which stops its lines
    step = trainer.state.global_step
    owed = owed_work(training_args.output_dir, step, evaluate=eval_dataset is not None)
    if trainer.run_already_complete:  # a finished job relaunched: only the end-of-run work it still owes
        if not owed:
            print(f"Run already complete at step {step}: its final model and evaluation are written; nothing to do")
            trainer.end()
            return {}
        print(f"Run already complete at step {step}: doing the end-of-run work it still owes: {', '.join(owed)}")
    try:
        with errors.training_errors(training_args.output_dir, started=True):  # saving and evaluating too
            results = finish_run(trainer, script_args, training_args, eval_dataset, owed, model_args, tiny_dir)
    except Stopped as stop:  # SIGTERM or Ctrl-C after training: the step's checkpoint kept for the requeued run
        if not stop.at_once:
            trainer.save_checkpoint_now()
        left = owed_work(training_args.output_dir, step, evaluate=eval_dataset is not None)
        done = [work for work in owed if work not in left]
        saved = f"saved: {' and '.join(done)} in {training_args.output_dir}" if done else "saved: nothing more"
        raise Stopped(stop.signal_number, stop.at_once, finished=saved, not_done=", ".join(left) or None,
                      output_dir=training_args.output_dir, step=step) from None  # fmt: skip
    trainer.accelerator.wait_for_everyone()
    trainer.end()  # finish the trackers and close the process group
    return results


FINAL_MODEL, EVALUATION = "the final model", "the evaluation (eval_results.json)"


def owed_work(output_dir: str, step: int, evaluate: bool) -> list[str]:
    """What the end of a run trained to `step` has not written yet: `FINAL_MODEL` unless `output_dir` holds a complete
    save of that step (`saved_model_step`), `EVALUATION` (when `evaluate`) unless its eval_results.json is of that
    step."""
    owed = [] if saved_model_step(output_dir) == step else [FINAL_MODEL]
    if evaluate:
        try:
            evaluated = json.loads((Path(output_dir) / "eval_results.json").read_text()).get("global_step")
        except (OSError, ValueError):
            evaluated = None
        owed += [] if evaluated == step else [EVALUATION]
    return owed


def finish_run(trainer, script_args, training_args, eval_dataset, owed: list[str], model_args, tiny_dir) -> dict:
    """The end-of-run work of `owed`: save the final model into `output_dir`, then evaluate it on `eval_dataset`
    (every process its share; all get the results) and write eval_results.json with the step; returns the results.
    When `EMPTY_SHARE` or more of the greedy completions are empty, the model before training (`tiny_dir`'s, or the
    base under the LoRA adapter) is evaluated too (`untrained`), so that the warning blames training only for what
    it did."""
    if FINAL_MODEL in owed:
        trainer.save_model(training_args.output_dir)
    if EVALUATION not in owed:
        return {}
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        results = evaluate_gsm8k(
            model.eval(),
            trainer.processing_class,
            eval_dataset,
            max_new_tokens=training_args.max_completion_length,
            batch_size=script_args.eval_batch_size,
            chat_template_kwargs=training_args.chat_template_kwargs,  # prompts as training formatted them
            seed=training_args.seed,
            accelerator=trainer.accelerator,
        )
        if results["empty_completions"] >= EMPTY_SHARE:  # an untrained model, or one its training wrecked?
            with model_before_training(model, tiny_dir) as before:
                if before is not None:
                    results["untrained"] = untrained_empty_share(
                        before, trainer.processing_class, eval_dataset,
                        max_new_tokens=training_args.max_completion_length,
                        chat_template_kwargs=training_args.chat_template_kwargs,
                        accelerator=trainer.accelerator,
                    )  # fmt: skip
    results["global_step"] = trainer.state.global_step
    if trainer.accelerator.is_main_process:
        path = write_results(results, training_args.output_dir)
        print(format_table(results))
        print(f"Saved {path}")
        warning = collapse_warning(results, training_args.learning_rate, base=model_args.model_name_or_path)
        if warning:
            print(warning)
    return results


# what a run of this recipe writes into output_dir besides the model and checkpoints (doctor.png: the doctor command)
RUN_FILES = ("training_metrics.jsonl", "run_doctor_log.jsonl", "training_curves.png", "policy_groups.png",
             "doctor.png", "eval_results.json", "chat_template_kwargs.json", "error.log")  # fmt: skip


def clear_earlier_run(output_dir: str) -> list[str]:
    """Remove an earlier run's `RUN_FILES` from `output_dir` before a new run (not a resume) writes its own, saying
    so in one line, so that none is left stale (a run without policy groups writes no policy_groups.png); returns
    the names removed."""
    found = [name for name in RUN_FILES if (Path(output_dir) / name).is_file()]
    if found:
        resumable = last_complete_checkpoint(output_dir)[0] is not None
        how = "; to continue that run instead, add --resume_from_checkpoint true" if resumable else ""
        print(f"{output_dir} holds an earlier run ({', '.join(found)}): replacing it{how}")
        for name in found:
            (Path(output_dir) / name).unlink()
    return found


PROG = "math_gsm8k.py"


def make_parser() -> TrlParser:
    return TrlParser(
        (GSM8KScriptArguments, GRPOConfig, ModelConfig),
        prog=PROG,
        usage="%(prog)s --config FILE.yaml [--FIELD VALUE ...]",  # argparse's own lists all ~300 fields
        epilog=errors.DEBUG_HELP,
        allow_abbrev=False,  # a typo'd option is an error with "did you mean", not a field it is the start of
    )


def _cli(argv: list[str]) -> None:
    parser = make_parser()
    errors.check_config_file(parser, argv, examples="recipes/configs/*.yaml")  # before anything reads it
    path = errors.config_path(argv)
    if path is not None:  # before transformers' own check of bf16 fails while parsing, without the CPU configs
        import torch

        problem = presets.no_cuda_problem(path, errors.read_config_file(path), argv, cuda=torch.cuda.is_available())
        if problem is not None:
            raise ValueError(problem)
    # Before parsing: TrainingArguments builds its DeepSpeed plugin while parsing, and fails deep inside without it.
    check_optional_dependencies(deepspeed=deepspeed_requested(argv))
    main(*errors.parse_command_line(parser, argv))


def cli(argv: list[str] | None = None) -> int:
    """The recipe run from the command line (`argv` defaults to `sys.argv[1:]`); returns the exit code, 1 or 2 for a
    user error printed as one line (`trl_grpo_ext.cli.errors.run`)."""
    return errors.run(_cli, sys.argv[1:] if argv is None else argv, prog=PROG, command=errors.script_command(__file__),
                      trains=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(cli())
