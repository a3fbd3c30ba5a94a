"""Who is asking, and may they. The admin pages ask only two questions, through ``Authorizer``:
``principal_for(request)`` and ``can(principal, action, resource)``. Today one implementation
answers them from a single shared token (``TXLOG_ADMIN_TOKEN``); principals with ACLs can replace
it later without the pages changing.

- With a token: every page and action needs a signed-in session. Signing in exchanges the token
  for a session cookie (HttpOnly, SameSite=Strict) signed with an HMAC keyed from the token, so
  changing the token ends every session.
- Without a token: anyone who can reach the server may look; nobody may act, except over a
  loopback connection to a server bound to loopback (an operator on the machine itself). A
  request relayed by a proxy (``Forwarded``/``X-Forwarded-For``) is never treated as local.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from starlette.requests import HTTPConnection

if TYPE_CHECKING:
    from app.services.security import Authorizer as AclAuthorizer

SESSION_COOKIE = "txlog_admin_session"
SESSION_TTL_S = 12 * 3600
_PROXY_HEADERS = (b"forwarded", b"x-forwarded-for", b"x-real-ip")


class Action(Enum):
    VIEW = "view"
    ABORT_TRANSACTION = "abort_transaction"  # kafka-transactions.sh abort


@dataclass(frozen=True)
class Resource:
    """What an action is on, named as Kafka's ACLs name resources."""

    kind: str  # "cluster", "topic", "group", "transactional_id"
    name: str = ""


CLUSTER = Resource("cluster", "txlog")


@dataclass(frozen=True)
class Principal:
    name: str
    authenticated: bool  # signed in, as opposed to an anonymous visitor
    local: bool = False  # reached the server over loopback, the server bound to loopback
    token_id: str | None = None  # with TXLOG_AUTH=token: the token it signed in with


class Authorizer(Protocol):
    @property
    def sign_in_required(self) -> bool:
        """True when pages must not be shown to anonymous visitors (a sign-in form is offered)."""

    def principal_for(self, request: HTTPConnection) -> Principal | None:
        """The principal making the request, or None if it must sign in first."""

    def authenticate(self, secret: str) -> Principal | None:
        """The principal a sign-in secret names, or None."""

    def session_for(self, principal: Principal) -> str:
        """The cookie value that makes later requests come from ``principal``."""

    def form_token(self, request: HTTPConnection) -> str | None:
        """The anti-forgery token bound to the request's session, if it has one."""

    def can(self, principal: Principal | None, action: Action, resource: Resource) -> bool:
        """May ``principal`` do ``action`` on ``resource``?"""


def is_loopback_connection(request: HTTPConnection) -> bool:
    """The client and the server's address of this connection are both loopback addresses, and no
    proxy relayed the request."""
    if any(name in _PROXY_HEADERS for name, _ in request.scope.get("headers", ())):
        return False
    server = request.scope.get("server")
    client = request.scope.get("client")
    return bool(server and client and _is_loopback(server[0]) and _is_loopback(client[0]))


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Session:
    subject: str
    expires_at: int  # epoch seconds
    csrf: str  # the session's anti-forgery token, echoed by every form


class SessionSigner:
    """``payload.signature``: the payload is base64url JSON, the signature an HMAC-SHA256 of it."""

    def __init__(self, key: bytes, ttl_s: int = SESSION_TTL_S) -> None:
        self._key = key
        self._ttl = ttl_s

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).digest())

    def issue(self, subject: str, now_s: float | None = None) -> str:
        now = int(now_s if now_s is not None else time.time())
        body = {"sub": subject, "exp": now + self._ttl, "csrf": secrets.token_urlsafe(24)}
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{payload}.{self._sign(payload)}"

    def read(self, cookie: str | None, now_s: float | None = None) -> Session | None:
        if not cookie or cookie.count(".") != 1:
            return None
        payload, signature = cookie.split(".")
        try:
            expected = self._sign(payload)
        except UnicodeEncodeError:
            return None
        if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
            return None
        try:
            body = json.loads(_unb64(payload))
            session = Session(str(body["sub"]), int(body["exp"]), str(body["csrf"]))
        except (ValueError, KeyError, TypeError):
            return None
        if session.expires_at <= (now_s if now_s is not None else time.time()):
            return None
        return session


