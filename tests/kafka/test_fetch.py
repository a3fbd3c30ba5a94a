"""Fetch and ListOffsets against a real ``txlog kafka`` on a real PostgreSQL: records produced by
confluent-kafka (every compression) or written through txlog's own services, consumed with
confluent-kafka, kafka-python and aiokafka by ``assign`` (no group), read_committed and
read_uncommitted, long-polling; plus raw frames for what the clients do not show (the aborted
transactions list, a null list for read_uncommitted, every partition answered, batch base offsets)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any, NamedTuple

import psycopg
import pytest

from api.kafka.handlers import fetch as fetch_handler
from api.kafka.handlers.fetch import _batches_within
from app.domain.log import PartitionStatus, StoredRecord
from app.domain.records import NewRecord
from app.errors import ErrorCode
from app.services import Broker, topics
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services.produce import ProduceRequest
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.records.batch import HEADER_SIZE, RecordBatch
from app.wire.kafka.records.decode import decode_batches
from app.wire.kafka.records.encode import batch_runs, encode_records
from tests.conftest import make_broker
from tests.integration.test_transactions import Producer
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.support import wait_until

T0 = 1_700_000_000_000
HEADERS = (("h", b"\x00\xff"), ("h", None), ("trace", b"t-1"))
UNKNOWN = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.kafka_code
OUT_OF_RANGE = ErrorCode.OFFSET_OUT_OF_RANGE.kafka_code
INVALID_REQUEST = ErrorCode.INVALID_REQUEST.kafka_code
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


class Rec(NamedTuple):
    """A consumed record as every client can tell it."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


@pytest.fixture
def topic(store: Broker) -> str:
    name = f"f-{uuid.uuid4().hex[:10]}"
    topics.create_topic(store, name, 2)
    return name


def write(
    store: Broker, topic: str, partition: int, *values: str, ts: int = T0, headers: Any = (), key: bytes | None = None
) -> int:
    """Plain records through the produce service, one batch: its base offset."""
    batch = [NewRecord(key, v.encode(), headers, ts + i) for i, v in enumerate(values)]
    return produce_service.produce(store, topic, partition, ProduceRequest(batch)).base_offset


def transactions_log(store: Broker, topic: str) -> Producer:
    """Partition 0: plain 0, aborted 1-2, ABORT 3, committed 4-5, COMMIT 6, plain 7, aborted 8,
    ABORT 9 — one producer at one epoch, as Kafka clients before transactions V2 keep it."""
    write(store, topic, 0, "plain-0")
    p = Producer(store, f"tx-{topic}", transaction_version=1)
    p.send(topic, 0, "aborted-1", "aborted-2")
    p.abort()
    p.send(topic, 0, "committed-4", "committed-5")
    p.commit()
    write(store, topic, 0, "plain-7")
    p.send(topic, 0, "aborted-8")
    p.abort()
    return p


# -- clients -------------------------------------------------------------------------------------


def confluent_consume(
    bootstrap: str, topic: str, partition: int, offset: int, n: int, timeout: float = 20, **conf: Any
) -> list[Rec]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "assign-only",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **conf,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        got: list[Rec] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(Rec(msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ()), msg.timestamp()[1]))
        return got
    finally:
        consumer.close()


def kafka_python_consumer(bootstrap: str, **conf: Any) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **conf)


def kafka_python_consume(
    bootstrap: str, topic: str, partition: int, offset: int, n: int, timeout: float = 20, **conf: Any
) -> list[Rec]:
    from kafka import TopicPartition

    consumer = kafka_python_consumer(bootstrap, **conf)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        got: list[Rec] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                got.extend(Rec(m.offset, m.key, m.value, tuple(m.headers), m.timestamp) for m in batch)
        return got
    finally:
        consumer.close()


def aiokafka_consume(
    bootstrap: str, topic: str, partition: int, offset: int, n: int, timeout: float = 20, **conf: Any
) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> list[Rec]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **conf)
        await consumer.start()
        try:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, offset)
            got: list[Rec] = []
            deadline = time.monotonic() + timeout
            while len(got) < n and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    got.extend(Rec(m.offset, m.key, m.value, tuple(m.headers), m.timestamp) for m in batch)
            return got
        finally:
            await consumer.stop()

    return asyncio.run(run())


CONSUMERS = {"confluent": confluent_consume, "kafka-python": kafka_python_consume, "aiokafka": aiokafka_consume}
ISOLATION = {
    "confluent": lambda level: {"isolation.level": level},
    "kafka-python": lambda level: {"isolation_level": level},
    "aiokafka": lambda level: {"isolation_level": level},
}


