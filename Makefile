# A newcomer's commands: `make demo` runs the product, `make test` runs the suite.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# the suite waits on networks and subprocesses much of the time: one worker per core
TEST_WORKERS ?= 2

.PHONY: install demo dev test lint services clean compile

# the proxy's per-request modules are compiled by `compile` below, once the venv holds
# every dependency (their types are the compiler's), not by pip's bare build env
$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 'setuptools>=68'
	CANARY_PURE_PYTHON=1 $(PY) -m pip install --quiet -e '.[dev]'
	VENV_BIN=$(VENV)/bin scripts/install-k8s-tools.sh
	touch $@

install: $(VENV)/.installed compile

# recompiled when a proxy source changed since: a stale build would not be used
# (sidecar/compiled.py falls back to pure Python), so tests would miss the compiled one
sidecar/proxy/compiled.json: $(wildcard sidecar/proxy/*.py) sidecar/choice.py sidecar/compiled.py setup.py | $(VENV)/.installed
	$(PY) setup.py --quiet build_ext --inplace

compile: sidecar/proxy/compiled.json

demo: install
	$(VENV)/bin/canary demo

dev: install
	$(VENV)/bin/canary dev

services: install
	VENV_BIN=$(VENV)/bin scripts/services.sh

test: services
	$(VENV)/bin/pytest -n $(TEST_WORKERS)

lint: install
	$(VENV)/bin/ruff check controlplane sidecar routers tests
	$(VENV)/bin/mypy controlplane sidecar routers

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build sidecar/proxy/compiled.json
	find sidecar -name '*.so' -delete
