"""Request and response bodies of the v1 API (validation only; no rules live here)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.domain.producer_state import MAX_EPOCH
from app.domain.records import MAX_STRING_LENGTH, TOPIC_NAME
from app.domain.transactions import MAX_TRANSACTIONAL_ID_LENGTH, Result
from app.errors import ErrorCode

INT32 = 2**31 - 1
INT64 = 2**63 - 1
# A produce body's bounds (``codec`` reads bodies by them too, without the models).
MAX_TIMESTAMP_MS = 253402300799999  # 9999-12-31T23:59:59.999Z
MAX_BODY_RECORDS = 100_000


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TopicCreate(Model):
    # The pattern is documented, not enforced here: a name off it is INVALID_TOPIC_EXCEPTION (400).
    name: str = Field(max_length=1000, json_schema_extra={"pattern": TOPIC_NAME.pattern})
    partitions: int = Field(1, ge=-INT32, le=INT32)
    config: dict = Field(default_factory=dict)


class TopicInfo(Model):
    name: str
    partitions: int


class PartitionInfo(Model):
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


class TopicDescription(Model):
    name: str
    partitions: list[PartitionInfo]
    config: dict = Field(default_factory=dict)


class TopicAlter(Model):
    config: dict = Field(max_length=1000)


class PartitionsCreate(Model):
    count: int = Field(ge=1)  # the partition count wanted, above the current one
    validate_only: bool = False


class TopicPartitionCount(Model):
    name: str
    partitions: int


class TopicConfigInfo(Model):
    name: str
    config: dict


class TopicDeleted(Model):
    name: str
    topic_id: str
    aborted_transactions: list[str]  # transactional ids whose open transaction wrote to the topic
    records_pending: bool  # its records are still being deleted: the name cannot be created again yet


class DeleteRecordsBody(Model):
    before_offset: int = Field(ge=-1, le=INT64)


class GroupDeleted(Model):
    group_id: str
    deleted: bool


class DeleteRecordsResponse(Model):
    topic: str
    partition: int
    log_start_offset: int


class HeaderIn(Model):
    key: str = Field(max_length=MAX_STRING_LENGTH)
    value: str | None = None  # follows the request's encoding


class RecordIn(Model):
    key: str | None = None
    value: str | None = None
    # Kafka's headers: an ordered list of {"key", "value"} (keys may repeat, values follow
    # ``encoding``, null allowed), or an object {"key": "text value"} for the simple case.
    headers: list[HeaderIn] | dict[str, str | None] | None = None
    timestamp_ms: int | None = Field(None, ge=0, le=MAX_TIMESTAMP_MS)


class ProduceBody(Model):
    producer_id: int | None = Field(None, ge=0, le=INT64)
    producer_epoch: int | None = Field(None, ge=0, le=MAX_EPOCH)
    base_sequence: int | None = Field(None, ge=0, le=INT32)
    transactional_id: str | None = Field(None, min_length=1, max_length=MAX_TRANSACTIONAL_ID_LENGTH)
    encoding: Literal["utf8", "base64"] = "utf8"
    records: list[RecordIn] = Field(min_length=1, max_length=MAX_BODY_RECORDS)
    commit: bool = Field(
        False,
        description="With a transactional_id: commit the transaction with this batch, as an EndTxn "
        "with result commit right after it would, in one request (the answer adds `transaction`).",
    )


class PlainProduceBody(Model):
    encoding: Literal["utf8", "base64"] = "utf8"
    records: list[RecordIn] = Field(min_length=1, max_length=MAX_BODY_RECORDS)


class EndTxnResponse(Model):
    state: str
    producer_id: int
    producer_epoch: int


class ProduceResponse(Model):
    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool = False
    partition: int | None = None
    transaction: EndTxnResponse | None = None  # a produce that commits its transaction: the end's answer


class InitProducerBody(Model):
    transactional_id: str | None = Field(None, min_length=1, max_length=MAX_TRANSACTIONAL_ID_LENGTH)
    transaction_timeout_ms: int | None = Field(None, ge=-INT32, le=INT32)


class ProducerIdAndEpoch(Model):
    producer_id: int
    producer_epoch: int


class TopicPartitionIn(Model):
    topic: str = Field(max_length=1000)
    partition: int = Field(ge=0, le=INT32)


class TxnProducer(Model):
    producer_id: int = Field(ge=0, le=INT64)
    producer_epoch: int = Field(ge=0, le=MAX_EPOCH)


class AddPartitionsBody(TxnProducer):
    partitions: list[TopicPartitionIn] = Field(min_length=1, max_length=10_000)


class OffsetIn(Model):
    topic: str = Field(max_length=1000)
    partition: int = Field(ge=0, le=INT32)
    offset: int = Field(ge=0, le=INT64)
    metadata: str | None = Field("", max_length=4096)


class TxnOffsetsBody(TxnProducer):
    group_id: str = Field(min_length=1, max_length=1000)
    offsets: list[OffsetIn] = Field(max_length=10_000)


class EndTxnBody(TxnProducer):
    result: Literal["commit", "abort"]


class GroupOffsetsBody(Model):
    offsets: list[OffsetIn] = Field(max_length=10_000)


class TopicList(Model):
    topics: list[TopicInfo]


class HeaderOut(Model):
    key: str
    value: str | None  # in the request's encoding


class FetchedRecord(Model):
    offset: int
    key: str | None
    value: str | None
    headers: dict[str, str | None]  # the last value of each key, as text
    header_list: list[HeaderOut]  # exact: every header in order
    timestamp_ms: int


class FetchResponse(Model):
    topic: str
    partition: int
    records: list[FetchedRecord]
    next_offset: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


class GroupOffsetOut(Model):
    topic: str
    partition: int
    offset: int
    metadata: str


class GroupOffsets(Model):
    offsets: list[GroupOffsetOut]


class TopicPartitionOut(Model):
    topic: str
    partition: int


class TxnDescription(Model):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    started_at_ms: int | None
    updated_at_ms: int
    partitions: list[TopicPartitionOut]
    groups: list[str]
    coordinator: int
    last_producer_id: int | None
    last_producer_epoch: int | None
    last_result: Result | None
    fence_reason: str | None


class TxnList(Model):
    transactions: list[TxnDescription]


class TxnEventOut(Model):
    version: int
    from_state: str | None
    to_state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    at_ms: int
    partitions_added: list[TopicPartitionOut]
    groups_added: list[str]
    result: Result | None
    reason: str | None


class TxnEvents(Model):
    transactional_id: str
    events: list[TxnEventOut]
    next_before_version: int | None


class ErrorDetail(BaseModel):
    """A Kafka-named error. Some codes add fields, e.g. ``reason`` of PRODUCER_FENCED."""

    model_config = ConfigDict(extra="allow")

    code: str = Field(json_schema_extra={"enum": [c.name for c in ErrorCode]})
    kafka_code: int
    message: str
    retriable: bool


class ErrorResponse(Model):
    error: ErrorDetail


# --- operator reads: consumer groups with lag, open and hanging transactions -----------------------


class GroupSummaryOut(Model):
    group_id: str
    partitions: int
    lag: int
    last_commit_ms: int | None
    pending_offsets: int
    pending_transactions: int


class GroupList(Model):
    groups: list[GroupSummaryOut]


class GroupPartitionOut(Model):
    topic: str
    partition: int
    offset: int
    metadata: str
    committed_at_ms: int
    log_start_offset: int | None
    high_watermark: int | None
    last_stable_offset: int | None
    lag: int | None


class PendingGroupOffsetOut(Model):
    topic: str
    partition: int
    offset: int
    metadata: str
    transactional_id: str
    producer_id: int
    producer_epoch: int


class GroupDescription(Model):
    group_id: str
    lag: int
    offsets: list[GroupPartitionOut]
    pending_offsets: list[PendingGroupOffsetOut]


class OpenTransactionOut(Model):
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int
    last_timestamp_ms: int
    transactional_id: str | None
    coordinator_state: str | None
    started_at_ms: int | None
    duration_ms: int
    hanging: list[str]


class OpenTransactions(Model):
    max_transaction_timeout_ms: int
    open_transactions: list[OpenTransactionOut]


class ProducerOut(Model):
    producer_id: int
    producer_epoch: int
    last_sequence: int | None  # null: no batch at this epoch
    last_timestamp_ms: int
    current_txn_start_offset: int | None  # null: no open transaction on the partition


class PartitionProducers(Model):
    topic: str
    partition: int
    producers: list[ProducerOut]


class PartitionAbortBody(Model):
    producer_id: int | None = Field(None, ge=0, le=INT64)
    start_offset: int | None = Field(None, ge=0, le=INT64)


class PartitionAbortResponse(Model):
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int
    transactional_id: str | None
    marker_offset: int | None
    transaction: TxnDescription | None
