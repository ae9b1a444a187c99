# Two entry points, each doing its own set-up on a fresh machine:
#   make demo   create .venv, install, train the tiny model on the CPU demo (recipes/configs/demo_cpu.yaml)
#   make test   create .venv, install, run the test suite
# and for CI: make test-oldest   the contact-surface subset of the suite against the oldest trl/transformers allowed
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-oldest
$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)

demo: $(VENV)/.installed
	$(PY) recipes/math_gsm8k.py --config recipes/configs/demo_cpu.yaml $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest tests $(ARGS)

# The tests that exercise every contact with TRL's and transformers' private API (trl_grpo_ext/trl_contact.py)
# (the CPU throughput smoke run of test_generation.py checks the benchmark script, not TRL: left out for time)
OLDEST_TESTS ?= tests/test_trl_contact.py tests/test_equivalence.py tests/test_resume.py tests/test_split_invariance.py \
	tests/test_policy_groups.py tests/test_entropy.py tests/test_grad_reg.py tests/test_generation.py \
	--deselect tests/test_generation.py::test_gpu_throughput_benchmark_runs_every_configuration_in_cpu_smoke_mode
test-oldest: $(VENV)/.installed
	bash scripts/oldest_overlay.sh $(VENV) .oldest
	PYTHONPATH=.oldest $(PY) -m pytest $(OLDEST_TESTS) $(ARGS)
