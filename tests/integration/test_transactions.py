"""The transaction protocol through the services, against a real PostgreSQL: InitProducerId,
AddPartitionsToTxn (explicit and by produce), TxnOffsetCommit, EndTxn with its markers, retries
and fencing (transactions V2: one epoch per transaction), operator aborts, concurrency."""

from __future__ import annotations

import copy
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text

from app.domain.groups.offsets import GroupOffset
from app.domain.producer_state import MAX_EPOCH
from app.domain.records import CONTROL_ABORT, CONTROL_COMMIT, NewRecord
from app.domain.transactions import TxnState
from app.errors import ErrorCode, TxlogError
from app.services import fetch as fetch_service
from app.services import groups, topics, transaction_aborts, transactions
from app.services import produce as produce_service
from app.services.produce import ProduceRequest
from app.storage import log as log_store
from tests import storage_helpers

S = TxnState


# --- a client, as a Kafka producer drives the protocol ----------------------------------------------


class Producer:
    """A transactional producer: its producer id and epoch and its next sequence per partition.
    ``copy.copy(p)`` keeps a stale view — a zombie, or a request delayed in the network."""

    def __init__(self, broker, tid: str, timeout_ms: int | None = None, transaction_version: int = 2) -> None:  # type: ignore[no-untyped-def]
        self.broker = broker
        self.tid = tid
        self.transaction_version = transaction_version  # 1: keeps its epoch across transactions, as Kafka clients before V2
        self.init(timeout_ms)

    def init(self, timeout_ms: int | None = None) -> "Producer":
        got = transactions.init_producer_id(self.broker, self.tid, timeout_ms)
        self.pid, self.epoch, self.seqs = got.producer_id, got.producer_epoch, {}
        return self

    def send(self, topic: str, partition: int, *values: str) -> produce_service.ProduceResult:
        seq = self.seqs.get((topic, partition), 0)
        records = [NewRecord(f"{self.tid}".encode(), v.encode()) for v in values]
        result = produce_service.produce(
            self.broker, topic, partition, ProduceRequest(records, self.pid, self.epoch, seq, self.tid)
        )
        self.seqs[(topic, partition)] = seq + len(values)
        return result

    def add(self, *partitions: tuple[str, int]):  # type: ignore[no-untyped-def]
        return transactions.add_partitions_to_txn(self.broker, self.tid, self.pid, self.epoch, list(partitions))

    def commit_offsets(self, group: str, *offsets: tuple[str, int, int]):  # type: ignore[no-untyped-def]
        return transactions.txn_offset_commit(
            self.broker, self.tid, self.pid, self.epoch, group, [GroupOffset(t, p, o, "") for t, p, o in offsets]
        )

    def end(self, result: str) -> transactions.EndTxnOutcome:
        out = transactions.end_txn(self.broker, self.tid, self.pid, self.epoch, result, self.transaction_version)  # type: ignore[arg-type]
        if (out.producer_id, out.producer_epoch) != (self.pid, self.epoch):
            self.pid, self.epoch, self.seqs = out.producer_id, out.producer_epoch, {}
        return out

    def commit(self) -> transactions.EndTxnOutcome:
        return self.end("commit")

    def abort(self) -> transactions.EndTxnOutcome:
        return self.end("abort")


def error_of(fn, *args, **kwargs) -> TxlogError:  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        fn(*args, **kwargs)
    return info.value


def read(broker, topic: str, partition: int, isolation: str = "read_committed", max_records: int = 3) -> list[bytes | None]:  # type: ignore[no-untyped-def]
    """Every record a reader sees following next_offset from 0 with small fetches, until it
    reaches the last stable offset (read_committed) or the high watermark."""
    values, offset = [], 0
    for _ in range(10_000):
        got = fetch_service.fetch(broker, topic, partition, offset, max_records=max_records, isolation_level=isolation)  # type: ignore[arg-type]
        assert all(r.control_type is None for r in got.records)
        values += [r.value for r in got.records]
        assert got.next_offset >= offset
        offset = got.next_offset
        end = got.last_stable_offset if isolation == "read_committed" else got.high_watermark
        if offset >= end:
            assert not got.records or got.next_offset == end
            return values
    raise AssertionError("the reader did not reach the end")


