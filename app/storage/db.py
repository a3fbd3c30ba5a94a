"""Connections, transactions and the one place database failures become Kafka-named errors."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterator
from urllib.parse import unquote

import psycopg
import psycopg._queries
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from app.errors import DatabaseUnavailable, ErrorCode, TxlogError

# psycopg parses a statement for its placeholders once and keeps the result, but only for
# statements of at most MAX_CACHED_STATEMENT_LENGTH bytes (4096) and MAX_CACHED_STATEMENT_PARAMS
# parameters (50), a guard against ORM-generated statements of many shapes; any other is parsed
# again at every execution. txlog's statements are a fixed few, and the conditional append, which
# every optimistic produce sends, is longer (parsed each time, it was 5% of a Kafka gateway's
# produce time), as is the transitions' statement planned ahead (a transaction's first batch on a
# partition, its end), which carries the append's and the transitions' in one and has more
# parameters (parsed each time, it was 0.1 ms of a one-batch transaction's 1.2 ms of Python).
psycopg._queries.MAX_CACHED_STATEMENT_LENGTH = max(psycopg._queries.MAX_CACHED_STATEMENT_LENGTH, 16384)
psycopg._queries.MAX_CACHED_STATEMENT_PARAMS = max(psycopg._queries.MAX_CACHED_STATEMENT_PARAMS, 128)


def _url_parts(url: str) -> tuple[str, str, str, str]:
    """``(userinfo@, hosts, /path, query)`` of a PostgreSQL URL in either style, scheme dropped."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            rest = url[len(prefix) :]
            break
    else:
        raise ValueError(f"not a PostgreSQL URL: {url!r}")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, hosts = netloc.rpartition("@")
    path, _, query = tail.partition("?")
    return userinfo + at, hosts, path, query


def sqlalchemy_url(url: str) -> str:
    """Any PostgreSQL URL (libpq style or SQLAlchemy style) as SQLAlchemy + psycopg 3 wants it.
    libpq's multi-host form (``user@h1:p1,h2:p2/db?target_session_attrs=read-write``, hosts tried
    in order) becomes SQLAlchemy's (``user@/db?host=h1:p1&host=h2:p2&…``)."""
    user, hosts, path, query = _url_parts(url)
    if "," in hosts:
        query = "&".join([*(f"host={h}" for h in hosts.split(",")), *([query] if query else [])])
        hosts, path = "", path or "/"
    return f"postgresql+psycopg://{user}{hosts}{path}" + (f"?{query}" if query else "")


def libpq_url(url: str) -> str:
    """The same URL for psql / psycopg: ``postgresql://…``, several hosts in libpq's form."""
    user, hosts, path, query = _url_parts(url)
    params = query.split("&") if query else []
    given = [unquote(p[len("host=") :]) for p in params if p.startswith("host=")]
    if not hosts and len(given) > 1 and not any(h.startswith("/") for h in given):
        hosts = ",".join(given)
        params = [p for p in params if not p.startswith("host=")]
    return f"postgresql://{user}{hosts}{path}" + (f"?{'&'.join(params)}" if params else "")


IDLE_PING_SECONDS = 1.0

log = logging.getLogger("txlog.db")


@dataclass(frozen=True)
class SessionLimits:
    """What PostgreSQL enforces on each of txlog's sessions so that a process that stops mid-request
    (and keeps its sessions and row locks) cannot hold the others up for long: its idle
    transaction is ended by the server, lock waits and long statements end with a retriable error,
    and TCP keepalives (both ways) and a user timeout notice a peer that is gone. Zero disables a
    timeout."""

    lock_timeout_ms: int = 5_000
    statement_timeout_ms: int = 30_000
    idle_in_transaction_timeout_ms: int = 10_000
    keepalives_idle_s: int = 10
    keepalives_interval_s: int = 5
    keepalives_count: int = 3
    tcp_user_timeout_ms: int = 30_000

    @classmethod
    def from_settings(cls, settings) -> "SessionLimits":
        return cls(
            settings.db_lock_timeout_ms,
            settings.db_statement_timeout_ms,
            settings.db_idle_in_transaction_timeout_ms,
            settings.db_keepalives_idle_s,
            settings.db_keepalives_interval_s,
            settings.db_keepalives_count,
            settings.db_tcp_user_timeout_ms,
        )

    def connect_args(self) -> dict[str, object]:
        server = {
            "lock_timeout": self.lock_timeout_ms,
            "statement_timeout": self.statement_timeout_ms,
            "idle_in_transaction_session_timeout": self.idle_in_transaction_timeout_ms,
            # the server's side of the same connection
            "tcp_keepalives_idle": self.keepalives_idle_s,
            "tcp_keepalives_interval": self.keepalives_interval_s,
            "tcp_keepalives_count": self.keepalives_count,
            "tcp_user_timeout": self.tcp_user_timeout_ms,
        }
        return {
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle_s,
            "keepalives_interval": self.keepalives_interval_s,
            "keepalives_count": self.keepalives_count,
            "tcp_user_timeout": self.tcp_user_timeout_ms,
            "options": " ".join(f"-c {k}={v}" for k, v in server.items()),
        }


