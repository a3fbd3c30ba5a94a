"""The baselines on PostgreSQL itself: the least a durable append and a page fetch cost (psycopg
straight to the tables), and the PostgreSQL queues PgQueuer and pgmq."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from bench.lanes import BATCH, PAGE, Lane, batch_keys, batch_values

PGQ_SCHEMA = "pgqueuer"
PGQ_ENQUEUE = "bench-enqueue"  # entrypoint of the enqueue workload (deleted after each window)
PGQ_DEQUEUE = "bench-dequeue"  # entrypoint of the pre-filled queue the dequeue workload drains
PGMQ_QUEUE = "bench_read"  # the pre-filled pgmq queue the read + delete workload drains

# --- PostgreSQL directly --------------------------------------------------------------------------

_RAW_LOCK = "SELECT next FROM public.bench_counter WHERE p = %b FOR UPDATE"
_RAW_ADVANCE = "UPDATE public.bench_counter SET next = next + %b WHERE p = %b"
_RAW_INSERT = (
    'INSERT INTO public.bench_raw (topic, partition, "offset", key, value, "timestamp") '
    "SELECT %b, %b, %b + u.o - 1, u.k, u.v, now() "
    "FROM unnest(%b::bytea[], %b::bytea[]) WITH ORDINALITY AS u(k, v, o)"
)
_RAW_PAGE = (
    'SELECT "offset", key, value, header_keys, header_values, "timestamp" FROM txlog.records '
    'WHERE topic = %b AND partition = %b AND "offset" >= %b ORDER BY "offset" LIMIT %b'
)


def create_raw_tables(conn: Any, partitions: int) -> None:
    """The raw append's table (like txlog.records) and its per-partition counter rows, made anew."""
    conn.execute("DROP TABLE IF EXISTS public.bench_raw, public.bench_counter")
    conn.execute("CREATE TABLE public.bench_raw (LIKE txlog.records INCLUDING ALL)")
    conn.execute("CREATE TABLE public.bench_counter (p int PRIMARY KEY, next bigint NOT NULL)")
    conn.execute("INSERT INTO public.bench_counter SELECT p, 0 FROM generate_series(0, %s) AS p", (partitions - 1,))


class RawAppendRunner:
    """The least a durable append at dense offsets costs: one transaction per batch that locks the
    partition's counter row, advances it and inserts the batch (binary parameters)."""

    def __init__(self, lane: Lane) -> None:
        import psycopg

        self.conn = psycopg.connect(lane.target)
        self.cur = self.conn.cursor()
        self.partition = lane.partition
        self.keys, self.values = batch_keys(), batch_values()
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0

    def step(self) -> int:
        cur = self.cur
        cur.execute(_RAW_LOCK, (self.partition,))
        (base,) = cur.fetchone()  # type: ignore[misc]
        cur.execute(_RAW_ADVANCE, (BATCH, self.partition))
        cur.execute(_RAW_INSERT, ("raw", self.partition, base, self.keys, self.values))
        self.conn.commit()
        return BATCH

    def close(self) -> None:
        self.conn.close()


class RawFetchRunner:
    """A page of the log by its primary key, binary results, no filtering at all."""

    def __init__(self, lane: Lane) -> None:
        import psycopg

        self.conn = psycopg.connect(lane.target, autocommit=True)
        self.cur = self.conn.cursor(binary=True)
        self.topic, self.partition, self.offset, self.end = lane.topic, lane.partition, lane.offset, lane.end
        self.latencies: list[tuple[float, float]] = []
        self.empty = 0

    def step(self) -> int:
        self.cur.execute(_RAW_PAGE, (self.topic, self.partition, self.offset, PAGE))
        rows = self.cur.fetchall()
        nxt = rows[-1][0] + 1 if len(rows) == PAGE else 0
        self.offset = 0 if self.end and nxt >= self.end else nxt
        return len(rows)

    def close(self) -> None:
        self.conn.close()


# --- PgQueuer -------------------------------------------------------------------------------------


def pgq_queries(conn: Any) -> Any:
    """PgQueuer's query layer on a psycopg async connection, its objects in their own schema."""
    from pgqueuer.adapters.drivers.psycopg import PsycopgDriver
    from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment, QueryQueueBuilder, QuerySchedulerBuilder
    from pgqueuer.adapters.persistence.queries import Queries
    from pgqueuer.domain.settings import DBSettings

    settings = DBSettings(db_schema=PGQ_SCHEMA)
    return Queries(
        PsycopgDriver(conn),
        qbe=QueryBuilderEnvironment(settings),
        qbq=QueryQueueBuilder(settings),
        qbs=QuerySchedulerBuilder(settings),
    )


class PgqRunner:
    """PgQueuer called in-process (its own asyncio loop in this lane's thread): ``enqueue`` of a batch,
    or ``dequeue`` of a batch followed by its ack (``log_jobs`` with status successful)."""

    def __init__(self, lane: Lane) -> None:
        import psycopg

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(psycopg.AsyncConnection.connect(lane.target, autocommit=True))
        self.q = pgq_queries(self.conn)
        self.dequeue = lane.kind == "pgq_dequeue"
        self.payloads: list[bytes | None] = list(batch_values())
        self.manager = uuid.uuid4()
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0

    def step(self) -> int:
        return self.loop.run_until_complete(self._dequeue_ack() if self.dequeue else self._enqueue())

    async def _enqueue(self) -> int:
        await self.q.enqueue([PGQ_ENQUEUE] * BATCH, self.payloads, [0] * BATCH)
        return BATCH

    async def _dequeue_ack(self) -> int:
        from pgqueuer.ports.repository import EntrypointExecutionParameter

        jobs = await self.q.dequeue(
            batch_size=BATCH,
            entrypoints={PGQ_DEQUEUE: EntrypointExecutionParameter(concurrency_limit=0)},
            queue_manager_id=self.manager,
            global_concurrency_limit=None,
            heartbeat_timeout=timedelta(seconds=60),
        )
        if not jobs:
            self.empty += 1
            return 0
        await self.q.log_jobs([(job, "successful", None) for job in jobs])
        return len(jobs)

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


# --- pgmq -----------------------------------------------------------------------------------------

_PGMQ_READ = "SELECT msg_id, read_ct, enqueued_at, vt, message FROM pgmq.read(%s, %s, %s)"
_PGMQ_DELETE = "SELECT count(*) FROM pgmq.delete(%s, %s::bigint[])"
PGMQ_VISIBILITY_S = 30  # a message read is invisible this long: share.record.lock.duration.ms's 30 s


class PgmqRunner:
    """pgmq (its SQL functions, installed from the ``pgmq`` package's bundled SQL) over psycopg:
    ``pgmq.read`` of a batch, invisible to other readers for 30 s, then ``pgmq.delete`` of their
    ids — two statements, each its own transaction, as a pgmq consumer does."""

    def __init__(self, lane: Lane) -> None:
        import psycopg

        self.conn = psycopg.connect(lane.target, autocommit=True)
        self.cur = self.conn.cursor(binary=True)
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0

    def step(self) -> int:
        self.cur.execute(_PGMQ_READ, (PGMQ_QUEUE, PGMQ_VISIBILITY_S, BATCH))
        ids = [row[0] for row in self.cur.fetchall()]
        if not ids:
            self.empty += 1
            return 0
        self.cur.execute(_PGMQ_DELETE, (PGMQ_QUEUE, ids))
        (deleted,) = self.cur.fetchone()  # type: ignore[misc]
        return int(deleted)

    def close(self) -> None:
        self.conn.close()
