"""A real ``txlog serve`` per test module on a fresh database, and the ``txlog`` command line run as
a real subprocess against it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from typing import Iterator

import orjson
import pytest

from tests.conftest import fresh_database
from tests.support import ROOT, ServerProcess


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self):  # type: ignore[no-untyped-def]
        return orjson.loads(self.out)

    def json_lines(self) -> list:
        return [orjson.loads(line) for line in self.out.splitlines() if line.strip()]


class Cli:
    """``python -m app.cli ARGS`` with TXLOG_URL pointing at the module's server."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(
        self, *args: str, input: str | bytes | None = None, env: dict[str, str] | None = None, expect: int | None = 0
    ) -> Run:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
        environment.update({"TXLOG_URL": self.url, "COLUMNS": "200"}, **(env or {}))
        data = input.encode() if isinstance(input, str) else input
        proc = subprocess.run(
            [sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=environment, input=data, capture_output=True, timeout=120
        )
        run = Run(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
        if expect is not None:
            assert run.code == expect, (
                f"txlog {' '.join(args)} exited {run.code}, expected {expect}\nstdout:\n{run.out}\nstderr:\n{run.err}"
            )
        return run


@pytest.fixture(scope="module")
def cli_db(pg_admin_url: str, template_db: str) -> Iterator[str]:
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


@pytest.fixture(scope="module")
def cli_server(cli_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("cli-server") / "server.log"
    with ServerProcess(cli_db, log_path=log) as server:
        yield server


@pytest.fixture(scope="module")
def txlog(cli_server: ServerProcess) -> Cli:
    return Cli(cli_server.url)


@pytest.fixture
def topic() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"
