#!/usr/bin/env bash
# The GPU check of the code that only CUDA exercises, for a device machine (one call each, about 6 minutes):
#   here:   bash ../shared/tools/gpu_wheels.sh          # .whl/ with trl, datasets, bitsandbytes, math-verify, ...
#   there:  bash scripts/gpu_check.sh                   # carry .whl; results go to $OUT (else /tmp/gpu_check)
#           bash scripts/gpu_check.sh throughput        # the throughput benchmark, in a call of its own
# checks (default): benchmarks/gpu_checks.py, inside 6 minutes, a PASS/FAIL line per check, exit code 1 if one failed:
#   1. exact resume inside a generation cycle on CUDA (bf16, LoRA, every feature on), restored batch on the GPU;
#   2. a QLoRA (4-bit NF4 + LoRA) GRPO step on GSM8K, then recipes/eval_gsm8k.py on the trained adapter;
#   3. the GPU-marked tests (every tests/test_*.py holding one: fast generation, resume, fp16, the run doctor's
#      CUDA memory metrics).
# throughput: benchmarks/gpu_throughput.py: stock TRL's generation against each fast-generation setting and each
#   preset (8 and 24 GB), seconds per step, completion tokens per second, merge share, peak memory beside the estimate.
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
    timeout 360 python3 benchmarks/gpu_checks.py --time-budget 330 2>&1 | tee "$out/gpu_checks.log" ;;
  throughput)
    python3 benchmarks/gpu_throughput.py --time-budget 330 --output-dir "$out" 2>&1 | tee "$out/gpu_throughput.log" ;;
  *)
    echo "usage: bash scripts/gpu_check.sh [checks|throughput]" >&2
    exit 2 ;;
esac
