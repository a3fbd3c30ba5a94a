"""Responses, as a handler's plain data becomes bytes, through kafka-python's structs.

A handler returns plain data, a dict of snake_case field names whose nested structs are dicts and
lists of dicts. ``build`` turns it into kafka-python's struct for one version, walking the schema:
fields the version does not have are dropped, fields left out take the schema's defaults, an
unknown name is a mistake (``ValueError``). ``encode_response`` frames it with the response header
of that version (v1 for flexible versions, but always v0 for ApiVersions). The answers to Produce
and Fetch, the hot ones, are written directly (``direct_responses``): the same bytes for less work.

The client's side goes through the same structs: ``encode_request`` and ``decode_response``, for
the admin pages' client (``admin_client``), tests and tools.
"""

from __future__ import annotations

from typing import Any, Mapping

from app.wire.kafka.direct_responses import direct_response
from app.wire.kafka.messages import REQUESTS, RESPONSES, ApiKey, DataContainer
from app.wire.kafka.requests import RequestHeader

__all__ = ["build", "decode_response", "encode_request", "encode_response", "generic_response"]

# kafka-python renames a few fields of Kafka's schemas (and types them as sets of bits): the
# names Kafka's schemas use are accepted for them.
_ALIASES = {"authorized_operations": ("topic_authorized_operations", "cluster_authorized_operations")}


def encode_request(
    api_key: int, api_version: int, body: Mapping[str, Any], correlation_id: int = 0, client_id: str | None = "txlog"
) -> bytes:
    """A framed request (size prefix included), as a client sends it: for tests and tools."""
    message = build(REQUESTS[api_key], api_version, body)
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(header=True, framed=True))


def build(cls_or_key: Any, api_version: int, data: Mapping[str, Any]) -> Any:
    """kafka-python's response struct (or request struct, given its class) for ``api_version``
    from plain data (see the module's doc)."""
    cls = RESPONSES[cls_or_key] if isinstance(cls_or_key, int) else cls_or_key
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
    plain data. An ApiVersions error is answered as a v0 body (``error_responses``: ApiVersions' quirks)."""
    direct = direct_response(header, body)
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


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Any]:
    """``(correlation_id, struct)`` of a response frame (without its size prefix): what a client
    reads (``admin_client``, and the tests)."""
    cls = RESPONSES[api_key]
    message = cls.decode(frame, version=api_version, header=True)
    return message.header.correlation_id, message
