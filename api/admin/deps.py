"""What every admin route depends on: the broker, and a principal allowed to look."""

from __future__ import annotations

import re

from fastapi import Request

from api.admin.auth import CLUSTER, Action, Authorizer, Principal, Resource
from app.errors import ErrorCode, TxlogError
from app.services import Broker


class SignInRequired(Exception):
    """No principal: the visitor must sign in first."""


def broker(request: Request) -> Broker:
    return request.app.state.broker


def authorizer(request: Request) -> Authorizer:
    return request.app.state.authorizer


def viewer(request: Request) -> Principal:
    """The principal, allowed to view; a page dependency of every router but sign-in's."""
    auth: Authorizer = request.app.state.authorizer
    principal = auth.principal_for(request)
    request.state.principal = principal
    if principal is None:
        raise SignInRequired()
    if not auth.can(principal, Action.VIEW, CLUSTER):
        raise TxlogError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{principal.name} may not view the admin pages")
    return principal


def require(request: Request, principal: Principal, action: Action, resource: Resource) -> None:
    if not request.app.state.authorizer.can(principal, action, resource):
        if request.app.state.authorizer.sign_in_required:
            why = "Signed-in operators only (with TXLOG_AUTH=token: principals allowed to Alter the cluster)."
        else:
            why = (
                "Without TXLOG_ADMIN_TOKEN the admin pages are read-only, except for a browser on the "
                "server's own machine talking to a server bound to 127.0.0.1 or ::1. Set TXLOG_ADMIN_TOKEN "
                "and sign in, or use POST /v1/transactions/{tid}/abort."
            )
        raise TxlogError(
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            f"{principal.name} may not {action.value.replace('_', ' ')} {resource.name!r}. {why}",
        )


_DURATION = re.compile(r"^\s*(\d{1,9})\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1000}


def parse_duration_ms(text: str | None) -> int | None:
    """``90s``, ``5m``, ``2h``, ``1d``, ``250ms``; a bare number is seconds; empty is None."""
    if text is None or not text.strip():
        return None
    m = _DURATION.match(text)
    if not m:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Cannot read {text!r} as a duration: use e.g. 90s, 5m, 2h or 1d")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]
