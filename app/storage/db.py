"""Connections, transactions and the one place database failures become Kafka-named errors."""

from __future__ import annotations

import contextlib
from typing import Iterator

import sqlalchemy as sa
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


def create_engine(url: str, pool_size: int = 10, max_overflow: int = 20) -> Engine:
    return sa.create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=10,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"connect_timeout": 5, "application_name": "txlog"},
    )


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