def confluent_produce(
    bootstrap: str, topic: str, items: list[tuple[int, bytes | None, bytes | None, Any, int]], **conf: Any
) -> None:
    """(partition, key, value, headers, timestamp) each, delivered or the test fails."""
    from confluent_kafka import Producer as KafkaProducer

    producer = KafkaProducer({"bootstrap.servers": bootstrap, "enable.idempotence": False, "linger.ms": 20, **conf})
    errors: list[Any] = []
    for partition, key, value, headers, ts in items:
        producer.produce(
            topic,
            value,
            key,
            partition=partition,
            headers=list(headers) or None,
            timestamp=ts,
            on_delivery=lambda err, _msg: err and errors.append(err),
        )
    assert producer.flush(30) == 0
    assert errors == []


# -- records through each client -----------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_produces_each_compression_and_reads_it_back(gateway: GatewayProcess, topic: str, compression: str) -> None:
    items = [(1, b"k-%d" % i, b"v-%d-" % i + b"x" * (i * 40), HEADERS if i % 2 else (), T0 + i) for i in range(20)] + [
        (1, None, None, (), T0 + 99)
    ]  # null key and value
    confluent_produce(gateway.bootstrap, topic, items, **{"compression.type": compression})
    got = confluent_consume(gateway.bootstrap, topic, 1, 0, len(items))
    assert got == [Rec(i, key, value, tuple(headers), ts) for i, (_, key, value, headers, ts) in enumerate(items)]


@pytest.mark.parametrize("client", CONSUMERS)
def test_each_client_reads_keys_values_repeated_null_headers_offsets_and_timestamps(
    gateway: GatewayProcess, store: Broker, topic: str, client: str
) -> None:
    write(store, topic, 0, "a", "b", "c", headers=HEADERS, key=b"key")
    write(store, topic, 0, "d", ts=T0 + 50)
    got = CONSUMERS[client](gateway.bootstrap, topic, 0, 0, 4)
    assert got == [
        Rec(0, b"key", b"a", HEADERS, T0),
        Rec(1, b"key", b"b", HEADERS, T0 + 1),
        Rec(2, b"key", b"c", HEADERS, T0 + 2),
        Rec(3, None, b"d", (), T0 + 50),
    ]


@pytest.mark.parametrize("client", CONSUMERS)
def test_a_consumer_starting_in_the_middle_of_a_batch_gets_exactly_the_rest(
    gateway: GatewayProcess, topic: str, client: str
) -> None:
    items = [(0, None, b"m-%d" % i, (), T0 + i) for i in range(10)]
    confluent_produce(gateway.bootstrap, topic, items, **{"linger.ms": 200})  # one batch
    got = CONSUMERS[client](gateway.bootstrap, topic, 0, 6, 4)
    assert [(r.offset, r.value) for r in got] == [(i, b"m-%d" % i) for i in range(6, 10)]


def test_a_record_larger_than_every_fetch_limit_still_arrives(gateway: GatewayProcess, store: Broker, topic: str) -> None:
    big = "B" * 50_000
    write(store, topic, 0, big, "small")
    got = kafka_python_consume(gateway.bootstrap, topic, 0, 0, 2, fetch_max_bytes=100, max_partition_fetch_bytes=100)
    assert [(r.offset, r.value) for r in got] == [(0, big.encode()), (1, b"small")]
    got = confluent_consume(gateway.bootstrap, topic, 0, 0, 2, **{"max.partition.fetch.bytes": 100})
    assert [r.offset for r in got] == [0, 1]


# -- read_committed ----------------------------------------------------------------------------


@pytest.mark.parametrize("client", CONSUMERS)
def test_read_committed_skips_aborted_records_and_moves_past_markers(
    gateway: GatewayProcess, store: Broker, topic: str, client: str
) -> None:
    transactions_log(store, topic)
    consume = CONSUMERS[client]
    committed = consume(gateway.bootstrap, topic, 0, 0, 4, **ISOLATION[client]("read_committed"))
    assert [(r.offset, r.value) for r in committed] == [
        (0, b"plain-0"),
        (4, b"committed-4"),
        (5, b"committed-5"),
        (7, b"plain-7"),
    ]
    everything = consume(gateway.bootstrap, topic, 0, 0, 7, **ISOLATION[client]("read_uncommitted"))
    assert [r.offset for r in everything] == [0, 1, 2, 4, 5, 7, 8]
    # the log ends with an ABORT marker (9): a consumer positioned on it moves on to what follows
    write(store, topic, 0, "after")
    tail = consume(gateway.bootstrap, topic, 0, 8, 1, **ISOLATION[client]("read_committed"))
    assert [(r.offset, r.value) for r in tail] == [(10, b"after")]


