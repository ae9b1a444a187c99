#!/usr/bin/env bash
# The installed package, as `pip install .` gives it: build the wheel, check what it holds, install it with its
# dependencies into a clean virtual environment, then, from outside the source tree, import the package, run the
# `trl-grpo-ext` command (help, tiny-model, memory) and the documented examples (the README's minimal script, and the
# commands that need an extra, which must stop with one line naming it). Fails on the first error.
#
#   bash scripts/wheel_check.sh [BUILD_VENV]     (default .venv: the set-up's environment, whose setuptools builds)
#
# torch goes into the clean environment first, picked as scripts/setup.sh picks it (TORCH_SPEC to choose), so the
# wheel's unpinned `torch` is already met; the check fails if installing the wheel changes that torch. KEEP_DIR=DIR
# keeps the work there (wheel, venv, tiny model) instead of a temporary folder removed at the end.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build_venv="$(cd "${1:-.venv}" && pwd)"
build_py="$build_venv/bin/python"
start=$(date +%s)
stage() { echo "wheel-check: $1 ($(( $(date +%s) - start )) s)"; }
fail() { echo "wheel-check: FAILED: $1" >&2; exit 1; }

if [ -n "${KEEP_DIR:-}" ]; then
  work="$KEEP_DIR"; rm -rf "$work"; mkdir -p "$work"; work="$(cd "$work" && pwd)"
else
  work="$(mktemp -d /tmp/wheel-check.XXXXXX)"
fi
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait; [ -n "${KEEP_DIR:-}" ] || rm -rf "$work"; }
trap cleanup EXIT

# 1. The wheel, built from a copy of the files git would commit (tracked, plus untracked ones not ignored): an
# in-place build would reuse build/lib, where a module deleted from the tree lives on and ends up in the wheel.
mkdir "$work/src"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$repo" ls-files -z --cached --others --exclude-standard \
    | (while IFS= read -r -d '' f; do [ -e "$repo/$f" ] && printf '%s\0' "$f"; done) \
    | tar -C "$repo" --null -T - -cf - | tar -C "$work/src" -xf -
else
  tar -C "$repo" --exclude=.venv --exclude=.oldest --exclude=build --exclude='*.egg-info' --exclude=outputs \
    --exclude=runs --exclude=.whl -cf - . | tar -C "$work/src" -xf -
fi
"$build_py" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w "$work/dist" \
  "$work/src"
wheels=("$work"/dist/trl_grpo_ext-*-py3-none-any.whl)
[ "${#wheels[@]}" -eq 1 ] && [ -f "${wheels[0]}" ] || fail "expected one trl_grpo_ext-*-py3-none-any.whl in $work/dist"
wheel="${wheels[0]}"
stage "built $(basename "$wheel")"

# 2. What the wheel holds: every file of the source's trl_grpo_ext/ (modules, and consumer_gpu/model_configs/*.json as package
# data: a new data file needs pyproject.toml's package-data), its .dist-info with the console script, and nothing
# else (tests, benchmarks, recipes, scripts stay in the clone).
unzip -Z1 "$wheel" | sort >"$work/wheel.txt"
(cd "$work/src" && find trl_grpo_ext -type f -not -path '*/__pycache__/*' -not -name '*.pyc' | sort) \
  >"$work/expected.txt"
grep -q '^trl_grpo_ext/consumer_gpu/model_configs/.*\.json$' "$work/expected.txt" || fail "no trl_grpo_ext/consumer_gpu/model_configs/*.json"
stray="$(grep -vE '^trl_grpo_ext(/|-[^/]*\.dist-info/)' "$work/wheel.txt" || true)"
[ -z "$stray" ] || fail "files outside the package in the wheel:"$'\n'"$stray"
! grep -qE '(^|/)(tests|benchmarks|recipes|scripts)/' "$work/wheel.txt" || fail "tests/benchmarks/recipes in the wheel"
package_files="$(grep -v '\.dist-info/' "$work/wheel.txt")"
difference="$(diff <(echo "$package_files") "$work/expected.txt" || true)"
[ -z "$difference" ] || fail "the wheel's package files and the source's differ (< wheel, > source):"$'\n'"$difference"
unzip -p "$wheel" '*.dist-info/entry_points.txt' | grep -qx 'trl-grpo-ext = trl_grpo_ext.cli:main' \
  || fail "no trl-grpo-ext console script in the wheel"
stage "the wheel holds the $(grep -c . "$work/expected.txt") package files (model configs included) and nothing else"

# 3. A clean environment: torch first, then the wheel with its dependencies. The environment gets no pip of its
# own: the build environment installs into it (scripts/pip_install.py: uv where the set-up installed it, else pip),
# without byte-compiling what it installs (torch alone takes ~45 s): the smoke test below compiles what it imports.
"${PYTHON:-python3}" -m venv --without-pip "$work/venv"
venv_py="$work/venv/bin/python"
pip=("$build_py" "$repo/scripts/pip_install.py" "$venv_py")
torch_spec="$(bash "$repo/scripts/torch_spec.sh")"  # chosen as scripts/setup.sh chooses it
"${pip[@]}" "$torch_spec"
torch_version() { "$venv_py" -c 'import importlib.metadata as m; print(m.version("torch"))'; }
torch_before="$(torch_version)"
stage "clean venv with torch $torch_before ($torch_spec)"
"${pip[@]}" "$wheel"
torch_after="$(torch_version)"
[ "$torch_after" = "$torch_before" ] || fail "installing the wheel replaced torch $torch_before by $torch_after"
stage "installed the wheel and its dependencies; torch left as it was ($torch_after)"

