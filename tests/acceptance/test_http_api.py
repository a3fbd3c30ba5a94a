"""Every endpoint of the v1 API through a real ``txlog serve``: happy paths, the error envelope for
malformed and hostile input (never a 500), partitioning, long polls, the size limit and the ops endpoints."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid

import httpx
import pytest

from app.domain.partitioner import partition_for_key
from app.errors import ErrorCode
from tests.support import ServerProcess

JSON = {"content-type": "application/json"}


def assert_error(r: httpx.Response, status: int, code: str) -> dict:
    """The response is the contract's error envelope with this status and code."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["retriable"] is ErrorCode[code].retriable
    return err


def assert_client_error(r: httpx.Response) -> dict:
    """Rejected with a 4xx and a well-formed envelope naming a known error (never a 500)."""
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["code"] in ErrorCode.__members__, err
    assert isinstance(err["message"], str) and isinstance(err["retriable"], bool)
    if r.status_code != 422 and err["code"] != "INVALID_REQUEST":
        assert r.status_code == ErrorCode[err["code"]].http_status
    return err


def create(api, name: str, partitions: int = 1) -> None:  # type: ignore[no-untyped-def]
    r = api.post("/v1/topics", json={"name": name, "partitions": partitions})
    assert r.status_code == 201, r.text


def records_url(topic: str, partition: int = 0) -> str:
    return f"/v1/topics/{topic}/partitions/{partition}/records"


def high_watermark(api, topic: str, partition: int = 0) -> int:  # type: ignore[no-untyped-def]
    return api.get(f"/v1/topics/{topic}").json()["partitions"][partition]["high_watermark"]


# --- topics ---------------------------------------------------------------------------------------


def test_topic_create_list_describe(api, topic_name):
    r = api.post("/v1/topics", json={"name": topic_name, "partitions": 3, "config": {"cleanup.policy": "delete"}})
    assert r.status_code == 201
    assert r.json() == {"name": topic_name, "partitions": 3}
    listed = api.get("/v1/topics").json()["topics"]
    assert {"name": topic_name, "partitions": 3} in listed
    described = api.get(f"/v1/topics/{topic_name}").json()
    assert described == {
        "name": topic_name,
        "partitions": [{"partition": p, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0} for p in range(3)],
        "config": {"cleanup.policy": "delete"},
    }


def test_topic_partitions_default_to_one(api, topic_name):
    r = api.post("/v1/topics", json={"name": topic_name})
    assert r.status_code == 201 and r.json() == {"name": topic_name, "partitions": 1}


def test_topic_already_exists(api, topic_name):
    create(api, topic_name, 2)
    assert_error(api.post("/v1/topics", json={"name": topic_name, "partitions": 4}), 409, "TOPIC_ALREADY_EXISTS")
    assert len(api.get(f"/v1/topics/{topic_name}").json()["partitions"]) == 2


@pytest.mark.parametrize("name", ["", ".", "..", "with space", "a/b", "x" * 250, "nul\x00byte", "trailing\n", "\u00fcml"])
def test_invalid_topic_names(api, name):
    assert_error(api.post("/v1/topics", json={"name": name}), 400, "INVALID_TOPIC_EXCEPTION")