def test_read_committed_waits_for_an_open_transaction_and_reads_it_once_committed(
    gateway: GatewayProcess, store: Broker, topic: str
) -> None:
    write(store, topic, 0, "before")
    p = Producer(store, f"tx-{topic}", transaction_version=1)
    p.send(topic, 0, "open-1", "open-2")
    write(store, topic, 0, "plain-after-open")  # above the last stable offset until the commit
    assert confluent_consume(gateway.bootstrap, topic, 0, 0, 2, timeout=3, **{"isolation.level": "read_committed"}) == [
        Rec(0, None, b"before", (), T0)
    ]
    p.commit()
    got = kafka_python_consume(gateway.bootstrap, topic, 0, 0, 4, isolation_level="read_committed")
    assert [r.value for r in got] == [b"before", b"open-1", b"open-2", b"plain-after-open"]


# -- long-poll -----------------------------------------------------------------------------------


def later(seconds: float, fn: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), fn(*args)), daemon=True)
    thread.start()
    return thread


def test_a_waiting_confluent_consumer_gets_a_record_produced_meanwhile_soon(
    gateway: GatewayProcess, store: Broker, topic: str
) -> None:
    produced_at: list[float] = []

    def produce() -> None:
        produced_at.append(time.monotonic())
        write(store, topic, 1, "late")

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": gateway.bootstrap,
            "group.id": "assign-only",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5000,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 1, 0)])
        assert consumer.poll(1.0) is None  # the consumer now waits in a fetch on the empty partition
        thread = later(0.5, produce)
        msg = None
        deadline = time.monotonic() + 15
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
        received_at = time.monotonic()
        thread.join()
    finally:
        consumer.close()
    assert msg is not None and msg.value() == b"late"
    assert received_at - produced_at[0] < 3.0  # well before the 5 s wait ends


def fetch_body(
    partitions: list[tuple[str, int, int]],
    *,
    isolation: int = READ_UNCOMMITTED,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 1_048_576,
    partition_max_bytes: int = 1_048_576,
) -> dict:
    by_topic: dict[str, list[dict]] = {}
    for name, partition, offset in partitions:
        by_topic.setdefault(name, []).append(
            {"partition": partition, "fetch_offset": offset, "partition_max_bytes": partition_max_bytes}
        )
    return {
        "replica_id": -1,
        "max_wait_ms": max_wait_ms,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "isolation_level": isolation,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic": name, "partitions": parts} for name, parts in by_topic.items()],
    }


def timed_fetch(raw: RawConnection, version: int, body: dict) -> tuple[float, Any]:
    started = time.monotonic()
    answer = raw.request(ApiKey.Fetch, version, body)
    return time.monotonic() - started, answer


def test_a_long_poll_wakes_on_an_append_to_any_of_its_partitions(raw: RawConnection, store: Broker, topic: str) -> None:
    write(store, topic, 0, "old")
    thread = later(0.5, write, store, topic, 1, "new")
    took, answer = timed_fetch(raw, 12, fetch_body([(topic, 0, 1), (topic, 1, 0)], max_wait_ms=5000))
    thread.join()
    assert took < 4.0
    p0, p1 = answer.responses[0].partitions
    assert p0.records in (b"", None)
    assert [r.value for b in decode_batches(p1.records) for r in b.records] == [b"new"]


def test_a_long_poll_answers_at_its_deadline_with_nothing(raw: RawConnection, topic: str) -> None:
    took, answer = timed_fetch(raw, 11, fetch_body([(topic, 0, 0)], max_wait_ms=1000))
    assert 0.8 < took < 4.0
    (part,) = answer.responses[0].partitions
    assert (part.error_code, part.high_watermark, part.records) == (0, 0, b"")


