"""Kafka's transactions V2 (KIP-890 part 2) over the wire, with raw frames: no Python client sends
it (Java clients from 4.0 do, when ApiVersions finalizes ``transaction.version`` 2).

The transcript, as a Kafka 4.x broker answers it: Produce v12 and TxnOffsetCommit v5 add their
partition and group to the transaction themselves; EndTxn v5 ends it with the next epoch, answered
to the client; a batch or AddPartitionsToTxn at the retired epoch is fenced; a retried EndTxn at the
retired epoch with the same outcome answers NONE with the current epoch, the opposite outcome
INVALID_TXN_STATE, and neither touches the producer's next transaction (the delayed EndTxn that
could end the wrong transaction in the first protocol). The epoch's edge cases: 32766 → 32767 → a
new producer id; InitProducerId during a V2 transaction aborts it and raises the epoch once; a
commit with no records. Clients of the first protocol on the same gateway learn of a partition or
group missing from their transaction as TRANSACTION_ABORTABLE from the versions that know it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from api.kafka import versions
from app.domain.producer_state import MAX_EPOCH
from app.domain.transactions import TxnState
from app.errors import ErrorCode
from app.services import Broker, topics
from app.services import transactions as txn_service
from app.wire.kafka.messages import ApiKey
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.kafka.test_transactions import (
    INVALID_PRODUCER_EPOCH,
    INVALID_TXN_STATE,
    NONE,
    PARTITIONS,
    PRODUCER_FENCED,
    aborted_flags,
    add_partitions,
    batch,
    committed_view,
    group_offsets,
    init_producer_id,
    produce,
    values,
)

CONCURRENT_TRANSACTIONS = ErrorCode.CONCURRENT_TRANSACTIONS.kafka_code
TRANSACTION_ABORTABLE = ErrorCode.TRANSACTION_ABORTABLE.kafka_code


@pytest.fixture
def topic(store: Broker) -> str:
    name = f"v2-{uuid.uuid4().hex[:10]}"
    topics.create_topic(store, name, PARTITIONS)
    return name


def end_txn(raw: RawConnection, tid: str, pid: int, epoch: int, commit: bool) -> tuple[int, int, int]:
    """EndTxn v5: (error code, producer id, epoch for the next transaction)."""
    answer = raw.request(
        ApiKey.EndTxn, 5, {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "committed": commit}
    )
    return answer.error_code, answer.producer_id, answer.producer_epoch


def send(
    raw: RawConnection, tid: str, topic: str, partition: int, pid: int, epoch: int, seq: int, items: list[bytes]
) -> tuple[int, int]:
    """A transactional batch in Produce v12: (error code, base offset)."""
    return produce(raw, topic, partition, batch(pid, epoch, seq, items, transactional=True), tid, version=12)


def txn_offset_commit(
    raw: RawConnection, version: int, tid: str, pid: int, epoch: int, group: str, topic: str, offset: int
) -> int:
    body: dict[str, Any] = {
        "transactional_id": tid,
        "group_id": group,
        "producer_id": pid,
        "producer_epoch": epoch,
        "generation_id": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset, "committed_metadata": ""}]}],
    }
    answer = raw.request(ApiKey.TxnOffsetCommit, version, body)
    return answer.topics[0].partitions[0].error_code


def decisions(store: Broker, tid: str) -> list[tuple[str, int]]:
    """(state, transaction version) of each decision and completion recorded for ``tid``."""
    return [
        (e.to_state.value, e.transaction_version)
        for e in txn_service.events(store, tid)
        if e.to_state.is_prepared or e.to_state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
    ]


def set_epoch(store: Broker, tid: str, epoch: int) -> None:
    with store.db.transaction() as conn:
        conn.execute(
            text("UPDATE txlog.transactions SET producer_epoch = :e WHERE transactional_id = :t"), {"e": epoch, "t": tid}
        )


# -- ApiVersions ---------------------------------------------------------------------------------


def features(raw: RawConnection, version: int = 4) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]], int]:
    got = raw.request(ApiKey.ApiVersions, version, {"client_software_name": "raw-test", "client_software_version": "1.0"})
    assert got.error_code == NONE
    supported = [(f.name, f.min_version, f.max_version) for f in got.supported_features]
    finalized = [(f.name, f.min_version_level, f.max_version_level) for f in got.finalized_features]
    return supported, finalized, got.finalized_features_epoch


def test_apiversions_finalizes_transaction_version_2_and_serves_its_request_versions(raw: RawConnection) -> None:
    for version in (3, 4):
        supported, finalized, epoch = features(raw, version)
        assert supported == [("transaction.version", 0, 2)]
        assert finalized == [("transaction.version", 2, 2)]
        assert epoch > 0
    served = {k: (lo, hi) for k, lo, hi in versions.advertised()}
    assert served[ApiKey.Produce] == (0, 12)
    assert served[ApiKey.InitProducerId] == (0, 5)
    assert served[ApiKey.AddPartitionsToTxn] == (0, 3)  # v4+ is between brokers
    assert served[ApiKey.AddOffsetsToTxn] == (0, 4)
    assert served[ApiKey.EndTxn] == (0, 5)
    assert served[ApiKey.TxnOffsetCommit] == (0, 5)


def test_an_operator_finalizes_transaction_version_1_and_requests_are_still_served_by_their_version(
    start_gateway: Any, store: Broker
) -> None:
    """As a Kafka cluster finalized at 1: clients stay on the first protocol, and a V2 request that
    comes anyway (a client that began its transaction before the change) is served as V2."""
    g: GatewayProcess = start_gateway(kafka_transaction_version="1", kafka_auto_create_topics="true")
    with g.connect() as raw:
        supported, finalized, _ = features(raw)
        assert supported == [("transaction.version", 0, 2)]
        assert finalized == [("transaction.version", 1, 1)]
        raw.request(ApiKey.Metadata, 4, {"topics": [{"name": "tv1-topic"}], "allow_auto_topic_creation": True})
        tid = f"tid-{uuid.uuid4().hex[:8]}"
        code, pid, epoch = init_producer_id(raw, tid, 5)
        assert code == NONE
        assert send(raw, tid, "tv1-topic", 0, pid, epoch, 0, values("a", 1))[0] == NONE
        assert end_txn(raw, tid, pid, epoch, commit=True) == (NONE, pid, epoch + 1)


# -- the transcript --------------------------------------------------------------------------------


def test_a_v2_transaction_adds_its_partitions_and_group_itself_and_its_end_moves_the_epoch_on(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    tid, group = f"tid-{topic}", f"group-{topic}"
    code, pid, e = init_producer_id(raw, tid, 5)
    assert code == NONE
    # no AddPartitionsToTxn, no AddOffsetsToTxn: the batches and the offset commit add themselves
    assert send(raw, tid, topic, 0, pid, e, 0, values("a", 2)) == (NONE, 0)
    assert send(raw, tid, topic, 1, pid, e, 0, values("b", 1)) == (NONE, 0)
    assert txn_offset_commit(raw, 5, tid, pid, e, group, topic, 7) == NONE
    meta = txn_service.describe(store, tid)
    assert (meta.state, meta.partitions, meta.groups) == (TxnState.ONGOING, ((topic, 0), (topic, 1)), (group,))
    assert end_txn(raw, tid, pid, e, commit=True) == (NONE, pid, e + 1)
    assert committed_view(store, topic) == {0: values("a", 2), 1: values("b", 1)}
    assert group_offsets(store, group, topic)[0] == 7
    assert decisions(store, tid) == [("PrepareCommit", 2), ("CompleteCommit", 2)]

    # the retired epoch is fenced: a batch (INVALID_PRODUCER_EPOCH on Produce, as Kafka answers a
    # fenced batch) and an AddPartitionsToTxn
    assert send(raw, tid, topic, 0, pid, e, 2, values("late", 1))[0] == INVALID_PRODUCER_EPOCH
    assert add_partitions(raw, tid, pid, e, topic, 0) == [PRODUCER_FENCED]
    # a retried EndTxn at the retired epoch: the same outcome is answered with the current epoch,
    # the opposite one refused
    assert end_txn(raw, tid, pid, e, commit=True) == (NONE, pid, e + 1)
    assert end_txn(raw, tid, pid, e, commit=False)[0] == INVALID_TXN_STATE

    # the next transaction, at the new epoch (its sequences from 0): a delayed EndTxn of the one
    # before cannot end it, whichever outcome it carries
    assert send(raw, tid, topic, 0, pid, e + 1, 0, values("next", 2)) == (NONE, 3)
    assert end_txn(raw, tid, pid, e, commit=False)[0] == INVALID_TXN_STATE
    assert end_txn(raw, tid, pid, e, commit=True) == (NONE, pid, e + 1)
    meta = txn_service.describe(store, tid)
    assert (meta.state, meta.producer_epoch) == (TxnState.ONGOING, e + 1)
    assert committed_view(store, topic) == {0: values("a", 2), 1: values("b", 1)}
    # its own producer ends it
    assert end_txn(raw, tid, pid, e + 1, commit=False) == (NONE, pid, e + 2)
    assert committed_view(store, topic) == {0: values("a", 2), 1: values("b", 1)}
    assert decisions(store, tid)[-2:] == [("PrepareAbort", 2), ("CompleteAbort", 2)]
    # two epochs back: fenced
    assert end_txn(raw, tid, pid, e, commit=True)[0] == PRODUCER_FENCED


def test_a_transaction_being_completed_answers_concurrent_transactions_which_is_retriable(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    assert ErrorCode.CONCURRENT_TRANSACTIONS.retriable
    tid = f"tid-{topic}"
    _, pid, e = init_producer_id(raw, tid, 5)
    assert send(raw, tid, topic, 0, pid, e, 0, values("a", 1)) == (NONE, 0)
    # the commit decided and durable, its markers not yet written (what EndTxn in two steps leaves)
    assert txn_service.end_txn_prepare(store, tid, pid, e, "commit", 2) is None
    assert send(raw, tid, topic, 1, pid, e, 0, values("b", 1))[0] == CONCURRENT_TRANSACTIONS
    assert end_txn(raw, tid, pid, e, commit=False)[0] == INVALID_TXN_STATE  # a decision is never reversed
    # the client's retry of its commit finds it decided, and completes it
    assert end_txn(raw, tid, pid, e, commit=True) == (NONE, pid, e + 1)
    assert committed_view(store, topic) == {0: values("a", 1), 1: []}


# -- the epoch's edge cases --------------------------------------------------------------------------


def test_the_last_epoch_is_used_once_and_then_a_new_producer_id_is_answered(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    tid = f"tid-{topic}"
    _, pid, _ = init_producer_id(raw, tid, 5)
    set_epoch(store, tid, MAX_EPOCH - 1)
    assert send(raw, tid, topic, 0, pid, MAX_EPOCH - 1, 0, values("a", 1)) == (NONE, 0)
    assert end_txn(raw, tid, pid, MAX_EPOCH - 1, commit=True) == (NONE, pid, MAX_EPOCH)
    assert send(raw, tid, topic, 0, pid, MAX_EPOCH, 0, values("b", 1)) == (NONE, 2)
    code, new_pid, epoch = end_txn(raw, tid, pid, MAX_EPOCH, commit=True)
    assert (code, new_pid != pid, epoch) == (NONE, True, 0)
    # its retry is answered the same; the old producer id writes no more
    assert end_txn(raw, tid, pid, MAX_EPOCH, commit=True) == (NONE, new_pid, 0)
    assert send(raw, tid, topic, 1, pid, MAX_EPOCH, 1, values("old", 1))[0] != NONE
    assert send(raw, tid, topic, 0, new_pid, 0, 0, values("c", 1)) == (NONE, 4)
    assert end_txn(raw, tid, new_pid, 0, commit=True) == (NONE, new_pid, 1)
    assert committed_view(store, topic) == {0: values("a", 1) + values("b", 1) + values("c", 1), 1: []}


def test_init_producer_id_during_a_v2_transaction_aborts_it_and_raises_the_epoch_once(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    tid = f"tid-{topic}"
    _, pid, e = init_producer_id(raw, tid, 5)
    assert send(raw, tid, topic, 0, pid, e, 0, values("open", 2)) == (NONE, 0)
    assert init_producer_id(raw, tid, 5, pid, e) == (NONE, pid, e + 1)
    assert aborted_flags(store, topic) == [(b"open-0", True), (b"open-1", True), (None, True)]
    assert decisions(store, tid) == [("PrepareAbort", 2), ("CompleteAbort", 2)]
    # the aborted transaction's producer is fenced; the new epoch writes
    assert end_txn(raw, tid, pid, e, commit=True)[0] == PRODUCER_FENCED
    assert send(raw, tid, topic, 0, pid, e + 1, 0, values("after", 1)) == (NONE, 3)
    assert end_txn(raw, tid, pid, e + 1, commit=True) == (NONE, pid, e + 2)
    assert committed_view(store, topic)[0] == values("after", 1)


def test_a_v2_commit_with_no_records_ends_an_empty_transaction_with_the_next_epoch(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    tid = f"tid-{topic}"
    _, pid, e = init_producer_id(raw, tid, 5)
    assert end_txn(raw, tid, pid, e, commit=True) == (NONE, pid, e + 1)
    assert end_txn(raw, tid, pid, e, commit=True) == (NONE, pid, e + 1)  # its retry
    assert end_txn(raw, tid, pid, e + 1, commit=False) == (NONE, pid, e + 2)
    assert committed_view(store, topic) == {0: [], 1: []}


# -- the first protocol's clients on the same gateway ---------------------------------------------


def test_a_partition_or_group_missing_from_a_v1_transaction_is_transaction_abortable_to_the_versions_that_know_it(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    tid, group = f"tid-{topic}", f"group-{topic}"
    _, pid, e = init_producer_id(raw, tid, 4)
    assert add_partitions(raw, tid, pid, e, topic, 0) == [NONE]
    stray = batch(pid, e, 0, values("stray", 1), transactional=True)
    assert produce(raw, topic, 1, stray, tid, version=11)[0] == TRANSACTION_ABORTABLE
    assert produce(raw, topic, 1, stray, tid, version=10)[0] == INVALID_TXN_STATE
    assert txn_offset_commit(raw, 4, tid, pid, e, group, topic, 3) == TRANSACTION_ABORTABLE
    assert txn_offset_commit(raw, 3, tid, pid, e, group, topic, 3) == INVALID_TXN_STATE
    # the added partition is written at v11 as at any version, and the epoch is kept (EndTxn v4)
    assert produce(raw, topic, 0, batch(pid, e, 0, values("in", 1), transactional=True), tid, version=11) == (NONE, 0)
    answer = raw.request(ApiKey.EndTxn, 4, {"transactional_id": tid, "producer_id": pid, "producer_epoch": e, "committed": True})
    assert answer.error_code == NONE
    assert txn_service.describe(store, tid).producer_epoch == e
    assert decisions(store, tid) == [("PrepareCommit", 1), ("CompleteCommit", 1)]
    assert committed_view(store, topic) == {0: values("in", 1), 1: []}


# -- the version a transaction runs in --------------------------------------------------------------


def joins(store: Broker, tid: str) -> list[tuple[tuple[tuple[str, int], ...], tuple[str, ...], int]]:
    """(partitions added, groups added, transaction version) of each event that added to a
    transaction of ``tid``."""
    return [
        (e.partitions_added, e.groups_added, e.transaction_version)
        for e in txn_service.events(store, tid)
        if e.to_state is TxnState.ONGOING
    ]


def add_offsets(raw: RawConnection, tid: str, pid: int, epoch: int, group: str) -> int:
    body = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "group_id": group}
    return raw.request(ApiKey.AddOffsetsToTxn, 3, body).error_code


def test_the_version_a_transaction_runs_in_is_recorded_when_it_starts_and_with_each_join(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    """Produce v12 and TxnOffsetCommit v5 add in V2, AddPartitionsToTxn and AddOffsetsToTxn in V1,
    each recorded with the event that adds, from the transaction's start, not only with its end."""
    tid, group = f"tid-{topic}", f"group-{topic}"
    _, pid, e = init_producer_id(raw, tid, 5)
    assert send(raw, tid, topic, 0, pid, e, 0, values("a", 1)) == (NONE, 0)
    assert txn_offset_commit(raw, 5, tid, pid, e, group, topic, 1) == NONE
    assert joins(store, tid) == [(((topic, 0),), (), 2), ((), (group,), 2)]
    assert txn_service.describe(store, tid).transaction_version == 2
    assert end_txn(raw, tid, pid, e, commit=True) == (NONE, pid, e + 1)
    # the same producer's next transaction in the first protocol: V1 from its start
    e += 1
    assert add_partitions(raw, tid, pid, e, topic, 1) == [NONE]
    assert txn_service.describe(store, tid).transaction_version == 1
    assert add_offsets(raw, tid, pid, e, group) == NONE
    assert produce(raw, topic, 1, batch(pid, e, 0, values("b", 1), transactional=True), tid, version=11) == (NONE, 0)
    assert txn_offset_commit(raw, 4, tid, pid, e, group, topic, 2) == NONE
    assert joins(store, tid)[2:] == [(((topic, 1),), (), 1), ((), (group,), 1)]  # the batch and commit add nothing
    answer = raw.request(ApiKey.EndTxn, 4, {"transactional_id": tid, "producer_id": pid, "producer_epoch": e, "committed": True})
    assert answer.error_code == NONE
    assert decisions(store, tid)[-2:] == [("PrepareCommit", 1), ("CompleteCommit", 1)]
    assert txn_service.describe(store, tid).producer_epoch == e
    assert committed_view(store, topic) == {0: values("a", 1), 1: values("b", 1)}
    assert group_offsets(store, group, topic)[0] == 2


