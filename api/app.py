"""The FastAPI application: v1 API, health, metrics, docs; admin pages mounted under /admin."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import Depends, FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi_offline import FastAPIOffline

from api import errors
from api.admin import mount as mount_admin
from api.auth import assert_every_route_secured, requires
from api.limits import MaxBodySize
from api.metrics import RequestMetrics, metrics_response
from api.notify import AppendNotifier
from api.v1 import hot
from api.v1 import operator as v1_operator
from api.v1.half_messages import router as half_messages_router
from api.v1.responses import errors as error_responses
from api.v1.routes import add_body_schemas
from api.v1.routes import router as v1_router
from api.v1.security import router as security_router
from api.v1.share import router as share_router
from app import memory
from app.config import Settings, load_settings
from app.domain.acls import Api
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.services import fetch as fetch_service
from app.services import quotas as quota_service
from app.services.executor import LoopExecutor
from app.services.half_messages import CheckerThread
from app.services.outbox import DrainerThread
from app.services.security import Authorizer, ensure_admin_principal
from app.services.sweeper import SweeperThread
from app.storage import migrate
from app.storage.db import Database, LoopConnections, SessionLimits

log = logging.getLogger("txlog")


def _in_threads(threads: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    return asyncio.get_running_loop().run_in_executor(threads, functools.partial(fn, *args))


def create_app(settings: Settings | None = None, run_sweeper: bool = True) -> FastAPI:
    settings = settings or load_settings()
    if not settings.database_url:
        raise RuntimeError("TXLOG_DATABASE_URL is not set (txlog serve sets it)")
    database_url = settings.database_url
    db = Database.from_settings(settings)
    broker = Broker(db, settings)
    hot_threads = hot.executor(settings)
    head = migrate.head_revision(settings.database_url)
    # TXLOG_AUTH=token: every request names a principal by its token; its ACLs decide. The admin
    # token, if set, is the principal "admin" with All on every resource.
    authorizer: Authorizer | None = None
    if settings.auth == "token":
        if settings.admin_token:
            ensure_admin_principal(db, settings.admin_token)
        authorizer = Authorizer(db)
        authorizer.refresh()
    # Client quotas, the same budgets as the Kafka gateway's.
    quotas = quota_service.manager_from_settings(broker)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        notifier = AppendNotifier(database_url, functools.partial(fetch_service.listen, broker))
        notifier.start()
        app.state.notifier = notifier
        # Statements planned ahead (appends, EndTxn) are awaited on this worker's loop, on its own connections.
        loop_executor.connections = LoopConnections(database_url, settings.db_pool_size, SessionLimits.from_settings(settings))
        if authorizer is not None:
            authorizer.start()
        quotas.start()
        memory.settle()
        sweeper = SweeperThread(broker) if run_sweeper else None
        if sweeper:
            sweeper.start()
        # Half messages' check-backs and the outbox's drain run beside the sweeper, in every worker.
        background: list[CheckerThread | DrainerThread] = [CheckerThread(broker), DrainerThread(broker)] if run_sweeper else []
        for thread in background:
            thread.start()
        try:
            yield
        finally:
            if sweeper:
                sweeper.stop()
            for thread in background:
                thread.stop()
            await notifier.stop()
            connections, loop_executor.connections = loop_executor.connections, None
            if connections is not None:
                await connections.close()
            hot_threads.shutdown(wait=False)
            if authorizer is not None:
                authorizer.stop()
            quotas.stop()
            db.dispose()

    # The API docs (/docs, /redoc) serve Swagger UI and ReDoc from the installed package: no CDN.
    app = FastAPIOffline(
        title="txlog",
        version="0.1.0",
        description="Kafka's exactly-once machinery on PostgreSQL: idempotent producers, transactions, "
        "transaction markers and read_committed reads.",
        lifespan=lifespan,
    )
    app.state.broker = broker
    app.state.settings = settings
    # Where operations run (``app.services.executor``): blocking steps in the hot routes' threads;
    # statements on the worker's own connections once the lifespan starts, in those threads until then.
    loop_executor = LoopExecutor(broker, None, functools.partial(_in_threads, hot_threads))
    app.state.loop_executor = loop_executor
    app.state.authorizer = authorizer
    app.state.quotas = quotas
    errors.install(app)
    v1_routers = [v1_router, half_messages_router, v1_operator.router, security_router, share_router]
    assert_every_route_secured(v1_routers)
    for router in v1_routers:
        app.include_router(router)

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses=error_responses())
    async def readyz() -> Response:
        def check() -> str | None:
            with db.read() as conn:
                return migrate.current_revision(conn)

        try:
            current = await run_in_threadpool(check)
        except TxlogError as exc:
            return errors.error_response(exc)
        if current != head:
            return errors.error_response(
                TxlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"Schema at {current}, expected {head}: run `txlog migrate`")
            )
        return JSONResponse({"status": "ready", "schema": current})

    # With TXLOG_AUTH=token the metrics (topic names among them) need Describe on the cluster.
    @app.get(
        "/metrics",
        tags=["ops"],
        response_class=PlainTextResponse,
        responses=error_responses(),
        dependencies=[Depends(requires(Api.DESCRIBE_CLUSTER))],
    )
    def metrics() -> Response:
        return metrics_response()

    mount_admin(app, broker)

    default_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = add_body_schemas(default_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customize the schema

    # Innermost first: the hot routes (produce, EndTxn, fetch) under the body size limit and the
    # request metrics.
    app.add_middleware(hot.HotRoutes, executor=hot_threads)
    app.add_middleware(MaxBodySize, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequestMetrics)
    return app


def app_factory() -> FastAPI:
    """Entry point for uvicorn workers (``--factory``): settings come from the environment."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return create_app()
