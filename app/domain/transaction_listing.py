"""What the operator's tools read of the transaction coordinator's states (Kafka's ListTransactions
and DescribeTransactions, KIP-664): ListTransactions' filters, which transactional ids they list,
and what DescribeTransactions answers of one. Pure, over ``app.domain.transactions``' states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import re2

from app.domain.transactions import TopicPartition, TxnMetadata, TxnState
from app.errors import ErrorCode, TxlogError

NO_START_TIME = -1  # Kafka's txnStartTimestamp of a transactional id with no transaction started


@dataclass(frozen=True)
class ListFilter:
    """ListTransactions' filters, checked: each is ignored when not given (no state names, no
    producer ids, a negative duration, no pattern)."""

    states: frozenset[TxnState]
    unknown_states: tuple[str, ...]  # the state names given that are not Kafka's, answered back
    states_given: bool
    producer_ids: frozenset[int]
    duration_ms: int
    pattern: Any | None  # an RE2 pattern (``list_filter``)

    @property
    def matches_nothing(self) -> bool:
        """Every state name given is unknown: no transaction is in any of them."""
        return self.states_given and not self.states


# Patterns are RE2's, as Kafka's RE2J: linear in the id's length whatever the pattern, so a client's
# pattern cannot hold a worker (Python's re backtracks). Parse errors are answered, not logged.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


def list_filter(
    state_names: Sequence[str] = (), producer_ids: Sequence[int] = (), duration_ms: int = -1, pattern: str | None = None
) -> ListFilter:
    """Kafka's filters of ListTransactions: an unknown state name is not an error but answered back
    (``unknown_state_filters``) and matches nothing; the transactional id pattern (v2, KIP-1152)
    must match the whole id, and one that does not compile is INVALID_REGULAR_EXPRESSION. An empty
    pattern is no pattern, as in Kafka."""
    by_name = {s.value: s for s in TxnState}
    states = frozenset(by_name[n] for n in state_names if n in by_name)
    unknown = tuple(dict.fromkeys(n for n in state_names if n not in by_name))
    compiled = None
    if pattern:
        try:
            compiled = re2.compile(pattern, options=_RE2_OPTIONS)
        except re2.error as exc:
            why = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
            raise TxlogError(
                ErrorCode.INVALID_REGULAR_EXPRESSION, f"Invalid transactional id pattern {pattern!r}: {why}"
            ) from None
    return ListFilter(states, unknown, bool(state_names), frozenset(producer_ids), duration_ms, compiled)


def start_time_ms(meta: TxnMetadata) -> int:
    """When the transactional id's current or last transaction started, as Kafka's
    txnStartTimestamp: kept once it completes, -1 for none since the producer initialised."""
    return NO_START_TIME if meta.started_at_ms is None else meta.started_at_ms


def is_listed(f: ListFilter, meta: TxnMetadata, now: int) -> bool:
    """Whether ListTransactions answers ``meta`` under ``f``. A Dead transactional id is being
    removed and never listed. The duration filter keeps what started more than ``duration_ms``
    ago by Kafka's rule over txnStartTimestamp, which keeps a transactional id with no transaction
    started (-1) under any duration."""
    if meta.state is TxnState.DEAD:
        return False
    if f.producer_ids and meta.producer_id not in f.producer_ids:
        return False
    if f.states_given and meta.state not in f.states:
        return False
    if f.duration_ms >= 0 and now - start_time_ms(meta) <= f.duration_ms:
        return False
    return f.pattern is None or f.pattern.fullmatch(meta.transactional_id) is not None


def described_partitions(meta: TxnMetadata) -> tuple[TopicPartition, ...]:
    """The partitions DescribeTransactions answers: those of the transaction in flight. Once it
    completes they all carry their markers and none is answered, as Kafka clears them; a prepared
    transaction's markers are written with its completion, so none has its marker yet."""
    return meta.partitions if meta.state.is_open else ()
