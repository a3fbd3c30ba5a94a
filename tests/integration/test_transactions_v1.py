"""Transactions as Kafka clients before transactions V2 drive them, through the services on a real
PostgreSQL: one epoch and one run of sequences across transactions, partitions and groups added
explicitly (a batch or offset commit for one not added is refused, KIP-890 part 1), EndTxn without
an epoch bump and its retries, the late EndTxn that protocol cannot tell apart, InitProducerId
with the producer's id and epoch (KIP-360), and aborted and committed transactions of one epoch
read back exactly."""

from __future__ import annotations

import copy

import pytest
from sqlalchemy import text

from app.domain.groups.offsets import GroupOffset
from app.domain.producer_state import MAX_EPOCH
from app.domain.records import CONTROL_ABORT, CONTROL_COMMIT, NewRecord
from app.domain.transactions import TxnState
from app.errors import ErrorCode
from app.services import fetch as fetch_service
from app.services import groups, topics, transactions
from app.services import produce as produce_service
from app.services.produce import ProduceRequest
from tests import storage_helpers
from tests.integration.test_transactions import Producer, describe, error_of, log, read, set_epoch, status

S = TxnState


class ClassicProducer:
    """A transactional producer as librdkafka, kafka-python, aiokafka and Java 3.x drive the
    protocol: AddPartitionsToTxn and AddOffsetsToTxn before their batches and offsets, EndTxn
    version below 5 (``transaction_version=1``), one epoch and one sequence per partition for the
    producer's whole session. ``copy.copy(p)`` keeps a stale view (a delayed request)."""

    def __init__(self, broker, tid: str) -> None:  # type: ignore[no-untyped-def]
        self.broker = broker
        self.tid = tid
        got = transactions.init_producer_id(broker, tid)
        self.pid, self.epoch, self.seqs = got.producer_id, got.producer_epoch, {}

    def reinit(self) -> transactions.ProducerIdAndEpoch:
        """InitProducerId naming the producer's id and epoch (KIP-360), as after an abortable error."""
        got = transactions.init_producer_id(self.broker, self.tid, None, self.pid, self.epoch)
        self.pid, self.epoch, self.seqs = got.producer_id, got.producer_epoch, {}
        return got

    def add(self, *partitions: tuple[str, int]):  # type: ignore[no-untyped-def]
        return transactions.add_partitions_to_txn(self.broker, self.tid, self.pid, self.epoch, list(partitions))

    def send(self, topic: str, partition: int, *values: str) -> produce_service.ProduceResult:
        seq = self.seqs.get((topic, partition), 0)
        records = [NewRecord(None, v.encode()) for v in values]
        result = produce_service.produce(
            self.broker, topic, partition, ProduceRequest(records, self.pid, self.epoch, seq, self.tid, require_added=True)
        )
        self.seqs[(topic, partition)] = seq + len(values)
        return result

    def add_offsets(self, group: str):  # type: ignore[no-untyped-def]
        return transactions.add_offsets_to_txn(self.broker, self.tid, self.pid, self.epoch, group)

    def commit_offsets(self, group: str, *offsets: tuple[str, int, int, str]):  # type: ignore[no-untyped-def]
        return transactions.txn_offset_commit(
            self.broker, self.tid, self.pid, self.epoch, group, [GroupOffset(*o) for o in offsets], require_added=True
        )

    def end(self, result: str) -> transactions.EndTxnOutcome:
        return transactions.end_txn(self.broker, self.tid, self.pid, self.epoch, result, 1)  # type: ignore[arg-type]

    def commit(self) -> transactions.EndTxnOutcome:
        return self.end("commit")

    def abort(self) -> transactions.EndTxnOutcome:
        return self.end("abort")


@pytest.fixture
def topic(broker) -> str:  # type: ignore[no-untyped-def]
    topics.create_topic(broker, "t", 2)
    return "t"


def values(broker, topic: str, partition: int, isolation: str = "read_committed") -> list[str]:  # type: ignore[no-untyped-def]
    return [v.decode() for v in read(broker, topic, partition, isolation) if v is not None]


def events_count(broker, tid: str) -> int:  # type: ignore[no-untyped-def]
    return len(transactions.events(broker, tid))


# --- one epoch, one run of sequences ---------------------------------------------------------------


