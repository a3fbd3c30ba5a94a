"""``txlog topics``, ``txlog transactions`` and ``txlog groups`` against a real server: tables by
default, ``--json`` for scripts, the server's error names on stderr and exit codes that tell them
apart."""

from __future__ import annotations

import http.server
import threading
from typing import ClassVar

import httpx
import psycopg
import pytest

from tests.cli.conftest import Cli


@pytest.fixture(scope="module")
def api(cli_server):  # type: ignore[no-untyped-def]
    with cli_server.client() as client:
        yield client


def rows(output: str) -> list[list[str]]:
    """A table's lines split on whitespace, header first."""
    return [line.split() for line in output.splitlines() if line.strip()]


def produce(api: httpx.Client, topic: str, partition: int, values: list[str], **producer: object) -> dict:
    r = api.post(
        f"/v1/topics/{topic}/partitions/{partition}/records", json={**producer, "records": [{"value": v} for v in values]}
    )
    assert r.status_code == 200, r.text
    return r.json()


def open_transaction(api: httpx.Client, tid: str, topic: str, partitions: dict[int, list[str]]) -> dict:
    """A transaction of ``tid`` left Ongoing with these records; answers its producer id and epoch."""
    pe = api.post("/v1/producers", json={"transactional_id": tid, "transaction_timeout_ms": 60000}).json()
    for partition, values in partitions.items():
        produce(
            api,
            topic,
            partition,
            values,
            producer_id=pe["producer_id"],
            producer_epoch=pe["producer_epoch"],
            base_sequence=0,
            transactional_id=tid,
        )
    return pe


def test_topics_create_list_describe_alter(txlog: Cli, api: httpx.Client, topic: str) -> None:
    run = txlog("topics", "create", topic, "--partitions", "3", "--config", "retention.ms=86400000")
    assert run.out.strip() == f"Created topic {topic} with 3 partition(s)."
    again = txlog("topics", "create", topic, expect=1)
    assert again.err.startswith("error: TOPIC_ALREADY_EXISTS (code 36): ") and topic in again.err
    assert again.out == ""
    assert txlog("topics", "create", topic, "--if-not-exists").out.strip() == f"Topic {topic} exists already."
    created = txlog("topics", "create", topic + "-j", "--json").json()
    assert created == {"name": topic + "-j", "partitions": 1}

    listed = rows(txlog("topics", "list").out)
    assert listed[0] == ["TOPIC", "PARTITIONS"]
    assert [topic, "3"] in listed and [topic + "-j", "1"] in listed
    assert {"name": topic, "partitions": 3} in txlog("topics", "list", "--json").json()["topics"]

    produce(api, topic, 1, ["a", "b", "c"])
    open_transaction(api, f"{topic}-tid", topic, {1: ["open"]})
    described = txlog("topics", "describe", topic).out
    assert f"Topic:          {topic}" in described and "PartitionCount: 3" in described
    assert "Configs:        retention.ms=86400000" in described
    table = rows(described)[3:]
    assert table[0] == ["PARTITION", "LOG-START-OFFSET", "LAST-STABLE-OFFSET", "HIGH-WATERMARK", "UNSTABLE"]
    assert table[1:] == [["0", "0", "0", "0", "0"], ["1", "0", "3", "4", "1"], ["2", "0", "0", "0", "0"]]
    assert txlog("topics", "describe", topic, "--json").json() == api.get(f"/v1/topics/{topic}").json()

    altered = txlog(
        "topics", "alter", topic, "--config", "retention.bytes=1048576", "--delete-config", "retention.ms", "--json"
    ).json()
    assert altered == {"name": topic, "config": {"retention.bytes": 1048576}}
    human = txlog("topics", "alter", topic, "--config", "cleanup.policy=delete").out
    assert human.startswith(f"Altered topic {topic}.")
    assert ["cleanup.policy", "delete"] in rows(human) and ["retention.bytes", "1048576"] in rows(human)

    bad = txlog("topics", "alter", topic, "--config", "retention.ms=soon", expect=1)
    assert bad.err.startswith("error: INVALID_CONFIG (code 40): ")
    usage = txlog("topics", "alter", topic, expect=2)
    assert "name at least one --config, --delete-config or --partitions" in usage.err
    assert "is not KEY=VALUE" in txlog("topics", "create", topic + "-x", "--config", "retention.ms", expect=2).err

    # deleted with the transaction still open on it, which is aborted (kafka-topics.sh --delete)
    assert txlog("topics", "delete", topic).out.strip() == f"Deleted topic {topic}. Aborted the open transactions of {topic}-tid."
    assert api.get(f"/v1/transactions/{topic}-tid").json()["state"] == "CompleteAbort"
    assert txlog("topics", "delete", topic, expect=1).err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION (code 3): ")
    assert txlog("topics", "delete", topic, "--if-exists").out.strip() == f"Topic {topic} does not exist."