def status(broker, topic: str, partition: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(high watermark, last stable offset)."""
    with broker.db.read() as conn:
        s = log_store.partition_status(conn, topic, partition)
    return s.high_watermark, s.last_stable_offset


def log(broker, topic: str, partition: int) -> list[tuple[int, int | None, bytes | None, bool]]:  # type: ignore[no-untyped-def]
    """Every record: (offset, control type, value, whether it is data of an aborted transaction)."""
    with broker.db.read() as conn:
        rows = storage_helpers.records_browse(conn, topic, partition, 0, 10_000)
    return [(r.offset, r.control_type, r.value, r.aborted and r.control_type is None) for r in rows]


def markers(broker, topic: str, partition: int) -> list[int]:  # type: ignore[no-untyped-def]
    return [c for _, c, _, _ in log(broker, topic, partition) if c is not None]


def describe(broker, tid: str):  # type: ignore[no-untyped-def]
    return transactions.describe(broker, tid)


def set_epoch(broker, tid: str, epoch: int) -> None:  # type: ignore[no-untyped-def]
    with broker.db.transaction() as conn:
        conn.execute(
            text("UPDATE txlog.transactions SET producer_epoch = :e WHERE transactional_id = :t"), {"e": epoch, "t": tid}
        )


def prepare_only(broker, tid: str, result: str) -> None:  # type: ignore[no-untyped-def]
    """The decision alone, made durable (``end_txn_prepare``): what an EndTxn in two steps — for
    partitions not all in one database — leaves when its process dies before the markers."""
    meta = describe(broker, tid)
    assert transactions.end_txn_prepare(broker, tid, meta.producer_id, meta.producer_epoch, result) is None  # type: ignore[arg-type]


@pytest.fixture
def topic(broker) -> str:  # type: ignore[no-untyped-def]
    topics.create_topic(broker, "t", 4)
    return "t"


# --- InitProducerId ---------------------------------------------------------------------------------


def test_init_of_a_new_transactional_id_is_epoch_zero_and_persisted(broker, topic):
    p = Producer(broker, "tx", timeout_ms=5000)
    assert p.epoch == 0
    meta = describe(broker, "tx")
    assert (meta.producer_id, meta.producer_epoch, meta.state, meta.timeout_ms) == (p.pid, 0, S.EMPTY, 5000)
    plain = transactions.init_producer_id(broker, None)
    assert plain.producer_id != p.pid and plain.producer_epoch == 0


def test_init_without_timeout_uses_the_default(broker, topic):
    Producer(broker, "tx")
    assert describe(broker, "tx").timeout_ms == broker.settings.default_transaction_timeout_ms


def test_reinit_raises_the_epoch_and_keeps_the_producer_id(broker, topic):
    p = Producer(broker, "tx")
    pid = p.pid
    for expected in (1, 2, 3):
        p.init()
        assert (p.pid, p.epoch) == (pid, expected)
    assert describe(broker, "tx").fence_reason == "newer_epoch"


def test_reinit_fences_the_old_epoch_everywhere(broker, topic):
    old = Producer(broker, "tx")
    old.send(topic, 0, "before")
    new = copy.copy(old).init()
    assert (new.pid, new.epoch) == (old.pid, old.epoch + 1)  # raised by one, also over an open transaction
    for attempt in (
        lambda: old.send(topic, 1, "zombie"),
        lambda: old.add((topic, 2)),
        lambda: old.commit_offsets("g", (topic, 0, 5)),
        lambda: old.commit(),
        lambda: old.abort(),
    ):
        err = error_of(attempt)
        assert err.code is ErrorCode.PRODUCER_FENCED
        assert err.details["reason"] == "newer_epoch"
        assert err.details["current_epoch"] == new.epoch
        assert f"current epoch is {new.epoch}" in err.message
    assert describe(broker, "tx").state is S.EMPTY
    assert read(broker, topic, 0, "read_uncommitted") == [b"before"]
    assert read(broker, topic, 0) == []
    assert read(broker, topic, 1, "read_uncommitted") == []
    assert groups.offset_fetch(broker, "g") == []


def test_reinit_aborts_an_ongoing_transaction_with_abort_markers(broker, topic):
    old = Producer(broker, "tx")
    old.send(topic, 0, "a", "b")
    old.send(topic, 1, "c")
    old.add((topic, 2))
    old.commit_offsets("g", (topic, 0, 10))
    assert status(broker, topic, 0) == (2, 0)
    new = copy.copy(old).init()
    assert describe(broker, "tx").state is S.EMPTY
    for partition in (0, 1, 2):
        assert markers(broker, topic, partition) == [CONTROL_ABORT]
    assert log(broker, topic, 0) == [(0, None, b"a", True), (1, None, b"b", True), (2, CONTROL_ABORT, None, False)]
    assert status(broker, topic, 0) == (3, 3)
    assert read(broker, topic, 0) == []
    assert read(broker, topic, 0, "read_uncommitted") == [b"a", b"b"]
    assert groups.offset_fetch(broker, "g", require_stable=True) == []
    new.send(topic, 0, "fresh")
    new.commit()
    assert read(broker, topic, 0) == [b"fresh"]


def test_reinit_completes_a_prepare_commit_as_a_commit(broker, topic):
    p = Producer(broker, "tx")
    p.send(topic, 0, "a")
    p.send(topic, 3, "b")
    p.commit_offsets("g", (topic, 0, 7))
    prepare_only(broker, "tx", "commit")  # a two-step EndTxn(commit) died after its decision
    assert describe(broker, "tx").state is S.PREPARE_COMMIT
    assert read(broker, topic, 0) == []
    assert copy.copy(p).init().epoch == p.epoch + 1
    assert read(broker, topic, 0) == [b"a"] and read(broker, topic, 3) == [b"b"]
    assert markers(broker, topic, 0) == [CONTROL_COMMIT] and markers(broker, topic, 3) == [CONTROL_COMMIT]
    assert groups.offset_fetch(broker, "g") == [GroupOffset(topic, 0, 7, "")]
    events = [(e.from_state, e.to_state) for e in transactions.events(broker, "tx")]
    assert events[-2:] == [(S.PREPARE_COMMIT, S.COMPLETE_COMMIT), (S.COMPLETE_COMMIT, S.EMPTY)]


def test_reinit_completes_a_prepare_abort_as_an_abort(broker, topic):
    p = Producer(broker, "tx")
    p.send(topic, 0, "a")
    prepare_only(broker, "tx", "abort")
    p.init()
    assert markers(broker, topic, 0) == [CONTROL_ABORT]
    assert read(broker, topic, 0) == []


@pytest.mark.parametrize("timeout", [0, -1, 900_001, 10**12])
def test_invalid_transaction_timeout(broker, topic, timeout):
    err = error_of(transactions.init_producer_id, broker, "tx", timeout)
    assert err.code is ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert err.code.http_status == 400
    assert error_of(describe, broker, "tx").code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    p = Producer(broker, "tx", timeout_ms=900_000)
    assert error_of(p.init, timeout).code is ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert describe(broker, "tx").producer_epoch == 0  # the refused init changed nothing


def test_epoch_exhaustion_on_init_issues_a_new_producer_id(broker, topic):
    p = Producer(broker, "tx")
    old_pid = p.pid
    set_epoch(broker, "tx", MAX_EPOCH - 1)
    p.init()
    assert (p.pid, p.epoch) == (old_pid, MAX_EPOCH)
    zombie = copy.copy(p)
    p.init()
    assert p.pid != old_pid and p.epoch == 0
    # the old producer id is no longer this transactional id's
    assert error_of(zombie.send, topic, 0, "x").code is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert error_of(zombie.commit).code is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    p.send(topic, 0, "new-id")
    p.commit()
    assert read(broker, topic, 0) == [b"new-id"]


def test_epoch_exhaustion_on_end_issues_a_new_producer_id(broker, topic):
    p = Producer(broker, "tx")
    old_pid = p.pid
    set_epoch(broker, "tx", MAX_EPOCH)
    p.epoch = MAX_EPOCH
    p.send(topic, 0, "last-epoch")
    sent = copy.copy(p)
    out = p.commit()
    assert (out.state, out.producer_id != old_pid, out.producer_epoch) == (S.COMPLETE_COMMIT, True, 0)
    assert read(broker, topic, 0) == [b"last-epoch"]
    # the retry with the exhausted epoch is still recognised
    again = copy.copy(sent).commit()
    assert (again.producer_id, again.producer_epoch) == (out.producer_id, 0)
    assert error_of(copy.copy(sent).abort).code is ErrorCode.INVALID_TXN_STATE
    p.send(topic, 0, "next")  # the new id starts at sequence 0 on a partition the old one used
    p.abort()
    p.send(topic, 1, "third")
    p.commit()
    assert read(broker, topic, 0) == [b"last-epoch"]
    assert read(broker, topic, 1) == [b"third"]


def test_an_unknown_transactional_id_is_an_invalid_mapping(broker, topic):
    for call in (
        lambda: transactions.add_partitions_to_txn(broker, "nobody", 1, 0, [(topic, 0)]),
        lambda: transactions.end_txn(broker, "nobody", 1, 0, "commit"),
        lambda: produce_service.produce(broker, topic, 0, ProduceRequest([NewRecord(None, b"v")], 1, 0, 0, "nobody")),
    ):
        assert error_of(call).code is ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_another_producer_id_is_an_invalid_mapping(broker, topic):
    p = Producer(broker, "tx")
    other = Producer(broker, "other")
    err = error_of(transactions.end_txn, broker, "tx", other.pid, 0, "commit")
    assert err.code is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    err = error_of(transactions.add_partitions_to_txn, broker, "tx", p.pid, 5, [(topic, 0)])
    assert err.code is ErrorCode.INVALID_PRODUCER_EPOCH


# --- AddPartitionsToTxn, explicit and implicit -------------------------------------------------------


def test_add_partitions_explicitly(broker, topic):
    p = Producer(broker, "tx")
    meta = p.add((topic, 2), (topic, 0))
    assert (meta.state, meta.partitions) == (S.ONGOING, ((topic, 0), (topic, 2)))
    assert status(broker, topic, 0) == (0, 0)  # no data yet: the LSO is not held back
    p.send(topic, 0, "a")
    assert status(broker, topic, 0) == (1, 0)
    p.commit()
    assert markers(broker, topic, 0) == [CONTROL_COMMIT]
    assert markers(broker, topic, 2) == [CONTROL_COMMIT]  # added but empty: marked all the same
    assert markers(broker, topic, 1) == []


def test_a_transactional_produce_adds_its_partition(broker, topic):
    p = Producer(broker, "tx")
    p.send(topic, 3, "a")
    p.send(topic, 1, "b")
    meta = describe(broker, "tx")
    assert (meta.state, meta.partitions) == (S.ONGOING, ((topic, 1), (topic, 3)))
    events = transactions.events(broker, "tx")
    assert [e.partitions_added for e in events[1:]] == [((topic, 3),), ((topic, 1),)]
    p.send(topic, 3, "c")  # already in: no new event
    assert len(transactions.events(broker, "tx")) == 3


def test_add_unknown_partitions(broker, topic):
    p = Producer(broker, "tx")
    err = error_of(p.add, (topic, 9), ("missing", 0))
    assert err.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "t-9" in err.message and "missing-0" in err.message
    assert describe(broker, "tx").state is S.EMPTY


# --- TxnOffsetCommit --------------------------------------------------------------------------------


def test_txn_offsets_are_pending_until_commit(broker, topic):
    groups.offset_commit(broker, "g", [GroupOffset(topic, 0, 3, "plain")])
    p = Producer(broker, "tx")
    p.send(topic, 1, "out")
    meta = p.commit_offsets("g", (topic, 0, 10), (topic, 1, 20))
    assert meta.groups == ("g",)
    assert groups.offset_fetch(broker, "g") == [GroupOffset(topic, 0, 3, "plain")]
    err = error_of(groups.offset_fetch, broker, "g", require_stable=True)
    assert err.code is ErrorCode.UNSTABLE_OFFSET_COMMIT and err.code.retriable
    assert groups.offset_fetch(broker, "other", require_stable=True) == []
    p.commit_offsets("g", (topic, 0, 11))  # a later commit in the same transaction wins
    p.commit()
    assert groups.offset_fetch(broker, "g", require_stable=True) == [GroupOffset(topic, 0, 11, ""), GroupOffset(topic, 1, 20, "")]
    assert transactions.pending_offsets(broker, "tx") == []


def test_txn_offsets_are_dropped_on_abort(broker, topic):
    groups.offset_commit(broker, "g", [GroupOffset(topic, 0, 3, "plain")])
    p = Producer(broker, "tx")
    p.commit_offsets("g", (topic, 0, 10))
    assert describe(broker, "tx").state is S.ONGOING
    p.abort()
    assert groups.offset_fetch(broker, "g", require_stable=True) == [GroupOffset(topic, 0, 3, "plain")]
    assert transactions.pending_offsets(broker, "tx") == []


def test_txn_offsets_for_unknown_partitions(broker, topic):
    p = Producer(broker, "tx")
    err = error_of(p.commit_offsets, "g", ("missing", 0, 1))
    assert err.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert transactions.pending_offsets(broker, "tx") == []


# --- EndTxn: markers, LSO, read_committed -----------------------------------------------------------


def test_commit_writes_a_marker_on_every_partition_and_moves_the_lso(broker, topic):
    p = Producer(broker, "tx")
    p.send(topic, 0, "a0", "a1")
    p.send(topic, 1, "b0")
    p.send(topic, 0, "a2")
    produce_service.produce(broker, topic, 0, ProduceRequest([NewRecord(None, b"plain")]))
    assert status(broker, topic, 0) == (4, 0)
    assert status(broker, topic, 1) == (1, 0)
    assert read(broker, topic, 0) == []  # the plain record is above the LSO too
    assert read(broker, topic, 0, "read_uncommitted") == [b"a0", b"a1", b"a2", b"plain"]
    out = p.commit()
    assert (out.state, out.producer_id, out.producer_epoch) == (S.COMPLETE_COMMIT, p.pid, 1)
    assert log(broker, topic, 0) == [
        (0, None, b"a0", False),
        (1, None, b"a1", False),
        (2, None, b"a2", False),
        (3, None, b"plain", False),
        (4, CONTROL_COMMIT, None, False),
    ]
    assert status(broker, topic, 0) == (5, 5)
    assert status(broker, topic, 1) == (2, 2)
    assert read(broker, topic, 0) == [b"a0", b"a1", b"a2", b"plain"]
    assert read(broker, topic, 1) == [b"b0"]
    assert markers(broker, topic, 2) == []


def test_end_txn_is_one_database_transaction(broker, topic):
    """The decision, every marker, the offsets and the completion commit together: an EndTxn that
    fails at the last marker leaves nothing behind, and its retry does all of it."""
    p = Producer(broker, "tx")
    for partition in range(3):
        p.send(topic, partition, f"v{partition}")
    p.commit_offsets("g", (topic, 3, 11))
    before = describe(broker, "tx")
    with broker.db.transaction() as conn:  # the marker of the last partition cannot be written
        conn.execute(
            text(
                "CREATE FUNCTION public.refuse_marker() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.partition = 2 AND NEW.control_type IS NOT NULL THEN RAISE EXCEPTION 'marker refused'; END IF; "
                "RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                "CREATE TRIGGER refuse_marker BEFORE INSERT ON txlog.records FOR EACH ROW EXECUTE FUNCTION public.refuse_marker()"
            )
        )

    with pytest.raises(Exception, match="marker refused"):
        copy.copy(p).commit()
    after = describe(broker, "tx")
    assert (after.state, after.version, after.producer_epoch) == (S.ONGOING, before.version, p.epoch)
    assert [e.to_state for e in transactions.events(broker, "tx")][-1] is S.ONGOING
    assert all(markers(broker, topic, i) == [] for i in range(3))
    assert all(status(broker, topic, i) == (1, 0) for i in range(3))
    assert groups.offset_fetch(broker, "g") == []
    assert [o["offset"] for o in transactions.pending_offsets(broker, "tx")] == [11]

    with broker.db.transaction() as conn:
        conn.execute(text("DROP TRIGGER refuse_marker ON txlog.records"))
        conn.execute(text("DROP FUNCTION public.refuse_marker()"))
    out = p.commit()
    assert (out.state, out.producer_epoch) == (S.COMPLETE_COMMIT, before.producer_epoch + 1)
    assert all(markers(broker, topic, i) == [CONTROL_COMMIT] for i in range(3))
    assert all(read(broker, topic, i) == [f"v{i}".encode()] for i in range(3))
    assert groups.offset_fetch(broker, "g") == [GroupOffset(topic, 3, 11, "")]
    assert [e.to_state for e in transactions.events(broker, "tx")][-3:] == [S.ONGOING, S.PREPARE_COMMIT, S.COMPLETE_COMMIT]


def test_abort_hides_the_records_from_read_committed_only(broker, topic):
    p = Producer(broker, "tx")
    p.send(topic, 0, "x", "y")
    produce_service.produce(broker, topic, 0, ProduceRequest([NewRecord(None, b"plain")]))
    out = p.abort()
    assert (out.state, out.producer_epoch) == (S.COMPLETE_ABORT, 1)
    assert status(broker, topic, 0) == (4, 4)
    assert read(broker, topic, 0) == [b"plain"]
    assert read(broker, topic, 0, "read_uncommitted") == [b"x", b"y", b"plain"]
    assert [a for _, _, _, a in log(broker, topic, 0)] == [True, True, False, False]


def test_next_offset_moves_past_markers_and_aborted_records(broker, topic):
    p = Producer(broker, "tx")
    p.send(topic, 0, "gone1", "gone2", "gone3")
    p.abort()  # offsets 0-2 aborted, 3 marker
    p.send(topic, 0, "kept")
    p.commit()  # 4 data, 5 marker
    p.send(topic, 0, "gone4")
    p.abort()  # 6 aborted, 7 marker
    got = fetch_service.fetch(broker, topic, 0, 0, isolation_level="read_committed")
    assert [(r.offset, r.value) for r in got.records] == [(4, b"kept")]
    assert got.next_offset == 8 == got.last_stable_offset == got.high_watermark
    for start in (0, 1, 3, 5, 6, 7):
        after = fetch_service.fetch(broker, topic, 0, start, isolation_level="read_committed")
        assert after.next_offset == 8
    one = fetch_service.fetch(broker, topic, 0, 0, max_records=1, isolation_level="read_committed")
    assert [r.offset for r in one.records] == [4]
    assert one.next_offset == 8  # nothing more below the LSO: the reader need not come back for it
    uncommitted = fetch_service.fetch(broker, topic, 0, 0)
    assert [r.offset for r in uncommitted.records] == [0, 1, 2, 4, 6]
    assert uncommitted.next_offset == 8


def _mixed_log(broker, topic, rng) -> tuple[dict[int, bool], int]:
    """Interleaved committed, aborted and open transactions of several producers, plain records
    and transactions aborted by a re-init, on partition 0: each offset's aborted flag by
    txlog.log_records, and the high watermark."""
    producers = [Producer(broker, f"tx{i}") for i in range(4)]
    for step in range(120):
        p = rng.choice(producers)
        roll = rng.random()
        if roll < 0.55:
            p.send(topic, 0, *[f"{p.tid}-{step}-{i}" for i in range(rng.randint(1, 3))])
        elif roll < 0.70:
            p.commit()
        elif roll < 0.85:
            p.abort()
        elif roll < 0.92:
            p.init()  # fences the producer: its open transaction is aborted
        else:
            produce_service.produce(broker, topic, 0, ProduceRequest([NewRecord(None, b"plain")]))
    with broker.db.read() as conn:
        view = dict(
            conn.execute(
                text('SELECT "offset", aborted FROM txlog.log_records WHERE topic = :t AND partition = 0'), {"t": topic}
            ).all()
        )
        status = log_store.partition_status(conn, topic, 0)
    assert any(view.values()) and not all(view.values())
    return view, status.high_watermark


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_fetch_page_flags_aborted_records_as_the_view_does(broker, topic, seed):
    """Kafka's Fetch flags a page's aborted records by the page form of the definition
    (``views.page_aborted``); every page, wherever it starts and ends, agrees with
    txlog.log_records.aborted row by row."""
    rng = random.Random(seed)
    view, hw = _mixed_log(broker, topic, rng)
    for _ in range(60):
        start = rng.randrange(hw)
        end = rng.randint(start + 1, hw)
        max_bytes = rng.choice([1, 40, 200, 10_000])
        with broker.db.read() as conn:
            page = log_store.records_fetch_log(conn, topic, 0, start, end, max_bytes, with_aborted=True)
        assert page and page[0].offset == start
        assert [(r.offset, r.aborted) for r in page] == [(r.offset, view[r.offset]) for r in page]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_committed_read_leaves_out_what_the_view_calls_aborted(broker, topic, seed):
    """The HTTP fetch's read_committed read, made span by span with the page form of the
    definition, returns exactly the first ``limit`` data records of the range that
    txlog.log_records does not call aborted, wherever the range starts and ends and whatever the
    limit (a span boundary inside a transaction, limits of 1 to past the range)."""
    rng = random.Random(seed)
    view, hw = _mixed_log(broker, topic, rng)
    with broker.db.read() as conn:
        data = [
            o
            for (o,) in conn.execute(
                text(
                    'SELECT "offset" FROM txlog.records WHERE topic = :t AND partition = 0 AND control_type IS NULL '
                    'ORDER BY "offset"'
                ),
                {"t": topic},
            ).all()
        ]
    for _ in range(80):
        start = rng.randrange(hw)
        upper = rng.randint(start + 1, hw)
        limit = rng.choice([1, 2, 3, 5, 17, 40, 400])
        with broker.db.read() as conn:
            got = [r.offset for r in log_store.records_fetch(conn, topic, 0, start, upper, limit, committed_only=True)]
        assert got == [o for o in data if start <= o < upper and not view[o]][:limit], (start, upper, limit)


def test_lso_is_the_first_offset_of_the_earliest_open_transaction(broker, topic):
    a, b = Producer(broker, "a"), Producer(broker, "b")
    produce_service.produce(broker, topic, 0, ProduceRequest([NewRecord(None, b"p0")]))  # 0
    a.send(topic, 0, "a1")  # 1
    b.send(topic, 0, "b2")  # 2
    a.send(topic, 0, "a3")  # 3
    assert status(broker, topic, 0) == (4, 1)
    assert read(broker, topic, 0) == [b"p0"]
    b.commit()  # marker 4
    assert status(broker, topic, 0) == (5, 1)  # a is still open
    assert read(broker, topic, 0) == [b"p0"]
    a.abort()  # marker 5
    assert status(broker, topic, 0) == (6, 6)
    assert read(broker, topic, 0) == [b"p0", b"b2"]
    with broker.db.read() as conn:
        s = log_store.partition_status(conn, topic, 0)
    assert s.open_transactions == 0


def test_empty_transaction_end_writes_no_markers(broker, topic):
    p = Producer(broker, "tx")
    assert p.commit().state is S.COMPLETE_COMMIT
    assert p.abort().state is S.COMPLETE_ABORT
    assert p.epoch == 2
    p.send(topic, 0, "a")
    p.commit()
    assert markers(broker, topic, 0) == [CONTROL_COMMIT]
    # an empty transaction right after one with partitions marks nothing either
    assert p.commit().state is S.COMPLETE_COMMIT
    assert p.abort().state is S.COMPLETE_ABORT
    assert markers(broker, topic, 0) == [CONTROL_COMMIT]
    assert status(broker, topic, 0) == (2, 2)
    assert describe(broker, "tx").partitions == ()


def test_an_empty_transaction_with_offsets_only_applies_them(broker, topic):
    p = Producer(broker, "tx")
    p.commit_offsets("g", (topic, 2, 42))
    p.commit()
    assert groups.offset_fetch(broker, "g") == [GroupOffset(topic, 2, 42, "")]
    assert all(markers(broker, topic, i) == [] for i in range(4))


def test_each_transaction_has_its_own_epoch_and_sequences_restart(broker, topic):
    p = Producer(broker, "tx")
    epochs = []
    for i in range(4):
        epochs.append(p.epoch)
        p.send(topic, 0, f"v{i}a", f"v{i}b")
        assert p.seqs[(topic, 0)] == 2
        (p.commit if i % 2 == 0 else p.abort)()
    assert epochs == [0, 1, 2, 3]
    got = fetch_service.fetch(broker, topic, 0, 0).records
    assert [(r.producer_epoch, r.sequence) for r in got] == [(e, s) for e in range(4) for s in (0, 1)]
    assert read(broker, topic, 0) == [b"v0a", b"v0b", b"v2a", b"v2b"]


def test_a_new_epoch_must_start_at_sequence_zero(broker, topic):
    p = Producer(broker, "tx")
    p.send(topic, 0, "a")
    p.commit()
    p.seqs[(topic, 0)] = 1  # a client that forgot to restart its sequences
    assert error_of(p.send, topic, 0, "b").code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


# --- retried and late EndTxn --------------------------------------------------------------------------


@pytest.mark.parametrize("result", ["commit", "abort"])
def test_a_retried_end_is_idempotent(broker, topic, result):
    p = Producer(broker, "tx")
    p.send(topic, 0, "a")
    p.send(topic, 1, "b")
    sent = copy.copy(p)
    first = p.end(result)
    for _ in range(3):
        again = copy.copy(sent).end(result)
        assert (again.state, again.producer_id, again.producer_epoch) == (first.state, first.producer_id, first.producer_epoch)
    assert markers(broker, topic, 0) == [CONTROL_COMMIT if result == "commit" else CONTROL_ABORT]
    assert markers(broker, topic, 1) == [CONTROL_COMMIT if result == "commit" else CONTROL_ABORT]
    assert describe(broker, "tx").version == 5  # created, 2 partitions, prepared, completed


@pytest.mark.parametrize(("taken", "contradiction"), [("commit", "abort"), ("abort", "commit")])
def test_a_contradicting_end_is_invalid_txn_state(broker, topic, taken, contradiction):
    p = Producer(broker, "tx")
    p.send(topic, 0, "a")
    sent = copy.copy(p)
    p.end(taken)
    err = error_of(copy.copy(sent).end, contradiction)
    assert err.code is ErrorCode.INVALID_TXN_STATE
    assert markers(broker, topic, 0) == [CONTROL_COMMIT if taken == "commit" else CONTROL_ABORT]
    assert describe(broker, "tx").last_result == taken


@pytest.mark.parametrize("n_decision", ["commit", "abort"])
@pytest.mark.parametrize("n1_decision", ["commit", "abort"])
def test_delayed_ends_of_transaction_n_never_touch_transaction_n_plus_1(broker, topic, n_decision, n1_decision):
    """Jepsen's delayed-commit anomaly: EndTxn of N arrives again, late, while N+1 is open. Under
    transactions V2 it carries N's epoch and is answered as a retry of N; N+1 ends only by its own
    decision, and its records keep their fate."""
    p = Producer(broker, "tx")
    p.send(topic, 0, "n-a")
    p.send(topic, 1, "n-b")
    late = copy.copy(p)
    p.end(n_decision)
    p.send(topic, 0, "n1-a")
    p.send(topic, 2, "n1-c")
    before = describe(broker, "tx")
    assert before.state is S.ONGOING

    same = copy.copy(late).end(n_decision)  # the delayed repeat of N's decision
    assert (same.producer_id, same.producer_epoch) == (p.pid, p.epoch)
    contradicting = "abort" if n_decision == "commit" else "commit"
    assert error_of(copy.copy(late).end, contradicting).code is ErrorCode.INVALID_TXN_STATE
    assert error_of(late.send, topic, 0, "late-produce").code is ErrorCode.PRODUCER_FENCED
    assert error_of(late.add, (topic, 3)).code is ErrorCode.PRODUCER_FENCED

    after = describe(broker, "tx")
    assert (after.state, after.version, after.partitions) == (S.ONGOING, before.version, ((topic, 0), (topic, 2)))
    assert status(broker, topic, 0) == (3, 2)  # N's marker at 1; N+1's first record holds the LSO
    assert read(broker, topic, 0) == ([b"n-a"] if n_decision == "commit" else [])
    assert markers(broker, topic, 2) == []

    p.end(n1_decision)
    n_seen = [b"n-a"] if n_decision == "commit" else []
    n1_seen = [b"n1-a"] if n1_decision == "commit" else []
    assert read(broker, topic, 0) == n_seen + n1_seen
    assert read(broker, topic, 2) == ([b"n1-c"] if n1_decision == "commit" else [])
    assert read(broker, topic, 1) == ([b"n-b"] if n_decision == "commit" else [])
    # once N+1 ended, N's epoch is two behind: no longer a retry, plainly fenced
    err = error_of(copy.copy(late).end, n_decision)
    assert err.code is ErrorCode.PRODUCER_FENCED


def test_an_end_whose_commit_a_newer_init_completed_between_its_steps_is_told_it_committed(broker, topic):
    old = Producer(broker, "tx")
    old.send(topic, 0, "a")
    assert transactions.end_txn_prepare(broker, "tx", old.pid, old.epoch, "commit") is None
    new = copy.copy(old).init()  # completes the PrepareCommit as a commit, then fences
    err = error_of(transactions.end_txn_complete, broker, "tx", old.pid, old.epoch, "commit")
    assert (err.code, err.details["reason"], err.details["transaction_result"]) == (
        ErrorCode.PRODUCER_FENCED,
        "newer_epoch",
        "commit",
    )
    assert "commit was completed" in err.message
    assert read(broker, topic, 0) == [b"a"]
    assert describe(broker, "tx").producer_epoch == new.epoch


def test_a_late_end_after_the_transaction_was_ended_by_a_newer_init_is_fenced(broker, topic):
    old = Producer(broker, "tx")
    old.send(topic, 0, "a")
    copy.copy(old).init()
    for result in ("commit", "abort"):
        err = error_of(copy.copy(old).end, result)
        assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "newer_epoch")
    assert read(broker, topic, 0) == []


# --- operator abort -----------------------------------------------------------------------------------


def test_operator_abort_aborts_and_fences_with_the_reason(broker, topic):
    p = Producer(broker, "tx")
    p.send(topic, 0, "a")
    p.commit_offsets("g", (topic, 0, 1))
    meta = transaction_aborts.abort_by_operator(broker, "tx")
    assert (meta.state, meta.producer_epoch, meta.fence_reason) == (S.COMPLETE_ABORT, 1, "aborted_by_operator")
    assert markers(broker, topic, 0) == [CONTROL_ABORT]
    assert read(broker, topic, 0) == []
    assert groups.offset_fetch(broker, "g") == []
    for attempt in (
        lambda: p.send(topic, 0, "more"),
        lambda: copy.copy(p).commit(),
        lambda: copy.copy(p).abort(),
        lambda: p.add((topic, 1)),
    ):
        err = error_of(attempt)
        assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "aborted_by_operator")
        assert "aborted_by_operator" in err.message
    p.init()
    p.send(topic, 0, "b")
    p.commit()
    assert read(broker, topic, 0) == [b"b"]


def test_operator_abort_of_nothing(broker, topic):
    assert error_of(transaction_aborts.abort_by_operator, broker, "nobody").code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    p = Producer(broker, "tx")
    assert error_of(transaction_aborts.abort_by_operator, broker, "tx").code is ErrorCode.INVALID_TXN_STATE
    p.send(topic, 0, "a")
    p.commit()
    assert error_of(transaction_aborts.abort_by_operator, broker, "tx").code is ErrorCode.INVALID_TXN_STATE


# --- concurrency ------------------------------------------------------------------------------------


def test_concurrent_ends_of_one_transaction_write_one_marker(broker, topic):
    p = Producer(broker, "tx")
    for partition in range(4):
        p.send(topic, partition, f"v{partition}")
    start = threading.Barrier(12)

    def end() -> transactions.EndTxnOutcome:
        start.wait()
        return transactions.end_txn(broker, "tx", p.pid, p.epoch, "commit")

    with ThreadPoolExecutor(12) as pool:
        outcomes = [f.result() for f in [pool.submit(end) for _ in range(12)]]
    assert {(o.state, o.producer_id, o.producer_epoch) for o in outcomes} == {(S.COMPLETE_COMMIT, p.pid, p.epoch + 1)}
    for partition in range(4):
        assert markers(broker, topic, partition) == [CONTROL_COMMIT]
        assert read(broker, topic, partition) == [f"v{partition}".encode()]


def test_concurrent_inits_of_one_transactional_id_get_distinct_epochs(broker, topic):
    start = threading.Barrier(10)

    def init() -> transactions.ProducerIdAndEpoch:
        start.wait()
        return transactions.init_producer_id(broker, "tx")

    with ThreadPoolExecutor(10) as pool:
        got = [f.result() for f in [pool.submit(init) for _ in range(10)]]
    assert len({g.producer_id for g in got}) == 1
    assert sorted(g.producer_epoch for g in got) == list(range(10))
    assert describe(broker, "tx").producer_epoch == 9
    assert [e.version for e in transactions.events(broker, "tx")] == list(range(1, 11))


def test_concurrent_operations_on_one_transaction_are_serialized(broker, topic):
    """Produces, AddPartitionsToTxn and TxnOffsetCommit of one transaction at once: each waits for
    the transaction row, none is lost, and the history has one event per change."""
    p = Producer(broker, "tx")
    start = threading.Barrier(12)

    def op(i: int) -> None:
        start.wait()
        if i < 4:
            p.send(topic, i, f"v{i}")  # distinct partitions: each is that partition's sequence 0
        elif i < 8:
            p.add((topic, i % 4), (topic, (i + 1) % 4))
        else:
            p.commit_offsets(f"g{i}", (topic, i % 4, i))

    with ThreadPoolExecutor(12) as pool:
        for f in [pool.submit(op, i) for i in range(12)]:
            f.result()
    meta = describe(broker, "tx")
    assert meta.partitions == tuple((topic, i) for i in range(4))
    assert meta.groups == ("g10", "g11", "g8", "g9")
    events = transactions.events(broker, "tx")
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert sum(len(e.partitions_added) for e in events) == 4
    assert sum(len(e.groups_added) for e in events) == 4
    p.commit()
    for partition in range(4):
        assert read(broker, topic, partition) == [f"v{partition}".encode()]
        assert markers(broker, topic, partition) == [CONTROL_COMMIT]
    assert [groups.offset_fetch(broker, f"g{i}") for i in range(8, 12)] == [
        [GroupOffset(topic, i % 4, i, "")] for i in range(8, 12)
    ]


def test_many_threads_running_transactions_over_overlapping_partitions_do_not_deadlock(broker, topic):
    """8 producers x 10 transactions, each over a random subset of the 4 partitions in random
    order, committed or aborted at random: every operation completes (no deadlock, no error), and
    afterwards each partition shows exactly the committed records, in a dense log with one marker
    per transaction that touched it."""
    committed: dict[int, list[bytes]] = {i: [] for i in range(4)}
    touched: dict[int, int] = {i: 0 for i in range(4)}
    lock = threading.Lock()

    def run(worker: int) -> None:
        rng = random.Random(worker)
        p = Producer(broker, f"tx-{worker}")
        for n in range(10):
            parts = rng.sample(range(4), rng.randint(1, 4))
            values: dict[int, list[bytes]] = {}
            for partition in parts:
                for k in range(rng.randint(1, 2)):
                    value = f"w{worker}-t{n}-p{partition}-{k}"
                    p.send(topic, partition, value)
                    values.setdefault(partition, []).append(value.encode())
            if rng.random() < 0.5:
                p.commit_offsets(f"g{worker}", (topic, parts[0], n))
            commit = rng.random() < 0.6
            (p.commit if commit else p.abort)()
            with lock:
                for partition in parts:
                    touched[partition] += 1
                    if commit:
                        committed[partition] += values[partition]

    with ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(run, w) for w in range(8)]:
            f.result(timeout=120)

    for partition in range(4):
        entries = log(broker, topic, partition)
        assert [o for o, _, _, _ in entries] == list(range(len(entries)))
        assert len([c for _, c, _, _ in entries if c is not None]) == touched[partition]
        assert sorted(read(broker, topic, partition)) == sorted(committed[partition])
        hw, lso = status(broker, topic, partition)
        assert hw == lso == len(entries)
    for w in range(8):
        assert describe(broker, f"tx-{w}").state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
        assert describe(broker, f"tx-{w}").producer_epoch == 10
