"""Half messages, as RocketMQ has them: a message stored where no consumer can see it until its
producer — or, when the producer goes quiet, the producer group's check-back endpoint — decides to
commit it (it is then appended to its topic and partition, once) or to roll it back.

Plain rules over plain data, no I/O: the states and the one transition check, what a decision does
to a half message (and what a repeated or contradicting one answers), when the checker asks the
producer group, how its answer is read, and when it gives up. Time is passed in (epoch ms).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from app.errors import ErrorCode, TxlogError


class HalfState(Enum):
    """A half message's state. ``Prepared``: stored, invisible, waiting for a decision (its
    producer's commit or rollback, or a check-back). ``Committed``: appended to its partition.
    ``RolledBack``: dropped. The decided states are final."""

    PREPARED = "Prepared"
    COMMITTED = "Committed"
    ROLLED_BACK = "RolledBack"

    @property
    def is_decided(self) -> bool:
        return self is not HalfState.PREPARED


VALID_PREVIOUS: dict[HalfState, frozenset[HalfState]] = {
    HalfState.PREPARED: frozenset(),  # only ever the first state
    HalfState.COMMITTED: frozenset({HalfState.PREPARED}),
    HalfState.ROLLED_BACK: frozenset({HalfState.PREPARED}),
}


def check_transition(current: HalfState, to: HalfState) -> None:
    """The one guard of the state machine."""
    if current not in VALID_PREVIOUS[to]:
        raise TxlogError(ErrorCode.INVALID_TXN_STATE, f"A half message cannot go from {current.value} to {to.value}")


class DecidedBy(Enum):
    """Who took a half message's decision."""

    PRODUCER = "producer"  # its producer's commit or rollback
    CHECK_BACK = "check_back"  # the producer group's answer to a check-back
    MAX_CHECKS = "max_checks"  # the checker, after max_checks check-backs without a decision
    DELIVERY_TIME = "delivery_time"  # a delayed message's delivery time came (CheckChannel.DELAY)


class CheckChannel(Enum):
    """How a half message's check-backs reach its producer group. ``http``: a POST to the group's
    check-back URL, by the HTTP server's checker. ``rocketmq``: RecoverOrphanedTransactionCommand
    on the Telemetry stream of a live RocketMQ producer of the group, by a RocketMQ gateway the
    producer is connected to. Each checker claims only its own channel's half messages."""

    HTTP = "http"
    ROCKETMQ = "rocketmq"
    # A delayed message (RocketMQ's DELAY): nobody is asked; its next check is its delivery time,
    # when the claim commits it (``Deliver``). Its own claim loop (``deliver_due``) takes it.
    DELAY = "delay"


class LocalTransactionState(Enum):
    """A producer group's answer about its local transaction (RocketMQ's LocalTransactionState)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


# RocketMQ's own spellings are read too (its enum names, with its misspelt UNKNOW).
_ANSWERS = {
    "COMMIT": LocalTransactionState.COMMIT,
    "COMMIT_MESSAGE": LocalTransactionState.COMMIT,
    "ROLLBACK": LocalTransactionState.ROLLBACK,
    "ROLLBACK_MESSAGE": LocalTransactionState.ROLLBACK,
    "UNKNOWN": LocalTransactionState.UNKNOWN,
    "UNKNOW": LocalTransactionState.UNKNOWN,
}


class BadAnswer(ValueError):
    """A check-back answer that is not ``{"state": "COMMIT" | "ROLLBACK" | "UNKNOWN"}``."""


def read_check_answer(body: Any) -> LocalTransactionState:
    """The state in a check-back endpoint's decoded JSON answer, or ``BadAnswer`` saying why not."""
    if not isinstance(body, dict) or "state" not in body:
        raise BadAnswer(f'expected an object with a "state", got {_short(body)}')
    state = body["state"]
    if not isinstance(state, str) or state.upper() not in _ANSWERS:
        raise BadAnswer(f'"state" must be COMMIT, ROLLBACK or UNKNOWN, got {_short(state)}')
    return _ANSWERS[state.upper()]


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


# RocketMQ's broker defaults: transactionCheckInterval, transactionTimeOut (the immunity of a fresh
# half message), transactionCheckMax.
DEFAULT_CHECK_INTERVAL_MS = 60_000
DEFAULT_CHECK_IMMUNITY_MS = 6_000
DEFAULT_MAX_CHECKS = 15


