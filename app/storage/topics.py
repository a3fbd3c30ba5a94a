"""Topics and their partitions: create, list, configure, and which partitions exist."""

from __future__ import annotations

import json
import uuid
from typing import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.log import TopicMetadata


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
    conn.execute(
        text(
            "INSERT INTO txlog.partitions (topic, partition) "
            "SELECT :name, g FROM generate_series(0, :n - 1) AS g"
        ),
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
    conn.execute(text("UPDATE txlog.topics SET config = CAST(:config AS jsonb) WHERE name = :name"), {"name": name, "config": json.dumps(config)})


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
