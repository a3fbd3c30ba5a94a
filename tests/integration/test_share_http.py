"""Share groups over HTTP through a real ``txlog serve``: acquire and acknowledge, redelivery with a
delivery count, a member acknowledging records it does not hold, long polls woken by an append
and by a release, listing and describing share groups, configs, and the error envelope."""

from __future__ import annotations

import threading
import time
import uuid

import httpx

from tests.acceptance.test_http_api import assert_error, create, records_url


def group_name() -> str:
    return f"sg-{uuid.uuid4().hex[:10]}"


def produce(api, topic: str, *values: str, partition: int = 0) -> None:  # type: ignore[no-untyped-def]
    r = api.post(records_url(topic, partition), json={"records": [{"value": v} for v in values]})
    assert r.status_code == 200, r.text


def earliest(api, group: str) -> None:  # type: ignore[no-untyped-def]
    r = api.patch(f"/v1/share-groups/{group}/configs", json={"configs": {"share.auto.offset.reset": "earliest"}})
    assert r.status_code == 200, r.text
    assert r.json()["configs"]["share.auto.offset.reset"] == "earliest"


def acquire(api, group: str, member: str, topic: str, **body) -> httpx.Response:  # type: ignore[no-untyped-def]
    return api.post(f"/v1/share-groups/{group}/acquire", json={"member_id": member, "topic": topic, **body})


def acknowledge(api, group: str, member: str, *acks: dict) -> httpx.Response:  # type: ignore[no-untyped-def]
    return api.post(f"/v1/share-groups/{group}/acknowledge", json={"member_id": member, "acknowledgements": list(acks)})


def test_members_acquire_disjoint_records_and_released_ones_come_back_counted(api, topic_name):
    group = group_name()
    create(api, topic_name)
    earliest(api, group)
    produce(api, topic_name, "a", "b", "c", "d", "e")

    first = acquire(api, group, "m1", topic_name, max_records=2)
    assert first.status_code == 200, first.text
    body = first.json()
    assert [(r["offset"], r["value"], r["delivery_count"]) for r in body["records"]] == [(0, "a", 1), (1, "b", 1)]
    assert body["partitions"][0]["acquired"] == [{"first_offset": 0, "last_offset": 1, "delivery_count": 1}]
    second = acquire(api, group, "m2", topic_name).json()
    assert [r["offset"] for r in second["records"]] == [2, 3, 4]

    done = acknowledge(
        api,
        group,
        "m1",
        {"topic": topic_name, "partition": 0, "offset": 0, "type": "accept"},
        {"topic": topic_name, "partition": 0, "offset": 1, "type": "release"},
    )
    assert done.status_code == 200, done.text
    assert done.json()["partitions"] == [
        {"topic": topic_name, "partition": 0, "accepted": 1, "released": 1, "archived": 0, "renewed": 0, "error": None}
    ]
    again = acquire(api, group, "m3", topic_name).json()
    assert [(r["offset"], r["value"], r["delivery_count"]) for r in again["records"]] == [(1, "b", 2)]

    described = api.get(f"/v1/share-groups/{group}")
    assert described.status_code == 200, described.text
    [part] = described.json()["partitions"]
    assert (part["start_offset"], part["end_offset"]) == (1, 5)
    assert part["records"]["Acquired"] == 4
    assert [(r["first_offset"], r["last_offset"], r["member_id"], r["delivery_count"]) for r in part["in_flight"]] == [
        (1, 1, "m3", 2),
        (2, 4, "m2", 1),
    ]
    assert group in api.get("/v1/share-groups").json()["groups"]


def test_acknowledging_records_held_by_another_member_is_refused(api, topic_name):
    group = group_name()
    create(api, topic_name)
    earliest(api, group)
    produce(api, topic_name, "x")
    assert acquire(api, group, "holder", topic_name).status_code == 200
    refused = acknowledge(
        api, group, "thief", {"topic": topic_name, "partition": 0, "first_offset": 0, "last_offset": 0, "type": "accept"}
    )
    assert_error(refused, 409, "INVALID_RECORD_STATE")
    rejected = acknowledge(api, group, "holder", {"topic": topic_name, "partition": 0, "offset": 0, "type": "reject"})
    assert rejected.json()["partitions"][0]["archived"] == 1
    assert acquire(api, group, "other", topic_name).json()["records"] == []  # archived: never again


def test_an_idle_acquire_waits_for_an_append(api, server, topic_name):
    group = group_name()
    create(api, topic_name)
    result: dict = {}

    def poll() -> None:
        with server.client() as c:
            start = time.monotonic()
            result["response"] = acquire(c, group, "waiter", topic_name, wait_ms=20_000)
            result["elapsed"] = time.monotonic() - start

    poller = threading.Thread(target=poll)
    poller.start()
    poller.join(0.5)
    assert poller.is_alive(), "an acquire with nothing to acquire should be waiting"
    produce(api, topic_name, "new")
    poller.join(10)
    assert not poller.is_alive()
    assert result["elapsed"] < 10
    assert [r["value"] for r in result["response"].json()["records"]] == ["new"]


