"""The half-message state machine, decisions, check counting and check-back URLs, without a database."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.domain import half_messages as hm
from app.domain.half_messages import (
    BadAnswer,
    Check,
    CheckChannel,
    Contradicted,
    Decided,
    DecidedBy,
    Deliver,
    GiveUp,
    HalfMessage,
    HalfState,
    ProducerGroup,
    Repeated,
)
from app.domain.half_messages import LocalTransactionState as L
from app.errors import ErrorCode, TxlogError

T0 = 1_700_000_000_000
GROUP = ProducerGroup("orders", "http://127.0.0.1:9/check", check_interval_ms=1000, check_immunity_ms=500, max_checks=3)


def prepared(check_count: int = 0, next_check: int | None = T0 + 500) -> HalfMessage:
    return HalfMessage("TX1", "orders", "t", 0, HalfState.PREPARED, check_count, T0, next_check)


def decided(state: HalfState, by: DecidedBy = DecidedBy.PRODUCER, reason: str | None = None) -> HalfMessage:
    d = hm.decide(prepared(), state, by, T0 + 10, reason)
    assert isinstance(d, Decided)
    return d.applied(prepared(), 7 if state is HalfState.COMMITTED else None)


def test_only_prepared_moves_and_decided_states_are_final():
    for frm in HalfState:
        for to in HalfState:
            allowed = frm is HalfState.PREPARED and to.is_decided
            if allowed:
                hm.check_transition(frm, to)
            else:
                with pytest.raises(TxlogError) as e:
                    hm.check_transition(frm, to)
                assert e.value.code is ErrorCode.INVALID_TXN_STATE


def test_first_decision_is_taken_and_applied():
    d = hm.decide(prepared(), HalfState.COMMITTED, DecidedBy.PRODUCER, T0 + 10)
    assert d == Decided(HalfState.COMMITTED, DecidedBy.PRODUCER, T0 + 10)
    m = d.applied(prepared(), offset=42)
    assert (m.state, m.offset, m.decided_at_ms, m.decided_by, m.next_check_at_ms) == (
        HalfState.COMMITTED,
        42,
        T0 + 10,
        DecidedBy.PRODUCER,
        None,
    )


@pytest.mark.parametrize("state", [HalfState.COMMITTED, HalfState.ROLLED_BACK])
def test_the_same_decision_again_is_a_repeat_whoever_takes_it(state):
    m = decided(state)
    for by in DecidedBy:
        assert hm.decide(m, state, by, T0 + 99) == Repeated(m)


def test_the_opposite_decision_is_refused_naming_who_decided_and_why():
    m = decided(HalfState.ROLLED_BACK, DecidedBy.MAX_CHECKS, "no decision after 3 check-backs")
    d = hm.decide(m, HalfState.COMMITTED, DecidedBy.PRODUCER, T0 + 99)
    assert isinstance(d, Contradicted)
    err = d.error()
    assert err.code is ErrorCode.INVALID_TXN_STATE
    assert "RolledBack" in err.message and "max-checks" in err.message and "no decision after 3" in err.message
    assert err.details == {"state": "RolledBack", "decided_by": "max_checks"}
    with pytest.raises(ValueError):
        hm.decide(prepared(), HalfState.PREPARED, DecidedBy.PRODUCER, T0)


def test_immunity_then_checks_every_interval_and_give_up_after_max_checks():
    assert hm.first_check_at(T0, GROUP) == T0 + 500
    assert hm.claim(prepared(), GROUP, T0 + 499) is None  # not yet due
    assert hm.claim(prepared(), GROUP, T0 + 500) == Check(1, T0 + 1500)
    assert hm.claim(prepared(check_count=2, next_check=T0 + 2500), GROUP, T0 + 2600) == Check(3, T0 + 3600)
    # a check whose checker died left the count at max_checks without recording a decision
    give_up = hm.claim(prepared(check_count=3, next_check=T0 + 3600), GROUP, T0 + 3600)
    assert isinstance(give_up, GiveUp) and "3 check-backs" in give_up.reason
    assert hm.claim(decided(HalfState.COMMITTED), GROUP, T0 + 10_000) is None


def test_a_delayed_message_is_delivered_when_due_never_checked_nor_given_up():
    delayed = replace(prepared(check_count=3, next_check=T0 + 2000), check_channel=CheckChannel.DELAY)
    assert hm.claim(delayed, GROUP, T0 + 1999) is None  # not before its delivery time
    assert hm.claim(delayed, GROUP, T0 + 2000) == Deliver()  # past max_checks: still delivered
    assert hm.claim(replace(delayed, state=HalfState.COMMITTED, next_check_at_ms=None), GROUP, T0 + 9000) is None


def test_a_check_back_answer_decides_or_waits_and_the_last_one_rolls_back():
    m = prepared(check_count=1)
    c = hm.after_check(m, GROUP, 1, L.COMMIT, None, T0 + 1)
    assert isinstance(c, Decided) and (c.to, c.by) == (HalfState.COMMITTED, DecidedBy.CHECK_BACK)
    r = hm.after_check(m, GROUP, 1, L.ROLLBACK, None, T0 + 1)
    assert isinstance(r, Decided) and (r.to, r.by) == (HalfState.ROLLED_BACK, DecidedBy.CHECK_BACK)
    assert hm.after_check(m, GROUP, 1, L.UNKNOWN, None, T0 + 1) is None
    assert hm.after_check(m, GROUP, 2, None, "no answer within 100 ms", T0 + 1) is None
    last = hm.after_check(prepared(check_count=3), GROUP, 3, None, "HTTP 500: boom", T0 + 1)
    assert isinstance(last, Decided) and (last.to, last.by) == (HalfState.ROLLED_BACK, DecidedBy.MAX_CHECKS)
    assert "HTTP 500: boom" in (last.reason or "") and "max_checks 3" in (last.reason or "")
    last_unknown = hm.after_check(prepared(check_count=3), GROUP, 3, L.UNKNOWN, None, T0 + 1)
    assert isinstance(last_unknown, Decided) and "UNKNOWN" in (last_unknown.reason or "")


def test_a_check_back_racing_the_producer_repeats_or_is_contradicted():
    committed = decided(HalfState.COMMITTED)
    assert hm.after_check(committed, GROUP, 1, L.COMMIT, None, T0) == Repeated(committed)
    assert isinstance(hm.after_check(committed, GROUP, 1, L.ROLLBACK, None, T0), Contradicted)
    assert hm.after_check(committed, GROUP, 3, L.UNKNOWN, None, T0) is None  # decided: nothing to give up


@pytest.mark.parametrize(
    "body, state",
    [
        ({"state": "COMMIT"}, L.COMMIT),
        ({"state": "ROLLBACK"}, L.ROLLBACK),
        ({"state": "UNKNOWN"}, L.UNKNOWN),
        ({"state": "COMMIT_MESSAGE"}, L.COMMIT),
        ({"state": "ROLLBACK_MESSAGE"}, L.ROLLBACK),
        ({"state": "UNKNOW"}, L.UNKNOWN),
        ({"state": "commit", "extra": 1}, L.COMMIT),
    ],
)
def test_check_back_answers_are_read(body, state):
    assert hm.read_check_answer(body) is state


@pytest.mark.parametrize("body", [None, [], "COMMIT", {"status": "COMMIT"}, {"state": 1}, {"state": "MAYBE"}, {"state": None}])
def test_garbage_answers_are_named(body):
    with pytest.raises(BadAnswer):
        hm.read_check_answer(body)


LOOPBACK = "localhost,127.0.0.0/8,::1"


@pytest.mark.parametrize(
    "url, allowed, ok",
    [
        ("http://127.0.0.1:8080/check", LOOPBACK, True),
        ("http://127.9.9.9/check", LOOPBACK, True),
        ("http://localhost:1/x", LOOPBACK, True),
        ("https://[::1]:8443/x", LOOPBACK, True),
        ("http://10.0.0.5/x", LOOPBACK, False),
        ("http://169.254.169.254/latest/meta-data", LOOPBACK, False),
        ("http://example.com/x", LOOPBACK, False),
        ("http://localhost.example.com/x", LOOPBACK, False),
        ("ftp://127.0.0.1/x", LOOPBACK, False),
        ("file:///etc/passwd", LOOPBACK, False),
        ("http://user:pw@127.0.0.1/x", LOOPBACK, False),
        ("http://127.0.0.1:99999/x", LOOPBACK, False),
        ("not a url", LOOPBACK, False),
        ("http://10.0.0.5/x", "10.0.0.0/8", True),
        ("http://orders.internal:9000/check", "orders.internal", True),
        ("http://ORDERS.internal./check", "orders.internal", True),
    ],
)
def test_check_back_urls_are_restricted_to_the_allowed_hosts(url, allowed, ok):
    assert (hm.check_url_problem(url, allowed) is None) is ok


def test_names_and_group_settings_are_validated():
    hm.validate_names("g", "ABC")
    for bad in ("", "x" * 250, "a\nb"):
        with pytest.raises(TxlogError):
            hm.validate_names(bad)
    for bad_tid in ("", "a/b", "x" * 129):
        with pytest.raises(TxlogError):
            hm.validate_names("g", bad_tid)
    hm.validate_group_settings(1, 0, 1)
    for args in ((0, 0, 1), (1, -1, 1), (1, 0, 0)):
        with pytest.raises(TxlogError) as e:
            hm.validate_group_settings(*args)
        assert e.value.code is ErrorCode.INVALID_CONFIG
