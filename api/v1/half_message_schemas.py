"""Request and response bodies of the half-message and producer-group API (validation only)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from api.v1.schemas import INT32, HeaderIn, HeaderOut, Model


class HalfMessageBody(Model):
    producer_group: str = Field(min_length=1, max_length=249)
    topic: str = Field(max_length=1000)
    partition: int | None = Field(None, ge=0, le=INT32)  # none: the key picks it, as a plain produce
    key: str | None = None
    value: str | None = None
    headers: list[HeaderIn] | dict[str, str | None] | None = None
    encoding: Literal["utf8", "base64"] = "utf8"
    # Chosen by the producer, it makes the send safe to retry (the same message again answers the
    # half message stored first); the server picks one otherwise.
    transaction_id: str | None = Field(None, min_length=1, max_length=128)


class HalfMessageOut(Model):
    transaction_id: str
    producer_group: str
    topic: str
    partition: int
    state: Literal["Prepared", "Committed", "RolledBack"]
    check_count: int
    created_at_ms: int
    next_check_at_ms: int | None
    decided_at_ms: int | None
    decided_by: Literal["producer", "check_back", "max_checks", "delivery_time"] | None
    reason: str | None
    offset: int | None  # where it was appended, once committed


class CheckOut(Model):
    check_no: int
    started_at_ms: int
    finished_at_ms: int | None
    check_url: str | None
    answer: Literal["COMMIT", "ROLLBACK", "UNKNOWN"] | None
    error: str | None
    outcome: str | None


class HalfMessageDetail(HalfMessageOut):
    encoding: Literal["utf8", "base64"]
    key: str | None
    value: str | None
    headers: dict[str, str | None]
    header_list: list[HeaderOut]
    checks: list[CheckOut]


class HalfMessageList(Model):
    half_messages: list[HalfMessageOut]
    next_after: str | None


class ProducerGroupBody(Model):
    check_url: str | None = Field(None, min_length=1, max_length=2048)
    check_interval_ms: int | None = Field(None, ge=1, le=2**63 - 1)
    check_immunity_ms: int | None = Field(None, ge=0, le=2**63 - 1)
    max_checks: int | None = Field(None, ge=1, le=INT32)


class ProducerGroupOut(Model):
    producer_group: str
    check_url: str | None
    check_interval_ms: int
    check_immunity_ms: int
    max_checks: int
    registered: bool
    updated_at_ms: int | None
