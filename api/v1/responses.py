"""The error answers each operation declares in the OpenAPI document, all in the error envelope."""

from __future__ import annotations

from typing import Any

from api.v1.schemas import ErrorResponse
from app.errors import ErrorCode

# Every operation may answer these: no or a bad token (401) and an ACL refusing (403) with
# TXLOG_AUTH=token, a request that does not match its schema (422), and a database that is away or
# did not answer in time (503, with Retry-After).
SHARED = (401, 403, 422, 503)

RETRY_AFTER = {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}


def _description(status: int) -> str:
    if status == 422:
        return f"{ErrorCode.INVALID_REQUEST.name}: the request does not match the schema"
    return ", ".join(c.name for c in ErrorCode if c.http_status == status)


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route that may answer these error statuses besides the shared ones; each
    is described by the Kafka-named codes it can carry. Routes with a body list 413."""
    out: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorResponse, "description": _description(status)} for status in sorted({*statuses, *SHARED})
    }
    for status in (429, 503):
        if status in out:
            out[status]["headers"] = {"Retry-After": RETRY_AFTER}
    return out
