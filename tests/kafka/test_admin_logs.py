"""DeleteRecords, DescribeLogDirs and OffsetForLeaderEpoch on the wire, through real clients and raw
frames, agreeing with the HTTP API and with Fetch.

- DeleteRecords through confluent-kafka's, kafka-python's and aiokafka's admin clients and raw
  frames (v0-2): the low watermark answered is the log start the HTTP API, ListOffsets and Fetch
  then name; -1 is the log end (the last stable offset while a transaction is open), past it
  OFFSET_OUT_OF_RANGE, an unknown partition UNKNOWN_TOPIC_OR_PARTITION.
- DescribeLogDirs through kafka-python's admin client and raw frames (v0-4): one log directory,
  "/txlog", each partition sized as retention.bytes sizes it (``retention.log_sizes``), smaller
  once records are deleted. confluent-kafka has no DescribeLogDirs (librdkafka does not send it).
- OffsetForLeaderEpoch over raw frames (v0-4) by Kafka's rule, and as consumers use it: a
  confluent-kafka and a kafka-python consumer resuming from an offset committed with its leader
  epoch go on exactly there, confluent-kafka after validating it with the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Iterator

import httpx
import pytest

from app.services import Broker, retention
from app.wire.kafka.messages import ApiKey
from tests.conftest import make_broker
from tests.kafka import test_agree
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.kafka.test_fetch import fetch_body, list_offsets_body

OUT_OF_RANGE, UNKNOWN, UNKNOWN_EPOCH, FENCED_EPOCH = 1, 3, 75, 74


# The HTTP server and the gateway on one database, as test_agree.py has them.
agree_db, server, wire, http, ok = test_agree.agree_db, test_agree.server, test_agree.wire, test_agree.http, test_agree.ok


@pytest.fixture(scope="module")
def broker(agree_db: str) -> Iterator[Broker]:
    b = make_broker(agree_db)
    yield b
    b.db.dispose()


def new_topic(http: httpx.Client, prefix: str, records: dict[int, list[str]]) -> str:
    """A topic with a partition per entry of ``records``, each holding those values (keyless)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    ok(http.post("/v1/topics", json={"name": topic, "partitions": len(records)}))
    for partition, values in records.items():
        if values:
            ok(http.post(f"/v1/topics/{topic}/partitions/{partition}/records", json={"records": [{"value": v} for v in values]}))
    return topic


def log_start(http: httpx.Client, topic: str, partition: int) -> int:
    return ok(http.get(f"/v1/topics/{topic}"))["partitions"][partition]["log_start_offset"]


