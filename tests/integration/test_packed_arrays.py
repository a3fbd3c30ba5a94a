"""Arrays packed in PostgreSQL's binary format (app.storage.arrays) read back in PostgreSQL exactly
as psycopg's own list dumping would send them."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.storage.arrays import bytea_array, int4_array, int8_array, text_array

_INT4 = st.integers(-(2**31), 2**31 - 1)
_INT8 = st.integers(-(2**63), 2**63 - 1)
_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))


@pytest.fixture(scope="module")
def conn(pg_admin_url: str):  # type: ignore[no-untyped-def]
    with psycopg.connect(pg_admin_url, autocommit=True) as c:
        yield c


def _back(conn, packed, sql_type: str):  # type: ignore[no-untyped-def]
    return conn.execute(f"SELECT CAST(%b AS {sql_type}[]), cardinality(CAST(%b AS {sql_type}[]))", (packed, packed)).fetchone()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.none() | st.binary(max_size=300), max_size=40))
def test_bytea(conn, items) -> None:  # type: ignore[no-untyped-def]
    assert _back(conn, bytea_array(items), "bytea") == (items, len(items))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.none() | _TEXT, max_size=40))
def test_text(conn, items) -> None:  # type: ignore[no-untyped-def]
    assert _back(conn, text_array(items), "text") == (items, len(items))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.none() | _INT4, max_size=40))
def test_int4(conn, items) -> None:  # type: ignore[no-untyped-def]
    assert _back(conn, int4_array(items), "int4") == (items, len(items))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.none() | _INT8, max_size=40))
def test_int8(conn, items) -> None:  # type: ignore[no-untyped-def]
    assert _back(conn, int8_array(items), "int8") == (items, len(items))


def test_unnest_with_ordinality_pairs_elements(conn) -> None:  # type: ignore[no-untyped-def]
    rows = conn.execute(
        "SELECT u.k, u.n, u.o FROM unnest(CAST(%b AS bytea[]), CAST(%b AS int8[])) WITH ORDINALITY AS u(k, n, o)",
        (bytea_array([b"a", None, b""]), int8_array([1, 2, None])),
    ).fetchall()
    assert rows == [(b"a", 1, 1), (None, 2, 2), (b"", None, 3)]


def test_out_of_range_integer_refused() -> None:
    import struct

    with pytest.raises(struct.error):
        int4_array([2**31])
