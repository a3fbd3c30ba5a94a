"""The read side behind the admin pages (app.services.inspect) on a real database, with a clock the
tests move: record rates per minute, hanging-transaction alerts, the record browser's modes and
flags, paging, producer expiry, group lag, epoch history."""

from __future__ import annotations

import pytest

from app.domain.groups.offsets import GroupOffset
from app.domain.records import NewRecord
from app.domain.transactions import OPEN_STATE_NAMES, TxnState
from app.errors import ErrorCode, TxlogError
from app.services import Broker, groups, retention, topics, transaction_aborts, transactions
from app.services.inspect import groups as inspect_groups
from app.services.inspect.overview import overview
from app.services.inspect.producers import producers_page
from app.services.inspect.rates import RATE_BUCKETS
from app.services.inspect.topics import BROWSE_MODES, browse_partition, topic_detail
from app.services.inspect.transactions import LSO_HOLD_ALERT_MS, hanging_transactions, transaction_detail, transactions_page
from app.services.produce import ProduceRequest, produce
from tests.conftest import ManualClock

MINUTE = 60_000


def rec(key: str, ts: int | None = None) -> NewRecord:
    return NewRecord(key.encode(), f"value of {key}".encode(), (("h", b"1"),), ts)


class Txn:
    """A transactional producer driven through the services, as the HTTP API does."""

    def __init__(self, broker: Broker, tid: str, timeout_ms: int = 60_000) -> None:
        self.broker, self.tid = broker, tid
        got = transactions.init_producer_id(broker, tid, timeout_ms)
        self.pid, self.epoch = got.producer_id, got.producer_epoch
        self.seq: dict[tuple[str, int], int] = {}

    def send(self, topic: str, partition: int, *keys: str) -> None:
        seq = self.seq.get((topic, partition), 0)
        produce(self.broker, topic, partition, ProduceRequest([rec(k) for k in keys], self.pid, self.epoch, seq, self.tid))
        self.seq[(topic, partition)] = seq + len(keys)

    def end(self, result: str) -> None:
        out = transactions.end_txn(self.broker, self.tid, self.pid, self.epoch, result)  # type: ignore[arg-type]
        self.pid, self.epoch, self.seq = out.producer_id, out.producer_epoch, {}


