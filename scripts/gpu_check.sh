#!/usr/bin/env bash
# The GPU check of the code that only CUDA exercises, for a device machine (one call, about 8 minutes):
#   here:   bash ../shared/tools/gpu_wheels.sh          # .whl/ with trl, datasets, bitsandbytes, math-verify, ...
#   there:  bash scripts/gpu_check.sh                   # carry .whl; results go to $OUT (else /tmp/gpu_check)
# 1. tests/test_generation_gpu.py: pinned host copy and exact restore of the in-place merge, the bf16 generation
#    copy, compiled (CUDA-graph) generation in training for LoRA and QLoRA compiling once.
# 2. benchmarks/gpu_throughput.py: stock TRL's generation against each fast-generation setting and each preset (8 and
#    24 GB), seconds per step, completion tokens per second, merge share, peak memory next to the estimate.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpu_check}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/device.txt"
timeout 150 python3 -m pytest tests/test_generation_gpu.py -q -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log"
python3 benchmarks/gpu_throughput.py --time-budget 330 --output-dir "$out" 2>&1 | tee "$out/gpu_throughput.log"
