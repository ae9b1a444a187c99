#!/usr/bin/env bash
# Print the torch requirement that fits this machine, for `pip install`: $TORCH_SPEC when set; the default (CUDA)
# build `torch` where an NVIDIA GPU answers `nvidia-smi`; else the CPU build `torch==2.13.0` (on this project's
# machines pip finds it as a local file). Used by scripts/setup.sh and scripts/wheel_check.sh.
if [ -n "${TORCH_SPEC:-}" ]; then
  echo "$TORCH_SPEC"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "torch"
else
  echo "torch==2.13.0"
fi
