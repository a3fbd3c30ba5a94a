"""KIP-664's operator APIs over the wire — ListTransactions v0-2, DescribeTransactions,
DescribeProducers and WriteTxnMarkers v1 as kafka-transactions.sh abort sends it — in raw frames
and through kafka-python's KafkaAdminClient (list_transactions, describe_transactions,
describe_producers, abort_transaction; confluent-kafka's and aiokafka's admin clients have none of
them).

What they show: an open transaction listed and described as Ongoing with its partitions, then
CompleteCommit with none once it commits (as Kafka clears them); every filter of ListTransactions
(Kafka's state names, unknown ones answered back, producer ids, the duration, the transactional id
pattern matched whole, an invalid one refused); a producer's state on a partition after an
idempotent and a transactional produce; the abort of a transaction its coordinator has open (whole,
through the coordinator) and of a hanging one (a marker on its partition), each through the
operator's one abort."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
from sqlalchemy import text

from app.errors import ErrorCode
from app.services import Broker, fetch, topics
from app.wire.kafka.messages import ApiKey
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.kafka.test_transactions import add_partitions, batch, end_txn, init_producer_id, produce
from tests.support import wait_until

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.kafka_code
INVALID_REQUEST = ErrorCode.INVALID_REQUEST.kafka_code
INVALID_PRODUCER_EPOCH = ErrorCode.INVALID_PRODUCER_EPOCH.kafka_code
TRANSACTIONAL_ID_NOT_FOUND = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND.kafka_code
INVALID_REGULAR_EXPRESSION = ErrorCode.INVALID_REGULAR_EXPRESSION.kafka_code


@pytest.fixture
def topic(store: Broker) -> str:
    name = f"adm-{uuid.uuid4().hex[:10]}"
    topics.create_topic(store, name, 2)
    return name


def listed(raw: RawConnection, version: int = 2, **filters: Any) -> tuple[int, list[str], dict[str, tuple[int, str]]]:
    """ListTransactions: (error code, unknown state filters, {transactional id: (producer id, state)})."""
    body = {"state_filters": [], "producer_id_filters": [], "duration_filter": -1, "transactional_id_pattern": None, **filters}
    answer = raw.request(ApiKey.ListTransactions, version, body)
    return (
        answer.error_code,
        list(answer.unknown_state_filters),
        {t.transactional_id: (t.producer_id, t.transaction_state) for t in answer.transaction_states},
    )


def described(raw: RawConnection, *tids: str) -> list[Any]:
    return list(raw.request(ApiKey.DescribeTransactions, 0, {"transactional_ids": list(tids)}).transaction_states)


def producers_of(raw: RawConnection, topic: str, *partitions: int) -> list[Any]:
    answer = raw.request(ApiKey.DescribeProducers, 0, {"topics": [{"name": topic, "partition_indexes": list(partitions)}]})
    assert [t.name for t in answer.topics] == [topic]
    return list(answer.topics[0].partitions)


def abort_marker(raw: RawConnection, topic: str, partition: int, pid: int, epoch: int, commit: bool = False) -> int:
    """WriteTxnMarkers v1 as kafka-transactions.sh abort sends it: one marker, one partition."""
    answer = raw.request(
        ApiKey.WriteTxnMarkers,
        1,
        {
            "markers": [
                {
                    "producer_id": pid,
                    "producer_epoch": epoch,
                    "transaction_result": commit,
                    "coordinator_epoch": -1,
                    "topics": [{"name": topic, "partition_indexes": [partition]}],
                }
            ]
        },
    )
    [marker] = answer.markers
    [result] = marker.topics
    assert (marker.producer_id, result.name, [p.partition_index for p in result.partitions]) == (pid, topic, [partition])
    return result.partitions[0].error_code


def open_transaction(raw: RawConnection, tid: str, topic: str, records: dict[int, int]) -> tuple[int, int]:
    """A transaction of ``tid`` left Ongoing with ``records[p]`` records on each partition p."""
    code, pid, epoch = init_producer_id(raw, tid)
    assert code == NONE
    assert add_partitions(raw, tid, pid, epoch, topic, *records) == [NONE] * len(records)
    for partition, n in records.items():
        assert produce(raw, topic, partition, batch(pid, epoch, 0, [b"t"] * n, transactional=True), tid)[0] == NONE
    return pid, epoch


def last_stable(store: Broker, topic: str, partition: int) -> tuple[int, int]:
    status = fetch.partition_statuses(store, [(topic, partition)])[(topic, partition)]
    return status.last_stable_offset, status.high_watermark


# -- raw frames -------------------------------------------------------------------------------------


def test_an_open_transaction_is_ongoing_with_its_partitions_then_complete_commit(raw: RawConnection, topic: str) -> None:
    tid = f"{topic}-tx"
    assert produce(raw, topic, 0, batch(-1, -1, -1, [b"before"]))[0] == NONE
    pid, epoch = open_transaction(raw, tid, topic, {0: 2, 1: 1})

    assert listed(raw, 0, state_filters=["Ongoing"], producer_id_filters=[pid]) == (NONE, [], {tid: (pid, "Ongoing")})
    [d] = described(raw, tid)
    assert (d.error_code, d.transactional_id, d.transaction_state, d.producer_id, d.producer_epoch, d.transaction_timeout_ms) == (
        NONE,
        tid,
        "Ongoing",
        pid,
        epoch,
        60_000,
    )
    assert d.transaction_start_time_ms > 0
    assert sorted((t.topic, sorted(t.partitions)) for t in d.topics) == [(topic, [0, 1])]
    p0, p1 = producers_of(raw, topic, 0, 1)
    assert [(p.partition_index, p.error_code) for p in (p0, p1)] == [(0, NONE), (1, NONE)]
    [on0] = p0.active_producers
    assert (on0.producer_id, on0.producer_epoch, on0.last_sequence, on0.coordinator_epoch, on0.current_txn_start_offset) == (
        pid,
        epoch,
        1,
        -1,
        1,
    )
    assert on0.last_timestamp > 0
    assert [(p.producer_id, p.current_txn_start_offset) for p in p1.active_producers] == [(pid, 0)]

    assert end_txn(raw, tid, pid, epoch, commit=True) == NONE
    assert listed(raw, 1, producer_id_filters=[pid]) == (NONE, [], {tid: (pid, "CompleteCommit")})
    [after] = described(raw, tid)
    assert (after.error_code, after.transaction_state, after.topics) == (NONE, "CompleteCommit", [])
    assert after.transaction_start_time_ms == d.transaction_start_time_ms  # the last transaction's, kept
    [on0] = producers_of(raw, topic, 0)[0].active_producers
    assert (on0.producer_id, on0.last_sequence, on0.current_txn_start_offset) == (pid, 1, -1)


def test_list_transactions_filters(raw: RawConnection, topic: str) -> None:
    a, b, idle = f"{topic}-a", f"{topic}-b", f"{topic}-idle"
    pid_a, _ = open_transaction(raw, a, topic, {0: 1})
    pid_b, _ = open_transaction(raw, b, topic, {1: 1})
    pid_idle = init_producer_id(raw, idle)[1]
    mine = {a: (pid_a, "Ongoing"), b: (pid_b, "Ongoing"), idle: (pid_idle, "Empty")}

    def of_mine(**filters: Any) -> tuple[int, list[str], dict[str, tuple[int, str]]]:
        code, unknown, found = listed(raw, **filters)
        return code, unknown, {t: v for t, v in found.items() if t in mine}

    assert of_mine() == (NONE, [], mine)
    assert of_mine(state_filters=["Ongoing", "Empty"]) == (NONE, [], mine)
    assert of_mine(state_filters=["Empty"]) == (NONE, [], {idle: mine[idle]})
    # Kafka's state names only: an unknown one is answered back and matches nothing.
    assert of_mine(state_filters=["Ongoing", "Bogus"]) == (NONE, ["Bogus"], {a: mine[a], b: mine[b]})
    assert listed(raw, state_filters=["ongoing"]) == (NONE, ["ongoing"], {})
    assert of_mine(producer_id_filters=[pid_b, pid_idle]) == (NONE, [], {b: mine[b], idle: mine[idle]})
    assert listed(raw, producer_id_filters=[2**62]) == (NONE, [], {})
    # Running longer than the duration: not the open ones yet; a transactional id with no
    # transaction started has Kafka's start time -1 and passes any duration.
    assert of_mine(duration_filter=3_600_000) == (NONE, [], {idle: mine[idle]})
    wait_until(lambda: of_mine(duration_filter=0) == (NONE, [], mine), message="both open for more than 0 ms")
    # The pattern (v2) matches the whole transactional id; an empty one is none.
    assert of_mine(transactional_id_pattern=f"{topic}-[ab]") == (NONE, [], {a: mine[a], b: mine[b]})
    assert of_mine(transactional_id_pattern="a") == (NONE, [], {})
    assert of_mine(transactional_id_pattern=f"{topic}-.*", state_filters=["Empty"]) == (NONE, [], {idle: mine[idle]})
    assert of_mine(transactional_id_pattern="") == (NONE, [], mine)
    assert listed(raw, transactional_id_pattern="(unclosed") == (INVALID_REGULAR_EXPRESSION, [], {})
    # v0 has neither duration nor pattern.
    assert listed(raw, 0, state_filters=["Empty"], producer_id_filters=[pid_idle]) == (NONE, [], {idle: mine[idle]})


def test_describe_transactions_of_unknown_ids(raw: RawConnection, topic: str) -> None:
    known = f"{topic}-known"
    pid = init_producer_id(raw, known)[1]
    unknown, empty, mine = described(raw, f"{topic}-nobody", "", known)
    assert (unknown.transactional_id, unknown.error_code) == (f"{topic}-nobody", TRANSACTIONAL_ID_NOT_FOUND)
    assert (empty.transactional_id, empty.error_code) == ("", INVALID_REQUEST)
    assert [t.error_code for t in described(raw, f"{known}\x00")] == [TRANSACTIONAL_ID_NOT_FOUND]
    assert (mine.error_code, mine.transaction_state, mine.producer_id, mine.transaction_start_time_ms, mine.topics) == (
        NONE,
        "Empty",
        pid,
        -1,
        [],
    )
    assert described(raw) == []


def test_describe_producers_after_an_idempotent_produce(raw: RawConnection, topic: str) -> None:
    assert [p.active_producers for p in producers_of(raw, topic, 0)] == [[]]
    code, pid, epoch = init_producer_id(raw, None)
    assert code == NONE
    assert produce(raw, topic, 1, batch(pid, epoch, 0, [b"x", b"y", b"z"]))[0] == NONE
    assert produce(raw, topic, 1, batch(pid, epoch, 3, [b"w"]))[0] == NONE
    empty, one = producers_of(raw, topic, 0, 1)
    assert (empty.error_code, empty.active_producers) == (NONE, [])
    [p] = one.active_producers
    assert (p.producer_id, p.producer_epoch, p.last_sequence, p.coordinator_epoch, p.current_txn_start_offset) == (
        pid,
        epoch,
        3,
        -1,
        -1,
    )
    # Kafka's answers for partitions it does not have.
    [beyond, negative] = producers_of(raw, topic, 2, -1)
    assert [(b.partition_index, b.error_code) for b in (beyond, negative)] == [
        (2, UNKNOWN_TOPIC_OR_PARTITION),
        (-1, UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert beyond.error_message
    assert [(p.partition_index, p.error_code) for p in producers_of(raw, f"{topic}-none", 0)] == [(0, UNKNOWN_TOPIC_OR_PARTITION)]
    assert [(p.partition_index, p.error_code) for p in producers_of(raw, f"{topic}\x00", 0)] == [(0, UNKNOWN_TOPIC_OR_PARTITION)]


def test_write_txn_markers_aborts_a_transaction_its_coordinator_has_through_the_coordinator(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    tid = f"{topic}-open"
    pid, epoch = open_transaction(raw, tid, topic, {0: 2, 1: 1})
    assert abort_marker(raw, topic, 0, pid, epoch, commit=True) == INVALID_REQUEST  # the coordinator's alone
    assert abort_marker(raw, topic, 0, pid, epoch - 1 if epoch else -1) == INVALID_PRODUCER_EPOCH
    assert abort_marker(raw, f"{topic}-none", 0, pid, epoch) == UNKNOWN_TOPIC_OR_PARTITION
    assert abort_marker(raw, f"{topic}\x00", 0, pid, epoch) == UNKNOWN_TOPIC_OR_PARTITION
    assert abort_marker(raw, topic, 2, pid, epoch) == UNKNOWN_TOPIC_OR_PARTITION
    assert described(raw, tid)[0].transaction_state == "Ongoing"

    assert abort_marker(raw, topic, 0, pid, epoch) == NONE
    # Aborted whole, on both partitions, its producer fenced: never torn.
    [d] = described(raw, tid)
    assert (d.transaction_state, d.topics) == ("CompleteAbort", [])
    assert [last_stable(store, topic, p) for p in (0, 1)] == [(3, 3), (2, 2)]
    assert [[p.current_txn_start_offset for p in part.active_producers] for part in producers_of(raw, topic, 0, 1)] == [
        [-1],
        [-1],
    ]
    late = produce(raw, topic, 1, batch(pid, epoch, 1, [b"late"], transactional=True), tid)[0]
    assert late in (ErrorCode.PRODUCER_FENCED.kafka_code, INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_TXN_STATE.kafka_code)
    # Nothing open any more: Kafka's answer, no error, and nothing written.
    assert abort_marker(raw, topic, 0, pid, epoch) == NONE
    assert last_stable(store, topic, 0) == (3, 3)


def test_write_txn_markers_aborts_a_hanging_transaction_on_its_partition(raw: RawConnection, store: Broker, topic: str) -> None:
    """The shape of KAFKA-9144: the coordinator completed a transaction without its marker on one
    partition, whose last stable offset stays behind; kafka-transactions.sh abort writes it."""
    tid = f"{topic}-lost"
    pid, epoch = open_transaction(raw, tid, topic, {0: 1, 1: 2})
    with store.db.transaction() as conn:  # the coordinator forgets partition 1
        conn.execute(text("DELETE FROM txlog.transaction_partitions WHERE transactional_id = :t AND partition = 1"), {"t": tid})
    assert end_txn(raw, tid, pid, epoch, commit=True) == NONE
    assert last_stable(store, topic, 1) == (0, 2)
    [held] = producers_of(raw, topic, 1)[0].active_producers
    assert (held.producer_id, held.current_txn_start_offset) == (pid, 0)

    assert abort_marker(raw, topic, 1, pid, held.producer_epoch) == NONE
    assert last_stable(store, topic, 1) == (3, 3)
    assert [p.current_txn_start_offset for p in producers_of(raw, topic, 1)[0].active_producers] == [-1]
    assert described(raw, tid)[0].transaction_state == "CompleteCommit"  # the coordinator's transaction is untouched
    assert last_stable(store, topic, 0) == (2, 2)


# -- kafka-python's KafkaAdminClient ----------------------------------------------------------------


@pytest.fixture
def admin(gateway: GatewayProcess) -> Iterator[Any]:
    from kafka.admin import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    try:
        yield client
    finally:
        client.close()


def test_kafka_python_admin_lists_describes_and_aborts(
    admin: Any, raw: RawConnection, gateway: GatewayProcess, store: Broker, topic: str
) -> None:
    from kafka.admin._transactions import AbortTransactionSpec, TransactionState
    from kafka.errors import TransactionalIdNotFoundError
    from kafka.structs import TopicPartition

    tid, idle = f"{topic}-kp", f"{topic}-kp-idle"
    pid, epoch = open_transaction(raw, tid, topic, {0: 2, 1: 1})
    init_producer_id(raw, idle)

    def mine(**filters: Any) -> dict[str, tuple[int, TransactionState]]:
        by_broker = admin.list_transactions(**filters)
        assert list(by_broker) == [gateway.node_id]
        return {
            t.transactional_id: (t.producer_id, t.state)
            for t in by_broker[gateway.node_id]
            if t.transactional_id.startswith(topic)
        }

    assert mine(state_filters=["Ongoing"]) == {tid: (pid, TransactionState.ONGOING)}
    assert mine(producer_id_filters=[pid]) == {tid: (pid, TransactionState.ONGOING)}
    assert set(mine(transactional_id_pattern=f"{topic}-kp(-idle)?")) == {tid, idle}
    assert set(mine(duration_filter_ms=3_600_000)) == {idle}

    d = admin.describe_transactions([tid])[tid]
    assert (d.state, d.producer_id, d.producer_epoch, d.transaction_timeout_ms) == (TransactionState.ONGOING, pid, epoch, 60_000)
    assert d.topic_partitions == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
    with pytest.raises(TransactionalIdNotFoundError):
        admin.describe_transactions([f"{topic}-nobody"])

    states = admin.describe_producers([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    [p0] = states[TopicPartition(topic, 0)].active_producers
    assert (p0.producer_id, p0.producer_epoch, p0.last_sequence, p0.current_transaction_start_offset) == (pid, epoch, 1, 0)

    # kafka-transactions.sh abort: the producer id and epoch DescribeProducers showed.
    admin.abort_transaction(
        AbortTransactionSpec(TopicPartition(topic, 0), p0.producer_id, p0.producer_epoch, p0.coordinator_epoch)
    )
    assert admin.describe_transactions([tid])[tid].state == TransactionState.COMPLETE_ABORT
    assert [last_stable(store, topic, p) for p in (0, 1)] == [(3, 3), (2, 2)]
    after = admin.describe_producers([TopicPartition(topic, 1)])[TopicPartition(topic, 1)].active_producers
    assert [p.current_transaction_start_offset for p in after] == [-1]
