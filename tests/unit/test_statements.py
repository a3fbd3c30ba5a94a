"""The hot statements stay within what psycopg parses once (``app/storage/db.py`` raises its
limits): a statement longer than ``MAX_CACHED_STATEMENT_LENGTH`` bytes, or sent with more than
``MAX_CACHED_STATEMENT_PARAMS`` parameters, has its placeholders parsed again at every execution.
Each is sent with exactly its placeholders."""

from __future__ import annotations

import re

import psycopg._queries
import pytest

from app.storage import (
    _sql,
    append,
    db,  # noqa: F401  (sets psycopg's limit)
    log,
    transactions,
)


@pytest.mark.parametrize(
    "sql",
    [
        append._LOG_APPEND,
        append._LOG_APPEND_IF_UNCHANGED,
        append._TXN_APPEND_IF_UNCHANGED,
        transactions._TXN_RECORD,
        log._FETCH_LOG_WITH_ABORTED,
        log._FETCH_COMMITTED,
    ],
    ids=[
        "_LOG_APPEND",
        "_LOG_APPEND_IF_UNCHANGED",
        "_TXN_APPEND_IF_UNCHANGED",
        "_TXN_RECORD",
        "_FETCH_LOG_WITH_ABORTED",
        "_FETCH_COMMITTED",
    ],
)
def test_a_hot_statement_is_parsed_once(sql):  # type: ignore[no-untyped-def]
    assert len(sql.encode()) <= psycopg._queries.MAX_CACHED_STATEMENT_LENGTH
    assert len(set(re.findall(r"%\((\w+)\)[sb]", sql))) <= psycopg._queries.MAX_CACHED_STATEMENT_PARAMS


def test_compacting_keeps_the_statement_and_drops_only_indentation():  # type: ignore[no-untyped-def]
    sql = "\n    SELECT a,\n           b -- a comment\n    FROM t  WHERE x = 'a  b'\n"
    assert _sql._compact(sql) == "SELECT a,\nb -- a comment\nFROM t  WHERE x = 'a  b'"
