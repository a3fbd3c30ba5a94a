"""Client quotas on the HTTP API: produce and fetch spend the same budgets as the Kafka gateway's
(here Kafka's anonymous user, TXLOG_AUTH=none), and a throttled answer is held back for its
throttle time and says so in Txlog-Throttle-Time-Ms."""

from __future__ import annotations

import time
from typing import Iterator

import httpx
import pytest

from app.services import quotas
from tests.conftest import fresh_database, make_broker
from tests.support import ServerProcess, wait_until

HEADER = "Txlog-Throttle-Time-Ms"


@pytest.fixture(scope="module")
def quota_server(pg_admin_url: str, template_db: str) -> Iterator[httpx.Client]:
    with fresh_database(pg_admin_url, template_db) as url:
        b = make_broker(url)
        try:
            assert quotas.alter_quotas(
                b.db,
                [
                    quotas.QuotaAlteration([("user", "ANONYMOUS")], [quotas.QuotaOp("producer_byte_rate", 20_000)]),
                    quotas.QuotaAlteration([("client-id", None)], [quotas.QuotaOp("consumer_byte_rate", 20_000)]),
                ],
            ) == [None, None]
        finally:
            b.db.dispose()
        env = {"TXLOG_QUOTA_WINDOW_NUM": "3"}
        with ServerProcess(url, env=env) as server, server.client(timeout=30) as c:
            assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
            yield c


def _records(n: int, size: int) -> dict:
    return {"records": [{"value": "v" * size} for _ in range(n)]}


def test_a_produce_over_the_quota_is_answered_late_with_its_throttle_time(quota_server: httpx.Client) -> None:
    def throttled() -> httpx.Response | None:
        started = time.monotonic()
        r = quota_server.post("/v1/topics/t/partitions/0/records", json=_records(10, 3_000))
        assert r.status_code == 200
        r.extensions["took"] = time.monotonic() - started
        return r if HEADER in r.headers else None

    r = wait_until(throttled, 20, 0.0, "a throttled produce")
    throttle_ms = int(r.headers[HEADER])
    print(f"{HEADER}: {throttle_ms}, answered after {r.extensions['took'] * 1000:.0f} ms")
    assert throttle_ms > 0 and r.extensions["took"] >= throttle_ms / 1000 * 0.9
    # the plain produce to a topic spends the same budget
    r = quota_server.post("/v1/topics/t/records", json=_records(10, 3_000))
    assert r.status_code == 200 and int(r.headers[HEADER]) > 0


def test_a_fetch_spends_the_consumer_byte_rate(quota_server: httpx.Client) -> None:
    for _ in range(3):
        assert quota_server.post("/v1/topics/t/partitions/0/records", json=_records(5, 3_000)).status_code == 200

    def throttled() -> httpx.Response | None:
        r = quota_server.get("/v1/topics/t/partitions/0/records", params={"offset": 0, "max_records": 100})
        assert r.status_code == 200 and r.json()["records"]
        return r if HEADER in r.headers else None

    r = wait_until(throttled, 20, 0.0, "a throttled fetch")
    assert int(r.headers[HEADER]) > 0


def test_the_openapi_document_declares_the_header(quota_server: httpx.Client) -> None:
    paths = quota_server.get("/openapi.json").json()["paths"]
    for path, method in (
        ("/v1/topics/{topic}/partitions/{partition}/records", "post"),
        ("/v1/topics/{topic}/records", "post"),
        ("/v1/topics/{topic}/partitions/{partition}/records", "get"),
    ):
        assert HEADER in paths[path][method]["responses"]["200"]["headers"]
