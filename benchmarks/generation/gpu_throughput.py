"""Completion tokens per second of GRPO steps on one GPU: stock TRL's generation path, each fast-generation setting of
`trl_grpo_ext.generation`, and each preset's own default, side by side (issue #10).

    python benchmarks/generation/gpu_throughput.py    # CUDA: 8 GB and 24 GB presets, every configuration (< 8 min)
    python benchmarks/generation/gpu_throughput.py --presets 24gb --configs stock preset \\
        --completion-length 0                         # full length
    python benchmarks/generation/gpu_throughput.py --device cpu --tiny --steps 2  # the same code path on the CPU
                                                                                  # (CI smoke; into the temp dir)

Each preset `recipes/configs/gsm8k-<N>gb.yaml` runs as the recipe runs it (random weights of its real architecture,
saved once; the local tokenizer; prompts of 320 tokens; every completion forced to full length) under these
configurations, each in a process of its own (on the CPU, a smoke run, only the first: the others run in the
benchmark's process), `--steps` GRPO steps each:

| configuration | generation |
|---|---|
| `stock` | TRL's default path: `model.generate`, dynamic cache, PEFT's adapter layers (the preset's levers off) |
| `preset` | the preset's own settings (its YAML) |
| `compile` | static cache + compiled decode step, adapters unmerged |
| `inplace` | adapters merged into the base weights for each generation, restored bit for bit |
| `copy` | a separate merged bf16 generation copy |
| `continuous_batching` | TRL's `use_transformers_continuous_batching` |
| `qlora_stock` | the 8 GB preset in 4-bit (QLoRA) on TRL's default path: the preset before fast generation |
| `qlora_copy_compile` | the same 4-bit model generating from a bf16 copy with a compiled decode step |

The first step compiles where compilation is on; the figures are the median over the later steps (`first_step_s`
keeps the first). Completion tokens per second = completion tokens of a step / the step's wall time; generation and
training time split the step; `merge_share` is the merge/restore (or copy refresh) time over the step time; peaks
are `torch.cuda.max_memory_allocated`, next to `trl_grpo_ext.consumer_gpu.memory`'s estimate for the preset's card.
`--completion-length` (default 256 on CUDA; 0: the preset's own 512 or 768; with `--tiny`, 16) keeps the whole run
inside 8 minutes on one H200: stock TRL decodes at a fixed cost per token, so its tokens per second hardly depend on
the length. Configurations run in priority order
(both stocks and presets first) until `--time-budget` is spent; the rest are reported as skipped.

Writes `benchmarks/generation/results/gpu_throughput.json` and `.md`. A `--tiny` smoke run writes
`gpu_throughput_tiny.*` into `<temp dir>/trl-grpo-ext-benchmarks/` instead, so that it never rewrites the committed
results; `--output-dir` sets either (add `--output-dir benchmarks/generation/results` to refresh the committed
`gpu_throughput_tiny.*`). Exit code 2 without CUDA (unless `--device cpu`) or with a missing package, 1 when a
configuration failed (its row says why).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the harness, also when this file is loaded by path
from benchmarks.harness import (  # noqa: E402
    PRESETS,
    add_common_arguments,
    cell,
    environment_problem,
    measure_run,
    preset_config,
    preset_model,
    results_dir,
    run_child,
    write_results,
)

STOCK = ["--generation_compile", "false", "--generation_lora_merge", "none"]
CONFIGS = {
    "stock": STOCK,
    "preset": [],
    "compile": ["--generation_compile", "true", "--generation_lora_merge", "none"],
    "inplace": ["--generation_compile", "false", "--generation_lora_merge", "inplace"],
    "copy": ["--generation_compile", "false", "--generation_lora_merge", "copy"],
    "continuous_batching": [*STOCK, "--use_transformers_continuous_batching", "true"],
    "qlora_stock": [*STOCK, "--load_in_4bit", "true"],
    "qlora_copy_compile": [
        "--load_in_4bit",
        "true",
        "--generation_lora_merge",
        "copy",
        "--generation_compile",
        "true",
    ],
}
QLORA_CONFIGS = ("qlora_stock", "qlora_copy_compile")  # by default on the 8 GB preset only
PRIORITY = (
    "stock",
    "preset",
    "compile",
    "copy",
    "inplace",
    "qlora_stock",
    "qlora_copy_compile",
    "continuous_batching",
)
DEFAULT_COMPLETION_LENGTH = 256


def plan(presets: list[str], configs: list[str] | None) -> list[tuple[str, str]]:
    """(preset, configuration) pairs in the order they run: by configuration priority, then by preset."""
    pairs = []
    for config in PRIORITY:
        for preset in presets:
            default = config not in QLORA_CONFIGS or preset == "8gb"
            if (config in configs) if configs else default:
                pairs.append((preset, config))
    return pairs


def summarize(row: dict) -> dict:
    """Medians over the measured steps (all but the first, which compiles) of a measured row, in s and tokens/s."""
    steps, generation, tokens = (
        row.get("step_times_s", []),
        row.get("generation_times_s", []),
        row["completion_tokens"],
    )
    measured = slice(1, None) if len(steps) > 1 else slice(None)
    if not steps:
        return {}
    step = statistics.median(steps[measured])
    gen = statistics.median(generation[measured])
    merge = statistics.median(row["merge_times_s"][measured]) if row.get("merge_times_s") else 0.0
    per_step = statistics.median(tokens[measured])
    return {
        "first_step_s": round(steps[0], 2),
        "step_s": round(step, 3),
        "generation_s": round(gen, 3),
        "training_s": round(step - gen, 3),
        "completion_tokens_per_step": per_step,
        "tokens_per_s": round(per_step / step, 1),
        "generation_tokens_per_s": round(per_step / gen, 1) if gen > 0 else None,
        "merge_s": round(merge, 4),
        "merge_share": round(merge / step, 4),
    }


def measure(preset: str, config: str, args, model_dir: Path) -> dict:
    """One configuration of one preset: what it runs, the estimate for the preset's card, the measured figures."""
    from trl_grpo_ext.consumer_gpu import memory

    card = float(preset.removesuffix("gb"))
    extra = list(CONFIGS[config])
    if args.completion_length:
        extra += ["--max_completion_length", str(args.completion_length)]
    row = {"preset": preset, "config": config, "overrides": " ".join(extra), "card_gib": card}
    with tempfile.TemporaryDirectory() as out:
        training_args, model_args, model_config, prompt_length = preset_config(
            preset, out, args.steps, args.device, args.tiny, extra
        )
        row |= {
            "model": model_args.model_name_or_path + (" (tiny: 2 layers)" if args.tiny else ""),
            "method": ("QLoRA" if model_args.load_in_4bit else "LoRA") + f" r={model_args.lora_r}",
            "completion_length": training_args.max_completion_length,
            "generation_batch": training_args.generation_batch_size,
            "generation": _describe(training_args),
        }
        try:
            est = memory.estimate_for(model_config, training_args, model_args, prompt_length=prompt_length,
                                      card_gib=card)  # fmt: skip
            row |= {"estimate_gib": round(est.total, 3), "estimate_fits": est.total <= 0.9 * card}
        except ValueError as error:
            row["estimate_gib"], row["estimate_error"] = None, str(error)
        row |= measure_run(training_args, model_args, model_config, prompt_length, model_dir, args.device)
    return row | summarize(row)


