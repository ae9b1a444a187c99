"""Peak GPU memory and step time of every consumer-GPU preset, measured next to its estimate (issue #6).

    python benchmarks/gpu_memory.py                           # CUDA: every preset, 3 GRPO steps (< 8 min on one H200)
    python benchmarks/gpu_memory.py --presets 8gb 12gb --steps 3
    python benchmarks/gpu_memory.py --device cpu --tiny       # the same code path on CPU with shrunken models (smoke)

For each preset `recipes/configs/gsm8k-<N>gb.yaml`: a model of the preset's architecture
(`trl_grpo_ext/model_configs/`) with random weights, built on the device and saved once in bf16, then loaded by
TRL as the recipe loads it (4-bit NF4 for QLoRA, the preset's LoRA, optimizer, checkpointing and extension settings);
a byte-level BPE tokenizer trained locally (`trl_grpo_ext.tiny_model`; its ids stay below the model's vocabulary);
prompts of the estimate's prompt length; every completion forced to `max_completion_length` (`min_new_tokens`); a
reward computed from the text, no model. Nothing is downloaded. Each preset runs in a process of its own, so its peak
is its own, and the parent never touches the GPU. Peaks are `torch.cuda.max_memory_allocated/reserved`, overall and
per phase (loading, generation, training); `device_used_gib` is the card's used memory at the end, CUDA context
included (what nvidia-smi shows). On a large card the caching allocator reserves more freely than on a small one:
compare the estimate without its overhead term to the allocated peak.

Writes `benchmarks/results/gpu_memory.json` and `gpu_memory.md` (with `--tiny`: `gpu_memory_tiny.*`). Needs torch with
CUDA, transformers, peft, accelerate, trl, bitsandbytes, datasets and this package's own imports (scikit-learn, scipy,
math-verify): a missing one, or no CUDA device, stops it with exit code 2 and a message saying what to install or use.
Exit code 1 when a preset failed (its row says why: an out-of-memory error keeps the peak reached).
"""

import argparse
import gc
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # trl_grpo_ext from this checkout, installed or not

PRESETS = ("8gb", "12gb", "16gb", "24gb")
# Imported before a preset runs, so that a missing package (or one of its dependencies) is named, not a stack trace
REQUIRED = ("torch", "transformers", "peft", "accelerate", "trl", "bitsandbytes", "datasets", "trl_grpo_ext")
PIP_NAMES = {"sklearn": "scikit-learn", "yaml": "pyyaml", "math_verify": "math-verify"}
VERSIONS = ("torch", "transformers", "trl", "peft", "bitsandbytes")
TINY_ARCH = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
TINY_ARCH |= {"vocab_size": 1024}  # a CPU projects fast onto 1024 entries; the GPU run keeps 151936
TINY_RUN = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--num_generations", "4"]
TINY_RUN += ["--max_completion_length", "16"]
TINY_PROMPT_LENGTH = 32
GIB = 2**30


def missing_packages(modules=REQUIRED) -> list[str]:
    """pip names of the packages this benchmark needs, directly or through this package's imports, that are missing."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            name = (error.name or module).split(".")[0]
            missing.append(PIP_NAMES.get(name, name.replace("_", "-")))
    return sorted(set(missing))


def preset_config(preset: str, args, output_dir: str):
    """(GRPOConfig, ModelConfig, architecture config, prompt length) of a preset, with the benchmark's overrides."""
    from trl_grpo_ext import memory, presets

    overrides = ["--output_dir", output_dir, "--max_steps", str(args.steps), "--report_to", "none"]
    overrides += ["--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true", "--seed", "0"]
    overrides += TINY_RUN if args.tiny else []
    path = REPO_ROOT / "recipes" / "configs" / f"gsm8k-{preset}.yaml"
    training_args, model_args = presets.load_config(path, *overrides, use_cpu=args.device == "cpu")
    model_config = presets.architecture_config(model_args.model_name_or_path)
    if args.tiny:  # rebuilt, so that the fields derived from the layer count (layer_types) follow
        from transformers import AutoConfig

        values = {k: v for k, v in model_config.to_dict().items() if k not in ("model_type", "layer_types")}
        values |= TINY_ARCH | {
            "bos_token_id": None,
            "eos_token_id": None,
        }  # the real ids are above the tiny vocabulary
        model_config = AutoConfig.for_model(model_config.model_type, **values)
    prompt_length = TINY_PROMPT_LENGTH if args.tiny else memory.DEFAULT_PROMPT_LENGTH
    return training_args, model_args, model_config, prompt_length


