"""What the benchmarks share, imported as `benchmarks.harness` (each script puts the repository root on `sys.path`
first, so that `trl_grpo_ext` and this module come from this checkout, installed or not).

The family benchmarks (`policy_groups/`, `prompt_skip/`, `entropy/`): variants from `--ours` (`with_ours` for the
entropy benchmarks), stock TRL's runs reused from `--trl-json`, and `--report` over earlier `--json` files.

The GPU benchmarks (`generation/gpu_memory.py`, `generation/gpu_throughput.py`; `generation/gpu_checks.py` takes the
repository root and the environment check): a preset's configs with overrides, a random model of its real
architecture saved once, prompts of the estimate's length, a reward without a model, and running one measurement in a
process of its own. Nothing is downloaded."""

import argparse
import gc
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# Imported before a preset runs, so that a missing package (or one of its dependencies) is named, not a stack trace
REQUIRED = ("torch", "transformers", "peft", "accelerate", "trl", "bitsandbytes", "datasets", "trl_grpo_ext")
PIP_NAMES = {"sklearn": "scikit-learn", "yaml": "pyyaml", "math_verify": "math-verify"}
VERSIONS = ("torch", "transformers", "trl", "peft", "bitsandbytes")
TINY_ARCH = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
TINY_ARCH |= {"vocab_size": 1024}  # a CPU projects fast onto 1024 entries; the GPU run keeps 151936
TINY_RUN = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--num_generations", "4"]
TINY_RUN += ["--max_completion_length", "16", "--generation_max_prompt_length", "64"]
TINY_PROMPT_LENGTH = 32
GIB = 2**30
# the GPU benchmarks' results, tracked: only a measurement writes here
RESULTS_DIR = REPO_ROOT / "benchmarks" / "generation" / "results"
SMOKE_DIR_NAME = "trl-grpo-ext-benchmarks"  # a --tiny run's folder in the system's temp directory


def missing_packages(modules=REQUIRED) -> list[str]:
    """pip names of the packages a benchmark needs, directly or through this package's imports, that are missing."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            name = (error.name or module).split(".")[0]
            missing.append(PIP_NAMES.get(name, name.replace("_", "-")))
    return sorted(set(missing))


PRESETS = ("8gb", "12gb", "16gb", "24gb")  # the consumer-card presets the GPU benchmarks measure


def preset_path(preset: str) -> Path:
    return REPO_ROOT / "recipes" / "configs" / f"gsm8k-{preset}.yaml"


def preset_config(preset: str, output_dir: str, steps: int, device: str, tiny: bool, extra: list[str] = ()):
    """(GRPOConfig, ModelConfig, architecture config, prompt length) of a preset, with a benchmark's overrides: no
    saving, a log row per step, seed 0, `extra` (command-line style) last; `tiny` shrinks the model and lengths."""
    from trl_grpo_ext.consumer_gpu import memory, presets

    overrides = ["--output_dir", output_dir, "--max_steps", str(steps), "--report_to", "none"]
    overrides += ["--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true", "--seed", "0"]
    # the presets' relative entropy target measures its reference over 5 steps: a shorter run keeps a step after it
    overrides += ["--entropy_target_window", str(max(1, min(5, steps - 1)))]
    overrides += TINY_RUN if tiny else []
    overrides += list(extra)
    training_args, model_args = presets.load_config(preset_path(preset), *overrides, use_cpu=device == "cpu")
    model_config = presets.architecture_config(model_args.model_name_or_path)
    if tiny:  # rebuilt, so that the fields derived from the layer count (layer_types) follow
        from transformers import AutoConfig

        values = {k: v for k, v in model_config.to_dict().items() if k not in ("model_type", "layer_types")}
        values |= TINY_ARCH | {"bos_token_id": None, "eos_token_id": None}  # the real ids are above its vocabulary
        model_config = AutoConfig.for_model(model_config.model_type, **values)
    prompt_length = TINY_PROMPT_LENGTH if tiny else memory.DEFAULT_PROMPT_LENGTH
    return training_args, model_args, model_config, prompt_length


def preset_model(preset: str) -> str | None:
    """`model_name_or_path` of a preset, read from its YAML without importing anything heavy."""
    import yaml

    return yaml.safe_load(preset_path(preset).read_text()).get("model_name_or_path")


def save_random_model(model_config, model_dir: Path, device: str):
    """A bf16 model of `model_config` with random weights, built on `device`, saved with the local tokenizer (once)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_grpo_ext.cli.tiny_model import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    if not (model_dir / "config.json").is_file():
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(model_config, dtype=torch.bfloat16)
        eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
        for config in (model.config, model.generation_config):
            config.bos_token_id, config.eos_token_id, config.pad_token_id = None, eos, pad
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        del model
        gc.collect()
    return tokenizer