def test_a_read_committed_long_poll_whose_stable_offset_stays_answers_at_its_deadline(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    p = Producer(store, f"tx-{topic}", transaction_version=1)
    p.send(topic, 0, "open")
    thread = later(0.3, p.send, topic, 0, "still-open")  # an append wakes the fetch; nothing is readable
    took, answer = timed_fetch(raw, 12, fetch_body([(topic, 0, 0)], isolation=READ_COMMITTED, max_wait_ms=1500))
    thread.join()
    assert 1.2 < took < 5.0
    (part,) = answer.responses[0].partitions
    assert (part.high_watermark, part.last_stable_offset, part.records, part.aborted_transactions) == (2, 0, b"", [])


def test_min_bytes_zero_or_no_wait_answers_at_once(raw: RawConnection, topic: str) -> None:
    for body in (
        fetch_body([(topic, 0, 0)], max_wait_ms=5000, min_bytes=0),
        fetch_body([(topic, 0, 0)], max_wait_ms=0),
        fetch_body([], max_wait_ms=5000),  # no partition: nothing to wait for
    ):
        took, _ = timed_fetch(raw, 12, body)
        assert took < 2.0


def test_a_partition_in_error_answers_at_once(raw: RawConnection, topic: str) -> None:
    took, answer = timed_fetch(raw, 12, fetch_body([(topic, 0, 0), (topic, 7, 0)], max_wait_ms=5000))
    assert took < 2.0
    assert [p.error_code for p in answer.responses[0].partitions] == [0, UNKNOWN]


def test_a_long_poll_of_many_partitions_is_one_of_the_long_polls_bounded(start_gateway: Any) -> None:
    """TXLOG_MAX_LONG_POLLS bounds the fetches waiting, not their partitions: with a bound of 2, a
    read_committed fetch of three partitions waiting leaves room for another, which an append
    from another connection wakes, as it then wakes the first."""
    gateway = start_gateway(max_long_polls="2")
    store = make_broker(gateway.database_url)
    answers: dict[str, Any] = {}

    def fetch(name: str, conn: RawConnection, partitions: list[tuple[str, int, int]]) -> None:
        answers[name] = conn.request(
            ApiKey.Fetch, 12, fetch_body(partitions, isolation=READ_COMMITTED, max_wait_ms=60_000)
        ).responses

    def listened(topic: str) -> int:
        row = outside.execute("SELECT count(*) FROM txlog.fetch_listeners WHERE topic = %s", (topic,)).fetchone()
        return row[0] if row else 0

    try:
        topics.create_topic(store, "wide", 3)
        topics.create_topic(store, "narrow", 1)
        with (
            gateway.connect() as first,
            gateway.connect() as second,
            psycopg.connect(gateway.database_url, autocommit=True) as outside,
        ):
            wide = threading.Thread(target=fetch, args=("wide", first, [("wide", p, 0) for p in range(3)]), daemon=True)
            wide.start()
            wait_until(lambda: listened("wide") == 3, message="the fetch of three partitions to wait")
            narrow = threading.Thread(target=fetch, args=("narrow", second, [("narrow", 0, 0)]), daemon=True)
            narrow.start()
            # It waits once its gateway listens on its partition (or, over the bound, is answered at once).
            wait_until(lambda: "narrow" in answers or listened("narrow") == 1, message="the second fetch to wait or answer")
            write(store, "narrow", 0, "late")
            narrow.join(30)
            write(store, "wide", 2, "wide-late")
            wide.join(30)
    finally:
        store.db.dispose()
    (narrow_topic,) = answers["narrow"]
    assert [r.value for b in decode_batches(narrow_topic.partitions[0].records) for r in b.records] == [b"late"]
    (wide_topic,) = answers["wide"]
    got = {p.partition_index: [r.value for b in decode_batches(p.records) for r in b.records] for p in wide_topic.partitions}
    assert got == {0: [], 1: [], 2: [b"wide-late"]}


# -- raw frames ----------------------------------------------------------------------------------


def batches_of(records: bytes | None) -> list[RecordBatch]:
    return decode_batches(records)


@pytest.mark.parametrize("version", [4, 7, 11, 12])
def test_every_requested_partition_is_answered_in_order(raw: RawConnection, store: Broker, topic: str, version: int) -> None:
    write(store, topic, 0, "a", "b", "c")
    answer = raw.request(
        ApiKey.Fetch,
        version,
        fetch_body([(topic, 1, 0), (topic, 0, 1), ("no-such-topic-" + topic, 0, 0), (topic, 9, 0), (topic, 0, 5), (topic, 0, 3)]),
    )
    if version >= 7:
        assert (answer.error_code, answer.session_id) == (0, 0)
    assert [t.topic for t in answer.responses] == [topic, "no-such-topic-" + topic]
    mine, unknown = answer.responses
    assert [(p.partition_index, p.error_code) for p in mine.partitions] == [
        (1, 0),
        (0, 0),
        (9, UNKNOWN),
        (0, OUT_OF_RANGE),
        (0, 0),
    ]
    assert [(p.partition_index, p.error_code) for p in unknown.partitions] == [(0, UNKNOWN)]
    empty, from_1, missing, beyond, at_end = mine.partitions
    assert (empty.high_watermark, empty.records) == (0, b"")
    (batch,) = batches_of(from_1.records)
    assert batch.base_offset == 1 and [r.value for r in batch.records] == [b"b", b"c"]
    assert (from_1.high_watermark, from_1.last_stable_offset) == (3, 3)
    if version >= 5:
        assert from_1.log_start_offset == 0
        assert (beyond.high_watermark, beyond.log_start_offset) == (3, 0)
    if version >= 11:
        assert from_1.preferred_read_replica == -1
    assert (at_end.high_watermark, at_end.records) == (3, b"")
    assert from_1.aborted_transactions is None and missing.records == b""


def test_read_committed_lists_the_aborted_transactions_and_read_uncommitted_none(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    p = transactions_log(store, topic)
    committed = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 0, 0)], isolation=READ_COMMITTED)).responses[0].partitions[0]
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [(p.pid, 1), (p.pid, 8)]
    assert (committed.high_watermark, committed.last_stable_offset) == (10, 10)
    batches = batches_of(committed.records)
    # data and markers alike, each batch starting where its first record is
    assert [(b.base_offset, b.last_offset, b.is_control, b.control_type) for b in batches] == [
        (0, 0, False, None),
        (1, 2, False, None),
        (3, 3, True, 0),
        (4, 5, False, None),
        (6, 6, True, 1),
        (7, 7, False, None),
        (8, 8, False, None),
        (9, 9, True, 0),
    ]
    assert all(b.producer_id == p.pid and b.is_transactional for b in batches if b.base_offset in (1, 3, 4, 6, 8, 9))
    # a fetch past the first aborted transaction lists only the one it reaches
    later_page = raw.request(ApiKey.Fetch, 4, fetch_body([(topic, 0, 4)], isolation=READ_COMMITTED)).responses[0].partitions[0]
    assert [(a.producer_id, a.first_offset) for a in later_page.aborted_transactions] == [(p.pid, 8)]
    # from inside the aborted transaction: it is listed, by its first offset
    inside = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 0, 2)], isolation=READ_COMMITTED)).responses[0].partitions[0]
    assert [(a.producer_id, a.first_offset) for a in inside.aborted_transactions] == [(p.pid, 1), (p.pid, 8)]
    assert batches_of(inside.records)[0].base_offset == 2
    uncommitted = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 0, 0)])).responses[0].partitions[0]
    assert uncommitted.aborted_transactions is None
    assert uncommitted.records == committed.records