# 4. From outside the source tree (the source is not importable), offline: the import, and the command.
cd "$work"
run() { env -u PYTHONPATH -u PYTHONDONTWRITEBYTECODE HF_HUB_OFFLINE=1 "$@"; }
# Two processes at once, each loading torch, transformers and TRL (the first load also writes their byte code):
# `trl-grpo-ext tiny-model` as the installed command, and one that imports the package and calls the command's
# entry point with --help and with memory. memory reads a recipe config from the clone (recipes/ is not in the
# wheel) and takes that model's architecture from the package data.
cli="$work/venv/bin/trl-grpo-ext"
run "$cli" tiny-model "$work/tiny" >"$work/tiny.txt" 2>&1 & tiny_pid=$!
run "$venv_py" - "$work/venv" "$repo/recipes/configs/gsm8k-8gb.yaml" <<'EOF'
import contextlib
import io
import sys
from importlib.metadata import entry_points
from importlib.resources import files
from pathlib import Path

import trl
import trl_grpo_ext
from trl_grpo_ext import GRPOConfig, GRPOTrainer

venv, recipe = sys.argv[1:]
location = Path(trl_grpo_ext.__file__).resolve()
assert Path(venv).resolve() in location.parents, f"trl_grpo_ext imported from {location}, not the venv"
assert issubclass(GRPOConfig, trl.GRPOConfig) and issubclass(GRPOTrainer, trl.GRPOTrainer)
configs = sorted(p.name for p in (files("trl_grpo_ext.consumer_gpu") / "model_configs").iterdir())
assert configs, "no model configs in the installed package"
print(f"import trl_grpo_ext {trl_grpo_ext.__version__} from {location.parent}; model configs: {', '.join(configs)}")
(script,) = entry_points(group="console_scripts", name="trl-grpo-ext")
memory = ["memory", "--config", recipe, "--card-gib", "8"]
for args, expected in ((["--help"], "tiny-model"), (memory, "\npeak ")):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = script.load()(args)
    assert code == 0 and expected in out.getvalue(), f"trl-grpo-ext {' '.join(args)}: exit {code}\n{out.getvalue()}"
    lines = [line for line in out.getvalue().splitlines() if line.startswith(("usage", "peak", "card"))]
    print(f"trl-grpo-ext {' '.join(args)} ({script.value}): " + "\n  ".join(lines))
# the wheel without extras: none of the extras' packages, and the GSM8K task's import names the extra to install
from importlib.util import find_spec

from trl_grpo_ext.error_reports import EXTRAS, MissingDependencyError

installed = [module for module in EXTRAS if find_spec(module) is not None]
assert not installed, f"the wheel without extras installed {installed}"
try:
    import trl_grpo_ext.gsm8k.rewards  # noqa: F401
except MissingDependencyError as error:
    assert "pip install 'trl-grpo-ext[gsm8k]'" in str(error), error
    print(f"without extras: no {', '.join(EXTRAS)}; import trl_grpo_ext.gsm8k.rewards: {error}")
else:
    raise AssertionError("trl_grpo_ext.gsm8k.rewards imported without math-verify")
EOF
stage "import trl_grpo_ext, GRPOConfig, GRPOTrainer; trl-grpo-ext --help, memory; the extras left out"
wait "$tiny_pid" && [ -f "$work/tiny/config.json" ] && [ -f "$work/tiny/tokenizer.json" ] \
  || fail "trl-grpo-ext tiny-model $work/tiny:"$'\n'"$(cat "$work/tiny.txt")"
grep '^Wrote ' "$work/tiny.txt"
stage "trl-grpo-ext tiny-model"

# 5. The documented examples, as a reader copies them (scripts/doc_examples.py takes each from its page), in this
# environment without extras: the README's minimal script trains its 4 steps offline, as the README says to run it;
# getting-started's offline `trl-grpo-ext grpo ... --reward_funcs accuracy_reward` and `make demo`'s recipe each stop
# before loading a model with one line naming the extra to install. The first runs while the other two do.
"$build_py" "$repo/scripts/doc_examples.py" minimal-script "$work" >"$work/minimal.py"
"$build_py" "$repo/scripts/doc_examples.py" grpo-offline "$work" >"$work/grpo.sh"
run "$venv_py" "$work/minimal.py" >"$work/minimal.txt" 2>&1 & minimal_pid=$!
one_line() {  # one_line NAME EXTRA COMMAND...: exit 1, no traceback, one error line (the last) naming the extra
  local name="$1" extra="$2" rc=0; shift 2
  run env PATH="$work/venv/bin:$PATH" "$@" >"$work/$name.out" 2>"$work/$name.err" || rc=$?
  [ "$rc" -eq 1 ] && ! grep -q Traceback "$work/$name.err" && [ "$(grep -c ': error: ' "$work/$name.err")" -eq 1 ] \
    && tail -n 1 "$work/$name.err" | grep -q ": error: .*pip install 'trl-grpo-ext\[$extra\]'" \
    || fail "$name: expected exit 1 and one line naming the $extra extra, got exit $rc:"$'\n'"$(cat "$work/$name.err")"
  echo "$name: $(tail -n 1 "$work/$name.err")"
}
one_line grpo-offline gsm8k bash "$work/grpo.sh"
one_line make-demo gsm8k "$venv_py" "$repo/recipes/math_gsm8k.py" --config "$repo/recipes/configs/demo_cpu.yaml"
wait "$minimal_pid" && grep -q "train_runtime" "$work/minimal.txt" \
  || fail "the README's minimal script:"$'\n'"$(tail -20 "$work/minimal.txt")"
stage "the documented examples: the minimal script trained; grpo and the demo named the missing extra in one line"
echo "wheel-check: passed in $(( $(date +%s) - start )) s"