def _describe(args) -> str:
    if args.use_transformers_continuous_batching:
        return "continuous batching"
    parts = ["compiled static cache"] if args.generation_compile else ["dynamic cache"]
    parts.append(
        {"none": "adapter layers", "inplace": "merged in place", "copy": "merged copy"}[args.generation_lora_merge]
    )
    return ", ".join(parts)


def with_speedups(rows: list[dict]) -> list[dict]:
    """Each row's tokens per second over its preset's `stock` row (`speedup`), when both were measured."""
    stock = {r["preset"]: r.get("tokens_per_s") for r in rows if r.get("config") == "stock"}
    for row in rows:
        base = stock.get(row.get("preset"))
        if base and row.get("tokens_per_s"):
            row["speedup"] = round(row["tokens_per_s"] / base, 2)
    return rows


def markdown(rows: list[dict], header: str) -> str:
    """The results as a markdown table, measured next to estimated."""

    lines = [
        header,
        "",
        "| preset | configuration | model, method | generation | completions × tokens per step | step s | generation "
        "s | training s | completion tokens / s | × stock | merge / step | first step s | peak allocated GiB | "
        "estimated peak GiB (card) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = r.get("merge_share")
        lines.append(
            f"| {r['preset']} | {r.get('config', '-')} | {cell(r, 'model')}, {cell(r, 'method')} | "
            f"{cell(r, 'generation')} | {cell(r, 'generation_batch')} × {cell(r, 'completion_length')} | "
            f"{cell(r, 'step_s')} | {cell(r, 'generation_s')} | {cell(r, 'training_s')} | "
            f"{cell(r, 'tokens_per_s', 1)} | {cell(r, 'speedup')} | {'-' if share is None else f'{share:.1%}'} | "
            f"{cell(r, 'first_step_s', 1)} | {cell(r, 'peak_allocated_gib')} | {cell(r, 'estimate_gib')} "
            f"({cell(r, 'card_gib', 0)}) |"
        )
    errors = [f"- {r['preset']} {r.get('config', '')}: {r['error']}" for r in rows if "error" in r]
    return "\n".join(lines + ([""] + errors if errors else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["8gb", "24gb"], choices=PRESETS)
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), help="default: all (QLoRA ones on 8gb)")
    add_common_arguments(parser, "GRPO steps per configuration (default 3; >= 2)")
    parser.add_argument(
        "--completion-length",
        type=int,
        help=f"completion tokens (CUDA default {DEFAULT_COMPLETION_LENGTH}; 0: the preset's)",
    )
    parser.add_argument("--time-budget", type=float, default=420, help="seconds for all runs (default 420)")
    args = parser.parse_args(argv)
    if args.completion_length is None:
        args.completion_length = 0 if args.tiny else DEFAULT_COMPLETION_LENGTH
    if args.completion_length < 0:
        parser.error(f"--completion-length must be >= 0 (0: the preset's own), got {args.completion_length}")
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 (the first step compiles and is not measured), got {args.steps}")
    problem = environment_problem("gpu_throughput.py", "GPU generation speed", args.device, bool(args.child))
    if problem is not None:
        return problem
    if args.child:
        preset, config = args.child.split(":")
        Path(args.json_out).write_text(json.dumps(measure(preset, config, args, Path(args.model_dir))))
        return 0

    deadline, rows = time.monotonic() + args.time_budget, []
    with tempfile.TemporaryDirectory() as work:
        for preset, config in plan(args.presets, args.configs):
            model_dir = Path(work) / (preset_model(preset) or preset).replace("/", "--")  # one per architecture
            left = deadline - time.monotonic()
            if left < 30:
                row = {
                    "preset": preset,
                    "config": config,
                    "error": f"skipped: the {args.time_budget:.0f} s budget was spent",
                }
            else:
                child = ["--child", f"{preset}:{config}", "--model-dir", str(model_dir), "--device", args.device]
                child += ["--steps", str(args.steps), "--completion-length", str(args.completion_length)]
                child += ["--tiny"] if args.tiny else []
                # On the CPU (a smoke run, no device memory to keep apart) the first configuration runs in a child
                # process as every one does on a GPU, the others in this process.
                in_process = main if args.device == "cpu" and rows else None
                json_out = Path(work) / f"{preset}-{config}.json"
                row = run_child(__file__, child, json_out, left, f"{preset}:{config}", in_process)
                row.setdefault("preset", preset)
                row.setdefault("config", config)
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list | dict)}), flush=True)
            rows.append(row)

    rows = with_speedups(rows)
    name = "gpu_throughput_tiny" if args.tiny else "gpu_throughput"
    versions = next((row["versions"] for row in rows if "versions" in row), {})
    device = next((row["device"] for row in rows if "device" in row), args.device)
    header = f"{device}{' (--tiny: 2-layer models, a smoke run, not a speed figure)' if args.tiny else ''}; GRPO "
    header += f"steps per configuration: {args.steps} (the first not measured); "
    header += ", ".join(f"{k} {v}" for k, v in versions.items())
    payload = {"steps": args.steps, "device": device, "rows": rows}
    write_results(results_dir(args.output_dir, args.tiny), name, payload, markdown(rows, header))
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
