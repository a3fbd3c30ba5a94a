"""Authentication and authorization of the HTTP API, with ``TXLOG_AUTH=token``.

Every ``/v1`` route depends on ``requires(Api.X)``: it authenticates the request's
``Authorization: Bearer`` token and, when the checks ``Api.X`` needs (``app.domain.acls.REQUIRED``)
read only path parameters, checks them. Routes whose resources are named in the body call
``authorize(request, Api.X, names)`` once they have read it. With ``TXLOG_AUTH=none`` both return at
once: no principal, no check, no cost.

``create_app`` refuses to build an application with a ``/v1`` route that does not depend on
``requires`` (``assert_every_route_secured``)."""

from __future__ import annotations

from typing import Mapping, Sequence, TypeVar

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute

from app.domain.acls import Api, names_needed
from app.services.security import Authorizer

NAMES_FROM_PATH = {"topic": "topic", "group": "group", "tid": "transactional_id"}

Item = TypeVar("Item")


def authorizer(request: Request) -> Authorizer | None:
    return request.app.state.authorizer


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class requires:
    """The dependency of a route answering ``api``."""

    def __init__(self, api: Api, names_in_body: bool = False) -> None:
        """``names_in_body``: the route reads names its checks need from the body, and calls
        ``authorize`` itself; this dependency only authenticates."""
        self.api = api
        self.from_path = not names_in_body
        if not names_in_body and not names_needed(api) <= set(NAMES_FROM_PATH.values()):
            raise ValueError(f"{api.value} needs names a path does not give")

    async def __call__(self, request: Request) -> None:
        auth: Authorizer | None = request.app.state.authorizer
        if auth is None:
            return
        token = bearer(request)
        principal = auth.principal_if_known(token) if token else None
        if principal is None:
            # The first request with a token in this process: its scrypt check, off the event loop.
            principal = await run_in_threadpool(auth.authenticate, token)
        request.state.principal = principal.name
        if self.from_path:
            names = {NAMES_FROM_PATH[k]: v for k, v in request.path_params.items() if k in NAMES_FROM_PATH}
            auth.check(principal.name, self.api, names)


def principal_of(request: Request) -> str | None:
    """The request's authenticated principal; None without authentication."""
    return getattr(request.state, "principal", None)


def authorize(request: Request, api: Api, names: Mapping[str, str | Sequence[str] | None]) -> None:
    """Check ``api``'s ACLs for the request's principal with names read from its body."""
    auth: Authorizer | None = request.app.state.authorizer
    if auth is not None:
        auth.check(request.state.principal, api, names)


def visible(request: Request, api: Api, items: Sequence[Item], name_of) -> list[Item]:
    """The items of a list answer the principal may see (all of them without auth)."""
    auth: Authorizer | None = request.app.state.authorizer
    if auth is None:
        return list(items)
    principal = request.state.principal
    return [i for i in items if auth.visible(principal, api, name_of(i))]


def active(request: Request) -> bool:
    return request.app.state.authorizer is not None


def assert_every_route_secured(routers: Sequence[APIRouter]) -> None:
    for router in routers:
        for route in router.routes:
            if isinstance(route, APIRoute) and not any(isinstance(d.call, requires) for d in route.dependant.dependencies):
                raise RuntimeError(f"{sorted(route.methods or ())} {route.path} has no ACL requirement (api.auth.requires)")