@pytest.mark.parametrize("partitions", [0, -1, 10_001])
def test_invalid_partition_counts(api, topic_name, partitions):
    assert_error(api.post("/v1/topics", json={"name": topic_name, "partitions": partitions}), 400, "INVALID_PARTITIONS")
    assert_error(api.get(f"/v1/topics/{topic_name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_unknown_topic(api, topic_name):
    assert_error(api.get(f"/v1/topics/{topic_name}"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_error(api.get(records_url(topic_name)), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_error(api.post(records_url(topic_name), json={"records": [{"value": "v"}]}), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_error(
        api.post(f"/v1/topics/{topic_name}/records", json={"records": [{"value": "v"}]}), 404, "UNKNOWN_TOPIC_OR_PARTITION"
    )


# --- malformed requests ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"",
        b"null",
        b"[]",
        b'"text"',
        b'{"name": 5}',
        b'{"name": "ok", "partitions": "many"}',
        b'{"name": "ok", "partitions": 1.5}',
        b'{"name": "ok", "partitions": 99999999999999999999999999}',
        b'{"name": "ok", "config": []}',
        b'{"partitions": 1}',
    ],
)
def test_malformed_topic_bodies_are_invalid_request(api, body):
    assert_error(api.post("/v1/topics", content=body, headers=JSON), 422, "INVALID_REQUEST")


@pytest.mark.parametrize("body", [b"\xff\xfe\x00", b"[" * 100_000])
def test_unparseable_bodies_are_invalid_request(api, body):
    assert_error(api.post("/v1/topics", content=body, headers=JSON), 400, "INVALID_REQUEST")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"records": None},
        {"records": []},
        {"records": "abc"},
        {"records": [None]},
        {"records": [{"value": 5}]},
        {"records": [{"key": ["a"]}]},
        {"records": [{"headers": [{"value": "no key"}]}]},
        {"records": [{"headers": {"h": 1}}]},
        {"records": [{"value": "v", "timestamp_ms": -1}]},
        {"records": [{"value": "v", "timestamp_ms": 2**70}]},
        {"records": [{"value": "v", "timestamp_ms": "soon"}]},
        {"records": [{"value": "v"}], "encoding": "latin1"},
        {"records": [{"value": "v"}], "producer_id": 2**70, "producer_epoch": 0, "base_sequence": 0},
        {"records": [{"value": "v"}], "producer_id": 1, "producer_epoch": 40_000, "base_sequence": 0},
        {"records": [{"value": "v"}], "producer_id": 1, "producer_epoch": 0, "base_sequence": -1},
    ],
)
def test_malformed_produce_bodies_are_invalid_request(api, topic_name, body):
    create(api, topic_name)
    assert_error(api.post(records_url(topic_name), json=body), 422, "INVALID_REQUEST")
    assert high_watermark(api, topic_name) == 0


def test_incomplete_producer_fields_are_invalid_request(api, topic_name):
    create(api, topic_name)
    assert_error(
        api.post(records_url(topic_name), json={"producer_epoch": 0, "records": [{"value": "v"}]}), 400, "INVALID_REQUEST"
    )
    assert_error(api.post(records_url(topic_name), json={"producer_id": 5, "records": [{"value": "v"}]}), 400, "INVALID_REQUEST")


@pytest.mark.parametrize(
    "query",
    [
        {"offset": -1},
        {"offset": "x"},
        {"offset": 2**70},
        {"max_records": 0},
        {"max_bytes": 0},
        {"isolation_level": "dirty"},
        {"encoding": "hex"},
        {"wait_ms": -5},
        {"wait_ms": 10**9},
    ],
)
def test_malformed_fetch_parameters_are_invalid_request(api, topic_name, query):
    create(api, topic_name)
    assert_error(api.get(records_url(topic_name), params=query), 422, "INVALID_REQUEST")


def test_unknown_route_and_method_have_the_envelope(api):
    err = assert_error(api.get("/v1/no-such-thing"), 404, "INVALID_REQUEST")
    assert "Not Found" in err["message"]
    assert_error(api.delete("/v1/topics"), 405, "INVALID_REQUEST")
    assert_error(api.get("/nowhere/at/all"), 404, "INVALID_REQUEST")


HOSTILE_BODIES = [
    b"",
    b"null",
    b"{}",
    b"1e999",
    b"NaN",
    b"\xff\xfe",
    b'{"records": [{"key": "\\ud800", "headers": {"\\udc00": "\\ud800"}}]}',
    b'{"name": "\\u0000", "transactional_id": "\\u0000", "group_id": "\\u0000"}',
    b'{"offsets": [{"topic": "\\ud800", "partition": 0, "offset": 1, "metadata": "\\u0000"}]}',
    b'{"offsets": [{"topic": "t", "partition": 99999999999999999999, "offset": 1}]}',
    b'{"producer_id": 1, "producer_epoch": 0, "partitions": [{"topic": "\\u0000", "partition": 0}]}',
    b'{"producer_id": 1, "producer_epoch": 0, "group_id": "g", "offsets": [{"topic": "\\ud800", "partition": 0, "offset": 0}]}',
    b'{"producer_id": -1, "producer_epoch": 0, "result": "commit"}',
    b'{"transactional_id": "\\ud800"}',
    b'{"transaction_timeout_ms": 99999999999999999999}',
    b'{"a":' * 5000,
]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/topics",
        "/v1/topics/{topic}/partitions/0/records",
        "/v1/topics/{topic}/records",
        "/v1/groups/g/offsets",
        "/v1/producers",
        "/v1/transactions/tx-{topic}/partitions",
        "/v1/transactions/tx-{topic}/offsets",
        "/v1/transactions/tx-{topic}/end",
        "/v1/transactions/tx-{topic}/abort",
    ],
)
def test_hostile_bodies_never_yield_a_500(api, topic_name, path):
    create(api, topic_name)
    for body in HOSTILE_BODIES:
        r = api.post(path.format(topic=topic_name), content=body, headers=JSON)
        assert r.status_code < 500, (body, r.text)
        if r.status_code >= 400:
            assert_client_error(r)
    assert high_watermark(api, topic_name) == 0