def test_read_committed_stops_at_the_last_stable_offset(raw: RawConnection, store: Broker, topic: str) -> None:
    write(store, topic, 0, "plain")
    p = Producer(store, f"tx-{topic}", transaction_version=1)
    p.send(topic, 0, "open")
    write(store, topic, 0, "plain-2")
    body = fetch_body([(topic, 0, 0)], isolation=READ_COMMITTED)
    part = raw.request(ApiKey.Fetch, 12, body).responses[0].partitions[0]
    assert (part.high_watermark, part.last_stable_offset) == (3, 1)
    assert [b.base_offset for b in batches_of(part.records)] == [0]
    uncommitted = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 0, 0)])).responses[0].partitions[0]
    assert [r.value for b in batches_of(uncommitted.records) for r in b.records] == [b"plain", b"open", b"plain-2"]
    p.abort()
    part = raw.request(ApiKey.Fetch, 12, body).responses[0].partitions[0]
    assert (part.last_stable_offset, [(a.producer_id, a.first_offset) for a in part.aborted_transactions]) == (4, [(p.pid, 1)])


def test_byte_limits_first_record_whole_then_the_budget_passes_on(raw: RawConnection, store: Broker, topic: str) -> None:
    write(store, topic, 0, "x" * 3000, "y" * 10)
    write(store, topic, 1, "z" * 10)
    # one byte for everything: the first record of the first partition with records still comes
    answer = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 0, 0), (topic, 1, 0)], max_bytes=1, partition_max_bytes=1))
    first, second = answer.responses[0].partitions
    assert [(b.base_offset, len(b.records)) for b in batches_of(first.records)] == [(0, 1)]
    assert (second.error_code, second.high_watermark, second.records) == (0, 1, b"")
    # an empty partition first does not use up the exception
    write(store, topic, 1, "w" * 3000)
    answer = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 0, 2), (topic, 1, 0)], max_bytes=100, partition_max_bytes=100))
    at_end, second = answer.responses[0].partitions
    assert at_end.records == b"" and [r.value for b in batches_of(second.records) for r in b.records] == [b"z" * 10]
    # the request's max_bytes bounds the sum: what the first partition used is gone for the next
    answer = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 0, 0), (topic, 1, 1)], max_bytes=3200, partition_max_bytes=3200))
    first, second = answer.responses[0].partitions
    assert [r.offset_delta for b in batches_of(first.records) for r in b.records] == [0, 1]
    assert len(first.records) <= 3200
    assert (second.high_watermark, second.records) == (2, b"")  # its 3000-byte record no longer fits
    alone = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 1, 1)], max_bytes=3200, partition_max_bytes=3200))
    assert [r.value for b in batches_of(alone.responses[0].partitions[0].records) for r in b.records] == [b"w" * 3000]


