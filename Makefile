# jaxrl-agents: every target creates the virtual environment when it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv install test bench lint demo clean

venv: $(STAMP)

# torch==2.13.0 goes first: it is the CPU build on this disk; anything that asks for
# plain "torch" later is then already satisfied and does not pull a CUDA build.
$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check jaxrl_agents envs configs tests bench

demo: $(STAMP)
	$(VENV)/bin/jaxrl-train --config configs/textworld_tiny.py

clean:
	rm -rf $(VENV) build *.egg-info