def delete(raw: RawConnection, version: int, topic: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    answer = raw.request(
        ApiKey.DeleteRecords,
        version,
        {
            "topics": [{"name": topic, "partitions": [{"partition_index": p, "offset": o} for p, o in offsets]}],
            "timeout_ms": 10_000,
        },
    )
    assert [t.name for t in answer.topics] == [topic]
    return [(p.partition_index, p.low_watermark, p.error_code) for p in answer.topics[0].partitions]


VALUES = [f"v{i:02d}" for i in range(10)]  # three bytes each


# -- DeleteRecords -------------------------------------------------------------------------------


def test_delete_records_through_each_client_and_raw_frames_agree_with_http_and_fetch(
    http: httpx.Client, wire: GatewayProcess
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
    from aiokafka.structs import TopicPartition as ATopicPartition
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient
    from kafka.errors import OffsetOutOfRangeError

    from kafka import TopicPartition as KTopicPartition

    topic = new_topic(http, "dr", {0: VALUES, 1: VALUES})

    admin = AdminClient({"bootstrap.servers": wire.bootstrap})
    done = admin.delete_records([TopicPartition(topic, 0, 2)], operation_timeout=10)
    assert [f.result(30).low_watermark for f in done.values()] == [2]
    assert log_start(http, topic, 0) == 2
    past = admin.delete_records([TopicPartition(topic, 1, 11)], operation_timeout=10)
    with pytest.raises(KafkaException) as info:
        next(iter(past.values())).result(30)
    assert info.value.args[0].code() == OUT_OF_RANGE

    kp = KafkaAdminClient(bootstrap_servers=wire.bootstrap)
    try:
        answered = kp.delete_records({KTopicPartition(topic, 0): 4}, timeout_ms=10_000)
        assert {tp: (r["low_watermark"], r["error_code"]) for tp, r in answered.items()} == {KTopicPartition(topic, 0): (4, 0)}
        with pytest.raises(OffsetOutOfRangeError):
            kp.delete_records({KTopicPartition(topic, 1): 11})
    finally:
        kp.close()
    assert log_start(http, topic, 0) == 4

    async def aiokafka_delete() -> dict:
        client = AIOKafkaAdminClient(bootstrap_servers=wire.bootstrap)
        await client.start()
        try:
            return await client.delete_records({ATopicPartition(topic, 0): RecordsToDelete(6)}, timeout_ms=10_000)
        finally:
            await client.close()

    assert asyncio.run(aiokafka_delete()) == {ATopicPartition(topic, 0): 6}
    assert log_start(http, topic, 0) == 6

    with wire.connect() as raw:
        for version in (0, 1, 2):
            # below the log start: nothing moves, the low watermark is the log start
            assert delete(raw, version, topic, [(0, 5), (7, 1)]) == [(0, 6, 0), (7, -1, UNKNOWN)]
        assert delete(raw, 2, topic, [(0, 11), (1, -2)]) == [(0, -1, OUT_OF_RANGE), (1, -1, OUT_OF_RANGE)]
        assert delete(raw, 1, f"{topic}-none", [(0, 1)]) == [(0, -1, UNKNOWN)]
        assert delete(raw, 2, topic, [(0, 7), (1, 3)]) == [(0, 7, 0), (1, 3, 0)]
        assert delete(raw, 0, topic, [(0, -1)]) == [(0, 10, 0)]  # the high watermark
        assert delete(raw, 2, topic, [(0, 10)]) == [(0, 10, 0)]  # at the end: the log is empty

        # the HTTP API moves it, the wire sees it
        assert (
            ok(http.post(f"/v1/topics/{topic}/partitions/1/delete-records", json={"before_offset": 8}))["log_start_offset"] == 8
        )
        assert delete(raw, 2, topic, [(1, 5)]) == [(1, 8, 0)]
        assert [log_start(http, topic, p) for p in (0, 1)] == [10, 8]
        listed = raw.request(ApiKey.ListOffsets, 7, list_offsets_body([(topic, 0, -2), (topic, 1, -2)]))
        assert [(p.error_code, p.offset) for p in listed.topics[0].partitions] == [(0, 10), (0, 8)]
        fetched = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 0, 9), (topic, 1, 8)]))
        below, at = fetched.responses[0].partitions
        assert (below.error_code, below.log_start_offset, below.high_watermark) == (OUT_OF_RANGE, 10, 10)
        assert (at.error_code, at.log_start_offset, at.high_watermark) == (0, 8, 10) and at.records
    records = ok(http.get(f"/v1/topics/{topic}/partitions/1/records", params={"offset": 8}))["records"]
    assert [r["offset"] for r in records] == [8, 9]


