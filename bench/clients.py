"""Load generators, run in client processes of their own (multiprocessing, spawn) so that the
process timing the benchmark never shares a GIL with the load.

A *lane* is one producer or reader: one thread, one keep-alive connection, one partition. A client
process runs the lanes it is given in threads for one window: it sets them up (connections,
InitProducerId) before the window starts, runs them through a warm-up and the measured window, and
answers what they completed inside the window and its own CPU time during it (getrusage).

The HTTP clients are lean on purpose: ``http.client`` with keep-alive, a batch's JSON encoded once
per lane with only the producer id, epoch and sequence spliced in per request, and a produce
answer's status checked without decoding its body. A fetch answer is decoded (orjson) since its
``next_offset`` drives the next request. The client CPU per 1000 rows is reported beside every
figure, so a load generator that became the bottleneck shows.

The Kafka wire lanes drive confluent-kafka (librdkafka) as an application would: a producer per
partition calling ``produce`` per record and counting acknowledged batches from delivery reports,
and a consumer per partition calling ``consume``. librdkafka's own threads do the batching,
framing and I/O; their CPU is the client process's too.
"""

from __future__ import annotations

import asyncio
import http.client
import random
import resource
import string
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, Callable, Protocol

import orjson

BATCH = 100  # records per produce batch, per raw append, per PgQueuer enqueue/dequeue
KEY_BYTES = 16
VALUE_BYTES = 1024
PAGE = 1000  # records per fetch
PGQ_SCHEMA = "pgqueuer"
PGQ_ENQUEUE = "bench-enqueue"  # entrypoint of the enqueue workload (deleted after each window)
PGQ_DEQUEUE = "bench-dequeue"  # entrypoint of the pre-filled queue the dequeue workload drains
PGMQ_QUEUE = "bench_read"  # the pre-filled pgmq queue the read + delete workload drains


def batch_keys() -> list[bytes]:
    return [b"key-%012d" % i for i in range(BATCH)]


def batch_values() -> list[bytes]:
    """1 KiB printable values (no JSON escaping needed), a different one per record of the batch."""
    alphabet = string.ascii_letters + string.digits
    text = "".join(random.Random(7).choices(alphabet, k=VALUE_BYTES + BATCH))
    return [text[i : i + VALUE_BYTES].encode() for i in range(BATCH)]


def records_json() -> bytes:
    return orjson.dumps([{"key": k.decode(), "value": v.decode()} for k, v in zip(batch_keys(), batch_values())])


@dataclass(frozen=True)
class Lane:
    """One producer or reader. ``target`` is ``host:port`` for HTTP lanes, Kafka's bootstrap servers
    for the wire lanes, a database URL otherwise."""

    kind: str  # produce | raw_append | fetch | raw_fetch | pgq_enqueue | pgq_dequeue | pgmq_read | share_acquire
    # | kafka_produce | kafka_fetch | kafka_share | kafka_share_explicit
    target: str
    topic: str = ""
    partition: int = 0
    mode: str = ""  # produce: plain | idempotent | transactional; fetch: read_committed | read_uncommitted
    commit_every: int = 0  # transactional: batches per transaction
    transactional_id: str = ""
    offset: int = 0  # fetch: where the walk starts
    end: int = 0  # fetch: where the walk wraps (0: at the high watermark or LSO)
    start: int = 0  # fetch: where it wraps to (or the log start, if later)
    group: str = ""  # share lanes: the share group


@dataclass
class LaneResult:
    rows: int = 0  # records completed inside the window
    latencies_ms: list[float] = field(default_factory=list)  # EndTxn, inside the window
    offset: int = 0  # fetch: where the walk stopped
    empty: int = 0  # dequeues (PgQueuer, pgmq, share acquisitions) that found nothing to take
    error: str | None = None


@dataclass
class ClientResult:
    lanes: list[LaneResult]
    cpu_s: float  # the client process's CPU time inside the window


class Runner(Protocol):
    latencies: list[tuple[float, float]]  # (completed at, milliseconds)
    offset: int
    empty: int

    def step(self) -> int: ...

    def close(self) -> None: ...


# --- HTTP -----------------------------------------------------------------------------------------


