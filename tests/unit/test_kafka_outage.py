"""The Kafka gateway's answers while the database is away, as plain rules: which code each API
answers (``api.kafka.handlers.error_code``) and the topics Metadata remembers
(``bootstrap.KnownTopics``)."""

from __future__ import annotations

import uuid

import pytest

from api.kafka.handlers import error_code
from api.kafka.handlers.bootstrap import KnownTopics
from api.kafka.versions import BY_KEY
from app.domain.log import TopicMetadata
from app.errors import DatabaseUnavailable, ErrorCode, TxlogError
from app.wire.kafka.messages import ApiKey

AWAY = DatabaseUnavailable("Database unavailable: connection refused")
SLOW = TxlogError(ErrorCode.REQUEST_TIMED_OUT, "The database did not answer in time")


@pytest.mark.parametrize(
    ("api", "away", "slow"),
    [
        (ApiKey.Produce, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.REQUEST_TIMED_OUT),  # a timed-out append may be in
        (ApiKey.Fetch, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.KAFKA_STORAGE_ERROR),
        (ApiKey.ListOffsets, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.KAFKA_STORAGE_ERROR),
        (ApiKey.DeleteRecords, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.KAFKA_STORAGE_ERROR),
        (ApiKey.DescribeLogDirs, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.KAFKA_STORAGE_ERROR),
        (ApiKey.OffsetForLeaderEpoch, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.KAFKA_STORAGE_ERROR),
        (ApiKey.OffsetFetch, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        (ApiKey.DescribeGroups, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        (ApiKey.ListGroups, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        (ApiKey.OffsetCommit, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ApiKey.InitProducerId, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ApiKey.AddPartitionsToTxn, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ApiKey.AddOffsetsToTxn, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ApiKey.TxnOffsetCommit, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ApiKey.EndTxn, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ApiKey.CreateTopics, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.REQUEST_TIMED_OUT),
        (ApiKey.ListTransactions, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        (ApiKey.DescribeTransactions, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        (ApiKey.DescribeProducers, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.KAFKA_STORAGE_ERROR),
        (ApiKey.WriteTxnMarkers, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.KAFKA_STORAGE_ERROR),
    ],
)
def test_each_api_names_the_database_away_or_too_slow_as_a_broker_does(api: int, away: ErrorCode, slow: ErrorCode) -> None:
    assert (error_code(api, AWAY), error_code(api, SLOW)) == (away, slow)
    assert away.retriable and slow.retriable


def test_every_served_api_answers_a_retriable_error_and_other_errors_pass_unchanged() -> None:
    for api in BY_KEY:
        assert error_code(api, AWAY).retriable
        assert error_code(api, TxlogError(ErrorCode.INVALID_REQUEST)) is ErrorCode.INVALID_REQUEST
        assert error_code(api, TxlogError(ErrorCode.PRODUCER_FENCED)) is ErrorCode.PRODUCER_FENCED


def _topic(name: str, partitions: int = 1) -> TopicMetadata:
    return TopicMetadata(name, partitions, uuid.uuid4())


def test_known_topics_follow_each_reading() -> None:
    known = KnownTopics()
    a, b, c = _topic("a"), _topic("b", 3), _topic("c")
    known.remember([a, b], None)  # every topic
    assert known.all() == [a, b] and known.get(None, b.topic_id) == b
    grown = TopicMetadata("b", 6, b.topic_id)
    known.remember([grown, c], ["b", "c", "a"])  # asked by name: a is gone, b grew, c is new
    assert known.all() == [grown, c] and known.get("a") is None
    known.remember([c], None)  # a full listing forgets what it does not list
    assert known.all() == [c] and known.get("b") is None and known.get(None, uuid.uuid4()) is None
