"""The lanes of Kafka's wire protocol: produce, fetch, and share consumers in implicit and explicit
acknowledgement mode.

They drive confluent-kafka (librdkafka) as an application would: a producer per
partition calling ``produce`` per record and counting acknowledged batches from delivery reports,
and a consumer per partition calling ``consume``. librdkafka's own threads do the batching,
framing and I/O; their CPU is the client process's too.
"""

from __future__ import annotations

import time
from typing import Any

from bench.lanes import BATCH, PAGE, Lane, batch_keys, batch_values

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


# --- many partitions (bench.partitions) -------------------------------------------------------------

# The producer of the many-partitions rows: idempotent, linger 5 ms, 1 KiB values, librdkafka's own
# batch limits — a partition's batch holds what accumulated for it while the requests before were in
# flight, so the same records make batches of a few records over 1,000 partitions and of hundreds
# over 8.
KAFKA_SPREAD_PRODUCER: dict[str, Any] = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, "compression.type": "none"}
SPREAD_CHUNK = 500  # records produced per step, round-robin over the lane's partitions
SPREAD_OUTSTANDING = 10_000  # records produced and not yet acknowledged, at most, per producer


class KafkaSpreadProduceRunner:
    """A confluent-kafka idempotent producer writing the batch's records in turn to each of the
    lane's partitions, keeping up to ``SPREAD_OUTSTANDING`` records unacknowledged: a step is
    ``SPREAD_CHUNK`` records produced; counted are the records acknowledged meanwhile."""

    def __init__(self, lane: Lane) -> None:
        from confluent_kafka import Producer

        self.lane = lane
        self.partitions = list(lane.partitions)
        self.keys, self.values = batch_keys(), batch_values()
        self.acked = 0
        self.failed: str | None = None
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0
        self.turn = 0
        self.producer = Producer({"bootstrap.servers": lane.target, **KAFKA_SPREAD_PRODUCER, "on_delivery": self._delivered})
        self.step()
        self.producer.flush(60)
        if self.failed:
            raise RuntimeError(f"delivery failed: {self.failed}")
        self.acked = 0

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed = self.failed or str(err)
        else:
            self.acked += 1

    def step(self) -> int:
        produce, topic, parts, n = self.producer.produce, self.lane.topic, self.partitions, len(self.partitions)
        keys, values, turn = self.keys, self.values, self.turn
        for i in range(turn, turn + SPREAD_CHUNK):
            produce(topic, values[i % BATCH], keys[i % BATCH], partition=parts[i % n])
        self.turn = turn + SPREAD_CHUNK
        self.producer.poll(0)
        while len(self.producer) > SPREAD_OUTSTANDING and not self.failed:
            self.producer.poll(0.005)
        if self.failed:
            raise RuntimeError(f"delivery failed: {self.failed}")
        done, self.acked = self.acked, 0
        return done

    def close(self) -> None:
        left = self.producer.flush(60)
        if left:
            raise RuntimeError(f"{left} records not acknowledged at the end of the window")


# A Fetch over many partitions brings at most 4 MiB (librdkafka's default is 50 MiB): over 1,000
# partitions of 100 records that would be the whole log in one answer, the consumer's queue far
# beyond the couple of pages it keeps (KAFKA_CONSUMER).
KAFKA_SPREAD_CONSUMER: dict[str, Any] = {"fetch.max.bytes": 4 * 1_048_576}


class KafkaSpreadFetchRunner:
    """A confluent-kafka read_committed consumer of the lane's partitions by ``assign`` (no group)
    from their starts; a partition whose record before its ``ends`` entry is delivered is sought
    back to its start. Counted: records handed to the application."""

    def __init__(self, lane: Lane) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.tp = TopicPartition
        self.topic = lane.topic
        self.end = dict(zip(lane.partitions, lane.ends))
        self.consumer = Consumer(
            {"bootstrap.servers": lane.target, "isolation.level": lane.mode, **KAFKA_CONSUMER, **KAFKA_SPREAD_CONSUMER}
        )
        self.consumer.assign([TopicPartition(self.topic, p, 0) for p in lane.partitions])
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0
        deadline = time.monotonic() + 60
        while not self.step():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no records from {self.topic} in 60 s")
        self.empty = 0

    def step(self) -> int:
        # A short wait: a consumer of one partition whose records left before the wrap are fewer
        # than PAGE gets them only when the wait ends (nothing more comes until the seek), and
        # with 1 s it read its partition once a second (45,040 records/s for eight consumers).
        msgs = self.consumer.consume(PAGE, 0.05)
        if not msgs:
            self.empty += 1
            return 0
        wrapped = set()
        for m in msgs:
            if m.error() is not None:
                raise RuntimeError(f"consume: {m.error()}")
            p = m.partition()
            if m.offset() + 1 >= self.end[p] and p not in wrapped:
                wrapped.add(p)
        for p in wrapped:
            self.consumer.seek(self.tp(self.topic, p, 0))
        return len(msgs)

    def close(self) -> None:
        self.consumer.close()


