"""Idempotent and transactional produce over Kafka's wire protocol, with the real clients:
confluent-kafka (librdkafka: InitProducerId v4, AddPartitionsToTxn v0, EndTxn v1), kafka-python
3.0.12 (InitProducerId v4, AddPartitionsToTxn/EndTxn v3) and aiokafka 0.14 (every transaction API
at v0). Each keeps one epoch across its transactions (the coordinator's version-1 mode).

What each client shows: commit, abort, commit at one epoch read back exactly by read_committed
consumers of every client, by ``txlog.committed_records`` and by the services' fetch; offsets sent
to a transaction are the group's once it commits, never when it aborts; a second producer with the
same transactional id fences the first and aborts its open transaction. Raw frames show what no
client does on purpose: a retried batch answered with its first offsets, a sequence gap refused,
a transactional batch for a partition not added refused (KIP-890 part 1), KIP-360's epoch bump
and its fence. A transaction left open past its timeout is aborted by the gateway's sweeper."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Callable

import pytest
from sqlalchemy import text

from app.domain.log import StoredRecord
from app.domain.transactions import TxnState
from app.errors import ErrorCode
from app.services import Broker, fetch, groups, topics
from app.services import transactions as txn_service
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.records.encode import encode_batch
from tests.conftest import make_broker
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.kafka.test_fetch import CONSUMERS, ISOLATION, write
from tests.support import wait_until

PARTITIONS = 2
T0 = 1_700_000_000_000
NONE = 0
OUT_OF_ORDER_SEQUENCE_NUMBER = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER.kafka_code
INVALID_TXN_STATE = ErrorCode.INVALID_TXN_STATE.kafka_code
PRODUCER_FENCED = ErrorCode.PRODUCER_FENCED.kafka_code
INVALID_PRODUCER_EPOCH = ErrorCode.INVALID_PRODUCER_EPOCH.kafka_code


@pytest.fixture
def topic(store: Broker) -> str:
    name = f"x-{uuid.uuid4().hex[:10]}"
    topics.create_topic(store, name, PARTITIONS)
    return name


# -- one interface over the three clients' transactional producers -------------------------------


class Fenced(Exception):
    """The client reported that a newer producer with its transactional id fenced it."""


class ConfluentTxn:
    def __init__(self, bootstrap: str, tid: str, **conf: Any) -> None:
        from confluent_kafka import Producer

        self.bootstrap = bootstrap
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5, **conf})
        self.failed: list[Any] = []

    def init(self) -> None:
        self.producer.init_transactions(30)

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, topic: str, partition: int, key: bytes, value: bytes) -> None:
        self.producer.produce(topic, value, key, partition=partition, on_delivery=self._delivered)

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed.append(err)

    def flush(self) -> None:
        self.producer.flush(30)

    def failures(self) -> list[str]:
        """The names of the errors its deliveries reported, and of a fatal error of the producer
        (such as being fenced: ``poll`` raises it), once every record is delivered or failed."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + 30
        while len(self.producer) > 0 and time.monotonic() < deadline:
            try:
                self.producer.poll(0.1)
            except KafkaException as exc:
                self.failed.append(exc.args[0])
        return [err.name() for err in self.failed]

    def send_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            positions = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
            self.producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
        finally:
            consumer.close()

    def commit(self) -> None:
        """Commit; when the transaction failed (an abortable error), abort it as an application
        does, which is where a fenced producer learns that it is."""
        from confluent_kafka import KafkaException

        try:
            self._guard(lambda: self.producer.commit_transaction(30))
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise
            self.abort()
            raise

    def abort(self) -> None:
        self._guard(lambda: self.producer.abort_transaction(30))

    def _guard(self, step: Callable[[], None]) -> None:
        from confluent_kafka import KafkaError, KafkaException

        try:
            step()
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() and err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
                raise Fenced(str(err)) from exc
            raise

    def close(self) -> None:
        self.producer.flush(5)


