"""The answers written directly (``direct_responses.direct_response``: Produce and Fetch) are, byte for
byte, what kafka-python's generic codec writes for the same answer, in every version written so;
and what they do not write goes to the generic path."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.wire.kafka.direct_responses import direct_response
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.requests import RequestHeader
from app.wire.kafka.structs import decode_response, encode_response, generic_response

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def optional(**fields: st.SearchStrategy) -> st.SearchStrategy:
    """A dict of any of ``fields``: one left out takes the schema's default, as in ``structs.build``."""
    return st.fixed_dictionaries({}, optional=fields)


def topics(name: str, partitions: str, partition: st.SearchStrategy) -> st.SearchStrategy:
    """A response's array of topics, each with its name and its partitions' answers."""
    return st.lists(optional(**{name: st.text(max_size=150), partitions: st.lists(partition, max_size=4)}), max_size=3)


answers = optional(
    responses=topics(
        "name",
        "partition_responses",
        optional(
            index=INT32,
            error_code=INT16,
            base_offset=INT64,
            log_append_time_ms=INT64,
            log_start_offset=INT64,
            # up to 300 characters, some of several bytes: compact lengths of one and two bytes
            error_message=st.none() | st.text(max_size=300),
        ),
    ),
    throttle_time_ms=st.integers(0, 2**31 - 1),
)
fetch_answers = optional(
    responses=topics(
        "topic",
        "partitions",
        optional(
            partition_index=INT32,
            error_code=INT16,
            high_watermark=INT64,
            last_stable_offset=INT64,
            log_start_offset=INT64,
            aborted_transactions=st.none()
            | st.lists(st.fixed_dictionaries({"producer_id": INT64, "first_offset": INT64}), max_size=3),
            preferred_read_replica=INT32,
            # up to 300 bytes: compact lengths of one and two bytes
            records=st.none() | st.binary(max_size=300),
        ),
    ),
    throttle_time_ms=st.integers(0, 2**31 - 1),
    error_code=INT16,
    session_id=INT32,
)


def generic(header: RequestHeader, body: dict[str, Any]) -> bytes:
    return generic_response(header.api_key, header.api_version, header.correlation_id, body)


def check_direct(header: RequestHeader, body: dict[str, Any]) -> Any:
    direct = direct_response(header, body)
    assert direct is not None
    assert direct == generic(header, body) == encode_response(header, body)
    got_id, decoded = decode_response(header.api_key, header.api_version, bytes(direct[4:]))
    assert got_id == header.correlation_id
    return decoded


@settings(max_examples=300, deadline=None)
@given(version=st.integers(3, 10), correlation_id=INT32, body=answers)
def test_the_produce_response_is_kafka_pythons_byte_for_byte(version: int, correlation_id: int, body: dict[str, Any]) -> None:
    decoded = check_direct(RequestHeader(ApiKey.Produce, version, correlation_id, "c"), body)
    assert [t.name for t in decoded.responses] == [t.get("name", "") for t in body.get("responses", [])]


@settings(max_examples=300, deadline=None)
@given(version=st.integers(4, 12), correlation_id=INT32, body=fetch_answers)
def test_the_fetch_response_is_kafka_pythons_byte_for_byte(version: int, correlation_id: int, body: dict[str, Any]) -> None:
    decoded = check_direct(RequestHeader(ApiKey.Fetch, version, correlation_id, "c"), body)
    records = [p.records for t in decoded.responses for p in t.partitions]
    assert records == [p.get("records", b"") for t in body.get("responses", []) for p in t.get("partitions", [])]


def test_a_megabyte_of_records_is_answered_whole() -> None:
    records = bytes(range(256)) * 4096
    body = {"responses": [{"topic": "t", "partitions": [{"partition_index": 0, "records": records}]}]}
    framed = check_direct(RequestHeader(ApiKey.Fetch, 12, 1, "c"), body)
    assert framed.responses[0].partitions[0].records == records


def test_what_they_do_not_write_takes_the_generic_path() -> None:
    header = RequestHeader(ApiKey.Produce, 9, 7, "c")
    part = {
        "index": 0,
        "error_code": 0,
        "base_offset": 5,
        "record_errors": [{"batch_index": 1, "batch_index_error_message": "no"}],
    }
    body = {"responses": [{"name": "t", "partition_responses": [part]}]}
    assert direct_response(header, body) is None
    assert encode_response(header, body) == generic(header, body)
    fetch = RequestHeader(ApiKey.Fetch, 12, 7, "c")
    diverging = {"partition_index": 0, "diverging_epoch": {"epoch": 1, "end_offset": 3}}
    body = {"responses": [{"topic": "t", "partitions": [diverging]}]}
    assert direct_response(fetch, body) is None
    assert encode_response(fetch, body) == generic(fetch, body)
    # below the versions written directly (Produce below v3 is answered with an error)
    for version in (0, 2):
        old = RequestHeader(ApiKey.Produce, version, 7, "c")
        plain = {"responses": [{"name": "t", "partition_responses": [{"index": 0, "error_code": 35}]}]}
        assert direct_response(old, plain) is None
        assert encode_response(old, plain) == generic(old, plain)
