"""Logs and transaction histories built in bulk with SQL (INSERT … SELECT generate_series), so that a
10^6-record log takes seconds rather than the minutes producing it over HTTP would.

A log is a run of transactions, each ``txn_size`` data records (16-byte keys, the 1 KiB values of
the benchmark's batches) followed by its COMMIT or ABORT marker; one transaction in ten aborts,
with its row in the aborted-transaction index. Transaction ``t`` belongs to producer
``t % producers`` at epoch ``t // producers`` (one epoch per transaction, as transactions V2), its
records carry the transaction's first offset and their log positions, and the partition's high
watermark and log position are moved to the end, as txlog itself writes them.

A history gives each producer of such a log the transactional id it would have had: the id's
producer id, its state (CompleteCommit or CompleteAbort after its last transaction) and every
event (Ongoing, Prepare*, Complete* per transaction), so the coordinator's tables hold what
``producers * transactions`` real transactions would have left.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psycopg

from app.config import load_settings
from app.domain.partitioner import coordinator_partition
from bench.lanes import KEY_BYTES, VALUE_BYTES, batch_values
from bench.postgres_lanes import PGMQ_QUEUE, PGQ_SCHEMA

RECORD_SIZE = KEY_BYTES + VALUE_BYTES  # a data record's size as txlog counts it (no headers)


@dataclass(frozen=True)
class LogShape:
    transactions: int
    txn_size: int  # data records per transaction, each transaction followed by its marker
    producers: int

    @property
    def offsets(self) -> int:
        return self.transactions * (self.txn_size + 1)


def _aborted(t: str, producers: int) -> str:
    """SQL: whether transaction ``t`` aborted — one in ten, spread over producers and epochs."""
    return f"(mod(({t}) / {producers} + mod({t}, {producers}), 10) = 9)"


def allocate_producer_ids(conn: psycopg.Connection, n: int) -> int:
    """Take ``n`` consecutive producer ids from txlog's sequence; answers the first."""
    (base,) = conn.execute("SELECT nextval('txlog.producer_id_seq')").fetchone()  # type: ignore[misc]
    conn.execute("SELECT setval('txlog.producer_id_seq', %s)", (base + n - 1,))
    return int(base)


def fill_log(conn: psycopg.Connection, topic: str, partition: int, shape: LogShape, base_pid: int) -> None:
    """Write ``shape`` into an empty partition of an existing topic."""
    g, s, p = shape.txn_size + 1, shape.txn_size, shape.producers
    t = f"(o / {g})"
    conn.execute(
        f"""
        INSERT INTO txlog.records (topic, partition, "offset", key, value, "timestamp", producer_id, producer_epoch,
                                   sequence, is_transactional, control_type, position, txn_first_offset)
        SELECT %(topic)s, %(partition)s, o,
               CASE WHEN mod(o, {g}) < {s} THEN convert_to(lpad(o::text, {KEY_BYTES}, '0'), 'UTF8') END,
               CASE WHEN mod(o, {g}) < {s} THEN (%(values)s::bytea[])[1 + mod(o, 100)] END,
               now(), {base_pid} + mod({t}, {p}), ({t} / {p})::smallint,
               CASE WHEN mod(o, {g}) < {s} THEN mod(o, {g})::int END,
               true,
               CASE WHEN mod(o, {g}) = {s} THEN (CASE WHEN {_aborted(t, p)} THEN 0 ELSE 1 END)::smallint END,
               {RECORD_SIZE} * (o - o / {g}),
               {t} * {g}
        FROM generate_series(0, {shape.offsets - 1}) AS o
        """,
        {"topic": topic, "partition": partition, "values": batch_values()},
    )
    conn.execute(
        f"""
        INSERT INTO txlog.aborted_txns (topic, partition, producer_id, producer_epoch, first_offset, last_offset)
        SELECT %(topic)s, %(partition)s, {base_pid} + mod(t, {p}), (t / {p})::smallint, t * {g}, t * {g} + {s}
        FROM generate_series(0, {shape.transactions - 1}) AS t
        WHERE {_aborted("t", p)}
        """,
        {"topic": topic, "partition": partition},
    )
    # Each producer's state on the partition: its last epoch, no transaction open.
    conn.execute(
        f"""
        INSERT INTO txlog.producer_partitions (topic, partition, producer_id, producer_epoch, batches, txn_first_offset,
                                               last_timestamp)
        SELECT %(topic)s, %(partition)s, {base_pid} + i, (({shape.transactions} - 1 - i) / {p})::smallint, '[]'::jsonb,
               NULL, now()
        FROM generate_series(0, {min(p, shape.transactions) - 1}) AS i
        """,
        {"topic": topic, "partition": partition},
    )
    cur = conn.execute(
        "UPDATE txlog.partitions SET next_offset = %s, next_position = %s WHERE topic = %s AND partition = %s",
        (shape.offsets, RECORD_SIZE * shape.transactions * s, topic, partition),
    )
    assert cur.rowcount == 1, f"no partition {topic}-{partition}"