class KafkaPythonTxn:
    def __init__(self, bootstrap: str, tid: str, **conf: Any) -> None:
        from kafka import KafkaProducer

        self.producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, linger_ms=5, **conf)
        self.futures: list[Any] = []

    def init(self) -> None:
        self.producer.init_transactions()

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, topic: str, partition: int, key: bytes, value: bytes) -> None:
        self.futures.append(self.producer.send(topic, value, key, partition=partition))

    def flush(self) -> None:
        self.producer.flush(30)

    def failures(self) -> list[str]:
        out = []
        for future in self.futures:
            try:
                future.get(30)
            except Exception as exc:
                out.append(type(exc).__name__)
        return out

    def send_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        from kafka import OffsetAndMetadata, TopicPartition

        self.producer.send_offsets_to_transaction(
            {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}, group
        )

    def commit(self) -> None:
        """Commit; when that fails short of a fatal error, abort as an application does (see
        ``ConfluentTxn.commit``)."""
        from kafka.errors import KafkaError

        try:
            self._guard(self.producer.commit_transaction)
        except KafkaError:
            # kafka-python answers a failed batch with KIP-360's epoch bump first, and refuses an
            # abort until that bump has its answer: the application retries the abort meanwhile
            deadline = time.monotonic() + 10
            while True:
                try:
                    self.abort()
                    break
                except KafkaError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            raise

    def abort(self) -> None:
        self._guard(self.producer.abort_transaction)

    def _guard(self, step: Callable[[], None]) -> None:
        from kafka.errors import KafkaError, ProducerFencedError

        try:
            step()
        except ProducerFencedError as exc:
            raise Fenced(repr(exc)) from exc
        except KafkaError as exc:
            # once fenced, every later call names the fatal error it is stuck in
            if "ProducerFencedError" in str(exc):
                raise Fenced(repr(exc)) from exc
            raise

    def close(self) -> None:
        self.producer.close(5)


class AiokafkaTxn:
    """aiokafka's coroutines run on one event loop the adapter keeps (``asyncio.Runner``)."""

    def __init__(self, bootstrap: str, tid: str, **conf: Any) -> None:
        from aiokafka import AIOKafkaProducer

        self.runner = asyncio.Runner()

        async def make() -> Any:
            return AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, linger_ms=5, **conf)

        self.producer = self.runner.run(make())
        self.pending: list[Any] = []

    def init(self) -> None:
        self.runner.run(self.producer.start())

    def begin(self) -> None:
        self.runner.run(self.producer.begin_transaction())

    def send(self, topic: str, partition: int, key: bytes, value: bytes) -> None:
        self.pending.append(self.runner.run(self.producer.send(topic, value, key, partition=partition)))

    def flush(self) -> None:
        self.runner.run(self.producer.flush())

    def failures(self) -> list[str]:
        async def settled() -> list[str]:
            done = await asyncio.gather(*self.pending, return_exceptions=True)
            return [type(d).__name__ for d in done if isinstance(d, BaseException)]

        return self.runner.run(settled())

    def send_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        from aiokafka import TopicPartition

        self.runner.run(
            self.producer.send_offsets_to_transaction({TopicPartition(t, p): o for (t, p), o in offsets.items()}, group)
        )

    def commit(self) -> None:
        self._guard(self.producer.commit_transaction)

    def abort(self) -> None:
        self._guard(self.producer.abort_transaction)

    def _guard(self, step: Callable[[], Any]) -> None:
        from aiokafka.errors import ProducerFenced

        try:
            self.runner.run(step())
        except ProducerFenced as exc:
            raise Fenced(repr(exc)) from exc

    def close(self) -> None:
        try:
            self.runner.run(self.producer.stop())
        finally:
            self.runner.close()


PRODUCERS: dict[str, Callable[..., Any]] = {"confluent": ConfluentTxn, "kafka-python": KafkaPythonTxn, "aiokafka": AiokafkaTxn}
# How each client names the refusal of a fenced producer's record (librdkafka adds its own fatal
# _FENCED to the delivery's INVALID_PRODUCER_EPOCH).
FENCING_ERRORS = {
    "confluent": {"_FENCED", "INVALID_PRODUCER_EPOCH"},
    "kafka-python": {"InvalidProducerEpochError", "ProducerFencedError"},
    "aiokafka": {"ProducerFenced"},
}


# -- reading back --------------------------------------------------------------------------------


