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
# pip byte-compiles the files it installs one after the other (torch alone ~45 s on 2 cores): install without, then
# compile the environment once on every core (compileall -j 0). The byte code is needed: where PYTHONDONTWRITEBYTECODE
# is set (this project's machines) Python never writes what it compiles on import, so without it every process
# would compile torch and transformers from source again (the test suite took twice as long).
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  spec="$(bash "$(dirname "$0")/torch_spec.sh")"
  echo "Installing $spec into $venv"
  "${pip[@]}" "$spec"
fi
echo "Installing trl-grpo-ext (editable) with its test tools into $venv"
"${pip[@]}" -e ".[test]"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "Byte-compiling $site"
# exit code 1 when a file does not compile (a few packages ship such files; pip skips them the same way)
"$venv/bin/python" -m compileall -q -j 0 "$site" >/dev/null || true
touch "$venv/.installed"