def test_exit_codes_tell_server_errors_usage_and_an_unreachable_server_apart(txlog: Cli, topic: str) -> None:
    missing = txlog("topics", "describe", topic, expect=1)
    assert missing.err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION (code 3): ")
    assert "No such command" in txlog("topics", "drop", topic, expect=2).err
    assert "Missing argument" in txlog("topics", "describe", expect=2).err
    away = txlog("topics", "list", "--url", "http://127.0.0.1:9", expect=3)
    assert away.err.startswith("error: _TRANSPORT (code -195): ")
    assert "Exit codes:" in txlog("--help").out


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:  # noqa: N802 — the standard library's name
        _Recorder.seen.append((self.path, self.headers.get("Authorization")))
        body = b'{"topics": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_url_and_token_come_from_flags_or_the_environment(txlog: Cli) -> None:
    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=listener.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.server_address[1]}"
        txlog("topics", "list", "--url", url, "--token", "s3cret")
        txlog("topics", "list", env={"TXLOG_URL": url, "TXLOG_TOKEN": "from-env"})
        txlog("topics", "list", "--bootstrap-server", url.removeprefix("http://"))
    finally:
        listener.shutdown()
        listener.server_close()
    assert _Recorder.seen == [("/v1/topics", "Bearer s3cret"), ("/v1/topics", "Bearer from-env"), ("/v1/topics", None)]


