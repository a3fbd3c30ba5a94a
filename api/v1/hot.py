"""The hottest routes of the v1 API served straight from ASGI: produce to a partition, produce to a
topic, EndTxn, fetch, and a share group's acquisition.

Each is answered by the very functions its FastAPI route calls (``routes.produce_batch``,
``routes.produce_plain``, ``routes.end_transaction``, ``routes.fetch_page``,
``share.acquire_records``), which run the
operation through the worker's executor (``app.services.executor``), after the route's own ACL
dependency, with errors answered by ``errors.response_for`` as the
application's exception handlers answer them. What is left out is FastAPI's per-request machinery: matching the request
against every route, solving the dependencies, and anyio's thread hand-off. Measured over HTTP,
that machinery was about a fifth of the server's CPU per produced batch (docs/benchmarks.md).

A request these routes cannot answer exactly as FastAPI would goes on to FastAPI, its body
replayed: an EndTxn or acquisition body that is not JSON of the route's model or a fetch parameter that is not a
plain decimal within its bounds or one of its words (FastAPI words the 422), EndTxn sent with
another content type, a fetch parameter given twice, a partition not in plain decimal. The routes
stay declared in FastAPI for the OpenAPI document, and answer any request that reaches them.

The middleware sits inside the request metrics and the body size limit, so both apply as to every
route; the request's ``route`` is the FastAPI route's, so the metrics label it the same.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal, get_args, get_origin
from urllib.parse import parse_qsl

import annotated_types
import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api import errors
from api.auth import requires
from api.limits import replaying
from api.v1 import routes, share, share_schemas
from api.v1 import schemas as s
from app.config import Settings

# A handler answers the request from its path parameters and body, running blocking work through
# ``run`` (a worker thread); None: FastAPI must answer it.
Run = Callable[..., Awaitable]
Handler = Callable[[Request, bytes, Run], Awaitable["Response | None"]]


async def _produce_batch(request: Request, raw: bytes, run: Run) -> Response:
    params = request.path_params
    return await routes.produce_batch(request, params["topic"], int(params["partition"]), raw)


async def _produce_plain(request: Request, raw: bytes, run: Run) -> Response:
    return await run(routes.produce_plain, request, request.path_params["topic"], raw)


async def _end_transaction(request: Request, raw: bytes, run: Run) -> Response | None:
    if request.headers.get("content-type") != "application/json":
        return None
    try:
        body = s.EndTxnBody.model_validate(orjson.loads(raw))
    except ValueError:  # not JSON, or not the model's: FastAPI's validation words the answer
        return None
    return await routes.end_transaction(request, request.path_params["tid"], body)


async def _share_acquire(request: Request, raw: bytes, run: Run) -> Response | None:
    if request.headers.get("content-type") != "application/json":
        return None
    try:
        body = share_schemas.AcquireBody.model_validate(orjson.loads(raw))
    except ValueError:  # not JSON, or not the model's: FastAPI's validation words the answer
        return None
    return await share.acquire_records(request, request.path_params["group"], body, run)


# A route's query parameters as ``_fetch_query`` checks them: (name, default, bounds of an integer
# or the words allowed), read from the route's own declaration, so they cannot differ from it.
QueryBounds = tuple[tuple[str, "int | str", "tuple[int, int] | tuple[str, ...]"], ...]


# Each hot route's query parameters, read from its declaration once (``_hot_routes``), by method and path.
_QUERY_BOUNDS: dict[tuple[str, str], QueryBounds] = {}


def query_bounds(route: APIRoute) -> QueryBounds:
    """The query parameters ``route`` declares: integers with their ``ge``/``le`` bounds, words
    with their ``Literal`` choices (anything else is not served here: an error names it)."""
    out = []
    for param in route.dependant.query_params:
        info = param.field_info
        choices = get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
        if choices:
            out.append((param.alias, info.default, tuple(choices)))
            continue
        low = next(m.ge for m in info.metadata if isinstance(m, annotated_types.Ge))
        high = next(m.le for m in info.metadata if isinstance(m, annotated_types.Le))
        if info.annotation is not int:
            raise TypeError(f"{route.path}: query parameter {param.alias} is neither a bounded int nor a Literal")
        out.append((param.alias, info.default, (low, high)))
    return tuple(out)


def _fetch_query(query_string: bytes, declared: QueryBounds) -> dict[str, int | str] | None:
    """The fetch parameters as the route would read them, or None where FastAPI must judge them."""
    given: dict[str, str] = {}
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if name in given:
            return None
        given[name] = value
    out: dict[str, int | str] = {}
    for name, default, allowed in declared:
        text = given.get(name)
        if text is None:
            out[name] = default
        elif isinstance(default, str):
            if text not in allowed:
                return None
            out[name] = text
        else:
            low, high = allowed
            if not _canonical_int(text) or not int(low) <= int(text) <= int(high):
                return None
            out[name] = int(text)
    return out


async def _fetch(request: Request, raw: bytes, run: Run) -> Response | None:
    query = _fetch_query(request.scope["query_string"], _QUERY_BOUNDS[("GET", request.scope["route"].path)])
    if query is None:
        return None
    params = request.path_params
    return await routes.fetch_page(request, params["topic"], int(params["partition"]), run=run, **query)  # type: ignore[arg-type]  # the query was read by the route's own bounds (query_bounds)


# (method, the FastAPI route's path, its handler)
HOT: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records", _fetch),
    ("POST", "/v1/topics/{topic}/partitions/{partition}/records", _produce_batch),
    ("POST", "/v1/topics/{topic}/records", _produce_plain),
    ("POST", "/v1/transactions/{tid}/end", _end_transaction),
    ("POST", "/v1/share-groups/{group}/acquire", _share_acquire),
)

# A partition as the route's ``int`` parameter reads it, and only so: anything else goes to FastAPI.
_PARTITION_DIGITS = 9
_METHODS = {method for method, _, _ in HOT}


@dataclass(frozen=True)
class _Hot:
    method: str
    route: APIRoute
    auth: requires
    handler: Handler


def _hot_routes() -> list[_Hot]:
    declared = [*routes.router.routes, *share.router.routes]
    by_key = {(m, r.path): r for r in declared if isinstance(r, APIRoute) for m in r.methods or ()}
    found = []
    for method, path, handler in HOT:
        route = by_key[(method, path)]
        _QUERY_BOUNDS[(method, path)] = query_bounds(route)
        (auth,) = [d.dependency for d in route.dependencies if isinstance(d.dependency, requires)]
        found.append(_Hot(method, route, auth, handler))
    return found


class HotRoutes:
    """ASGI middleware: ``HOT`` answered here, every other request passed on to ``app``."""

    def __init__(self, app: ASGIApp, executor: ThreadPoolExecutor) -> None:
        self.app = app
        self.routes = _hot_routes()
        self.executor = executor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in _METHODS and not scope.get("root_path"):
            for hot in self.routes:
                if hot.method != scope["method"]:
                    continue
                match = hot.route.path_regex.match(scope["path"])
                if match is not None:
                    params = match.groupdict()
                    if "partition" in params and not _canonical_int(params["partition"], _PARTITION_DIGITS):
                        break
                    await self._answer(hot, params, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _answer(self, hot: _Hot, params: dict[str, str], scope: Scope, receive: Receive, send: Send) -> None:
        raw = await _body(receive)
        if raw is None:  # the client went away
            return
        replay = replaying(raw, receive)
        scope["path_params"] = params
        scope["route"] = hot.route
        request = Request(scope, replay)
        response: Response | None
        try:
            await hot.auth(request)
            response = await hot.handler(request, raw, self._run)
        except Exception as exc:
            response = errors.response_for(request, exc)
        if response is None:
            await self.app(scope, replay, send)
        else:
            await response(scope, replay, send)

    def _run(self, fn: Callable, *args: Any) -> Awaitable:
        return asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


def executor(settings: Settings) -> ThreadPoolExecutor:
    """The hot routes' worker threads: as many as the database pool has connections (a request
    beyond them would only wait for one)."""
    return ThreadPoolExecutor(max_workers=settings.db_pool_size + settings.db_pool_max_overflow, thread_name_prefix="txlog-http")


def _canonical_int(text: str, digits: int = 19) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= digits and (text == "0" or text[0] != "0")


async def _body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
