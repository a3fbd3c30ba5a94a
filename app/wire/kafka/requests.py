"""Requests, as the gateway reads them.

``read_header`` reads the fixed part of a request header (key, version, correlation id, client id:
header v1, and the start of v2, whose ``client_id`` stays a non-compact nullable string);
``decode_request`` decodes the frame into a ``Request`` whose ``body`` is kafka-python's struct,
fields named as in Kafka's JSON schemas in snake_case. A frame that does not decode (short,
truncated, a field running past its end, an unknown key or version) raises ``FrameError``: the
connection is closed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from app.wire.kafka.messages import REQUESTS, api_name, has_codec

__all__ = ["FrameError", "HEADER_MIN_BYTES", "Request", "RequestHeader", "decode_request", "read_header"]

# api_key int16, api_version int16, correlation_id int32, client_id length int16 (-1: null)
_HEADER = struct.Struct(">hhih")
HEADER_MIN_BYTES = _HEADER.size


class FrameError(ValueError):
    """A frame that cannot be read as a request: its connection is closed."""


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True)
class Request:
    header: RequestHeader
    body: Any  # kafka-python's request struct: attributes named as in Kafka's schemas, snake_case


def read_header(frame: bytes | memoryview) -> RequestHeader:
    """The request header's fixed part (enough to answer even a request whose body cannot be read)."""
    header, _ = _read_header(frame)
    return header


def _read_header(frame: bytes | memoryview) -> tuple[RequestHeader, int]:
    if len(frame) < HEADER_MIN_BYTES:
        raise FrameError(f"a request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id, length = _HEADER.unpack_from(frame, 0)
    pos = HEADER_MIN_BYTES
    client_id = None
    if length >= 0:
        if pos + length > len(frame):
            raise FrameError("the client id runs past the end of the request")
        try:
            client_id = bytes(frame[pos : pos + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("the client id is not UTF-8") from None
        pos += length
    elif length != -1:
        raise FrameError(f"client id length {length}")
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def _read_uvarint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 28:
            raise FrameError("a truncated or overlong varint in the request header")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _skip_tagged_fields(data: memoryview, pos: int) -> int:
    """Request header v2's tagged fields: none is defined for requests; skipped."""
    count, pos = _read_uvarint(data, pos)
    for _ in range(count):
        _, pos = _read_uvarint(data, pos)
        size, pos = _read_uvarint(data, pos)
        pos += size
        if pos > len(data):
            raise FrameError("a tagged field runs past the end of the request header")
    return pos


def decode_request(frame: bytes | memoryview) -> Request:
    """The request in ``frame`` (a frame without its size prefix): any failure, a field running past
    the end, or a key or version the codec does not know, is a ``FrameError``."""
    data = memoryview(frame)
    header, pos = _read_header(data)
    if not has_codec(header.api_key, header.api_version):
        raise FrameError(f"no codec for {api_name(header.api_key)} v{header.api_version}")
    cls = REQUESTS[header.api_key]
    flexible = cls.flexible_version_q(header.api_version)
    if flexible:
        pos = _skip_tagged_fields(data, pos)
    decode = cls._struct.compiled_decode_from(header.api_version, compact=flexible, tagged=flexible, data_class=cls)
    try:
        body, end = decode(data, pos)
    except Exception as exc:  # any failure of the generated decoder is a malformed body
        raise FrameError(f"{api_name(header.api_key)} v{header.api_version}: {type(exc).__name__}: {exc}") from None
    # A field running past the end reads short without failing: caught here. Bytes left over are
    # ignored, as Kafka does: librdkafka's Metadata v9+ for every topic carries three.
    if end > len(data):
        raise FrameError(f"{api_name(header.api_key)} v{header.api_version}: the body runs past the end of the frame")
    null = _null_not_allowed(cls._struct, header.api_version, body, cls.__name__)
    if null is not None:
        raise FrameError(f"{api_name(header.api_key)} v{header.api_version}: {null} is null, which the version does not allow")
    return Request(header, body)


def _null_not_allowed(schema: Any, version: int, value: Any, path: str) -> str | None:
    """The first array or string of ``value`` that is null where ``version`` does not allow it
    (the generated decoder reads a length of -1 as null whatever the schema says), or None."""
    for field in schema._fields:
        if field.tag is not None or not field.for_version_q(version):
            continue
        item = getattr(value, field.name, None)
        if item is None:
            if (field.is_array() or field.type_str in ("string", "bytes")) and not field.nullable_for_version_q(version):
                return f"{path}.{field.name}"
        elif field.is_struct_array():
            for i, element in enumerate(item):
                found = _null_not_allowed(field.array_of, version, element, f"{path}.{field.name}[{i}]")
                if found is not None:
                    return found
        elif field.is_struct():
            found = _null_not_allowed(field, version, item, f"{path}.{field.name}")
            if found is not None:
                return found
    return None