# The end-to-end lane's producer sends each record at once (linger 0): the latency measured is the
# gateway's and the database's, not the client's wait for a fuller batch.
KAFKA_LATENCY_PRODUCER: dict[str, Any] = {**KAFKA_SPREAD_PRODUCER, "linger.ms": 0}


class KafkaLatencyRunner:
    """Produce → visible to a read_committed consumer: an idempotent producer writing ``lane.rate``
    records a second (0: as fast as ``SPREAD_OUTSTANDING`` unacknowledged records allow, the peak)
    in turn to the lane's partitions, each value starting with the wall-clock time
    it was produced at (8 bytes, nanoseconds), and a read_committed consumer of those partitions
    (from their ends) in a thread of its own, noting for each record the time from its produce to
    its delivery to the application, and (``acks``) to its acknowledgement, the first part of that
    time. Counted: records acknowledged."""

    def __init__(self, lane: Lane) -> None:
        import threading

        from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

        self.lane = lane
        self.partitions = list(lane.partitions)
        self.keys, self.values = batch_keys(), [v[8:] for v in batch_values()]
        self.latencies: list[tuple[float, float]] = []
        self.acks: list[tuple[float, float]] = []  # (acknowledged at, ms from produce): the first part of a latency
        self.offset = 0
        self.empty = 0
        self.acked = 0
        self.failed: str | None = None
        self.producer = Producer({"bootstrap.servers": lane.target, **KAFKA_LATENCY_PRODUCER, "on_delivery": self._delivered})
        self.consumer = Consumer({"bootstrap.servers": lane.target, "isolation.level": "read_committed", **KAFKA_CONSUMER})
        self.consumer.assign([TopicPartition(lane.topic, p, OFFSET_END) for p in self.partitions])
        self.stopped = threading.Event()
        self.seen = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 60
        while not self.seen.is_set():  # the consumer is at the end: a record produced now reaches it
            self._produce(1)
            self.producer.flush(10)
            if self.seen.wait(0.5):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no record of {lane.topic} consumed in 60 s")
        self.latencies.clear()
        self.acks.clear()
        self.acked = 0
        self.sent = 0
        # The pace counts from the first step, not from here: the window starts once every client
        # is set up, and records "due" for that wait, sent at once, were a burst that queued in the
        # client (and in the gateway) for the whole window.
        self.started: float | None = None

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed = self.failed or str(err)
        else:
            self.acked += 1
            # Noted when the producer's poll serves the report: at most a step after it came.
            self.acks.append((time.monotonic(), (time.time_ns() - int.from_bytes(msg.value()[:8], "big")) / 1e6))

    def _produce(self, n: int) -> None:
        produce, topic, parts = self.producer.produce, self.lane.topic, self.partitions
        for _ in range(n):
            i = self.offset
            self.offset += 1
            value = time.time_ns().to_bytes(8, "big") + self.values[i % BATCH]
            produce(topic, value, self.keys[i % BATCH], partition=parts[i % len(parts)])

    def _read(self) -> None:
        # A record is noted as soon as the client hands it over: ``poll`` returns with the first
        # one, then ``consume`` with no timeout takes what else is there. (``consume(PAGE, 0.1)``
        # returns only once it has PAGE records or its 0.1 s passed, which added up to 100 ms.)
        while not self.stopped.is_set():
            first = self.consumer.poll(0.1)
            if first is None:
                continue
            msgs = [first, *self.consumer.consume(PAGE - 1, 0)]
            now = time.time_ns()
            at = time.monotonic()
            for m in msgs:
                if m.error() is not None:
                    self.failed = self.failed or f"consume: {m.error()}"
                    continue
                sent = int.from_bytes(m.value()[:8], "big")
                self.latencies.append((at, (now - sent) / 1e6))
            if msgs:
                self.seen.set()

    def step(self) -> int:
        if not self.lane.rate:
            self._produce(SPREAD_CHUNK)
            self.producer.poll(0)
            while len(self.producer) > SPREAD_OUTSTANDING and not self.failed:
                self.producer.poll(0.005)
            if self.failed:
                raise RuntimeError(self.failed)
            done, self.acked = self.acked, 0
            return done
        if self.started is None:
            self.started = time.monotonic()
        due = int((time.monotonic() - self.started) * self.lane.rate) + 1 - self.sent
        if due > 0:
            self._produce(due)
            self.sent += due
        self.producer.poll(0)
        if self.failed:
            raise RuntimeError(self.failed)
        time.sleep(max(0.0, self.started + (self.sent + 1) / self.lane.rate - time.monotonic()))
        done, self.acked = self.acked, 0
        return done

    def close(self) -> None:
        self.producer.flush(30)
        self.stopped.set()
        self.reader.join(10)
        self.consumer.close()
