"""The CUDA machine's checks (issues #12, #27), in one process that ends inside 6 minutes on one H200, offline:

    python benchmarks/generation/gpu_checks.py               # CUDA, bf16 (scripts/gpu_check.sh runs it on a device
                                                             # machine)
    python benchmarks/generation/gpu_checks.py --device cpu  # the same logic on the CPU, fp32 (the GPU-marked tests
                                                             # skip)
    python benchmarks/generation/gpu_checks.py --checks rerecord resume

The most telling first:

1. `rerecord`: the re-record probe. A trainer with the 8 GB preset's fast generation (LoRA, `generation_compile`,
   `generation_lora_merge="inplace"`) generates 150 times through TRL's generation path, 8 prompts of 3-40 tokens
   each; every 10 calls it prints the seconds of the call, the CUDA graphs recorded so far and the device memory.
   Passes when the recordings stop growing after the first 10 calls, inductor skipped no CUDA graph, the run kept
   one static cache (`tests.gpu.test_generation_gpu.generation_probe`); the detail gives the median call time from
   call 10 on and the slowest sampled call against it (a re-recording run would grow with the calls).
2. `resume`: a run with bf16, LoRA and every feature on (policy groups, entropy regularization, ZClip + AGC, the
   adaptive KL coefficient) resumed from a checkpoint inside a generation cycle continues exactly as the
   uninterrupted one, and the buffered generation batch restored from the checkpoint is on the device
   (`tests.gpu.test_resume_gpu.resume_inside_cycle`, the GPU test's case `every_feature_bf16_weights`).
3. `qlora_eval`: QLoRA (bitsandbytes 4-bit NF4 + LoRA) trains 2 GRPO steps on GSM8K problems and its LoRA weights
   move; the adapter is saved and `recipes/eval_gsm8k.py`'s `main` evaluates it in this process on 4 test problems
   (from the project's shared GSM8K folder beside the repository when present, else seeded GSM8K-format problems
   of `trl_grpo_ext.gsm8k.data`).
4. `gpu_tests`: `pytest -m gpu` on the test files that hold GPU-marked tests (fast generation as the presets run it:
   in-place and copy merges with compilation, LoRA and 4-bit, bf16 and the T4 preset's fp16, 50 generations each;
   resume; the fp16 paths of the T4 preset and the quickstart notebook, `tests/gpu/test_fp16_gpu.py`; the run doctor's
   CUDA memory metrics, `tests/training/test_doctor.py`; the probe generation on a real compile and the fall back with
   Triton hidden, `tests/training/test_generation_fallback.py`; the in-place merge's exact page-locked bytes; the two
   static caches' memory, `tests/training/test_memory.py`), in a subprocess, with what is left of `--time-budget` as
   its timeout. On CUDA a skipped test fails the check; with `--device cpu` they all skip and the check only shows that
   they collect.

Every model is the tiny random-init Qwen2 of `trl_grpo_ext.cli.tiny_model`, built here: nothing is downloaded. Prints
one `PASS <check>: <detail>` or `FAIL <check>: <reason>` line per check (the traceback of a failure goes to stderr).
Exit code 1 when a check failed, 2 without CUDA (unless `--device cpu`) or with a missing package.
"""

import argparse
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before torch touches cuBLAS (the resume comparison)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the harness, also when this file is loaded by path
from benchmarks.harness import REPO_ROOT, environment_problem  # noqa: E402

GSM8K_DIR = REPO_ROOT.parent / "shared" / "data" / "gsm8k"
CHECKS = ("rerecord", "resume", "qlora_eval", "gpu_tests")
PROBE_CALLS = int(os.environ.get("GPU_CHECK_PROBE_CALLS", "150"))  # fewer for a CPU smoke run
EVAL_PROBLEMS = 4


