"""``txlog produce`` and ``txlog consume`` against a real server, through txlog's own Producer and
Consumer: keys, headers, transactions, isolation levels, starting points, groups, following the
log, progress, and the failures a script must be able to tell apart."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.cli.conftest import Cli
from tests.support import ROOT


@pytest.fixture(scope="module")
def api(cli_server):  # type: ignore[no-untyped-def]
    with cli_server.client() as client:
        yield client


def create(api: httpx.Client, topic: str, partitions: int = 1) -> None:
    assert api.post("/v1/topics", json={"name": topic, "partitions": partitions}).status_code == 201


def test_lines_with_keys_and_headers_round_trip(txlog: Cli, api: httpx.Client, topic: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    create(api, topic, 2)
    lines = "".join(f"k{i % 3}:value {i}\n" for i in range(9))
    summary = txlog("produce", topic, "--key-separator", ":", "--header", "source=cli", "--json", input=lines).json()
    assert summary["records"] == 9 and summary["failed"] == 0 and summary["transactional_id"] is None
    assert sum(p["records"] for p in summary["partitions"]) == 9

    records = txlog("consume", topic, "--json").json_lines()
    assert sorted(r["value"] for r in records) == sorted(f"value {i}" for i in range(9))
    by_value = {r["value"]: r for r in records}
    assert by_value["value 4"]["key"] == "k1" and by_value["value 4"]["headers"] == [["source", "cli"]]
    # One key, one partition (Kafka's partitioner), in the order produced.
    for key in ("k0", "k1", "k2"):
        mine = [r for r in records if r["key"] == key]
        assert len({r["partition"] for r in mine}) == 1
        assert [r["value"] for r in sorted(mine, key=lambda r: r["offset"])] == [
            f"value {i}" for i in range(9) if f"k{i % 3}" == key
        ]

    one = records[-1]
    run = txlog(
        "consume",
        topic,
        "--partition",
        str(one["partition"]),
        "--offset",
        str(one["offset"]),
        "--max-messages",
        "1",
        "--print-key",
        "--print-headers",
        "--print-offset",
        "--key-separator",
        "|",
    )
    assert run.out == f"Partition:{one['partition']}|Offset:{one['offset']}|source:cli|{one['key']}|{one['value']}\n"
    assert run.err.strip() == "Processed a total of 1 messages"

    source = tmp_path / "lines.txt"
    source.write_bytes(b"from a file\r\nand another\n")
    human = txlog("produce", topic, "--file", str(source), "--partition", "1").out
    assert human.startswith("Produced 2 record(s) to ") and "partition 1 offsets" in human
    assert txlog("consume", topic, "--partition", "1").out.splitlines()[-2:] == ["from a file", "and another"]


def test_transactions_and_isolation_levels(txlog: Cli, api: httpx.Client, topic: str) -> None:
    create(api, topic)
    tid = f"{topic}-tid"
    summary = txlog(
        "produce", topic, "--transactional-id", tid, "--transaction-size", "2", "--json", input="a\nb\nc\nd\ne\n"
    ).json()
    assert (summary["records"], summary["transactions_committed"], summary["transactional_id"]) == (5, 3, tid)
    assert api.get(f"/v1/transactions/{tid}").json()["state"] == "CompleteCommit"

    # A transaction left open after them: read_committed stops at its first offset, read_uncommitted does not.
    pe = api.post("/v1/producers", json={"transactional_id": f"{topic}-open"}).json()
    r = api.post(
        f"/v1/topics/{topic}/partitions/0/records",
        json={**pe, "base_sequence": 0, "transactional_id": f"{topic}-open", "records": [{"value": "pending"}]},
    )
    assert r.status_code == 200, r.text
    assert txlog("consume", topic, "--isolation-level", "read_committed").out.split() == ["a", "b", "c", "d", "e"]
    assert txlog("consume", topic).out.split() == ["a", "b", "c", "d", "e", "pending"]
    assert txlog("consume", topic, "--max-messages", "2", "--from-beginning").out.split() == ["a", "b"]
    assert txlog("consume", topic, "--offset", "latest").out == ""

    # An aborted transaction's records never reach read_committed readers.
    assert api.post(f"/v1/transactions/{f'{topic}-open'}/end", json={**pe, "result": "abort"}).status_code == 200
    assert txlog("consume", topic, "--isolation-level", "read_committed").out.split() == ["a", "b", "c", "d", "e"]


def test_a_group_starts_where_it_committed(txlog: Cli, api: httpx.Client, topic: str) -> None:
    create(api, topic)
    txlog("produce", topic, input="".join(f"m{i}\n" for i in range(5)))
    group = f"{topic}-g"
    assert txlog("consume", topic, "--group", group, "--max-messages", "3").out.split() == ["m0", "m1", "m2"]
    assert txlog("groups", "describe", group, "--json").json()["offsets"][0]["offset"] == 3
    assert txlog("consume", topic, "--group", group).out.split() == ["m3", "m4"]
    described = txlog("groups", "describe", group, "--json").json()
    assert (described["offsets"][0]["offset"], described["lag"]) == (5, 0)
    assert txlog("consume", topic, "--group", group).out == ""


def test_follow_waits_for_new_records(txlog: Cli, api: httpx.Client, topic: str) -> None:
    create(api, topic)
    txlog("produce", topic, input="first\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}, "TXLOG_URL": txlog.url}
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "consume",
            topic,
            "--follow",
            "--max-messages",
            "3",
            "--isolation-level",
            "read_committed",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert follower.stdout.readline() == b"first\n"  # type: ignore[union-attr]
        assert follower.poll() is None  # at the end of the log it waits
        txlog("produce", topic, "--transactional-id", f"{topic}-t", input="second\nthird\n")
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert out == b"second\nthird\n"


def test_progress_of_a_long_run_on_stderr(txlog: Cli, api: httpx.Client, topic: str) -> None:
    create(api, topic)
    run = txlog("produce", topic, "--progress", input="".join(f"{i}\n" for i in range(5000)))
    assert run.out.startswith("Produced 5000 record(s)")
    assert run.err.splitlines()[-1].startswith("produced 5000 records (")
    quiet = txlog("produce", topic, input="x\n")
    assert quiet.err == ""  # stderr is not a terminal and progress was not asked for
    consumed = txlog("consume", topic, "--progress", "--json")
    assert len(consumed.json_lines()) == 5001
    assert "consumed 5001 records (" in consumed.err


def test_failures_a_script_can_tell_apart(txlog: Cli, api: httpx.Client, topic: str) -> None:
    missing = txlog("produce", topic, input="x\n", expect=1)
    assert missing.err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION (code 3): ")
    assert txlog("consume", topic, expect=1).err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION (code 3): ")
    create(api, topic)
    bad = txlog("produce", topic, "--key-separator", ":", input="k:v\nno separator\n", expect=1)
    assert bad.err.strip() == "error: line 2 has no key separator ':'; 1 record(s) before it were produced"
    bad_txn = txlog("produce", topic, "--key-separator", ":", "--transactional-id", f"{topic}-t", input="k:w\nnope\n", expect=1)
    assert "its transaction was aborted" in bad_txn.err
    assert txlog("consume", topic, "--isolation-level", "read_committed", "--print-key").out == "k\tv\n"
    assert "needs --partition" in txlog("consume", topic, "--offset", "3", expect=2).err
    assert "goes with --transactional-id" in txlog("produce", topic, "--transaction-size", "2", input="", expect=2).err
    assert txlog("consume", topic, "--partition", "7", expect=1).err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION")
    assert txlog("produce", topic, "--url", "http://127.0.0.1:9", input="x\n", expect=3).err.startswith("error: _TRANSPORT")
