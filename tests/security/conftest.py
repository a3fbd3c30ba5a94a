"""A real ``txlog serve`` with TXLOG_AUTH=token and two workers on its own database, principals
created and ACLs granted on that database as ``txlog principals`` / ``txlog acls`` do."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from app.domain.acl_bindings import CLUSTER_NAME, AclBinding, Operation, PatternType, PermissionType, ResourceType
from app.services import security
from app.storage.db import Database
from tests.conftest import fresh_database
from tests.support import ServerProcess, wait_until

ADMIN_TOKEN = "admin-token-for-the-security-tests"
QUIET_SWEEPER = {"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "600000"}


@pytest.fixture(scope="module")
def secured_db(pg_admin_url: str, template_db: str) -> Iterator[str]:
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


@pytest.fixture(scope="module")
def database(secured_db: str) -> Iterator[Database]:
    db = Database(secured_db, pool_size=2)
    yield db
    db.dispose()


@pytest.fixture(scope="module")
def server(secured_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log: Path = tmp_path_factory.mktemp("secured") / "server.log"
    env = {"TXLOG_AUTH": "token", "TXLOG_ADMIN_TOKEN": ADMIN_TOKEN, **QUIET_SWEEPER}
    with ServerProcess(secured_db, workers=2, env=env, log_path=log) as s:
        yield s


def client(server: ServerProcess, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def admin(server: ServerProcess) -> Iterator[httpx.Client]:
    with client(server, ADMIN_TOKEN) as c:
        yield c


class Principals:
    """Principals and ACLs made on the server's database."""

    def __init__(self, db: Database, server: ServerProcess) -> None:
        self.db = db
        self.server = server

    def create(self, name: str) -> httpx.Client:
        return client(self.server, security.create_principal(self.db, name).token)

    def grant(
        self, principal: str, rt: ResourceType, name: str, *ops: Operation, deny: bool = False, prefixed: bool = False
    ) -> list[AclBinding]:
        bindings = [
            AclBinding(
                principal,
                rt,
                CLUSTER_NAME if rt is ResourceType.CLUSTER else name,
                PatternType.PREFIXED if prefixed else PatternType.LITERAL,
                op,
                PermissionType.DENY if deny else PermissionType.ALLOW,
            )
            for op in ops
        ]
        security.add_acls(self.db, bindings)
        return bindings


@pytest.fixture(scope="module")
def principals(database: Database, server: ServerProcess) -> Principals:
    return Principals(database, server)


def eventually(request: Callable[[], httpx.Response], status: int, times: int = 8, timeout: float = 5.0) -> httpx.Response:
    """Wait (at most ``timeout``) until ``times`` requests in a row answer ``status``, and answer
    the last. The requests of one ``client`` share its connection, so one worker answers them all;
    ``on_new_connections`` spreads them over the workers."""

    def settled() -> httpx.Response | None:
        answers = [request() for _ in range(times)]
        return answers[-1] if all(a.status_code == status for a in answers) else None

    return wait_until(settled, timeout, 0.05, f"{times} answers in a row with status {status}")


def on_new_connections(c: httpx.Client, path: str) -> Callable[[], httpx.Response]:
    """A GET of ``path`` as ``c`` on a new connection each time: whichever worker accepts it
    answers, so a run of them reaches each of the server's workers in turn or by chance."""
    return lambda: httpx.get(f"{c.base_url}{path}", headers=c.headers, timeout=30)


def code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]
