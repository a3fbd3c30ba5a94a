# txlog: two commands do everything: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: run test install bench clean system-deps

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

clean:
	rm -rf $(VENV) .txlog .pytest_cache