def test_the_epoch_and_the_sequences_carry_on_from_one_transaction_to_the_next(broker, topic):
    p = ClassicProducer(broker, "classic")
    epoch = p.epoch
    p.add((topic, 0))
    p.send(topic, 0, "a", "b")
    out = p.commit()
    assert (out.state, out.producer_id, out.producer_epoch) == (S.COMPLETE_COMMIT, p.pid, epoch)
    p.add((topic, 0), (topic, 1))
    p.send(topic, 0, "c")  # sequence 2: the producer's sequences go on
    p.send(topic, 1, "d")
    p.abort()
    p.add((topic, 0))
    p.send(topic, 0, "e")  # sequence 3
    p.commit()
    assert p.epoch == epoch == describe(broker, "classic").producer_epoch
    with broker.db.read() as conn:
        sequences = [r.sequence for r in storage_helpers.records_browse(conn, topic, 0, 0, 100) if r.control_type is None]
    assert sequences == [0, 1, 2, 3]
    assert values(broker, topic, 0) == ["a", "b", "e"]
    assert values(broker, topic, 1) == []
    # a batch restarting at sequence 0 at the same epoch is out of order, not a new transaction
    p.add((topic, 0))
    p.seqs[(topic, 0)] = 0
    assert error_of(p.send, topic, 0, "again").code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


# --- partitions and groups added explicitly (KIP-890 part 1) -------------------------------------------


def test_a_batch_for_a_partition_not_added_is_refused_and_opens_nothing(broker, topic):
    p = ClassicProducer(broker, "classic")
    err = error_of(p.send, topic, 0, "too early")
    assert err.code is ErrorCode.INVALID_TXN_STATE
    assert err.message.startswith("Partition was not added to the transaction")
    assert describe(broker, "classic").state is S.EMPTY and status(broker, topic, 0) == (0, 0)
    p.seqs.clear()
    p.add((topic, 0))
    p.send(topic, 0, "in")
    assert error_of(p.send, topic, 1, "elsewhere").message.startswith("Partition was not added to the transaction")
    assert describe(broker, "classic").partitions == ((topic, 0),)
    delayed = copy.copy(p)
    delayed.seqs = dict(p.seqs)
    p.commit()
    # a batch of the ended transaction arriving late (same epoch, next sequence) must not open the
    # next transaction behind the producer's back
    assert error_of(delayed.send, topic, 0, "late").code is ErrorCode.INVALID_TXN_STATE
    assert describe(broker, "classic").state is S.COMPLETE_COMMIT
    assert status(broker, topic, 0) == (2, 2)
    assert values(broker, topic, 0) == ["in"]


def test_without_require_added_a_batch_adds_its_partition_as_the_http_api_does(broker, topic):
    p = Producer(broker, "implicit")
    p.send(topic, 1, "joins by itself")
    meta = describe(broker, "implicit")
    assert (meta.state, meta.partitions) == (S.ONGOING, ((topic, 1),))


def test_offsets_need_their_group_added_first_and_wait_for_the_commit(broker, topic):
    p = ClassicProducer(broker, "copier")
    p.add((topic, 0))
    p.send(topic, 0, "out")
    err = error_of(p.commit_offsets, "g", (topic, 1, 7, "m"))
    assert err.code is ErrorCode.INVALID_TXN_STATE and err.message.startswith("Group was not added to the transaction")
    assert describe(broker, "copier").groups == ()
    meta = p.add_offsets("g")
    assert (meta.state, meta.groups) == (S.ONGOING, ("g",))
    p.commit_offsets("g", (topic, 1, 7, "meta-é"))
    assert groups.offset_fetch(broker, "g") == []
    p.commit()
    assert groups.offset_fetch(broker, "g") == [GroupOffset(topic, 1, 7, "meta-é")]
    # a delayed TxnOffsetCommit of the ended transaction opens nothing
    assert error_of(p.commit_offsets, "g", (topic, 1, 99, "")).code is ErrorCode.INVALID_TXN_STATE
    assert describe(broker, "copier").state is S.COMPLETE_COMMIT


def test_add_offsets_to_txn_starts_a_transaction_and_is_fenced_like_the_others(broker, topic):
    p = ClassicProducer(broker, "copier")
    stale = copy.copy(p)
    p.add_offsets("g")
    assert describe(broker, "copier").state is S.ONGOING
    transactions.init_producer_id(broker, "copier")  # another instance takes over
    assert error_of(stale.add_offsets, "g").code is ErrorCode.PRODUCER_FENCED


