"""Kafka's request and response structs, every version, through kafka-python's generated codec.

This is the only module that imports ``kafka.protocol`` (pinned in pyproject.toml): the gateway
(``api.kafka``) sees plain values.

- Requests: ``read_header`` reads the fixed part of a request header (key, version, correlation id,
  client id: header v1, and the start of v2, whose ``client_id`` stays a non-compact nullable
  string); ``decode_request`` decodes the frame into a ``Request`` whose ``body`` is
  kafka-python's struct, fields named as in Kafka's JSON schemas in snake_case. A frame that does
  not decode (short, truncated, a field running past its end, an unknown key or version) raises
  ``FrameError``: the connection is closed.
- Responses: a handler returns plain data, a dict of snake_case field names whose nested structs
  are dicts and lists of dicts. ``build`` turns it into kafka-python's struct for one version,
  walking the schema: fields the version does not have are dropped, fields left out take the
  schema's defaults, an unknown name is a mistake (``ValueError``). ``encode_response`` frames it
  with the response header of that version (v1 for flexible versions, but always v0 for
  ApiVersions). The answers to Produce and Fetch, the hot ones, are written directly
  (``_direct_response``): the same bytes for less work.
- Errors: ``error_body`` builds a valid body of any API carrying one error code everywhere the
  version has one: the top-level ``error_code`` when the version has it, otherwise per entry of the
  response's arrays, mirrored from the request's (topics, partitions, groups, keys), so that the
  client hears about every item it asked for.
- ApiVersions' quirks: an error answer is always a v0 body (clients decode an ApiVersions error as
  v0 whatever they sent: kafka-python does, librdkafka then retries lower), and an unsupported
  version is answered with UNSUPPORTED_VERSION and the full list of API keys
  (``api_versions_fallback``).
"""

from __future__ import annotations

import struct
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

# kafka-python reads its schemas with importlib.resources.read_text, deprecated since Python 3.11:
# its warning, not ours, and only at import.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.protocol.admin  # noqa: F401  (the modules define, and so register, the message classes)
    import kafka.protocol.consumer  # noqa: F401
    import kafka.protocol.metadata  # noqa: F401
    import kafka.protocol.producer  # noqa: F401
    import kafka.protocol.sasl  # noqa: F401
    from kafka.protocol.api_key import ApiKey
    from kafka.protocol.api_message import ApiMessage
    from kafka.protocol.data_container import DataContainer

# The share-group APIs (KIP-932) and the consumer-group APIs of the next-generation protocol
# (KIP-848), which kafka-python 3.0.12 has no schema for: their message definitions are ours (app/wire/kafka/schemas/*.json, in the form of Kafka's), loaded by
# kafka-python's own machinery (a message class reads the JSON file named as the class from the
# package given as ``load_json``), so that they decode, build and encode as every other API does.
# Only the versions Kafka 4.1+ serves and librdkafka's share consumer and admin client send: v1 of
# the four share APIs (v0 was Kafka 4.0's early access, removed in 4.1), v0 of the offsets APIs;
# v0–1 of ConsumerGroupHeartbeat and ConsumerGroupDescribe.
_SCHEMAS = "app.wire.kafka.schemas"
_SHARE_MESSAGES = (
    "ShareGroupHeartbeat",
    "ShareGroupDescribe",
    "ShareFetch",
    "ShareAcknowledge",
    "DescribeShareGroupOffsets",
    "AlterShareGroupOffsets",
    "DeleteShareGroupOffsets",
    "ConsumerGroupHeartbeat",
    "ConsumerGroupDescribe",
)


def _define_share_messages() -> dict[str, Any]:
    """The request and response classes of ``_SHARE_MESSAGES`` by name. Held here: kafka-python
    finds message classes as ``ApiMessage``'s subclasses, which Python holds weakly."""
    return {
        name: types.new_class(name, (ApiMessage,), {"load_json": _SCHEMAS}, lambda ns: ns.update(__module__=__name__))
        for name in (message + kind for message in _SHARE_MESSAGES for kind in ("Request", "Response"))
    }


with warnings.catch_warnings():  # kafka-python's read_text again
    warnings.simplefilter("ignore", DeprecationWarning)
    _SHARE_CLASSES = _define_share_messages()
# API keys whose schemas are ours: their first version is the schema's (kafka-python counts every
# schema from version 0, the versions Kafka removed included, so that its own schemas read them).
_OWN_SCHEMAS = frozenset(cls.API_KEY for cls in _SHARE_CLASSES.values())

__all__ = [
    "ApiKey",
    "FrameError",
    "HEADER_MIN_BYTES",
    "Request",
    "RequestHeader",
    "api_versions_fallback",
    "build",
    "codec_versions",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "error_body",
    "error_response",
    "generic_response",
    "has_codec",
    "read_header",
    "uvarint",
]

# api_key int16, api_version int16, correlation_id int32, client_id length int16 (-1: null)
_HEADER = struct.Struct(">hhih")
HEADER_MIN_BYTES = _HEADER.size
_INT32 = struct.Struct(">i")

