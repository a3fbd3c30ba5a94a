"""SaslHandshake and SaslAuthenticate: a connection signs in as a principal.

A connection's ``Session`` holds where its authentication stands. With the gateway authenticating
(TXLOG_AUTH=token) a connection must sign in before anything but ApiVersions, SaslHandshake and
SaslAuthenticate; any other request before that closes it, as Kafka's ``SaslServerAuthenticator``
does ("Unexpected Kafka request of type … during SASL handshake").

- SaslHandshake v1 names the mechanism; the tokens then come in SaslAuthenticate requests.
- SaslHandshake v0 (clients from before KIP-152) does the same, but the tokens then come as bare
  frames, a 4-byte size and the token, answered the same way (``Session.raw_tokens``).
- A failed exchange is answered SASL_AUTHENTICATION_FAILED and the connection is closed once the
  answer is sent, as Kafka closes it.
- Without authentication (TXLOG_AUTH=none) SaslHandshake is answered ILLEGAL_SASL_STATE, as a
  Kafka listener without SASL answers it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from api.kafka.handlers import RequestContext
from app.errors import ErrorCode, TxlogError
from app.services import sasl
from app.wire.kafka.protocol import ApiKey

log = logging.getLogger("txlog.kafka.sasl")

# What an unauthenticated connection may send.
BEFORE_AUTHENTICATION = frozenset({ApiKey.ApiVersions, ApiKey.SaslHandshake, ApiKey.SaslAuthenticate})


@dataclass
class Session:
    """One connection's authentication."""

    principal: str | None = None  # signed in as
    exchange: sasl.SaslExchange | None = None  # under way, after a SaslHandshake
    raw_tokens: bool = False  # SaslHandshake v0: the next tokens are bare frames
    close_after_answer: bool = False  # a failed sign-in: the answer is the last frame


def _enabled() -> list[str]:
    return sasl.enabled()


async def handle_sasl_handshake(ctx: RequestContext, request: Any) -> dict:
    session: Session = ctx.session
    if ctx.authorizer is None:
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE.kafka_code, "mechanisms": []}
    if session.principal is not None or session.exchange is not None:
        session.close_after_answer = True
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE.kafka_code, "mechanisms": _enabled()}
    try:
        session.exchange = sasl.start(request.mechanism, ctx.authorizer)
    except TxlogError as exc:
        session.close_after_answer = True
        return {"error_code": exc.code.kafka_code, "mechanisms": _enabled()}
    session.raw_tokens = ctx.api_version == 0
    return {"error_code": 0, "mechanisms": _enabled()}


async def authenticate(ctx: RequestContext, token: bytes) -> bytes:
    """The server's answer to one token of the exchange under way; the principal is set once it
    completes. Raises ``TxlogError`` (the connection is then closed after the answer)."""
    session: Session = ctx.session
    exchange = session.exchange
    if exchange is None:
        session.close_after_answer = True
        raise TxlogError(ErrorCode.ILLEGAL_SASL_STATE, "Unexpected SaslAuthenticate request: no SaslHandshake came first")
    try:
        answer = await ctx.call(exchange.respond, bytes(token))
    except TxlogError as exc:
        log.warning("failed authentication from %s with %s: %s", ctx.client_host, exchange.mechanism, exc.message)
        session.close_after_answer = True
        session.exchange = None
        raise
    if exchange.principal is not None:
        session.principal = exchange.principal.name
        session.exchange = None
        session.raw_tokens = False
    return answer


async def handle_sasl_authenticate(ctx: RequestContext, request: Any) -> dict:
    if ctx.authorizer is None:
        raise TxlogError(ErrorCode.ILLEGAL_SASL_STATE, "Unexpected SaslAuthenticate request: SASL is not enabled")
    try:
        answer = await authenticate(ctx, request.auth_bytes)
    except TxlogError as exc:
        return {"error_code": exc.code.kafka_code, "error_message": exc.message, "auth_bytes": b""}
    return {"error_code": 0, "error_message": None, "auth_bytes": answer, "session_lifetime_ms": 0}
