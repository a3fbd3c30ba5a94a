"""Kafka's client quota rules (app.domain.quotas): entities and their precedence, the keys and their
validation, DescribeClientQuotas' filter, and the throttle time of a sampled rate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.quotas import (
    CLIENT_ID,
    IP,
    USER,
    FilterComponent,
    MatchType,
    QuotaError,
    QuotaWindow,
    applicable,
    entity_of,
    entity_path,
    matches,
    precedence,
    validate_filter,
    validate_value,
)


def test_entities_are_validated_with_kafkas_messages() -> None:
    assert entity_of([(USER, "alice"), (CLIENT_ID, None)]) == ((CLIENT_ID, None), (USER, "alice"))
    cases = {
        (): "Invalid empty client quota entity",
        ((USER, "a"), (USER, "b")): "Invalid client quota entity, duplicate entity entry user",
        (("group", "g"),): "Unhandled client quota entity type: group",
        ((CLIENT_ID, ""),): "Empty client-id not supported",
        (
            (IP, "1.2.3.4"),
            (USER, "a"),
        ): "Invalid quota entity combination, IP entity should not be combined with User or ClientId",
    }
    for parts, message in cases.items():
        with pytest.raises(QuotaError) as err:
            entity_of(parts)
        assert (err.value.code, err.value.message) == ("INVALID_REQUEST", message)


def test_values_are_validated_with_kafkas_messages() -> None:
    user = entity_of([(USER, "alice")])
    validate_value(user, "producer_byte_rate", 1024.0)
    validate_value(user, "request_percentage", 12.5)
    cases = {
        ("controller_mutation_rates", 1.0): "Invalid configuration key controller_mutation_rates",
        ("consumer_byte_rate", 0.0): "Quota consumer_byte_rate must be greater than 0",
        ("producer_byte_rate", -1.0): "Quota producer_byte_rate must be greater than 0",
        ("producer_byte_rate", 10.5): "producer_byte_rate cannot be a fractional value.",
        ("producer_byte_rate", 1e300): "Proposed value for producer_byte_rate is too large for a LONG.",
    }
    for (key, value), message in cases.items():
        with pytest.raises(QuotaError) as err:
            validate_value(user, key, value)
        assert err.value.message == message
    with pytest.raises(QuotaError, match="not supported"):
        validate_value(entity_of([(IP, None)]), "connection_creation_rate", 10.0)


def test_precedence_is_kafkas_eight_levels() -> None:
    paths = [entity_path(e) for e in precedence("alice", "app")]
    assert paths == [
        "/users/alice/clients/app",
        "/users/alice/clients/<default>",
        "/users/alice",
        "/users/<default>/clients/app",
        "/users/<default>/clients/<default>",
        "/users/<default>",
        "/clients/app",
        "/clients/<default>",
    ]


def test_the_first_entity_with_the_key_applies_and_names_whose_budget() -> None:
    configs = {
        entity_of([(CLIENT_ID, None)]): {"producer_byte_rate": 100.0},
        entity_of([(USER, None)]): {"consumer_byte_rate": 200.0},
        entity_of([(USER, "alice"), (CLIENT_ID, "app")]): {"producer_byte_rate": 300.0},
    }
    a = applicable(configs, "alice", "app", "producer_byte_rate")
    assert a is not None and (a.limit, a.usage) == (300.0, ("alice", "app", "producer_byte_rate"))
    # a default client-id: each client id its own budget, shared by every user
    b = applicable(configs, "bob", "app", "producer_byte_rate")
    assert b is not None and (b.limit, b.usage) == (100.0, ("", "app", "producer_byte_rate"))
    # a default user: each user its own budget, whatever its client ids
    c = applicable(configs, "bob", "other", "consumer_byte_rate")
    assert c is not None and (c.limit, c.usage) == (200.0, ("bob", "", "consumer_byte_rate"))
    assert applicable(configs, "bob", "app", "request_percentage") is None


def test_filters_match_as_kafkas() -> None:
    alice_app = entity_of([(USER, "alice"), (CLIENT_ID, "app")])
    alice = entity_of([(USER, "alice")])
    default_user = entity_of([(USER, None)])
    exact = FilterComponent(USER, MatchType.EXACT, "alice")
    default = FilterComponent(USER, MatchType.DEFAULT, None)
    anything = FilterComponent(USER, MatchType.ANY, None)
    assert [matches(e, [exact], False) for e in (alice_app, alice, default_user)] == [True, True, False]
    assert [matches(e, [exact], True) for e in (alice_app, alice, default_user)] == [False, True, False]
    assert [matches(e, [default], False) for e in (alice_app, alice, default_user)] == [False, False, True]
    assert [matches(e, [anything], True) for e in (alice_app, alice, default_user)] == [False, True, True]
    assert matches(alice_app, [], False) and not matches(alice_app, [], True)
    for bad, message in (
        ([exact, exact], "Entity type user cannot appear more than once in the filter."),
        ([FilterComponent("group", 0, "g")], "Unsupported entity type group"),
        ([FilterComponent(USER, MatchType.EXACT, None)], "Unexpected null match string for exact match type"),
        ([FilterComponent(USER, 7, None)], "Unexpected match type: 7"),
    ):
        with pytest.raises(QuotaError) as err:
            validate_filter(bad)
        assert err.value.message == message


def test_the_rate_counts_at_least_num_minus_one_windows() -> None:
    w = QuotaWindow()
    now_ms = 100_500.0  # half-way through window 100
    # 5000 bytes in the current window alone: measured over 10.5 s, not 0.5 s
    assert w.rate({100: 5000.0}, now_ms) == pytest.approx(5000 / 10.5)
    # windows older than the last 11 are not counted
    assert w.rate({89: 1e9, 100: 5000.0}, now_ms) == pytest.approx(5000 / 10.5)
    # a full history: measured since the oldest kept window began
    full = {i: 1000.0 for i in range(90, 101)}
    assert w.rate(full, now_ms) == pytest.approx(11000 / 10.5)


def test_throttle_time_is_kafkas() -> None:
    w = QuotaWindow()
    now_ms = 100_500.0
    # 21000 over 10.5 s is 2000/s against a quota of 1000/s: (2000 - 1000) / 1000 × 10500 ms
    assert w.throttle_ms({100: 21000.0}, now_ms, 1000.0) == 10500
    assert w.throttle_ms({100: 10500.0}, now_ms, 1000.0) == 0
    # the request-time quota's is capped at one window
    assert w.throttle_ms({100: 21000.0}, now_ms, 1000.0, capped=True) == 1000
    assert w.max_value(1000.0) == 10_000.0


@given(
    samples=st.dictionaries(st.integers(0, 30), st.floats(0, 1e7), max_size=12),
    now_ms=st.floats(20_000, 31_000),
    limit=st.floats(1, 1e6),
)
def test_waiting_the_throttle_time_brings_the_rate_back_to_the_quota(
    samples: dict[int, float], now_ms: float, limit: float
) -> None:
    """The throttle time is the wait after which, nothing more recorded, the average over the same
    samples is at the quota (Kafka's formula: the measured span grows by the throttle time)."""
    w = QuotaWindow()
    throttle = w.throttle_ms(samples, now_ms, limit)
    kept = {k: v for k, v in samples.items() if k >= w.oldest_kept(now_ms)}
    if throttle == 0:
        assert w.rate(samples, now_ms) <= limit
        return
    measured = w.measured_ms(min(kept), now_ms)
    assert sum(kept.values()) / ((measured + throttle) / 1000) == pytest.approx(limit, rel=1e-3, abs=1.0)


def test_quota_windows_follow_the_database_clock_and_carry_it_while_a_reading_is_due() -> None:
    from types import SimpleNamespace

    from app.services.quotas import DatabaseSeconds

    readings: list[int | None] = [1_000_000, None]
    synced: list[bool] = []
    broker = SimpleNamespace(now_without_waiting=lambda: readings[0], now=lambda: synced.append(True))
    clock = DatabaseSeconds(broker)  # type: ignore[arg-type]
    assert clock() == 1_000.0  # the database's time, not this host's
    readings[0] = None  # a reading is due: carried forward, never below the last answer
    assert 1_000.0 <= clock() < 1_001.0
    clock.sync()
    assert synced == [True]