def test_record_rate_counts_records_per_minute(clocked_broker: Broker, clock: ManualClock) -> None:
    b = clocked_broker
    clock.now_ms = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE + 30_000  # half past a minute
    topics.create_topic(b, "rate", 2)
    start = clock.now_ms
    # 3 records at t-10m, 5 at t-3m (two partitions), 2 now; and 4 older than the window.
    produce(b, "rate", 0, ProduceRequest([rec(f"old{i}", start - 40 * MINUTE) for i in range(4)]))
    produce(b, "rate", 0, ProduceRequest([rec(f"a{i}", start - 10 * MINUTE) for i in range(3)]))
    produce(b, "rate", 1, ProduceRequest([rec(f"b{i}", start - 3 * MINUTE) for i in range(2)]))
    produce(b, "rate", 0, ProduceRequest([rec(f"c{i}", start - 3 * MINUTE + 5_000) for i in range(3)]))
    produce(b, "rate", 1, ProduceRequest([rec("d0"), rec("d1")]))  # append time: now
    points = overview(b).rate
    assert len(points) == RATE_BUCKETS
    assert [p.end_ms - p.start_ms for p in points[:-1]] == [MINUTE] * (RATE_BUCKETS - 1)
    assert points[-1].end_ms == start and points[-1].end_ms - points[-1].start_ms == 30_000
    by_minute = {(start - p.start_ms) // MINUTE: p.records for p in points if p.records}
    assert by_minute == {10: 3, 3: 5, 0: 2}
    assert points[-1].per_second == pytest.approx(2 / 30)
    # Per partition too (the record browser's chart).
    page = browse_partition(b, "rate", 1)
    assert sum(p.records for p in page.rate) == 4


def test_record_rate_ignores_other_topics_and_empty_partitions(clocked_broker: Broker, clock: ManualClock) -> None:
    b = clocked_broker
    topics.create_topic(b, "busy", 1)
    topics.create_topic(b, "idle", 3)
    produce(b, "busy", 0, ProduceRequest([rec(str(i)) for i in range(7)]))
    assert sum(p.records for p in topic_detail(b, "busy").rate) == 7
    assert sum(p.records for p in topic_detail(b, "idle").rate) == 0
    clock.advance(20 * MINUTE)
    assert sum(p.records for p in overview(b).rate) == 0


def test_alerts_for_timed_out_and_lso_holding_transactions(clocked_broker: Broker, clock: ManualClock) -> None:
    b = clocked_broker
    topics.create_topic(b, "events", 2)
    short = Txn(b, "short", timeout_ms=5_000)
    short.send("events", 0, "s1")
    long = Txn(b, "long", timeout_ms=600_000)
    long.send("events", 1, "l1", "l2")
    produce(b, "events", 1, ProduceRequest([rec("after")]))
    assert overview(b).alerts == []

    clock.advance(6_000)  # past "short"'s timeout, "long" open for 6 s only
    alerts = overview(b).alerts
    assert [(a.transactional_id, a.reasons) for a in alerts] == [("short", ("timed_out",))]
    assert alerts[0].abortable and alerts[0].timeout_ms == 5_000

    clock.advance(LSO_HOLD_ALERT_MS)  # "long" now holds events-1's LSO for over a minute
    alerts = {a.transactional_id: a for a in overview(b).alerts}
    assert alerts["short"].reasons == ("timed_out", "holding_lso")
    assert alerts["long"].reasons == ("holding_lso",)
    held = alerts["long"].held[0]
    assert (held.topic, held.partition, held.last_stable_offset, held.high_watermark, held.waiting) == ("events", 1, 0, 3, 3)
    assert [a.transactional_id for a in hanging_transactions(b)] == ["short", "long"]

    transaction_aborts.abort_by_operator(b, "short")
    long.end("commit")
    assert overview(b).alerts == []


def test_overview_counts_and_topics(clocked_broker: Broker) -> None:
    b = clocked_broker
    topics.create_topic(b, "a", 2)
    topics.create_topic(b, "b", 1)
    t = Txn(b, "t1")
    t.send("a", 1, "x", "y")
    produce(b, "a", 1, ProduceRequest([rec("z")]))
    data = overview(b)
    assert [t.name for t in data.topics] == ["a", "b"]
    a = data.topics[0]
    assert (a.records, a.unstable, a.open_transactions, a.max_high_watermark) == (3, 3, 1, 3)
    assert data.state_counts["Ongoing"] == 1 and data.open_transactions == 1
    assert set(data.state_counts) == {s.value for s in TxnState}


def test_browse_modes_flag_control_aborted_and_open_records(clocked_broker: Broker) -> None:
    b = clocked_broker
    topics.create_topic(b, "log", 1)
    ok = Txn(b, "ok")
    ok.send("log", 0, "c1", "c2")
    ok.end("commit")  # offsets 0, 1, COMMIT at 2
    bad = Txn(b, "bad")
    bad.send("log", 0, "a1")
    bad.end("abort")  # offset 3, ABORT at 4
    produce(b, "log", 0, ProduceRequest([rec("plain")]))  # 5
    ok.send("log", 0, "o1")  # 6, open

    everything = browse_partition(b, "log", 0, "all")
    assert [r.offset for r in everything.records] == list(range(7))
    flags = {r.offset: (r.control_type, r.aborted, r.open) for r in everything.records}
    assert flags == {
        0: (None, False, False),
        1: (None, False, False),
        2: (1, False, False),
        3: (None, True, False),
        4: (0, True, False),
        5: (None, False, False),
        6: (None, False, True),
    }
    uncommitted = browse_partition(b, "log", 0, "read_uncommitted")
    assert [r.offset for r in uncommitted.records] == [0, 1, 3, 5, 6]
    committed = browse_partition(b, "log", 0, "read_committed")
    assert [r.offset for r in committed.records] == [0, 1, 5]
    assert committed.upper == 6 and everything.upper == 7

    with pytest.raises(TxlogError) as err:
        browse_partition(b, "log", 0, "sideways")  # type: ignore[arg-type]
    assert err.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(TxlogError) as err:
        browse_partition(b, "log", 9)
    assert err.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_browse_pages_forwards_backwards_and_clamps(clocked_broker: Broker) -> None:
    b = clocked_broker
    topics.create_topic(b, "pages", 1)
    produce(b, "pages", 0, ProduceRequest([rec(str(i)) for i in range(12)]))
    tail = browse_partition(b, "pages", 0, "all", limit=5)
    assert [r.offset for r in tail.records] == [7, 8, 9, 10, 11]
    assert (tail.older, tail.newer) == (7, None)
    older = browse_partition(b, "pages", 0, "all", before=tail.older, limit=5)
    assert [r.offset for r in older.records] == [2, 3, 4, 5, 6]
    first = browse_partition(b, "pages", 0, "all", offset=0, limit=5)
    assert [r.offset for r in first.records] == [0, 1, 2, 3, 4]
    assert (first.older, first.newer) == (None, 5)
    beyond = browse_partition(b, "pages", 0, "all", offset=10**12, limit=5)
    assert beyond.records == [] and beyond.older == 12


def test_transactions_page_filters_and_pages(clocked_broker: Broker, clock: ManualClock) -> None:
    b = clocked_broker
    topics.create_topic(b, "t", 1)
    for name in ("app-1", "app-2", "app-3", "other_1"):
        Txn(b, name).send("t", 0, name)
    done = Txn(b, "app-0")
    done.send("t", 0, "x")
    done.end("commit")
    page = transactions_page(b, limit=2)
    assert [t.transactional_id for t in page.transactions] == ["app-0", "app-1"] and page.next_after == "app-1"
    page = transactions_page(b, after=page.next_after, limit=2)
    assert [t.transactional_id for t in page.transactions] == ["app-2", "app-3"]
    page = transactions_page(b, after=page.next_after, limit=2)
    assert [t.transactional_id for t in page.transactions] == ["other_1"] and page.next_after is None
    assert [t.transactional_id for t in transactions_page(b, prefix="app-").transactions] == ["app-0", "app-1", "app-2", "app-3"]
    # "_" is a literal character in a prefix, not a LIKE wildcard
    assert [t.transactional_id for t in transactions_page(b, prefix="other_").transactions] == ["other_1"]
    assert transactions_page(b, prefix="other-").transactions == []
    opened = transactions_page(b, states=list(OPEN_STATE_NAMES))
    assert [t.transactional_id for t in opened.transactions] == ["app-1", "app-2", "app-3", "other_1"]
    assert transactions_page(b, states=["Ongoing"], older_than_ms=1_000).transactions == []
    clock.advance(2_000)
    assert len(transactions_page(b, states=["Ongoing"], older_than_ms=1_000).transactions) == 4
    with pytest.raises(TxlogError) as err:
        transactions_page(b, states=["Sleeping"])
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_transaction_detail_partitions_pending_offsets_and_epoch_history(clocked_broker: Broker) -> None:
    b = clocked_broker
    topics.create_topic(b, "in", 1)
    topics.create_topic(b, "out", 2)
    t = Txn(b, "ctp")
    t.send("out", 0, "r1")
    t.end("commit")
    t.send("out", 1, "r2", "r3")
    transactions.txn_offset_commit(b, "ctp", t.pid, t.epoch, "g1", [GroupOffset("in", 0, 5, "m")])
    produce(b, "out", 1, ProduceRequest([rec("later")]))

    d = transaction_detail(b, "ctp")
    assert d.meta.state is TxnState.ONGOING and d.deadline_ms == d.meta.started_at_ms + d.meta.timeout_ms
    assert [(p.topic, p.partition, p.first_offset, p.holds_lso) for p in d.partitions] == [("out", 1, 0, True)]
    assert d.pending_offsets == [{"group_id": "g1", "topic": "in", "partition": 0, "offset": 5, "metadata": "m"}]
    assert [(e.producer_epoch, e.cause) for e in d.epochs] == [(0, "InitProducerId (new id)"), (1, "after a commit")]
    assert d.total_events == d.meta.version == len(d.events)

    transaction_aborts.abort_by_operator(b, "ctp")
    d = transaction_detail(b, "ctp")
    assert d.meta.state is TxnState.COMPLETE_ABORT and d.pending_offsets == [] and d.alert is None
    assert d.partitions[0].first_offset is None and not d.partitions[0].holds_lso
    assert (d.epochs[-1].producer_epoch, d.epochs[-1].cause, d.epochs[-1].reason) == (2, "after an abort", "aborted_by_operator")
    assert len(transaction_detail(b, "ctp", events_limit=3).events) == 3

    with pytest.raises(TxlogError) as err:
        transaction_detail(b, "nobody")
    assert err.value.code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


def test_producers_page_expiry_open_transactions_and_paging(clocked_broker: Broker, clock: ManualClock) -> None:
    b = clocked_broker
    topics.create_topic(b, "p", 3)
    idem = transactions.init_producer_id(b, None)
    for partition in range(3):
        produce(b, "p", partition, ProduceRequest([rec("a"), rec("b")], idem.producer_id, 0, 0))
    appended = clock.now_ms
    t = Txn(b, "tx")
    t.send("p", 2, "c")

    page = producers_page(b, limit=2)
    assert [(e.topic, e.partition, e.producer_id) for e in page.entries] == [
        ("p", 0, idem.producer_id),
        ("p", 1, idem.producer_id),
    ]
    assert page.next_after == ("p", 1, idem.producer_id)
    rest = producers_page(b, after=page.next_after, limit=2)
    assert [(e.partition, e.producer_id) for e in rest.entries] == [(2, idem.producer_id), (2, t.pid)] and rest.next_after is None

    entry = page.entries[0]
    assert (entry.last_sequence, entry.last_offset, entry.batches, entry.transactional_id) == (1, 1, 1, None)
    assert entry.expires_at_ms == appended + b.settings.producer_id_expiration_ms
    open_ = producers_page(b, open_only=True)
    assert [(e.transactional_id, e.txn_first_offset, e.expires_at_ms) for e in open_.entries] == [("tx", 2, None)]
    mine = producers_page(b, producer_id=idem.producer_id, topic="p")
    assert [e.partition for e in mine.entries] == [0, 1, 2] and mine.next_after is None


def test_groups_lag_against_the_last_stable_offset(clocked_broker: Broker) -> None:
    b = clocked_broker
    topics.create_topic(b, "src", 2)
    produce(b, "src", 0, ProduceRequest([rec(str(i)) for i in range(10)]))
    produce(b, "src", 1, ProduceRequest([rec(str(i)) for i in range(4)]))
    groups.offset_commit(b, "readers", [GroupOffset("src", 0, 6, ""), GroupOffset("src", 1, 4, "")])
    t = Txn(b, "writer")
    t.send("src", 0, "open")  # offset 10: the LSO of src-0 stays at 10
    transactions.txn_offset_commit(b, "writer", t.pid, t.epoch, "readers", [GroupOffset("src", 1, 3, "")])
    produce(b, "src", 0, ProduceRequest([rec("after")]))

    (summary,) = inspect_groups.groups(b)
    assert (summary.group_id, summary.partitions, summary.lag, summary.pending_offsets, summary.pending_transactions) == (
        "readers",
        2,
        4,
        1,
        1,
    )
    detail = inspect_groups.group_detail(b, "readers")
    assert [(o.partition, o.offset, o.last_stable_offset, o.high_watermark, o.lag) for o in detail.offsets] == [
        (0, 6, 10, 12, 4),
        (1, 4, 4, 4, 0),
    ]
    assert [(p["partition"], p["offset"], p["transactional_id"]) for p in detail.pending] == [(1, 3, "writer")]
    assert inspect_groups.group_detail(b, "nobody").offsets == []


def test_every_read_is_served_by_an_index(clocked_broker: Broker, clock: ManualClock) -> None:
    """Run each page's reads, then EXPLAIN every statement with sequential scans discouraged: a
    statement that still scans a table sequentially has no index to use, and the logs and event
    histories (records, transaction_events) must only be read through index conditions, never
    walked whole. Only the partitions table (the cluster's metadata, one row per partition) may be
    read whole."""
    from sqlalchemy import event, text

    b = clocked_broker
    topics.create_topic(b, "ix", 2)
    t = Txn(b, "ix-txn")
    t.send("ix", 0, "a", "b")
    transactions.txn_offset_commit(b, "ix-txn", t.pid, t.epoch, "g", [GroupOffset("ix", 1, 0, "")])
    groups.offset_commit(b, "g2", [GroupOffset("ix", 0, 1, "")])
    statements: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append((statement, parameters))

    event.listen(b.db.engine, "before_cursor_execute", capture)
    try:
        overview(b)
        topic_detail(b, "ix")
        for mode in BROWSE_MODES:
            browse_partition(b, "ix", 0, mode)
            browse_partition(b, "ix", 0, mode, offset=1)
            browse_partition(b, "ix", 0, mode, before=1)
        transactions_page(b, ["Ongoing"], 1000, "ix-", "a")
        transaction_detail(b, "ix-txn")
        producers_page(b, ("ix", 0, 0), 10, "ix", True)
        producers_page(b, producer_id=t.pid)
        inspect_groups.groups(b)
        inspect_groups.group_detail(b, "g")
        retention.log_sizes(b)  # every partition's, as DescribeLogDirs asks with null topics
    finally:
        event.remove(b.db.engine, "before_cursor_execute", capture)
    reads = [(s, p) for s, p in statements if s.lstrip().upper().startswith(("SELECT", "WITH", "("))]
    assert len(reads) > 20
    with b.db.engine.connect() as conn:
        conn.execute(text("SET enable_seqscan = off"))
        for statement, params in reads:
            plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, params).scalar_one()  # type: ignore[arg-type]
            bad = [n for n in _plan_nodes(plan[0]["Plan"]) if _walks_a_table(n)]
            assert not bad, f"{statement}\n{bad}"


def _plan_nodes(node: dict) -> list[dict]:
    return [node] + [n for child in node.get("Plans", []) for n in _plan_nodes(child)]


def _walks_a_table(node: dict) -> bool:
    relation = node.get("Relation Name")
    if relation is None or relation == "partitions":
        return False
    if node["Node Type"] == "Seq Scan":
        return True
    unbounded = relation in ("records", "transaction_events")
    return unbounded and node["Node Type"] in ("Index Scan", "Index Only Scan") and "Index Cond" not in node
