"""Kafka's own clients ride through PostgreSQL going away under two gateways.

Two ``txlog kafka`` gateways share one PostgreSQL. Under load:
- idempotent producers, one per client: confluent-kafka with ``metadata.recovery.strategy=none``
  and with its default (re-bootstrap), kafka-python and aiokafka, each writing numbered values;
- transactional copiers (``tests/kafka/copier_*.py``): confluent-kafka with either recovery
  strategy, kafka-python and aiokafka, each copying its own input topic to its own output topic, one
  transaction per poll with the input offsets in it;
- read_committed group consumers, one per client, following every output topic.

Meanwhile PostgreSQL is stopped in immediate mode (no checkpoint, crash recovery on start) and
started again at once, twice, then stopped for longer than the clients' request timeout. After
each fault every producer must have new values acknowledged; afterwards every copier finishes in
its first run (its transactions in flight at a restart ended committed or aborted and it went on),
every acknowledged value is in the log exactly once where it was acknowledged and nothing was
written twice, each output is its input transformed exactly once, and each consumer read every
copy in order and nothing uncommitted (a group consumer may read records again from its committed
offset after a rebalance: at least once, as Kafka's). Every producer's client objects are the ones created before the first fault: a client that
lost its brokers would never deliver again.

``make chaos`` runs this module by name (it is not a ``test_*.py``); the suite's slice of it is the
fault suite's PostgreSQL restarts under its Kafka doors (tests/chaos/test_fault_suite.py), with the
producers, copiers and consumers defined here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

from app.storage.embedded import EmbeddedPostgres
from tests.chaos.checker import acknowledged_where
from tests.kafka.conftest import GatewayProcess
from tests.kafka.test_exactly_once import COPIERS
from tests.support import ROOT, wait_until

pytestmark = pytest.mark.slow

PARTITIONS = 3
REQUEST_TIMEOUT_MS = 5000
OUTAGE_S = REQUEST_TIMEOUT_MS / 1000 + 3  # longer than every client's request timeout
COPY_RECORDS = 1800  # per copier: at its pace, enough for the copiers to be mid-run at every fault
HELD_BACK = 2 * PARTITIONS  # of each copier's input, produced only once the faults are over
PROGRESS_S = 90  # how long a client may take to deliver again after PostgreSQL is back
ACKS = "acks"
PROGRAMS = {**COPIERS, "aiokafka": COPIERS["confluent"].with_name("copier_aiokafka.py")}
COPIER_RUNS = {  # name -> (program, extra arguments); a call blocked for 30 s is a wedged client
    "confluent-none": ("confluent", ["--metadata-recovery", "none"]),
    "confluent-rebootstrap": ("confluent", ["--metadata-recovery", "rebootstrap"]),
    "kafka-python": ("kafka-python", ["--stuck-after-s", "30"]),
    "aiokafka": ("aiokafka", ["--stuck-after-s", "30"]),
}


@dataclass
class Acked:
    """What one idempotent producer was told."""

    name: str
    # value -> (partition, offset); the offset is None when acknowledged implicitly (checker.Acknowledged)
    acked: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    last_ack: float = 0.0  # time.monotonic() of the last acknowledgement
    errors: Counter = field(default_factory=Counter)  # delivery failures, by error
    failed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, value: str, partition: int, offset: int | None) -> None:
        with self.lock:
            self.acked[value] = (partition, offset)
            self.last_ack = time.monotonic()

    def fail(self, value: str, error: object) -> None:
        with self.lock:
            self.failed.append(value)
            self.errors[str(error)[:120]] += 1


def wait_progressing(done: Callable[[], bool], progress: Callable[[], Any], idle_s: float, what: str) -> None:
    """Wait until ``done``, for as long as ``progress`` keeps changing: fail only after ``idle_s``
    without a change (a loaded machine reads slower; a stuck client reads nothing)."""
    last, since = progress(), time.monotonic()
    while not done():
        time.sleep(0.2)
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > idle_s:
            raise AssertionError(f"no progress for {idle_s} s waiting for {what}")


class Load:
    """The producers' and consumers' threads, each with one client object for the whole run."""

    def __init__(self, bootstrap: str, outputs: list[str], log_dir: Path) -> None:
        self.bootstrap = bootstrap
        self.log_dir = log_dir
        self.outputs = outputs
        self.stop = threading.Event()
        self.producers = {name: Acked(name) for name in ("confluent-none", "confluent-rebootstrap", "kafka-python", "aiokafka")}
        # per consumer, per (topic, partition): the (offset, value) of each record read, in order
        self.read: dict[str, dict[tuple[str, int], list[tuple[int, bytes]]]] = {
            name: defaultdict(list) for name in ("confluent", "kafka-python", "aiokafka")
        }
        self.failures: list[str] = []
        self.pause_s = 0.05  # between each producer's groups of five values
        self.threads: list[threading.Thread] = []

    def start(self, runs: dict[str, Callable[[], Any]] | None = None) -> None:
        """Every client's thread, or those of ``runs`` (name -> what its thread runs)."""
        runs = runs if runs is not None else self.runs()
        for name, run in runs.items():
            t = threading.Thread(target=self._guarded, args=(name, run), name=name, daemon=True)
            t.start()
            self.threads.append(t)

    def runs(self) -> dict[str, Callable[[], Any]]:
        return {
            "confluent-none": lambda: self.confluent_producer(self.producers["confluent-none"], "none"),
            "confluent-rebootstrap": lambda: self.confluent_producer(self.producers["confluent-rebootstrap"], "rebootstrap"),
            "kafka-python": lambda: self.kafka_python_producer(self.producers["kafka-python"]),
            "aiokafka": lambda: asyncio.run(self._aiokafka_producer(self.producers["aiokafka"])),
            "read-confluent": lambda: self._confluent_consumer(self.read["confluent"]),
            "read-kafka-python": lambda: self._kafka_python_consumer(self.read["kafka-python"]),
            "read-aiokafka": lambda: asyncio.run(self._aiokafka_consumer(self.read["aiokafka"])),
        }

    def _guarded(self, name: str, run: Callable[[], Any]) -> None:
        try:
            run()
        except Exception as exc:  # a client call that raised: the test fails with it
            self.failures.append(f"{name}: {exc!r}")
            raise

    def halt(self) -> None:
        """Stop every client thread and wait for it to close its client, whatever the test's outcome
        (a client left running would go on after the test: kafka-python's reconnects among others)."""
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def join(self) -> None:
        self.halt()
        assert not [t.name for t in self.threads if t.is_alive()], "a client thread did not stop"

    def _values(self, log: Acked, pause: bool = True) -> Iterator[tuple[int, str]]:
        """Five values, then a pause of ``pause_s`` (the caller's when ``pause`` is false), until stopped."""
        i = 0
        while not self.stop.is_set():
            for _ in range(5):
                yield i % PARTITIONS, f"{log.name}-{i}"
                i += 1
            if pause:
                time.sleep(self.pause_s)

    # -- producers ---------------------------------------------------------------------------------

    def confluent_producer(self, log: Acked, recovery: str, bootstrap: str | None = None) -> None:
        """An idempotent confluent-kafka producer writing ``log``'s values to ACKS, through
        ``bootstrap`` (the gateways' by default) until stopped."""
        from confluent_kafka import Producer

        p = Producer(
            {
                "bootstrap.servers": bootstrap or self.bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "request.timeout.ms": REQUEST_TIMEOUT_MS,
                "metadata.recovery.strategy": recovery,
            }
        )

        def report(err, msg) -> None:  # type: ignore[no-untyped-def]
            value = msg.value().decode()
            if err is None:
                log.ack(value, msg.partition(), msg.offset())
            else:
                log.fail(value, err)

        for partition, value in self._values(log):
            p.produce(ACKS, value.encode(), partition=partition, on_delivery=report)
            p.poll(0)
        assert p.flush(PROGRESS_S) == 0, f"{log.name}: records still undelivered"

    def kafka_python_producer(self, log: Acked) -> None:
        """An idempotent kafka-python producer writing ``log``'s values to ACKS until stopped."""
        from kafka import KafkaProducer

        p = KafkaProducer(
            bootstrap_servers=self.bootstrap.split(","),
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            reconnect_backoff_ms=50,
            reconnect_backoff_max_ms=1000,
        )
        for partition, value in self._values(log):
            future = p.send(ACKS, value.encode(), partition=partition)
            future.add_callback(lambda md, v=value: log.ack(v, md.partition, md.offset))
            future.add_errback(lambda exc, v=value: log.fail(v, exc))
        p.flush(PROGRESS_S)
        p.close(10)

    async def _aiokafka_producer(self, log: Acked) -> None:
        from aiokafka import AIOKafkaProducer

        p = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap.split(","),
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )
        await p.start()
        pending: set[asyncio.Future] = set()

        def done(value: str, future: asyncio.Future) -> None:
            pending.discard(future)
            if future.exception() is None:
                md = future.result()
                log.ack(value, md.partition, md.offset)
            else:
                log.fail(value, future.exception())

        try:
            for partition, value in self._values(log, pause=False):
                future = await p.send(ACKS, value.encode(), partition=partition)
                pending.add(future)
                future.add_done_callback(lambda f, v=value: done(v, f))
                if partition == PARTITIONS - 1:
                    await asyncio.sleep(0.03)
            await p.flush()
        finally:
            await p.stop()

    # -- consumers ---------------------------------------------------------------------------------

    def _confluent_consumer(self, read: dict[tuple[str, int], list[tuple[int, bytes]]]) -> None:
        from confluent_kafka import Consumer

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "readers-confluent",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "metadata.recovery.strategy": "none",
                "socket.timeout.ms": REQUEST_TIMEOUT_MS,
                **_librdkafka_log(self.log_dir / "consumer-confluent.log"),
            }
        )
        c.subscribe(self.outputs)
        try:
            while not self.stop.is_set():
                for m in c.consume(100, 0.25):
                    if m.error() is None:
                        read[(m.topic(), m.partition())].append((m.offset(), m.value()))
        finally:
            c.close()

    def _kafka_python_consumer(self, read: dict[tuple[str, int], list[tuple[int, bytes]]]) -> None:
        from kafka import KafkaConsumer

        c = KafkaConsumer(
            bootstrap_servers=self.bootstrap.split(","),
            group_id="readers-kafka-python",
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            request_timeout_ms=REQUEST_TIMEOUT_MS + 1000,
            reconnect_backoff_ms=50,
            reconnect_backoff_max_ms=1000,
        )
        c.subscribe(self.outputs)
        for topic in self.outputs:  # see docs/kafka.md: kafka-python's group leader wants the metadata first
            c.partitions_for_topic(topic)
        try:
            while not self.stop.is_set():
                for tp, records in c.poll(timeout_ms=250).items():
                    read[(tp.topic, tp.partition)].extend((r.offset, r.value) for r in records)
        finally:
            c.close()

    async def _aiokafka_consumer(self, read: dict[tuple[str, int], list[tuple[int, bytes]]]) -> None:
        from aiokafka import AIOKafkaConsumer

        c = AIOKafkaConsumer(
            *self.outputs,
            bootstrap_servers=self.bootstrap.split(","),
            group_id="readers-aiokafka",
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )
        await c.start()
        try:
            while not self.stop.is_set():
                for tp, records in (await c.getmany(timeout_ms=250)).items():
                    read[(tp.topic, tp.partition)].extend((r.offset, r.value) for r in records)
        finally:
            await c.stop()


