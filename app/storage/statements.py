"""Statements as values: what to send and how its answer reads, apart from who sends it.

A statement planned ahead (an append, a transaction's transitions) is built once, as a value, and
run by ``execute`` on a blocking psycopg connection or by ``execute_async`` on an asyncio one. The
operations that yield such values are driven by ``app.services.executor``, the one place that
decides where a statement runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, TypeVar

import psycopg

R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Statement(Generic[R]):
    """One statement: its SQL, its parameters, and how its one answer row reads."""

    sql: str
    params: Mapping[str, Any]
    read: Callable[[Any], R]

    def then(self, fn: Callable[[R], T]) -> "Statement[T]":
        """The same statement, its reading passed through ``fn``."""
        read = self.read
        return Statement(self.sql, self.params, lambda row: fn(read(row)))


def execute(conn: psycopg.Connection[Any], statement: Statement[R]) -> R:
    """Run ``statement`` on a blocking connection; its reading."""
    return statement.read(conn.execute(statement.sql, statement.params).fetchone())


async def execute_async(conn: psycopg.AsyncConnection[Any], statement: Statement[R]) -> R:
    """Run ``statement`` on an asyncio connection: the same, awaited."""
    cursor = await conn.execute(statement.sql, statement.params)
    return statement.read(await cursor.fetchone())