def fill_history(conn: psycopg.Connection, prefix: str, topic: str, partition: int, shape: LogShape, base_pid: int) -> None:
    """The coordinator's side of ``shape`` (written by ``fill_log`` with the same ``base_pid``):
    transactional ids ``prefix0`` … with their producer ids, states and events."""
    p = shape.producers
    assert shape.transactions % p == 0, "every transactional id runs the same number of transactions"
    k = shape.transactions // p
    partitions = load_settings().transaction_state_partitions
    coordinators = [coordinator_partition(f"{prefix}{i}", partitions) for i in range(p)]
    params = {"prefix": prefix, "topic": topic, "partition": partition, "coordinators": coordinators}
    conn.execute(
        f"""
        INSERT INTO txlog.producer_ids (producer_id, transactional_id, created_at)
        SELECT {base_pid} + i, %(prefix)s || i, now() FROM generate_series(0, {p - 1}) AS i
        """,
        params,
    )
    last_aborted = _aborted(f"({k - 1}) * {p} + i", p)
    conn.execute(
        f"""
        INSERT INTO txlog.transactions (transactional_id, producer_id, producer_epoch, state, timeout_ms, version,
                                        started_at, updated_at, epoch_changed_at, deadline, last_producer_id,
                                        last_producer_epoch, last_result, fence_reason, coordinator, transaction_version)
        SELECT %(prefix)s || i, {base_pid} + i, {k}, CASE WHEN {last_aborted} THEN 'CompleteAbort' ELSE 'CompleteCommit' END,
               60000, {1 + 3 * k}, now(), now(), now(), NULL, {base_pid} + i, {k - 1},
               CASE WHEN {last_aborted} THEN 'abort' ELSE 'commit' END, NULL, (%(coordinators)s::int[])[i + 1], 2
        FROM generate_series(0, {p - 1}) AS i
        """,
        params,
    )
    conn.execute(
        f"""
        INSERT INTO txlog.transaction_partitions (transactional_id, topic, partition)
        SELECT %(prefix)s || i, %(topic)s, %(partition)s FROM generate_series(0, {p - 1}) AS i
        """,
        params,
    )
    # Per transaction (epoch e of id i): Ongoing (partition added), Prepare*, Complete* (next epoch).
    aborted, before = _aborted(f"e * {p} + i", p), _aborted(f"(e - 1) * {p} + i", p)
    conn.execute(
        f"""
        INSERT INTO txlog.transaction_events (transactional_id, version, from_state, to_state, producer_id, producer_epoch,
                                              timeout_ms, at, partitions_added, groups_added, last_producer_id,
                                              last_producer_epoch, result, reason, transaction_version)
        SELECT %(prefix)s || i, 1, NULL, 'Empty', {base_pid} + i, 0, 60000, now(), '[]'::jsonb, '[]'::jsonb,
               NULL, NULL, NULL, NULL, 2
        FROM generate_series(0, {p - 1}) AS i
        UNION ALL
        SELECT %(prefix)s || i, 2 + 3 * e + step,
               CASE step WHEN 0 THEN (CASE WHEN e = 0 THEN 'Empty' WHEN {before} THEN 'CompleteAbort' ELSE 'CompleteCommit' END)
                         WHEN 1 THEN 'Ongoing'
                         ELSE (CASE WHEN {aborted} THEN 'PrepareAbort' ELSE 'PrepareCommit' END) END,
               CASE step WHEN 0 THEN 'Ongoing'
                         WHEN 1 THEN (CASE WHEN {aborted} THEN 'PrepareAbort' ELSE 'PrepareCommit' END)
                         ELSE (CASE WHEN {aborted} THEN 'CompleteAbort' ELSE 'CompleteCommit' END) END,
               {base_pid} + i, (e + CASE WHEN step = 2 THEN 1 ELSE 0 END)::smallint, 60000, now(),
               CASE WHEN step = 0 THEN jsonb_build_array(jsonb_build_array(%(topic)s::text, %(partition)s::int))
                    ELSE '[]'::jsonb END,
               '[]'::jsonb,
               CASE WHEN step = 2 OR e > 0 THEN {base_pid} + i END,
               (CASE WHEN step = 2 THEN e WHEN e > 0 THEN e - 1 END)::smallint,
               CASE WHEN step = 2 THEN (CASE WHEN {aborted} THEN 'abort' ELSE 'commit' END) END,
               NULL, 2
        FROM generate_series(0, {p - 1}) AS i, generate_series(0, {k - 1}) AS e, generate_series(0, 2) AS step
        """,
        params,
    )


