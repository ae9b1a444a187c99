# Two entry points, each doing its own set-up on a fresh machine:
#   make demo   create .venv, install, train the tiny model on the CPU demo (recipes/configs/demo_cpu.yaml)
#   make test   create .venv, install, run the test suite
# and for CI: make test-oldest   the contact-surface subset of the suite against the oldest trl/transformers allowed
#             make test-engines  DeepSpeed ZeRO-2/3, FSDP2 and vLLM colocate for real, on CPU processes
#             make wheel-check   the wheel built, installed into a clean venv, imported and its command run from there
#             make docs          the documentation site (docs/, mkdocs.yml) built into site/, warnings as errors
# make docs-serve serves the site at http://127.0.0.1:8000 and rebuilds it on every change.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-oldest test-engines wheel-check docs docs-serve
$(VENV)/.installed: pyproject.toml scripts/setup.sh scripts/torch_spec.sh scripts/pip_install.py
	bash scripts/setup.sh $(VENV)

demo: $(VENV)/.installed
	$(PY) recipes/math_gsm8k.py --config recipes/configs/demo_cpu.yaml $(ARGS)

# The suite on $(TEST_WORKERS) pytest-xdist workers, one torch thread each (tests/conftest.py): its training runs are
# tiny and gain nothing from a second thread, so 2 workers on 2 cores finish in about 0.6 of one's time. The shared
# two-process job (tests/two_process.py) runs once, in the first worker that needs it. TEST_WORKERS=0: one process.
# --dist worksteal: a worker that runs out of tests takes half of the other's queue, so neither idles while the
# other works through a run of slow training tests (tests/training sits between fast folders).
# TESTS: what pytest collects (`make test TESTS=tests/unit`: the tests without a model, about a minute;
# `TESTS=tests/unit/test_rewards.py`: one file); ARGS add options such as -k.
TEST_WORKERS ?= 2
TESTS ?= tests
test: $(VENV)/.installed
	$(PY) -m pytest $(TESTS) --ignore=tests/engines -n $(TEST_WORKERS) --dist worksteal $(ARGS)

# The real engines (tests/engines/): DeepSpeed ZeRO-2 and ZeRO-3 and FSDP2 on 2 CPU processes over gloo, and TRL's
# vLLM colocate mode on vLLM's CPU build, in an environment of their own outside the clone (scripts/engines_setup.sh;
# reused while pyproject.toml and the script are unchanged). One pytest process: each engine job already runs 2
# processes on the 2 cores. TRL_GRPO_EXT_ENGINES=1: a missing engine fails the stage instead of skipping it.
ENGINES_VENV ?= $(HOME)/.cache/trl-grpo-ext/engines-venv
test-engines:
	bash scripts/engines_setup.sh "$(ENGINES_VENV)"
	TRL_GRPO_EXT_ENGINES=1 VLLM_CPU_KVCACHE_SPACE=1 "$(ENGINES_VENV)/bin/python" -m pytest tests/engines -p no:xdist $(ARGS)

# The tests that exercise every contact with TRL's and transformers' private API (trl_grpo_ext/trl_contact/), one
# run each: the import-time check; stock equivalence (the forwarding overrides); exact resume inside a generation
# cycle, with LoRA, of a finished run and on two processes (sampler, checkpoint save/load, RNG state, _tr_loss,
# _step, _buffered_inputs, _memory_tracker); split invariance (policy groups, entropy, KL-Cov through
# _compute_loss and the log-probabilities); gradient regularization (_clip_grad_norm, _get_grad_norm); fast
# generation (_generate_single_turn and the transformers internals; compiled with the CPU tests' backend,
# tests/cpu_compile.py). The whole suite runs with the newest versions.
OLDEST_TESTS ?= tests/unit/test_trl_contact.py \
	"tests/training/test_equivalence.py::test_default_settings_reproduce_stock_trl_exactly" \
	"tests/training/test_resume.py::test_resumed_run_equals_uninterrupted[save_steps_inside_generation_cycle]" \
	"tests/training/test_resume.py::test_resumed_run_equals_uninterrupted[lora]" \
	tests/training/test_resume.py::test_resuming_a_finished_run_changes_nothing tests/training/test_resume.py::test_two_processes_resume_exactly \
	tests/training/test_split_invariance.py::test_a_step_over_two_generation_batches_draws_the_same_tokens \
	tests/training/test_grad_reg.py::test_resume_is_exact tests/training/test_grad_reg.py::test_nonfinite_step_is_skipped_and_training_goes_on \
	tests/training/test_entropy.py::test_resume_restores_the_entropy_controllers_exactly \
	tests/training/test_policy_groups.py::test_grouped_run_resumes_exactly \
	"tests/training/test_generation.py::test_training_with_a_lever_matches_stock_generation" \
	tests/training/test_generation.py::test_repeated_input_grad_hooks_are_cut_with_fast_generation_and_pile_up_without
test-oldest: $(VENV)/.installed
	bash scripts/oldest_overlay.sh $(VENV) .oldest
	PYTHONPATH=.oldest $(PY) -m pytest $(OLDEST_TESTS) -n $(TEST_WORKERS) --dist worksteal $(ARGS)

# `pip install .` as a user gets it (scripts/wheel_check.sh): what the wheel holds (the package and its model configs,
# no tests, benchmarks or recipes), then, in a clean venv with torch installed first, the import and the command.
wheel-check: $(VENV)/.installed
	bash scripts/wheel_check.sh $(VENV)

# The `docs` extra's requirements as read from pyproject.toml, each quoted for xargs (installed alone: reinstalling the
# package itself is not needed, `make test`'s set-up has done that)
define DOCS_EXTRA
try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib
import shlex
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]
print(" ".join(shlex.quote(requirement) for requirement in extra))
endef
export DOCS_EXTRA

# The documentation site: the `docs` extra (MkDocs, Material, mkdocstrings) installed into $(VENV) once (again when
# pyproject.toml changes), then
# `mkdocs build --strict`, so a broken link or anchor, or a docstring that cannot be rendered, fails (mkdocs.yml,
# `validation:`). mkdocstrings reads the package statically: the build imports no torch.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -c "$$DOCS_EXTRA" | xargs $(PY) scripts/pip_install.py $(PY)
	touch $@
# NO_MKDOCS_2_WARNING: Material 9.7+ prints a banner about its end of life (May 2027) on every build, not a finding
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site $(ARGS)
docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve $(ARGS)