class TokenAuthorizer:
    """One shared secret, or none (read-only, actions only from loopback)."""

    ADMIN = "admin"

    def __init__(self, token: str | None) -> None:
        self._token = token or None
        key = hmac.new((self._token or "").encode(), b"txlog admin session v1", hashlib.sha256).digest()
        self.sessions = SessionSigner(key)

    @property
    def sign_in_required(self) -> bool:
        return self._token is not None

    def session(self, request: HTTPConnection) -> Session | None:
        if self._token is None:
            return None
        return self.sessions.read(request.cookies.get(SESSION_COOKIE))

    def principal_for(self, request: HTTPConnection) -> Principal | None:
        local = is_loopback_connection(request)
        if self._token is None:
            return Principal("anonymous", authenticated=False, local=local)
        session = self.session(request)
        return Principal(session.subject, authenticated=True, local=local) if session else None

    def authenticate(self, secret: str) -> Principal | None:
        if self._token is None:
            return None
        if hmac.compare_digest(secret.encode("utf-8", "replace"), self._token.encode("utf-8", "replace")):
            return Principal(self.ADMIN, authenticated=True)
        return None

    def session_for(self, principal: Principal) -> str:
        return self.sessions.issue(principal.name)

    def form_token(self, request: HTTPConnection) -> str | None:
        session = self.session(request)
        return session.csrf if session else None

    def can(self, principal: Principal | None, action: Action, resource: Resource) -> bool:
        if principal is None:
            return False
        if action is Action.VIEW:
            return True
        if self._token is not None:
            return principal.authenticated
        return principal.local


class PrincipalAuthorizer:
    """``TXLOG_AUTH=token``: sign in with a principal's token (``TXLOG_ADMIN_TOKEN`` is the principal
    ``admin``); viewing needs Describe on the cluster, aborting a transaction Alter on the cluster,
    as their HTTP APIs do. A session names the token it was opened with: revoking the principal ends
    it on every process within a second. Sessions are signed with a key kept in the database."""

    def __init__(self, acls: "AclAuthorizer", session_key: bytes) -> None:
        self._acls = acls
        self.sessions = SessionSigner(hmac.new(session_key, b"txlog admin principal session v1", hashlib.sha256).digest())

    @property
    def sign_in_required(self) -> bool:
        return True

    def session(self, request: HTTPConnection) -> Session | None:
        return self.sessions.read(request.cookies.get(SESSION_COOKIE))

    def principal_for(self, request: HTTPConnection) -> Principal | None:
        session = self.session(request)
        stored = self._acls.principal_by_token_id(session.subject) if session else None
        if stored is None:
            return None
        return Principal(stored.name, authenticated=True, local=is_loopback_connection(request), token_id=stored.token_id)

    def authenticate(self, secret: str) -> Principal | None:
        from app.errors import TxlogError

        try:
            stored = self._acls.authenticate(secret)
        except TxlogError:
            return None
        return Principal(stored.name, authenticated=True, token_id=stored.token_id)

    def session_for(self, principal: Principal) -> str:
        assert principal.token_id is not None
        return self.sessions.issue(principal.token_id)

    def form_token(self, request: HTTPConnection) -> str | None:
        session = self.session(request)
        return session.csrf if session else None

    def can(self, principal: Principal | None, action: Action, resource: Resource) -> bool:
        from app.domain.acl_bindings import Operation, ResourceType

        if principal is None or not principal.authenticated:
            return False
        operation = Operation.DESCRIBE if action is Action.VIEW else Operation.ALTER
        return self._acls.allowed(principal.name, operation, ResourceType.CLUSTER)
