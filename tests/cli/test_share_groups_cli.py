"""``txlog share-groups`` and ``txlog consume --share-group`` against a real server: configs set,
records acquired, printed and accepted, rejected or released, the in-flight records described with
their lock holder and delivery count, and the usage errors."""

from __future__ import annotations

import httpx
import pytest

from tests.cli.conftest import Cli


@pytest.fixture(scope="module")
def api(cli_server):  # type: ignore[no-untyped-def]
    with cli_server.client() as client:
        yield client


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip()]


def test_share_group_consume_describe_and_configs(txlog: Cli, api: httpx.Client, topic: str) -> None:
    group = f"{topic}-share"
    assert api.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code == 201
    r = api.post(f"/v1/topics/{topic}/partitions/0/records", json={"records": [{"value": v} for v in "abcde"]})
    assert r.status_code == 200, r.text

    altered = txlog(
        "share-groups",
        "alter-config",
        group,
        "--set",
        "share.auto.offset.reset=earliest",
        "--set",
        "share.record.lock.duration.ms=30000",
    )
    assert f"Altered share group {group}." in altered.out
    assert any(line.split() == ["share.record.lock.duration.ms:", "30000"] for line in altered.out.splitlines())
    bad = txlog("share-groups", "alter-config", group, "--set", "share.record.lock.duration.ms=5", expect=1)
    assert "INVALID_CONFIG" in bad.err

    first = txlog("consume", "--share-group", group, topic, "--max-messages", "2", "--print-offset")
    assert first.out.splitlines() == ["Partition:0\tOffset:0\tDeliveryCount:1\ta", "Partition:0\tOffset:1\tDeliveryCount:1\tb"]
    assert "Processed a total of 2 messages (accepted)" in first.err
    rejected = txlog("consume", "--share-group", group, topic, "--max-messages", "1", "--reject")
    assert rejected.out == "c\n"
    released = txlog("consume", "--share-group", group, topic, "--max-messages", "1", "--release", "--json").json_lines()
    assert [(m["offset"], m["value"], m["delivery_count"]) for m in released] == [(3, "d", 1)]

    described = txlog("share-groups", "describe", group, "--json").json()
    [part] = described["partitions"]
    assert (part["start_offset"], part["end_offset"]) == (3, 4)
    assert [(r["first_offset"], r["state"], r["member_id"], r["delivery_count"]) for r in part["in_flight"]] == [
        (3, "Available", None, 1)
    ]

    # A member holds d: the lock holder and the delivery count are shown.
    held = api.post(f"/v1/share-groups/{group}/acquire", json={"member_id": "holder-1", "topic": topic, "max_records": 1})
    assert held.status_code == 200 and [r["offset"] for r in held.json()["records"]] == [3]
    human = rows(txlog("share-groups", "describe", group).out)
    assert human[0] == [
        "GROUP",
        "TOPIC",
        "PARTITION",
        "START-OFFSET",
        "END-OFFSET",
        "AVAILABLE",
        "ACQUIRED",
        "ACKNOWLEDGED",
        "ARCHIVED",
    ]
    assert human[1] == [group, topic, "0", "3", "3", "0", "1", "0", "0"]
    assert ["Records", "in", "flight"] in human
    assert human[-1][:6] == [topic, "0", "3", "3", "Acquired", "holder-1"]
    assert human[-1][-1] == "2"
    with_configs = txlog("share-groups", "describe", group, "--configs").out
    assert any(line.split() == ["share.auto.offset.reset", "earliest"] for line in with_configs.splitlines())
    r = api.post(
        f"/v1/share-groups/{group}/acknowledge",
        json={"member_id": "holder-1", "acknowledgements": [{"topic": topic, "partition": 0, "offset": 3, "type": "release"}]},
    )
    assert r.status_code == 200, r.text

    rest = txlog("consume", "--share-group", group, topic, "--print-offset").out.splitlines()
    assert rest == ["Partition:0\tOffset:3\tDeliveryCount:3\td", "Partition:0\tOffset:4\tDeliveryCount:1\te"]
    after = txlog("share-groups", "describe", group, "--json").json()["partitions"][0]
    assert (after["start_offset"], after["in_flight"]) == (5, [])

    assert group in txlog("share-groups", "list", "--json").json()["groups"]
    assert [group] in rows(txlog("share-groups", "list").out)
    missing = txlog("share-groups", "describe", f"{topic}-nobody", expect=1)
    assert "GROUP_ID_NOT_FOUND" in missing.err


def test_records_acquired_past_max_messages_go_back_to_the_group(txlog: Cli, api: httpx.Client, topic: str) -> None:
    group = f"{topic}-share"
    assert api.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code == 201
    assert (
        api.post(f"/v1/topics/{topic}/partitions/0/records", json={"records": [{"value": v} for v in "xyz"]}).status_code == 200
    )
    txlog("share-groups", "alter-config", group, "--set", "share.auto.offset.reset=earliest")
    assert txlog("consume", "--share-group", group, topic, "--max-messages", "1").out == "x\n"
    assert txlog("consume", "--share-group", group, topic).out == "y\nz\n"
    part = txlog("share-groups", "describe", group, "--json").json()["partitions"][0]
    assert (part["start_offset"], part["in_flight"]) == (3, [])


def test_share_group_usage_errors(txlog: Cli, topic: str) -> None:
    assert "--share-group does not go with" in txlog("consume", "--share-group", "g", "--group", "h", topic, expect=2).err
    assert "--share-group does not go with" in txlog("consume", "--share-group", "g", "--from-beginning", topic, expect=2).err
    assert "go with --share-group" in txlog("consume", "--reject", topic, expect=2).err
    assert "at least one --set" in txlog("share-groups", "alter-config", "g", expect=2).err
