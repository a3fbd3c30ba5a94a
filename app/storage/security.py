"""The SQL of principals, ACLs and the security version row, one function per statement, named
noun-first. Every change raises ``security_version`` in the same database transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.acl_bindings import AclBinding, Operation, PatternType, PermissionType, ResourceType, StoredPrincipal

_PRINCIPAL_COLUMNS = (
    "name, token_id, token_hash, (extract(epoch FROM created_at) * 1000)::bigint, (extract(epoch FROM revoked_at) * 1000)::bigint"
)


def _principal(row: Any) -> StoredPrincipal:
    return StoredPrincipal(row[0], row[1], bytes(row[2]), row[3], row[4])


def security_version_get(conn: Connection) -> int:
    return conn.execute(text("SELECT version FROM txlog.security_version WHERE id = 1")).scalar_one()


def security_version_bump(conn: Connection) -> int:
    return conn.execute(
        text("UPDATE txlog.security_version SET version = version + 1 WHERE id = 1 RETURNING version")
    ).scalar_one()


def session_key_get_or_set(conn: Connection, candidate: bytes) -> bytes:
    """The admin pages' session key: the stored one, else ``candidate``, stored now."""
    conn.execute(
        text("UPDATE txlog.security_version SET session_key = :k WHERE id = 1 AND session_key IS NULL"), {"k": candidate}
    )
    return bytes(conn.execute(text("SELECT session_key FROM txlog.security_version WHERE id = 1")).scalar_one())


def principal_list(conn: Connection) -> list[StoredPrincipal]:
    rows = conn.execute(text(f"SELECT {_PRINCIPAL_COLUMNS} FROM txlog.principals ORDER BY name")).all()
    return [_principal(r) for r in rows]


def principal_get(conn: Connection, name: str) -> StoredPrincipal | None:
    row = conn.execute(text(f"SELECT {_PRINCIPAL_COLUMNS} FROM txlog.principals WHERE name = :n"), {"n": name}).first()
    return _principal(row) if row else None


def principal_insert(
    conn: Connection, name: str, token_id: str, token_hash: bytes, replace_revoked: bool
) -> StoredPrincipal | None:
    """A new principal; None if the name is taken (by a revoked one too, unless ``replace_revoked``:
    then that row gets the new token and is active again)."""
    row = conn.execute(
        text(
            f"""
            INSERT INTO txlog.principals (name, token_id, token_hash) VALUES (:n, :id, :h)
            ON CONFLICT (name) DO UPDATE
            SET token_id = EXCLUDED.token_id, token_hash = EXCLUDED.token_hash, created_at = now(), revoked_at = NULL
            WHERE txlog.principals.revoked_at IS NOT NULL AND :replace
            RETURNING {_PRINCIPAL_COLUMNS}
            """
        ),
        {"n": name, "id": token_id, "h": token_hash, "replace": replace_revoked},
    ).first()
    return _principal(row) if row else None


def principal_put(conn: Connection, name: str, token_id: str, token_hash: bytes) -> bool:
    """The principal with exactly this token, active (created, or its token replaced); True if that
    changed anything."""
    row = conn.execute(
        text(
            """
            INSERT INTO txlog.principals (name, token_id, token_hash) VALUES (:n, :id, :h)
            ON CONFLICT (name) DO UPDATE
            SET token_id = EXCLUDED.token_id, token_hash = EXCLUDED.token_hash, revoked_at = NULL
            WHERE txlog.principals.token_id <> EXCLUDED.token_id OR txlog.principals.revoked_at IS NOT NULL
            RETURNING name
            """
        ),
        {"n": name, "id": token_id, "h": token_hash},
    ).first()
    return row is not None


def principal_revoke(conn: Connection, name: str) -> StoredPrincipal | None:
    """Revoke the principal's token (a revoked one stays as it was); None if there is no such principal."""
    conn.execute(text("UPDATE txlog.principals SET revoked_at = now() WHERE name = :n AND revoked_at IS NULL"), {"n": name})
    return principal_get(conn, name)


_ACL_COLUMNS = "principal, resource_type, resource_name, pattern_type, operation, permission_type"


def _acl(row: Any) -> AclBinding:
    return AclBinding(row[0], ResourceType(row[1]), row[2], PatternType(row[3]), Operation(row[4]), PermissionType(row[5]))


def _acl_params(b: AclBinding) -> dict[str, str]:
    return b.to_dict()


def acl_list(conn: Connection) -> list[AclBinding]:
    rows = conn.execute(
        text(
            f"SELECT {_ACL_COLUMNS} FROM txlog.acls ORDER BY principal, resource_type, resource_name, pattern_type, operation, permission_type"
        )
    ).all()
    return [_acl(r) for r in rows]


def acl_insert(conn: Connection, binding: AclBinding) -> bool:
    """True if the ACL is new."""
    row = conn.execute(
        text(
            f"""
            INSERT INTO txlog.acls ({_ACL_COLUMNS})
            VALUES (:principal, :resource_type, :resource_name, :pattern_type, :operation, :permission_type)
            ON CONFLICT DO NOTHING RETURNING principal
            """
        ),
        _acl_params(binding),
    ).first()
    return row is not None


def acl_delete(conn: Connection, binding: AclBinding) -> bool:
    """True if the ACL existed."""
    row = conn.execute(
        text(
            """
            DELETE FROM txlog.acls
            WHERE principal = :principal AND resource_type = :resource_type AND resource_name = :resource_name
              AND pattern_type = :pattern_type AND operation = :operation AND permission_type = :permission_type
            RETURNING principal
            """
        ),
        _acl_params(binding),
    ).first()
    return row is not None
