"""OffsetFetch as Kafka answers it, partition by partition, through the services on a real
PostgreSQL: UNSTABLE_OFFSET_COMMIT only on the partitions a transaction has an offset pending for
(KIP-447's require_stable), the others answered; partitions without an offset; metadata as
committed; the HTTP API's group-wide answer unchanged."""

from __future__ import annotations

import pytest

from app.domain.groups.offsets import GroupOffset
from app.errors import ErrorCode
from app.services import groups, topics
from app.services.groups import FetchedOffset
from tests.integration.test_transactions import Producer, error_of


@pytest.fixture
def topic(broker) -> str:  # type: ignore[no-untyped-def]
    topics.create_topic(broker, "g", 3)
    return "g"


def answers(fetched: list[FetchedOffset]) -> list[tuple]:
    return [(f.topic, f.partition, f.offset, f.metadata, f.error.code if f.error else None) for f in fetched]


def test_require_stable_marks_only_the_partitions_with_a_pending_offset(broker, topic):
    groups.offset_commit(broker, "c", [GroupOffset(topic, 0, 5, "zero"), GroupOffset(topic, 1, 6, "one")])
    p = Producer(broker, "copier")
    p.commit_offsets("c", (topic, 1, 60), (topic, 2, 70))  # pending: partition 1 (committed too) and 2 (only pending)
    asked = [(topic, 0), (topic, 1), (topic, 2), ("other", 0)]
    unstable = ErrorCode.UNSTABLE_OFFSET_COMMIT
    assert answers(groups.offset_fetch_partitions(broker, "c", asked, require_stable=True)) == [
        (topic, 0, 5, "zero", None),
        (topic, 1, 6, "one", unstable),
        (topic, 2, None, "", unstable),
        ("other", 0, None, "", None),
    ]
    assert answers(groups.offset_fetch_partitions(broker, "c", asked)) == [
        (topic, 0, 5, "zero", None),
        (topic, 1, 6, "one", None),
        (topic, 2, None, "", None),
        ("other", 0, None, "", None),
    ]
    # every partition of the group: the pending-only one shows only when asked stable
    assert answers(groups.offset_fetch_partitions(broker, "c", None, require_stable=True)) == [
        (topic, 0, 5, "zero", None),
        (topic, 1, 6, "one", unstable),
        (topic, 2, None, "", unstable),
    ]
    assert answers(groups.offset_fetch_partitions(broker, "c")) == [(topic, 0, 5, "zero", None), (topic, 1, 6, "one", None)]
    err = groups.offset_fetch_partitions(broker, "c", [(topic, 1)], require_stable=True)[0].error
    assert err is not None and err.code.retriable and f"{topic}-1" in err.message

    p.commit()
    assert answers(groups.offset_fetch_partitions(broker, "c", asked, require_stable=True)) == [
        (topic, 0, 5, "zero", None),
        (topic, 1, 60, "", None),
        (topic, 2, 70, "", None),
        ("other", 0, None, "", None),
    ]


def test_the_http_answer_stays_group_wide(broker, topic):
    groups.offset_commit(broker, "c", [GroupOffset(topic, 0, 5, "")])
    p = Producer(broker, "copier")
    p.commit_offsets("c", (topic, 2, 1), (topic, 1, 1))
    err = error_of(groups.offset_fetch, broker, "c", True)
    assert err.code is ErrorCode.UNSTABLE_OFFSET_COMMIT
    assert err.message == f"Group 'c' has offsets pending in open transactions for {topic}-1, {topic}-2; retry"
    assert groups.offset_fetch(broker, "c") == [GroupOffset(topic, 0, 5, "")]
    p.abort()
    assert groups.offset_fetch(broker, "c", True) == [GroupOffset(topic, 0, 5, "")]


def test_metadata_comes_back_as_committed(broker, topic):
    kept = ["", "plain", "ünïcödé ✓", "x" * 4096, '{"json": [1, 2]}', "line\nbreak\ttab"]
    offsets = [GroupOffset(topic, i % 3, i, m) for i, m in enumerate(kept)]
    for o in offsets:
        groups.offset_commit(broker, "meta", [o])
        [got] = groups.offset_fetch_partitions(broker, "meta", [(o.topic, o.partition)])
        assert (got.offset, got.metadata) == (o.offset, o.metadata)
    p = Producer(broker, "copier")
    p.commit_offsets("meta", (topic, 0, 99))
    p.commit()
    assert groups.offset_fetch_partitions(broker, "meta", [(topic, 0)])[0].offset == 99
    assert error_of(groups.offset_fetch_partitions, broker, "").code is ErrorCode.INVALID_REQUEST


def test_metadata_longer_than_the_setting_commits_nothing(db_url):  # type: ignore[no-untyped-def]
    """TXLOG_OFFSET_METADATA_MAX_BYTES (offset.metadata.max.bytes): nothing of the commit is
    kept, the partitions too long are named, and the HTTP answer is 413."""
    from app.services import transactions
    from tests.conftest import make_broker

    topic_name = "meta-limit"
    b = make_broker(db_url, offset_metadata_max_bytes=8)
    try:
        topics.create_topic(b, topic_name, 2)
        long = [GroupOffset(topic_name, 0, 1, "12345678"), GroupOffset(topic_name, 1, 1, "123456789")]
        err = error_of(groups.offset_commit, b, "limited", long)
        assert err.code is ErrorCode.OFFSET_METADATA_TOO_LARGE and err.details["partitions"] == [(topic_name, 1)]
        assert err.code.value.http_status == 413
        assert answers(groups.offset_fetch_partitions(b, "limited", [(topic_name, 0)])) == [(topic_name, 0, None, "", None)]
        got = transactions.init_producer_id(b, "limited-tx")
        err = error_of(transactions.txn_offset_commit, b, "limited-tx", got.producer_id, got.producer_epoch, "limited", long)
        assert err.code is ErrorCode.OFFSET_METADATA_TOO_LARGE
        groups.offset_commit(b, "limited", long[:1])  # at the limit: kept
        assert answers(groups.offset_fetch_partitions(b, "limited", [(topic_name, 0)])) == [(topic_name, 0, 1, "12345678", None)]
    finally:
        b.db.dispose()
