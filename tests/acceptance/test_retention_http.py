"""Retention through a real ``txlog serve``: topic configs at create and PATCH, DeleteRecords, the
fetch error below the log start, the server's own sweeper deleting what lies below it, and the
admin partition page."""

from __future__ import annotations

import psycopg
import pytest

from tests.acceptance.test_http_api import assert_client_error, assert_error, create, records_url
from tests.support import wait_until


def delete_records_url(topic: str, partition: int = 0) -> str:
    return f"/v1/topics/{topic}/partitions/{partition}/delete-records"


def partition_info(api, topic: str, partition: int = 0) -> dict:  # type: ignore[no-untyped-def]
    return api.get(f"/v1/topics/{topic}").json()["partitions"][partition]


def stored_offsets(server, topic: str) -> list[int]:  # type: ignore[no-untyped-def]
    with psycopg.connect(server.database_url) as conn:
        rows = conn.execute('SELECT "offset" FROM txlog.records WHERE topic = %s ORDER BY 1', (topic,)).fetchall()
    return [o for (o,) in rows]


def test_retention_config_at_create_and_patch(api, topic_name):
    err = assert_error(
        api.post("/v1/topics", json={"name": topic_name, "config": {"retention.ms": "1 day"}}), 400, "INVALID_CONFIG"
    )
    assert "retention.ms" in err["message"]
    assert_error(api.get(f"/v1/topics/{topic_name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")  # not created
    r = api.post("/v1/topics", json={"name": topic_name, "config": {"retention.bytes": "1048576", "cleanup.policy": "delete"}})
    assert r.status_code == 201, r.text
    assert api.get(f"/v1/topics/{topic_name}").json()["config"] == {"retention.bytes": 1048576, "cleanup.policy": "delete"}

    r = api.patch(f"/v1/topics/{topic_name}", json={"config": {"retention.ms": 3_600_000, "retention.bytes": None}})
    assert r.status_code == 200, r.text
    assert r.json() == {"name": topic_name, "config": {"retention.ms": 3_600_000, "cleanup.policy": "delete"}}
    assert api.get(f"/v1/topics/{topic_name}").json()["config"] == {"retention.ms": 3_600_000, "cleanup.policy": "delete"}

    for bad in (
        {"retention.ms": -2},
        {"retention.bytes": 1.5},
        {"retention.ms": True},
        {"retention.bytes": "10 MB"},
        {"retention.ms": 2**63},
        {"other": "nul\u0000"},
        {"": 1},
    ):
        assert_error(api.patch(f"/v1/topics/{topic_name}", json={"config": bad}), 400, "INVALID_CONFIG")
    assert api.get(f"/v1/topics/{topic_name}").json()["config"] == {"retention.ms": 3_600_000, "cleanup.policy": "delete"}
    assert_error(api.patch("/v1/topics/no-such-topic", json={"config": {"retention.ms": 1}}), 404, "UNKNOWN_TOPIC_OR_PARTITION")


@pytest.mark.parametrize(
    "body",
    [
        b'{"config": {"x": NaN}}',
        b'{"config": {"x": Infinity}}',
        b'{"config": {"x": "\\ud800"}}',
        b'{"config": {"\\udfff": 1}}',
        b'{"config": [1]}',
        b'{"config": null}',
        b"{}",
        b"not json",
        b'{"config": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ],
)
def test_hostile_patch_bodies_are_client_errors(api, topic_name, body):
    create(api, topic_name)
    assert_client_error(api.patch(f"/v1/topics/{topic_name}", content=body, headers={"content-type": "application/json"}))
    assert api.get(f"/v1/topics/{topic_name}").json()["config"] == {}


def test_delete_records_and_the_fetch_below_the_log_start(api, server, topic_name):
    create(api, topic_name, 2)
    r = api.post(records_url(topic_name), json={"records": [{"value": f"v{i}"} for i in range(10)]})
    assert r.status_code == 200, r.text

    r = api.post(delete_records_url(topic_name), json={"before_offset": 4})
    assert r.status_code == 200, r.text
    assert r.json() == {"topic": topic_name, "partition": 0, "log_start_offset": 4}
    assert partition_info(api, topic_name) == {
        "partition": 0,
        "log_start_offset": 4,
        "high_watermark": 10,
        "last_stable_offset": 10,
    }
    assert partition_info(api, topic_name, 1)["log_start_offset"] == 0

    for isolation in ("read_uncommitted", "read_committed"):
        err = assert_error(
            api.get(records_url(topic_name), params={"offset": 3, "isolation_level": isolation}), 416, "OFFSET_OUT_OF_RANGE"
        )
        assert (err["log_start_offset"], err["high_watermark"]) == (4, 10)
        got = api.get(records_url(topic_name), params={"offset": 4, "isolation_level": isolation}).json()
        assert [x["offset"] for x in got["records"]] == [4, 5, 6, 7, 8, 9] and got["log_start_offset"] == 4

    # Below the log start: no change. Past the last stable offset: refused. -1: the LSO.
    assert api.post(delete_records_url(topic_name), json={"before_offset": 1}).json()["log_start_offset"] == 4
    err = assert_error(api.post(delete_records_url(topic_name), json={"before_offset": 11}), 416, "OFFSET_OUT_OF_RANGE")
    assert (err["log_start_offset"], err["last_stable_offset"], err["high_watermark"]) == (4, 10, 10)
    assert_error(api.post(delete_records_url(topic_name, 2), json={"before_offset": 0}), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_error(api.post(delete_records_url("no-such-topic"), json={"before_offset": 0}), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    for body in ({"before_offset": -2}, {"before_offset": 2**63}, {"before_offset": "x"}, {}):
        assert_client_error(api.post(delete_records_url(topic_name), json=body))
    assert_client_error(
        api.post(f"/v1/topics/{topic_name}/partitions/99999999999999999999999/delete-records", json={"before_offset": 0})
    )

    # The server's sweeper deletes what lies below the log start.
    wait_until(lambda: stored_offsets(server, topic_name) == [4, 5, 6, 7, 8, 9], 30, 0.1, "the sweeper to delete offsets 0-3")
    assert api.post(delete_records_url(topic_name), json={"before_offset": -1}).json()["log_start_offset"] == 10
    wait_until(lambda: stored_offsets(server, topic_name) == [], 30, 0.1, "the sweeper to delete the rest")
    assert api.get(records_url(topic_name), params={"offset": 10}).json()["records"] == []
    assert api.post(records_url(topic_name), json={"records": [{"value": "after"}]}).json()["base_offset"] == 10


def test_retention_bytes_set_by_patch_is_applied_by_the_servers_sweeper(api, server, topic_name):
    create(api, topic_name)
    api.post(records_url(topic_name), json={"records": [{"value": "0123456789"} for _ in range(10)]})
    r = api.patch(f"/v1/topics/{topic_name}", json={"config": {"retention.bytes": 30}})
    assert r.status_code == 200, r.text
    wait_until(lambda: partition_info(api, topic_name)["log_start_offset"] == 7, 30, 0.1, "retention.bytes to move the log start")
    wait_until(lambda: stored_offsets(server, topic_name) == [7, 8, 9], 30, 0.1, "the sweeper to delete offsets 0-6")
    err = assert_error(api.get(records_url(topic_name), params={"offset": 0}), 416, "OFFSET_OUT_OF_RANGE")
    assert err["log_start_offset"] == 7


def test_the_admin_partition_page_starts_at_the_log_start(api, topic_name):
    create(api, topic_name)
    api.post(records_url(topic_name), json={"records": [{"value": f"value-{i}"} for i in range(5)]})
    api.post(delete_records_url(topic_name), json={"before_offset": 3})
    for query in ({}, {"offset": 0}, {"mode": "read_committed"}, {"mode": "read_uncommitted", "before": 2}):
        r = api.get(f"/admin/topics/{topic_name}/0", params=query)
        assert r.status_code == 200, r.text
        assert "value-0" not in r.text and "value-2" not in r.text
        assert ("value-3" in r.text) is ("before" not in query)
        facts = r.text[r.text.index("Log start offset") :]
        assert facts[: facts.index("</dd>")].endswith(">3"), facts[:200]