def log_rows(n: int, headers_every: int = 3) -> list[StoredRecord]:
    """Rows as a page holds them: plain records of growing size, some with headers (every
    ``headers_every``-th; 0: none), a transaction's records and its marker."""
    rows, position = [], 0
    for i in range(n):
        control = i % 7 == 6
        with_headers = headers_every and not control and i % headers_every == 0
        headers = (("h", b"\x00" * i), ("h", None)) if with_headers else ()
        key, value = (None, None) if control else (b"k" * (i % 4), b"v" * (i * 37 % 500))
        txn = i % 7 >= 4
        rows.append(
            StoredRecord(
                100 + i,
                key,
                value,
                [k for k, _ in headers] or None,
                [v for _, v in headers] or None,
                T0 + i,
                9 if txn else None,
                0 if txn else None,
                i if txn and not control else None,
                txn,
                1 if control else None,
                position,
                100 if txn else None,
                False,
            )
        )
        position += rows[-1].size
    return rows


def test_a_page_is_cut_in_whole_records_within_the_limit() -> None:
    rows = log_rows(60)
    whole = encode_records(rows)
    for limit in (0, 1, 60, 200, 1000, 5000, len(whole) - 1, len(whole), 10 * len(whole)):
        for first_whole in (False, True):
            data, last = _batches_within(rows, limit, first_whole)
            offsets = [b.base_offset + r.offset_delta for b in decode_batches(data) for r in b.records]
            assert offsets == [r.offset for r in rows][: len(offsets)]
            assert last == (offsets[-1] if offsets else None)
            assert len(data) <= limit or (first_whole and len(offsets) == 1)
            if first_whole:
                assert offsets[:1] == [100]
    assert _batches_within(rows, 10 * len(whole), False)[0] == whole
    assert _batches_within([], 100, True) == (b"", None)


def _longest_head(rows: list[StoredRecord], limit: int, first_whole: bool) -> int:
    """How many rows the cut keeps, by its definition: rows are added one by one, each with its
    record and header overheads at their largest and each batch with its header, while the sum
    stays within ``limit``."""
    size = kept = 0
    for run in batch_runs(rows):
        size += HEADER_SIZE
        for row in run:
            size += (
                row.size + fetch_handler._RECORD_OVERHEAD_MAX + fetch_handler._HEADER_OVERHEAD_MAX * len(row.header_keys or ())
            )
            if size > limit and not (kept == 0 and first_whole):
                return kept
            kept += 1
    return kept


@pytest.mark.parametrize("headers_every", [0, 2, 3, 50])
def test_a_page_is_cut_at_the_longest_head_within_the_limit(headers_every: int) -> None:
    """Runs without headers are sized whole; the cut is still the one row by row would make."""
    rows = log_rows(120, headers_every)
    whole = encode_records(rows)
    for limit in range(0, len(whole) + 200, 97):
        for first_whole in (False, True):
            data, last = _batches_within(rows, limit, first_whole)
            kept = _longest_head(rows, limit, first_whole)
            assert last == (rows[kept - 1].offset if kept else None), (limit, first_whole)
            assert data == encode_records(rows[:kept])


def _log_of(sizes: list[int]) -> list[StoredRecord]:
    """A partition's log of plain records with values of ``sizes`` bytes, from offset 0."""
    rows, position = [], 0
    for offset, size in enumerate(sizes):
        rows.append(StoredRecord(offset, None, b"v" * size, None, None, T0, None, None, None, False, None, position, None, False))
        position += size
    return rows