def log_rows(store: Broker, topic: str) -> list[tuple[int, int, bytes | None, int | None, int | None, bool, int | None]]:
    """Every stored row of the topic, markers included: (partition, offset, value, producer id,
    epoch, transactional, control type)."""
    with store.db.read() as conn:
        rows = conn.execute(
            text(
                'SELECT partition, "offset", value, producer_id, producer_epoch, is_transactional, control_type '
                'FROM txlog.log_records WHERE topic = :t ORDER BY partition, "offset"'
            ),
            {"t": topic},
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def committed_view(store: Broker, topic: str) -> dict[int, list[bytes]]:
    """``txlog.committed_records``, by partition, in offset order."""
    with store.db.read() as conn:
        rows = conn.execute(
            text('SELECT partition, value FROM txlog.committed_records WHERE topic = :t ORDER BY partition, "offset"'),
            {"t": topic},
        ).all()
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for partition, value in rows:
        out[partition].append(bytes(value))
    return out


def service_fetch(store: Broker, topic: str, isolation: str) -> dict[int, list[bytes]]:
    """What the HTTP API's fetch answers (the same service), by partition."""
    return {
        p: [r.value for r in fetch.fetch(store, topic, p, 0, max_records=10_000, isolation_level=isolation).records]  # type: ignore[arg-type]
        for p in range(PARTITIONS)
    }


def consumed(bootstrap: str, client: str, topic: str, isolation: str, expected: dict[int, list[bytes]]) -> dict[int, list[bytes]]:
    """What one client's consumer reads of each partition at ``isolation``, up to the plain record
    the test wrote last on each (``END``): so an extra record shows, and no test waits out a
    timeout to prove that nothing more comes."""
    got = {}
    for p, values in expected.items():
        records = CONSUMERS[client](bootstrap, topic, p, 0, len(values), **ISOLATION[client](isolation))
        got[p] = [r.value for r in records]
    return got


END = b"end"


def seal(store: Broker, topic: str) -> None:
    """A plain record at the end of every partition (see ``consumed``)."""
    for p in range(PARTITIONS):
        write(store, topic, p, END.decode())


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def send_all(producer: Any, topic: str, items: list[bytes]) -> dict[int, list[bytes]]:
    """Records spread over the partitions in turn; what went where."""
    where: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for i, value in enumerate(items):
        p = i % PARTITIONS
        producer.send(topic, p, b"k", value)
        where[p].append(value)
    return where


def joined(*parts: dict[int, list[bytes]]) -> dict[int, list[bytes]]:
    return {p: [v for part in parts for v in part.get(p, [])] for p in range(PARTITIONS)}


# -- commit, abort, commit at one epoch ----------------------------------------------------------


@pytest.mark.parametrize("client", PRODUCERS)
def test_commit_abort_commit_at_one_epoch_read_back_exactly_everywhere(
    gateway: GatewayProcess, store: Broker, topic: str, client: str
) -> None:
    tid = f"tid-{topic}"
    producer = PRODUCERS[client](gateway.bootstrap, tid)
    try:
        producer.init()
        started = txn_service.describe(store, tid)
        producer.begin()
        first = send_all(producer, topic, values("c1", 6))
        producer.commit()
        producer.begin()
        dropped = send_all(producer, topic, values("a", 5))
        producer.flush()  # the aborted records are in the log, not only in the client
        producer.abort()
        producer.begin()
        second = send_all(producer, topic, values("c2", 4))
        producer.commit()
    finally:
        producer.close()
    ended = txn_service.describe(store, tid)
    assert (ended.producer_id, ended.producer_epoch) == (started.producer_id, started.producer_epoch)
    assert ended.state is TxnState.COMPLETE_COMMIT and ended.transaction_version == 1

    rows = log_rows(store, topic)
    assert {(pid, epoch) for _, _, _, pid, epoch, _, _ in rows} == {(started.producer_id, started.producer_epoch)}
    markers = [(p, control) for p, _, _, _, _, _, control in rows if control is not None]
    # each transaction wrote to both partitions: COMMIT (1), ABORT (0), COMMIT on each
    assert markers == [(p, c) for p in range(PARTITIONS) for c in (1, 0, 1)]
    seal(store, topic)

    committed = joined(first, second, {p: [END] for p in range(PARTITIONS)})
    everything = joined(first, dropped, second, {p: [END] for p in range(PARTITIONS)})
    assert committed_view(store, topic) == committed
    assert service_fetch(store, topic, "read_committed") == committed
    assert service_fetch(store, topic, "read_uncommitted") == everything
    for reader in CONSUMERS:
        assert consumed(gateway.bootstrap, reader, topic, "read_committed", committed) == committed, reader
        assert consumed(gateway.bootstrap, reader, topic, "read_uncommitted", everything) == everything, reader


# -- offsets sent to a transaction ---------------------------------------------------------------


def group_offsets(store: Broker, group: str, topic: str, require_stable: bool = False) -> dict[int, int | str | None]:
    """The group's committed offset per partition (None: none), or the error's name where a
    stable answer was asked and a transaction still holds an offset for the partition."""
    fetched = groups.offset_fetch_partitions(store, group, [(topic, p) for p in range(PARTITIONS)], require_stable)
    return {f.partition: f.error.code.name if f.error is not None else f.offset for f in fetched}


@pytest.mark.parametrize("client", PRODUCERS)
def test_offsets_sent_to_a_transaction_are_the_groups_once_it_commits_never_when_it_aborts(
    gateway: GatewayProcess, store: Broker, topic: str, client: str
) -> None:
    group = f"g-{topic}"
    producer = PRODUCERS[client](gateway.bootstrap, f"tid-{topic}")
    try:
        producer.init()
        producer.begin()
        send_all(producer, topic, values("out", 2))
        producer.send_offsets(group, {(topic, 0): 5, (topic, 1): 7})
        # pending in the open transaction: not the group's yet, and a stable read is told to retry
        assert group_offsets(store, group, topic) == {0: None, 1: None}
        assert group_offsets(store, group, topic, require_stable=True) == {
            0: "UNSTABLE_OFFSET_COMMIT",
            1: "UNSTABLE_OFFSET_COMMIT",
        }
        producer.commit()
        assert group_offsets(store, group, topic, require_stable=True) == {0: 5, 1: 7}

        producer.begin()
        send_all(producer, topic, values("dropped", 2))
        producer.send_offsets(group, {(topic, 0): 9, (topic, 1): 11})
        producer.abort()
        assert group_offsets(store, group, topic, require_stable=True) == {0: 5, 1: 7}

        producer.begin()  # the same producer, at the same epoch, commits offsets again
        producer.send_offsets(group, {(topic, 1): 12})
        producer.commit()
    finally:
        producer.close()
    assert group_offsets(store, group, topic, require_stable=True) == {0: 5, 1: 12}


# -- fencing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("client", PRODUCERS)
def test_a_second_producer_with_the_same_transactional_id_fences_the_first_and_aborts_its_transaction(
    gateway: GatewayProcess, store: Broker, topic: str, client: str
) -> None:
    tid = f"tid-{topic}"
    make = PRODUCERS[client]
    zombie, successor = make(gateway.bootstrap, tid), make(gateway.bootstrap, tid)
    try:
        zombie.init()
        zombie_epoch = txn_service.describe(store, tid).producer_epoch
        zombie.begin()
        send_all(zombie, topic, values("zombie", 4))
        zombie.flush()
        assert txn_service.describe(store, tid).state is TxnState.ONGOING

        successor.init()
        meta = txn_service.describe(store, tid)
        assert meta.producer_epoch > zombie_epoch
        assert meta.state in (TxnState.COMPLETE_ABORT, TxnState.EMPTY)  # the zombie's transaction, aborted

        # its next record is refused as of an old epoch (INVALID_PRODUCER_EPOCH, as Kafka answers a
        # Produce), and its commit, or the abort the failed commit calls for, finds it fenced
        zombie.send(topic, 0, b"k", b"zombie-late")
        failures = zombie.failures()
        assert failures and set(failures) <= FENCING_ERRORS[client], failures
        with pytest.raises(Fenced):
            zombie.commit()

        successor.begin()
        kept = send_all(successor, topic, values("successor", 2))
        successor.commit()
    finally:
        for p in (zombie, successor):
            try:
                p.close()
            except Exception:  # a fenced producer may refuse to close cleanly; it is done either way
                pass
    rows = log_rows(store, topic)
    assert b"zombie-late" not in [value for _, _, value, *_ in rows]
    zombie_rows = [r for r in rows if r[2] is not None and r[2].startswith(b"zombie")]
    assert len(zombie_rows) == 4 and {r[4] for r in zombie_rows} == {zombie_epoch}
    seal(store, topic)
    committed = joined(kept, {p: [END] for p in range(PARTITIONS)})
    assert committed_view(store, topic) == committed
    for reader in CONSUMERS:
        assert consumed(gateway.bootstrap, reader, topic, "read_committed", committed) == committed, reader


# -- idempotence ---------------------------------------------------------------------------------


def idempotent_produce(client: str, bootstrap: str, topic: str, items: list[bytes]) -> None:
    """Each client's plain idempotent producer, every record acknowledged."""
    if client == "confluent":
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        failed: list[Any] = []
        for i, value in enumerate(items):
            producer.produce(topic, value, b"k", partition=i % PARTITIONS, on_delivery=lambda err, _m: err and failed.append(err))
        assert producer.flush(30) == 0 and failed == []
    elif client == "kafka-python":
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)  # idempotent by default
        try:
            for f in [producer.send(topic, value, b"k", partition=i % PARTITIONS) for i, value in enumerate(items)]:
                f.get(30)
        finally:
            producer.close(5)
    else:
        from aiokafka import AIOKafkaProducer

        async def run() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5)
            await producer.start()
            try:
                futures = [await producer.send(topic, value, b"k", partition=i % PARTITIONS) for i, value in enumerate(items)]
                await asyncio.gather(*futures)
            finally:
                await producer.stop()

        asyncio.run(run())