# kafka-python renames a few fields of Kafka's schemas (and types them as sets of bits): the
# names Kafka's schemas use are accepted for them.
_ALIASES = {"authorized_operations": ("topic_authorized_operations", "cluster_authorized_operations")}
# Fields that name the item an error is about, copied from the request into an error answer.
_IDENTITY = {
    "name": ("name", "topic"),
    "topic": ("topic", "name"),
    "topic_id": ("topic_id",),
    "partition_index": ("partition_index", "partition", "index"),
    "partition": ("partition", "partition_index", "index"),
    "index": ("index", "partition_index", "partition"),
    "group_id": ("group_id",),
    "key": ("key",),
    "topic_name": ("topic_name", "name", "topic"),
    "transactional_id": ("transactional_id",),
    "resource_type": ("resource_type",),
    "resource_name": ("resource_name",),
}
# A response array answers the request array of the same name, or of one of these.
_MIRRORS = {
    "responses": ("topic_data", "topics"),  # Produce, Fetch
    "partition_responses": ("partition_data",),  # Produce
    "partitions": ("partitions", "partition_indexes", "partition_data"),
    "results_by_topic_v3_and_below": ("v3_and_below_topics",),  # AddPartitionsToTxn v0-3
    "results_by_transaction": ("transactions",),  # AddPartitionsToTxn v4+
    "topic_results": ("topics",),
    "results_by_partition": ("partitions",),
    "coordinators": ("coordinator_keys",),  # FindCoordinator v4+
    "results": ("resources",),  # DescribeConfigs
    "groups": ("groups", "group_ids"),  # ShareGroupDescribe: a group per id asked for
}


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


def _message_classes() -> tuple[dict[int, Any], dict[int, Any]]:
    """Each API key's request and response class (kafka-python's, untyped)."""
    requests: dict[int, Any] = {}
    responses: dict[int, Any] = {}
    pending = list(ApiMessage.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        # the primary class of each message (its per-version wrappers are subclasses without a schema)
        if cls.__dict__.get("_json") is None:
            continue
        (requests if cls.is_request() else responses)[cls.API_KEY] = cls
    return requests, responses


_REQUESTS, _RESPONSES = _message_classes()


def codec_versions(api_key: int) -> tuple[int, int] | None:
    """The versions of ``api_key`` the codec reads and writes, or None when it has no schema."""
    cls = _REQUESTS.get(api_key)
    if cls is None or api_key not in _RESPONSES:
        return None
    return (cls.valid_versions[0] if api_key in _OWN_SCHEMAS else 0), cls.max_version


def has_codec(api_key: int, api_version: int) -> bool:
    versions = codec_versions(api_key)
    return versions is not None and versions[0] <= api_version <= versions[1]


def api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"ApiKey{api_key}"


# -- requests ------------------------------------------------------------------------------------


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
    cls = _REQUESTS[header.api_key]
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


def encode_request(
    api_key: int, api_version: int, body: Mapping[str, Any], correlation_id: int = 0, client_id: str | None = "txlog"
) -> bytes:
    """A framed request (size prefix included), as a client sends it: for tests and tools."""
    message = build(_REQUESTS[api_key], api_version, body)
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(header=True, framed=True))


# -- responses -----------------------------------------------------------------------------------


def build(cls_or_key: Any, api_version: int, data: Mapping[str, Any]) -> Any:
    """kafka-python's response struct (or request struct, given its class) for ``api_version``
    from plain data (see the module's doc)."""
    cls = _RESPONSES[cls_or_key] if isinstance(cls_or_key, int) else cls_or_key
    return _build(cls._struct, cls, api_version, data, cls.__name__)


def _build(schema: Any, data_class: type, version: int, data: Any, path: str) -> Any:
    if isinstance(data, DataContainer):
        return data
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a dict, got {type(data).__name__}")
    fields = schema.fields  # name -> field, every version
    unknown = [name for name in data if name not in fields and not _alias_of(name, fields)]
    if unknown:
        raise ValueError(f"{path}: no field {', '.join(map(repr, unknown))} (fields: {', '.join(fields)})")
    values = {}
    for field in schema._fields:
        if not field.for_version_q(version):
            continue
        name = field.name
        value = _given(data, name)
        if field.is_struct_array():
            if value is _MISSING:
                value = field.default
            elif value is not None:
                value = [
                    _build(field.array_of, field.data_class, version, item, f"{path}.{name}[{i}]") for i, item in enumerate(value)
                ]
        elif field.is_struct():
            if value is _MISSING:
                # an absent tagged or nullable struct stays absent; a required one takes its defaults
                value = None if field.tag is not None or field.nullable_for_version_q(version) else {}
            if value is not None:
                value = _build(field, field.data_class, version, value, f"{path}.{name}")
        elif value is _MISSING:
            value = field.default
        elif field.type_str == "bitfield" and isinstance(value, int):
            value = _bits(value)
        values[name] = value
    return data_class(version=version, **values)


_MISSING = object()


def _given(data: Mapping[str, Any], name: str) -> Any:
    if name in data:
        return data[name]
    for alias in _ALIASES.get(name, ()):
        if alias in data:
            return data[alias]
    return _MISSING