# --- produce and fetch ----------------------------------------------------------------------------


def test_produce_and_fetch_round_trip(api, topic_name):
    create(api, topic_name, 2)
    first = api.post(
        records_url(topic_name, 1),
        json={
            "records": [
                {"key": "k1", "value": "v1", "headers": {"h": "1"}, "timestamp_ms": 1_600_000_000_000},
                {"key": None, "value": None},
            ]
        },
    )
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["base_offset"], body["last_offset"], body["log_start_offset"], body["duplicate"]) == (0, 1, 0, False)
    assert abs(body["log_append_time_ms"] - time.time() * 1000) < 60_000
    assert "partition" not in body
    second = api.post(records_url(topic_name, 1), json={"records": [{"value": "v3"}]}).json()
    assert (second["base_offset"], second["last_offset"]) == (2, 2)

    got = api.get(records_url(topic_name, 1), params={"offset": 0}).json()
    assert got["topic"] == topic_name and got["partition"] == 1
    assert got["records"] == [
        {
            "offset": 0,
            "key": "k1",
            "value": "v1",
            "headers": {"h": "1"},
            "header_list": [{"key": "h", "value": "1"}],
            "timestamp_ms": 1_600_000_000_000,
        },
        {"offset": 1, "key": None, "value": None, "headers": {}, "header_list": [], "timestamp_ms": body["log_append_time_ms"]},
        {"offset": 2, "key": None, "value": "v3", "headers": {}, "header_list": [], "timestamp_ms": second["log_append_time_ms"]},
    ]
    assert (got["next_offset"], got["high_watermark"], got["last_stable_offset"], got["log_start_offset"]) == (3, 3, 3, 0)
    assert api.get(records_url(topic_name, 0)).json()["records"] == []


def test_fetch_limits_and_ranges(api, topic_name):
    create(api, topic_name)
    api.post(records_url(topic_name), json={"records": [{"value": "x" * 100}] + [{"value": str(i)} for i in range(1, 10)]})
    first = api.get(records_url(topic_name), params={"offset": 0, "max_bytes": 1}).json()
    assert [r["offset"] for r in first["records"]] == [0] and first["next_offset"] == 1  # first record always
    page = api.get(records_url(topic_name), params={"offset": 1, "max_records": 4}).json()
    assert [r["value"] for r in page["records"]] == ["1", "2", "3", "4"] and page["next_offset"] == 5
    at_hw = api.get(records_url(topic_name), params={"offset": 10}).json()
    assert (at_hw["records"], at_hw["next_offset"], at_hw["high_watermark"]) == ([], 10, 10)
    err = assert_error(api.get(records_url(topic_name), params={"offset": 11}), 416, "OFFSET_OUT_OF_RANGE")
    assert (err["log_start_offset"], err["high_watermark"]) == (0, 10)
    assert_error(api.get(records_url(topic_name, 1)), 404, "UNKNOWN_TOPIC_OR_PARTITION")