def create_engine(
    url: str,
    pool_size: int = 10,
    max_overflow: int = 20,
    limits: SessionLimits | None = SessionLimits(),
    pool_timeout_ms: int = 10_000,
) -> Engine:
    """An engine whose sessions carry ``limits`` (none for migrations, which may run long). A
    request finding all ``pool_size + max_overflow`` connections in use waits ``pool_timeout_ms``
    for one, then fails REQUEST_TIMED_OUT (``translate_errors``)."""
    connect_args: dict[str, object] = {"connect_timeout": 5, "application_name": "txlog"}
    if limits is not None:
        connect_args.update(limits.connect_args())
    engine = sa.create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout_ms / 1000,
        pool_recycle=1800,
        connect_args=connect_args,
    )
    _ping_idle_connections(engine)
    return engine


def _ping_idle_connections(engine: Engine) -> None:
    """Check a pooled connection before use only when it sat idle for a while (the database may
    have restarted meanwhile). A busy pool pays no extra round trip per request; a connection
    found dead is replaced transparently; a disconnect seen mid-request invalidates the whole pool."""

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_conn, record) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn, record, proxy) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_SECONDS:
            return
        try:
            dbapi_conn.execute("SELECT 1")
            dbapi_conn.rollback()
        except Exception as exc:
            raise sa_exc.DisconnectionError(str(exc)) from exc


_UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)

# SQLSTATEs and SQLSTATE classes as Kafka-named errors. A lock wait or statement past its limit
# is a retriable timeout (the row is held by a stuck or slow session); a serialization failure or
# deadlock a retriable conflict; a duplicate key a race with a concurrent request; bad data a
# client error.
_BY_SQLSTATE = {
    "55P03": ErrorCode.REQUEST_TIMED_OUT,  # lock_not_available (lock_timeout)
    "57014": ErrorCode.REQUEST_TIMED_OUT,  # query_canceled (statement_timeout)
    "40001": ErrorCode.CONCURRENT_TRANSACTIONS,  # serialization_failure
    "40P01": ErrorCode.CONCURRENT_TRANSACTIONS,  # deadlock_detected
    "23505": ErrorCode.CONCURRENT_TRANSACTIONS,  # unique_violation: a concurrent request won
}
_BY_SQLSTATE_CLASS = {
    "21": ErrorCode.INVALID_REQUEST,  # cardinality_violation
    "22": ErrorCode.INVALID_REQUEST,  # data_exception
    "23": ErrorCode.INVALID_REQUEST,  # integrity_constraint_violation
    "42": ErrorCode.INVALID_REQUEST,  # syntax_error_or_access_rule_violation (e.g. a name too long)
    "54": ErrorCode.INVALID_REQUEST,  # program_limit_exceeded
}


def _sqlstate(exc: sa_exc.DBAPIError | psycopg.Error) -> str | None:
    orig = exc if isinstance(exc, psycopg.Error) else getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None)


