#!/usr/bin/env bash
# Put the oldest TRL/transformers releases pyproject.toml allows into an overlay folder for `make test-oldest`:
# `bash scripts/oldest_overlay.sh VENV DIR`. PYTHONPATH=DIR then runs VENV's Python with these versions in front.
# transformers 5.3 (the first with `Trainer._clip_grad_norm` and `_tr_loss`, see trl_grpo_ext/trl_contact.py) needs
# huggingface-hub 1.x and tokenizers <= 0.23.0, so those come along with the client libraries hub 1.x imports.
# trl's lower bound, 1.16.0, is also its upper one (trl>=1.16,<1.17): the environment already has it.
set -euo pipefail
venv="$1"
dir="$2"
oldest=("transformers==5.3.0" "trl==1.16.0")
rm -rf "$dir"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" "${oldest[@]}" \
  "huggingface-hub>=1.3,<2" "tokenizers>=0.22,<=0.23.0" httpx httpcore h11 anyio sniffio certifi idna hf-xet
PYTHONPATH="$dir" "$venv/bin/python" - "${oldest[@]}" <<'PY'
import sys
from importlib.metadata import version

for pin in sys.argv[1:]:
    name, wanted = pin.split("==")
    assert version(name) == wanted, f"{name} {version(name)} in front of the overlay, not {wanted}"
    print(f"oldest: {name} {version(name)}")
PY
