#!/usr/bin/env bash
# Create a virtual environment with trl-grpo-ext and its test tools: `bash scripts/setup.sh [VENV_DIR]` (default .venv).
# torch is installed first and picked for the machine: the default (CUDA) build where an NVIDIA GPU answers, else the
# CPU build torch==2.13.0. On this project's machines pip finds that CPU build as a local file; elsewhere point pip
# at PyTorch's CPU wheel index first, e.g. PIP_EXTRA_INDEX_URL=<pytorch cpu index>. Set TORCH_SPEC to choose yourself.
set -euo pipefail
venv="${1:-.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# Installs go through scripts/pip_install.py: uv where it installs (several times faster than pip, with pip's settings
# carried over), pip otherwise. --compile writes the byte code, which Python does not where PYTHONDONTWRITEBYTECODE is
# set (this project's machines).
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv || echo "uv did not install; pip installs instead"
install=("$venv/bin/python" "$(dirname "$0")/pip_install.py" "$venv/bin/python" --compile)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  spec="$(bash "$(dirname "$0")/torch_spec.sh")"
  echo "Installing $spec into $venv"
  "${install[@]}" "$spec"
fi
echo "Installing trl-grpo-ext (editable) with its test tools into $venv"
"${install[@]}" -e ".[all,test]"
touch "$venv/.installed"
