"""The SQL of Kafka's client quotas: their config values (``client_quotas``; every change raises
``security_version`` in the same transaction) and the usage every process records against them
(``client_quota_usage``), one function per statement, named noun-first."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import orjson
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.engine import Connection
from sqlalchemy.types import BigInteger, Double, Text

from app.domain.quotas import Entity, UsageKey


def _entity_json(entity: Entity) -> dict[str, str | None]:
    return dict(entity)


def _entity(value: Any) -> Entity:
    data = value if isinstance(value, dict) else orjson.loads(value)
    return tuple(sorted(data.items()))


def quota_list(conn: Connection) -> dict[Entity, dict[str, float]]:
    """Every entity's quota values."""
    out: dict[Entity, dict[str, float]] = {}
    for entity, key, value in conn.execute(text("SELECT entity, quota_key, value FROM txlog.client_quotas")).all():
        out.setdefault(_entity(entity), {})[key] = value
    return out


_PUT = text(
    """
    INSERT INTO txlog.client_quotas (entity, quota_key, value) VALUES (:entity, :key, :value)
    ON CONFLICT (entity, quota_key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
    WHERE txlog.client_quotas.value IS DISTINCT FROM EXCLUDED.value
    RETURNING quota_key
    """
).bindparams(bindparam("entity", type_=JSONB))

_REMOVE = text("DELETE FROM txlog.client_quotas WHERE entity = :entity AND quota_key = :key RETURNING quota_key").bindparams(
    bindparam("entity", type_=JSONB)
)


def quota_put(conn: Connection, entity: Entity, key: str, value: float) -> bool:
    """Set one value; True if it changed."""
    return conn.execute(_PUT, {"entity": _entity_json(entity), "key": key, "value": value}).first() is not None


def quota_remove(conn: Connection, entity: Entity, key: str) -> bool:
    """Remove one value; True if it was set."""
    return conn.execute(_REMOVE, {"entity": _entity_json(entity), "key": key}).first() is not None


# One round trip per flush: this process's counts added, old windows deleted, and the sums of every
# budget it watches read back. The SELECT sees the table as it was before this statement's own
# upsert, whose RETURNING gives the new sums of the rows it wrote (the caller lets those win).
# Rows are upserted in key order, so concurrent flushes lock them in the same order; a data-modifying
# CTE runs whether or not the query reads it.
_FLUSH = text(
    """
    WITH added AS (
        INSERT INTO txlog.client_quota_usage AS u (user_tag, client_tag, quota_key, window_index, amount)
        SELECT * FROM unnest(:users, :clients, :keys, :windows, :amounts)
        ORDER BY 1, 2, 3, 4
        ON CONFLICT (user_tag, client_tag, quota_key, window_index) DO UPDATE SET amount = u.amount + EXCLUDED.amount
        RETURNING user_tag, client_tag, quota_key, window_index, amount
    ), expired AS (
        -- rows another flush is deleting are skipped: concurrent deletes never wait on each other
        DELETE FROM txlog.client_quota_usage WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM txlog.client_quota_usage WHERE window_index < :oldest FOR UPDATE SKIP LOCKED
        ))
    )
    SELECT user_tag, client_tag, quota_key, window_index, amount, false FROM txlog.client_quota_usage
    WHERE window_index >= :oldest
      AND (user_tag, client_tag, quota_key) IN (SELECT * FROM unnest(:watch_users, :watch_clients, :watch_keys))
    UNION ALL
    SELECT user_tag, client_tag, quota_key, window_index, amount, true FROM added
    """
).bindparams(
    bindparam("users", type_=ARRAY(Text)),
    bindparam("clients", type_=ARRAY(Text)),
    bindparam("keys", type_=ARRAY(Text)),
    bindparam("windows", type_=ARRAY(BigInteger)),
    bindparam("amounts", type_=ARRAY(Double)),
    bindparam("watch_users", type_=ARRAY(Text)),
    bindparam("watch_clients", type_=ARRAY(Text)),
    bindparam("watch_keys", type_=ARRAY(Text)),
)


def usage_flush(
    conn: Connection, counts: Iterable[tuple[UsageKey, int, float]], watch: Sequence[UsageKey], oldest: int
) -> dict[UsageKey, dict[int, float]]:
    """Add ``counts`` ((budget, window, amount)), delete windows below ``oldest``, and answer the
    sums of every window from ``oldest`` on of the budgets in ``watch`` (and of those counted)."""
    rows = sorted(counts)
    fresh: dict[tuple[UsageKey, int], float] = {}
    sums: dict[UsageKey, dict[int, float]] = {key: {} for key in watch}
    result = conn.execute(
        _FLUSH,
        {
            "users": [r[0][0] for r in rows],
            "clients": [r[0][1] for r in rows],
            "keys": [r[0][2] for r in rows],
            "windows": [r[1] for r in rows],
            "amounts": [r[2] for r in rows],
            "watch_users": [k[0] for k in watch],
            "watch_clients": [k[1] for k in watch],
            "watch_keys": [k[2] for k in watch],
            "oldest": oldest,
        },
    ).all()
    for user, client, key, window, amount, written in result:
        if written:
            fresh[((user, client, key), window)] = amount
        else:
            sums.setdefault((user, client, key), {})[window] = amount
    for (budget, window), amount in fresh.items():
        if window >= oldest:
            sums.setdefault(budget, {})[window] = amount
    return sums