# --- EndTxn without an epoch bump -----------------------------------------------------------------------


def test_a_repeated_end_is_answered_while_the_transaction_is_complete(broker, topic):
    p = ClassicProducer(broker, "classic")
    p.add((topic, 0))
    p.send(topic, 0, "x")
    first = p.abort()
    assert p.abort() == first
    assert error_of(p.commit).code is ErrorCode.INVALID_TXN_STATE
    assert [c for _, c, _, _ in log(broker, topic, 0)] == [None, CONTROL_ABORT]  # one marker


def test_the_hole_of_the_classic_protocol_a_late_end_ends_the_next_transaction(broker, topic):
    """Documented, not wanted: once the producer's next transaction is open at the same epoch, a
    delayed EndTxn of the previous one cannot be told from the new transaction's own, and ends it
    (Kafka's protocol before V2 has the same hole). The HTTP API and V2 clients do not: their next
    transaction has the next epoch, so the late EndTxn is a recognised retry."""
    p = ClassicProducer(broker, "classic")
    p.add((topic, 0))
    p.send(topic, 0, "first")
    late = copy.copy(p)
    p.commit()
    p.add((topic, 0))
    p.send(topic, 0, "second, not yet committed")
    late.commit()  # the first transaction's EndTxn, delayed in the network
    assert describe(broker, "classic").state is S.COMPLETE_COMMIT
    assert values(broker, topic, 0) == ["first", "second, not yet committed"]

    v2 = Producer(broker, "v2")  # the same story with one epoch per transaction
    v2.send(topic, 1, "first")
    late_v2 = copy.copy(v2)
    v2.commit()
    v2.send(topic, 1, "second, not yet committed")
    late_v2.commit()  # a retry of the first: answered, the second untouched
    assert describe(broker, "v2").state is S.ONGOING
    assert values(broker, topic, 1) == ["first"]


# --- InitProducerId with the producer's id and epoch (KIP-360) ------------------------------------------


def test_an_init_naming_the_current_epoch_bumps_it_ending_the_open_transaction(broker, topic):
    p = ClassicProducer(broker, "classic")
    pid, epoch = p.pid, p.epoch
    p.add((topic, 0))
    p.send(topic, 0, "abandoned")
    got = p.reinit()
    assert (got.producer_id, got.producer_epoch) == (pid, epoch + 1)
    assert [c for _, c, _, _ in log(broker, topic, 0)] == [None, CONTROL_ABORT]
    assert describe(broker, "classic").state is S.EMPTY
    p.add((topic, 0))
    p.send(topic, 0, "fresh")  # sequence 0 again, at the new epoch
    p.commit()
    assert values(broker, topic, 0) == ["fresh"]


def test_a_retried_init_gets_the_same_answer_and_changes_nothing(broker, topic):
    p = ClassicProducer(broker, "classic")
    pid, epoch = p.pid, p.epoch
    first = transactions.init_producer_id(broker, "classic", None, pid, epoch)
    n = events_count(broker, "classic")
    again = transactions.init_producer_id(broker, "classic", None, pid, epoch)  # its answer was lost
    assert again == first == transactions.ProducerIdAndEpoch(pid, epoch + 1)
    assert events_count(broker, "classic") == n
    # once the producer went on with its new epoch, the old request is a stale one
    p.pid, p.epoch = first.producer_id, first.producer_epoch
    p.add((topic, 0))
    err = error_of(transactions.init_producer_id, broker, "classic", None, pid, epoch)
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "newer_epoch")
    assert describe(broker, "classic").state is S.ONGOING


def test_an_init_naming_an_epoch_another_init_superseded_is_fenced(broker, topic):
    p = ClassicProducer(broker, "classic")
    zombie = copy.copy(p)
    transactions.init_producer_id(broker, "classic")  # a new instance: no id given, the old ones forgotten
    for pid, epoch in ((zombie.pid, zombie.epoch), (zombie.pid, zombie.epoch + 5), (zombie.pid + 1, 0)):
        err = error_of(transactions.init_producer_id, broker, "classic", None, pid, epoch)
        assert err.code is ErrorCode.PRODUCER_FENCED, (pid, epoch)
    assert "Producer id" in error_of(transactions.init_producer_id, broker, "classic", None, zombie.pid + 1, 0).message