@dataclass(frozen=True)
class ProducerGroup:
    """A producer group's check-back settings. A group nobody registered has the defaults and no
    check-back endpoint: its undecided half messages are rolled back after ``max_checks`` rounds."""

    producer_group: str
    check_url: str | None = None
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS
    check_immunity_ms: int = DEFAULT_CHECK_IMMUNITY_MS
    max_checks: int = DEFAULT_MAX_CHECKS
    updated_at_ms: int | None = None  # None: never registered


@dataclass(frozen=True)
class HalfMessage:
    transaction_id: str
    producer_group: str
    topic: str
    partition: int
    state: HalfState
    check_count: int
    created_at_ms: int
    next_check_at_ms: int | None  # None once decided
    decided_at_ms: int | None = None
    decided_by: DecidedBy | None = None
    reason: str | None = None
    offset: int | None = None  # where it was appended, once committed
    check_channel: CheckChannel = CheckChannel.HTTP


def first_check_at(created_at_ms: int, group: ProducerGroup, immunity_ms: int | None = None) -> int:
    """A fresh half message is left alone for the group's immunity time — or its own, when its
    producer set one (RocketMQ's CHECK_IMMUNITY_TIME_IN_SECONDS): its producer is most likely
    still running its local transaction."""
    return created_at_ms + (group.check_immunity_ms if immunity_ms is None else immunity_ms)


# --- decisions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decided:
    """The decision is taken now: the half message goes to ``to`` (and is appended if committed)."""

    to: HalfState
    by: DecidedBy
    at_ms: int
    reason: str | None = None

    def applied(self, msg: HalfMessage, offset: int | None = None) -> HalfMessage:
        check_transition(msg.state, self.to)
        return replace(
            msg,
            state=self.to,
            next_check_at_ms=None,
            decided_at_ms=self.at_ms,
            decided_by=self.by,
            reason=self.reason,
            offset=offset,
        )


@dataclass(frozen=True)
class Repeated:
    """The same decision was taken already (a retried, duplicated or racing call): nothing to do;
    the answer is the half message as it is."""

    msg: HalfMessage


@dataclass(frozen=True)
class Contradicted:
    """The opposite decision was taken already: the call is refused, saying who decided and why."""

    msg: HalfMessage
    wanted: HalfState

    def error(self) -> TxlogError:
        m = self.msg
        by = m.decided_by.value.replace("_", "-") if m.decided_by else "unknown"
        why = f": {m.reason}" if m.reason else ""
        return TxlogError(
            ErrorCode.INVALID_TXN_STATE,
            f"Half message {m.transaction_id} is already {m.state.value} (decided by {by}{why}); "
            f"it cannot be {'committed' if self.wanted is HalfState.COMMITTED else 'rolled back'}",
            state=m.state.value,
            decided_by=m.decided_by.value if m.decided_by else None,
        )


Decision = Decided | Repeated | Contradicted


def decide(msg: HalfMessage, to: HalfState, by: DecidedBy, now_ms: int, reason: str | None = None) -> Decision:
    """What a commit (``to`` = Committed) or rollback (RolledBack) does to ``msg``. Decisions are
    final: the first one wins, the same one again is ``Repeated``, the opposite ``Contradicted``."""
    if not to.is_decided:
        raise ValueError(f"not a decision: {to}")
    if msg.state is to:
        return Repeated(msg)
    if msg.state.is_decided:
        return Contradicted(msg, to)
    check_transition(msg.state, to)
    return Decided(to, by, now_ms, reason)


# --- the checker ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """Ask the producer group now: this is check number ``check_no``; until ``lease_until_ms`` no
    other checker asks again (the next check is due then if this one brings no decision)."""

    check_no: int
    lease_until_ms: int


@dataclass(frozen=True)
class GiveUp:
    """No more check-backs: roll the half message back, for ``reason``."""

    reason: str


@dataclass(frozen=True)
class Deliver:
    """A delayed message's delivery time came: commit it now (no check-back, no limit of checks)."""


def claim(msg: HalfMessage, group: ProducerGroup, now_ms: int) -> Check | GiveUp | Deliver | None:
    """What the checker does with a half message it found due (None: it is not due, or decided)."""
    if msg.state.is_decided or msg.next_check_at_ms is None or msg.next_check_at_ms > now_ms:
        return None
    if msg.check_channel is CheckChannel.DELAY:
        return Deliver()
    if msg.check_count >= group.max_checks:
        # The last check-back gave no decision and never recorded one (its checker died).
        return GiveUp(f"no decision after {msg.check_count} check-backs (max_checks {group.max_checks})")
    return Check(msg.check_count + 1, now_ms + group.check_interval_ms)


