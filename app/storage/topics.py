"""Topics and their partitions: create, list, configure, and which partitions exist."""

from __future__ import annotations

import json
import uuid
from typing import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.log import TopicMetadata
from app.errors import ErrorCode, TxlogError
from app.storage._sql import OPEN_STATES_SQL
from app.storage.log import NOTIFY_CHANNEL


def topic_insert(conn: Connection, name: str, partitions: int, config: dict) -> bool:
    row = conn.execute(
        text(
            "INSERT INTO txlog.topics (name, partitions, config) VALUES (:name, :n, CAST(:config AS jsonb)) "
            "ON CONFLICT (name) DO NOTHING RETURNING name"
        ),
        {"name": name, "n": partitions, "config": json.dumps(config)},
    ).first()
    if row is None:
        return False
    # A deleted topic of this name whose records are still being deleted: read in a statement of its
    # own, so that a deletion committed while the insert waited on its row is seen.
    if conn.execute(text("SELECT 1 FROM txlog.deleted_partitions WHERE topic = :name LIMIT 1"), {"name": name}).first():
        raise TxlogError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' is marked for deletion.")
    conn.execute(
        text("INSERT INTO txlog.partitions (topic, partition) SELECT :name, g FROM generate_series(0, :n - 1) AS g"),
        {"name": name, "n": partitions},
    )
    return True


def topic_list(conn: Connection) -> list[tuple[str, int]]:
    return [tuple(r) for r in conn.execute(text("SELECT name, partitions FROM txlog.topics ORDER BY name"))]


def topic_config_get(conn: Connection, name: str, for_update: bool = False) -> dict | None:
    row = conn.execute(
        text("SELECT config FROM txlog.topics WHERE name = :name" + (" FOR UPDATE" if for_update else "")), {"name": name}
    ).first()
    return dict(row[0]) if row else None


def topic_config_set(conn: Connection, name: str, config: dict) -> None:
    conn.execute(
        text("UPDATE txlog.topics SET config = CAST(:config AS jsonb) WHERE name = :name"),
        {"name": name, "config": json.dumps(config)},
    )


def topic_partitions(conn: Connection, name: str, for_update: bool = False) -> int | None:
    return conn.execute(
        text("SELECT partitions FROM txlog.topics WHERE name = :name" + (" FOR UPDATE" if for_update else "")), {"name": name}
    ).scalar()


def partitions_add(conn: Connection, name: str, current: int, total: int) -> None:
    """Grow a topic from ``current`` to ``total`` partitions (its row locked by the caller)."""
    conn.execute(text("UPDATE txlog.topics SET partitions = :n WHERE name = :name"), {"name": name, "n": total})
    conn.execute(
        text("INSERT INTO txlog.partitions (topic, partition) SELECT :name, g FROM generate_series(:first, :n - 1) AS g"),
        {"name": name, "first": current, "n": total},
    )


def topics_version(conn: Connection) -> int:
    """The topic catalogue's version: it moves in every transaction that creates or deletes a topic
    or changes a partition count (a trigger on ``txlog.topics``, migration 0019). Read it before
    the topics it stands for."""
    return int(conn.execute(text("SELECT version FROM txlog.topics_version")).scalar_one())


def topics_metadata(
    conn: Connection, names: Sequence[str] | None = None, topic_ids: Sequence[uuid.UUID] | None = None
) -> list[TopicMetadata]:
    """Topics with their partition counts and ids, in name order: every one, or those named in
    ``names`` or identified in ``topic_ids`` that exist."""
    if names is None and topic_ids is None:
        rows = conn.execute(text("SELECT name, partitions, topic_id FROM txlog.topics ORDER BY name"))
    else:
        rows = conn.execute(
            text(
                "SELECT name, partitions, topic_id FROM txlog.topics "
                "WHERE name = ANY(CAST(:names AS text[])) OR topic_id = ANY(CAST(:ids AS uuid[])) ORDER BY name"
            ),
            {"names": list(names or ()), "ids": list(topic_ids or ())},
        )
    return [TopicMetadata(*r) for r in rows]


def partitions_missing(conn: Connection, wanted: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    if not wanted:
        return []
    rows = conn.execute(
        text(
            "SELECT w.topic, w.partition FROM unnest(CAST(:topics AS text[]), CAST(:parts AS int[])) AS w(topic, partition) "
            "WHERE NOT EXISTS (SELECT 1 FROM txlog.partitions p WHERE p.topic = w.topic AND p.partition = w.partition)"
        ),
        {"topics": [t for t, _ in wanted], "parts": [p for _, p in wanted]},
    )
    return [(r[0], r[1]) for r in rows]


def topic_lock_for_delete(conn: Connection, name: str) -> uuid.UUID | None:
    """The topic's id, with its row and every one of its partitions' rows locked (the append locks:
    no batch or marker lands on it until the deletion commits); None for no such topic."""
    topic_id = conn.execute(text("SELECT topic_id FROM txlog.topics WHERE name = :name FOR UPDATE"), {"name": name}).scalar()
    if topic_id is not None:
        conn.execute(text("SELECT 1 FROM txlog.partitions WHERE topic = :name ORDER BY partition FOR UPDATE"), {"name": name})
    return topic_id


def open_transactions_on(conn: Connection, name: str) -> list[str]:
    """The transactional ids whose open transaction has a partition of topic ``name``."""
    rows = conn.execute(
        text(
            "SELECT DISTINCT t.transactional_id FROM txlog.transaction_partitions m "
            "JOIN txlog.transactions t ON t.transactional_id = m.transactional_id "
            f"WHERE m.topic = :name AND t.state IN {OPEN_STATES_SQL} ORDER BY 1"
        ),
        {"name": name},
    )
    return [r[0] for r in rows]


_DELETE_WITH_TOPIC = (
    text("DELETE FROM txlog.group_offsets WHERE topic = :name"),
    text("DELETE FROM txlog.pending_group_offsets WHERE topic = :name"),
    text("DELETE FROM txlog.producer_partitions WHERE topic = :name"),
    text("DELETE FROM txlog.transaction_partitions WHERE topic = :name"),
)


def topic_delete(conn: Connection, name: str) -> None:
    """Delete topic ``name`` (locked by ``topic_lock_for_delete``, its open transactions ended):
    its partitions and what refers to them — committed and pending group offsets, producer states,
    its place in transactions — at once; its stored records and aborted ranges are left for
    ``retention.deleted_log_trim``, each partition with records noted in ``deleted_partitions``."""
    params = {"name": name}
    conn.execute(
        text(
            "INSERT INTO txlog.deleted_partitions (topic, partition, stored_start_offset, end_offset, topic_id) "
            "SELECT p.topic, p.partition, p.stored_start_offset, p.next_offset, t.topic_id "
            "FROM txlog.partitions p JOIN txlog.topics t ON t.name = p.topic "
            "WHERE p.topic = :name AND p.stored_start_offset < p.next_offset"
        ),
        params,
    )
    for statement in _DELETE_WITH_TOPIC:
        conn.execute(statement, params)
    conn.execute(text("DELETE FROM txlog.topics WHERE name = :name"), params)  # its partitions and fetch listeners with it
    # Every process forgets its listening leases on the topic (they went with it), so a topic made
    # again under the name is leased anew by the next long poll (``notify.AppendNotifier``).
    conn.execute(
        text("SELECT pg_notify(:channel, :payload)"), {"channel": NOTIFY_CHANNEL, "payload": deleted_topic_payload(name)}
    )


def deleted_topic_payload(name: str) -> str:
    """The notification a topic's deletion sends on the append channel (appends send
    ``topic:partition``)."""
    return f"{name}:*"
