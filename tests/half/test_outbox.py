"""The in-database outbox over a real PostgreSQL: applications call ``txlog.send`` inside their own
transactions (psycopg, and the SQLAlchemy helper), the drainer moves committed rows into the log.
A rollback leaves no trace; committed rows appear exactly once, in the order the docs promise,
under concurrent applications and drainers; a long application transaction holds up nobody."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from app.domain.partitioner import murmur2, partition_for_key
from app.domain.records import NewRecord
from app.services import Broker, fetch, outbox, produce, topics
from app.storage.db import libpq_url
from tests.conftest import make_broker
from txlog import outbox as helper

TOPIC = "events"


@pytest.fixture
def b(db_url: str) -> Iterator[Broker]:
    broker = make_broker(db_url, db_lock_timeout_ms=1000)
    topics.create_topic(broker, TOPIC, 3)
    yield broker
    broker.db.dispose()


def app_conn(b: Broker) -> psycopg.Connection:
    return psycopg.connect(libpq_url(b.db.url))


def log(b: Broker, partition: int) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) for r in fetch.fetch(b, TOPIC, partition, 0, 100_000, 10**8, "read_committed").records]


def test_murmur2_in_sql_is_kafkas_and_txlog_send_partitions_as_the_http_api(b):
    rng = random.Random(7)
    keys = [b"", b"a", b"ab", b"abc", b"abcd", b"\xff" * 7, "clé".encode()] + [
        rng.randbytes(rng.randrange(0, 40)) for _ in range(300)
    ]
    with app_conn(b) as conn:
        got = conn.execute("SELECT txlog.murmur2(k) FROM unnest(%s::bytea[]) AS k", (keys,)).fetchall()
        assert [g for (g,) in got] == [murmur2(k) for k in keys]
        # Kafka's own test vectors (Utils.murmur2 in UtilsTest)
        assert conn.execute("SELECT txlog.murmur2('21'::bytea), txlog.murmur2('foobar'::bytea)").fetchone() == (
            -973932308,
            -790332482,
        )
        for k in keys[:60]:
            conn.execute("SELECT txlog.send(%s, %s, 'v')", (TOPIC, k))
        rows = conn.execute("SELECT key, partition FROM txlog.outbox ORDER BY id").fetchall()
        conn.rollback()
    assert [p for _, p in rows] == [partition_for_key(k, 3) for k in keys[:60]]


def test_an_application_rollback_leaves_no_trace(b):
    with app_conn(b) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (1)")
        conn.execute("SELECT txlog.send(%s, 'k', 'never')", (TOPIC,))
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM txlog.outbox").fetchone() == (0,)
    assert outbox.drain(b).appended == 0
    assert [log(b, p) for p in range(3)] == [[], [], []]
    assert outbox.backlog(b) == []


def test_committed_rows_are_appended_once_with_their_headers_and_send_time_then_deleted(b):
    with app_conn(b) as conn:
        ids = [
            conn.execute("SELECT txlog.send(%s, 'k', 'v1', %s::jsonb)", (TOPIC, '{"b": "2", "a": null}')).fetchone()[0],
            conn.execute(
                "SELECT txlog.send(%s, NULL, 'v2', %s::jsonb, 2)",
                (TOPIC, '[{"key": "x", "value": "1"}, {"key": "x", "value": null}]'),
            ).fetchone()[0],
        ]
        sent_at = conn.execute("SELECT (extract(epoch FROM created_at) * 1000)::bigint FROM txlog.outbox ORDER BY id").fetchall()
        conn.commit()
    assert ids[0] < ids[1]
    (backlog_row,) = [x for x in outbox.backlog(b) if x.partition == 2] or [None]
    assert backlog_row is not None and backlog_row.rows >= 1
    assert outbox.drain(b).appended == 2
    assert outbox.drain(b).appended == 0  # nothing twice
    k_partition = partition_for_key(b"k", 3)
    r1 = fetch.fetch(b, TOPIC, k_partition, 0, 10, 10**6, "read_committed").records
    r2 = fetch.fetch(b, TOPIC, 2, 0, 10, 10**6, "read_committed").records
    first = next(r for r in r1 if r.value == b"v1")
    assert first.headers == (("a", None), ("b", b"2")) and first.timestamp_ms == sent_at[0][0]
    assert [r.headers for r in r2 if r.value == b"v2"] == [(("x", b"1"), ("x", None))]
    with app_conn(b) as conn:
        assert conn.execute("SELECT count(*) FROM txlog.outbox").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM txlog.outbox_backlog").fetchone() == (0,)


@pytest.mark.parametrize(
    "call, code",
    [
        ("SELECT txlog.send('nope', 'k', 'v')", "UNKNOWN_TOPIC_OR_PARTITION"),
        (f"SELECT txlog.send('{TOPIC}', 'k', 'v', NULL, 3)", "UNKNOWN_TOPIC_OR_PARTITION"),
        (f"SELECT txlog.send('{TOPIC}', 'k', 'v', NULL, -1)", "UNKNOWN_TOPIC_OR_PARTITION"),
        (f"SELECT txlog.send('{TOPIC}', 'k', 'v', '{{\"a\": 1}}')", "INVALID_RECORD"),
        (f"SELECT txlog.send('{TOPIC}', 'k', 'v', '[1]')", "INVALID_RECORD"),
        (f"SELECT txlog.send('{TOPIC}', 'k', 'v', '\"x\"')", "INVALID_RECORD"),
        ("SELECT txlog.send(NULL, 'k', 'v')", "INVALID_TOPIC_EXCEPTION"),
    ],
)
def test_txlog_send_refuses_what_the_api_refuses_with_the_same_names(b, call, code):
    with app_conn(b) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
            conn.execute(call)
    assert str(e.value).startswith(code)


def test_the_sqlalchemy_helper_sends_inside_the_session_transaction(b):
    engine = sa.create_engine(b.db.engine.url)
    try:
        with engine.begin() as conn:
            assert helper.send(conn, TOPIC, b"k1", b"one", headers={"h": "v"}) > 0
            helper.send(conn, TOPIC, None, "two", partition=1)
        with pytest.raises(RuntimeError), engine.begin() as conn:
            helper.send(conn, TOPIC, b"k1", b"rolled back")
            raise RuntimeError("the application fails")
        from sqlalchemy.orm import Session

        with Session(engine) as session, session.begin():
            helper.send(session, TOPIC, b"k1", b"three")
    finally:
        engine.dispose()
    outbox.drain(b)
    assert [v for _, v in log(b, partition_for_key(b"k1", 3))] == [b"one", b"three"]
    assert [v for _, v in log(b, 1)] == [b"two"]


def test_a_long_application_transaction_holds_up_no_producer_of_its_partition(b):
    """The drainer and plain producers append to partition 0 while an application transaction that
    sent to it stays open; its record follows once it commits. The broker's lock timeout is 1 s: a
    wait for a lock the open transaction held would fail these appends."""
    slow = app_conn(b)
    slow.execute("SELECT txlog.send(%s, NULL, 'slow', NULL, 0)", (TOPIC,))  # open, not committed
    with app_conn(b) as fast:
        fast.execute("SELECT txlog.send(%s, NULL, 'fast', NULL, 0)", (TOPIC,))
        fast.commit()
    assert outbox.drain(b).appended == 1
    produce.produce(b, TOPIC, 0, produce.ProduceRequest([NewRecord(None, b"plain")]))
    topics_status = topics.describe_topic(b, TOPIC)[0]
    assert topics_status.last_stable_offset == topics_status.high_watermark == 2  # nothing held back
    assert [v for _, v in log(b, 0)] == [b"fast", b"plain"]
    slow.commit()
    slow.close()
    outbox.drain(b)
    assert [v for _, v in log(b, 0)] == [b"fast", b"plain", b"slow"]


def test_concurrent_applications_and_drainers_append_each_committed_row_once_in_order(b):
    """Eight applications, each running transactions of one to four sends over the three
    partitions, a third of them rolled back, while three drainers drain. Checked: exactly the rows
    of committed transactions, each once; rows of one transaction in the order sent; and a
    transaction that committed before another began comes first on every partition."""
    n_apps, per_app = 8, 25
    stop = threading.Event()
    commits: list[tuple[float, float, str, list[tuple[int, bytes]]]] = []  # (began, committed, txn, rows)
    lock = threading.Lock()
    clock = threading.Lock()
    ticks = iter(range(10**9))

    def tick() -> int:
        with clock:
            return next(ticks)

    def application(app: int) -> None:
        rng = random.Random(app)
        with app_conn(b) as conn:
            for t in range(per_app):
                txn = f"a{app}t{t}"
                began = tick()
                conn.execute("SELECT 1")  # the transaction has begun
                rows = []
                for i in range(rng.randint(1, 4)):
                    p = rng.randrange(3)
                    value = f"{txn}r{i}".encode()
                    conn.execute("SELECT txlog.send(%s, NULL, %s, NULL, %s)", (TOPIC, value, p))
                    rows.append((p, value))
                if rng.random() < 0.33:
                    conn.rollback()
                    continue
                conn.commit()
                done = tick()
                with lock:
                    commits.append((began, done, txn, rows))

    def drainer() -> None:
        broker = make_broker(b.db.url, outbox_batch_records=7)
        try:
            while not stop.is_set():
                outbox.drain(broker)
            outbox.drain(broker)
        finally:
            broker.db.dispose()

    with ThreadPoolExecutor(3) as drainers:
        futures = [drainers.submit(drainer) for _ in range(3)]
        with ThreadPoolExecutor(n_apps) as apps:
            list(apps.map(application, range(n_apps)))
        stop.set()
        for f in futures:
            f.result()
    outbox.drain(b)

    position = {}
    for p in range(3):
        values = [v for _, v in log(b, p)]
        assert len(values) == len(set(values)), "a row appended twice"
        position.update({v: (p, i) for i, v in enumerate(values)})
    expected = {v for _, _, _, rows in commits for _, v in rows}
    assert set(position) == expected  # every committed row, no rolled-back one
    for _, _, _, rows in commits:  # rows of one transaction keep their order on each partition
        for p in range(3):
            mine = [position[v][1] for q, v in rows if q == p]
            assert mine == sorted(mine)
    for _began_a, done_a, _, rows_a in commits:  # committed before the other began: comes first
        for began_b, _, _, rows_b in commits:
            if done_a < began_b:
                for p in range(3):
                    last_a = max((position[v][1] for q, v in rows_a if q == p), default=None)
                    first_b = min((position[v][1] for q, v in rows_b if q == p), default=None)
                    if last_a is not None and first_b is not None:
                        assert last_a < first_b
    with app_conn(b) as conn:
        assert conn.execute("SELECT count(*) FROM txlog.outbox").fetchone() == (0,)
