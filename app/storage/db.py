"""Connections, transactions and the one place database failures become Kafka-named errors."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from app.errors import ErrorCode, TxlogError


def sqlalchemy_url(url: str) -> str:
    """Any PostgreSQL URL (libpq style or SQLAlchemy style) as SQLAlchemy + psycopg 3 wants it."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError(f"not a PostgreSQL URL: {url!r}")


def libpq_url(url: str) -> str:
    """The same URL for psql / psycopg: ``postgresql://…``."""
    return "postgresql://" + sqlalchemy_url(url)[len("postgresql+psycopg://"):]


IDLE_PING_SECONDS = 1.0


def create_engine(url: str, pool_size: int = 10, max_overflow: int = 20) -> Engine:
    engine = sa.create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=10,
        pool_recycle=1800,
        connect_args={"connect_timeout": 5, "application_name": "txlog"},
    )
    _ping_idle_connections(engine)
    return engine


def _ping_idle_connections(engine: Engine) -> None:
    """Check a pooled connection before use only when it sat idle for a while (the database may
    have restarted meanwhile). A busy pool pays no extra round trip per request; a connection
    found dead is replaced transparently; a disconnect seen mid-request invalidates the whole pool."""

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_conn, record) -> None:  # type: ignore[no-untyped-def]
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn, record, proxy) -> None:  # type: ignore[no-untyped-def]
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_SECONDS:
            return
        try:
            dbapi_conn.execute("SELECT 1")
            dbapi_conn.rollback()
        except Exception as exc:
            raise sa_exc.DisconnectionError(str(exc)) from exc


_UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """psycopg/SQLAlchemy failures → TxlogError. A lost or refused connection is the coordinator
    being unavailable (retriable); bad data the database refused is an invalid request."""
    try:
        yield
    except TxlogError:
        raise
    except sa_exc.DBAPIError as exc:
        if isinstance(exc, _UNAVAILABLE) or exc.connection_invalidated:
            raise TxlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"Database unavailable: {_first_line(exc)}") from exc
        if isinstance(exc, sa_exc.DataError):
            raise TxlogError(ErrorCode.INVALID_REQUEST, f"Rejected by the database: {_first_line(exc)}") from exc
        raise
    except sa_exc.TimeoutError as exc:
        raise TxlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "Timed out waiting for a database connection") from exc
    except UnicodeEncodeError as exc:  # psycopg cannot send text holding a lone surrogate
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Text is not valid Unicode: {exc.reason} at position {exc.start}") from exc


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__


class Database:
    """The engine plus transaction scopes. Services open their own transactions: each protocol step
    that must be durable before the next is one ``transaction()``."""

    def __init__(self, url: str, pool_size: int = 10, max_overflow: int = 20) -> None:
        self.url = url
        self.engine = create_engine(url, pool_size, max_overflow)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        with translate_errors():
            with self.engine.begin() as conn:
                yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction at REPEATABLE READ: one snapshot for every statement in it."""
        with translate_errors():
            with self.engine.connect() as conn:
                conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
                with conn.begin():
                    yield conn

    def dispose(self) -> None:
        self.engine.dispose()
