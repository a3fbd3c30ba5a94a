"""A topic-partition given more than once in one OffsetCommit or TxnOffsetCommit: the last entry
wins, as in Kafka, and the answer is what was stored."""

from __future__ import annotations

from app.domain.groups.offsets import GroupOffset
from app.services import groups, topics, transactions


def test_offset_commit_keeps_the_last_offset_of_a_repeated_partition(broker):
    topics.create_topic(broker, "a", 2)
    given = [GroupOffset("a", 0, 5, "first"), GroupOffset("a", 1, 2, ""), GroupOffset("a", 0, 9, "last")]
    stored = groups.offset_commit(broker, "g", given)
    assert stored == [GroupOffset("a", 0, 9, "last"), GroupOffset("a", 1, 2, "")]
    assert groups.offset_fetch(broker, "g") == stored


def test_offset_commit_of_one_partition_many_times_stores_one_offset(broker):
    topics.create_topic(broker, "a", 1)
    stored = groups.offset_commit(broker, "g", [GroupOffset("a", 0, n, str(n)) for n in range(100)])
    assert stored == [GroupOffset("a", 0, 99, "99")]
    assert groups.offset_fetch(broker, "g") == stored


def test_txn_offset_commit_keeps_the_last_offset_of_a_repeated_partition(broker):
    topics.create_topic(broker, "a", 2)
    groups.offset_commit(broker, "g", [GroupOffset("a", 0, 1, "before")])
    ids = transactions.init_producer_id(broker, "tx")
    given = [GroupOffset("a", 0, 10, "first"), GroupOffset("a", 1, 20, ""), GroupOffset("a", 0, 11, "last")]
    transactions.txn_offset_commit(broker, "tx", ids.producer_id, ids.producer_epoch, "g", given)
    pending = transactions.pending_offsets(broker, "tx")
    assert [(p["partition"], p["offset"], p["metadata"]) for p in pending] == [(0, 11, "last"), (1, 20, "")]
    assert groups.offset_fetch(broker, "g") == [GroupOffset("a", 0, 1, "before")]  # pending until the commit
    transactions.end_txn(broker, "tx", ids.producer_id, ids.producer_epoch, "commit")
    assert groups.offset_fetch(broker, "g", require_stable=True) == [GroupOffset("a", 0, 11, "last"), GroupOffset("a", 1, 20, "")]