def test_delete_records_to_the_end_stops_at_an_open_transaction(http: httpx.Client, wire: GatewayProcess) -> None:
    """-1 is the last stable offset while a transaction is open (so it keeps its records), and an
    offset past it is OFFSET_OUT_OF_RANGE; once the transaction ends, the high watermark."""
    from confluent_kafka import Producer

    topic = new_topic(http, "dr-txn", {0: VALUES[:3]})
    producer = Producer({"bootstrap.servers": wire.bootstrap, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    assert producer.flush(30) == 0
    with wire.connect() as raw:
        assert delete(raw, 2, topic, [(0, 4)]) == [(0, -1, OUT_OF_RANGE)]
        assert delete(raw, 2, topic, [(0, -1)]) == [(0, 3, 0)]
        producer.commit_transaction(30)
        assert delete(raw, 2, topic, [(0, -1)]) == [(0, 5, 0)]  # past the record and its marker
    assert log_start(http, topic, 0) == 5


# -- DescribeLogDirs -----------------------------------------------------------------------------


def test_describe_log_dirs_sizes_each_partition_as_retention_does(
    http: httpx.Client, wire: GatewayProcess, broker: Broker
) -> None:
    from kafka.admin import KafkaAdminClient

    topic = new_topic(http, "dirs", {0: VALUES, 1: ["vvvv"] * 5, 2: []})
    expected = {0: 30, 1: 20, 2: 0}
    assert {s.partition: s.size_bytes for s in retention.log_sizes(broker, [topic])} == expected

    def described(raw: RawConnection, version: int, topics: Any) -> tuple[Any, dict[int, tuple[int, int, bool]]]:
        answer = raw.request(ApiKey.DescribeLogDirs, version, {"topics": topics})
        (d,) = answer.results
        mine = [t for t in d.topics if t.name == topic]
        assert len(mine) <= 1
        sizes = {p.partition_index: (p.partition_size, p.offset_lag, p.is_future_key) for t in mine for p in t.partitions}
        return answer, sizes

    with wire.connect() as raw:
        for version in range(5):
            answer, sizes = described(raw, version, None)
            d = answer.results[0]
            assert (d.error_code, d.log_dir) == (0, "/txlog")
            assert sizes == {p: (n, 0, False) for p, n in expected.items()}
            if version >= 3:
                assert answer.error_code == 0
            if version >= 4:
                assert (d.total_bytes, d.usable_bytes) == (-1, -1)
        # asked by topic: only those partitions, and one that does not exist left out
        _, sizes = described(raw, 4, [{"topic": topic, "partitions": [1, 7]}, {"topic": f"{topic}-none", "partitions": [0]}])
        assert sizes == {1: (20, 0, False)}
        answer, _ = described(raw, 2, [{"topic": f"{topic}-none", "partitions": [0]}])
        assert answer.results[0].topics == []
        answer, _ = described(raw, 3, [])  # no topic asked: none described
        assert answer.results[0].topics == []

        assert delete(raw, 2, topic, [(0, 4)]) == [(0, 4, 0)]
        _, sizes = described(raw, 1, [{"topic": topic, "partitions": [0, 1, 2]}])
        assert sizes == {0: (18, 0, False), 1: (20, 0, False), 2: (0, 0, False)}

    kp = KafkaAdminClient(bootstrap_servers=wire.bootstrap)
    try:
        (by_broker,) = kp.describe_log_dirs({topic: [0, 1, 2]})
        assert by_broker["broker"] == wire.node_id
        (d,) = by_broker["log_dirs"]
        assert (d["error_code"], d["log_dir"]) == (0, "/txlog")
        got = {p["partition_index"]: p["partition_size"] for t in d["topics"] for p in t["partitions"]}
        assert got == {0: 18, 1: 20, 2: 0}
    finally:
        kp.close()
    assert {s.partition: s.size_bytes for s in retention.log_sizes(broker, [topic])} == {0: 18, 1: 20, 2: 0}


# -- OffsetForLeaderEpoch ------------------------------------------------------------------------


def epoch_ends(
    raw: RawConnection, version: int, topic: str, asked: list[tuple[int, int, int]]
) -> list[tuple[int, int, int, int]]:
    """(partition, error, leader epoch, end offset) for each (partition, current leader epoch, leader epoch)."""
    answer = raw.request(
        ApiKey.OffsetForLeaderEpoch,
        version,
        {
            "replica_id": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {"partition": p, "current_leader_epoch": current, "leader_epoch": epoch} for p, current, epoch in asked
                    ],
                }
            ],
        },
    )
    assert [t.topic for t in answer.topics] == [topic]
    return [
        (p.partition, p.error_code, p.leader_epoch if version >= 1 else -1, p.end_offset) for p in answer.topics[0].partitions
    ]


def test_offset_for_leader_epoch_raw_every_version(http: httpx.Client, wire: GatewayProcess) -> None:
    topic = new_topic(http, "epochs", {0: VALUES, 1: []})
    with wire.connect() as raw:
        metadata = raw.request(ApiKey.Metadata, 12, {"topics": [{"name": topic}]})
        assert {p.leader_epoch for p in metadata.topics[0].partitions} == {0}
        for version in range(5):
            current = 0 if version >= 2 else -1
            got = epoch_ends(
                raw, version, topic, [(0, current, 0), (1, current, 0), (0, current, 1), (0, current, -1), (9, current, 0)]
            )
            epoch = 0 if version >= 1 else -1
            assert got == [(0, 0, epoch, 10), (1, 0, epoch, 0), (0, 0, -1, -1), (0, 0, -1, -1), (9, UNKNOWN, -1, -1)]
        # the client's current leader epoch is fenced: newer than the leader's, or older
        assert epoch_ends(raw, 2, topic, [(0, 1, 0), (0, -1, 0), (0, -3, 0)]) == [
            (0, UNKNOWN_EPOCH, -1, -1),
            (0, 0, 0, 10),
            (0, FENCED_EPOCH, -1, -1),
        ]
        assert delete(raw, 2, topic, [(0, 6)]) == [(0, 6, 0)]
        assert epoch_ends(raw, 4, topic, [(0, 0, 0)]) == [(0, 0, 0, 10)]  # the end, not the start, moves nothing
        assert epoch_ends(raw, 3, f"{topic}-none", [(0, 0, 0)]) == [(0, UNKNOWN, -1, -1)]