def prompt_dataset(tokenizer, prompt_length: int, rows: int = 64):
    """`rows` plain-text prompts of `prompt_length` tokens (GSM8K-style text), in 4 difficulty groups."""
    from datasets import Dataset

    from trl_grpo_ext.gsm8k.data import synthetic_gsm8k

    text = " ".join(row["question"] for row in synthetic_gsm8k(200, seed=0))
    ids = tokenizer(text)["input_ids"]
    prompts = []
    for i in range(rows):
        start = (i * 37) % max(len(ids) - prompt_length, 1)
        prompts.append(tokenizer.decode(ids[start : start + prompt_length]))
    groups = ["1-2", "3", "4", "5+"]
    return Dataset.from_list([{"prompt": p, "difficulty": groups[i % 4]} for i, p in enumerate(prompts)])


def text_reward(completions, **kwargs) -> list[float]:
    """A reward with spread and no model: completion length in characters modulo 7, scaled to [0, 6/7]."""
    return [(len(c) % 7) / 7 for c in completions]


def versions() -> dict[str, str]:
    return {m: importlib.import_module(m).__version__ for m in VERSIONS}


def run_child(script: str, child_args: list[str], json_out: Path, timeout: float, name: str, in_process=None) -> dict:
    """`python script --child ... --json-out json_out` in a fresh process (its own CUDA peak); its JSON row, or a row
    whose `error` says how it crashed or that it timed out.

    `in_process`: the script's `main`, to call here instead (no timeout): for runs on the CPU, which have no device
    memory to keep apart and would spend most of a child's time importing torch, transformers and TRL again."""
    if in_process is not None:
        try:
            code = in_process([*child_args, "--json-out", str(json_out)])
        except (Exception, SystemExit) as error:  # as a crashed child: a row saying how
            return {"name": name, "error": f"{type(error).__name__}: {error}"}
        return json.loads(json_out.read_text()) if code == 0 else {"name": name, "error": f"exit code {code}"}
    cmd = [sys.executable, script, *child_args, "--json-out", str(json_out)]
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": name, "error": f"timed out after {timeout:.0f} s"}
    if json_out.is_file():
        return json.loads(json_out.read_text())
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"name": name, "error": f"exit code {proc.returncode}: {' / '.join(tail)}"}


