"""Request and response bodies of the share-group API (KIP-932 over HTTP; validation only)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from api.v1.schemas import INT32, INT64, ErrorDetail, HeaderOut, Model


class TopicPartitionIn(Model):
    topic: str = Field(max_length=1000)
    partition: int = Field(ge=0, le=INT32)


class AcquireBody(Model):
    # Chosen by the consumer (Kafka's share consumers make a UUID); the server makes one if none is
    # given and answers it: acknowledge with the same.
    member_id: str | None = Field(None, min_length=1, max_length=255)
    # Either a topic, its partitions taken in turn from a random one (many consumers spread over
    # them), or the partitions themselves, in order.
    topic: str | None = Field(None, max_length=1000)
    partitions: list[TopicPartitionIn] | None = Field(None, min_length=1, max_length=10_000)
    max_records: int = Field(500, ge=1, le=100_000)
    max_bytes: int = Field(1_048_576, ge=1, le=2**31 - 1)  # per partition
    # Long poll: wait up to this long for records when none can be acquired now.
    wait_ms: int = Field(0, ge=0, le=60_000)
    encoding: Literal["utf8", "base64"] = "utf8"
    # Acknowledgements of records acquired before, applied first (Kafka's ShareFetch carries them):
    # one request per round for a consumer that acknowledges and asks for more.
    acknowledgements: list[AcknowledgementIn] | None = Field(None, min_length=1, max_length=100_000)

    @model_validator(mode="after")
    def _one_target(self) -> "AcquireBody":
        if (self.topic is None) == (self.partitions is None):
            raise ValueError("give either topic or partitions")
        return self


class AcquiredRecordOut(Model):
    topic: str
    partition: int
    offset: int
    delivery_count: int  # 1 at the first delivery
    key: str | None
    value: str | None
    headers: dict[str, str | None]
    header_list: list[HeaderOut]
    timestamp_ms: int


class AcquiredRangeOut(Model):
    first_offset: int
    last_offset: int
    delivery_count: int


class SharePartitionFetchOut(Model):
    topic: str
    partition: int
    # Every offset acquired (records, and offsets without one: acknowledge those as gap).
    acquired: list[AcquiredRangeOut]
    start_offset: int | None  # the share-partition start offset (SPSO) after this acquisition
    error: ErrorDetail | None


class AcquireResponse(Model):
    group_id: str
    member_id: str
    records: list[AcquiredRecordOut]
    partitions: list[SharePartitionFetchOut]
    # The outcome of the acknowledgements sent with the acquisition, per partition (absent without).
    acknowledgements: list[SharePartitionAckOut] | None = None


class AcknowledgementIn(Model):
    topic: str = Field(max_length=1000)
    partition: int = Field(ge=0, le=INT32)
    # One record (``offset``) or a range (``first_offset``..``last_offset``, inclusive).
    offset: int | None = Field(None, ge=0, le=INT64)
    first_offset: int | None = Field(None, ge=0, le=INT64)
    last_offset: int | None = Field(None, ge=0, le=INT64)
    # accept: done; release: give it back (redelivered); reject: unprocessable (archived, never
    # redelivered); renew: extend the lock; gap: no record at these offsets.
    type: Literal["accept", "release", "reject", "renew", "gap"]

    @model_validator(mode="after")
    def _offsets(self) -> "AcknowledgementIn":
        single = self.offset is not None
        ranged = self.first_offset is not None and self.last_offset is not None
        if single == ranged or (not ranged and (self.first_offset is not None or self.last_offset is not None)):
            raise ValueError("give either offset, or first_offset and last_offset")
        return self


class AcknowledgeBody(Model):
    member_id: str = Field(min_length=1, max_length=255)
    acknowledgements: list[AcknowledgementIn] = Field(min_length=1, max_length=100_000)


class SharePartitionAckOut(Model):
    topic: str
    partition: int
    accepted: int
    released: int
    archived: int  # rejected, gaps, or released on the last delivery
    renewed: int
    error: ErrorDetail | None


class AcknowledgeResponse(Model):
    group_id: str
    member_id: str
    partitions: list[SharePartitionAckOut]


class ShareGroupList(Model):
    groups: list[str]


class InFlightOut(Model):
    first_offset: int
    last_offset: int
    state: Literal["Available", "Acquired", "Acknowledged", "Archived"]
    member_id: str | None  # the lock holder, while acquired
    lock_deadline_ms: int | None  # epoch ms of the database's clock
    delivery_count: int


class SharePartitionOut(Model):
    topic: str
    partition: int
    start_offset: int  # SPSO: every record below it is done
    end_offset: int  # one past the last offset taken in flight
    state_epoch: int
    records: dict[str, int]  # in-flight records per state
    in_flight: list[InFlightOut]


class ShareGroupOut(Model):
    group_id: str
    configs: dict[str, str]  # every share.* config, defaults included
    partitions: list[SharePartitionOut]


class ShareGroupConfigsBody(Model):
    # Each key given is set, each given as null goes back to its default.
    configs: dict[str, str | None]


class ShareGroupConfigsOut(Model):
    group_id: str
    configs: dict[str, str]


# Bodies that name models defined after them.
AcquireBody.model_rebuild()
AcquireResponse.model_rebuild()
