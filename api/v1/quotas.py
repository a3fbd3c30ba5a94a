"""Client quotas on the HTTP API's produce and fetch: the same budgets as the Kafka gateway's
(``app.services.quotas``), spent by the request's principal (Kafka's anonymous user without
authentication) with no client id, so /users/<user>, /users/<user>/clients/<default> and
/clients/<default> are the entities that can apply.

HTTP has no channel to mute: a throttled answer is held back for its throttle time and says so in
``Txlog-Throttle-Time-Ms``. Without any quota configured a request costs one attribute check.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.auth import principal_of
from app.domain.quotas import REQUEST_PERCENTAGE, request_percentage

THROTTLE_HEADER = "Txlog-Throttle-Time-Ms"
# Declared on every answer that spends a quota (OpenAPI ``responses`` of produce and fetch).
THROTTLE_HEADER_DOC: dict[str, Any] = {
    THROTTLE_HEADER: {
        "description": "Present when the answer was throttled by a client quota (Kafka's throttle_time_ms): "
        "the answer was held back this many milliseconds",
        "schema": {"type": "integer", "minimum": 1},
    }
}


class ThrottledResponse(Response):
    """An answer sent once its throttle time has passed."""

    def __init__(self, answer: Response, throttle_ms: int) -> None:
        super().__init__(answer.body, answer.status_code, media_type=answer.media_type)
        self.raw_headers = [*answer.raw_headers, (THROTTLE_HEADER.lower().encode(), str(throttle_ms).encode())]
        self.throttle_ms = throttle_ms

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.sleep(self.throttle_ms / 1000)
        await super().__call__(scope, receive, send)


def spend(request: Request, answer: Response, key: str, amount: float, handler_s: float) -> Response:
    """Record what ``answer`` spent of ``key`` and of request_percentage; the answer, throttled if
    either quota is exceeded."""
    quotas = getattr(request.app.state, "quotas", None)
    if quotas is None or not quotas.enabled:
        return answer
    user = principal_of(request)
    throttle_ms = max(
        quotas.record(user, "", key, amount), quotas.record(user, "", REQUEST_PERCENTAGE, request_percentage(handler_s))
    )
    return ThrottledResponse(answer, throttle_ms) if throttle_ms else answer
