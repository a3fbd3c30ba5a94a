"""The v2 log through a real ``txlog serve``: headers as Kafka has them (a list with repeated keys
and null values, or the simple object), fencing that reaches partitions a fenced producer never
wrote (with or without its transactional id), and a paged transaction history."""

from __future__ import annotations

import base64

from tests.acceptance.test_http_api import assert_error, create, records_url


def fetch(api, topic: str, encoding: str = "utf8", isolation: str = "read_uncommitted", partition: int = 0) -> dict:  # type: ignore[no-untyped-def]
    r = api.get(records_url(topic, partition), params={"encoding": encoding, "isolation_level": isolation})
    assert r.status_code == 200, r.text
    return r.json()


def test_headers_as_a_list_keep_order_repeats_null_and_bytes(api, topic_name):
    create(api, topic_name)
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    listed = [
        {"key": "trace", "value": b64(b"1")},
        {"key": "bin", "value": b64(b"\x00\xff")},
        {"key": "trace", "value": b64(b"2")},
        {"key": "none", "value": None},
    ]
    r = api.post(records_url(topic_name), json={"encoding": "base64", "records": [{"value": b64(b"v"), "headers": listed}]})
    assert r.status_code == 200, r.text
    r = api.post(records_url(topic_name), json={"records": [{"value": "w", "headers": {"h": "x", "n": None}}]})
    assert r.status_code == 200, r.text
    r = api.post(records_url(topic_name), json={"records": [{"value": "z", "headers": [{"key": "h", "value": "text"}]}]})
    assert r.status_code == 200, r.text

    got = fetch(api, topic_name, "base64")["records"]
    assert got[0]["header_list"] == listed
    assert got[0]["headers"] == {"trace": "2", "bin": "\ufffd\ufffd", "none": None}  # the object form: last value wins
    assert got[1]["header_list"] == [{"key": "h", "value": b64(b"x")}, {"key": "n", "value": None}]
    assert got[1]["headers"] == {"h": "x", "n": None}
    text = fetch(api, topic_name)["records"]
    assert text[2]["header_list"] == [{"key": "h", "value": "text"}] and text[2]["headers"] == {"h": "text"}


def test_bad_headers_are_invalid_not_500(api, topic_name):
    create(api, topic_name)
    for headers in (
        [{"key": "k", "value": "not base64!"}],
        [{"key": "a\x00b", "value": None}],
        [{"value": "x"}],
        [{"key": 1, "value": "x"}],
        {"k": 1},
        "text",
    ):
        r = api.post(records_url(topic_name), json={"encoding": "base64", "records": [{"value": None, "headers": headers}]})
        assert 400 <= r.status_code < 500, (headers, r.text)


def test_a_fenced_producer_appends_nowhere_without_its_transactional_id(api, topic_name):
    create(api, topic_name, 3)
    tid = f"fence-{topic_name}"
    first = api.post("/v1/producers", json={"transactional_id": tid}).json()
    ident = {"producer_id": first["producer_id"], "producer_epoch": first["producer_epoch"]}
    r = api.post(
        records_url(topic_name, 0), json={**ident, "transactional_id": tid, "base_sequence": 0, "records": [{"value": "in txn"}]}
    )
    assert r.status_code == 200, r.text
    again = api.post("/v1/producers", json={"transactional_id": tid}).json()  # a new producer takes over
    assert again["producer_epoch"] == first["producer_epoch"] + 1
    for partition in (0, 1, 2):
        r = api.post(
            records_url(topic_name, partition),
            json={**ident, "base_sequence": 0 if partition else 1, "records": [{"value": "zombie"}]},
        )
        err = assert_error(r, 409, "PRODUCER_FENCED")
        assert err["reason"] == "newer_epoch"
    for partition in (0, 1, 2):
        body = fetch(api, topic_name, isolation="read_committed", partition=partition)
        assert [rec["value"] for rec in body["records"]] == []
        assert body["last_stable_offset"] == body["high_watermark"]


def test_events_are_paged_from_the_newest(api, topic_name):
    create(api, topic_name)
    tid = f"paged-{topic_name}"
    p = api.post("/v1/producers", json={"transactional_id": tid}).json()
    for _ in range(3):
        ident = {"producer_id": p["producer_id"], "producer_epoch": p["producer_epoch"]}
        r = api.post(
            records_url(topic_name), json={**ident, "transactional_id": tid, "base_sequence": 0, "records": [{"value": "x"}]}
        )
        assert r.status_code == 200, r.text
        p = api.post(f"/v1/transactions/{tid}/end", json={**ident, "result": "commit"}).json()
    everything = api.get(f"/v1/transactions/{tid}/events").json()
    versions = [e["version"] for e in everything["events"]]
    assert versions == list(range(1, len(versions) + 1)) and everything["next_before_version"] is None
    page = api.get(f"/v1/transactions/{tid}/events", params={"limit": 3}).json()
    assert [e["version"] for e in page["events"]] == versions[-3:]
    older = api.get(f"/v1/transactions/{tid}/events", params={"limit": 3, "before_version": page["next_before_version"]}).json()
    assert [e["version"] for e in older["events"]] == versions[-6:-3]
    assert_error(api.get(f"/v1/transactions/{tid}/events", params={"limit": 0}), 422, "INVALID_REQUEST")
    assert_error(api.get("/v1/transactions/nobody-at-all/events"), 404, "TRANSACTIONAL_ID_NOT_FOUND")