def test_an_init_naming_an_id_for_an_unknown_or_non_transactional_producer_starts_afresh(broker, topic):
    got = transactions.init_producer_id(broker, "unknown", None, 4242, 7)
    assert got.producer_epoch == 0 and got.producer_id != 4242
    plain = transactions.init_producer_id(broker, None, None, got.producer_id, 3)
    assert plain.producer_epoch == 0 and plain.producer_id not in (4242, got.producer_id)
    assert (
        error_of(transactions.init_producer_id, broker, "unknown", None, got.producer_id, None).code is ErrorCode.INVALID_REQUEST
    )


def test_a_retried_init_is_recognised_across_a_new_producer_id(broker, topic):
    p = ClassicProducer(broker, "classic")
    set_epoch(broker, "classic", MAX_EPOCH)
    old_pid = p.pid
    first = transactions.init_producer_id(broker, "classic", None, old_pid, MAX_EPOCH)
    assert first.producer_id != old_pid and first.producer_epoch == 0
    assert transactions.init_producer_id(broker, "classic", None, old_pid, MAX_EPOCH) == first
    assert transactions.init_producer_id(broker, "classic", None, first.producer_id, 0).producer_epoch == 1


# --- aborted and committed transactions of one epoch, read back ------------------------------------------


def test_an_aborted_then_a_committed_transaction_of_one_epoch_on_one_partition_read_exactly(broker, topic):
    p = ClassicProducer(broker, "classic")
    plain = lambda v: produce_service.produce(broker, topic, 0, ProduceRequest([NewRecord(None, v.encode())]))  # noqa: E731
    plain("before")  # 0
    p.add((topic, 0))
    p.send(topic, 0, "aborted-1", "aborted-2")  # 1, 2
    plain("between")  # 3
    p.abort()  # 4: ABORT
    p.add((topic, 0))
    p.send(topic, 0, "committed-1")  # 5
    p.send(topic, 0, "committed-2")  # 6
    p.commit()  # 7: COMMIT
    plain("after")  # 8
    assert p.epoch == describe(broker, "classic").producer_epoch  # one epoch for both

    expected = ["before", "between", "committed-1", "committed-2", "after"]
    assert values(broker, topic, 0) == expected
    assert len(values(broker, topic, 0, "read_uncommitted")) == 7
    with broker.db.read() as conn:
        view = [
            r[0].decode()
            for r in conn.execute(
                text('SELECT value FROM txlog.committed_records WHERE topic = :t AND partition = 0 ORDER BY "offset"'),
                {"t": topic},
            )
        ]
        ranges = conn.execute(
            text("SELECT producer_id, first_offset, last_offset FROM txlog.aborted_txns WHERE topic = :t"), {"t": topic}
        ).all()
        flagged = [(r.offset, r.aborted) for r in storage_helpers.records_browse(conn, topic, 0, 0, 100)]
    assert view == expected
    assert ranges == [(p.pid, 1, 4)]
    assert [o for o, aborted in flagged if aborted] == [1, 2, 4]  # the aborted records and their marker
    page = fetch_service.fetch_log(broker, topic, 0, 0, isolation_level="read_committed")
    assert [r.offset for r in page.records] == list(range(9))
    assert [r.control_type for r in page.records if r.control_type is not None] == [CONTROL_ABORT, CONTROL_COMMIT]
    assert page.aborted_transactions == [(p.pid, 1)]
    # a page that starts inside the committed transaction names no aborted one
    assert fetch_service.fetch_log(broker, topic, 0, 5, isolation_level="read_committed").aborted_transactions == []


def test_an_init_over_a_prepared_kept_epoch_transaction_completes_it_and_still_fences(broker, topic):
    p = ClassicProducer(broker, "classic")
    p.add((topic, 0))
    p.send(topic, 0, "decided")
    # a two-step EndTxn whose process died after the decision: prepared, keeping its epoch
    assert transactions.end_txn_prepare(broker, "classic", p.pid, p.epoch, "commit", 1) is None
    assert describe(broker, "classic").state is S.PREPARE_COMMIT
    got = transactions.init_producer_id(broker, "classic")
    assert (got.producer_id, got.producer_epoch) == (p.pid, p.epoch + 1)  # raised: the old producer is fenced
    assert values(broker, topic, 0) == ["decided"]
    assert error_of(p.send, topic, 0, "zombie").code is ErrorCode.PRODUCER_FENCED
