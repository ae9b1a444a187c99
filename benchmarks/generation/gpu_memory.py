"""Peak GPU memory and step time of every consumer-GPU preset, measured next to its estimate (issue #6).

    python benchmarks/generation/gpu_memory.py                  # CUDA: every preset, 3 GRPO steps (< 8 min on one
                                                                # H200)
    python benchmarks/generation/gpu_memory.py --presets 8gb 12gb --steps 3
    python benchmarks/generation/gpu_memory.py --device cpu --tiny  # the same code path on CPU with shrunken models
                                                                    # (smoke; writes into the temp dir, not
                                                                    # benchmarks/generation/results)

For each preset `recipes/configs/gsm8k-<N>gb.yaml`: a model of the preset's architecture
(`trl_grpo_ext/consumer_gpu/model_configs/`) with random weights, built on the device and saved once in bf16, then
loaded by TRL as the recipe loads it (4-bit NF4 for QLoRA, the preset's LoRA, optimizer, checkpointing and extension
settings);
a byte-level BPE tokenizer trained locally (`trl_grpo_ext.cli.tiny_model`; its ids stay below the model's vocabulary);
prompts of the estimate's prompt length; every completion forced to `max_completion_length` (`min_new_tokens`); a
reward computed from the text, no model. Nothing is downloaded. Each preset runs in a process of its own, so its peak
is its own, and the parent never touches the GPU. Peaks are `torch.cuda.max_memory_allocated/reserved`, overall and
per phase (loading, generation, training); `device_used_gib` is the card's used memory at the end, CUDA context
included (what nvidia-smi shows). On a large card the caching allocator reserves more freely than on a small one:
compare the estimate without its overhead term to the allocated peak.

Writes `benchmarks/generation/results/gpu_memory.json` and `gpu_memory.md`. A `--tiny` smoke run writes
`gpu_memory_tiny.*` into `<temp dir>/trl-grpo-ext-benchmarks/` instead, so that it never rewrites the committed
results; `--output-dir` sets either (`--output-dir benchmarks/generation/results` to commit a smoke run's files).
Needs torch with CUDA, transformers, peft, accelerate, trl, bitsandbytes, datasets and this package's own imports
(scikit-learn, scipy, math-verify): a missing one, or no CUDA device, stops it with exit code 2 and a message saying
what to install or use. Exit code 1 when a preset failed (its row says why: an out-of-memory error keeps the peak
reached).
"""

import argparse
import json
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


def estimate_row(training_args, model_args, model_config, prompt_length: int) -> dict:
    """The estimate of a preset as the benchmark runs it, in GiB, and what it runs."""
    from trl_grpo_ext.consumer_gpu import memory

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


def measure(preset: str, args, model_dir: Path) -> dict:
    """The estimate of a preset, then `args.steps` GRPO steps on random weights: peaks (GiB) and step times (s).

    A failure (out of memory included) is the row's `error`, with the peaks reached until then.
    """
    import statistics

    with tempfile.TemporaryDirectory() as out:
        training_args, model_args, model_config, prompt_length = preset_config(
            preset, out, args.steps, args.device, args.tiny
        )
        row = {"preset": preset} | estimate_row(training_args, model_args, model_config, prompt_length)
        row |= measure_run(training_args, model_args, model_config, prompt_length, model_dir, args.device)
    times = row["step_times_s"]
    row["step_time_s"] = round(statistics.median(times[1:] or times), 2) if times else None
    return row


def markdown(rows: list[dict], header: str) -> str:
    """The results as a markdown table, measured next to estimated."""

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
    add_common_arguments(parser, "GRPO steps per preset (default 3)")
    parser.add_argument("--in-process", action="store_true", help="run the presets in this process, one after another")
    parser.add_argument("--time-budget", type=float, default=450, help="seconds for all presets (default 450)")
    args = parser.parse_args(argv)
    problem = environment_problem("gpu_memory.py", "GPU memory", args.device, bool(args.child or args.in_process))
    if problem is not None:
        return problem
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
                child = ["--child", preset, "--model-dir", str(model_dir), "--device", args.device]
                child += ["--steps", str(args.steps)] + (["--tiny"] if args.tiny else [])
                row = run_child(__file__, child, Path(work) / f"{preset}.json", left, preset)
                row.setdefault("preset", row.pop("name", preset))
            print(json.dumps(row), flush=True)
            rows.append(row)

    name = "gpu_memory_tiny" if args.tiny else "gpu_memory"
    versions = next((row["versions"] for row in rows if "versions" in row), {})
    header = f"GRPO steps per preset: {args.steps}; " + ", ".join(f"{k} {v}" for k, v in versions.items())
    payload = {"steps": args.steps, "versions": versions, "rows": rows}
    write_results(results_dir(args.output_dir, args.tiny), name, payload, markdown(rows, header))
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
