"""When a push consumer's receipt handles are renewed, without a server: which handles are due, the
renew back-off, the release after the longest renewal time, the drop after failed renewals, the
handles of a client gone offline, and the calls that settle them; and when a client counts as
offline."""

from __future__ import annotations

from api.rocketmq import renewal
from api.rocketmq.clients import Clients
from api.rocketmq.renewal import CLEAR_INVISIBLE_MS, MAX_RENEW_FAILURES, RENEW_MAX_MS, Held

MINUTE = 60_000
T0 = 1_700_000_000_000
AHEAD = 10_000


def _held(offset: int = 0, member: str = "c/1", visible_in: int = 60_000, **kw: int) -> Held:
    fields = dict(delivery_count=1, received_ms=T0, visible_ms=T0 + visible_in)
    fields.update(kw)
    return Held(f"h{offset}", "orders", 0, offset, member, **fields)


def test_the_renew_back_off_steps_up_to_an_hour_and_stays_there() -> None:
    got = [renewal.renew_backoff_ms(n) for n in range(9)]
    assert got == [
        1 * MINUTE,
        3 * MINUTE,
        5 * MINUTE,
        10 * MINUTE,
        30 * MINUTE,
        60 * MINUTE,
        60 * MINUTE,
        60 * MINUTE,
        60 * MINUTE,
    ]


def test_the_retry_back_off_doubles_from_five_seconds_to_two_hours() -> None:
    assert [renewal.retry_backoff_ms(n) for n in (1, 2, 3, 4)] == [5_000, 10_000, 20_000, 40_000]
    assert renewal.retry_backoff_ms(12) == 7_200_000
    assert renewal.retry_backoff_ms(1_000) == 7_200_000
    assert renewal.retry_backoff_ms(0) == 5_000


def test_a_handle_is_due_when_its_lock_ends_within_the_renew_ahead_time() -> None:
    early, due, late = _held(0, visible_in=30_000), _held(1, visible_in=10_000), _held(2, visible_in=-1)
    plan = renewal.plan([early, due, late], T0, AHEAD)
    assert plan.renew == [(due, MINUTE), (late, MINUTE)]
    assert plan.release == [] and plan.drop == []
    assert renewal.plan([early], T0 + 20_000, AHEAD).renew == [(early, MINUTE)]


def test_each_renewal_moves_the_lock_and_the_back_off_one_step() -> None:
    h = _held(visible_in=5_000)
    [(_, lock_ms)] = renewal.plan([h], T0, AHEAD).renew
    h = renewal.renewed(h, T0, lock_ms)
    assert (h.visible_ms, h.renewals) == (T0 + MINUTE, 1)
    assert renewal.plan([h], T0 + 49_999, AHEAD).renew == []
    [(_, lock_ms)] = renewal.plan([h], T0 + 50_000, AHEAD).renew
    assert lock_ms == 3 * MINUTE


def test_a_handle_held_the_longest_renewal_time_is_released_with_the_groups_retry_back_off() -> None:
    h = _held(visible_in=RENEW_MAX_MS + MINUTE, delivery_count=3)
    assert renewal.plan([h], T0 + RENEW_MAX_MS - 1, AHEAD).release == []
    plan = renewal.plan([h], T0 + RENEW_MAX_MS, AHEAD)
    assert plan.release == [(h, 20_000)] and plan.renew == [] and plan.drop == []


def test_a_handle_whose_renewals_failed_in_a_row_is_dropped_and_a_success_starts_the_count_again() -> None:
    h = _held(visible_in=0)
    for _ in range(MAX_RENEW_FAILURES - 1):
        h = renewal.failed(h)
    assert renewal.plan([h], T0, AHEAD).renew == [(h, MINUTE)]
    assert renewal.renewed(h, T0, MINUTE).failures == 0
    h = renewal.failed(h)
    plan = renewal.plan([h], T0, AHEAD)
    assert plan.drop == [h] and plan.renew == [] and plan.release == []


def test_a_client_gone_offline_has_every_handle_returned_for_a_second() -> None:
    held = [_held(0), _held(1, renewals=4)]
    assert renewal.cleared(held) == [(held[0], CLEAR_INVISIBLE_MS), (held[1], CLEAR_INVISIBLE_MS)]
    assert CLEAR_INVISIBLE_MS == 1_000


def test_due_handles_are_settled_in_one_call_per_acquiring_member_and_lock_duration() -> None:
    a0, a1, b0, a2 = _held(0, "c/a"), _held(1, "c/a"), _held(2, "c/b"), _held(3, "c/a")
    calls = renewal.by_member([(a0, MINUTE), (a1, MINUTE), (b0, MINUTE), (a2, 3 * MINUTE)])
    assert calls == {("c/a", MINUTE): [a0, a1], ("c/b", MINUTE): [b0], ("c/a", 3 * MINUTE): [a2]}


def test_a_client_is_offline_once_terminated_or_once_its_telemetry_streams_here_ended() -> None:
    clients = Clients()
    assert not clients.online("never")
    clients.seen("simple")
    assert clients.online("simple")  # no stream ever opened here: online while it calls
    stream = clients.open_stream("push")
    assert clients.online("push")
    second = clients.open_stream("push")
    clients.close_stream("push", stream)
    assert clients.online("push")  # one stream left
    clients.close_stream("push", second)
    assert not clients.online("push")
    clients.terminated("simple")
    assert not clients.online("simple")
