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
- Without authentication (TXLOG_AUTH=none), or on a listener without SASL (PLAINTEXT, SSL),
  SaslHandshake is answered ILLEGAL_SASL_STATE, as a Kafka listener without SASL answers it.

KIP-368 re-authentication (connections.max.reauth.ms, TXLOG_KAFKA_CONNECTIONS_MAX_REAUTH_MS):

- SaslAuthenticate v1+ answers ``session_lifetime_ms``: the setting, or less when the credential
  itself ends sooner (0: the session does not end). The session ends that long after sign-in.
- Before it ends the client signs in again on the same connection (SaslHandshake v1+, the same
  mechanism, then SaslAuthenticate), at most once a second as Kafka allows; meanwhile nothing but
  SaslAuthenticate may come. It must sign in as the same principal ("Cannot change principals
  during re-authentication"); a principal revoked meanwhile fails. Either failure closes the
  connection, as does any request once the session has ended (``server``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from api.kafka.handlers import RequestContext
from app.errors import ErrorCode, TxlogError
from app.services import sasl
from app.wire.kafka.messages import ApiKey

log = logging.getLogger("txlog.kafka.sasl")

# What an unauthenticated connection may send.
BEFORE_AUTHENTICATION = frozenset({ApiKey.ApiVersions, ApiKey.SaslHandshake, ApiKey.SaslAuthenticate})
MIN_REAUTH_INTERVAL_S = 1.0  # Kafka's KafkaChannel: one re-authentication a second at most


@dataclass
class Session:
    """One connection's authentication."""

    principal: str | None = None  # signed in as
    exchange: sasl.SaslExchange | None = None  # under way, after a SaslHandshake
    raw_tokens: bool = False  # SaslHandshake v0: the next tokens are bare frames
    close_after_answer: bool = False  # a failed sign-in: the answer is the last frame
    listener: str = ""  # the listener's name the connection came in on
    sasl: bool = True  # whether that listener signs clients in with SASL
    sign_in_deadline: float = float("inf")  # time.monotonic() by which a SASL sign-in must be done
    mechanism: str | None = None  # the mechanism signed in with
    expires_at: float | None = None  # time.monotonic() at which the session ends (KIP-368)
    reauth_started: float = float("-inf")  # when the last re-authentication began

    @property
    def reauthenticating(self) -> bool:
        return self.principal is not None and self.exchange is not None

    def expired(self, now: float) -> bool:
        """The session ended and no re-authentication begun before that is under way."""
        return self.expires_at is not None and now > self.expires_at and not self.reauthenticating


def session_lifetime_ms(max_reauth_ms: int, credential_expires_at_ms: int | None, now_ms: int) -> int:
    """How long a session lasts (Kafka's ``calcCompletionTimesAndReturnSessionLifetimeMs``): the
    smaller of connections.max.reauth.ms (0: no bound) and the time left to the credential (none:
    no bound); 0 means it does not end. A credential already past its end gives a session that
    ends at once (1 ms: 0 would say it never ends)."""
    bounds = [
        b
        for b in (max_reauth_ms or None, None if credential_expires_at_ms is None else credential_expires_at_ms - now_ms)
        if b is not None
    ]
    return max(1, min(bounds)) if bounds else 0


def _enabled() -> list[str]:
    return sasl.enabled()


async def handle_sasl_handshake(ctx: RequestContext, request: Any) -> dict:
    session: Session = ctx.session
    if ctx.authorizer is None or not session.sasl:
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE.kafka_code, "mechanisms": []}
    if session.principal is not None and not _may_reauthenticate(ctx, session):
        session.close_after_answer = True
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE.kafka_code, "mechanisms": _enabled()}
    if session.exchange is not None:
        session.close_after_answer = True
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE.kafka_code, "mechanisms": _enabled()}
    if session.principal is not None and request.mechanism != session.mechanism:
        log.warning(
            "failed re-authentication from %s: SASL mechanism '%s' requested by client is not supported for "
            "re-authentication of mechanism '%s'",
            ctx.client_host,
            request.mechanism,
            session.mechanism,
        )
        session.close_after_answer = True
        return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM.kafka_code, "mechanisms": _enabled()}
    try:
        session.exchange = sasl.start(request.mechanism, ctx.authorizer)
    except TxlogError as exc:
        session.close_after_answer = True
        return {"error_code": exc.code.kafka_code, "mechanisms": _enabled()}
    if session.principal is not None:
        session.reauth_started = time.monotonic()
    session.raw_tokens = ctx.api_version == 0
    return {"error_code": 0, "mechanisms": _enabled()}


def _may_reauthenticate(ctx: RequestContext, session: Session) -> bool:
    """Kafka's ``KafkaChannel.maybeBeginServerReauthentication``: only a session that ends may be
    renewed, with SaslHandshake v1+, and not twice within a second; any other SaslHandshake on a
    signed-in connection is ILLEGAL_SASL_STATE."""
    return (
        session.expires_at is not None
        and ctx.api_version >= 1
        and session.exchange is None
        and time.monotonic() - session.reauth_started >= MIN_REAUTH_INTERVAL_S
    )


async def authenticate(ctx: RequestContext, token: bytes) -> tuple[bytes, int]:
    """The server's answer to one token of the exchange under way, and the session's lifetime in
    ms once it completes (0 before, or when it does not end); the principal is set once it
    completes. Raises ``TxlogError`` (the connection is then closed after the answer)."""
    session: Session = ctx.session
    exchange = session.exchange
    if exchange is None:
        session.close_after_answer = True
        raise TxlogError(ErrorCode.ILLEGAL_SASL_STATE, "Unexpected SaslAuthenticate request: no SaslHandshake came first")
    what = "re-authentication" if session.principal is not None else "authentication"
    try:
        answer = await ctx.call(exchange.respond, bytes(token))
        if exchange.principal is not None and session.principal is not None and exchange.principal.name != session.principal:
            raise TxlogError(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                f"Cannot change principals during re-authentication from User.{session.principal}: User.{exchange.principal.name}",
            )
    except TxlogError as exc:
        log.warning("failed %s from %s with %s: %s", what, ctx.client_host, exchange.mechanism, exc.message)
        session.close_after_answer = True
        session.exchange = None
        raise
    if exchange.principal is None:
        return answer, 0
    if session.principal is not None:
        log.info("re-authenticated %s from %s with %s", session.principal, ctx.client_host, exchange.mechanism)
    session.principal = exchange.principal.name
    session.mechanism = exchange.mechanism
    session.exchange = None
    session.raw_tokens = False
    lifetime = session_lifetime_ms(
        ctx.broker.settings.kafka_connections_max_reauth_ms,
        getattr(exchange, "credential_expires_at_ms", None),
        int(time.time() * 1000),
    )
    session.expires_at = time.monotonic() + lifetime / 1000 if lifetime else None
    return answer, lifetime


async def handle_sasl_authenticate(ctx: RequestContext, request: Any) -> dict:
    if ctx.authorizer is None or not ctx.session.sasl:
        raise TxlogError(ErrorCode.ILLEGAL_SASL_STATE, "Unexpected SaslAuthenticate request: SASL is not enabled")
    try:
        answer, lifetime_ms = await authenticate(ctx, request.auth_bytes)
    except TxlogError as exc:
        return {"error_code": exc.code.kafka_code, "error_message": exc.message, "auth_bytes": b""}
    return {"error_code": 0, "error_message": None, "auth_bytes": answer, "session_lifetime_ms": lifetime_ms}