def vacuum(url: str) -> None:
    """Statistics for the planner, visibility maps for index-only scans, and a checkpoint, so that
    the bulk writes are not flushed in the middle of a measured window."""
    with psycopg.connect(url, autocommit=True) as conn:
        for table in (
            "records",
            "aborted_txns",
            "producer_partitions",
            "producer_ids",
            "transactions",
            "transaction_events",
            "transaction_partitions",
            "partitions",
        ):
            conn.execute(f"VACUUM ANALYZE txlog.{table}")
        conn.execute("CHECKPOINT")
    os.sync()  # and the operating system's dirty pages, or their writeback slows the first fsyncs measured


def window_target(rate: float, seconds: float, lanes: int, batch: int) -> int:
    """Enough work for a window of ``seconds`` (warm-up and window, and half a second of set-up)
    at ``rate`` records/s, and half again, and 20 batches per lane: what a queue is filled to
    before a dequeuing window, so that it never runs dry."""
    return int(rate * (seconds + 0.5) * 1.5) + 20 * batch * lanes


def fill_pgqueuer(url: str, entrypoint: str, target: int) -> None:
    """PgQueuer's queue of ``entrypoint`` topped up to ``target`` queued jobs (the benchmark's
    values as payloads), vacuumed."""
    with psycopg.connect(url, autocommit=True) as conn:
        (queued,) = conn.execute(
            f"SELECT count(*) FROM {PGQ_SCHEMA}.pgqueuer WHERE entrypoint = %s AND status = 'queued'", (entrypoint,)
        ).fetchone()  # type: ignore[misc]
        if queued < target:
            conn.execute(
                f"INSERT INTO {PGQ_SCHEMA}.pgqueuer (priority, entrypoint, payload, status) "
                "SELECT 0, %s, (%s::bytea[])[1 + mod(g, 100)], 'queued' FROM generate_series(1, %s) AS g",
                (entrypoint, batch_values(), target - queued),
            )
        conn.execute(f"VACUUM ANALYZE {PGQ_SCHEMA}.pgqueuer")


def fill_pgmq(url: str, target: int) -> None:
    """pgmq's queue topped up to ``target`` messages by ``pgmq.send_batch``, each the benchmark's
    1 KiB value as a JSON string (pgmq's messages are jsonb), vacuumed."""
    with psycopg.connect(url, autocommit=True) as conn:
        (queued,) = conn.execute(f"SELECT count(*) FROM pgmq.q_{PGMQ_QUEUE}").fetchone()  # type: ignore[misc]
        values = [v.decode() for v in batch_values()]
        left = target - queued
        while left > 0:
            n = min(left, 10_000)
            conn.execute(
                "SELECT count(*) FROM pgmq.send_batch(%s, ARRAY(SELECT to_jsonb((%s::text[])[1 + mod(g, 100)]) "
                "FROM generate_series(1, %s) AS g))",
                (PGMQ_QUEUE, values, n),
            )
            left -= n
        conn.execute(f"VACUUM ANALYZE pgmq.q_{PGMQ_QUEUE}")


def fill_share(url: str, topic: str, group: str, partitions: int, target: int) -> None:
    """Each of ``topic``'s partitions topped up to ``target / partitions`` records that ``group``
    has not yet passed (past its share partition's start offset, or the log start where the group
    never read): plain records (no producer id) appended at the partition's end, as the fetch
    logs are written, with the benchmark's keys and values. The share groups' state is vacuumed."""
    each = -(-target // partitions)
    with psycopg.connect(url) as conn:
        for p in range(partitions):
            next_offset, next_position = conn.execute(
                "SELECT next_offset, next_position FROM txlog.partitions WHERE topic = %s AND partition = %s FOR UPDATE",
                (topic, p),
            ).fetchone()  # type: ignore[misc]
            row = conn.execute(
                "SELECT start_offset FROM txlog.share_partitions WHERE group_id = %s AND topic = %s AND partition = %s",
                (group, topic, p),
            ).fetchone()
            n = each - (next_offset - (row[0] if row else 0))
            if n <= 0:
                conn.rollback()
                continue
            conn.execute(
                f"""
                INSERT INTO txlog.records (topic, partition, "offset", key, value, "timestamp", is_transactional, position)
                SELECT %(topic)s, %(partition)s, %(base)s + i,
                       convert_to(lpad(i::text, {KEY_BYTES}, '0'), 'UTF8'), (%(values)s::bytea[])[1 + mod(i, 100)],
                       now(), false, %(position)s + {RECORD_SIZE} * i
                FROM generate_series(0, %(n)s - 1) AS i
                """,
                {
                    "topic": topic,
                    "partition": p,
                    "base": next_offset,
                    "values": batch_values(),
                    "position": next_position,
                    "n": n,
                },
            )
            conn.execute(
                "UPDATE txlog.partitions SET next_offset = next_offset + %s, next_position = next_position + %s "
                "WHERE topic = %s AND partition = %s",
                (n, RECORD_SIZE * n, topic, p),
            )
            conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE txlog.share_partitions, txlog.share_in_flight, txlog.partitions")