def estimate_row(training_args, model_args, model_config, prompt_length: int) -> dict:
    """The estimate of a preset as the benchmark runs it, in GiB, and what it runs."""
    from trl_grpo_ext import memory

    est = memory.estimate_for(model_config, training_args, model_args, prompt_length=prompt_length)
    return {
        "model": model_args.model_name_or_path,
        "method": ("QLoRA" if model_args.load_in_4bit else "LoRA") + f" r={model_args.lora_r}",
        "prompt_length": prompt_length,
        "completion_length": training_args.max_completion_length,
        "micro_batch": training_args.per_device_train_batch_size,
        "generation_batch": training_args.generation_batch_size,
        "estimate_gib": round(est.total, 3),
        "estimate_allocator_gib": round(est.total - est.overhead, 3),  # what max_memory_allocated can show
        "estimate_generation_phase_gib": round(est.generation, 3),
        "estimate_training_phase_gib": round(est.training, 3),
        "estimate_terms_gib": {name: round(gib, 3) for name, gib in est.terms().items()},
    }


def save_random_model(model_config, model_dir: Path, device: str):
    """A bf16 model of `model_config` with random weights, built on `device`, saved with the local tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_grpo_ext.tiny_model import build_tiny_tokenizer

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

    from trl_grpo_ext.data import synthetic_gsm8k

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


def measure(preset: str, args, model_dir: Path) -> dict:
    """The estimate of a preset, then `args.steps` GRPO steps on random weights: peaks (GiB) and step times (s).

    A failure (out of memory included) is the row's `error`, with the peaks reached until then.
    """
    import torch
    from transformers import TrainerCallback
    from trl import get_peft_config, get_quantization_config

    from trl_grpo_ext import GRPOTrainer

    cuda = args.device == "cuda"
    stats = {"load": 0, "generation": 0, "training": 0, "reserved": 0}

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

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], None

        def on_step_begin(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.start)
            take("training")

    timer, row = Timer(), {"preset": preset}
    with tempfile.TemporaryDirectory() as out:
        training_args, model_args, model_config, prompt_length = preset_config(preset, args, out)
        row |= estimate_row(training_args, model_args, model_config, prompt_length)
        try:
            tokenizer = save_random_model(model_config, model_dir, args.device)
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
            lengths = [
                r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r
            ]
            row["mean_completion_tokens"] = round(statistics.mean(lengths), 1) if lengths else None
        except Exception as error:  # any failure, out of memory included, is a result of this preset: go on
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
        take("training")

    def gib(value):  # no memory figures on the CPU
        return round(value / GIB, 3) if cuda else None

    free, total = torch.cuda.mem_get_info() if cuda else (0, 0)
    row |= {f"peak_{phase}_allocated_gib": gib(stats[phase]) for phase in ("load", "generation", "training")}
    row |= {
        "peak_allocated_gib": gib(max(stats["load"], stats["generation"], stats["training"])),
        "peak_reserved_gib": gib(stats["reserved"]),
        "device_used_gib": gib(total - free),
        "step_times_s": [round(t, 2) for t in timer.times],
        "step_time_s": round(statistics.median(timer.times[1:] or timer.times), 2) if timer.times else None,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "versions": {m: importlib.import_module(m).__version__ for m in VERSIONS},
    }
    return row


def run_child(preset: str, args, model_dir: Path, json_out: Path, timeout: float) -> dict:
    """`measure` in a fresh process (its own CUDA peak); a crash or a timeout becomes the row's `error`."""
    cmd = [sys.executable, __file__, "--child", preset, "--model-dir", str(model_dir), "--json-out", str(json_out)]
    cmd += ["--device", args.device, "--steps", str(args.steps)] + (["--tiny"] if args.tiny else [])
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"preset": preset, "error": f"timed out after {timeout:.0f} s"}
    if json_out.is_file():
        return json.loads(json_out.read_text())
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"preset": preset, "error": f"exit code {proc.returncode}: {' / '.join(tail)}"}