def test_a_request_of_one_protocol_joining_a_transaction_of_the_other_is_served_as_kafka_4_serves_it(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    """Kafka's coordinator (4.x) refuses neither: the transaction takes the version of the latest
    request that added something to it (one that adds nothing changes nothing), and the EndTxn that
    ends it decides with its own, keeping or moving the producer's epoch on."""
    tid = f"tid-{topic}"
    _, pid, e = init_producer_id(raw, tid, 5)
    # V1 joining V2: a Produce v12 starts the transaction, AddPartitionsToTxn adds another partition
    assert send(raw, tid, topic, 0, pid, e, 0, values("a", 1)) == (NONE, 0)
    assert add_partitions(raw, tid, pid, e, topic, 1) == [NONE]
    assert add_partitions(raw, tid, pid, e, topic, 0, 1) == [NONE, NONE]  # in already: nothing recorded
    assert joins(store, tid) == [(((topic, 0),), (), 2), (((topic, 1),), (), 1)]
    assert txn_service.describe(store, tid).transaction_version == 1
    assert end_txn(raw, tid, pid, e, commit=True) == (NONE, pid, e + 1)  # EndTxn v5: V2's end
    assert decisions(store, tid) == [("PrepareCommit", 2), ("CompleteCommit", 2)]
    # V2 joining V1: AddPartitionsToTxn starts it, a Produce v12 adds another partition
    e += 1
    assert add_partitions(raw, tid, pid, e, topic, 0) == [NONE]
    assert send(raw, tid, topic, 1, pid, e, 0, values("b", 1)) == (NONE, 1)  # after the first one's marker
    assert send(raw, tid, topic, 0, pid, e, 0, values("c", 1)) == (NONE, 2)  # in already: nothing recorded
    assert joins(store, tid)[2:] == [(((topic, 0),), (), 1), (((topic, 1),), (), 2)]
    assert txn_service.describe(store, tid).transaction_version == 2
    answer = raw.request(ApiKey.EndTxn, 4, {"transactional_id": tid, "producer_id": pid, "producer_epoch": e, "committed": True})
    assert answer.error_code == NONE  # EndTxn v4: the first protocol's end, the epoch kept
    assert decisions(store, tid)[-2:] == [("PrepareCommit", 1), ("CompleteCommit", 1)]
    assert txn_service.describe(store, tid).producer_epoch == e
    assert committed_view(store, topic) == {0: values("a", 1) + values("c", 1), 1: values("b", 1)}
