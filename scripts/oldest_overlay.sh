#!/usr/bin/env bash
# Put the oldest TRL/transformers releases pyproject.toml allows into an overlay folder for `make test-oldest`:
# `bash scripts/oldest_overlay.sh VENV DIR`. PYTHONPATH=DIR then runs VENV's Python with these versions in front.
# transformers 5.18 is the oldest release this package's tests pass with (trl_grpo_ext/trl_contact.py needs 5.3 for
# `Trainer._clip_grad_norm` and `_tr_loss`, fast generation 5.13 for `GenerationConfig.max_cache_len`, TRL's continuous
# batching 5.8, and before 5.18 `Trainer` cannot resume an optimizer on several CPU processes). Its dependencies
# (huggingface-hub, tokenizers) are satisfied by the newest releases the environment holds: transformers checks them
# at import. trl's lower bound, 1.16.0, is also its upper one (trl>=1.16,<1.17).
set -euo pipefail
venv="$1"
dir="$2"
oldest=("transformers==5.18.0" "trl==1.16.0")
rm -rf "$dir"
"$venv/bin/python" "$(dirname "$0")/pip_install.py" "$venv/bin/python" --no-deps --target "$dir" "${oldest[@]}"
PYTHONPATH="$dir" "$venv/bin/python" - "${oldest[@]}" <<'PY'
import sys
from importlib.metadata import version

for pin in sys.argv[1:]:
    name, wanted = pin.split("==")
    assert version(name) == wanted, f"{name} {version(name)} in front of the overlay, not {wanted}"
    print(f"oldest: {name} {version(name)}")
PY