def error_for(exc: sa_exc.DBAPIError | psycopg.Error) -> TxlogError | None:
    """The Kafka-named error for a database failure (raised through SQLAlchemy, or by psycopg on a
    hot path that uses the driver directly), ``None`` for one txlog does not expect."""
    state = _sqlstate(exc)
    code = _BY_SQLSTATE.get(state or "") or _BY_SQLSTATE_CLASS.get((state or "")[:2])
    if code is ErrorCode.REQUEST_TIMED_OUT:
        return TxlogError(code, f"The database did not answer in time: {_first_line(exc)} (retriable)")
    if code is not None:
        return TxlogError(code, f"Rejected by the database: {_first_line(exc)}")
    if isinstance(exc, (sa_exc.DataError, sa_exc.IntegrityError, psycopg.DataError, psycopg.IntegrityError)):
        return TxlogError(ErrorCode.INVALID_REQUEST, f"Rejected by the database: {_first_line(exc)}")
    if isinstance(exc, (*_UNAVAILABLE, psycopg.OperationalError, psycopg.InterfaceError)) or getattr(
        exc, "connection_invalidated", False
    ):
        return DatabaseUnavailable(f"Database unavailable: {_first_line(exc)}")
    return None


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """psycopg/SQLAlchemy failures → TxlogError (see ``error_for``)."""
    try:
        yield
    except TxlogError:
        raise
    except (sa_exc.DBAPIError, psycopg.Error) as exc:
        err = error_for(exc)
        if err is None:
            raise
        raise err from exc
    except sa_exc.TimeoutError as exc:  # the pool's: every connection in use past TXLOG_DB_POOL_TIMEOUT_MS
        raise TxlogError(
            ErrorCode.REQUEST_TIMED_OUT,
            "Every database connection of this process is in use and none was freed in time "
            "(TXLOG_DB_POOL_SIZE, TXLOG_DB_POOL_MAX_OVERFLOW, TXLOG_DB_POOL_TIMEOUT_MS); retriable",
        ) from exc
    except UnicodeEncodeError as exc:  # psycopg cannot send text holding a lone surrogate
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Text is not valid Unicode: {exc.reason} at position {exc.start}") from exc


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__


def driver(conn: Connection) -> psycopg.Connection:
    """The psycopg connection under a SQLAlchemy one, in the same database transaction: for hot
    paths that send binary parameters, read binary results or build rows without SQLAlchemy.
    Its failures are translated by ``translate_errors`` as SQLAlchemy's are."""
    return conn.connection.driver_connection  # type: ignore[return-value]  # psycopg's connection under SQLAlchemy's: untyped there


class Database:
    """The engine plus transaction scopes. Services open their own transactions: each protocol step
    that must be durable before the next is one ``transaction()``."""

    def __init__(
        self,
        url: str,
        pool_size: int = 10,
        max_overflow: int = 20,
        limits: SessionLimits | None = SessionLimits(),
        pool_timeout_ms: int = 10_000,
    ) -> None:
        self.url = url
        self.engine = create_engine(url, pool_size, max_overflow, limits, pool_timeout_ms)

    @classmethod
    def from_settings(cls, settings) -> "Database":
        """A server process's database: ``settings.database_url`` with its pool and session limits."""
        return cls(
            settings.database_url,
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_pool_max_overflow,
            limits=SessionLimits.from_settings(settings),
            pool_timeout_ms=settings.db_pool_timeout_ms,
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        with translate_errors():
            with self.engine.begin() as conn:
                yield conn

    @contextlib.contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """A connection in autocommit: each statement is a database transaction of its own,
        committed before its answer comes back (no BEGIN or COMMIT round trips)."""
        with translate_errors():
            with self.engine.connect() as conn:
                yield conn.execution_options(isolation_level="AUTOCOMMIT")

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


class LoopConnections:
    """Connections in autocommit for single statements awaited on an event loop (appends,
    AddPartitionsToTxn and EndTxn planned ahead, in an HTTP worker or the Kafka gateway), so that
    such a statement needs no thread. Their sessions carry the engine's limits. At most ``size``
    are open; ``connection()`` gives None when all are in use (the caller goes its thread's way
    instead of waiting). A connection idle for IDLE_PING_SECONDS is checked before use (the
    database may have restarted), and one that failed is closed, never reused. Failures are
    translated as the engine's are (``translate_errors``). Belongs to the loop that uses it."""

    def __init__(self, url: str, size: int, limits: SessionLimits | None = SessionLimits()) -> None:
        self.url = libpq_url(url)
        self.size = size
        self.connect_args: dict[str, object] = {"connect_timeout": 5, "application_name": "txlog", "autocommit": True}
        if limits is not None:
            self.connect_args.update(limits.connect_args())
        self._idle: list[tuple[psycopg.AsyncConnection, float]] = []
        self._in_use = 0

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection | None]:
        if not self._idle and self._in_use >= self.size:
            yield None
            return
        self._in_use += 1
        conn: psycopg.AsyncConnection | None = None
        try:
            with translate_errors():
                conn = await self._checked_out()
                yield conn
        except BaseException:
            if conn is not None:
                await conn.close()
            raise
        finally:
            self._in_use -= 1
        if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await conn.close()
        else:
            self._idle.append((conn, time.monotonic()))

    async def _checked_out(self) -> psycopg.AsyncConnection:
        while self._idle:
            conn, since = self._idle.pop()
            if time.monotonic() - since < IDLE_PING_SECONDS:
                return conn
            try:
                await conn.execute("SELECT 1")
                return conn
            except psycopg.Error:
                await conn.close()
        return await psycopg.AsyncConnection.connect(self.url, **self.connect_args)  # type: ignore[arg-type]  # connect's keyword arguments are libpq's, typed loosely

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            await conn.close()


