#!/usr/bin/env bash
# The GPU check of the code that only CUDA exercises, for a device machine (one call each, about 6 minutes):
#   here:   bash ../shared/tools/gpu_wheels.sh          # .whl/ with trl, datasets, bitsandbytes, math-verify, ...
#   there:  bash scripts/gpu_check.sh                   # carry .whl; results go to $OUT (else /tmp/gpu_check)
#           bash scripts/gpu_check.sh throughput        # the throughput benchmark, in a second call
# checks (default): benchmarks/generation/gpu_checks.py, inside 6 minutes, a PASS/FAIL line per check, the most telling first,
# exit code 1 if one failed:
#   1. rerecord: the re-record probe, 150 generations with the 8 GB preset's fast generation (LoRA, compiled decode
#      step, in-place merge): time per call, CUDA graphs recorded and device memory every 10 calls; the recordings
#      must stop growing, no CUDA graph skipped, one static cache;
#   2. exact resume inside a generation cycle on CUDA (bf16, LoRA, every feature on), restored batch on the GPU;
#   3. a QLoRA (4-bit NF4 + LoRA) GRPO step on GSM8K, then recipes/eval_gsm8k.py on the trained adapter;
#   4. the GPU-marked tests (every tests/**/test_*.py holding one): the presets' fast generation trained and probed over
#      50 generations (in-place and copy + compile, LoRA and 4-bit, bf16 and the T4 preset's fp16 with its loss
#      scaler), resume, fp16, the run doctor's CUDA memory metrics; and (issue #57) the probe generation compiling
#      with inductor and CUDA graphs and the fast path kept (tests/training/test_generation_fallback.py, in-place and copy),
#      the fall back to TRL's generation with Triton hidden (the same file, a subprocess), the in-place merge's host
#      copy page-locked at exactly its bytes (tests/gpu/test_generation_gpu.py), the two static caches of prompt skipping
#      holding the estimate's bytes (tests/training/test_memory.py).
# throughput: benchmarks/generation/gpu_throughput.py, the 8 GB preset's stock and preset rows first (in $OUT/first), then its
#   single levers (compile, inplace, copy) until the budget is spent (a row left out for time says "skipped", it is
#   no failure): seconds per step, completion tokens per second, merge share, peak memory beside the estimate. The
#   24 GB preset and the QLoRA rows: python3 benchmarks/generation/gpu_throughput.py --presets 24gb, in a call of its own.
# vllm: (issue #59) adapter-only LoRA sync to colocated vLLM on a bitsandbytes 4-bit base, whose log-probabilities
#   must equal the trainer's where the merged sync's do not (tests/engines/test_vllm.py, its GPU-marked test). Needs
#   vLLM installed on the machine: the lent machines have none (no internet, and a GPU build of vLLM is far above the
#   64 MiB the carried tree may hold), so it has not run; without vLLM it fails, saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-checks}"
out="${OUT:-/tmp/gpu_check}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/device.txt"
case "$mode" in
  checks)
    timeout 360 python3 benchmarks/generation/gpu_checks.py --time-budget 330 2>&1 | tee "$out/gpu_checks.log" ;;
  throughput)
    python3 benchmarks/generation/gpu_throughput.py --presets 8gb --configs stock preset --time-budget 200 --output-dir "$out/first" \
      2>&1 | tee "$out/gpu_throughput_first.log"
    python3 benchmarks/generation/gpu_throughput.py --presets 8gb --configs compile inplace copy --time-budget 130 \
      --output-dir "$out" 2>&1 | tee "$out/gpu_throughput.log" ;;
  vllm)
    TRL_GRPO_EXT_ENGINES=1 timeout 300 python3 -m pytest tests/engines/test_vllm.py -m gpu -p no:cacheprovider -q \
      2>&1 | tee "$out/vllm_4bit.log" ;;
  *)
    echo "usage: bash scripts/gpu_check.sh [checks|throughput|vllm]" >&2
    exit 2 ;;
esac
