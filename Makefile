# txlog: two commands do everything: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: run test lint install bench chaos clean system-deps

$(STAMP): pyproject.toml setup.py app/_native.c
	PYTHON=$(PYTHON) bash scripts/system-deps.sh build
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,spark]'
	touch $(STAMP)

install: $(STAMP)

# A C compiler, Java's PostgreSQL JDBC driver, a headless Chromium for page tests and more (Debian/Ubuntu).
system-deps:
	@bash scripts/system-deps.sh

# The HTTP API and admin pages on :8080, the Kafka wire gateway on :9092 and the RocketMQ gateway
# on :8081, over one database.
run: $(STAMP)
	$(VENV)/bin/txlog serve --kafka --rocketmq

test: $(STAMP) lint system-deps
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q

# The static checks, each configured in pyproject.toml: ruff's lint and its formatter's check, mypy,
# and the import contracts (lint-imports). `ruff format .` lays a file out as the check wants it.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The benchmark's own extras (PgQueuer, matplotlib, orjson); `make test` does not need them.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -q -e '.[bench]'
	touch $(BENCH_STAMP)

# make bench QUICK=1: 3 short rounds, a few minutes in all; ONLY=share (or http,kafka,spark,outbox,replicas,partitions) runs those alone.
bench: $(STAMP) system-deps $(BENCH_STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m bench $(if $(QUICK),--quick,) $(if $(ONLY),--only $(ONLY),)

# Longer fault runs: the fault suite (HTTP and Kafka doors) for CHAOS_SECONDS under a heavier load, then
# again on a Patroni cluster (TXLOG_CHAOS_HA=1) with PostgreSQL's failovers among its faults, Kafka's
# clients through PostgreSQL restarts and an outage (tests/chaos/database_restarts.py), a share
# group's workers under faults for CHAOS_SECONDS (tests/chaos/test_share_group_faults.py), 10,000
# transactions timing out together, a frozen server a few times over, and a confluent-kafka copier
# through both gateways killed at once (tests/chaos/gateway_restarts.py), Patroni's failovers with
# a frozen primary and the loss of the primary's whole host added (tests/replication/), the Spark
# pipeline crashed at every step, 12 servers killed under transactions (tests/acceptance/test_crash.py),
# and schemathesis with 200 generated requests per operation.
CHAOS_ROUNDS ?= 3
CHAOS_SECONDS ?= 300
chaos: $(STAMP) system-deps
	TXLOG_CHAOS_SECONDS=$(CHAOS_SECONDS) TXLOG_CHAOS_PRODUCE_PAUSE_S=0.03 $(PY) -m pytest -q -s -p no:cacheprovider tests/chaos --ignore=tests/chaos/test_share_group_faults.py
	TXLOG_CHAOS_HA=1 TXLOG_CHAOS_SECONDS=$(CHAOS_SECONDS) TXLOG_CHAOS_PRODUCE_PAUSE_S=0.03 $(PY) -m pytest -q -s -p no:cacheprovider tests/chaos/test_fault_suite.py
	$(PY) -m pytest -q -s -p no:cacheprovider tests/chaos/database_restarts.py
	TXLOG_SHARE_CHAOS_SECONDS=$(CHAOS_SECONDS) $(PY) -m pytest -q -s -p no:cacheprovider tests/chaos/test_share_group_faults.py
	TXLOG_SWEEPER_SCALE_N=10000 $(PY) -m pytest -q -s -p no:cacheprovider tests/integration/test_sweeper_scale.py
	for i in $$(seq $(CHAOS_ROUNDS)); do \
	  $(PY) -m pytest -q -s -p no:cacheprovider tests/acceptance/test_frozen_host.py || exit 1; \
	done
	$(PY) -m tests.chaos.gateway_restarts --strategy none
	$(PY) -m pytest -q -s -p no:cacheprovider tests/replication/test_patroni_failover.py tests/replication/patroni_stall.py tests/replication/patroni_host_loss.py
	TXLOG_SPARK_CRASH_STEPS=all PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -s -p no:cacheprovider tests/spark/test_pipeline.py
	TXLOG_CRASH_ROUNDS=12 $(PY) -m pytest -q -s -p no:cacheprovider tests/acceptance/test_crash.py
	TXLOG_FUZZ_CASES=200 $(PY) -m pytest -q -s -p no:cacheprovider tests/acceptance/test_openapi_fuzz.py

clean:
	rm -rf $(VENV) .txlog .pytest_cache