class Http:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)

    def call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = {"content-type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=body, headers=headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status not in (200, 201):
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {data[:500]!r}")
        return data

    def close(self) -> None:
        self.conn.close()


class ProduceRunner:
    """Plain, idempotent or transactional produce of one pre-encoded batch, over and over."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.http = Http(lane.target)
        self.path = f"/v1/topics/{lane.topic}/partitions/{lane.partition}/records"
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0
        self.open_batches = 0
        self.seq = 0
        head = b'{"encoding":"utf8","records":' + records_json()
        if lane.mode == "plain":
            self.plain = head + b"}"
            return
        self.head = head + b',"producer_id":'
        self.tail = b"}"
        init = b"{}"
        if lane.mode == "transactional":
            tid = orjson.dumps(lane.transactional_id)
            self.tail = b',"transactional_id":' + tid + b"}"
            init = b'{"transactional_id":' + tid + b"}"
        out = orjson.loads(self.http.call("POST", "/v1/producers", init))
        self.pid, self.epoch = out["producer_id"], out["producer_epoch"]

    def step(self) -> int:
        if self.lane.mode == "plain":
            self.http.call("POST", self.path, self.plain)
            return BATCH
        ids = b'%d,"producer_epoch":%d,"base_sequence":%d' % (self.pid, self.epoch, self.seq)
        self.http.call("POST", self.path, self.head + ids + self.tail)
        self.seq += BATCH
        if self.lane.mode == "transactional":
            self.open_batches += 1
            if self.open_batches >= self.lane.commit_every:
                self._commit()
        return BATCH

    def _commit(self) -> None:
        body = b'{"producer_id":%d,"producer_epoch":%d,"result":"commit"}' % (self.pid, self.epoch)
        started = time.monotonic()
        out = orjson.loads(self.http.call("POST", f"/v1/transactions/{self.lane.transactional_id}/end", body))
        done = time.monotonic()
        self.latencies.append((done, (done - started) * 1000))
        self.pid, self.epoch, self.seq, self.open_batches = out["producer_id"], out["producer_epoch"], 0, 0

    def close(self) -> None:
        if self.open_batches:  # never leave a transaction open: it would hold the last stable offset
            self._commit()
        self.http.close()


class FetchRunner:
    """Pages of 1000 records from ``offset``, following ``next_offset``, wrapping to the lane's
    ``start`` (or the log start, if later)."""

    def __init__(self, lane: Lane) -> None:
        self.http = Http(lane.target)
        self.offset = lane.offset
        self.bound = "last_stable_offset" if lane.mode == "read_committed" else "high_watermark"
        self.start, self.end = lane.start, lane.end
        self.path = (
            f"/v1/topics/{lane.topic}/partitions/{lane.partition}/records"
            f"?max_records={PAGE}&max_bytes=16777216&isolation_level={lane.mode}&offset="
        )
        self.latencies: list[tuple[float, float]] = []
        self.empty = 0

    def step(self) -> int:
        doc = orjson.loads(self.http.call("GET", self.path + str(self.offset)))
        n = len(doc["records"])
        nxt = doc["next_offset"]
        wrap = nxt >= doc[self.bound] or (self.end and nxt >= self.end)
        self.offset = max(doc["log_start_offset"], self.start) if wrap else nxt
        return n

    def close(self) -> None:
        self.http.close()


class ShareAcquireRunner:
    """A share group's member over HTTP, consuming as a share consumer does: each acquisition
    (``POST /v1/share-groups/{group}/acquire``, up to a batch of the lane's topic, its partitions
    taken from a random one) carries the acceptance of the batch before it (a range per run
    acquired), as Kafka's ShareFetch carries acknowledgements: one request per batch, a
    partition both accepted and read in one database transaction. Counted: records accepted
    (the answer's ``acknowledgements``); the last batch is accepted when the runner closes."""

    def __init__(self, lane: Lane) -> None:
        self.http = Http(lane.target)
        self.member = str(uuid.uuid4())
        self.acquire_path = f"/v1/share-groups/{lane.group}/acquire"
        self.ack_path = f"/v1/share-groups/{lane.group}/acknowledge"
        self.acquire_head = orjson.dumps(
            {"member_id": self.member, "topic": lane.topic, "max_records": BATCH, "wait_ms": 0, "encoding": "utf8"}
        )[:-1]
        self.pending: list[dict] = []  # the acceptance of the last batch, sent with the next acquisition
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0

    def step(self) -> int:
        body = self.acquire_head
        if self.pending:
            body += b',"acknowledgements":' + orjson.dumps(self.pending)
        doc = orjson.loads(self.http.call("POST", self.acquire_path, body + b"}"))
        accepted = sum(p["accepted"] for p in doc.get("acknowledgements") or () if p["error"] is None)
        self.pending = [
            {
                "topic": p["topic"],
                "partition": p["partition"],
                "first_offset": a["first_offset"],
                "last_offset": a["last_offset"],
                "type": "accept",
            }
            for p in doc["partitions"]
            for a in p["acquired"]
        ]
        if not accepted and not self.pending:
            self.empty += 1
        return accepted

    def close(self) -> None:
        if self.pending:
            body = orjson.dumps({"member_id": self.member, "acknowledgements": self.pending})
            self.http.call("POST", self.ack_path, body)
        self.http.close()


# --- Kafka's wire protocol (confluent-kafka, librdkafka) -----------------------------------------

# librdkafka's settings for the wire lanes. Batches are cut at 100 records (about 105 KB, below
# batch.size) as the HTTP produce's bodies are: the 100th record sends the batch without waiting
# for linger.ms.
KAFKA_PRODUCER: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 5,
    "batch.num.messages": BATCH,
    "compression.type": "none",
}
# A fetch brings at most max.partition.fetch.bytes (1 MiB, the default): about 1000 records, the
# HTTP page. The consumer keeps a couple of pages ahead rather than librdkafka's default 64 MiB,
# which would hold the whole log and hide its fetches from a short window; with a queue that
# small, librdkafka's pause once it is full (fetch.queue.backoff.ms, 1 s by default) must be short.
KAFKA_CONSUMER: dict[str, Any] = {
    "group.id": "txlog-bench",  # never joined: partitions are assigned, offsets never committed
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "max.partition.fetch.bytes": 1_048_576,
    "queued.min.messages": 2 * PAGE,
    "queued.max.messages.kbytes": 4096,
    "fetch.queue.backoff.ms": 2,
}
# A share consumer's poll hands over at most a batch, as PgQueuer's dequeue and pgmq's read take.
# Implicit acknowledgement (librdkafka's default): each poll accepts the records of the one before,
# and the acceptances ride on the next ShareFetch.
KAFKA_SHARE_CONSUMER: dict[str, Any] = {"share.acknowledgement.mode": "implicit", "max.poll.records": BATCH}


class KafkaProduceRunner:
    """A confluent-kafka producer sending batches of 100 records to one partition, idempotent, or
    transactional committing every ``commit_every`` batches; a step is one batch, produced and
    acknowledged (its last record's delivery report: a partition's records are acknowledged in
    order). One batch goes before the window (connection, metadata, producer id).

    One batch at a time, as the raw append and the HTTP lanes: the gateway answers a connection's
    requests one at a time anyway. With more batches outstanding an idempotent librdkafka 2.x
    producer busy-polls its socket (``poll`` with a zero timeout, tens of thousands a second) while
    they wait for their acknowledgements: measured here, 4-7 ms of client CPU per batch against
    0.4-0.6 ms one at a time (0.45 ms with idempotence off), taken from the cores the gateway and
    PostgreSQL need."""

    def __init__(self, lane: Lane) -> None:
        from confluent_kafka import Producer

        self.lane = lane
        self.transactional = lane.mode == "transactional"
        conf = {"bootstrap.servers": lane.target, **KAFKA_PRODUCER}
        if self.transactional:
            conf["transactional.id"] = lane.transactional_id
        self.producer = Producer(conf)
        self.keys, self.values = batch_keys(), batch_values()
        self.latencies: list[tuple[float, float]] = []  # commit_transaction(): EndTxn (the batches are acknowledged)
        self.offset = 0
        self.empty = 0
        self.acked = 0
        self.failed: str | None = None
        self.open_batches = 0
        if self.transactional:
            self.producer.init_transactions(30)
            self.producer.begin_transaction()
            self._send()
            self._commit()
            self.latencies.clear()
        else:
            self._send()
            self.producer.flush(30)
        self._check()
        self.acked = 0

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed = self.failed or str(err)
        else:
            self.acked += BATCH

    def _send(self) -> None:
        """One batch, produced and acknowledged."""
        produce, topic, partition = self.producer.produce, self.lane.topic, self.lane.partition
        for key, value in zip(self.keys[:-1], self.values[:-1]):
            produce(topic, value, key, partition=partition)
        produce(topic, self.values[-1], self.keys[-1], partition=partition, on_delivery=self._delivered)
        acked = self.acked
        deadline = time.monotonic() + 60
        while self.acked == acked and not self.failed:
            self.producer.poll(0.5)
            if time.monotonic() > deadline:
                raise RuntimeError("a batch not acknowledged in 60 s")

    def _commit(self) -> None:
        started = time.monotonic()
        self.producer.commit_transaction(30)
        done = time.monotonic()
        self.latencies.append((done, (done - started) * 1000))
        self.open_batches = 0
        self.producer.begin_transaction()

    def _check(self) -> None:
        if self.failed:
            raise RuntimeError(f"delivery failed: {self.failed}")

    def step(self) -> int:
        self._send()
        if self.transactional:
            self.open_batches += 1
            if self.open_batches >= self.lane.commit_every:
                self._commit()
        self._check()
        n, self.acked = self.acked, 0
        return n

    def close(self) -> None:
        # Never leave a transaction open (it would hold the last stable offset), nor records unsent.
        if self.transactional and self.open_batches:
            self.producer.commit_transaction(30)
        left = self.producer.flush(30)
        self.producer.close()
        if left:
            raise RuntimeError(f"{left} records not acknowledged at the end of the window")


class KafkaFetchRunner:
    """A confluent-kafka consumer of one partition by ``assign`` (no group), at the lane's
    isolation level, from ``offset``. Once it has delivered the record before ``end`` (bench.kafka
    sets it short of the log's end) it seeks back to the log start, as the raw page fetch wraps.
    The first records arrive before the window (connection, metadata, the first fetch)."""

    def __init__(self, lane: Lane) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.tp = TopicPartition
        self.topic, self.partition, self.end = lane.topic, lane.partition, lane.end
        self.consumer = Consumer({"bootstrap.servers": lane.target, "isolation.level": lane.mode, **KAFKA_CONSUMER})
        self.offset = lane.offset if lane.offset < lane.end else 0
        self.consumer.assign([TopicPartition(self.topic, self.partition, self.offset)])
        self.latencies: list[tuple[float, float]] = []
        self.empty = 0
        deadline = time.monotonic() + 30
        while not self.step():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no records from {self.topic}-{self.partition} at offset {self.offset} in 30 s")
        self.empty = 0

    def step(self) -> int:
        msgs = self.consumer.consume(PAGE, 1.0)
        if not msgs:
            self.empty += 1
            return 0
        for m in msgs:
            if m.error() is not None:
                raise RuntimeError(f"consume: {m.error()}")
        nxt = msgs[-1].offset() + 1
        if nxt >= self.end:
            self.consumer.seek(self.tp(self.topic, self.partition, 0))
            nxt = 0
        self.offset = nxt
        return len(msgs)

    def close(self) -> None:
        self.consumer.close()


class KafkaShareRunner:
    """A confluent-kafka ``ShareConsumer`` (KIP-932) in the lane's share group, subscribed to the
    lane's topic, in implicit acknowledgement mode (librdkafka's default): a step is one ``poll``
    (up to a batch of records, ``max.poll.records``), which accepts the batch polled before — the
    acceptances ride on the ShareFetch asking for more. Counted: records polled (each accepted by
    the next poll; the last batch by ``close``). The first records arrive before the window
    (joining the group, the assignment, the first ShareFetch)."""

    mode = "implicit"

    def __init__(self, lane: Lane) -> None:
        from confluent_kafka import AcknowledgeType, ShareConsumer

        self.accept = AcknowledgeType.ACCEPT
        conf = {**KAFKA_SHARE_CONSUMER, "share.acknowledgement.mode": self.mode}
        self.consumer = ShareConsumer({"bootstrap.servers": lane.target, "group.id": lane.group, **conf})
        self.consumer.subscribe([lane.topic])
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0
        deadline = time.monotonic() + 60
        while not self.step():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no records for share group {lane.group} of {lane.topic} in 60 s")
        self.empty = 0

    def _polled(self) -> list[Any]:
        msgs = self.consumer.poll(1.0) or []
        for m in msgs:
            if m.error() is not None:
                raise RuntimeError(f"share consume: {m.error()}")
        return msgs

    def step(self) -> int:
        n = len(self._polled())
        if not n:
            self.empty += 1
        return n

    def close(self) -> None:
        self.consumer.close()


class KafkaShareExplicitRunner(KafkaShareRunner):
    """``KafkaShareRunner`` in explicit acknowledgement mode: each record polled acknowledged
    ACCEPT, then ``commit_sync`` (Kafka's ShareAcknowledge, answered before the next poll): two
    round trips per batch. Counted: records accepted."""

    mode = "explicit"

    def step(self) -> int:
        msgs = self._polled()
        for m in msgs:
            self.consumer.acknowledge(m, self.accept)
        if not msgs:
            self.empty += 1
            return 0
        failed = [f"{tp}: {err}" for tp, err in (self.consumer.commit_sync(30) or {}).items() if err is not None]
        if failed:
            raise RuntimeError(f"acknowledgements refused: {failed[:3]}")
        return len(msgs)


# --- PostgreSQL directly --------------------------------------------------------------------------

_RAW_LOCK = "SELECT next FROM public.bench_counter WHERE p = %b FOR UPDATE"
_RAW_ADVANCE = "UPDATE public.bench_counter SET next = next + %b WHERE p = %b"
_RAW_INSERT = (
    'INSERT INTO public.bench_raw (topic, partition, "offset", key, value, "timestamp") '
    "SELECT %b, %b, %b + u.o - 1, u.k, u.v, now() "
    "FROM unnest(%b::bytea[], %b::bytea[]) WITH ORDINALITY AS u(k, v, o)"
)
_RAW_PAGE = (
    'SELECT "offset", key, value, header_keys, header_values, "timestamp" FROM txlog.records '
    'WHERE topic = %b AND partition = %b AND "offset" >= %b ORDER BY "offset" LIMIT %b'
)


def create_raw_tables(conn: Any, partitions: int) -> None:
    """The raw append's table (like txlog.records) and its per-partition counter rows, made anew."""
    conn.execute("DROP TABLE IF EXISTS public.bench_raw, public.bench_counter")
    conn.execute("CREATE TABLE public.bench_raw (LIKE txlog.records INCLUDING ALL)")
    conn.execute("CREATE TABLE public.bench_counter (p int PRIMARY KEY, next bigint NOT NULL)")
    conn.execute("INSERT INTO public.bench_counter SELECT p, 0 FROM generate_series(0, %s) AS p", (partitions - 1,))


class RawAppendRunner:
    """The least a durable append at dense offsets costs: one transaction per batch that locks the
    partition's counter row, advances it and inserts the batch (binary parameters)."""

    def __init__(self, lane: Lane) -> None:
        import psycopg

        self.conn = psycopg.connect(lane.target)
        self.cur = self.conn.cursor()
        self.partition = lane.partition
        self.keys, self.values = batch_keys(), batch_values()
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0

    def step(self) -> int:
        cur = self.cur
        cur.execute(_RAW_LOCK, (self.partition,))
        (base,) = cur.fetchone()  # type: ignore[misc]
        cur.execute(_RAW_ADVANCE, (BATCH, self.partition))
        cur.execute(_RAW_INSERT, ("raw", self.partition, base, self.keys, self.values))
        self.conn.commit()
        return BATCH

    def close(self) -> None:
        self.conn.close()


class RawFetchRunner:
    """A page of the log by its primary key, binary results, no filtering at all."""

    def __init__(self, lane: Lane) -> None:
        import psycopg

        self.conn = psycopg.connect(lane.target, autocommit=True)
        self.cur = self.conn.cursor(binary=True)
        self.topic, self.partition, self.offset, self.end = lane.topic, lane.partition, lane.offset, lane.end
        self.latencies: list[tuple[float, float]] = []
        self.empty = 0

    def step(self) -> int:
        self.cur.execute(_RAW_PAGE, (self.topic, self.partition, self.offset, PAGE))
        rows = self.cur.fetchall()
        nxt = rows[-1][0] + 1 if len(rows) == PAGE else 0
        self.offset = 0 if self.end and nxt >= self.end else nxt
        return len(rows)

    def close(self) -> None:
        self.conn.close()


# --- PgQueuer -------------------------------------------------------------------------------------


def pgq_queries(conn: Any) -> Any:
    """PgQueuer's query layer on a psycopg async connection, its objects in their own schema."""
    from pgqueuer.adapters.drivers.psycopg import PsycopgDriver
    from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment, QueryQueueBuilder, QuerySchedulerBuilder
    from pgqueuer.adapters.persistence.queries import Queries
    from pgqueuer.domain.settings import DBSettings

    settings = DBSettings(db_schema=PGQ_SCHEMA)
    return Queries(
        PsycopgDriver(conn),
        qbe=QueryBuilderEnvironment(settings),
        qbq=QueryQueueBuilder(settings),
        qbs=QuerySchedulerBuilder(settings),
    )


class PgqRunner:
    """PgQueuer called in-process (its own asyncio loop in this lane's thread): ``enqueue`` of a batch,
    or ``dequeue`` of a batch followed by its ack (``log_jobs`` with status successful)."""

    def __init__(self, lane: Lane) -> None:
        import psycopg

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(psycopg.AsyncConnection.connect(lane.target, autocommit=True))
        self.q = pgq_queries(self.conn)
        self.dequeue = lane.kind == "pgq_dequeue"
        self.payloads: list[bytes | None] = list(batch_values())
        self.manager = uuid.uuid4()
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0

    def step(self) -> int:
        return self.loop.run_until_complete(self._dequeue_ack() if self.dequeue else self._enqueue())

    async def _enqueue(self) -> int:
        await self.q.enqueue([PGQ_ENQUEUE] * BATCH, self.payloads, [0] * BATCH)
        return BATCH

    async def _dequeue_ack(self) -> int:
        from pgqueuer.ports.repository import EntrypointExecutionParameter

        jobs = await self.q.dequeue(
            batch_size=BATCH,
            entrypoints={PGQ_DEQUEUE: EntrypointExecutionParameter(concurrency_limit=0)},
            queue_manager_id=self.manager,
            global_concurrency_limit=None,
            heartbeat_timeout=timedelta(seconds=60),
        )
        if not jobs:
            self.empty += 1
            return 0
        await self.q.log_jobs([(job, "successful", None) for job in jobs])
        return len(jobs)

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


# --- pgmq -----------------------------------------------------------------------------------------

_PGMQ_READ = "SELECT msg_id, read_ct, enqueued_at, vt, message FROM pgmq.read(%s, %s, %s)"
_PGMQ_DELETE = "SELECT count(*) FROM pgmq.delete(%s, %s::bigint[])"
PGMQ_VISIBILITY_S = 30  # a message read is invisible this long: share.record.lock.duration.ms's 30 s


class PgmqRunner:
    """pgmq (its SQL functions, installed from the ``pgmq`` package's bundled SQL) over psycopg:
    ``pgmq.read`` of a batch, invisible to other readers for 30 s, then ``pgmq.delete`` of their
    ids — two statements, each its own transaction, as a pgmq consumer does."""

    def __init__(self, lane: Lane) -> None:
        import psycopg

        self.conn = psycopg.connect(lane.target, autocommit=True)
        self.cur = self.conn.cursor(binary=True)
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0

    def step(self) -> int:
        self.cur.execute(_PGMQ_READ, (PGMQ_QUEUE, PGMQ_VISIBILITY_S, BATCH))
        ids = [row[0] for row in self.cur.fetchall()]
        if not ids:
            self.empty += 1
            return 0
        self.cur.execute(_PGMQ_DELETE, (PGMQ_QUEUE, ids))
        (deleted,) = self.cur.fetchone()  # type: ignore[misc]
        return int(deleted)

    def close(self) -> None:
        self.conn.close()


_RUNNERS: dict[str, Callable[[Lane], Runner]] = {
    "produce": ProduceRunner,
    "fetch": FetchRunner,
    "raw_append": RawAppendRunner,
    "raw_fetch": RawFetchRunner,
    "pgq_enqueue": PgqRunner,
    "pgq_dequeue": PgqRunner,
    "pgmq_read": PgmqRunner,
    "share_acquire": ShareAcquireRunner,
    "kafka_share": KafkaShareRunner,
    "kafka_share_explicit": KafkaShareExplicitRunner,
    "kafka_produce": KafkaProduceRunner,
    "kafka_fetch": KafkaFetchRunner,
}


# --- the client process ---------------------------------------------------------------------------


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _drive(runner: Runner, start: float, warm: float, end: float, out: LaneResult) -> None:
    try:
        _sleep_until(start)
        while time.monotonic() < end:
            n = runner.step()
            done = time.monotonic()
            if warm <= done <= end:
                out.rows += n
    except Exception:
        out.error = traceback.format_exc()
    finally:
        try:
            runner.close()
        except Exception:
            out.error = out.error or traceback.format_exc()
    out.latencies_ms = [ms for at, ms in runner.latencies if warm <= at <= end]
    out.offset = runner.offset
    out.empty = runner.empty


def client_main(conn: Connection) -> None:
    """A client process: ``(lanes, warmup, window)`` → sets up and answers ``ready`` (or an error)
    → ``start`` (a time.monotonic() instant, the same clock in every process; ``None`` calls the
    window off) → runs → answers a ClientResult. ``None`` instead of lanes ends the process."""
    while True:
        msg = conn.recv()
        if msg is None:
            return
        lanes, warmup, window = msg
        runners: list[Runner] = []
        try:
            for lane in lanes:
                runners.append(_RUNNERS[lane.kind](lane))
        except Exception:
            for r in runners:
                r.close()
            conn.send(("error", traceback.format_exc()))
            continue
        conn.send(("ready", None))
        start = conn.recv()
        if start is None:  # another client's set-up failed: the window is called off
            for r in runners:
                r.close()
            continue
        warm, end = start + warmup, start + warmup + window
        results = [LaneResult() for _ in runners]
        threads = [
            threading.Thread(target=_drive, args=(r, start, warm, end, out), daemon=True) for r, out in zip(runners, results)
        ]
        for t in threads:
            t.start()
        _sleep_until(warm)
        cpu0 = _cpu_seconds()
        _sleep_until(end)
        cpu1 = _cpu_seconds()
        for t in threads:
            t.join()
        conn.send(("done", ClientResult(results, cpu1 - cpu0)))


class ClientPool:
    """Client processes started once (spawn) and given lanes window after window."""

    def __init__(self, processes: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._pipes: list[Connection] = []
        self._procs = []
        for i in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=client_main, args=(child,), name=f"bench-client-{i}", daemon=True)
            proc.start()
            child.close()
            self._pipes.append(parent)
            self._procs.append(proc)

    @property
    def size(self) -> int:
        return len(self._procs)

    def run(
        self, assignment: list[list[Lane]], warmup: float, window: float, sample: Callable[[], Any]
    ) -> tuple[list[tuple[list[Lane], ClientResult]], Any, Any]:
        """Run a window: process i drives ``assignment[i]``. Answers each busy process's lanes with
        its result, and the readings ``sample`` took here at the start and at the end of the
        measured window (server and database CPU)."""
        busy = [(pipe, lanes) for pipe, lanes in zip(self._pipes, assignment) if lanes]
        for pipe, lanes in busy:
            pipe.send((lanes, warmup, window))
        answers = [(pipe, pipe.recv()) for pipe, _ in busy]
        failures = [detail for _, (status, detail) in answers if status != "ready"]
        start = time.monotonic() + 0.05
        for pipe, (status, _) in answers:
            if status == "ready":
                pipe.send(None if failures else start)
        if failures:
            raise RuntimeError("client set-up failed:\n" + failures[0])
        _sleep_until(start + warmup)
        first = sample()
        _sleep_until(start + warmup + window)
        last = sample()
        results = [(lanes, pipe.recv()[1]) for pipe, lanes in busy]
        errors = [lane.error for _, r in results for lane in r.lanes if lane.error]
        if errors:
            raise RuntimeError("client error:\n" + errors[0])
        return results, first, last

    def close(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
