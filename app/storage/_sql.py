"""Small helpers the storage modules share to write their SQL and its parameters."""

from __future__ import annotations

import re

from psycopg.types.numeric import Int8


def _int8(value: int | None) -> Int8 | None:
    """A number sent binary as a bigint whatever its size (one prepared statement serves all)."""
    return None if value is None else Int8(value)


def _ms(col: str) -> str:
    return f"(extract(epoch FROM {col}) * 1000)::bigint"


def _compact(sql: str) -> str:
    """A statement without its indentation: fewer bytes to send, and to parse for placeholders
    (once: see ``db.py`` on psycopg's statement cache)."""
    return re.sub(r"[ \t]*\n[ \t]*", "\n", sql.strip())
