"""Every way in and out agrees: a real ``txlog serve`` and a real ``txlog kafka`` on one database.

- Records produced over the wire by confluent-kafka (idempotent, and a committed and an aborted
  transaction; binary keys, repeated and null headers) read the same over HTTP (read_committed and
  read_uncommitted, base64), in ``txlog.committed_records``, through Spark and on the admin pages.
- Records produced over HTTP (plain, idempotent, a committed and an aborted HTTP transaction) read
  the same through confluent-kafka and kafka-python consumers, read_committed, by ``assign``.
- The admin pages show a consumer group of Kafka clients: its coordinator, state, protocol, members
  and their assignments, committed offsets and lag; a gateway that stops answering is reported,
  in bounded time.
"""

from __future__ import annotations

import base64
import html as htmllib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import httpx
import psycopg
import pytest

from app.wire.kafka.messages import ApiKey
from tests.conftest import fresh_database
from tests.kafka.conftest import GatewayProcess
from tests.kafka.test_fetch import Rec, confluent_consume, kafka_python_consume
from tests.support import ROOT, ServerProcess, wait_until

T0 = 1_700_000_000_000
REPEATED = (("h", b"1"), ("h", b"2"), ("nul", None))


class Sent(NamedTuple):
    """A record as produced, where it landed, and whether a read_committed reader may see it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    committed: bool

    def rec(self) -> Rec:
        return Rec(self.offset, self.key, self.value, self.headers, self.timestamp)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def page_text(html: str) -> str:
    """The page's text, tags removed, whitespace collapsed and none left before punctuation."""
    return re.sub(r" ([,;:])", r"\1", re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", html))))


@pytest.fixture(scope="module")
def agree_db(pg_admin_url: str, template_db: str) -> Iterator[str]:
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


@pytest.fixture(scope="module")
def server(agree_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The HTTP server; no admin token: the admin pages are read-only and open."""
    log = tmp_path_factory.mktemp("agree-server") / "server.log"
    with ServerProcess(agree_db, log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def wire(agree_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("agree-gateway") / "gateway.log"
    env = {"TXLOG_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}
    with GatewayProcess(agree_db, env=env, log_path=log) as g:
        yield g


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def ok(r: httpx.Response) -> Any:
    assert r.status_code in (200, 201), f"{r.request.method} {r.request.url}: {r.status_code} {r.text[:2000]}"
    return r.json() if r.headers["content-type"].startswith("application/json") else r.text


def create_topic_over_the_wire(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures fail once it is collected
    futures = admin.create_topics([NewTopic(topic, partitions)], operation_timeout=10)
    futures[topic].result(timeout=30)


# -- the wire to everything else -------------------------------------------------------------------


def produce_over_the_wire(bootstrap: str, topic: str) -> list[Sent]:
    """Partition 0: three idempotent records, one committed, one aborted (each transaction followed
    by its marker), one idempotent record after them. Partition 1: two committed, one aborted."""
    from confluent_kafka import Producer

    sent: list[Sent] = []

    def produce(
        producer: Producer, partition: int, key: bytes | None, value: bytes | None, headers: tuple, ts: int, committed: bool
    ) -> None:
        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            sent.append(Sent(msg.partition(), msg.offset(), key, value, headers, ts, committed))

        producer.produce(
            topic, value, key, partition=partition, headers=list(headers) or None, timestamp=ts, on_delivery=delivered
        )

    idempotent = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    produce(idempotent, 0, b"\x00\x01bin\xff", b"idem-0", REPEATED, T0, True)
    produce(idempotent, 0, None, b"\xff\xfe not utf-8", (), T0 + 1, True)
    produce(idempotent, 0, b"k-2", b"idem-2", (("h", b"\x00\xff"),), T0 + 2, True)
    assert idempotent.flush(30) == 0

    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"agree-{topic}", "linger.ms": 5})
    txn.init_transactions(30)
    txn.begin_transaction()
    produce(txn, 0, b"\x10c", b"committed-p0", REPEATED, T0 + 10, True)
    produce(txn, 1, b"\x11c", b"committed-p1-a", (), T0 + 11, True)
    produce(txn, 1, b"\x12c", b"committed-p1-b", (("trace", b"t"),), T0 + 12, True)
    assert txn.flush(30) == 0
    txn.commit_transaction(30)
    txn.begin_transaction()
    produce(txn, 0, b"\x20a", b"aborted-p0", REPEATED, T0 + 20, False)
    produce(txn, 1, b"\x21a", b"aborted-p1", (), T0 + 21, False)
    assert txn.flush(30) == 0
    txn.abort_transaction(30)

    produce(idempotent, 0, b"\xffk-3", b"idem-3", (("nul", None),), T0 + 30, True)
    assert idempotent.flush(30) == 0
    return sorted(sent)


@pytest.fixture(scope="module")
def from_the_wire(wire: GatewayProcess) -> tuple[str, list[Sent]]:
    topic = f"agree-wire-{uuid.uuid4().hex[:8]}"
    create_topic_over_the_wire(wire.bootstrap, topic, 2)
    sent = produce_over_the_wire(wire.bootstrap, topic)
    # the log as laid out: partition 0 has markers at 4 and 6, partition 1 at 2 and 4
    assert [(s.partition, s.offset) for s in sent] == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 5), (0, 7), (1, 0), (1, 1), (1, 3)]
    return topic, sent


def http_fetch(http: httpx.Client, topic: str, partition: int, isolation_level: str) -> dict:
    return ok(
        http.get(
            f"/v1/topics/{topic}/partitions/{partition}/records",
            params={"offset": 0, "isolation_level": isolation_level, "encoding": "base64", "max_records": 1000},
        )
    )


@pytest.mark.parametrize("isolation_level", ["read_committed", "read_uncommitted"])
def test_wire_records_read_the_same_over_http(
    http: httpx.Client, from_the_wire: tuple[str, list[Sent]], isolation_level: str
) -> None:
    topic, sent = from_the_wire
    for partition, end in ((0, 8), (1, 5)):
        answer = http_fetch(http, topic, partition, isolation_level)
        got = [
            Sent(
                partition,
                r["offset"],
                unb64(r["key"]),
                unb64(r["value"]),
                tuple((h["key"], unb64(h["value"])) for h in r["header_list"]),
                r["timestamp_ms"],
                True,
            )
            for r in answer["records"]
        ]
        expected = [
            s._replace(committed=True)
            for s in sent
            if s.partition == partition and (s.committed or isolation_level == "read_uncommitted")
        ]
        assert got == expected
        assert (answer["high_watermark"], answer["last_stable_offset"], answer["next_offset"]) == (end, end, end)
        # the object form: the last value of each key, as text
        assert [r["headers"] for r in answer["records"]][:1] == ([{"h": "2", "nul": None}] if partition == 0 else [{}])


def test_wire_records_are_in_committed_records_and_the_aborted_are_not(
    agree_db: str, from_the_wire: tuple[str, list[Sent]]
) -> None:
    topic, sent = from_the_wire
    with psycopg.connect(agree_db) as conn:
        rows = conn.execute(
            'SELECT partition, "offset", key, value, header_keys, header_values, headers, '
            '(extract(epoch FROM "timestamp") * 1000)::bigint, producer_id '
            'FROM txlog.committed_records WHERE topic = %s ORDER BY partition, "offset"',
            (topic,),
        ).fetchall()
    got = [Sent(p, o, k, v, tuple(zip(hk or (), hv or ())), ts, True) for p, o, k, v, hk, hv, _, ts, _ in rows]
    assert got == [s for s in sent if s.committed]
    assert rows[0][6] == {"h": "2", "nul": None}
    assert all(pid is not None for *_, pid in rows)  # every record here came from an idempotent or transactional producer


def test_wire_records_read_the_same_in_spark(agree_db: str, from_the_wire: tuple[str, list[Sent]]) -> None:
    from spark.reader import read_topic
    from spark.session import spark_session

    topic, sent = from_the_wire
    spark = spark_session("txlog-agree", "local[1]", {"spark.sql.shuffle.partitions": "2"})
    try:
        df = read_topic(spark, agree_db, topic).selectExpr("*", "unix_millis(timestamp) AS ts")
        rows = sorted(
            (r["partition"], r["offset"], None if r["key"] is None else bytes(r["key"]), bytes(r["value"]), r["ts"], r["topic"])
            for r in df.collect()
        )
    finally:
        spark.stop()
    assert rows == [(s.partition, s.offset, s.key, s.value, s.timestamp, topic) for s in sent if s.committed]


def test_wire_records_show_on_the_admin_pages(http: httpx.Client, from_the_wire: tuple[str, list[Sent]]) -> None:
    topic, sent = from_the_wire
    overview = page_text(ok(http.get(f"/admin/topics/{topic}")))
    assert f"{topic}-0" in overview and f"{topic}-1" in overview

    def offsets(mode: str, partition: int) -> tuple[list[int], str]:
        html = ok(http.get(f"/admin/topics/{topic}/{partition}", params={"mode": mode}))
        return sorted(int(o) for o in re.findall(r'<td class="num off">(\d+)</td>', html)), html

    committed, html = offsets("read_committed", 0)
    assert committed == [s.offset for s in sent if s.partition == 0 and s.committed]
    text = page_text(html)
    assert b64(b"\x00\x01bin\xff") in text  # a binary key, shown in base64
    assert "idem-0" in text and "committed-p0" in text and "aborted-p0" not in text
    shown = re.findall(r'<span class="hdr">(.*?)</span>(?=<span class="hdr">|</td>)', html)
    assert shown[:3] == [
        "h=<b>1</b>",
        "h=<b>2</b>",
        'nul=<b><span class="null">null</span></b>',
    ]  # repeated keys in order, a null value
    everything, html = offsets("all", 0)
    assert everything == list(range(8))  # markers included
    assert html.count('<span class="tag aborted">aborted</span>') == 1
    assert "COMMIT marker" in html and "ABORT marker" in html
    uncommitted, html = offsets("read_uncommitted", 1)
    assert uncommitted == [s.offset for s in sent if s.partition == 1]
    assert "aborted-p1" in page_text(html)


# -- HTTP to the wire ------------------------------------------------------------------------------


def produce_over_http(http: httpx.Client, topic: str) -> list[Sent]:
    """Partition 0 of a one-partition topic: plain records, idempotent ones, a committed HTTP
    transaction, an aborted one, and a plain record after them."""
    sent: list[Sent] = []

    def post(records: list[tuple[bytes | None, bytes | None, tuple, int]], committed: bool = True, **producer: Any) -> None:
        body = {
            "encoding": "base64",
            "records": [
                {"key": b64(k), "value": b64(v), "headers": [{"key": hk, "value": b64(hv)} for hk, hv in h], "timestamp_ms": ts}
                for k, v, h, ts in records
            ],
            **producer,
        }
        answer = ok(http.post(f"/v1/topics/{topic}/partitions/0/records", json=body))
        assert answer["last_offset"] - answer["base_offset"] == len(records) - 1 and not answer["duplicate"]
        for i, (k, v, h, ts) in enumerate(records):
            sent.append(Sent(0, answer["base_offset"] + i, k, v, h, ts, committed))

    post([(b"\x00plain", b"plain-0", REPEATED, T0 + 100), (None, b"\xffplain-1", (), T0 + 101)])
    pid = ok(http.post("/v1/producers", json={}))
    post(
        [(b"\x01idem", b"idem-0", (("h", None),), T0 + 110), (b"\x02idem", None, (), T0 + 111)],
        producer_id=pid["producer_id"],
        producer_epoch=pid["producer_epoch"],
        base_sequence=0,
    )
    post(
        [(b"\x03idem", b"idem-2", REPEATED, T0 + 112)],
        producer_id=pid["producer_id"],
        producer_epoch=pid["producer_epoch"],
        base_sequence=2,
    )

    tid = f"agree-http-{topic}"
    txn = ok(http.post("/v1/producers", json={"transactional_id": tid}))
    post(
        [(b"\x04txn", b"committed-0", REPEATED, T0 + 120), (b"\x05txn", b"committed-1", (), T0 + 121)],
        transactional_id=tid,
        producer_id=txn["producer_id"],
        producer_epoch=txn["producer_epoch"],
        base_sequence=0,
    )
    txn = ok(http.post(f"/v1/transactions/{tid}/end", json={**txn, "result": "commit"}))
    assert txn["state"] == "CompleteCommit"
    post(
        [(b"\x06txn", b"aborted-0", REPEATED, T0 + 130)],
        committed=False,
        transactional_id=tid,
        producer_id=txn["producer_id"],
        producer_epoch=txn["producer_epoch"],
        base_sequence=0,
    )
    txn = ok(
        http.post(
            f"/v1/transactions/{tid}/end",
            json={"producer_id": txn["producer_id"], "producer_epoch": txn["producer_epoch"], "result": "abort"},
        )
    )
    assert txn["state"] == "CompleteAbort"
    post([(b"\x07last", b"plain-last", (("nul", None),), T0 + 140)])
    return sent


@pytest.fixture(scope="module")
def from_http(server: ServerProcess) -> tuple[str, list[Sent]]:
    topic = f"agree-http-{uuid.uuid4().hex[:8]}"
    with server.client() as http:
        ok(http.post("/v1/topics", json={"name": topic, "partitions": 1}))
        sent = produce_over_http(http, topic)
        # plain 0-1, idempotent 2-4, committed 5-6, COMMIT 7, aborted 8, ABORT 9, plain 10
        assert [s.offset for s in sent] == [0, 1, 2, 3, 4, 5, 6, 8, 10]
        status = ok(http.get(f"/v1/topics/{topic}"))["partitions"][0]
        assert (status["high_watermark"], status["last_stable_offset"]) == (11, 11)
    return topic, sent


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_http_records_read_the_same_over_the_wire_read_committed(
    wire: GatewayProcess, from_http: tuple[str, list[Sent]], client: str
) -> None:
    topic, sent = from_http
    expected = [s.rec() for s in sent if s.committed]
    if client == "confluent":
        got = confluent_consume(
            wire.bootstrap, topic, 0, 0, len(expected) + 1, timeout=4, **{"isolation.level": "read_committed"}
        )
    else:
        got = kafka_python_consume(wire.bootstrap, topic, 0, 0, len(expected) + 1, timeout=4, isolation_level="read_committed")
    # exactly these: the aborted record is absent, the markers skipped, nothing after the last
    assert got == expected


# -- consumer groups on the admin pages --------------------------------------------------------------


def group_served(wire: GatewayProcess) -> bool:
    with wire.connect() as raw:
        served = {k.api_key for k in raw.request(ApiKey.ApiVersions, 0).api_keys}
    return {ApiKey.JoinGroup, ApiKey.SyncGroup, ApiKey.ListGroups, ApiKey.DescribeGroups} <= served


def consumer_group(bootstrap: str, group: str, topic: str, clients: list[str]) -> list[Any]:
    """Consumers of ``group`` subscribed to ``topic``, polled in turn until every one has its
    partitions and the assignments cover the topic."""
    from confluent_kafka import Consumer

    consumers = [
        Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": client,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
            }
        )
        for client in clients
    ]
    for c in consumers:
        c.subscribe([topic])

    def settled() -> bool:
        for c in consumers:
            c.poll(0.1)
        return all(c.assignment() for c in consumers) and sum(len(c.assignment()) for c in consumers) == 2

    wait_until(settled, 60, 0, f"{len(clients)} consumers of {group} to be assigned")
    return consumers


def test_a_topic_grown_over_the_wire_http_and_the_cli_has_its_new_partitions_everywhere(
    http: httpx.Client, wire: GatewayProcess, server: ServerProcess
) -> None:
    """CreatePartitions through confluent-kafka's and kafka-python's admin clients and raw frames,
    ``POST /v1/topics/{t}/partitions`` and ``txlog topics alter --partitions``: grow only,
    validate_only, assignments checked as Kafka checks them; the new partitions take records over
    the wire and read back over HTTP."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewPartitions
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewPartitions as KNewPartitions
    from kafka.errors import InvalidPartitionsError

    topic = f"agree-grow-{uuid.uuid4().hex[:8]}"
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 2}))

    def count() -> int:
        return len(ok(http.get(f"/v1/topics/{topic}"))["partitions"])

    admin = AdminClient({"bootstrap.servers": wire.bootstrap})
    admin.create_partitions([NewPartitions(topic, 6)], validate_only=True)[topic].result(30)
    assert count() == 2
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    assert count() == 3
    kp = KafkaAdminClient(bootstrap_servers=wire.bootstrap)
    try:
        with pytest.raises(InvalidPartitionsError):
            kp.create_partitions({topic: KNewPartitions(2)})  # never shrunk
        kp.create_partitions({topic: KNewPartitions(4)})
    finally:
        kp.close()
    assert count() == 4
    with wire.connect() as raw:

        def grow(entries: list[dict], validate_only: bool = False) -> list[tuple[str, str]]:
            answer = raw.request(
                ApiKey.CreatePartitions, 3, {"topics": entries, "timeout_ms": 10_000, "validate_only": validate_only}
            )
            return [(r.name, r.error_code) for r in answer.results]

        invalid = 39  # INVALID_REPLICA_ASSIGNMENT
        assert grow([{"name": topic, "count": 6, "assignments": [{"broker_ids": [wire.node_id]}]}]) == [(topic, invalid)]
        assert grow([{"name": topic, "count": 5, "assignments": [{"broker_ids": [wire.node_id + 7]}]}]) == [(topic, invalid)]
        assert grow([{"name": topic, "count": 5, "assignments": [{"broker_ids": [wire.node_id, wire.node_id]}]}]) == [
            (topic, invalid)
        ]
        assert grow([{"name": "no-such-topic", "count": 5, "assignments": None}]) == [("no-such-topic", 3)]
        assert grow([{"name": topic, "count": 5, "assignments": None}] * 2) == [(topic, 42), (topic, 42)]
        assert grow([{"name": topic, "count": 5, "assignments": [{"broker_ids": [wire.node_id]}]}]) == [(topic, 0)]
    assert ok(http.post(f"/v1/topics/{topic}/partitions", json={"count": 6})) == {"name": topic, "partitions": 6}
    again = http.post(f"/v1/topics/{topic}/partitions", json={"count": 6})
    assert (again.status_code, again.json()["error"]["code"]) == (400, "INVALID_PARTITIONS")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
    run = subprocess.run(
        [sys.executable, "-m", "app.cli", "topics", "alter", topic, "--partitions", "7"],
        cwd=ROOT,
        env={**env, "TXLOG_URL": server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout.strip()) == (0, f"Topic {topic} now has 7 partition(s)."), run.stderr
    assert count() == 7
    producer = Producer({"bootstrap.servers": wire.bootstrap, "enable.idempotence": True})
    producer.produce(topic, b"on-the-new-partition", partition=6)
    assert producer.flush(30) == 0
    records = ok(http.get(f"/v1/topics/{topic}/partitions/6/records", params={"offset": 0}))["records"]
    assert [r["value"] for r in records] == ["on-the-new-partition"]


def test_a_group_deleted_over_http_and_the_cli_is_asked_of_its_coordinator(
    http: httpx.Client, wire: GatewayProcess, server: ServerProcess
) -> None:
    """``DELETE /v1/groups/{g}`` and ``txlog groups delete`` ask the gateway coordinating the group:
    refused while Kafka consumers are its members, done once they left, with its offsets; then gone
    from the HTTP API and the wire alike."""
    from confluent_kafka import TopicPartition

    topic, group, simple = (f"agree-{name}-{uuid.uuid4().hex[:8]}" for name in ("del", "members", "simple"))
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 2}))
    consumers = consumer_group(wire.bootstrap, group, topic, ["agree-del-a", "agree-del-b"])
    try:
        consumers[0].commit(offsets=[TopicPartition(topic, p, 0) for p in (0, 1)], asynchronous=False)
        refused = http.delete(f"/v1/groups/{group}")
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "NON_EMPTY_GROUP")
    finally:
        for c in consumers:
            c.close()  # they leave the group
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
    run = subprocess.run(
        [sys.executable, "-m", "app.cli", "groups", "delete", group],
        cwd=ROOT,
        env={**env, "TXLOG_URL": server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout.strip()) == (0, f"Deleted consumer group {group}."), run.stderr
    ok(http.post(f"/v1/groups/{simple}/offsets", json={"offsets": [{"topic": topic, "partition": 1, "offset": 0}]}))
    assert ok(http.delete(f"/v1/groups/{simple}")) == {"group_id": simple, "deleted": True}
    listed = {g["group_id"] for g in ok(http.get("/v1/groups"))["groups"]}
    assert not {group, simple} & listed
    gone = http.delete(f"/v1/groups/{group}")
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "GROUP_ID_NOT_FOUND")
    with wire.connect() as raw:
        described = raw.request(ApiKey.DescribeGroups, 5, {"groups": [group, simple]}).groups
    assert [(g.group_id, g.group_state) for g in described] == [(group, "Dead"), (simple, "Dead")]


