"""Fixtures of the admin page tests: a real ``txlog serve`` with an admin token on its own database
(so that no other server's sweeper aborts its hanging transaction), the scenario built through the
API, and signed-in clients."""

from __future__ import annotations

import re
from typing import Iterator

import httpx
import pytest

from tests.admin.scenario import Scenario
from tests.conftest import _with_database, drop_database, new_database
from tests.support import ServerProcess

ADMIN_TOKEN = "correct-horse-battery-staple"
# The sweeper runs once at start-up, then not again during the tests: hanging transactions stay.
QUIET_SWEEPER = {"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "600000"}


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, "no anti-forgery token in the page"
    return m.group(1)


def sign_in(client: httpx.Client, token: str = ADMIN_TOKEN) -> httpx.Response:
    form = client.get("/admin/sign-in")
    assert form.status_code == 200, form.text
    return client.post("/admin/sign-in", data={"token": token, "csrf_token": csrf_of(form.text), "next": "/admin/"})


@pytest.fixture(scope="module")
def admin_db(pg_admin_url: str, template_db: str) -> Iterator[str]:
    name = new_database(pg_admin_url, template_db)
    yield _with_database(pg_admin_url, name)
    drop_database(pg_admin_url, name)


@pytest.fixture(scope="module")
def token_server(admin_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("admin-server") / "server.log"
    with ServerProcess(admin_db, env={"TXLOG_ADMIN_TOKEN": ADMIN_TOKEN, **QUIET_SWEEPER}, log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def scenario(token_server: ServerProcess) -> Iterator[Scenario]:
    with token_server.client() as client:
        yield Scenario(client, hanging_timeout_ms=1500).build()


@pytest.fixture
def admin(token_server: ServerProcess, scenario: Scenario) -> Iterator[httpx.Client]:
    """A client signed in to the token server (the scenario built)."""
    with token_server.client() as client:
        r = sign_in(client)
        assert r.status_code == 303, r.text
        yield client


@pytest.fixture
def anonymous(token_server: ServerProcess) -> Iterator[httpx.Client]:
    with token_server.client() as client:
        yield client
