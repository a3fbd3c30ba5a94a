"""When a push consumer's receipt handles are renewed, as a RocketMQ 5 proxy renews them: the rules,
over plain data (``renewer`` runs them in the gateway).

- A receive with ``auto_renew`` (the push consumer's) hands over messages its client may keep in
  its cache and consume for far longer than the invisible duration. The proxy keeps each such
  handle and renews its lock ahead of its end, so the message is not delivered again while the
  client still holds it.
- A handle is due (``plan``) when its lock ends within the renew-ahead time
  (TXLOG_ROCKETMQ_RENEW_AHEAD_MS, the proxy's renewAheadTimeMillis, 10 s); it is renewed for the
  proxy's renew back-off (``renew_backoff_ms``: 1, 3, 5, 10, 30 minutes, then an hour at every
  renewal after), one step further at each renewal.
- A handle held for ``RENEW_MAX_MS`` since it was received (the proxy's renewMaxTimeMillis, 3 h) is
  renewed no more: it is released, its lock set to the group's retry back-off for its delivery
  attempt (``retry_backoff_ms``, the back-off told to consumers in their Settings), after which it
  comes again. A handle whose renewal failed ``MAX_RENEW_FAILURES`` times in a row (the proxy's
  maxRenewRetryTimes) is dropped, its lock left to end.
- A client gone offline has its handles returned: each lock set to ``CLEAR_INVISIBLE_MS`` (the
  proxy's invisibleTimeMillisWhenClear, 1 s), so that its messages go promptly to the group's other
  consumers.

Times are milliseconds of the wall clock, as the share groups' lock deadlines.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable

from api.rocketmq.settings import BACKOFF_MULTIPLIER, CONSUMER_BACKOFF_INITIAL_MS, CONSUMER_BACKOFF_MAX_MS

RENEW_BACKOFF_MS = (60_000, 180_000, 300_000, 600_000, 1_800_000, 3_600_000)
RENEW_MAX_MS = 3 * 3_600_000
MAX_RENEW_FAILURES = 3
CLEAR_INVISIBLE_MS = 1_000


@dataclass(frozen=True)
class Held:
    """One receipt handle a client holds: the record it locks, and how its renewals went."""

    handle: str  # as the client has it, and acknowledges it
    topic: str
    partition: int
    offset: int
    member_id: str  # the acquisition that holds the lock
    delivery_count: int
    received_ms: int
    visible_ms: int  # when its lock ends
    renewals: int = 0
    failures: int = 0  # in a row


@dataclass(frozen=True)
class Plan:
    """What to do now with a client's handles: renew each of ``renew`` for its lock duration,
    release each of ``release`` with its lock duration (then forget it), forget ``drop``."""

    renew: list[tuple[Held, int]] = field(default_factory=list)
    release: list[tuple[Held, int]] = field(default_factory=list)
    drop: list[Held] = field(default_factory=list)


def renew_backoff_ms(renewals: int) -> int:
    """The lock of a handle's renewal after ``renewals`` earlier ones."""
    return RENEW_BACKOFF_MS[min(renewals, len(RENEW_BACKOFF_MS) - 1)]


def retry_backoff_ms(delivery_count: int) -> int:
    """The group's retry back-off before the ``delivery_count``-th delivery's message comes again:
    exponential from 5 s, doubling, at most 2 h (RocketMQ's default, as ``settings`` tells it)."""
    exponent = max(0, delivery_count - 1)
    if exponent >= 32:  # far beyond the cap
        return CONSUMER_BACKOFF_MAX_MS
    return int(min(CONSUMER_BACKOFF_INITIAL_MS * BACKOFF_MULTIPLIER**exponent, CONSUMER_BACKOFF_MAX_MS))


def plan(held: Iterable[Held], now_ms: int, ahead_ms: int) -> Plan:
    """The handles of one client that are due now: renewed when their lock ends within
    ``ahead_ms``, released when held ``RENEW_MAX_MS``, dropped after ``MAX_RENEW_FAILURES``."""
    out = Plan()
    for h in held:
        if h.failures >= MAX_RENEW_FAILURES:
            out.drop.append(h)
        elif now_ms >= h.received_ms + RENEW_MAX_MS:
            out.release.append((h, retry_backoff_ms(h.delivery_count)))
        elif now_ms + ahead_ms >= h.visible_ms:
            out.renew.append((h, renew_backoff_ms(h.renewals)))
    return out


def cleared(held: Iterable[Held]) -> list[tuple[Held, int]]:
    """The handles of a client gone offline, each released for ``CLEAR_INVISIBLE_MS``."""
    return [(h, CLEAR_INVISIBLE_MS) for h in held]


def renewed(h: Held, now_ms: int, lock_ms: int) -> Held:
    """``h`` after a renewal for ``lock_ms`` at ``now_ms``."""
    return replace(h, visible_ms=now_ms + lock_ms, renewals=h.renewals + 1, failures=0)


def failed(h: Held) -> Held:
    """``h`` after a renewal that did not reach the store (its lock may be held still)."""
    return replace(h, failures=h.failures + 1)


def by_member(due: Iterable[tuple[Held, int]]) -> dict[tuple[str, int], list[Held]]:
    """Due handles in the calls that settle them: one per acquiring member and lock duration."""
    calls: dict[tuple[str, int], list[Held]] = {}
    for h, lock_ms in due:
        calls.setdefault((h.member_id, lock_ms), []).append(h)
    return calls
