# Two entry points, each doing its own set-up on a fresh machine:
#   make demo   create .venv, install, train the tiny model on the CPU demo (recipes/configs/demo_cpu.yaml)
#   make test   create .venv, install, run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test
$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)

demo: $(VENV)/.installed
	$(PY) recipes/math_gsm8k.py --config recipes/configs/demo_cpu.yaml $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest tests $(ARGS)
