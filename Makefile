# txlog: two commands do everything: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: run test install bench chaos clean system-deps

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,spark]'
	touch $(STAMP)

install: $(STAMP)

# Java's PostgreSQL JDBC driver and a headless Chromium for page tests (Debian/Ubuntu).
system-deps:
	@bash scripts/system-deps.sh

run: $(STAMP)
	$(VENV)/bin/txlog serve

test: $(STAMP) system-deps
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q

bench: $(STAMP) system-deps
	$(PY) -m bench

# Longer fault runs: 10,000 transactions timing out together, and a frozen server a few times over.
CHAOS_ROUNDS ?= 3
chaos: $(STAMP) system-deps
	TXLOG_SWEEPER_SCALE_N=10000 $(PY) -m pytest -q -s -p no:cacheprovider tests/integration/test_sweeper_scale.py
	for i in $$(seq $(CHAOS_ROUNDS)); do \
	  $(PY) -m pytest -q -s -p no:cacheprovider tests/acceptance/test_frozen_host.py || exit 1; \
	done

clean:
	rm -rf $(VENV) .txlog .pytest_cache