@pytest.mark.parametrize("client", PRODUCERS)
def test_each_clients_idempotent_producer_writes_every_record_once_with_its_producer_id(
    gateway: GatewayProcess, store: Broker, topic: str, client: str
) -> None:
    items = values("idem", 50)
    idempotent_produce(client, gateway.bootstrap, topic, items)
    rows = log_rows(store, topic)
    assert sorted(value for _, _, value, *_ in rows) == sorted(items)
    producers = {(pid, epoch) for _, _, _, pid, epoch, _, _ in rows}
    assert len(producers) == 1 and next(iter(producers))[0] >= 0  # one producer id, on every record
    assert not any(transactional for *_, transactional, _ in rows)
    for p in range(PARTITIONS):
        assert [value for q, _, value, *_ in rows if q == p] == items[p::PARTITIONS]  # in order, once


def batch(producer_id: int, epoch: int, sequence: int, items: list[bytes], transactional: bool = False) -> bytes:
    """One record batch v2 as a producer sends it: offsets from 0, the producer's id, epoch and
    base sequence."""
    return encode_batch(
        0,
        [
            StoredRecord(i, b"k", value, None, None, T0 + i, producer_id, epoch, sequence, transactional, None, 0, None, False)
            for i, value in enumerate(items)
        ],
    )