class Lines(logging.Handler):
    """The messages logged to it, as text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _commit_at(wire: GatewayProcess, topic: str, group: str, n: int) -> None:
    """A confluent-kafka consumer of ``group`` reads ``n`` records of partition 0 and commits after
    them, with the leader epoch of the last one read."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": wire.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        read = []
        deadline = time.monotonic() + 30
        while len(read) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                read.append(msg)
        assert [m.offset() for m in read] == list(range(n))
        assert read[-1].leader_epoch() == 0
        consumer.commit(message=read[-1], asynchronous=False)
    finally:
        consumer.close()


def test_consumers_resume_at_an_offset_committed_with_its_leader_epoch_after_validating_it(
    http: httpx.Client, wire: GatewayProcess
) -> None:
    """An offset committed by confluent-kafka carries its record's leader epoch (kept by the
    gateway, answered by OffsetFetch). A consumer resumes exactly there; librdkafka validates a
    position with a leader epoch it seeks to with OffsetForLeaderEpoch v2 (KIP-320) before
    fetching, and the gateway's answer (the epoch ends at the log end, past the position) keeps
    the position: no truncation, no reset, the same records."""
    from confluent_kafka import Consumer, TopicPartition

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    topic = new_topic(http, "resume", {0: VALUES})
    group = f"{topic}-group"
    _commit_at(wire, topic, group, 4)
    with wire.connect() as raw:
        fetched = raw.request(
            ApiKey.OffsetFetch,
            9,
            {
                "groups": [
                    {
                        "group_id": group,
                        "member_id": None,
                        "member_epoch": -1,
                        "topics": [{"name": topic, "partition_indexes": [0]}],
                    }
                ],
                "require_stable": False,
            },
        )
        (p,) = fetched.groups[0].topics[0].partitions
        assert (p.committed_offset, p.committed_leader_epoch, p.error_code) == (4, 0, 0)

    # confluent-kafka resumes at the committed offset, and validates a position (with its leader
    # epoch) it seeks to, as after a rebalance or a leader change: its debug log shows the request
    # sent, the gateway's answer and the validation
    lines = Lines()
    logger = logging.getLogger(f"test.rdkafka.{topic}")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(lines)
    consumer = Consumer(
        {
            "bootstrap.servers": wire.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "enable.partition.eof": False,
            "debug": "fetch,protocol",
            "logger": logger,
        }
    )

    def next_message() -> Any:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                return msg
        raise AssertionError("no message")

    try:
        consumer.assign([TopicPartition(topic, 0)])  # from the committed offset
        msg = next_message()
        assert (msg.offset(), msg.value(), msg.leader_epoch()) == (4, VALUES[4].encode(), 0)
        (committed,) = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        assert (committed.offset, committed.leader_epoch) == (4, 0)
        assert "OffsetForLeaderEpochRequest" not in "\n".join(lines.lines)
        consumer.seek(committed)
        msg = next_message()
        assert (msg.offset(), msg.value()) == (4, VALUES[4].encode())
        assert next_message().offset() == 5
    finally:
        consumer.close()
    text = "\n".join(lines.lines)
    assert "Sent OffsetForLeaderEpochRequest (v2" in text, text[-5000:]
    assert "Received OffsetForLeaderEpochResponse (v2" in text
    assert "offset and epoch validation succeeded: broker end offset 10 (offset leader epoch 0)" in text
    assert "truncation" not in text.lower()

    # kafka-python resumes at the committed offset too; it validates a position only once the
    # leader's epoch is past the position's, which never happens here (one epoch)
    seen = Lines()
    fetcher = logging.getLogger("kafka.consumer.fetcher")
    level = fetcher.level
    fetcher.setLevel(logging.DEBUG)
    fetcher.addHandler(seen)
    kc = KafkaConsumer(bootstrap_servers=wire.bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="latest")
    try:
        kc.assign([KTopicPartition(topic, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = [r for rs in kc.poll(timeout_ms=200).values() for r in rs]
        assert [(r.offset, r.value) for r in got][:1] == [(4, VALUES[4].encode())]
    finally:
        kc.close()
        fetcher.removeHandler(seen)
        fetcher.setLevel(level)
    assert not any("Truncation detected" in line for line in seen.lines), seen.lines