def after_check(
    msg: HalfMessage, group: ProducerGroup, check_no: int, answer: LocalTransactionState | None, problem: str | None, now_ms: int
) -> Decision | None:
    """What a check-back's outcome does: the group's COMMIT or ROLLBACK decides (as a decision by
    the check-back, which may repeat or contradict one taken meanwhile); UNKNOWN, or no usable
    answer (``problem``: a timeout, a refused connection, garbage), leaves it to the next check —
    unless this was check number ``max_checks``, which rolls it back and says why."""
    if answer is LocalTransactionState.COMMIT:
        return decide(msg, HalfState.COMMITTED, DecidedBy.CHECK_BACK, now_ms, f"check-back {check_no} answered COMMIT")
    if answer is LocalTransactionState.ROLLBACK:
        return decide(msg, HalfState.ROLLED_BACK, DecidedBy.CHECK_BACK, now_ms, f"check-back {check_no} answered ROLLBACK")
    if check_no < group.max_checks or msg.state.is_decided:
        return None
    last = "UNKNOWN" if answer is LocalTransactionState.UNKNOWN else (problem or "no answer")
    reason = f"no decision after {check_no} check-backs (max_checks {group.max_checks}); the last: {last}"
    return decide(msg, HalfState.ROLLED_BACK, DecidedBy.MAX_CHECKS, now_ms, reason)


# --- check-back URLs ------------------------------------------------------------------------------


def parse_allowed_hosts(setting: str) -> tuple[frozenset[str], tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]]:
    """``TXLOG_HALF_CHECK_ALLOWED_HOSTS``: comma-separated host names (matched exactly, never
    resolved) and IP addresses or networks (``10.0.0.0/8``)."""
    names: set[str] = set()
    networks = []
    for item in (s.strip() for s in setting.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
        except ValueError:
            names.add(item.lower().rstrip("."))
    return frozenset(names), tuple(networks)


def check_url_problem(url: str, allowed_hosts: str) -> str | None:
    """Why the server must not call ``url`` (None: it may). Only http(s) URLs without credentials,
    to a host the setting lists by name, or an IP address inside one of its networks: the server
    must not become a way to reach the rest of the network. Names are not resolved here, so a name
    that resolves elsewhere later changes nothing."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 — raises on a port that is not a number in range
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"the scheme must be http or https, not {parts.scheme!r}"
    if parts.username is not None or parts.password is not None:
        return "credentials in the URL are not allowed"
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        return "the URL has no host"
    names, networks = parse_allowed_hosts(allowed_hosts)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if host in names:
            return None
        return f"host {host!r} is not in TXLOG_HALF_CHECK_ALLOWED_HOSTS ({allowed_hosts})"
    if any(address in n for n in networks) or host in names:
        return None
    return f"address {host} is not in TXLOG_HALF_CHECK_ALLOWED_HOSTS ({allowed_hosts})"


def validate_group_settings(check_interval_ms: int, check_immunity_ms: int, max_checks: int) -> None:
    if check_interval_ms < 1:
        raise TxlogError(ErrorCode.INVALID_CONFIG, "check_interval_ms must be at least 1")
    if check_immunity_ms < 0:
        raise TxlogError(ErrorCode.INVALID_CONFIG, "check_immunity_ms must not be negative")
    if max_checks < 1:
        raise TxlogError(ErrorCode.INVALID_CONFIG, "max_checks must be at least 1")


PRODUCER_GROUP_MAX_LENGTH = 249
TRANSACTION_ID_MAX_LENGTH = 128


def validate_producer_group(producer_group: str) -> None:
    if not producer_group or len(producer_group) > PRODUCER_GROUP_MAX_LENGTH or not producer_group.isprintable():
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"A producer group is 1 to {PRODUCER_GROUP_MAX_LENGTH} printable characters")


def validate_transaction_id(transaction_id: str) -> None:
    if (
        not transaction_id
        or len(transaction_id) > TRANSACTION_ID_MAX_LENGTH
        or not transaction_id.isprintable()
        or "/" in transaction_id
    ):
        raise TxlogError(
            ErrorCode.INVALID_REQUEST, f"A transaction id is 1 to {TRANSACTION_ID_MAX_LENGTH} printable characters, no '/'"
        )


def validate_names(producer_group: str, transaction_id: str | None = None) -> None:
    validate_producer_group(producer_group)
    if transaction_id is not None:
        validate_transaction_id(transaction_id)
