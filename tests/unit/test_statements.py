"""The hot statements stay within what psycopg parses once (``app/storage/db.py`` raises its
limit): a statement longer than ``MAX_CACHED_STATEMENT_LENGTH`` bytes has its placeholders parsed
again at every execution."""

from __future__ import annotations

import psycopg._queries
import pytest

from app.storage import db  # noqa: F401  (sets psycopg's limit)
from app.storage import queries as q


@pytest.mark.parametrize("name", [
    "_LOG_APPEND", "_LOG_APPEND_IF_UNCHANGED", "_TXN_APPEND_IF_UNCHANGED", "_TXN_RECORD", "_FETCH_LOG_WITH_ABORTED",
    "_FETCH_COMMITTED",
])
def test_a_hot_statement_is_parsed_once(name):  # type: ignore[no-untyped-def]
    assert len(getattr(q, name).encode()) <= psycopg._queries.MAX_CACHED_STATEMENT_LENGTH


def test_compacting_keeps_the_statement_and_drops_only_indentation():  # type: ignore[no-untyped-def]
    sql = "\n    SELECT a,\n           b -- a comment\n    FROM t  WHERE x = 'a  b'\n"
    assert q._compact(sql) == "SELECT a,\nb -- a comment\nFROM t  WHERE x = 'a  b'"