def test_the_admin_pages_show_a_kafka_consumer_group_and_a_gateway_that_stops_answering(
    http: httpx.Client, wire: GatewayProcess, agree_db: str, tmp_path: Path
) -> None:
    if not group_served(wire):
        pytest.fail("the gateway does not serve JoinGroup, SyncGroup, ListGroups and DescribeGroups yet")
    from confluent_kafka import TopicPartition

    topic = f"agree-group-{uuid.uuid4().hex[:8]}"
    group = f"agree-{uuid.uuid4().hex[:8]}"
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 2}))
    for partition, n in ((0, 5), (1, 3)):
        ok(
            http.post(
                f"/v1/topics/{topic}/partitions/{partition}/records", json={"records": [{"value": f"v{i}"} for i in range(n)]}
            )
        )
    consumers = consumer_group(wire.bootstrap, group, topic, ["agree-a", "agree-b"])
    try:
        owner = {tp.partition: c for c in consumers for tp in c.assignment()}
        owner[0].commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)  # lag 3 on partition 0; none committed on 1
        by_client = {"agree-a": consumers[0], "agree-b": consumers[1]}
        parts = {client: sorted(tp.partition for tp in c.assignment()) for client, c in by_client.items()}
        assert sorted(parts.values()) == [[0], [1]]

        listing = page_text(ok(http.get("/admin/kafka-groups")))
        assert f"{group} Stable consumer · range {wire.node_id} agree-a, agree-b 2 3" in listing, listing
        assert "answered in" in listing and "unreachable" not in listing

        detail = page_text(ok(http.get(f"/admin/kafka-groups/{group}")))
        assert "State Stable" in detail and "Protocol type consumer" in detail and "Protocol range" in detail
        assert f"Coordinator node {wire.node_id}" in detail and "Members 2" in detail and "Lag (to LSO) 3" in detail
        for client, assigned in parts.items():
            lag = 3 if assigned == [0] else 0
            assert re.search(rf"{client} /?127\.0\.0\.1 {client}-\S+ {topic} {topic}: {assigned[0]} {lag} ", detail), detail
        a0 = "agree-a" if parts["agree-a"] == [0] else "agree-b"
        a1 = "agree-b" if a0 == "agree-a" else "agree-a"
        assert re.search(rf"{topic}-0 {a0} /?127\.0\.0\.1 2 5 5 3 ", detail), detail
        assert re.search(rf"{topic}-1 {a1} /?127\.0\.0\.1 — 3 3 nothing committed ", detail), detail
    finally:
        for c in consumers:
            c.close()

    # A frozen gateway (SIGSTOP: connections are accepted by the kernel, never answered) is
    # reported after the admin client's timeout; the page does not hang on it.
    assert wire.proc is not None
    os.killpg(wire.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        frozen = page_text(ok(http.get("/admin/kafka-groups")))
        assert time.monotonic() - started < 6
    finally:
        os.killpg(wire.proc.pid, signal.SIGCONT)
    assert f"Node {wire.node_id} (" in frozen and "is unreachable: no answer to ApiVersions within 2 s" in frozen, frozen

    # A gateway killed outright stays in the registry until its lease lapses: refused at once.
    with GatewayProcess(agree_db, node_id=wire.node_id + 1, log_path=tmp_path / "second.log") as second:

        def answering() -> bool:
            html = ok(http.get("/admin/kafka-groups"))
            return f"127.0.0.1:{second.port}" in html and "unreachable" not in html

        wait_until(answering, 30, 0.2, "the second gateway to answer on the page")
        second.stop(signal.SIGKILL)
        started = time.monotonic()
        killed = page_text(ok(http.get("/admin/kafka-groups")))
        assert time.monotonic() - started < 3
    assert f"Node {second.node_id} (127.0.0.1:{second.port}) is unreachable: cannot connect: Connection refused" in killed, killed