def produce(
    raw: RawConnection, topic: str, partition: int, data: bytes, transactional_id: str | None = None, version: int = 9
) -> tuple[int, int]:
    """(error code, base offset) of one partition's Produce."""
    answer = raw.request(
        ApiKey.Produce,
        version,
        {
            "transactional_id": transactional_id,
            "acks": -1,
            "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": data}]}],
        },
    )
    part = answer.responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def init_producer_id(
    raw: RawConnection, transactional_id: str | None, version: int = 4, producer_id: int = -1, epoch: int = -1
) -> tuple[int, int, int]:
    """(error code, producer id, epoch)."""
    answer = raw.request(
        ApiKey.InitProducerId,
        version,
        {
            "transactional_id": transactional_id,
            "transaction_timeout_ms": 60_000,
            "producer_id": producer_id,
            "producer_epoch": epoch,
        },
    )
    return answer.error_code, answer.producer_id, answer.producer_epoch


def test_a_retried_batch_gets_its_first_offsets_and_a_sequence_gap_is_refused(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    code, pid, epoch = init_producer_id(raw, None)
    assert code == NONE and pid >= 0
    first = batch(pid, epoch, 0, values("a", 3))
    assert produce(raw, topic, 0, first) == (NONE, 0)
    assert produce(raw, topic, 0, first) == (NONE, 0)  # the retry: the same answer, nothing appended
    assert produce(raw, topic, 0, first, version=3) == (NONE, 0)
    assert produce(raw, topic, 0, batch(pid, epoch, 3, values("b", 2))) == (NONE, 3)
    assert produce(raw, topic, 0, batch(pid, epoch, 5, values("c", 1))) == (NONE, 5)
    assert produce(raw, topic, 0, first) == (NONE, 0)  # an older batch among the last five, too
    # a gap (sequence 9 where 6 is next) is refused, and appends nothing
    code, _ = produce(raw, topic, 0, batch(pid, epoch, 9, values("gap", 1)))
    assert code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(raw, topic, 0, batch(pid, epoch, 6, values("d", 1))) == (NONE, 6)
    rows = log_rows(store, topic)
    assert [(o, v) for _, o, v, *_ in rows] == list(enumerate(values("a", 3) + values("b", 2) + values("c", 1) + values("d", 1)))
    assert {(q, pid_, e) for q, _, _, pid_, e, _, _ in rows} == {(0, pid, epoch)}


# -- the first transaction protocol's rules (KIP-890 part 1, KIP-360) ----------------------------


def add_partitions(raw: RawConnection, tid: str, pid: int, epoch: int, topic: str, *partitions: int) -> list[int]:
    answer = raw.request(
        ApiKey.AddPartitionsToTxn,
        3,
        {
            "v3_and_below_transactional_id": tid,
            "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": list(partitions)}],
        },
    )
    return [r.partition_error_code for t in answer.results_by_topic_v3_and_below for r in t.results_by_partition]