def _alias_of(name: str, fields: Mapping[str, Any]) -> bool:
    return any(name in aliases and field in fields for field, aliases in _ALIASES.items())


def _bits(value: int) -> set[int] | None:
    """Kafka's int32 bit set of authorized operations as kafka-python holds it (INT32_MIN: none given)."""
    value &= 0xFFFFFFFF
    if value == 0x80000000:
        return None
    return {bit for bit in range(32) if value >> bit & 1}


def encode_response(header: RequestHeader, body: Mapping[str, Any]) -> bytes | bytearray:
    """The framed response (size prefix included) to the request ``header``, from a handler's
    plain data. An ApiVersions error is answered as a v0 body."""
    direct = _direct_response(header, body)
    if direct is not None:
        return direct
    version = header.api_version
    if header.api_key == ApiKey.ApiVersions and body.get("error_code"):
        version = 0
    return generic_response(header.api_key, version, header.correlation_id, body)


def generic_response(api_key: int, api_version: int, correlation_id: int, body: Mapping[str, Any]) -> bytes:
    """The framed response written by kafka-python's struct of that API and version (``build``)."""
    message = build(api_key, api_version, body)
    message.with_header(correlation_id=correlation_id)
    return bytes(message.encode(header=True, framed=True))


# -- the hot answers, written directly --------------------------------------------------------------
#
# The answer to every batch a producer sends (ProduceResponse v3-10) and to every fetch of a
# consumer (FetchResponse v4-12) is written here field by field, as Kafka's schemas lay them out,
# rather than through the generic struct (``build``): that costs a producer's batch about 20 µs
# more, and a fetch of 1 MiB of records about 90 µs more (with the gateway's memory settings,
# ``app.memory``), copying the records several times where this copies them once. These writers
# take the fields their handlers answer with (``api.kafka.handlers.produce``, ``.fetch``), a field
# left out taking the schema's default as in ``build``; anything else (a field they do not know)
# takes the generic path. tests/kafka/test_protocol.py checks them byte for byte against
# kafka-python's codec.

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


def _direct_response(header: RequestHeader, body: Mapping[str, Any]) -> bytearray | None:
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


def error_body(api_key: int, api_version: int, code: int, message: str | None = None, request: Any = None) -> dict[str, Any]:
    """A body of the API's response at ``api_version`` carrying ``code`` wherever the version has an
    error code: the top-level ``error_code`` if there is one, otherwise every entry mirrored from
    the decoded ``request`` (none when it is None)."""
    schema = _RESPONSES[api_key]._struct
    top = {field.name for field in schema.untagged_fields(api_version)}
    if "error_code" in top:
        body: dict[str, Any] = {"error_code": code}
        if "error_message" in top:
            body["error_message"] = message
        return body
    return _error_entry(schema, api_version, code, message, request)


def _error_entry(schema: Any, version: int, code: int, message: str | None, source: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    scalar_source = source is not None and not isinstance(source, DataContainer)
    for field in schema._fields:
        if not field.for_version_q(version):
            continue
        name = field.name
        if name == "error_code" or name.endswith("_error_code"):
            if field.tag is None:
                out[name] = code
        elif name == "error_message":
            out[name] = message
        elif field.is_struct_array():
            items = _mirrored(name, source) if isinstance(source, DataContainer) else None
            out[name] = [_error_entry(field.array_of, version, code, message, item) for item in items or ()]
        elif name in _IDENTITY and source is not None:
            if scalar_source:
                out[name] = source
                scalar_source = False  # a scalar item names one field: the first identity field
            else:
                for candidate in _IDENTITY[name]:
                    if candidate in source.fields and source.fields[candidate].for_version_q(version):
                        out[name] = getattr(source, candidate)
                        break
    return out


def _mirrored(name: str, source: DataContainer) -> Iterable[Any] | None:
    for candidate in (name, *_MIRRORS.get(name, ())):
        field = source.fields.get(candidate)
        if field is not None and field.is_array() and source.version is not None and field.for_version_q(source.version):
            return getattr(source, candidate)
    return None


def error_response(header: RequestHeader, code: int, message: str | None = None, request: Any = None) -> bytes | bytearray | None:
    """The framed error answer to ``header`` (see ``error_body``), or None when the codec has no
    response of that API and version."""
    if not has_codec(header.api_key, header.api_version):
        return None
    return encode_response(header, error_body(header.api_key, header.api_version, code, message, request))


def api_versions_fallback(header: RequestHeader, api_keys: Iterable[tuple[int, int, int]], code: int) -> bytes:
    """ApiVersions of a version not served: header v0, a v0 body with ``code`` and every
    ``(api_key, min_version, max_version)``, from which the client picks a version it shares."""
    body = {"error_code": code, "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in api_keys]}
    return generic_response(ApiKey.ApiVersions, 0, header.correlation_id, body)


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Any]:
    """``(correlation_id, struct)`` of a response frame (without its size prefix): what a client
    reads (``admin_client``, and the tests)."""
    cls = _RESPONSES[api_key]
    message = cls.decode(frame, version=api_version, header=True)
    return message.header.correlation_id, message
