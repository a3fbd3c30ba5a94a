"""Kafka's request and response structs, every version, through kafka-python's generated codec:
each API's message classes, kafka-python's and ours.

This is the only module that imports kafka-python (``kafka.protocol``, pinned in pyproject.toml;
``lint-imports`` holds the rule): its siblings (``requests``, ``structs``, ``direct_responses``,
``error_responses``) work on the classes it gives them, and the gateway (``api.kafka``) sees plain
values.
"""

from __future__ import annotations

import types
import warnings
from typing import Any

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

__all__ = ["ApiKey", "DataContainer", "REQUESTS", "RESPONSES", "api_name", "codec_versions", "has_codec"]

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


REQUESTS, RESPONSES = _message_classes()


def codec_versions(api_key: int) -> tuple[int, int] | None:
    """The versions of ``api_key`` the codec reads and writes, or None when it has no schema."""
    cls = REQUESTS.get(api_key)
    if cls is None or api_key not in RESPONSES:
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