def markdown(rows: list[dict], header: str) -> str:
    """The results as a markdown table, measured next to estimated."""

    def cell(row: dict, key: str, digits: int = 2) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = [
        header,
        "",
        "| preset | model | method | prompt + completion tokens | micro-batch / generated at once | estimated peak "
        "GiB (without the 1 GiB overhead) | measured peak allocated GiB | measured peak reserved GiB | card used at "
        "the end GiB | generation phase GiB est. / meas. | training phase GiB est. / meas. | step time s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {cell(r, 'model')} | {cell(r, 'method')} | {cell(r, 'prompt_length')} + "
            f"{cell(r, 'completion_length')} | {cell(r, 'micro_batch')} / {cell(r, 'generation_batch')} | "
            f"{cell(r, 'estimate_gib')} ({cell(r, 'estimate_allocator_gib')}) | {cell(r, 'peak_allocated_gib')} | "
            f"{cell(r, 'peak_reserved_gib')} | {cell(r, 'device_used_gib')} | "
            f"{cell(r, 'estimate_generation_phase_gib')} / {cell(r, 'peak_generation_allocated_gib')} | "
            f"{cell(r, 'estimate_training_phase_gib')} / {cell(r, 'peak_training_allocated_gib')} | "
            f"{cell(r, 'step_time_s')} |"
        )
    errors = [f"- {r['preset']}: {r['error']}" for r in rows if "error" in r]
    return "\n".join(lines + ([""] + errors if errors else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per preset (default 3)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="shrunken models and lengths (smoke test on CPU)")
    parser.add_argument("--in-process", action="store_true", help="run the presets in this process, one after another")
    parser.add_argument("--time-budget", type=float, default=450, help="seconds for all presets (default 450)")
    parser.add_argument("--output-dir", default=str(REPO_ROOT / "benchmarks" / "results"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded; fail fast if something tries
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if importlib.util.find_spec("torch") is None:
        print("gpu_memory.py needs torch (with CUDA for a measurement): pip install torch", file=sys.stderr)
        return 2
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_memory.py measures GPU memory and needs a CUDA device, but torch.cuda.is_available() is False here. "
            "On a CPU, `python benchmarks/gpu_memory.py --device cpu --tiny` runs the same code path as a smoke test.",
            file=sys.stderr,
        )
        return 2
    # The parent only checks that the packages are there (importing bitsandbytes could open a CUDA context here)
    missing = missing_packages() if args.child or args.in_process else []
    missing = missing or [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        print(f"gpu_memory.py needs these packages, not installed: pip install {' '.join(missing)}", file=sys.stderr)
        return 2
    if args.child:
        row = measure(args.child, args, Path(args.model_dir))
        Path(args.json_out).write_text(json.dumps(row))
        return 0

    deadline, rows = time.monotonic() + args.time_budget, []
    with tempfile.TemporaryDirectory() as work:
        for preset in args.presets:
            model_dir = Path(work) / f"{preset}-model"
            for other in rows:  # one random checkpoint per architecture
                if other.get("model") == preset_model(preset) and (Path(work) / f"{other['preset']}-model").is_dir():
                    model_dir = Path(work) / f"{other['preset']}-model"
            left = deadline - time.monotonic()
            if left < 30:
                row = {"preset": preset, "error": f"skipped: the {args.time_budget:.0f} s time budget was spent"}
            elif args.in_process:
                row = measure(preset, args, model_dir)
            else:
                row = run_child(preset, args, model_dir, Path(work) / f"{preset}.json", left)
            print(json.dumps(row), flush=True)
            rows.append(row)

    name = "gpu_memory_tiny" if args.tiny else "gpu_memory"
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    versions = next((row["versions"] for row in rows if "versions" in row), {})
    header = f"GRPO steps per preset: {args.steps}; " + ", ".join(f"{k} {v}" for k, v in versions.items())
    (out / f"{name}.json").write_text(json.dumps({"steps": args.steps, "versions": versions, "rows": rows}, indent=2))
    (out / f"{name}.md").write_text(markdown(rows, header))
    print(markdown(rows, header))
    print(f"Wrote {out / name}.json and {out / name}.md")
    return 1 if any("error" in row for row in rows) else 0


def preset_model(preset: str) -> str | None:
    """`model_name_or_path` of a preset, read from its YAML without importing anything heavy."""
    import yaml

    return yaml.safe_load((REPO_ROOT / "recipes" / "configs" / f"gsm8k-{preset}.yaml").read_text()).get(
        "model_name_or_path"
    )


if __name__ == "__main__":
    raise SystemExit(main())