def check_rerecord(model_dir: str, work: Path, device: str, dtype: str) -> str:
    import statistics

    from tests.gpu.test_generation_gpu import generation_probe, probe_trainer

    if PROBE_CALLS < 20:
        raise ValueError(f"GPU_CHECK_PROBE_CALLS={PROBE_CALLS}: the probe compares calls 10 to the last, needs >= 20")
    trainer = probe_trainer(model_dir, work / "probe", merge="inplace", dtype=dtype, device=device)
    rows, skips = generation_probe(trainer, calls=PROBE_CALLS)
    for row in rows:
        print(f"  probe call {row['call']:>3}: {row['seconds'] * 1000:7.1f} ms, CUDA graphs recorded "
              f"{row['recordings']}, allocated {row['allocated_gib']:.3f} GiB, reserved {row['reserved_gib']:.3f} GiB",
              flush=True)  # fmt: skip
    late = [row for row in rows if row["call"] >= 10]
    grew = late[-1]["recordings"] - late[0]["recordings"]
    assert grew == 0, f"CUDA graphs recorded grew by {grew} from call {late[0]['call']} to call {late[-1]['call']}"
    assert skips == 0, f"inductor skipped CUDA graphs {skips} times"
    caches = trainer.fast_generation.caches
    assert caches.built == 1, f"{caches.built} static caches built: {sorted(caches.caches)}"
    median = statistics.median(row["seconds"] for row in late)
    slowest = max(row["seconds"] for row in late)
    if device == "cuda":
        assert late[-1]["recordings"] >= 1, "no CUDA graph was recorded: the decode step did not run as a CUDA graph"
    first = rows[0]["seconds"]
    return (f"{PROBE_CALLS} generations: {late[-1]['recordings']} CUDA graphs recorded from call 10 on, no growth, "
            f"0 skips, 1 static cache; first call {first:.1f} s, then median {median * 1000:.1f} ms, slowest "
            f"{slowest / median:.1f}x the median")  # fmt: skip


def check_resume(model_dir: str, work: Path, device: str, dtype: str) -> str:
    from tests.gpu.test_resume_gpu import EVERY_FEATURE, resume_inside_cycle

    result = resume_inside_cycle(EVERY_FEATURE, work / "resume", model_dir, device=device, dtype=dtype)
    features = " ".join(result["features"])
    return f"max abs diff {result['max_diff']:.3g}, restored batch on {result['buffer_devices']}, logged: {features}"


def gsm8k_folder(work: Path) -> tuple[Path, str]:
    """A GSM8K-format folder (train.jsonl, test.jsonl) and what it holds: the real data beside the repository, else
    seeded generated problems written to `work`."""
    if (GSM8K_DIR / "train.jsonl").is_file() and (GSM8K_DIR / "test.jsonl").is_file():
        return GSM8K_DIR, f"GSM8K from {GSM8K_DIR}"
    from trl_grpo_ext.gsm8k.data import synthetic_gsm8k

    folder = work / "gsm8k"
    folder.mkdir(parents=True, exist_ok=True)
    for split, seed in (("train", 1), ("test", 2)):
        rows = synthetic_gsm8k(16, seed=seed)
        lines = [json.dumps({"question": r["question"], "answer": r["answer"]}) for r in rows]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder, f"seeded GSM8K-format problems: no {GSM8K_DIR} here"


def check_qlora_eval(model_dir: str, work: Path, device: str, dtype: str) -> str:
    import bitsandbytes as bnb
    import torch
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, PrinterCallback

    from tests.conftest import length_reward
    from trl_grpo_ext import GRPOConfig, GRPOTrainer
    from trl_grpo_ext.gsm8k.data import load_gsm8k
    from trl_grpo_ext.gsm8k.rewards import gsm8k_accuracy

    data_dir, data_note = gsm8k_folder(work)
    compute = torch.float32 if dtype == "fp32" else torch.bfloat16  # the 4-bit layers' compute dtype, the rest's
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
    args = GRPOConfig(
        output_dir=str(work / "qlora"), per_device_train_batch_size=8, num_generations=4, max_completion_length=16,
        learning_rate=1e-2, max_steps=2, logging_steps=1, report_to="none", save_strategy="no", seed=0,
        use_cpu=device == "cpu", bf16=dtype != "fp32", disable_tqdm=True, model_init_kwargs={"dtype": compute},
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[gsm8k_accuracy, length_reward],  # the length reward gives a random model's completions spread
        args=args,
        train_dataset=load_gsm8k("train", data_dir, limit=16),
        peft_config=LoraConfig(r=4, target_modules="all-linear"),
        quantization_config=quantization,
    )
    trainer.remove_callback(PrinterCallback)  # keeps the output to the check lines; logs still reach trainer.state
    layers = [m for m in trainer.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers, "no bitsandbytes Linear4bit layer in the trained model: it was not quantized"
    kinds = {m.weight.quant_state.quant_type for m in layers if m.weight.quant_state is not None}
    assert kinds == {"nf4"}, f"4-bit layers quantized as {kinds}, not nf4"
    placed = {m.weight.device.type for m in layers}
    assert placed == {device}, f"4-bit weights on {placed}, not {device}"
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    moved = sum(not torch.equal(lora[n], p) for n, p in trainer.model.named_parameters() if n in lora)
    assert moved, f"no LoRA weight changed in {args.max_steps} steps"
    adapter_dir = work / "qlora-adapter"
    trainer.save_model(str(adapter_dir))
    del trainer
    free_memory()

    spec = importlib.util.spec_from_file_location("eval_gsm8k", REPO_ROOT / "recipes" / "eval_gsm8k.py")
    eval_gsm8k = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_gsm8k)
    output_file = work / "eval_gsm8k.json"
    results = eval_gsm8k.main(
        eval_gsm8k.EvalArguments(
            model_name_or_path=str(adapter_dir), dataset_path=str(data_dir), limit=EVAL_PROBLEMS, batch_size=4,
            max_new_tokens=32, dtype="float32" if dtype == "fp32" else "bfloat16", output_file=str(output_file),
        )
    )  # fmt: skip
    assert results["num_problems"] == EVAL_PROBLEMS, f"evaluated {results['num_problems']} problems"
    completions = [sample["completion"] for sample in results["samples"]]
    assert len(completions) == EVAL_PROBLEMS and all(isinstance(c, str) for c in completions), completions
    assert all(0.0 <= results[k] <= 1.0 for k in ("strict_accuracy", "lenient_accuracy")), results
    assert json.loads(output_file.read_text())["num_problems"] == EVAL_PROBLEMS
    return (
        f"{len(layers)} NF4 layers, {moved}/{len(lora)} LoRA tensors moved in {args.max_steps} steps; eval_gsm8k on "
        f"{EVAL_PROBLEMS} problems ({data_note}): lenient accuracy {results['lenient_accuracy']:.2f}"
    )


