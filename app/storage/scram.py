"""The SQL of principals' SCRAM credentials (``txlog.scram_credentials``), one function per
statement. The callers raise ``security_version`` in the same database transaction as a change."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.scram import ScramCredential


def scram_list(conn: Connection) -> list[tuple[str, ScramCredential]]:
    """Every credential with its principal's name, by principal and mechanism."""
    rows = conn.execute(
        text(
            "SELECT principal, mechanism, salt, iterations, stored_key, server_key "
            "FROM txlog.scram_credentials ORDER BY principal, mechanism"
        )
    ).all()
    return [(r[0], ScramCredential(r[1], bytes(r[2]), r[3], bytes(r[4]), bytes(r[5]))) for r in rows]


def scram_iterations(conn: Connection, principals: Sequence[str] | None) -> list[tuple[str, str, int]]:
    """``(principal, mechanism, iterations)`` of the principals named (None: every one's)."""
    if principals is None:
        rows = conn.execute(
            text("SELECT principal, mechanism, iterations FROM txlog.scram_credentials ORDER BY principal, mechanism")
        ).all()
    else:
        rows = conn.execute(
            text(
                "SELECT principal, mechanism, iterations FROM txlog.scram_credentials "
                "WHERE principal = ANY(:names) ORDER BY principal, mechanism"
            ),
            {"names": list(principals)},
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


def scram_upsert(conn: Connection, principal: str, credential: ScramCredential) -> None:
    conn.execute(
        text(
            """
            INSERT INTO txlog.scram_credentials (principal, mechanism, salt, iterations, stored_key, server_key)
            VALUES (:p, :m, :salt, :i, :stored, :server)
            ON CONFLICT (principal, mechanism) DO UPDATE
            SET salt = EXCLUDED.salt, iterations = EXCLUDED.iterations, stored_key = EXCLUDED.stored_key,
                server_key = EXCLUDED.server_key, updated_at = now()
            """
        ),
        {
            "p": principal,
            "m": credential.mechanism,
            "salt": credential.salt,
            "i": credential.iterations,
            "stored": credential.stored_key,
            "server": credential.server_key,
        },
    )


def scram_delete(conn: Connection, principal: str, mechanism: str) -> bool:
    """True if the credential existed."""
    row = conn.execute(
        text("DELETE FROM txlog.scram_credentials WHERE principal = :p AND mechanism = :m RETURNING principal"),
        {"p": principal, "m": mechanism},
    ).first()
    return row is not None


def scram_delete_all(conn: Connection, principal: str) -> int:
    """Delete every credential of the principal; how many there were."""
    return conn.execute(text("DELETE FROM txlog.scram_credentials WHERE principal = :p"), {"p": principal}).rowcount


def principal_lock(conn: Connection, name: str) -> bool | None:
    """Lock the principal's row against a concurrent revoke (which updates it) until the transaction
    ends; whether it is revoked, or None when there is no such principal."""
    row = conn.execute(
        text("SELECT revoked_at IS NOT NULL FROM txlog.principals WHERE name = :n FOR NO KEY UPDATE"), {"n": name}
    ).first()
    return bool(row[0]) if row else None