def test_a_partition_whose_first_record_cannot_fit_what_is_left_is_answered_unread() -> None:
    """Once the request's budget bounds what the partitions left may get, those whose first record
    cannot fit in what is left are answered their offsets without reading a page: every answer is
    the one reading each page gives, for budgets ending anywhere among the partitions."""
    logs = {
        0: _log_of([3000] * 4),
        1: _log_of([900, 10]),
        2: _log_of([5000]),
        3: _log_of([40, 40, 40]),
        4: [],
        5: _log_of([700] * 3),
    }
    wanted = [fetch_handler._Wanted("t", p, 0, 4000) for p in logs] + [fetch_handler._Wanted("t", 5, 1, 4000)]
    read: list[tuple[int, int]] = []

    def read_page(w: Any, limit: int) -> fetch_service.LogPage:
        read.append((w.partition, limit))
        log = logs[w.partition]
        rows = log[w.offset :] if limit else []
        rows = [r for i, r in enumerate(rows) if i == 0 or r.position - rows[0].position <= limit]
        if len(rows) > 1 and rows[-1].position + rows[-1].size - rows[0].position > limit:
            rows.pop()  # as a page is cut: the last row may not end past the budget
        return fetch_service.LogPage.of(PartitionStatus("t", w.partition, 0, len(log), len(log)), rows, "read_uncommitted")

    def record_sizes(left: Any) -> dict[tuple[str, int, int], int]:
        return {
            (w.topic, w.partition, w.offset): logs[w.partition][w.offset].size for w in left if w.offset < len(logs[w.partition])
        }

    pages_each = pages_sized = 0  # pages read (a budget of 0 reads none)
    for max_bytes in range(1, 14_000, 61):
        read.clear()
        each = fetch_handler._read_pages(None, wanted, max_bytes, {}, None, read_page)  # type: ignore[arg-type]  # no redirect: no broker
        pages_each += sum(1 for _, limit in read if limit)
        read.clear()
        sized = fetch_handler._read_pages(None, wanted, max_bytes, {}, None, read_page, record_sizes)  # type: ignore[arg-type]
        pages_sized += sum(1 for _, limit in read if limit)
        assert sized == each, max_bytes
    assert pages_sized < pages_each - 100, (pages_sized, pages_each)  # those the spent budgets left unread


def test_an_unknown_isolation_level_is_refused(raw: RawConnection, topic: str) -> None:
    answer = raw.request(ApiKey.Fetch, 12, fetch_body([(topic, 0, 0)], isolation=7))
    assert answer.error_code == INVALID_REQUEST


# -- ListOffsets ---------------------------------------------------------------------------------


def list_offsets_body(asks: list[tuple[str, int, int]], isolation: int = READ_UNCOMMITTED) -> dict:
    by_topic: dict[str, list[dict]] = {}
    for name, partition, timestamp in asks:
        by_topic.setdefault(name, []).append({"partition_index": partition, "timestamp": timestamp})
    return {"replica_id": -1, "isolation_level": isolation, "topics": [{"name": n, "partitions": p} for n, p in by_topic.items()]}


def offsets_log(store: Broker, topic: str) -> Producer:
    """Partition 0: times T0, T0+10, T0+20 at offsets 0-2, then an open transaction at 3."""
    for i in range(3):
        write(store, topic, 0, f"r{i}", ts=T0 + 10 * i)
    p = Producer(store, f"tx-{topic}", transaction_version=1)
    p.send(topic, 0, "open")
    return p


def listed(raw: RawConnection, version: int, topic: str, timestamp: int, isolation: int = READ_UNCOMMITTED) -> tuple[int, int]:
    """(offset, timestamp) ListOffsets answers for partition 0 of ``topic``."""
    (part,) = raw.request(ApiKey.ListOffsets, version, list_offsets_body([(topic, 0, timestamp)], isolation)).topics[0].partitions
    assert part.error_code == 0
    return part.offset, part.timestamp