def _librdkafka_log(path: Path) -> dict[str, Any]:
    """TXLOG_CHAOS_DEBUG=cgrp,fetch,…: librdkafka's debug contexts, logged to ``path``."""
    contexts = os.environ.get("TXLOG_CHAOS_DEBUG")
    if not contexts:
        return {}
    logger = logging.getLogger(f"librdkafka.{path.stem}")
    logger.addHandler(logging.FileHandler(path))
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return {"debug": contexts, "logger": logger}


class Copier:
    """One copier process: it must finish in its first run."""

    def __init__(self, name: str, bootstrap: str, log_dir: Path) -> None:
        program, extra = COPIER_RUNS[name]
        self.name = name
        self.input, self.output = f"in-{name}", f"out-{name}"
        self.argv = [
            sys.executable,
            str(PROGRAMS[program]),
            "--bootstrap",
            bootstrap,
            "--input",
            self.input,
            "--output",
            self.output,
            "--group",
            f"copier-{name}",
            "--transactional-id",
            f"copier-{name}",
            "--max-batch",
            "10",
            "--pause-ms",
            "200",
            *extra,
        ]
        self.log_path = log_dir / f"copier-{name}.log"
        self.proc: Any = None

    def start(self, ends: list[int]) -> None:
        import subprocess

        with open(self.log_path, "ab") as out:  # a copier started again logs after the one before
            self.proc = subprocess.Popen(
                [*self.argv, "--ends", ",".join(map(str, ends))],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def _distinct(read: dict[tuple[str, int], list[tuple[int, bytes]]]) -> dict[tuple[str, int, int], bytes]:
    """Each (topic, partition, offset) a consumer read, with its value."""
    return {(t, p, offset): value for (t, p), records in read.items() for offset, value in records}


def _ordered_runs(records: list[tuple[int, bytes]]) -> bool:
    """Offsets go up (past aborted records and markers), except where a consumer starts again from
    an earlier offset, one it read before."""
    seen: set[int] = set()
    previous = -1
    for offset, _ in records:
        if offset <= previous and offset not in seen:
            return False
        seen.add(offset)
        previous = offset
    return True


def create_topics(bootstrap: str, copiers: list[Copier]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [ACKS, *(c.input for c in copiers), *(c.output for c in copiers)]
    for future in admin.create_topics([NewTopic(t, PARTITIONS) for t in topics]).values():
        future.result(30)


def produce_inputs(bootstrap: str, copiers: list[Copier], numbers: range, inputs: dict[str, dict[int, list[bytes]]]) -> None:
    """Each copier's input values ``numbers``, round-robin over the partitions, added to ``inputs``."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for c in copiers:
        partitions = inputs.setdefault(c.input, {p: [] for p in range(PARTITIONS)})
        for i in numbers:
            value = b"%s-%d" % (c.name.encode(), i)
            producer.produce(c.input, value, partition=i % PARTITIONS)
            partitions[i % PARTITIONS].append(value)
            producer.poll(0)
    assert producer.flush(60) == 0


@pytest.fixture
def quiet_clients() -> Iterator[None]:
    """kafka-python and aiokafka log every refused connection; the test reports what matters."""
    loggers = [logging.getLogger(name) for name in ("kafka", "aiokafka")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    yield
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)


def test_kafka_clients_ride_through_postgresql_restarts_and_an_outage(
    own_postgres: EmbeddedPostgres, tmp_path: Path, quiet_clients: None
) -> None:
    pg = own_postgres
    rng = random.Random()
    env = {"TXLOG_KAFKA_NODE_LEASE_MS": "3000", "TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "300"}
    gateways = [GatewayProcess(pg.url, env=env, log_path=tmp_path / f"gateway-{n}.log", node_id=n) for n in (1, 2)]
    with contextlib.ExitStack() as stack:
        for g in gateways:
            stack.enter_context(g)
        bootstrap = ",".join(g.bootstrap for g in gateways)
        copiers = [Copier(name, bootstrap, tmp_path) for name in COPIER_RUNS]
        create_topics(bootstrap, copiers)
        # A copier finishes only once it has copied its whole input, and the last of it is written
        # after the faults: every fault finds every copier still at work, however fast it copies.
        inputs: dict[str, dict[int, list[bytes]]] = {}
        produce_inputs(bootstrap, copiers, range(COPY_RECORDS - HELD_BACK), inputs)
        load = Load(bootstrap, [c.output for c in copiers], tmp_path)
        load.start()
        stack.callback(load.halt)
        for c in copiers:
            c.start([COPY_RECORDS // PARTITIONS] * PARTITIONS)
            stack.callback(lambda c=c: c.proc.poll() is None and c.proc.kill())

        def diagnosis() -> str:
            return "\n".join(
                [f"producer {a.name}: {len(a.acked)} acked, errors {dict(a.errors)}" for a in load.producers.values()]
                + [f"consumer {name}: {sum(len(v) for v in read.values())} read" for name, read in load.read.items()]
                + outages
                + load.failures
                + [f"--- copier {c.name} (exit {c.proc.poll()}):\n{c.log()}" for c in copiers]
                + [f"--- gateway {g.node_id}:\n{g.log()[-3000:]}" for g in gateways]
            )

        outages: list[str] = []

        def all_deliver(since: float, what: str) -> None:
            wait_until(
                lambda: all(a.last_ack > since for a in load.producers.values()) or load.failures,
                PROGRESS_S,
                0.1,
                f"every producer to deliver again after {what}",
            )
            assert not load.failures, diagnosis()

        try:
            all_deliver(0, "the start")
            # The faults find every client running: each consumer has joined its group and read
            # from every output topic (a consumer joining while the database is away is another
            # matter: kafka-python's group leader then may assign without a topic's metadata).
            wait_until(
                lambda: all({t for t, _ in read} == set(load.outputs) for read in load.read.values()) or load.failures,
                PROGRESS_S,
                0.1,
                "every consumer to read from every output topic",
            )
            assert not load.failures, diagnosis()
            for fault in ("restart", "restart", "outage"):
                for c in copiers:
                    assert c.proc.poll() is None, f"copier {c.name} finished before the faults did\n{diagnosis()}"
                pg.kill()
                time.sleep(OUTAGE_S if fault == "outage" else rng.uniform(0.2, 1.0))
                started = time.monotonic()
                pg.start()
                all_deliver(started, f"PostgreSQL's {fault}")
                outages.append(f"{fault}: every producer delivered again {time.monotonic() - started:.1f} s after the start")
            produce_inputs(bootstrap, copiers, range(COPY_RECORDS - HELD_BACK, COPY_RECORDS), inputs)
            for c in copiers:
                c.proc.wait(600)
                assert c.proc.returncode == 0, f"copier {c.name} exited {c.proc.returncode}\n{diagnosis()}"
            expected = {(c.output, p): [v + b"!" for v in inputs[c.input][p]] for c in copiers for p in range(PARTITIONS)}
            wait_progressing(
                lambda: (
                    all(len(_distinct(read)) >= COPY_RECORDS * len(copiers) for read in load.read.values()) or bool(load.failures)
                ),
                lambda: tuple(len(_distinct(read)) for read in load.read.values()),
                PROGRESS_S,
                "every consumer to read every copy",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnosis()}") from None
        load.join()
        assert not load.failures, diagnosis()
        print("\n".join(outages))

    with psycopg.connect(pg.url) as conn:
        committed = conn.execute(
            'SELECT topic, partition, "offset", value FROM txlog.committed_records WHERE topic = ANY(%s) '
            'ORDER BY topic, partition, "offset"',
            ([c.output for c in copiers],),
        ).fetchall()
    out: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    records: dict[tuple[str, int, int], bytes] = {}
    for topic, partition, offset, value in committed:
        out[(topic, partition)].append(bytes(value))
        records[(topic, partition, offset)] = bytes(value)
    assert dict(out) == expected, "an output is not its input copied exactly once"
    for name, read in load.read.items():
        # A group consumer may read a record again after a rebalance (from the committed offset:
        # at least once); it must read each committed record, in order, and nothing else.
        replays = sum(len(r) for r in read.values()) - len(_distinct(read))
        assert not [k for k, v in _distinct(read).items() if records.get(k) != v], f"consumer {name} read a record not committed"
        firsts = {tp: [v for _, v in sorted(dict.fromkeys(r).keys())] for tp, r in read.items()}
        assert firsts == expected, f"consumer {name} did not read each copy, in order"
        assert all(_ordered_runs(r) for r in read.values()), f"consumer {name} went backwards other than to replay"
        print(f"consumer {name}: every copy read, {replays} read again after a rebalance")
    with psycopg.connect(pg.url) as conn:
        written = conn.execute(
            'SELECT partition, "offset", value FROM txlog.log_records WHERE topic = %s AND control_type IS NULL', (ACKS,)
        ).fetchall()
    where = Counter(bytes(v).decode() for _, _, v in written)
    twice = [v for v, n in where.items() if n > 1]
    assert not twice, f"written more than once: {twice[:10]}"
    at = {bytes(v).decode(): (p, o) for p, o, v in written}
    for a in load.producers.values():
        assert a.acked, f"{a.name} never delivered"
        lost = [v for v, (p, o) in a.acked.items() if v not in at or not acknowledged_where((ACKS, p, o), [(ACKS, *at[v])])]
        assert not lost, f"{a.name}: acknowledged but not in the log where acknowledged: " + ", ".join(
            f"{v} acknowledged at (partition, offset) {a.acked[v]}, in the log at {at.get(v, 'nowhere')}" for v in lost[:10]
        )
        assert not a.failed, f"{a.name}: {len(a.failed)} sends failed: {dict(a.errors)}"
