# A newcomer's commands: `make demo` runs the product, `make test` runs the suite.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# the suite waits on networks and subprocesses much of the time: one worker per core
TEST_WORKERS ?= 2

# every install takes its versions from the pins (decision 0054); `make lock` moves them
CONSTRAINTS := constraints.txt

.PHONY: install demo dev test lint lock upgrade services clean compile

# the proxy's per-request modules are compiled by `compile` below, once the venv holds
# every dependency (their types are the compiler's), not by pip's bare build env
$(VENV)/.installed: pyproject.toml setup.py $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --constraint $(CONSTRAINTS) pip setuptools
	CANARY_PURE_PYTHON=1 $(PY) -m pip install --quiet --constraint $(CONSTRAINTS) -e '.[dev]'
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

# tests are dealt out two at a time, in collection order, which puts the modules of
# long tests first (tests/conftest.py): each idle worker takes the longest one left
test: services
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --maxschedchunk 2

lint: install
	$(VENV)/bin/ruff check controlplane sidecar routers tests scripts
	$(VENV)/bin/mypy --strict controlplane sidecar routers scripts/lock.py
	$(PY) scripts/lock.py --check

# Rewrite the pins from the virtualenv as it is: after `make upgrade` (or a new
# dependency in pyproject.toml) and a passing `make lint test`.
lock:
	$(PY) scripts/lock.py

# Move every dependency to the newest release its bounds allow, ignoring the pins;
# then `make lock` and `make lint test`, and commit constraints.txt on its own.
upgrade: $(VENV)/.installed
	CANARY_PURE_PYTHON=1 $(PY) -m pip install --quiet --upgrade --upgrade-strategy eager pip setuptools -e '.[dev]'

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build sidecar/proxy/compiled.json
	find sidecar -name '*.so' -delete