def measure_run(training_args, model_args, model_config, prompt_length: int, model_dir: Path, device: str) -> dict:
    """`training_args.max_steps` GRPO steps on random weights of `model_config`, every completion at full length.

    Returns (seconds, GiB, tokens; memory figures are None on the CPU): `step_times_s` and, per step,
    `generation_times_s` (TRL's generation calls, merges included), `completion_tokens`, `merge_times_s`
    (`fast_generation/merge_time`); peak allocated memory by phase (`peak_load/generation/training_allocated_gib`,
    then reset), `peak_allocated_gib`, `peak_reserved_gib`, `device_used_gib` (the card's used memory at the end,
    CUDA context included); `prompt_tokens`, `mean_completion_tokens`. A failure, out of memory included, is `error`,
    with what was measured until then.
    """
    import statistics
    import time

    import torch
    from transformers import TrainerCallback
    from trl import get_peft_config, get_quantization_config

    from trl_grpo_ext import GRPOTrainer

    cuda = device == "cuda"
    stats = {"load": 0, "generation": 0, "training": 0, "reserved": 0}
    per_step = {"generation_times_s": [0.0], "completion_tokens": [0]}

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def take(phase: str) -> None:  # the peak since the last reset goes to `phase`; then reset
        if cuda:
            stats[phase] = max(stats[phase], torch.cuda.max_memory_allocated())
            stats["reserved"] = max(stats["reserved"], torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()

    class MeasuredTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            take("training")  # what ran since the last optimizer step or generation
            output = super()._generate_and_score_completions(inputs)
            take("generation")
            return output

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            start = now()
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            per_step["generation_times_s"][-1] += now() - start
            per_step["completion_tokens"][-1] += sum(len(ids) for ids in completion_ids)
            return completion_ids, logprobs

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], None

        def on_step_begin(self, *_, **__):
            self.start = now()

        def on_step_end(self, *_, **__):
            self.times.append(now() - self.start)
            per_step["generation_times_s"].append(0.0)
            per_step["completion_tokens"].append(0)
            take("training")

    timer, row = Timer(), {}
    try:
        tokenizer = save_random_model(model_config, model_dir, device)
        dataset = prompt_dataset(tokenizer, prompt_length)
        row["prompt_tokens"] = len(tokenizer(dataset[0]["prompt"])["input_ids"])
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        training_args.generation_kwargs = {"min_new_tokens": training_args.max_completion_length}  # full length
        training_args.reward_weights = None  # one reward here, the recipe's two in the preset
        training_args.model_init_kwargs = {
            "dtype": model_args.dtype,
            "attn_implementation": model_args.attn_implementation,
        }
        trainer = MeasuredTrainer(
            model=str(model_dir),
            reward_funcs=[text_reward],
            args=training_args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
            quantization_config=get_quantization_config(model_args),
            callbacks=[timer],
        )
        take("load")
        trainer.train()
        history = trainer.state.log_history
        lengths = [r["completions/mean_length"] for r in history if "completions/mean_length" in r]
        row["mean_completion_tokens"] = round(statistics.mean(lengths), 1) if lengths else None
        row["merge_times_s"] = [r["fast_generation/merge_time"] for r in history if "fast_generation/merge_time" in r]
    except Exception as error:  # any failure, out of memory included, is a result of this run: report it
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
    take("training")

    def gib(value):  # no memory figures on the CPU
        return round(value / GIB, 3) if cuda else None

    free, total = torch.cuda.mem_get_info() if cuda else (0, 0)
    row |= {f"peak_{phase}_allocated_gib": gib(stats[phase]) for phase in ("load", "generation", "training")}
    done = len(timer.times)
    return row | {
        "peak_allocated_gib": gib(max(stats["load"], stats["generation"], stats["training"])),
        "peak_reserved_gib": gib(stats["reserved"]),
        "device_used_gib": gib(total - free),
        "step_times_s": [round(t, 3) for t in timer.times],
        "generation_times_s": [round(t, 3) for t in per_step["generation_times_s"][:done]],
        "completion_tokens": per_step["completion_tokens"][:done],
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "versions": versions(),
    }