class DatabaseClock:
    """The database server's clock, in epoch milliseconds: every host that serves one database
    reads the same time, whatever its own clock says, so deadlines and expiry agree across hosts.
    Read with one query every ``resync_s`` seconds and carried forward in between with this
    process's monotonic clock (no round trip per call). It never goes backwards: when the
    database's clock steps back, this one waits for it. While the database is away it keeps
    counting from its last reading; before a first reading there is no time to tell, and asking is
    COORDINATOR_NOT_AVAILABLE, as any request of the database would be."""

    def __init__(
        self, db: "Database", resync_s: float = 10.0, retry_s: float = 1.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.db = db
        self.resync_s = resync_s
        self.retry_s = retry_s
        self._monotonic = monotonic
        self._lock = threading.Lock()  # guards the reading
        self._sync_lock = threading.Lock()  # one thread asks the database at a time, outside ``_lock``
        self._base_ms: int | None = None  # the database's time at monotonic ``_base_mono``
        self._base_mono = 0.0
        self._next_sync = 0.0
        self._last_ms = 0
        self._failure: str | None = None  # why the last reading failed

    def __call__(self) -> int:
        if self._monotonic() >= self._next_sync:
            self._sync()
        now = self._carried()
        if now is None:
            raise TxlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"Cannot read the database's clock: {self._failure}")
        return now

    def without_waiting(self) -> int | None:
        """The time as ``__call__`` tells it, or None where telling it would ask the database first
        (a reading is due): for an event loop, which must not wait on the database."""
        return None if self._monotonic() >= self._next_sync else self._carried()

    def _carried(self) -> int | None:
        with self._lock:
            if self._base_ms is None:
                return None
            now = self._base_ms + int((self._monotonic() - self._base_mono) * 1000)
            self._last_ms = max(now, self._last_ms)
            return self._last_ms

    def _sync(self) -> None:
        """Read the database's clock. While another thread is at it, the last reading serves;
        only without one does a caller wait for it."""
        if not self._sync_lock.acquire(blocking=self._base_ms is None):
            return
        try:
            if self._monotonic() < self._next_sync:  # read meanwhile by the thread we waited for
                return
            try:
                before = self._monotonic()
                db_ms = self.read_database_ms()
                after = self._monotonic()
            except Exception as exc:  # the database is away: keep counting, try again soon
                if self._failure is None:
                    log.warning("cannot read the database clock (%s); trying again every %s s", _first_line(exc), self.retry_s)
                self._failure = _first_line(exc)
                self._next_sync = self._monotonic() + self.retry_s
                return
            with self._lock:
                self._base_ms, self._base_mono = db_ms, (before + after) / 2
            self._failure = None
            self._next_sync = after + self.resync_s
        finally:
            self._sync_lock.release()

    def read_database_ms(self) -> int:
        """One reading of the database server's clock (``clock_timestamp()``, not the start of a
        transaction)."""
        with self.db.engine.connect() as conn:
            db_ms = conn.execute(sa.text("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")).scalar_one()
            conn.rollback()
        return int(db_ms)
