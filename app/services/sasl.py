"""SASL on the Kafka wire: which mechanisms the gateway speaks and one exchange per mechanism.

A connection's authentication is an exchange: ``start(mechanism, authorizer)`` begins one (an
unknown mechanism is UNSUPPORTED_SASL_MECHANISM), each client token goes to ``respond``, which
answers the server's token, and once ``principal`` is set the client is that principal. A failed
exchange raises SASL_AUTHENTICATION_FAILED (a token past its last step: ILLEGAL_SASL_STATE) and is
over. ``respond`` may read the database or hash (PLAIN's token check): run it off the event loop.

- PLAIN (RFC 4616): the username is a principal's name, the password that principal's API token
  (the one identity of both doors: the HTTP API's ``Authorization: Bearer`` token).
- SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677; ``app.domain.scram``): the username is a
  principal's name, the password the one set for that mechanism (AlterUserScramCredentials,
  ``txlog principals scram set``). The credentials come from the authorizer's snapshot, no database
  round trip. A user without a credential (no such principal, revoked, or none for this mechanism)
  is answered with a fake one derived from a per-process secret, so the exchange goes the same
  way and fails at the same step as a wrong password, telling nothing of who exists.
"""

from __future__ import annotations

import hmac
import secrets

from app.domain import scram
from app.domain.acl_bindings import StoredPrincipal
from app.errors import ErrorCode, TxlogError
from app.services.security import Authorizer

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
# What SaslHandshake answers as enabled, in this order.
MECHANISMS: tuple[str, ...] = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)


class SaslExchange:
    """One mechanism's server side for one authentication."""

    mechanism: str = ""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer
        self.principal: StoredPrincipal | None = None
        self.finished = False

    def respond(self, token: bytes) -> bytes:
        """The server's answer to the client's next token."""
        if self.finished:
            raise TxlogError(ErrorCode.ILLEGAL_SASL_STATE, f"the {self.mechanism} exchange is over")
        try:
            return self._step(token)
        except TxlogError:
            self.finished = True
            raise

    def _step(self, token: bytes) -> bytes:
        raise NotImplementedError


def _failed(message: str) -> TxlogError:
    return TxlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, f"Authentication failed: {message}")


class Plain(SaslExchange):
    mechanism = PLAIN

    def _step(self, token: bytes) -> bytes:
        self.finished = True
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise _failed("a PLAIN token is [authzid] NUL username NUL password")
        try:
            authzid, username, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise _failed("a PLAIN token is UTF-8") from None
        if not username or not password:
            raise _failed("username and password must not be empty")
        if authzid and authzid != username:
            raise _failed("Client requested an authorization id that is different from username")
        try:
            principal = self.authorizer.authenticate(password)
        except TxlogError:
            raise _failed("Invalid username or password") from None
        if not hmac.compare_digest(principal.name.encode(), username.encode()):
            raise _failed("Invalid username or password")
        self.principal = principal
        return b""


# Derives the fake credentials of users who have none: the same within a process, so that asking
# twice for an unknown user shows the same salt.
_FAKE_CREDENTIAL_SECRET = secrets.token_bytes(32)


class Scram(SaslExchange):
    """Two tokens: client-first (answered server-first) and client-final (answered server-final);
    the principal is known once the client's proof checks out against the credential, which must
    still be the principal's then."""

    hashing: scram.Mechanism

    def __init__(self, authorizer: Authorizer) -> None:
        super().__init__(authorizer)
        self.server = scram.ScramServer(self.hashing, secrets.token_urlsafe(24))
        self.user: str = ""
        self.credential: scram.ScramCredential | None = None
        self.known: StoredPrincipal | None = None

    def _step(self, token: bytes) -> bytes:
        if self.server.state == "client-first":
            first = self.server.client_first(token)
            self.user = first.username
            # the fake one is derived whether it is needed or not: the same work for every user
            self.credential = scram.fake_credential(self.hashing, _FAKE_CREDENTIAL_SECRET, first.username)
            found = self.authorizer.scram_credential(first.username, self.mechanism)
            if found is not None:
                self.known, self.credential = found
            return self.server.server_first(self.credential)
        self.finished = True
        answer = self.server.client_final(token)
        now = self.authorizer.scram_credential(self.user, self.mechanism)
        if self.known is None or now is None or now[1] != self.credential:
            # no such user (the fake credential matched: never expected), or revoked or changed meanwhile
            raise TxlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, scram.INVALID_CREDENTIALS.format(self.mechanism))
        self.principal = now[0]
        return answer


class ScramSha256(Scram):
    mechanism = SCRAM_SHA_256
    hashing = scram.SCRAM_SHA_256


class ScramSha512(Scram):
    mechanism = SCRAM_SHA_512
    hashing = scram.SCRAM_SHA_512


_EXCHANGES: dict[str, type[SaslExchange]] = {PLAIN: Plain, SCRAM_SHA_256: ScramSha256, SCRAM_SHA_512: ScramSha512}


def start(mechanism: str, authorizer: Authorizer) -> SaslExchange:
    """An exchange of ``mechanism``, or UNSUPPORTED_SASL_MECHANISM."""
    exchange = _EXCHANGES.get(mechanism)
    if exchange is None:
        raise TxlogError(
            ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unsupported SASL mechanism {mechanism}: one of {', '.join(enabled())}"
        )
    return exchange(authorizer)


def enabled() -> list[str]:
    """The mechanisms SaslHandshake answers."""
    return [m for m in MECHANISMS if m in _EXCHANGES]
