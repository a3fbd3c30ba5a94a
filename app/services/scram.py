"""Principals' SCRAM credentials: Kafka's AlterUserScramCredentials and DescribeUserScramCredentials,
and ``txlog principals scram set/delete``.

A SCRAM user is a principal: the same name signs in over HTTP with the principal's token and on the
Kafka wire with SASL/PLAIN (that token) or SCRAM (a password of its own, per mechanism). Kafka
creates users implicitly: an upsertion for a name that is no principal creates the principal, with
a fresh token that no one is told, so it signs in only by SCRAM. A revoked principal is refused
(UNACCEPTABLE_CREDENTIAL): revoking deletes its credentials, and a principal created again under the
name (``txlog principals create``, a new token) starts without them. Every change raises
``security_version`` in its database transaction, so every process's ``Authorizer`` reloads.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Sequence

from sqlalchemy.engine import Connection

from app.domain import scram
from app.domain.acl_bindings import invalid_principal_name
from app.domain.scram import DESCRIBE_DUPLICATE, DESCRIBE_NOT_FOUND, Deletion, Refusal, Upsertion
from app.errors import ErrorCode, TxlogError
from app.services.security import new_token
from app.storage import scram as scram_sql
from app.storage import security as sql
from app.storage.db import Database


@dataclass(frozen=True)
class AlterResult:
    user: str
    error: Refusal | None  # None: done


@dataclass(frozen=True)
class UserCredentials:
    user: str
    credentials: tuple[tuple[str, int], ...]  # (mechanism, iterations)
    error: Refusal | None = None


def alter_credentials(db: Database, deletions: Sequence[Deletion], upsertions: Sequence[Upsertion]) -> list[AlterResult]:
    """Kafka's AlterUserScramCredentials: one result per user named, in the order first named.
    The checks that need nothing stored are the domain's (``scram.alteration_refusals``); a
    deletion of a credential that does not exist is RESOURCE_NOT_FOUND. The changes that pass
    are made in one database transaction."""
    refused = scram.alteration_refusals(deletions, upsertions)
    order = scram.users_named(deletions, upsertions)
    with db.transaction() as conn:
        changed = False
        for d in deletions:
            if d.user in refused:
                continue
            if not scram_sql.scram_delete(conn, d.user, scram.BY_TYPE[d.mechanism_type].name):
                refused[d.user] = Refusal(ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
            else:
                changed = True
        for u in upsertions:
            if u.user in refused:
                continue
            why = _principal_for_credentials(conn, u.user)
            if why is not None:
                refused[u.user] = why
                continue
            mech = scram.BY_TYPE[u.mechanism_type]
            scram_sql.scram_upsert(
                conn, u.user, scram.credential_from_salted_password(mech, u.salt, u.salted_password, u.iterations)
            )
            changed = True
        if changed:
            sql.security_version_bump(conn)
    return [AlterResult(user, refused.get(user)) for user in order]


def _principal_for_credentials(conn: Connection, name: str) -> Refusal | None:
    """The active principal ``name`` locked against a concurrent revoke (created, with a token no
    one is told, when there is none), or why it cannot have credentials."""
    problem = invalid_principal_name(name)
    if problem is not None:
        return Refusal(ErrorCode.UNACCEPTABLE_CREDENTIAL, problem)
    revoked = scram_sql.principal_lock(conn, name)
    if revoked is None:
        _, token_id, hashed = new_token()
        sql.principal_insert(conn, name, token_id, hashed, replace_revoked=False)
        revoked = scram_sql.principal_lock(conn, name)
    if revoked:
        return Refusal(ErrorCode.UNACCEPTABLE_CREDENTIAL, f"Principal {name!r} is revoked: create it again first")
    return None


def describe_credentials(db: Database, users: Sequence[str] | None) -> list[UserCredentials]:
    """Kafka's DescribeUserScramCredentials: every user with credentials (``users`` None or empty),
    else each user named once, in the order named: a user named twice DUPLICATE_RESOURCE, one
    without credentials RESOURCE_NOT_FOUND."""
    named = list(dict.fromkeys(users)) if users else None
    with db.read() as conn:
        rows = scram_sql.scram_iterations(conn, named)
    found: dict[str, list[tuple[str, int]]] = {}
    for principal, mechanism, iterations in rows:
        found.setdefault(principal, []).append((mechanism, iterations))
    if named is None:
        return [UserCredentials(user, tuple(creds)) for user, creds in found.items()]
    twice = scram.duplicates(users or ())
    results = []
    for user in named:
        if user in twice:
            results.append(UserCredentials(user, (), Refusal(ErrorCode.DUPLICATE_RESOURCE, DESCRIBE_DUPLICATE + user)))
        elif user not in found:
            results.append(UserCredentials(user, (), Refusal(ErrorCode.RESOURCE_NOT_FOUND, DESCRIBE_NOT_FOUND + user)))
        else:
            results.append(UserCredentials(user, tuple(found[user])))
    return results


def _raise(result: AlterResult) -> None:
    if result.error is not None:
        raise TxlogError(result.error.code, result.error.message)


def set_password(db: Database, name: str, mechanism: str, password: str, iterations: int = scram.DEFAULT_ITERATIONS) -> None:
    """``txlog principals scram set``: the credential of ``password`` under a fresh salt, as an
    AlterUserScramCredentials upsertion (the same rules, the principal created when missing)."""
    if not password:
        raise TxlogError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Password must not be empty")
    mech = scram.mechanism(mechanism)
    salt = secrets.token_bytes(scram.SALT_BYTES)
    why = scram.iterations_error(iterations)
    if why is not None:
        raise TxlogError(ErrorCode.UNACCEPTABLE_CREDENTIAL, f"{why}: {scram.MIN_ITERATIONS} to {scram.MAX_ITERATIONS}")
    salted = scram.salted_password(mech, password, salt, iterations)
    (result,) = alter_credentials(db, [], [Upsertion(name, mech.kafka_type, iterations, salt, salted)])
    _raise(result)


def delete_credential(db: Database, name: str, mechanism: str) -> None:
    """``txlog principals scram delete``: RESOURCE_NOT_FOUND when there is none."""
    (result,) = alter_credentials(db, [Deletion(name, scram.mechanism(mechanism).kafka_type)], [])
    _raise(result)


def credentials_by_principal(db: Database) -> dict[str, list[tuple[str, int]]]:
    """Every principal's ``(mechanism, iterations)``: what ``txlog principals list`` shows (never keys)."""
    return {d.user: list(d.credentials) for d in describe_credentials(db, None)}
