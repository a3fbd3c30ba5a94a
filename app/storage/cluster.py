"""The Kafka wire gateway's cluster: its id, and the registry of gateway nodes (leases on node ids)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.cluster import KafkaNode
from app.storage._sql import _ms


def cluster_id_get(conn: Connection) -> str | None:
    return conn.execute(text("SELECT cluster_id FROM txlog.cluster WHERE id = 1")).scalar()


def cluster_id_create(conn: Connection) -> None:
    """Make the cluster id if there is none yet (the migration that creates the table makes it; a
    schema built from the tables alone has none): a random UUID as Kafka writes one, URL-safe
    base64 without padding."""
    conn.execute(
        text(
            "INSERT INTO txlog.cluster (id, cluster_id) "
            "VALUES (1, translate(rtrim(encode(uuid_send(gen_random_uuid()), 'base64'), '='), '+/', '-_')) "
            "ON CONFLICT (id) DO NOTHING"
        )
    )


def kafka_node_claim(
    conn: Connection,
    node_id: int,
    host: str,
    port: int,
    token: str,
    lease_ms: int,
    listeners: Mapping[str, Any] | None = None,
    rack: str | None = None,
    read_replica: bool = False,
) -> bool:
    """Take or renew ``node_id`` for the process ``token`` until ``lease_ms`` from now (the
    database's clock): granted when the id is free, its lease has ended, or ``token`` holds it
    already (a renewal, also after its lease ended if nobody took the id meanwhile). False when
    another process holds it, its lease running. ``listeners``: every listener of the process
    ({name: {"host", "port", "security_protocol"}}), kept with the lease, as are its ``rack`` and
    whether it is a ``read_replica``."""
    row = conn.execute(
        text(
            """
            INSERT INTO txlog.kafka_nodes (node_id, host, port, process_token, registered_at, expires_at, listeners, rack, read_replica)
            VALUES (:node_id, :host, :port, :token, clock_timestamp(), clock_timestamp() + make_interval(secs => :lease_ms / 1000.0),
                    CAST(:listeners AS jsonb), :rack, :read_replica)
            ON CONFLICT (node_id) DO UPDATE
            SET host = EXCLUDED.host, port = EXCLUDED.port, process_token = EXCLUDED.process_token, listeners = EXCLUDED.listeners,
                rack = EXCLUDED.rack, read_replica = EXCLUDED.read_replica,
                registered_at = CASE WHEN txlog.kafka_nodes.process_token = EXCLUDED.process_token
                                     THEN txlog.kafka_nodes.registered_at ELSE EXCLUDED.registered_at END,
                expires_at = EXCLUDED.expires_at
            WHERE txlog.kafka_nodes.process_token = EXCLUDED.process_token OR txlog.kafka_nodes.expires_at <= clock_timestamp()
            RETURNING node_id
            """
        ),
        {
            "node_id": node_id,
            "host": host,
            "port": port,
            "token": token,
            "lease_ms": lease_ms,
            "listeners": json.dumps(dict(listeners or {})),
            "rack": rack,
            "read_replica": read_replica,
        },
    ).first()
    return row is not None


def kafka_node_release(conn: Connection, node_id: int, token: str) -> None:
    conn.execute(
        text("DELETE FROM txlog.kafka_nodes WHERE node_id = :node_id AND process_token = :token"),
        {"node_id": node_id, "token": token},
    )


def kafka_node_get(conn: Connection, node_id: int) -> KafkaNode | None:
    row = conn.execute(
        text(f"SELECT node_id, host, port, {_ms('expires_at')} FROM txlog.kafka_nodes WHERE node_id = :node_id"),
        {"node_id": node_id},
    ).first()
    return KafkaNode(*row) if row else None


def kafka_nodes_live(conn: Connection) -> list[KafkaNode]:
    """The nodes whose lease runs, in node id order."""
    rows = conn.execute(
        text(
            f"SELECT node_id, host, port, {_ms('expires_at')}, listeners, rack, read_replica FROM txlog.kafka_nodes "
            "WHERE expires_at > clock_timestamp() ORDER BY node_id"
        )
    )
    return [KafkaNode(*r) for r in rows]


# --- RocketMQ gateways -----------------------------------------------------------------------------


def rocketmq_gateway_claim(conn: Connection, token: str, host: str, port: int, lease_ms: int) -> None:
    """Enter or renew the RocketMQ gateway process ``token``, at ``host``:``port``, until
    ``lease_ms`` from now (the database's clock)."""
    conn.execute(
        text(
            """
            INSERT INTO txlog.rocketmq_gateways (process_token, host, port, registered_at, expires_at)
            VALUES (:token, :host, :port, clock_timestamp(), clock_timestamp() + make_interval(secs => :lease_ms / 1000.0))
            ON CONFLICT (process_token) DO UPDATE
            SET host = EXCLUDED.host, port = EXCLUDED.port, expires_at = EXCLUDED.expires_at
            """
        ),
        {"token": token, "host": host, "port": port, "lease_ms": lease_ms},
    )


def rocketmq_gateway_release(conn: Connection, token: str) -> None:
    conn.execute(text("DELETE FROM txlog.rocketmq_gateways WHERE process_token = :token"), {"token": token})


def rocketmq_gateways_live(conn: Connection) -> list[tuple[str, str, int]]:
    """(token, host, port) of the gateways whose lease runs, the longest registered first. Entries
    whose lease ended long ago (an hour) are deleted on the way: the table stays the size of the
    live set."""
    conn.execute(text("DELETE FROM txlog.rocketmq_gateways WHERE expires_at < clock_timestamp() - interval '1 hour'"))
    rows = conn.execute(
        text(
            "SELECT process_token, host, port FROM txlog.rocketmq_gateways "
            "WHERE expires_at > clock_timestamp() ORDER BY registered_at, process_token"
        )
    )
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]
