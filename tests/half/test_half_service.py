"""Half messages over a real PostgreSQL with the services, and the checker against real HTTP
check-back endpoints: invisible until decided, committed exactly once whatever races, decided by
the check-back when the producer goes quiet, rolled back after max_checks when the endpoint is
down, slow or answers garbage — every check recorded."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import orjson
import psycopg
import pytest

from app.domain.half_messages import HalfState
from app.domain.partitioner import partition_for_key
from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import Broker, fetch, topics
from app.services import half_messages as hs
from app.storage.db import libpq_url
from tests.conftest import make_broker
from tests.half.endpoint import Endpoint, answer
from tests.support import free_port

TOPIC = "orders"
QUICK = {"half_check_timeout_ms": 300, "half_check_concurrency": 4}


@pytest.fixture
def b(db_url: str) -> Iterator[Broker]:
    broker = make_broker(db_url, **QUICK)
    topics.create_topic(broker, TOPIC, 3)
    yield broker
    broker.db.dispose()


@pytest.fixture
def checker() -> Iterator[tuple]:
    with hs.new_http_client() as http, ThreadPoolExecutor(4) as pool:
        yield http, pool


def send(b: Broker, group: str = "g", key: bytes | None = b"order-1", value: bytes = b"created", **kw) -> str:
    record = NewRecord(key, value, (("orderId", b"1"), ("trace", None)))
    return hs.send_half_message(b, group, TOPIC, kw.pop("partition", None), record, **kw).transaction_id


def committed(b: Broker, partition: int | None = None) -> list[tuple[int, bytes]]:
    out = []
    for p in range(3) if partition is None else [partition]:
        out += [(p, r.value) for r in fetch.fetch(b, TOPIC, p, 0, 1000, 10**7, "read_committed").records]
    return out


def sql(b: Broker, query: str, *params: object) -> list[tuple]:
    with psycopg.connect(libpq_url(b.db.url)) as conn:
        return conn.execute(query, params).fetchall()


def state_of(b: Broker, tid: str) -> HalfState:
    return hs.describe(b, tid).stored.msg.state


def run_checks(b: Broker, checker: tuple, rounds: int = 1) -> hs.CheckReport:
    total = hs.CheckReport()
    for _ in range(rounds):
        total.add(hs.check_round(b, *checker))
    return total


# --- the producer decides -------------------------------------------------------------------------


def test_a_half_message_is_invisible_until_committed_then_appended_exactly_once(b):
    tid = send(b)
    msg = hs.describe(b, tid).stored.msg
    assert msg.state is HalfState.PREPARED and msg.partition == partition_for_key(b"order-1", 3)
    # not in any partition: nothing to read, no high watermark moved, no last stable offset held back
    assert committed(b) == []
    assert sql(b, "SELECT sum(high_watermark), sum(last_stable_offset) FROM txlog.partition_status WHERE topic = %s", TOPIC) == [
        (0, 0)
    ]
    assert sql(b, "SELECT transaction_id, producer_group, check_count FROM txlog.pending_half_messages") == [(tid, "g", 0)]

    done = hs.commit(b, tid)
    assert (done.state, done.offset, done.decided_by.value) == (HalfState.COMMITTED, 0, "producer")
    assert committed(b) == [(msg.partition, b"created")]
    (record,) = fetch.fetch(b, TOPIC, msg.partition, 0, 10, 10**6, "read_committed").records
    assert (record.key, record.headers, record.timestamp_ms) == (
        b"order-1",
        (("orderId", b"1"), ("trace", None)),
        msg.created_at_ms,
    )

    again = hs.commit(b, tid)  # a lost answer, retried: the same outcome, nothing appended
    assert (again.state, again.offset) == (HalfState.COMMITTED, 0)
    assert committed(b) == [(msg.partition, b"created")]
    with pytest.raises(TxlogError) as e:
        hs.rollback(b, tid)
    assert e.value.code is ErrorCode.INVALID_TXN_STATE and "decided by producer" in e.value.message
    assert sql(b, "SELECT count(*) FROM txlog.pending_half_messages") == [(0,)]


def test_a_rolled_back_half_message_leaves_nothing_and_cannot_be_committed(b):
    tid = send(b)
    assert hs.rollback(b, tid).state is HalfState.ROLLED_BACK
    assert hs.rollback(b, tid).state is HalfState.ROLLED_BACK
    with pytest.raises(TxlogError) as e:
        hs.commit(b, tid)
    assert e.value.code is ErrorCode.INVALID_TXN_STATE
    assert committed(b) == []


def test_the_key_picks_the_partition_as_a_plain_produce_does_and_an_explicit_one_wins(b):
    for i in range(10):
        key = f"order-{i}".encode()
        assert hs.describe(b, send(b, key=key)).stored.msg.partition == partition_for_key(key, 3)
    assert hs.describe(b, send(b, partition=2)).stored.msg.partition == 2


def test_sends_are_refused_with_named_errors_and_a_producer_chosen_id_makes_a_retry_safe(b):
    for kwargs, code in [
        ({"topic": "nope", "partition": None}, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ({"topic": TOPIC, "partition": 3}, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]:
        with pytest.raises(TxlogError) as e:
            hs.send_half_message(b, "g", kwargs["topic"], kwargs["partition"], NewRecord(b"k", b"v"))
        assert e.value.code is code
    with pytest.raises(TxlogError) as e:
        hs.send_half_message(b, "g", TOPIC, 0, NewRecord(None, b"x" * (b.settings.max_request_bytes + 1)))
    assert e.value.code is ErrorCode.MESSAGE_TOO_LARGE
    for tid in ("TX-unknown",):
        for end in (hs.commit, hs.rollback):
            with pytest.raises(TxlogError) as e:
                end(b, tid)
            assert e.value.code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND

    first = send(b, transaction_id="TX-7")
    assert send(b, transaction_id="TX-7") == first  # the same message again: the same half message
    assert sql(b, "SELECT count(*) FROM txlog.half_messages") == [(1,)]
    with pytest.raises(TxlogError) as e:
        send(b, value=b"something else", transaction_id="TX-7")
    assert e.value.code is ErrorCode.INVALID_REQUEST


def test_racing_commits_and_rollbacks_take_one_decision_and_append_at_most_once(b):
    tids = [send(b, key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(12)]
    barrier = threading.Barrier(8)

    def race(worker: int) -> list[tuple[str, str]]:
        barrier.wait()
        out = []
        for tid in tids:
            end = hs.commit if worker % 2 == 0 else hs.rollback
            try:
                out.append((tid, end(b, tid).state.value))
            except TxlogError as exc:
                assert exc.code is ErrorCode.INVALID_TXN_STATE, exc
                out.append((tid, "refused:" + ("commit" if end is hs.commit else "rollback")))
        return out

    with ThreadPoolExecutor(8) as pool:
        answers = [a for result in pool.map(race, range(8)) for a in result]
    appended = sorted(v for _, v in committed(b))
    want = []
    for i, tid in enumerate(tids):
        final = state_of(b, tid)
        mine = [a for t, a in answers if t == tid]
        # every caller that asked for the decision taken was told it; every other one was refused
        assert sorted(mine) == sorted(
            [final.value] * 4 + ["refused:" + ("rollback" if final is HalfState.COMMITTED else "commit")] * 4
        )
        if final is HalfState.COMMITTED:
            want.append(f"v{i}".encode())
    assert appended == sorted(want)


# --- the check-back decides -----------------------------------------------------------------------


def register(b: Broker, endpoint: Endpoint | None, group: str = "g", max_checks: int = 3, interval_ms: int = 1) -> None:
    hs.register_producer_group(b, group, endpoint.url if endpoint else None, interval_ms, 0, max_checks)


@pytest.mark.parametrize("decision, state", [("COMMIT", HalfState.COMMITTED), ("ROLLBACK", HalfState.ROLLED_BACK)])
def test_a_producer_that_never_decides_is_decided_by_its_check_back(b, checker, decision, state):
    with Endpoint(answer(decision)) as endpoint:
        register(b, endpoint)
        tid = hs.send_half_message(
            b, "g", TOPIC, 1, NewRecord(b"\xff\x00", b"v", (("orderId", b"42"),)), encoding="base64"
        ).transaction_id
        report = run_checks(b, checker)
        assert (report.checked, report.committed, report.rolled_back) == (
            1,
            int(state is HalfState.COMMITTED),
            int(state is HalfState.ROLLED_BACK),
        )
        (call,) = endpoint.calls
    # the message itself, as checkLocalTransaction(MessageExt) receives it, in the producer's encoding
    assert call == {
        "transaction_id": tid,
        "producer_group": "g",
        "topic": TOPIC,
        "partition": 1,
        "encoding": "base64",
        "key": "/wA=",
        "value": "dg==",
        "headers": {"orderId": "42"},
        "header_list": [{"key": "orderId", "value": "NDI="}],
        "timestamp_ms": hs.describe(b, tid).stored.msg.created_at_ms,
        "check_count": 1,
    }
    d = hs.describe(b, tid)
    assert (d.stored.msg.state, d.stored.msg.decided_by.value) == (state, "check_back")
    assert [(c.check_no, c.answer, c.error) for c in d.checks] == [(1, decision, None)]
    assert committed(b) == ([(1, b"v")] if state is HalfState.COMMITTED else [])
    with pytest.raises(TxlogError):  # the producer's late opposite decision is refused
        (hs.rollback if state is HalfState.COMMITTED else hs.commit)(b, tid)


def test_unknown_answers_are_asked_again_until_max_checks_then_rolled_back_with_the_reason(b, checker):
    with Endpoint(answer("UNKNOWN")) as endpoint:
        register(b, endpoint, max_checks=3)
        tid = send(b)
        reports = [run_checks(b, checker) for _ in range(4)]
        assert len(endpoint.calls) == 3 and [c["check_count"] for c in endpoint.calls] == [1, 2, 3]
    assert [r.undecided for r in reports] == [1, 1, 0, 0] and reports[2].rolled_back == 1
    d = hs.describe(b, tid)
    assert (d.stored.msg.state, d.stored.msg.decided_by.value) == (HalfState.ROLLED_BACK, "max_checks")
    assert "no decision after 3 check-backs" in d.stored.msg.reason and "UNKNOWN" in d.stored.msg.reason
    assert [(c.check_no, c.answer) for c in d.checks] == [(1, "UNKNOWN"), (2, "UNKNOWN"), (3, "UNKNOWN")]
    assert committed(b) == []


GARBAGE = {
    "not json": lambda p: (200, b"<html>oops</html>", 0.0),
    "no state": lambda p: (200, orjson.dumps({"status": "COMMIT"}), 0.0),
    "unknown state": lambda p: (200, orjson.dumps({"state": "MAYBE"}), 0.0),
    "error status": lambda p: (500, b"boom", 0.0),
    "redirect": lambda p: (302, b"", 0.0),
    "too slow": lambda p: (200, orjson.dumps({"state": "COMMIT"}), 1.0),  # the checker waits 300 ms
}
PROBLEM = {
    "not json": "not JSON",
    "no state": "unreadable answer",
    "unknown state": "unreadable answer",
    "error status": "HTTP 500",
    "redirect": "HTTP 302",
    "too slow": "no answer within 300 ms",
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_an_endpoint_that_answers_garbage_or_too_late_is_retried_then_rolled_back(b, checker, kind):
    with Endpoint(GARBAGE[kind]) as endpoint:
        register(b, endpoint, max_checks=2)
        tid = send(b)
        run_checks(b, checker, rounds=3)
        assert len(endpoint.calls) == 2
    d = hs.describe(b, tid)
    assert (d.stored.msg.state, d.stored.msg.decided_by.value) == (HalfState.ROLLED_BACK, "max_checks")
    assert [c.answer for c in d.checks] == [None, None]
    assert all(PROBLEM[kind] in (c.error or "") for c in d.checks), d.checks
    assert PROBLEM[kind] in d.stored.msg.reason
    assert committed(b) == []


def test_an_endpoint_that_is_down_or_missing_or_not_allowed_is_recorded_and_bounded(b, checker):
    hs.register_producer_group(b, "down", f"http://127.0.0.1:{free_port()}/check", 1, 0, 2)
    register(b, None, group="none", max_checks=2)
    down, none = send(b, group="down"), send(b, group="none")
    # a URL stored while allowed, then refused by a narrower setting: never called
    hs.register_producer_group(b, "moved", "http://localhost:1/check", 1, 0, 2)
    moved = send(b, group="moved")
    narrow = make_broker(b.db.url, **QUICK, half_check_allowed_hosts="127.0.0.1")
    try:
        run_checks(narrow, checker, rounds=3)
    finally:
        narrow.db.dispose()
    for tid, problem in [(down, "ConnectError"), (none, "no check-back endpoint"), (moved, "check-back URL refused")]:
        d = hs.describe(b, tid)
        assert d.stored.msg.state is HalfState.ROLLED_BACK, tid
        assert [c.check_no for c in d.checks] == [1, 2] and all(problem in (c.error or "") for c in d.checks), d.checks


def test_check_back_urls_outside_the_allowed_hosts_are_refused(b):
    for url in ("http://10.1.2.3/check", "http://169.254.169.254/", "file:///etc/passwd", "http://example.com/x"):
        with pytest.raises(TxlogError) as e:
            hs.register_producer_group(b, "g", url)
        assert e.value.code is ErrorCode.INVALID_CONFIG
    wide = make_broker(b.db.url, half_check_allowed_hosts="10.0.0.0/8")
    try:
        g = hs.register_producer_group(wide, "g", "http://10.1.2.3/check")
    finally:
        wide.db.dispose()
    assert (g.check_url, g.check_interval_ms, g.check_immunity_ms, g.max_checks) == ("http://10.1.2.3/check", 60_000, 6_000, 15)
    assert hs.producer_group(b, "never-registered").updated_at_ms is None


def test_a_check_back_racing_the_producers_decision_never_appends_twice(b, checker):
    release = threading.Event()

    def slow_commit(payload: dict) -> tuple[int, bytes, float]:
        release.wait(5)
        return 200, orjson.dumps({"state": payload["value"]}), 0.0  # the value says what to answer

    b2 = make_broker(b.db.url, half_check_timeout_ms=10_000)
    try:
        with Endpoint(slow_commit) as endpoint:
            register(b, endpoint)
            agree = send(b, value=b"COMMIT")
            disagree = send(b, value=b"ROLLBACK")
            with hs.new_http_client() as http, ThreadPoolExecutor(2) as pool:
                with ThreadPoolExecutor(1) as bg:
                    round_ = bg.submit(hs.check_round, b2, http, pool)
                    while len(endpoint.calls) < 2:
                        threading.Event().wait(0.01)
                    # both are being asked; meanwhile their producers commit
                    assert hs.commit(b, agree).offset is not None
                    assert hs.commit(b, disagree).offset is not None
                    release.set()
                    round_.result()
    finally:
        b2.db.dispose()
    assert sorted(v for _, v in committed(b)) == [b"COMMIT", b"ROLLBACK"]
    for tid in (agree, disagree):
        d = hs.describe(b, tid)
        assert d.stored.msg.state is HalfState.COMMITTED and d.stored.msg.decided_by.value == "producer"
        assert d.checks[0].outcome == "ignored: already Committed"


def test_several_checkers_share_the_due_half_messages_and_ask_about_each_once(b):
    with Endpoint(answer("COMMIT")) as endpoint:
        register(b, endpoint, interval_ms=60_000)
        tids = [send(b, key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(24)]
        checkers = [make_broker(b.db.url, **QUICK) for _ in range(3)]
        barrier = threading.Barrier(3)

        def run(broker: Broker) -> int:
            barrier.wait()
            with hs.new_http_client() as http, ThreadPoolExecutor(4) as pool:
                n = 0
                while True:
                    r = hs.check_round(broker, http, pool, limit=4)
                    n += r.checked
                    if not r.checked:
                        return n

        try:
            with ThreadPoolExecutor(3) as pool:
                counts = list(pool.map(run, checkers))
        finally:
            for c in checkers:
                c.db.dispose()
        assert sum(counts) == 24
        assert sorted(c["transaction_id"] for c in endpoint.calls) == sorted(tids)  # each asked about once
    assert sorted(v for _, v in committed(b)) == sorted(f"v{i}".encode() for i in range(24))


def test_decided_half_messages_are_forgotten_after_the_retention(db_url):
    from tests.conftest import ManualClock

    clock = ManualClock()
    b = make_broker(db_url, clock, half_message_retention_ms=1000)
    try:
        topics.create_topic(b, TOPIC, 3)
        done, pending = send(b), send(b)
        hs.commit(b, done)
        clock.advance(1001)
        assert hs.forget_decided(b) == 1
        with pytest.raises(TxlogError) as e:
            hs.commit(b, done)
        assert e.value.code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        assert state_of(b, pending) is HalfState.PREPARED
    finally:
        b.db.dispose()
