"""The in-database outbox from SQLAlchemy: append a record inside the application's own database
transaction, when its tables live in txlog's PostgreSQL.

    with engine.begin() as conn:                      # or a Session inside session.begin()
        conn.execute(orders.insert().values(id=42))
        send(conn, "orders", b"42", b'{"created": 42}', headers={"source": "shop"})

The record reaches the topic if and only if that transaction commits (the server drains committed
rows into the log, each once); a rollback leaves no trace. Without a partition the key picks it as
the HTTP API does (Kafka's murmur2), a null key takes turns. ``send`` never waits for a lock, so a
long application transaction holds up no producer. See ``docs/half-messages.md`` for the order
records keep.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

_SEND = "SELECT txlog.send(:topic, :key, :value, CAST(:headers AS jsonb), :partition)"


def _bytes(v: bytes | str | None) -> bytes | None:
    return v.encode("utf-8") if isinstance(v, str) else v


def send(
    conn: Any,
    topic: str,
    key: bytes | str | None,
    value: bytes | str | None,
    headers: Mapping[str, str | None] | Sequence[tuple[str, str | None]] | None = None,
    partition: int | None = None,
) -> int:
    """``SELECT txlog.send(...)`` on a SQLAlchemy ``Connection`` or ``Session`` (in its current
    transaction). ``headers``: a mapping of text values, or a list of (key, value) pairs (ordered,
    keys may repeat). Returns the outbox row's id."""
    from sqlalchemy import text

    if headers is None:
        encoded = None
    elif isinstance(headers, Mapping):
        encoded = json.dumps(dict(headers))
    else:
        encoded = json.dumps([{"key": k, "value": v} for k, v in headers])
    params = {"topic": topic, "key": _bytes(key), "value": _bytes(value), "headers": encoded, "partition": partition}
    return int(conn.execute(text(_SEND), params).scalar_one())