def test_list_offsets_raw_every_kind_and_version(raw: RawConnection, store: Broker, topic: str) -> None:
    offsets_log(store, topic)
    for version in (1, 2, 4, 7):
        assert listed(raw, version, topic, -2) == (0, -1)  # earliest: the log start
        assert listed(raw, version, topic, -1) == (4, -1)  # latest: the high watermark
        assert listed(raw, version, topic, T0) == (0, T0)
        assert listed(raw, version, topic, T0 + 5) == (1, T0 + 10)
        assert listed(raw, version, topic, T0 + 20) == (2, T0 + 20)
        assert listed(raw, version, topic, 2**62) == (-1, -1)  # no record that late
        answer = raw.request(ApiKey.ListOffsets, version, list_offsets_body([(topic, 0, -2), (topic, 1, -1), (topic, 9, -1)]))
        parts = answer.topics[0].partitions
        assert [(p.partition_index, p.error_code, p.offset, p.timestamp) for p in parts] == [
            (0, 0, 0, -1),
            (1, 0, 0, -1),
            (9, UNKNOWN, -1, -1),
        ], version
        if version >= 4:
            assert [p.leader_epoch for p in parts] == [0, 0, -1]
    # latest is the last stable offset for read_committed, from v2; a timestamp finds nothing past it
    assert listed(raw, 2, topic, -1, READ_COMMITTED) == (3, -1)
    assert listed(raw, 7, topic, T0 + 21, READ_COMMITTED) == (-1, -1)
    assert listed(raw, 7, topic, T0 + 21)[0] == 3  # the open transaction's record, read_uncommitted
    # the largest timestamp (v7): the open transaction's record, appended now
    offset, timestamp = listed(raw, 7, topic, -3)
    assert offset == 3 and timestamp > T0 + 20


def test_list_offsets_refuses_a_partition_asked_twice(raw: RawConnection, store: Broker, topic: str) -> None:
    answer = raw.request(ApiKey.ListOffsets, 5, list_offsets_body([(topic, 0, -1), (topic, 1, -1), (topic, 0, -2)]))
    assert [(p.partition_index, p.error_code) for p in answer.topics[0].partitions] == [
        (0, INVALID_REQUEST),
        (1, 0),
        (0, INVALID_REQUEST),
    ]


def test_confluent_watermarks_and_offsets_for_times(gateway: GatewayProcess, store: Broker, topic: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    offsets_log(store, topic)
    for level, high in (("read_uncommitted", 4), ("read_committed", 3)):
        consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "assign-only", "isolation.level": level})
        try:
            assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False) == (0, high)
            found = consumer.offsets_for_times([TopicPartition(topic, 0, T0 + 5), TopicPartition(topic, 1, T0)], timeout=10)
            assert [(tp.partition, tp.offset, tp.error) for tp in found] == [(0, 1, None), (1, -1, None)]
            late = consumer.offsets_for_times([TopicPartition(topic, 0, int(time.time() + 3600) * 1000)], timeout=10)
            assert late[0].offset == -1
        finally:
            consumer.close()


def test_kafka_python_beginning_end_offsets_and_offsets_for_times(gateway: GatewayProcess, store: Broker, topic: str) -> None:
    from kafka import TopicPartition

    offsets_log(store, topic)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    for level, high in (("read_uncommitted", 4), ("read_committed", 3)):
        consumer = kafka_python_consumer(gateway.bootstrap, isolation_level=level)
        try:
            assert consumer.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
            assert consumer.end_offsets([tp0, tp1]) == {tp0: high, tp1: 0}
            found = consumer.offsets_for_times({tp0: T0 + 5, tp1: T0})
            assert found[tp1] is None
            assert (found[tp0].offset, found[tp0].timestamp) == (1, T0 + 10)
        finally:
            consumer.close()


def test_aiokafka_beginning_end_offsets_and_offsets_for_times(gateway: GatewayProcess, store: Broker, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    offsets_log(store, topic)
    tp0 = TopicPartition(topic, 0)

    async def run(level: str) -> tuple[Any, Any, Any]:
        consumer = AIOKafkaConsumer(bootstrap_servers=gateway.bootstrap, isolation_level=level)
        await consumer.start()
        try:
            return (
                await consumer.beginning_offsets([tp0]),
                await consumer.end_offsets([tp0]),
                await consumer.offsets_for_times({tp0: T0 + 15}),
            )
        finally:
            await consumer.stop()

    for level, high in (("read_uncommitted", 4), ("read_committed", 3)):
        begin, end, found = asyncio.run(run(level))
        assert (begin, end) == ({tp0: 0}, {tp0: high})
        assert (found[tp0].offset, found[tp0].timestamp) == (2, T0 + 20)


def test_a_gateway_stops_cleanly_while_a_fetch_long_polls(start_gateway: Any) -> None:
    import signal

    g = start_gateway()
    services = make_broker(g.database_url)
    try:
        topics.create_topic(services, "waited", 1)
    finally:
        services.db.dispose()
    with g.connect() as conn:
        conn.send(ApiKey.Fetch, 12, fetch_body([("waited", 0, 0)], max_wait_ms=30_000))
        time.sleep(0.5)  # the fetch now waits
        started = time.monotonic()
        assert g.stop(signal.SIGTERM) == 0
        assert time.monotonic() - started < 15
    assert "Traceback" not in g.log()