def add_common_arguments(parser, steps_help: str) -> None:
    """The arguments both GPU benchmarks take: --steps, --device, --tiny, --output-dir and the hidden child ones."""
    parser.add_argument("--steps", type=int, default=3, help=steps_help)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="shrunken models and lengths (smoke test on CPU)")
    parser.add_argument(
        "--output-dir",
        help="where the JSON and markdown go; default: benchmarks/generation/results/ for a measurement, and for a "
        f"--tiny smoke run {Path(tempfile.gettempdir()) / SMOKE_DIR_NAME}, so that it never rewrites the committed "
        "results",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", help=argparse.SUPPRESS)


def results_dir(output_dir: str | None, tiny: bool) -> Path:
    """Where a GPU benchmark writes its JSON and markdown: `output_dir` when given; else the tracked
    `benchmarks/generation/results/` for a measurement, and for a `--tiny` smoke run
    `<temp dir>/trl-grpo-ext-benchmarks`."""
    if output_dir is not None:
        return Path(output_dir)
    return Path(tempfile.gettempdir()) / SMOKE_DIR_NAME if tiny else RESULTS_DIR


def write_results(out: Path, name: str, payload: dict, table: str) -> None:
    """Write a GPU benchmark's results as `<out>/<name>.json` (`payload`) and `<out>/<name>.md` (`table`, also
    printed), creating `out`, and say where they went."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2))
    (out / f"{name}.md").write_text(table)
    print(table)
    print(f"Wrote {out / name}.json and {out / name}.md")


def environment_problem(script: str, measures: str, device: str, import_all: bool) -> int | None:
    """Exit code 2, after a message on stderr, when `device` is CUDA without CUDA or a package is missing; else None.

    Sets HF_HUB_OFFLINE (nothing is downloaded; fail fast if something tries). `import_all` imports the packages
    (a child process); the parent only looks them up, since importing bitsandbytes could open a CUDA context.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if importlib.util.find_spec("torch") is None:
        print(f"{script} needs torch (with CUDA for a measurement): pip install torch", file=sys.stderr)
        return 2
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print(
            f"{script} measures {measures} and needs a CUDA device, but torch.cuda.is_available() is False here. On a "
            f"CPU, `python benchmarks/generation/{script} --device cpu --tiny` runs the same code path as a smoke "
            "test.",
            file=sys.stderr,
        )
        return 2
    missing = missing_packages() if import_all else [n for n in REQUIRED if importlib.util.find_spec(n) is None]
    if missing:
        print(f"{script} needs these packages, not installed: pip install {' '.join(missing)}", file=sys.stderr)
        return 2
    return None


def cell(row: dict, key: str, digits: int = 2) -> str:
    """A table cell: `row[key]` with `digits` decimals if a float, "-" if missing or None."""
    value = row.get(key)
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


# --- the family benchmarks ---


def print_reports(paths: list[str], report) -> None:
    """Print `report(results, ["trl", *other variants])` over the results of the `--json` files at `paths`."""
    results = load_results(paths)
    print(report(results, ["trl", *sorted({r["variant"] for r in results} - {"trl"})]))


def variants_and_reused(ours: list[str], trl_json: str | None) -> tuple[dict, list[dict]]:
    """({variant name: overrides, None for stock TRL}, stock TRL's results reused from `trl_json`). Each `--ours`
    JSON text is a variant named "ours" plus the text ("ours" alone for "{}"); with `trl_json`, stock TRL is not run
    again and its results there are returned."""
    variants = {"trl": None, **{f"ours{text if text != '{}' else ''}": json.loads(text) for text in ours}}
    reused = []
    if trl_json:
        reused = [r for r in json.loads(Path(trl_json).read_text()) if r["variant"] == "trl"]
        variants.pop("trl")
    return variants, reused


def with_ours(variants: dict, names: list[str], ours: list[str]) -> dict:
    """The `variants` named in `names`, plus one per `--ours` JSON text: `relative` with those overrides on top,
    named "relative" followed by the text (the entropy benchmarks' tuning variants)."""
    chosen = {name: variants[name] for name in names}
    return chosen | {f"relative{text}": {**variants["relative"], **json.loads(text)} for text in ours}


def add_output_arguments(parser, workers: int = 2) -> None:
    """`--workers`, `--json` (results already in the file are kept) and `--report`."""
    parser.add_argument("--workers", type=int, default=workers, help=f"runs in parallel (default {workers})")
    parser.add_argument("--json", help="write every figure to this JSON file (results already there are kept)")
    parser.add_argument("--report", nargs="+", help="only print the report of these --json files")


def load_results(paths: list[str]) -> list[dict]:
    """The results of every `--json` file of `paths`, in order."""
    return [r for path in paths for r in json.loads(Path(path).read_text())]


def add_family_arguments(parser, seeds: list[int], max_steps: int) -> None:
    """The options both family benchmarks take, after their own `--mixes` / `--tasks`."""
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds)
    parser.add_argument("--max_steps", type=int, default=max_steps)
    parser.add_argument("--ours", nargs="*", default=["{}"], help="JSON overrides of the defaults, one variant each")
    parser.add_argument("--trl-json", help="stock TRL's results from an earlier --json, instead of running them")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel, one CPU thread each (default 2)")
    parser.add_argument("--json", help="write every figure to this JSON file")
    parser.add_argument("--report", nargs="+", help="only print the report of these --json files")


def prepare_runs(args, report) -> tuple[dict, list[dict]] | None:
    """With `--report`, print the report of those files and return None. Else set the offline environment (no Hub
    calls, no tokenizer threads) and return `variants_and_reused(args.ours, args.trl_json)`."""
    if args.report:
        print_reports(args.report, report)
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return variants_and_reused(args.ours, args.trl_json)