def gpu_test_files() -> list[str]:
    """The test files with GPU-marked tests (collecting all of tests/ would import packages a GPU image lacks)."""
    return sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "tests").rglob("test_*.py")
                  if "engines" not in p.parts and "pytest.mark.gpu" in p.read_text())  # fmt: skip


def check_gpu_tests(device: str, timeout: float, work: Path) -> str:
    files = gpu_test_files()
    assert files, "no test file holds a GPU-marked test"
    report = work / "gpu_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", *files, "-q", "-rs", "-p", "no:cacheprovider",
           f"--junitxml={report}"]  # fmt: skip
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        print((error.stdout or b"")[-4000:].decode(errors="replace"), file=sys.stderr)
        raise AssertionError(f"pytest did not finish in {timeout:.0f} s") from None
    print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n", file=sys.stderr)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else f"exit code {proc.returncode}"
    assert report.is_file(), f"pytest wrote no report ({summary})"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    assert proc.returncode == 0, f"{summary} (exit code {proc.returncode})"
    if device == "cuda":
        assert passed > 0 and counts["skipped"] == 0, f"{summary}: on CUDA every GPU test must run"
        return f"{summary} ({', '.join(files)})"
    return f"{summary} ({', '.join(files)}; without CUDA they skip: collection only)"


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", choices=["bf16", "fp32"], help="default: bf16 on CUDA, fp32 on the CPU")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS))
    budget_help = "seconds for all checks: the GPU tests' timeout is what is left (at least 60 s)"
    parser.add_argument("--time-budget", type=float, default=330, help=budget_help)
    args = parser.parse_args(argv)
    code = environment_problem("gpu_checks.py", "resume, QLoRA and GPU-test checks", args.device, import_all=False)
    if code is not None:
        return code
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    start = time.perf_counter()
    failed = []
    with tempfile.TemporaryDirectory(prefix="gpu_checks_") as tmp:
        work = Path(tmp)
        from trl_grpo_ext.cli.tiny_model import save_tiny_model

        model_dir = str(save_tiny_model(work / "tiny-model"))
        for name in args.checks:
            began = time.perf_counter()
            try:
                if name == "rerecord":
                    detail = check_rerecord(model_dir, work, args.device, dtype)
                elif name == "resume":
                    detail = check_resume(model_dir, work, args.device, dtype)
                elif name == "qlora_eval":
                    detail = check_qlora_eval(model_dir, work, args.device, dtype)
                else:
                    left = max(args.time_budget - (time.perf_counter() - start), 60)
                    detail = check_gpu_tests(args.device, left, work)
                print(f"PASS {name}: {detail} [{time.perf_counter() - began:.0f} s]", flush=True)
            except Exception as error:  # a failed check is a result: report it and go on to the next one
                traceback.print_exc()
                reason = str(error).strip().splitlines()[0][:400] if str(error).strip() else ""
                seconds = time.perf_counter() - began
                print(f"FAIL {name}: {type(error).__name__}: {reason} [{seconds:.0f} s]", flush=True)
                failed.append(name)
            free_memory()
    print(f"{len(args.checks) - len(failed)}/{len(args.checks)} checks passed on {args.device} ({dtype}) in "
          f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
