"""The codec's names as this module held them before they moved to the codec's own modules:
``messages`` (kafka-python's and our message classes), ``requests``, ``structs`` (responses built
from plain data, and encoded), ``direct_responses`` (Produce's and Fetch's answers) and
``error_responses`` (error answers, ApiVersions' quirks). Re-exported for the importers not yet
moved to them; new code imports from those modules.
"""

from __future__ import annotations

from app.wire.kafka.direct_responses import uvarint
from app.wire.kafka.error_responses import api_versions_fallback, error_body, error_response
from app.wire.kafka.messages import ApiKey, api_name, codec_versions, has_codec
from app.wire.kafka.requests import HEADER_MIN_BYTES, FrameError, Request, RequestHeader, decode_request, read_header
from app.wire.kafka.structs import build, decode_response, encode_request, encode_response, generic_response

__all__ = [
    "ApiKey",
    "FrameError",
    "HEADER_MIN_BYTES",
    "Request",
    "RequestHeader",
    "api_name",
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
