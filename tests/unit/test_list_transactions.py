"""The rules of Kafka's ListTransactions and DescribeTransactions as the domain states them
(``app.domain.transaction_listing``: ``list_filter``, ``is_listed``, ``start_time_ms``,
``described_partitions``): Kafka's state names, unknown ones answered back, producer ids, the
duration over txnStartTimestamp (-1 for no transaction started), the pattern matched whole, Dead
never listed, partitions only while a transaction is in flight."""

from __future__ import annotations

import dataclasses

import pytest

from app.domain import transaction_listing
from app.domain.transactions import TxnMetadata, TxnState
from app.errors import ErrorCode, TxlogError

S = TxnState
NOW = 1_700_000_100_000


def meta(tid: str = "orders-1", state: TxnState = S.ONGOING, pid: int = 7, started: int | None = NOW - 5_000) -> TxnMetadata:
    return TxnMetadata(
        transactional_id=tid,
        producer_id=pid,
        producer_epoch=0,
        state=state,
        timeout_ms=60_000,
        version=2,
        updated_at_ms=NOW,
        epoch_changed_at_ms=NOW,
        started_at_ms=started,
        partitions=(("t", 0), ("t", 1)),
    )


def listed(m: TxnMetadata, **filters: object) -> bool:
    return transaction_listing.is_listed(transaction_listing.list_filter(**filters), m, NOW)  # type: ignore[arg-type]


def test_no_filter_lists_everything_but_dead() -> None:
    assert all(listed(meta(state=s)) for s in TxnState if s is not S.DEAD)
    assert not listed(meta(state=S.DEAD))
    assert not listed(meta(state=S.DEAD), state_names=["Dead"])


def test_state_names_are_kafkas_and_unknown_ones_are_answered_back() -> None:
    f = transaction_listing.list_filter(["Ongoing", "Bogus", "ongoing", "Bogus"])
    assert (f.states, f.unknown_states, f.matches_nothing) == (frozenset({S.ONGOING}), ("Bogus", "ongoing"), False)
    assert listed(meta(), state_names=["Ongoing", "Bogus"])
    assert not listed(meta(state=S.EMPTY), state_names=["Ongoing"])
    only_unknown = transaction_listing.list_filter(["PrepareEpochFence"])
    assert only_unknown.matches_nothing and not transaction_listing.is_listed(only_unknown, meta(), NOW)
    assert [s.value for s in TxnState] == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
    ]


def test_producer_ids() -> None:
    assert listed(meta(pid=7), producer_ids=[3, 7])
    assert not listed(meta(pid=7), producer_ids=[3])


@pytest.mark.parametrize(
    ("started", "duration", "expected"),
    [
        (NOW - 5_000, -1, True),  # negative: no filter
        (NOW - 5_000, 4_999, True),
        (NOW - 5_000, 5_000, False),  # running longer than, strictly
        (NOW - 5_000, 0, True),
        (None, 10**12, True),  # no transaction started: Kafka's -1 passes any duration
    ],
)
def test_duration_is_kafkas_rule_over_the_start_time(started: int | None, duration: int, expected: bool) -> None:
    assert listed(meta(started=started), duration_ms=duration) is expected


def test_the_pattern_matches_the_whole_transactional_id() -> None:
    assert listed(meta("orders-1"), pattern=r"orders-\d+")
    assert not listed(meta("orders-1"), pattern="orders")
    assert not listed(meta("my-orders-1"), pattern=r"orders-\d+")
    assert listed(meta("anything"), pattern="")  # empty: no pattern
    assert listed(meta("orders-1"), pattern="orders-.*", state_names=["Ongoing"], producer_ids=[7], duration_ms=0)
    assert not listed(meta("a" * 5000 + "!"), pattern="(a+)+$")  # RE2: no catastrophic backtracking


# RE2's syntax, as Kafka's RE2J: no backreferences or lookarounds, which need backtracking
@pytest.mark.parametrize("pattern", ["(unclosed", "[z-a]", "*", r"(a)\1", "(?=a)a"])
def test_a_pattern_that_does_not_compile_is_invalid_regular_expression(pattern: str) -> None:
    with pytest.raises(TxlogError) as info:
        transaction_listing.list_filter(pattern=pattern)
    assert info.value.code is ErrorCode.INVALID_REGULAR_EXPRESSION and info.value.code.kafka_code == 128


def test_start_time_and_partitions_as_described() -> None:
    assert transaction_listing.start_time_ms(meta(started=None)) == transaction_listing.NO_START_TIME == -1
    assert transaction_listing.start_time_ms(meta(started=123)) == 123
    for state in TxnState:
        m = dataclasses.replace(meta(), state=state)
        assert transaction_listing.described_partitions(m) == (m.partitions if state.is_open else ())