def test_groups_list_and_describe_show_lag_against_the_last_stable_offset(txlog: Cli, api: httpx.Client, topic: str) -> None:
    assert api.post("/v1/topics", json={"name": topic, "partitions": 2}).status_code == 201
    produce(api, topic, 0, ["a", "b", "c", "d", "e"])
    produce(api, topic, 1, ["a", "b", "c"])
    tid = f"{topic}-txn"
    pe = open_transaction(api, tid, topic, {1: ["x", "y"]})  # p1: last stable offset 3, high watermark 5
    group = f"{topic}-group"
    r = api.post(
        f"/v1/groups/{group}/offsets",
        json={"offsets": [{"topic": topic, "partition": 0, "offset": 2}, {"topic": topic, "partition": 1, "offset": 1}]},
    )
    assert r.status_code == 200, r.text
    r = api.post(
        f"/v1/transactions/{tid}/offsets",
        json={**pe, "group_id": group, "offsets": [{"topic": topic, "partition": 0, "offset": 4}]},
    )
    assert r.status_code == 200, r.text

    described = txlog("groups", "describe", group, "--json").json()
    assert described["group_id"] == group and described["lag"] == 3 + 2
    assert [
        (o["partition"], o["offset"], o["last_stable_offset"], o["high_watermark"], o["lag"]) for o in described["offsets"]
    ] == [(0, 2, 5, 5, 3), (1, 1, 3, 5, 2)]
    assert [(p["partition"], p["offset"], p["transactional_id"]) for p in described["pending_offsets"]] == [(0, 4, tid)]

    human = rows(txlog("groups", "describe", group).out)
    assert human[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LAST-STABLE-OFFSET", "LOG-END-OFFSET", "LAG"]
    assert human[1:3] == [[group, topic, "0", "2", "5", "5", "3"], [group, topic, "1", "1", "3", "5", "2"]]
    assert "Offsets pending in open transactions" in txlog("groups", "describe", group).out
    assert [topic, "0", "4", tid, str(pe["producer_id"]), str(pe["producer_epoch"])] in human

    listed = {g["group_id"]: g for g in txlog("groups", "list", "--json").json()["groups"]}
    assert (listed[group]["partitions"], listed[group]["lag"], listed[group]["pending_offsets"]) == (2, 5, 1)
    line = next(r for r in rows(txlog("groups", "list").out) if r[0] == group)
    assert line[:3] == [group, "2", "5"] and line[-1] == "1"

    # The transaction commits: its offset applies and p1's last stable offset reaches the high watermark.
    assert api.post(f"/v1/transactions/{tid}/end", json={**pe, "result": "commit"}).status_code == 200
    after = txlog("groups", "describe", group, "--json").json()
    assert [(o["offset"], o["lag"]) for o in after["offsets"]] == [(4, 1), (1, 5)]  # the commit marker is offset 5
    assert after["pending_offsets"] == []

    nobody = txlog("groups", "describe", f"{topic}-nobody")
    assert nobody.out.strip() == f"Consumer group {topic}-nobody has no committed offsets."


def test_transactions_list_and_describe(txlog: Cli, api: httpx.Client, topic: str) -> None:
    assert api.post("/v1/topics", json={"name": topic, "partitions": 2}).status_code == 201
    tid = f"{topic}-tid"
    pe = open_transaction(api, tid, topic, {0: ["a"], 1: ["b"]})

    listed = {t["transactional_id"]: t for t in txlog("transactions", "list", "--json").json()["transactions"]}
    assert (listed[tid]["state"], listed[tid]["producer_id"]) == ("Ongoing", pe["producer_id"])
    line = next(r for r in rows(txlog("transactions", "list").out) if r[0] == tid)
    assert line[2:5] == [str(pe["producer_id"]), str(pe["producer_epoch"]), "Ongoing"] and line[-1] == "2"
    committed_only = txlog("transactions", "list", "--state", "CompleteCommit", "--json").json()["transactions"]
    assert tid not in {t["transactional_id"] for t in committed_only}
    assert "Invalid value for '--state'" in txlog("transactions", "list", "--state", "Open", expect=2).err

    described = txlog("transactions", "describe", tid).out
    assert "TransactionState:              Ongoing" in described
    assert f"TopicPartitions:               {topic}-0,{topic}-1" in described
    assert "TransactionTimeoutMs:          60000" in described
    with_events = txlog("transactions", "describe", tid, "--events", "--json").json()
    assert [(e["from_state"], e["to_state"]) for e in with_events["events"]] == [
        (None, "Empty"),
        ("Empty", "Ongoing"),
        ("Ongoing", "Ongoing"),
    ]
    assert ["VERSION", "FROM", "TO", "PRODUCER-ID", "EPOCH", "AGO", "REASON"] in rows(
        txlog("transactions", "describe", tid, "--events").out
    )

    gone = txlog("transactions", "describe", f"{topic}-nobody", expect=1)
    assert gone.err.startswith("error: TRANSACTIONAL_ID_NOT_FOUND (code ")


def test_find_hanging_and_abort_one_the_coordinator_still_has(txlog: Cli, api: httpx.Client, topic: str) -> None:
    assert api.post("/v1/topics", json={"name": topic, "partitions": 2}).status_code == 201
    produce(api, topic, 0, ["before"])
    tid = f"{topic}-slow"
    pe = open_transaction(api, tid, topic, {0: ["t1", "t2"], 1: ["t3"]})

    none = txlog("transactions", "find-hanging", "--topic", topic)
    assert none.out.strip() == "No hanging transactions (maximum transaction timeout 900000 ms)."
    # Judged against a maximum transaction timeout of 0 ms, the open transaction is hanging on both partitions.
    found = txlog("transactions", "find-hanging", "--topic", topic, "--max-transaction-timeout-ms", "0", "--json").json()
    assert found["max_transaction_timeout_ms"] == 0
    assert [
        (o["partition"], o["start_offset"], o["producer_id"], o["transactional_id"], o["coordinator_state"], o["hanging"])
        for o in found["open_transactions"]
    ] == [
        (0, 1, pe["producer_id"], tid, "Ongoing", ["open_too_long"]),
        (1, 0, pe["producer_id"], tid, "Ongoing", ["open_too_long"]),
    ]
    table = rows(
        txlog("transactions", "find-hanging", "--topic", topic, "--partition", "1", "--max-transaction-timeout-ms", "0").out
    )
    assert table[0][:5] == ["TOPIC", "PARTITION", "PRODUCER-ID", "EPOCH", "START-OFFSET"]
    assert len(table) == 2 and table[1][:5] == [topic, "1", str(pe["producer_id"]), str(pe["producer_epoch"]), "0"]
    assert table[1][-3:] == [tid, "Ongoing", "open_too_long"]

    # Aborted by its partition and start offset: the coordinator aborts it everywhere and fences the producer.
    aborted = txlog("transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "1", "--json").json()
    assert aborted["transactional_id"] == tid and aborted["marker_offset"] is None
    assert aborted["transaction"]["state"] == "CompleteAbort" and aborted["transaction"]["fence_reason"] == "aborted_by_operator"
    status = {p["partition"]: p for p in api.get(f"/v1/topics/{topic}").json()["partitions"]}
    assert all(p["last_stable_offset"] == p["high_watermark"] for p in status.values())
    assert (
        txlog("transactions", "find-hanging", "--topic", topic, "--max-transaction-timeout-ms", "0", "--json").json()[
            "open_transactions"
        ]
        == []
    )
    late = api.post(
        f"/v1/topics/{topic}/partitions/0/records",
        json={**pe, "base_sequence": 2, "transactional_id": tid, "records": [{"value": "late"}]},
    )
    assert late.status_code == 409 and late.json()["error"]["code"] == "PRODUCER_FENCED"

    nothing = txlog("transactions", "abort", "--topic", topic, "--partition", "0", expect=1)
    assert nothing.err.startswith("error: INVALID_TXN_STATE (code 48): No open transaction on")


def test_abort_by_transactional_id_and_its_usage(txlog: Cli, api: httpx.Client, topic: str) -> None:
    assert api.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code == 201
    tid = f"{topic}-tid"
    pe = open_transaction(api, tid, topic, {0: ["a"]})
    out = txlog("transactions", "abort", "--transactional-id", tid).out
    assert out.startswith(f"Aborted the transaction of {tid}: now CompleteAbort, producer id {pe['producer_id']} at epoch ")
    again = txlog("transactions", "abort", "--transactional-id", tid, expect=1)
    assert again.err.startswith("error: INVALID_TXN_STATE (code 48): ")
    assert "either --transactional-id or --topic" in txlog("transactions", "abort", expect=2).err
    assert (
        "either --transactional-id or --topic"
        in txlog("transactions", "abort", "--transactional-id", tid, "--topic", topic, expect=2).err
    )
    assert "--topic and --partition go together" in txlog("transactions", "abort", "--topic", topic, expect=2).err
    assert "--partition needs --topic" in txlog("transactions", "find-hanging", "--partition", "0", expect=2).err


def test_find_hanging_and_abort_one_its_coordinator_forgot(txlog: Cli, api: httpx.Client, cli_db: str, topic: str) -> None:
    """The shape of KAFKA-9144: the coordinator completed a transaction without writing its marker on
    one partition, whose last stable offset then stays behind for good. find-hanging names it and
    the abort by partition writes the missing ABORT marker."""
    assert api.post("/v1/topics", json={"name": topic, "partitions": 2}).status_code == 201
    tid = f"{topic}-lost"
    pe = open_transaction(api, tid, topic, {0: ["kept"], 1: ["lost-1", "lost-2"]})
    with psycopg.connect(cli_db, autocommit=True) as conn:  # the coordinator forgets partition 1
        conn.execute("DELETE FROM txlog.transaction_partitions WHERE transactional_id = %s AND partition = 1", (tid,))
    assert api.post(f"/v1/transactions/{tid}/end", json={**pe, "result": "commit"}).status_code == 200
    produce(api, topic, 1, ["after"])
    stuck = {p["partition"]: p for p in api.get(f"/v1/topics/{topic}").json()["partitions"]}[1]
    assert (stuck["last_stable_offset"], stuck["high_watermark"]) == (0, 3)

    found = txlog("transactions", "find-hanging", "--json").json()["open_transactions"]
    mine = [o for o in found if o["topic"] == topic]
    assert [(o["partition"], o["start_offset"], o["transactional_id"], o["coordinator_state"], o["hanging"]) for o in mine] == [
        (1, 0, tid, "CompleteCommit", ["not_ongoing_at_coordinator"])
    ]
    assert [topic, "1"] == next(r for r in rows(txlog("transactions", "find-hanging").out) if r[0] == topic)[:2]

    out = txlog("transactions", "abort", "--topic", topic, "--partition", "1", "--start-offset", "0").out
    assert out.strip() == (
        f"Wrote an ABORT marker at offset 3 on {topic}-1 for producer id {pe['producer_id']} "
        f"(epoch {pe['producer_epoch']}), ending its transaction from offset 0."
    )
    assert txlog("transactions", "find-hanging", "--topic", topic, "--json").json()["open_transactions"] == []
    fetched = api.get(f"/v1/topics/{topic}/partitions/1/records", params={"isolation_level": "read_committed"}).json()
    assert [r["value"] for r in fetched["records"]] == ["after"]  # the lost transaction's records are aborted
    assert fetched["last_stable_offset"] == fetched["high_watermark"] == 4
    kept = api.get(f"/v1/topics/{topic}/partitions/0/records", params={"isolation_level": "read_committed"}).json()
    assert [r["value"] for r in kept["records"]] == ["kept"]


def test_find_hanging_names_why_the_coordinator_will_not_end_it(txlog: Cli, api: httpx.Client, cli_db: str, topic: str) -> None:
    assert api.post("/v1/topics", json={"name": topic, "partitions": 2}).status_code == 201
    tid, orphan = f"{topic}-open", f"{topic}-orphan"
    pe = open_transaction(api, tid, topic, {0: ["in"], 1: ["out"]})
    orphan_pe = open_transaction(api, orphan, topic, {0: ["orphaned"]})
    with psycopg.connect(cli_db, autocommit=True) as conn:
        # The coordinator loses partition 1 of one transaction, and every trace of the other's producer id.
        conn.execute("DELETE FROM txlog.transaction_partitions WHERE transactional_id = %s AND partition = 1", (tid,))
        conn.execute("DELETE FROM txlog.producer_ids WHERE producer_id = %s", (orphan_pe["producer_id"],))

    found = txlog("transactions", "find-hanging", "--topic", topic, "--json").json()["open_transactions"]
    assert [(o["partition"], o["producer_id"], o["transactional_id"], o["hanging"]) for o in found] == [
        (0, orphan_pe["producer_id"], None, ["unknown_to_coordinator"]),
        (1, pe["producer_id"], tid, ["partition_not_in_transaction"]),
    ]
    everything = txlog("transactions", "find-hanging", "--topic", topic, "--max-transaction-timeout-ms", "0", "--json").json()
    assert [o["hanging"] for o in everything["open_transactions"]] == [
        ["open_too_long"],
        ["unknown_to_coordinator", "open_too_long"],
        ["partition_not_in_transaction", "open_too_long"],
    ]
    several = txlog("transactions", "abort", "--topic", topic, "--partition", "0", expect=1)
    assert several.err.startswith("error: INVALID_REQUEST (code ") and "2 open transactions on" in several.err

    # Each hanging one gets its ABORT marker on its partition alone; the coordinator's transaction goes on.
    for partition, producer_id in ((0, orphan_pe["producer_id"]), (1, pe["producer_id"])):
        r = txlog(
            "transactions", "abort", "--topic", topic, "--partition", str(partition), "--producer-id", str(producer_id), "--json"
        ).json()
        assert r["marker_offset"] is not None and r["transaction"] is None
    assert txlog("transactions", "find-hanging", "--topic", topic, "--json").json()["open_transactions"] == []
    assert api.get(f"/v1/transactions/{tid}").json()["state"] == "Ongoing"
    assert api.post(f"/v1/transactions/{tid}/end", json={**pe, "result": "commit"}).status_code == 200
    committed = {
        p: [
            r["value"]
            for r in api.get(f"/v1/topics/{topic}/partitions/{p}/records", params={"isolation_level": "read_committed"}).json()[
                "records"
            ]
        ]
        for p in (0, 1)
    }
    assert committed == {0: ["in"], 1: []}


def test_producers_describe(txlog: Cli, api: httpx.Client, topic: str) -> None:
    """kafka-transactions.sh describe-producers: an idempotent producer's state on the partition and
    a transactional one with the start of its open transaction."""
    assert api.post("/v1/topics", json={"name": topic, "partitions": 2}).status_code == 201
    assert txlog("producers", "describe", topic, "0").out.strip() == f"No active producers on {topic}-0."
    idem = api.post("/v1/producers", json={}).json()
    produce(
        api, topic, 0, ["a", "b", "c"], producer_id=idem["producer_id"], producer_epoch=idem["producer_epoch"], base_sequence=0
    )
    tx = open_transaction(api, f"{topic}-tid", topic, {0: ["open-1", "open-2"]})

    answer = txlog("producers", "describe", topic, "0", "--json").json()
    assert answer == api.get(f"/v1/topics/{topic}/partitions/0/producers").json()
    assert (answer["topic"], answer["partition"]) == (topic, 0)
    assert [
        (p["producer_id"], p["producer_epoch"], p["last_sequence"], p["current_txn_start_offset"]) for p in answer["producers"]
    ] == [(idem["producer_id"], idem["producer_epoch"], 2, None), (tx["producer_id"], tx["producer_epoch"], 1, 3)]
    assert all(p["last_timestamp_ms"] > 0 for p in answer["producers"])
    table = rows(txlog("producers", "describe", topic, "0").out)
    assert table[0] == ["PRODUCER-ID", "PRODUCER-EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP", "CURRENT-TRANSACTION-START-OFFSET"]
    assert [r[:3] + r[4:] for r in table[1:]] == [
        [str(idem["producer_id"]), str(idem["producer_epoch"]), "2", "-"],
        [str(tx["producer_id"]), str(tx["producer_epoch"]), "1", "3"],
    ]
    for partition in ("2", "99"):
        missing = txlog("producers", "describe", topic, partition, expect=1)
        assert missing.err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION (code 3): "), missing.err
    assert txlog("producers", "describe", f"{topic}-none", "0", expect=1).err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION")