@pytest.mark.parametrize("partition", ["-1", "1", "99999999999999999999999999", "2147483648"])
def test_unknown_or_huge_partitions(api, topic_name, partition):
    create(api, topic_name)
    url = f"/v1/topics/{topic_name}/partitions/{partition}/records"
    assert_error(api.post(url, json={"records": [{"value": "v"}]}), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_error(api.get(url), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_non_integer_partition_is_invalid_request(api, topic_name):
    create(api, topic_name)
    assert_error(api.get(f"/v1/topics/{topic_name}/partitions/zero/records"), 422, "INVALID_REQUEST")


def test_base64_round_trip_of_binary_data(api, topic_name):
    create(api, topic_name)
    key, value = bytes(range(256)), b"\x00\x01\xfe\xff"
    r = api.post(
        records_url(topic_name),
        json={
            "encoding": "base64",
            "records": [
                {"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()},
                {"key": "", "value": None},
            ],
        },
    )
    assert r.status_code == 200, r.text
    got = api.get(records_url(topic_name), params={"encoding": "base64"}).json()["records"]
    assert [(base64.b64decode(x["key"]), x["value"] and base64.b64decode(x["value"])) for x in got] == [(key, value), (b"", None)]
    # text written as utf8 reads back as its bytes in base64, and the other way round
    api.post(records_url(topic_name), json={"records": [{"value": "h\u00e9"}]})
    assert api.get(records_url(topic_name), params={"offset": 2, "encoding": "base64"}).json()["records"][0]["value"] == (
        base64.b64encode("h\u00e9".encode()).decode()
    )
    assert api.get(records_url(topic_name), params={"offset": 0}).json()["records"][0]["value"] == "\x00\x01\ufffd\ufffd"


@pytest.mark.parametrize("bad", ["!!!", "abc", "\u00e9\u00e9\u00e9\u00e9", "YW Jj"])
def test_bad_base64_is_invalid_record(api, topic_name, bad):
    create(api, topic_name)
    err = assert_error(
        api.post(records_url(topic_name), json={"encoding": "base64", "records": [{"value": "AAAA"}, {"key": bad}]}),
        400,
        "INVALID_RECORD",
    )
    assert "records[1].key" in err["message"]
    assert high_watermark(api, topic_name) == 0


def test_nul_characters_in_keys_and_values_are_data(api, topic_name):
    create(api, topic_name)
    assert api.post(records_url(topic_name), json={"records": [{"key": "a\x00b", "value": "\x00"}]}).status_code == 200
    got = api.get(records_url(topic_name)).json()["records"]
    assert (got[0]["key"], got[0]["value"]) == ("a\x00b", "\x00")
    assert (
        base64.b64decode(api.get(records_url(topic_name), params={"encoding": "base64"}).json()["records"][0]["key"]) == b"a\x00b"
    )


@pytest.mark.parametrize("headers", [{"h\x00": "v"}, {"h": "v\x00"}, {"\x00": ""}])
def test_nul_characters_in_headers_are_invalid_record(api, topic_name, headers):
    create(api, topic_name)
    assert_error(api.post(records_url(topic_name), json={"records": [{"value": "v", "headers": headers}]}), 400, "INVALID_RECORD")
    assert_error(api.post(f"/v1/topics/{topic_name}/records", json={"records": [{"headers": headers}]}), 400, "INVALID_RECORD")
    assert high_watermark(api, topic_name) == 0


def test_lone_surrogates_in_headers_are_invalid_record(api, topic_name):
    create(api, topic_name)
    for raw in [b'{"records": [{"headers": {"\\ud800": "v"}}]}', b'{"records": [{"headers": {"h": "\\udfff"}}]}']:
        assert_error(api.post(records_url(topic_name), content=raw, headers=JSON), 400, "INVALID_RECORD")
    assert high_watermark(api, topic_name) == 0


def test_nul_characters_in_names_are_rejected_not_500(api, topic_name):
    create(api, topic_name)
    for r in [
        api.get("/v1/topics/a%00b"),
        api.get("/v1/topics/a%00b/partitions/0/records"),
        api.post("/v1/topics/a%00b/partitions/0/records", json={"records": [{"value": "v"}]}),
        api.post("/v1/topics/a%00b/records", json={"records": [{"value": "v"}]}),
        api.post("/v1/groups/g%00/offsets", json={"offsets": []}),
        api.get("/v1/groups/g%00/offsets"),
        api.post("/v1/groups/g/offsets", json={"offsets": [{"topic": "a\x00b", "partition": 0, "offset": 1}]}),
        api.post(
            "/v1/groups/g/offsets", json={"offsets": [{"topic": topic_name, "partition": 0, "offset": 1, "metadata": "\x00"}]}
        ),
        api.post("/v1/producers", json={"transactional_id": "t\x00"}),
        api.get("/v1/transactions/t%00"),
        api.get("/v1/transactions", params={"state": "\x00"}),
    ]:
        assert_client_error(r)
    assert api.get("/v1/groups/g/offsets").json() == {"offsets": []}


def test_huge_integers_are_rejected_cleanly(api, topic_name):
    create(api, topic_name)
    for r in [
        api.post("/v1/topics", json={"name": topic_name + "x", "partitions": 2**64}),
        api.post(records_url(topic_name), json={"producer_id": 2**63, "producer_epoch": 0, "base_sequence": 0, "records": [{}]}),
        api.post(records_url(topic_name), json={"records": [{"value": "v", "timestamp_ms": 10**30}]}),
        api.get(records_url(topic_name), params={"offset": 2**63}),
        api.get(records_url(topic_name), params={"max_records": 10**20}),
        api.post("/v1/groups/g/offsets", json={"offsets": [{"topic": topic_name, "partition": 0, "offset": 2**63}]}),
        api.post("/v1/producers", json={"transaction_timeout_ms": 2**40}),
        api.get("/v1/transactions", params={"older_than_ms": 2**64}),
    ]:
        assert_error(r, 422, "INVALID_REQUEST")
    err = assert_error(api.get(records_url(topic_name), params={"offset": 2**63 - 1}), 416, "OFFSET_OUT_OF_RANGE")
    assert err["high_watermark"] == 0


# --- the topic endpoint's partitioner ---------------------------------------------------------------


def test_keyed_records_land_on_the_murmur2_partition(api, topic_name):
    n = 6
    create(api, topic_name, n)
    keys = ["k", "user-1", "user-2", "order-42", "\u00e9t\u00e9", "21", "foobar"]
    for key in keys:
        r = api.post(f"/v1/topics/{topic_name}/records", json={"records": [{"key": key, "value": f"for {key}"}]})
        assert r.status_code == 200, r.text
        assert r.json()["partition"] == partition_for_key(key.encode(), n), key
    assert (
        partition_for_key(b"k", n)
        == api.post(f"/v1/topics/{topic_name}/records", json={"records": [{"key": "k", "value": "again"}]}).json()["partition"]
    )
    p = partition_for_key(b"k", n)
    got = api.get(records_url(topic_name, p)).json()["records"]
    assert [r["value"] for r in got if r["key"] == "k"] == ["for k", "again"]


def test_keyed_base64_records_are_partitioned_by_their_bytes(api, topic_name):
    n = 5
    create(api, topic_name, n)
    key = b"\x00\xffbinary"
    r = api.post(
        f"/v1/topics/{topic_name}/records", json={"encoding": "base64", "records": [{"key": base64.b64encode(key).decode()}]}
    )
    assert r.json()["partition"] == partition_for_key(key, n)


def test_null_keys_go_round_robin(api, topic_name):
    n = 4
    create(api, topic_name, n)
    chosen = []
    for i in range(2 * n):
        r = api.post(f"/v1/topics/{topic_name}/records", json={"records": [{"value": str(i)}, {"value": f"{i}b"}]})
        assert r.status_code == 200, r.text
        chosen.append(r.json()["partition"])
        assert r.json()["last_offset"] == r.json()["base_offset"] + 1  # the batch stays together
    assert sorted(chosen) == sorted(list(range(n)) * 2)
    assert [api.get(f"/v1/topics/{topic_name}").json()["partitions"][p]["high_watermark"] for p in range(n)] == [4] * n


# --- long polling ---------------------------------------------------------------------------------


def test_long_poll_is_woken_by_a_produce(api, server, topic_name):
    create(api, topic_name)
    api.post(records_url(topic_name), json={"records": [{"value": "old"}]})
    result: dict = {}

    def poll() -> None:
        with server.client() as c:
            start = time.monotonic()
            result["response"] = c.get(records_url(topic_name), params={"offset": 1, "wait_ms": 20_000})
            result["elapsed"] = time.monotonic() - start

    poller = threading.Thread(target=poll)
    poller.start()
    poller.join(0.5)
    assert poller.is_alive(), "the fetch at the high watermark should be waiting"
    produced = api.post(records_url(topic_name), json={"records": [{"value": "new"}]})
    assert produced.status_code == 200
    poller.join(10)
    assert not poller.is_alive()
    assert result["elapsed"] < 10  # woken, not timed out after 20 s
    body = result["response"].json()
    assert [(r["offset"], r["value"]) for r in body["records"]] == [(1, "new")]
    assert body["next_offset"] == 2


def test_long_poll_returns_empty_after_wait_ms(api, topic_name):
    create(api, topic_name)
    start = time.monotonic()
    r = api.get(records_url(topic_name), params={"offset": 0, "wait_ms": 600})
    elapsed = time.monotonic() - start
    assert r.status_code == 200
    assert (r.json()["records"], r.json()["next_offset"]) == ([], 0)
    assert 0.55 <= elapsed < 5


def test_long_poll_is_not_woken_by_another_partition(api, server, topic_name):
    create(api, topic_name, 2)
    result: dict = {}

    def poll() -> None:
        with server.client() as c:
            result["response"] = c.get(records_url(topic_name, 0), params={"offset": 0, "wait_ms": 1000})

    poller = threading.Thread(target=poll)
    poller.start()
    poller.join(0.3)
    api.post(records_url(topic_name, 1), json={"records": [{"value": "elsewhere"}]})
    poller.join(10)
    assert result["response"].json()["records"] == []


def test_long_poll_with_records_available_answers_at_once(api, topic_name):
    create(api, topic_name)
    api.post(records_url(topic_name), json={"records": [{"value": "ready"}]})
    start = time.monotonic()
    r = api.get(records_url(topic_name), params={"offset": 0, "wait_ms": 20_000})
    assert time.monotonic() - start < 5
    assert [x["value"] for x in r.json()["records"]] == ["ready"]


# --- consumer group offsets -----------------------------------------------------------------------


def test_group_offsets(api, topic_name):
    create(api, topic_name, 2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    assert api.get(f"/v1/groups/{group}/offsets").json() == {"offsets": []}
    body = {
        "offsets": [
            {"topic": topic_name, "partition": 1, "offset": 10, "metadata": "m1"},
            {"topic": topic_name, "partition": 0, "offset": 3},
        ]
    }
    r = api.post(f"/v1/groups/{group}/offsets", json=body)
    assert r.status_code == 200, r.text
    expected = [
        {"topic": topic_name, "partition": 0, "offset": 3, "metadata": ""},
        {"topic": topic_name, "partition": 1, "offset": 10, "metadata": "m1"},
    ]
    assert api.get(f"/v1/groups/{group}/offsets").json() == {"offsets": expected}
    assert api.get(f"/v1/groups/{group}/offsets", params={"require_stable": "true"}).json() == {"offsets": expected}
    err = assert_error(
        api.post(f"/v1/groups/{group}/offsets", json={"offsets": [{"topic": topic_name, "partition": 2, "offset": 1}]}),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    )
    assert f"{topic_name}-2" in err["message"]
    assert_error(
        api.post(f"/v1/groups/{group}/offsets", json={"offsets": [{"topic": topic_name, "partition": 0, "offset": -1}]}),
        422,
        "INVALID_REQUEST",
    )
    assert_error(api.post(f"/v1/groups/{group}/offsets", json={"offsets": [{"topic": topic_name}]}), 422, "INVALID_REQUEST")
    assert_error(api.get(f"/v1/groups/{group}/offsets", params={"require_stable": "perhaps"}), 422, "INVALID_REQUEST")
    assert api.get(f"/v1/groups/{group}/offsets").json() == {"offsets": expected}


# --- producers and transactions (happy paths and envelopes; semantics are tested elsewhere) --------


def test_producer_and_transaction_endpoints(api, topic_name):
    create(api, topic_name)
    plain = api.post("/v1/producers", json={})
    assert plain.status_code == 200 and plain.json()["producer_epoch"] == 0
    assert api.post("/v1/producers", json={}).json()["producer_id"] != plain.json()["producer_id"]

    tid = f"tx-{topic_name}"
    p = api.post("/v1/producers", json={"transactional_id": tid, "transaction_timeout_ms": 30_000}).json()
    ident = {"producer_id": p["producer_id"], "producer_epoch": p["producer_epoch"]}
    added = api.post(f"/v1/transactions/{tid}/partitions", json={**ident, "partitions": [{"topic": topic_name, "partition": 0}]})
    assert added.status_code == 200 and added.json()["state"] == "Ongoing"
    offsets = api.post(
        f"/v1/transactions/{tid}/offsets",
        json={**ident, "group_id": f"g-{topic_name}", "offsets": [{"topic": topic_name, "partition": 0, "offset": 0}]},
    )
    assert offsets.status_code == 200, offsets.text
    described = api.get(f"/v1/transactions/{tid}").json()
    assert described["transactional_id"] == tid and described["state"] == "Ongoing"
    assert described["partitions"] == [{"topic": topic_name, "partition": 0}]
    assert described["timeout_ms"] == 30_000 and 0 <= described["coordinator"] < 50
    assert tid in [t["transactional_id"] for t in api.get("/v1/transactions", params={"state": "Ongoing"}).json()["transactions"]]
    aborted = api.post(f"/v1/transactions/{tid}/abort")  # the operator's abort fences the producer
    assert aborted.status_code == 200, aborted.text
    assert aborted.json()["producer_epoch"] > p["producer_epoch"]
    assert_error(api.post(f"/v1/transactions/{tid}/end", json={**ident, "result": "commit"}), 409, "PRODUCER_FENCED")

    p = api.post("/v1/producers", json={"transactional_id": tid}).json()
    ident = {"producer_id": p["producer_id"], "producer_epoch": p["producer_epoch"]}
    produced = api.post(
        records_url(topic_name), json={**ident, "transactional_id": tid, "base_sequence": 0, "records": [{"value": "t"}]}
    )
    assert produced.status_code == 200, produced.text
    end = api.post(f"/v1/transactions/{tid}/end", json={**ident, "result": "commit"})
    assert end.status_code == 200 and end.json()["state"] == "CompleteCommit"
    assert end.json()["producer_epoch"] == p["producer_epoch"] + 1
    committed = api.get(records_url(topic_name), params={"isolation_level": "read_committed"}).json()
    assert [r["value"] for r in committed["records"]] == ["t"]
    events = api.get(f"/v1/transactions/{tid}/events").json()
    assert events["transactional_id"] == tid
    assert events["events"][0]["from_state"] is None and events["events"][-1]["to_state"] == "CompleteCommit"
    assert [e["version"] for e in events["events"]] == sorted(e["version"] for e in events["events"])


def test_a_produce_that_commits_its_transaction(api, topic_name):
    """``"commit": true``: the batch and its transaction's commit in one request, answered with the
    end's answer (the next epoch); the same request again is answered alike and writes nothing; a
    commit without a transactional id, or not a boolean, is refused."""
    create(api, topic_name)
    tid = f"tx-{topic_name}"
    p = api.post("/v1/producers", json={"transactional_id": tid}).json()
    for n in range(3):
        body = {**p, "transactional_id": tid, "base_sequence": 0, "records": [{"value": f"v{n}"}], "commit": True}
        done = api.post(records_url(topic_name), json=body)
        assert done.status_code == 200, done.text
        answer = done.json()
        assert (answer["base_offset"], answer["duplicate"]) == (2 * n, False)
        assert answer["transaction"] == {"state": "CompleteCommit", "producer_id": p["producer_id"], "producer_epoch": n + 1}
        again = api.post(records_url(topic_name), json=body).json()
        assert again == {**answer, "duplicate": True}
        p = {k: answer["transaction"][k] for k in ("producer_id", "producer_epoch")}
    committed = api.get(records_url(topic_name), params={"isolation_level": "read_committed"}).json()
    assert [(r["offset"], r["value"]) for r in committed["records"]] == [(0, "v0"), (2, "v1"), (4, "v2")]
    assert committed["last_stable_offset"] == committed["high_watermark"] == 6
    assert [e["to_state"] for e in api.get(f"/v1/transactions/{tid}/events").json()["events"]][-3:] == [
        "Ongoing",
        "PrepareCommit",
        "CompleteCommit",
    ]
    plain = {
        "producer_id": p["producer_id"],
        "producer_epoch": p["producer_epoch"],
        "base_sequence": 0,
        "records": [{"value": "x"}],
    }
    assert_error(api.post(records_url(topic_name), json={**plain, "commit": True}), 400, "INVALID_REQUEST")
    assert_error(
        api.post(records_url(topic_name), json={**plain, "transactional_id": tid, "commit": "maybe"}), 422, "INVALID_REQUEST"
    )
    assert "commit" in api.get("/openapi.json").json()["components"]["schemas"]["ProduceBody"]["properties"]


def test_transaction_error_envelopes(api, topic_name):
    tid = f"tx-{topic_name}"
    assert_error(api.get(f"/v1/transactions/{tid}"), 404, "TRANSACTIONAL_ID_NOT_FOUND")
    assert_error(
        api.post("/v1/producers", json={"transactional_id": tid, "transaction_timeout_ms": 0}), 400, "INVALID_TRANSACTION_TIMEOUT"
    )
    assert_error(
        api.post("/v1/producers", json={"transactional_id": tid, "transaction_timeout_ms": 10**9}),
        400,
        "INVALID_TRANSACTION_TIMEOUT",
    )
    p = api.post("/v1/producers", json={"transactional_id": tid}).json()
    wrong = {"producer_id": p["producer_id"] + 1, "producer_epoch": 0, "result": "commit"}
    assert_error(api.post(f"/v1/transactions/{tid}/end", json=wrong), 409, "INVALID_PRODUCER_ID_MAPPING")
    assert_error(api.post(f"/v1/transactions/{tid}/end", json={**wrong, "result": "maybe"}), 422, "INVALID_REQUEST")
    assert_error(api.get("/v1/transactions", params={"state": "Sleeping"}), 400, "INVALID_REQUEST")


# --- request size limit -----------------------------------------------------------------------------


def test_message_too_large_with_and_without_content_length(db_url, tmp_path, topic_name):
    limit = 1000
    with ServerProcess(db_url, env={"TXLOG_MAX_REQUEST_BYTES": str(limit)}, log_path=tmp_path / "server.log") as server:
        with server.client() as api:
            create(api, topic_name)
            small = api.post(records_url(topic_name), json={"records": [{"value": "x" * 500}]})
            assert small.status_code == 200, small.text

            big = json.dumps({"records": [{"value": "x" * (limit + 10)}]}).encode()
            err = assert_error(api.post(records_url(topic_name), content=big, headers=JSON), 413, "MESSAGE_TOO_LARGE")
            assert str(limit) in err["message"]

        def chunks():  # type: ignore[no-untyped-def]  # a generator body is sent chunked, without Content-Length
            yield b'{"records": [{"value": "'
            for _ in range(20):
                yield b"y" * 100
            yield b'"}]}'

        with server.client() as api:
            request = api.build_request("POST", records_url(topic_name), content=chunks(), headers=JSON)
            assert "content-length" not in request.headers and request.headers["transfer-encoding"] == "chunked"
            assert_error(api.send(request), 413, "MESSAGE_TOO_LARGE")
            assert_error(api.post(f"/v1/topics/{topic_name}/records", content=big, headers=JSON), 413, "MESSAGE_TOO_LARGE")

        with server.client() as api:  # the server is still fine, and nothing oversized was appended
            assert api.post(records_url(topic_name), json={"records": [{"value": "z"}]}).json()["base_offset"] == 1
            assert [r["value"][:1] for r in api.get(records_url(topic_name)).json()["records"]] == ["x", "z"]


# --- ops ------------------------------------------------------------------------------------------


def test_health_and_readiness(api):
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_metrics_are_prometheus_text(api, topic_name):
    create(api, topic_name)
    api.post(records_url(topic_name), json={"records": [{"value": "a"}, {"value": "b"}, {"value": "c"}]})
    r = api.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    lines = r.text.splitlines()
    assert "# TYPE txlog_http_requests_total counter" in lines
    assert any(
        line.startswith("txlog_http_requests_total{")
        and 'route="/v1/topics/{topic}/partitions/{partition}/records"' in line
        and 'method="POST"' in line
        and 'status="200"' in line
        for line in lines
    )
    appended = [line for line in lines if line.startswith("txlog_records_appended_total{") and f'topic="{topic_name}"' in line]
    assert len(appended) == 1 and float(appended[0].rsplit(" ", 1)[1]) == 3.0


def test_docs_and_openapi(api):
    docs = api.get("/docs")
    assert docs.status_code == 200 and "text/html" in docs.headers["content-type"]
    assert "swagger" in docs.text.lower()
    assets = re.findall(r'(?:src|href)="([^"]+)"', docs.text)
    assert assets and all(a.startswith("/") for a in assets), assets  # served here, not from a CDN
    for asset in assets:
        assert api.get(asset).status_code == 200, asset
    assert api.get("/redoc").status_code == 200
    spec = api.get("/openapi.json").json()
    assert spec["info"]["title"] == "txlog"
    for path in [
        "/v1/topics",
        "/v1/topics/{topic}",
        "/v1/topics/{topic}/records",
        "/v1/topics/{topic}/partitions/{partition}/records",
        "/v1/groups/{group}/offsets",
        "/v1/producers",
        "/v1/transactions",
        "/v1/transactions/{tid}",
        "/v1/transactions/{tid}/partitions",
        "/v1/transactions/{tid}/offsets",
        "/v1/transactions/{tid}/end",
        "/v1/transactions/{tid}/abort",
        "/v1/transactions/{tid}/events",
    ]:
        assert path in spec["paths"], path
    assert set(spec["paths"]["/v1/topics/{topic}/partitions/{partition}/records"]) == {"get", "post"}
