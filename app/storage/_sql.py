"""Small helpers the storage modules share to write their SQL and its parameters."""

from __future__ import annotations

import re
from typing import Iterable

from psycopg.types.numeric import Int8

from app.domain.transactions import OPEN_STATES, PREPARED_STATES, TxnState


def _int8(value: int | None) -> Int8 | None:
    """A number sent binary as a bigint whatever its size (one prepared statement serves all)."""
    return None if value is None else Int8(value)


def _ms(col: str) -> str:
    return f"(extract(epoch FROM {col}) * 1000)::bigint"


def _compact(sql: str) -> str:
    """A statement without its indentation: fewer bytes to send, and to parse for placeholders
    (once: see ``db.py`` on psycopg's statement cache)."""
    return re.sub(r"[ \t]*\n[ \t]*", "\n", sql.strip())


def states_sql(states: Iterable[TxnState]) -> str:
    """SQL for a list of transaction states, in TxnState's order: ``('Ongoing', 'PrepareCommit')``."""
    wanted = set(states)
    names = [s.value for s in TxnState if s in wanted]
    assert names and all(n.isalnum() for n in names), names  # nothing to quote
    return "(" + ", ".join(f"'{n}'" for n in names) + ")"


# Transaction states as SQL, built once from the domain's groups (app.domain.transactions) for the
# statements and the partial indexes that name them. A literal rather than a parameter: PostgreSQL
# uses a partial index only for a predicate it can prove implies the index's, at planning time.
ONGOING_SQL = f"'{TxnState.ONGOING.value}'"
OPEN_STATES_SQL = states_sql(OPEN_STATES)  # ('Ongoing', 'PrepareCommit', 'PrepareAbort')
PREPARED_STATES_SQL = states_sql(PREPARED_STATES)  # ('PrepareCommit', 'PrepareAbort')
# Every state but the open ones: where the sweeper looks for idle transactional ids (ended ones to
# expire, Dead ones to remove).
IDLE_STATES_SQL = states_sql(set(TxnState) - OPEN_STATES)  # ('Empty', 'CompleteCommit', 'CompleteAbort', 'Dead')