def end_txn(raw: RawConnection, tid: str, pid: int, epoch: int, commit: bool, version: int = 3) -> int:
    answer = raw.request(
        ApiKey.EndTxn, version, {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "committed": commit}
    )
    return answer.error_code


def high_watermarks(store: Broker, topic: str) -> dict[int, int]:
    statuses = fetch.partition_statuses(store, [(topic, p) for p in range(PARTITIONS)])
    return {p: s.high_watermark for (_, p), s in statuses.items()}


def test_a_transactional_batch_for_a_partition_not_added_is_refused_and_nothing_appended(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    tid = f"tid-{topic}"
    code, pid, epoch = init_producer_id(raw, tid)
    assert code == NONE
    assert add_partitions(raw, tid, pid, epoch, topic, 0) == [NONE]
    # partition 1 was never added to this transaction
    assert produce(raw, topic, 1, batch(pid, epoch, 0, values("stray", 2), transactional=True), tid)[0] == INVALID_TXN_STATE
    assert produce(raw, topic, 0, batch(pid, epoch, 0, values("in", 2), transactional=True), tid) == (NONE, 0)
    assert end_txn(raw, tid, pid, epoch, commit=True) == NONE
    # a batch delayed past its transaction's commit, at the kept epoch: the partition is not in a
    # transaction now, so it is refused rather than silently opening the next one
    late = batch(pid, epoch, 2, values("late", 1), transactional=True)
    assert produce(raw, topic, 0, late, tid)[0] == INVALID_TXN_STATE
    assert txn_service.describe(store, tid).state is TxnState.COMPLETE_COMMIT
    assert high_watermarks(store, topic) == {0: 3, 1: 0}  # two records and the COMMIT marker
    # once added, the same batch is taken
    assert add_partitions(raw, tid, pid, epoch, topic, 0) == [NONE]
    assert produce(raw, topic, 0, late, tid) == (NONE, 3)
    assert end_txn(raw, tid, pid, epoch, commit=False) == NONE
    assert committed_view(store, topic) == {0: values("in", 2), 1: []}


def test_init_producer_id_with_the_current_epoch_bumps_it_and_a_stale_one_is_fenced(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    tid = f"tid-{topic}"
    code, pid, e0 = init_producer_id(raw, tid)
    assert code == NONE
    # KIP-360: a producer naming its current id and epoch gets the next epoch, its open
    # transaction aborted first
    assert add_partitions(raw, tid, pid, e0, topic, 0) == [NONE]
    assert produce(raw, topic, 0, batch(pid, e0, 0, values("open", 2), transactional=True), tid) == (NONE, 0)
    assert init_producer_id(raw, tid, 4, pid, e0) == (NONE, pid, e0 + 1)
    assert aborted_flags(store, topic) == [(b"open-0", True), (b"open-1", True), (None, True)]  # and its ABORT marker
    assert init_producer_id(raw, tid, 4, pid, e0 + 1) == (NONE, pid, e0 + 2)
    # the retry of that last init (its answer lost) gets the same answer, and bumps nothing
    assert init_producer_id(raw, tid, 4, pid, e0 + 1) == (NONE, pid, e0 + 2)
    assert txn_service.describe(store, tid).producer_epoch == e0 + 2
    # an epoch from before: fenced, named as each version knows it
    assert init_producer_id(raw, tid, 4, pid, e0)[0] == PRODUCER_FENCED
    assert init_producer_id(raw, tid, 3, pid, e0)[0] == INVALID_PRODUCER_EPOCH
    assert txn_service.describe(store, tid).producer_epoch == e0 + 2
    # the current holder is unaffected by the refused inits: it still writes and commits
    assert add_partitions(raw, tid, pid, e0 + 2, topic, 0) == [NONE]
    assert produce(raw, topic, 0, batch(pid, e0 + 2, 0, values("kept", 1), transactional=True), tid)[0] == NONE
    assert end_txn(raw, tid, pid, e0 + 2, commit=True) == NONE
    assert committed_view(store, topic)[0] == [b"kept-0"]


def aborted_flags(store: Broker, topic: str) -> list[tuple[bytes | None, bool]]:
    """(value, aborted) of partition 0's rows in offset order (a marker's value is None)."""
    with store.db.read() as conn:
        rows = conn.execute(
            text('SELECT value, aborted FROM txlog.log_records WHERE topic = :t AND partition = 0 ORDER BY "offset"'),
            {"t": topic},
        ).all()
    return [(None if v is None else bytes(v), a) for v, a in rows]


# -- transaction timeout -------------------------------------------------------------------------


def test_a_transaction_left_open_past_its_timeout_is_aborted_by_the_gateways_sweeper(
    start_gateway: Callable[..., GatewayProcess],
) -> None:
    g = start_gateway(transaction_abort_check_interval_ms="200")
    store = make_broker(g.database_url)
    try:
        topic = f"x-{uuid.uuid4().hex[:10]}"
        topics.create_topic(store, topic, PARTITIONS)
        tid = f"tid-{topic}"
        producer = ConfluentTxn(g.bootstrap, tid, **{"transaction.timeout.ms": 1000, "socket.timeout.ms": 1000})
        try:
            producer.init()
            producer.begin()
            send_all(producer, topic, values("forgotten", 3))
            producer.flush()
            assert txn_service.describe(store, tid).state is TxnState.ONGOING
            started = time.monotonic()
            wait_until(
                lambda: txn_service.describe(store, tid).state is TxnState.COMPLETE_ABORT,
                15,
                0.1,
                "the sweeper to abort the timed-out transaction",
            )
            waited = time.monotonic() - started
            meta = txn_service.describe(store, tid)
            assert meta.fence_reason == "timed_out"
            # the abort moved the epoch on (as Kafka's coordinator does for a timed-out transaction
            # of the first protocol): the producer learns it is fenced when it tries to commit
            with pytest.raises(Fenced):
                producer.commit()
        finally:
            try:
                producer.close()
            except Exception:
                pass
        assert waited < 5
        seal(store, topic)
        assert committed_view(store, topic) == {p: [END] for p in range(PARTITIONS)}
        assert consumed(g.bootstrap, "confluent", topic, "read_committed", {p: [END] for p in range(PARTITIONS)}) == {
            p: [END] for p in range(PARTITIONS)
        }
    finally:
        store.db.dispose()


def test_a_batch_is_bounded_as_a_whole_by_message_max_bytes(raw: RawConnection, store: Broker, topic: str) -> None:
    """As Kafka bounds a produced batch: its size as framed against message.max.bytes
    (TXLOG_MAX_REQUEST_BYTES), and no record's key or value on its own (TXLOG_MAX_KEY_BYTES and
    its kin bound the HTTP API's records)."""
    limit = store.settings.max_request_bytes
    big_key = encode_batch(0, [StoredRecord(0, b"k" * 200_000, b"v", None, None, T0, -1, -1, -1, False, None, 0, None, False)])
    assert store.settings.max_key_bytes < 200_000
    code, offset = produce(raw, topic, 0, big_key)
    assert (code, offset) == (NONE, 0)
    assert fetch.fetch(store, topic, 0, 0, max_records=10).records[0].key == b"k" * 200_000
    over = batch(-1, -1, -1, [b"x" * (limit - 30)])  # the record's bytes fit; the batch's header does not
    assert len(over) > limit
    assert produce(raw, topic, 0, over)[0] == ErrorCode.MESSAGE_TOO_LARGE.kafka_code
    assert produce(raw, topic, 0, batch(-1, -1, -1, [b"x" * (limit - 100)]))[0] == NONE
