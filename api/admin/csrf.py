"""Forged-form protection for the admin actions.

Every form carries a token in a hidden field; a POST is accepted only if it matches the token of
the visitor's session: the signed session's own token once signed in, else a random token kept in
an HttpOnly, SameSite=Strict cookie (so the sign-in form and token-less servers are covered too).
A POST whose ``Origin`` names another site is refused outright.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from app.errors import ErrorCode, TxlogError

CSRF_COOKIE = "txlog_admin_csrf"
CSRF_FIELD = "csrf_token"


def _session_token(request: Request) -> str | None:
    return request.app.state.authorizer.form_token(request)


def token_for(request: Request) -> str:
    """The token this visitor's forms must carry (creating the cookie's token if needed)."""
    token = _session_token(request)
    if token:
        return token
    cookie = request.cookies.get(CSRF_COOKIE)
    if cookie and 16 <= len(cookie) <= 128:
        return cookie
    new = getattr(request.state, "new_csrf", None)
    if new is None:
        new = request.state.new_csrf = secrets.token_urlsafe(24)
    return new


def set_cookie_if_new(request: Request, response: Response) -> None:
    new = getattr(request.state, "new_csrf", None)
    if new is not None:
        response.set_cookie(
            CSRF_COOKIE,
            new,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=request.scope.get("root_path") or "/",
        )


def check(request: Request, submitted: str | None) -> None:
    """Refuse a POST that does not carry the visitor's token or comes from another origin."""
    origin = request.headers.get("origin")
    if origin and origin != "null":
        host = request.headers.get("host", "")
        if urlsplit(origin).netloc != host:
            raise TxlogError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cross-site form submission refused")
    expected = _session_token(request) or request.cookies.get(CSRF_COOKIE)
    if not expected or not submitted or not hmac.compare_digest(expected.encode(), submitted.encode("utf-8", "replace")):
        raise TxlogError(
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "The form's anti-forgery token is missing or does not match your session: reload the page and try again",
            reason="csrf",
        )
