"""Error answers, and ApiVersions' quirks.

- Errors: ``error_body`` builds a valid body of any API carrying one error code everywhere the
  version has one: the top-level ``error_code`` when the version has it, otherwise per entry of the
  response's arrays, mirrored from the request's (topics, partitions, groups, keys), so that the
  client hears about every item it asked for.
- ApiVersions' quirks: an error answer is always a v0 body (clients decode an ApiVersions error as
  v0 whatever they sent: kafka-python does, librdkafka then retries lower; ``structs.encode_response``
  answers so), and an unsupported version is answered with UNSUPPORTED_VERSION and the full list of
  API keys (``api_versions_fallback``).
"""

from __future__ import annotations

from typing import Any, Iterable

from app.wire.kafka.messages import RESPONSES, ApiKey, DataContainer, has_codec
from app.wire.kafka.requests import RequestHeader
from app.wire.kafka.structs import encode_response, generic_response

__all__ = ["api_versions_fallback", "error_body", "error_response"]

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


def error_body(api_key: int, api_version: int, code: int, message: str | None = None, request: Any = None) -> dict[str, Any]:
    """A body of the API's response at ``api_version`` carrying ``code`` wherever the version has an
    error code: the top-level ``error_code`` if there is one, otherwise every entry mirrored from
    the decoded ``request`` (none when it is None)."""
    schema = RESPONSES[api_key]._struct
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
