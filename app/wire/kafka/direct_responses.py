"""The hot answers, written directly.

The answer to every batch a producer sends (ProduceResponse v3-10) and to every fetch of a
consumer (FetchResponse v4-12) is written here field by field, as Kafka's schemas lay them out,
rather than through the generic struct (``structs.build``): that costs a producer's batch about
20 µs more, and a fetch of 1 MiB of records about 90 µs more (with the gateway's memory settings,
``app.memory``), copying the records several times where this copies them once. These writers
take the fields their handlers answer with (``api.kafka.handlers.produce``, ``.fetch``), a field
left out taking the schema's default as in ``build``; anything else (a field they do not know)
takes the generic path. tests/kafka/test_protocol.py checks them byte for byte against
kafka-python's codec.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Mapping, Sequence

from app.wire.kafka.messages import ApiKey
from app.wire.kafka.requests import RequestHeader

__all__ = ["direct_response", "uvarint"]

_INT32 = struct.Struct(">i")

_PRODUCE_PARTITION = frozenset(("index", "error_code", "base_offset", "log_append_time_ms", "log_start_offset", "error_message"))
_FETCH_PARTITION = frozenset(
    (
        "partition_index",
        "error_code",
        "high_watermark",
        "last_stable_offset",
        "log_start_offset",
        "aborted_transactions",
        "preferred_read_replica",
        "records",
    )
)
_I16_I64_I64, _I64, _I16_I32 = struct.Struct(">hqq"), struct.Struct(">q"), struct.Struct(">hi")
_I32_I16_I64_I64, _I64_I64 = struct.Struct(">ihqq"), struct.Struct(">qq")


def direct_response(header: RequestHeader, body: Mapping[str, Any]) -> bytearray | None:
    """The framed answer written directly, or None for the generic path."""
    served = _DIRECT.get(header.api_key)
    if served is None:
        return None
    first, last, flexible_from, write = served
    version = header.api_version
    if not first <= version <= last:
        return None
    flexible = version >= flexible_from
    out = bytearray(4)
    out += _INT32.pack(header.correlation_id)
    if flexible:
        out.append(0)  # the response header's tagged fields
    if not write(out, version, flexible, body):
        return None
    _INT32.pack_into(out, 0, len(out) - 4)
    return out


def _produce_body(out: bytearray, version: int, flexible: bool, body: Mapping[str, Any]) -> bool:
    if body.keys() - {"responses", "throttle_time_ms"}:
        return False

    def partition(part: Mapping[str, Any]) -> bool:
        if part.keys() - _PRODUCE_PARTITION:
            return False
        out.extend(_INT32.pack(part.get("index", 0)))
        out.extend(_I16_I64_I64.pack(part.get("error_code", 0), part.get("base_offset", 0), part.get("log_append_time_ms", -1)))
        if version >= 5:
            out.extend(_I64.pack(part.get("log_start_offset", -1)))
        if version >= 8:
            _array_length(out, 0, flexible)  # record_errors
            _string(out, part.get("error_message"), flexible)
        return True  # (tagged fields: no current_leader)

    if not _topics(out, body.get("responses", ()), "name", "partition_responses", flexible, partition):
        return False
    out += _INT32.pack(body.get("throttle_time_ms", 0))
    if flexible:
        out.append(0)  # tagged fields: no node_endpoints
    return True


def _fetch_body(out: bytearray, version: int, flexible: bool, body: Mapping[str, Any]) -> bool:
    if body.keys() - {"throttle_time_ms", "error_code", "session_id", "responses"}:
        return False
    out += _INT32.pack(body.get("throttle_time_ms", 0))
    if version >= 7:
        out += _I16_I32.pack(body.get("error_code", 0), body.get("session_id", 0))

    def partition(part: Mapping[str, Any]) -> bool:
        if part.keys() - _FETCH_PARTITION:
            return False
        out.extend(
            _I32_I16_I64_I64.pack(
                part.get("partition_index", 0),
                part.get("error_code", 0),
                part.get("high_watermark", 0),
                part.get("last_stable_offset", -1),
            )
        )
        if version >= 5:
            out.extend(_I64.pack(part.get("log_start_offset", -1)))
        aborted = part.get("aborted_transactions", ())
        if aborted is None:
            _array_length(out, -1, flexible)
        else:
            _array_length(out, len(aborted), flexible)
            for entry in aborted:
                if entry.keys() - {"producer_id", "first_offset"}:
                    return False
                out.extend(_I64_I64.pack(entry.get("producer_id", 0), entry.get("first_offset", 0)))
                if flexible:
                    out.append(0)
        if version >= 11:
            out.extend(_INT32.pack(part.get("preferred_read_replica", -1)))
        records = part.get("records", b"")
        if records is None:
            _array_length(out, -1, flexible)
        else:
            _array_length(out, len(records), flexible)
            out.extend(records)
        return True  # (tagged fields: no diverging epoch, current leader or snapshot id)

    if not _topics(out, body.get("responses", ()), "topic", "partitions", flexible, partition):
        return False
    if flexible:
        out.append(0)
    return True


def _topics(
    out: bytearray,
    topics: Sequence[Mapping[str, Any]],
    name: str,
    partitions: str,
    flexible: bool,
    partition: Callable[[Mapping[str, Any]], bool],
) -> bool:
    """A response's array of topics, each its name and its array of partition answers, each of
    those written by ``partition`` (False: a field it does not write, for the generic path)."""
    _array_length(out, len(topics), flexible)
    for topic in topics:
        if topic.keys() - {name, partitions}:
            return False
        _string(out, topic.get(name, ""), flexible)
        parts = topic.get(partitions, ())
        _array_length(out, len(parts), flexible)
        for part in parts:
            if not partition(part):
                return False
            if flexible:
                out.append(0)  # the partition's tagged fields
        if flexible:
            out.append(0)  # the topic's
    return True


# api key: (first version, last version, first flexible version, writer of the body)
_DIRECT = {ApiKey.Produce: (3, 10, 9, _produce_body), ApiKey.Fetch: (4, 12, 12, _fetch_body)}


def _array_length(out: bytearray, n: int, flexible: bool) -> None:
    """An array's (or bytes') length; -1: null."""
    if flexible:
        out += uvarint(n + 1)
    else:
        out += _INT32.pack(n)


def _string(out: bytearray, value: str | None, flexible: bool) -> None:
    if value is None:
        if flexible:
            out.append(0)
        else:
            out += b"\xff\xff"
        return
    data = value.encode()
    if flexible:
        out += uvarint(len(data) + 1)
    else:
        out += len(data).to_bytes(2, "big")
    out += data


def uvarint(n: int) -> bytes:
    """Kafka's unsigned varint of ``n`` >= 0 (compact lengths, tagged fields; zigzagged in records)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
