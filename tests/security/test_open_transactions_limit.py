"""TXLOG_MAX_OPEN_TRANSACTIONS_PER_PRINCIPAL over HTTP: the authenticated principal's open
transactions are counted whichever way a transaction starts (a produce, AddPartitionsToTxn,
AddOffsetsToTxn), one more is 429 THROTTLING_QUOTA_EXCEEDED (retriable), and ending one makes room.
Another principal is not held back."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest

from app.domain.acl_bindings import Operation as O
from app.domain.acl_bindings import ResourceType as R
from app.storage.db import Database
from tests.security.conftest import ADMIN_TOKEN, QUIET_SWEEPER, Principals, client, code, eventually
from tests.support import ServerProcess


@pytest.fixture(scope="module")
def limited(secured_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log: Path = tmp_path_factory.mktemp("limited") / "server.log"
    env = {
        "TXLOG_AUTH": "token",
        "TXLOG_ADMIN_TOKEN": ADMIN_TOKEN,
        "TXLOG_MAX_OPEN_TRANSACTIONS_PER_PRINCIPAL": "2",
        **QUIET_SWEEPER,
    }
    with ServerProcess(secured_db, env=env, log_path=log) as s:
        yield s


def test_open_transactions_per_principal(limited: ServerProcess, database: Database) -> None:
    principals = Principals(database, limited)
    with client(limited, ADMIN_TOKEN) as admin:
        assert admin.post("/v1/topics", json={"name": "lim-out", "partitions": 1}).status_code == 201

    def begin(c: httpx.Client, tid: str, how: str) -> httpx.Response:
        ids = eventually(lambda: c.post("/v1/producers", json={"transactional_id": tid}), 200).json()
        ids = {"producer_id": ids["producer_id"], "producer_epoch": ids["producer_epoch"]}
        if how == "produce":
            body = {**ids, "base_sequence": 0, "transactional_id": tid, "records": [{"value": "v"}]}
            return c.post("/v1/topics/lim-out/partitions/0/records", json=body)
        if how == "partitions":
            return c.post(
                f"/v1/transactions/{tid}/partitions", json={**ids, "partitions": [{"topic": "lim-out", "partition": 0}]}
            )
        group = tid.rsplit("-", 1)[0] + "-g"
        return c.post(
            f"/v1/transactions/{tid}/offsets",
            json={**ids, "group_id": group, "offsets": [{"topic": "lim-out", "partition": 0, "offset": 0}]},
        )

    # Each grant is its own change of the security version, and the server reloads at most once a
    # poll: the transactional id's grant, the one ``begin`` waits to see, is written last, so a
    # snapshot that has it has the others too.
    ca = principals.create("lim-c")
    principals.grant("lim-c", R.TOPIC, "lim-", O.READ, O.WRITE, prefixed=True)
    principals.grant("lim-c", R.GROUP, "lim-c-g", O.READ)
    principals.grant("lim-c", R.TRANSACTIONAL_ID, "lim-c-", O.WRITE, prefixed=True)
    cb = principals.create("lim-d")
    principals.grant("lim-d", R.TOPIC, "lim-", O.READ, O.WRITE, prefixed=True)
    principals.grant("lim-d", R.TRANSACTIONAL_ID, "lim-d-", O.WRITE, prefixed=True)
    with ca, cb:
        assert begin(ca, "lim-c-1", "produce").status_code == 200
        assert begin(ca, "lim-c-2", "partitions").status_code == 200
        for how in ("produce", "partitions", "offsets"):
            r = begin(ca, f"lim-c-{how}", how)
            assert r.status_code == 429 and code(r) == "THROTTLING_QUOTA_EXCEEDED", (how, r.text)
            assert r.json()["error"]["retriable"] is True and r.headers["retry-after"].isdigit()
        # Another principal has its own count.
        assert begin(cb, "lim-d-1", "produce").status_code == 200
        # Ending one of lim-c's transactions makes room for the next.
        state = ca.get("/v1/transactions/lim-c-1").json()
        end = {"producer_id": state["producer_id"], "producer_epoch": state["producer_epoch"], "result": "commit"}
        assert ca.post("/v1/transactions/lim-c-1/end", json=end).status_code == 200
        assert begin(ca, "lim-c-offsets", "offsets").status_code == 200