def test_an_idle_acquire_is_woken_by_a_release(api, server, topic_name):
    group = group_name()
    create(api, topic_name)
    earliest(api, group)
    produce(api, topic_name, "only")
    assert len(acquire(api, group, "first", topic_name).json()["records"]) == 1
    result: dict = {}

    def poll() -> None:
        with server.client() as c:
            result["response"] = acquire(c, group, "second", topic_name, wait_ms=20_000)

    poller = threading.Thread(target=poll)
    poller.start()
    poller.join(0.5)
    assert poller.is_alive()
    released = acknowledge(api, group, "first", {"topic": topic_name, "partition": 0, "offset": 0, "type": "release"})
    assert released.status_code == 200, released.text
    poller.join(10)
    assert not poller.is_alive()
    assert [(r["value"], r["delivery_count"]) for r in result["response"].json()["records"]] == [("only", 2)]


def test_errors_are_kafka_named(api, topic_name):
    group = group_name()
    assert_error(acquire(api, group, "m", "no-such-topic"), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    both = api.post(f"/v1/share-groups/{group}/acquire", json={"topic": "t", "partitions": [{"topic": "t", "partition": 0}]})
    assert_error(both, 422, "INVALID_REQUEST")
    assert_error(api.get(f"/v1/share-groups/{group}"), 404, "GROUP_ID_NOT_FOUND")
    bad = api.patch(f"/v1/share-groups/{group}/configs", json={"configs": {"share.delivery.count.limit": "100"}})
    assert_error(bad, 400, "INVALID_CONFIG")
    create(api, topic_name)
    never = acknowledge(api, group, "m", {"topic": topic_name, "partition": 0, "offset": 0, "type": "accept"})
    assert_error(never, 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_a_member_id_is_made_when_none_is_given(api, topic_name):
    group = group_name()
    create(api, topic_name)
    r = api.post(f"/v1/share-groups/{group}/acquire", json={"partitions": [{"topic": topic_name, "partition": 0}]})
    assert r.status_code == 200, r.text
    assert r.json()["member_id"]


def test_the_openapi_document_declares_every_answer(api):
    paths = api.get("/openapi.json").json()["paths"]
    for path, method, statuses in [
        ("/v1/share-groups/{group}/acquire", "post", {"200", "400", "404", "409", "413", "422", "503"}),
        ("/v1/share-groups/{group}/acknowledge", "post", {"200", "400", "404", "409", "413", "422", "503"}),
        ("/v1/share-groups", "get", {"200", "401", "403", "503"}),
        ("/v1/share-groups/{group}", "get", {"200", "404", "503"}),
        ("/v1/share-groups/{group}/configs", "patch", {"200", "400", "503"}),
    ]:
        assert statuses <= set(paths[path][method]["responses"]), (path, paths[path][method]["responses"].keys())


def test_an_acquisition_carries_acknowledgements_applied_before_it(api, topic_name):
    group = group_name()
    create(api, topic_name)
    earliest(api, group)
    produce(api, topic_name, "a", "b", "c")
    assert [r["offset"] for r in acquire(api, group, "m1", topic_name, max_records=2).json()["records"]] == [0, 1]
    r = acquire(
        api,
        group,
        "m1",
        topic_name,
        acknowledgements=[
            {"topic": topic_name, "partition": 0, "offset": 0, "type": "accept"},
            {"topic": topic_name, "partition": 0, "offset": 1, "type": "release"},
        ],
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["acknowledgements"] == [
        {"topic": topic_name, "partition": 0, "accepted": 1, "released": 1, "archived": 0, "renewed": 0, "error": None}
    ]
    assert [(x["offset"], x["delivery_count"]) for x in body["records"]] == [(1, 2), (2, 1)]
    # Refused acknowledgements are the partition's error; the acquisition still answers.
    stale = acquire(
        api, group, "m2", topic_name, acknowledgements=[{"topic": topic_name, "partition": 0, "offset": 1, "type": "accept"}]
    )
    assert stale.status_code == 200, stale.text
    assert stale.json()["acknowledgements"][0]["error"]["code"] == "INVALID_RECORD_STATE"
    assert "acknowledgements" not in acquire(api, group, "m1", topic_name).json()
    anonymous = api.post(
        f"/v1/share-groups/{group}/acquire",
        json={"topic": topic_name, "acknowledgements": [{"topic": topic_name, "partition": 0, "offset": 2, "type": "accept"}]},
    )
    assert_error(anonymous, 400, "INVALID_REQUEST")
