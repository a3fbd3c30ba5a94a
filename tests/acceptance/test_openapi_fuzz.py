"""The OpenAPI document against the server it describes. schemathesis reads ``/openapi.json`` and,
for every operation, sends its boundary and negative cases (the coverage phase) and generated ones
(the fuzzing phase), checking each answer: never a server error, only statuses the operation
declares, and a body that matches the declared schema (the error envelope included).

schemathesis runs as its command line (its pytest plugin's fixture-based loading does not work with
this pytest), in deterministic mode and one request at a time: every run sends the same requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from app.storage.db import libpq_url
from tests.conftest import drop_database, new_database
from tests.support import ServerProcess

CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance"
# Fuzzing phase, per operation (the coverage phase adds its own): a slice in the suite, more under
# `make chaos` (TXLOG_FUZZ_CASES).
CASES_PER_OPERATION = int(os.environ.get("TXLOG_FUZZ_CASES", "40"))

# The names the generator tries first (its shortest strings), given life, so that many requests
# reach the log and the coordinator rather than stopping at an unknown topic or transactional id.
SEEDED_NAME = "0"


@pytest.fixture(scope="module")
def fuzz_server(pg_admin_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a database of its own: the generated requests create topics, producers and
    transactions that other tests must not see."""
    name = new_database(pg_admin_url, template_db)
    url = libpq_url(pg_admin_url).rpartition("/")[0] + "/" + name
    try:
        # Long polls are shortened to 200 ms (TXLOG_MAX_FETCH_WAIT_MS): a generated fetch at the end of
        # a partition would otherwise wait out its wait_ms, up to a minute each.
        env = {"TXLOG_MAX_FETCH_WAIT_MS": "200"}
        with ServerProcess(url, env=env, log_path=tmp_path_factory.mktemp("fuzz") / "server.log") as server:
            with server.client() as c:
                assert c.post("/v1/topics", json={"name": SEEDED_NAME, "partitions": 2}).status_code == 201
                assert c.post("/v1/producers", json={"transactional_id": SEEDED_NAME}).status_code == 200
            yield server
    finally:
        drop_database(pg_admin_url, name)


def schemathesis_run(server: ServerProcess, report: Path) -> subprocess.CompletedProcess[str]:
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        server.url + "/openapi.json",
        "--checks",
        CHECKS,
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        str(CASES_PER_OPERATION),
        "--generation-deterministic",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        "--no-color",
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=report.parent)


@pytest.mark.timeout(1800)
def test_every_operation_answers_as_its_openapi_document_says(fuzz_server: ServerProcess, tmp_path: Path) -> None:
    report_path = tmp_path / "schemathesis.json"
    run = schemathesis_run(fuzz_server, report_path)
    assert run.returncode == 0, run.stdout[-20_000:] + run.stderr[-5_000:]
    report = json.loads(report_path.read_text())
    cases = report["test_cases"]
    print(
        f"schemathesis: {cases['generated']} cases, {report['operations']['tested']} operations, {report['running_time']:.0f} s"
    )
    paths = httpx.get(fuzz_server.url + "/openapi.json").json()["paths"]
    operations = {f"{method.upper()} {path}" for path, ops in paths.items() for method in ops}
    assert report["operations"]["tested"] == len(operations) == report["operations"]["total"]
    assert cases["generated"] >= len(operations) * CASES_PER_OPERATION // 2
    assert cases["with_failures"] == cases["errored"] == 0
    # Generated requests get past validation to the services, and some are accepted, for most
    # operations (not, say, for the abort of a transactional id that is not open).
    accepted = {op for op, phases in report["valid_rates"].items() if any(r["accepted"] for r in phases.values())}
    assert len(accepted) >= len(operations) * 2 // 3, sorted(operations - accepted)


def test_the_document_declares_every_error_answer_with_the_envelope(fuzz_server: ServerProcess) -> None:
    """Every v1 operation declares 422 and 503 (with Retry-After), those with a body 413, each
    error status with the error envelope's schema."""
    doc = httpx.get(fuzz_server.url + "/openapi.json").json()
    envelope = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, operations in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, op in operations.items():
            errors = {int(s): r for s, r in op["responses"].items() if int(s) >= 400}
            assert {422, 503} <= errors.keys(), (method, path)
            assert "Retry-After" in errors[503]["headers"], (method, path)
            for status, answer in errors.items():
                assert answer["content"]["application/json"]["schema"] == envelope, (method, path, status)
            if method in ("post", "patch"):
                assert 413 in errors, (method, path)
    error = doc["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"code", "kafka_code", "message", "retriable"}
