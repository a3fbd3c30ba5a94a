"""Principals, their API tokens and Kafka's ACLs: the management operations (CreateAcls,
DeleteAcls, DescribeAcls; principals created, listed and revoked) and the ``Authorizer`` each server
process asks on every request.

Tokens are ``txlog_<token_id>_<secret>``: the token id finds the principal, the secret is checked
against its scrypt hash (salted with the token id). A token in any other form (``TXLOG_ADMIN_TOKEN``)
is its own secret, found by an id derived from its SHA-256.

The database is the truth. Each process keeps a snapshot of the principals, their SCRAM credentials
and the ACLs and polls the
one-row ``security_version`` every ``POLL_INTERVAL_S``, reloading when it moved: a change is effective
on every worker within a second, and a request costs no database round trip. A token's scrypt check
is done once per process; later requests with it are matched by its SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from app.domain.acl_bindings import (
    CLUSTER_NAME,
    WILDCARD,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    PermissionType,
    ResourceType,
    StoredPrincipal,
    authorize,
    authorize_any,
    invalid_principal_name,
    validate_binding,
)
from app.domain.acls import Api, Denied, denied, shown
from app.domain.scram import ScramCredential
from app.errors import ErrorCode, TxlogError
from app.storage import scram as scram_sql
from app.storage import security as sql
from app.storage.db import Database

log = logging.getLogger("txlog.security")

TOKEN_PREFIX = "txlog_"
POLL_INTERVAL_S = 0.25
# scrypt's cost: about 16 MiB and a few tens of milliseconds per check, once per token and process.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
ADMIN_PRINCIPAL = "admin"

DENIED_ERROR: Mapping[ResourceType, ErrorCode] = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
}


# --- tokens ---------------------------------------------------------------------------------------


def token_parts(token: str) -> tuple[str, str]:
    """``(token_id, secret)`` of a token."""
    if token.startswith(TOKEN_PREFIX) and token.count("_") >= 2:
        token_id, _, secret = token[len(TOKEN_PREFIX) :].partition("_")
        if token_id and secret:
            return token_id, secret
    return "s" + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()[:24], token


def token_hash(token_id: str, secret: str) -> bytes:
    return hashlib.scrypt(
        secret.encode("utf-8", "surrogateescape"),
        salt=b"txlog token " + token_id.encode(),
        n=SCRYPT_N,
        r=SCRYPT_R,
        p=SCRYPT_P,
        dklen=32,
    )


# RocketMQ's signature (MQv2-HMAC-SHA1) is an HMAC keyed with the secret itself, which the server
# must hold to check it; txlog keeps only a token's scrypt hash. The RocketMQ secret key of a
# principal is therefore derived from that hash: its holder derives it from the token
# (``rocketmq_secret_key``), the gateway from the stored hash. A new token makes a new key; a
# revoked principal's key opens nothing.
ROCKETMQ_KEY_LABEL = b"txlog rocketmq secret key"


def rocketmq_key_of_hash(stored_hash: bytes) -> str:
    return hmac.new(stored_hash, ROCKETMQ_KEY_LABEL, hashlib.sha256).hexdigest()


def rocketmq_secret_key(token: str) -> str:
    """The RocketMQ secret key (``Credentials``' secret) of the principal whose token this is."""
    return rocketmq_key_of_hash(token_hash(*token_parts(token)))


# The key checked for an access key that is no active principal's: the same work as for a known
# one, so the answer tells nothing of who exists.
_UNKNOWN_KEY_SECRET = secrets.token_bytes(32)


def new_token() -> tuple[str, str, bytes]:
    """A fresh random token, its id and its hash."""
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return f"{TOKEN_PREFIX}{token_id}_{secret}", token_id, token_hash(token_id, secret)


# --- management (the CLI on the database, and the HTTP API) ---------------------------------------


@dataclass(frozen=True)
class NewPrincipal:
    principal: StoredPrincipal
    token: str  # shown once, never stored


def _valid_principal(name: str) -> None:
    problem = invalid_principal_name(name)
    if problem is not None:
        raise TxlogError(ErrorCode.INVALID_REQUEST, problem)


def create_principal(db: Database, name: str) -> NewPrincipal:
    """A principal with a new token. A revoked principal's name may be taken again (a new token);
    an active one's not."""
    _valid_principal(name)
    token, token_id, hashed = new_token()
    with db.transaction() as conn:
        stored = sql.principal_insert(conn, name, token_id, hashed, replace_revoked=True)
        if stored is None:
            raise TxlogError(ErrorCode.INVALID_REQUEST, f"Principal {name!r} exists: revoke it first to issue a new token")
        sql.security_version_bump(conn)
    return NewPrincipal(stored, token)


def list_principals(db: Database) -> list[StoredPrincipal]:
    with db.read() as conn:
        return sql.principal_list(conn)


def revoke_principal(db: Database, name: str) -> StoredPrincipal:
    with db.transaction() as conn:
        stored = sql.principal_revoke(conn, name)
        if stored is None:
            raise TxlogError(ErrorCode.INVALID_REQUEST, f"No principal named {name!r}")
        # Its SCRAM passwords go with its token: a principal created again under the name starts without.
        scram_sql.scram_delete_all(conn, name)
        sql.security_version_bump(conn)
    return stored


def _valid_acl(b: AclBinding) -> None:
    why = validate_binding(b)
    if why:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Invalid ACL: {why}")


def add_acls(db: Database, bindings: Sequence[AclBinding]) -> list[AclBinding]:
    """Kafka's CreateAcls: each binding stored (one already there stays); the new ones answered."""
    for b in bindings:
        _valid_acl(b)
    with db.transaction() as conn:
        added = [b for b in bindings if sql.acl_insert(conn, b)]
        if added:
            sql.security_version_bump(conn)
    return added


def remove_acls(db: Database, bindings: Sequence[AclBinding]) -> list[AclBinding]:
    """Kafka's DeleteAcls of exact bindings: the ones that existed answered."""
    with db.transaction() as conn:
        removed = [b for b in bindings if sql.acl_delete(conn, b)]
        if removed:
            sql.security_version_bump(conn)
    return removed


def list_acls(db: Database, principal: str | None = None) -> list[AclBinding]:
    """Kafka's DescribeAcls: every ACL, or those of one principal (``*``'s not included)."""
    with db.read() as conn:
        found = sql.acl_list(conn)
    return [a for a in found if principal is None or a.principal == principal]


def describe_acls(db: Database, acl_filter: AclFilter) -> list[AclBinding]:
    """Kafka's DescribeAcls of an AclBindingFilter: the ACLs it matches."""
    with db.read() as conn:
        return [a for a in sql.acl_list(conn) if acl_filter.matches(a)]


def delete_acls(db: Database, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
    """Kafka's DeleteAcls of AclBindingFilters, in one database transaction: each filter's matching
    ACLs, deleted (an ACL two filters match is answered by both, as Kafka answers it)."""
    with db.transaction() as conn:
        stored = sql.acl_list(conn)
        matched = [[a for a in stored if f.matches(a)] for f in filters]
        removed = [a for a in {a: None for found in matched for a in found} if sql.acl_delete(conn, a)]
        if removed:
            sql.security_version_bump(conn)
    return matched


def admin_bindings(name: str = ADMIN_PRINCIPAL) -> list[AclBinding]:
    """All on every resource: what ``TXLOG_ADMIN_TOKEN``'s principal may do."""
    return [
        AclBinding(
            name,
            rt,
            CLUSTER_NAME if rt is ResourceType.CLUSTER else WILDCARD,
            PatternType.LITERAL,
            Operation.ALL,
            PermissionType.ALLOW,
        )
        for rt in ResourceType
    ]


def ensure_admin_principal(db: Database, token: str) -> None:
    """``TXLOG_ADMIN_TOKEN`` as the principal ``admin`` with All on every resource (its token
    replaced when the setting changed). Safe to run from several processes at once."""
    token_id, secret = token_parts(token)
    with db.transaction() as conn:
        current = sql.principal_get(conn, ADMIN_PRINCIPAL)
        unchanged = current is not None and current.token_id == token_id and current.revoked_at_ms is None
        if unchanged and hmac.compare_digest(current.token_hash, token_hash(token_id, secret)):  # type: ignore[union-attr]  # unchanged: it exists
            changed = False
        else:
            changed = sql.principal_put(conn, ADMIN_PRINCIPAL, token_id, token_hash(token_id, secret))
        changed = any([sql.acl_insert(conn, b) for b in admin_bindings()]) or changed
        if changed:
            sql.security_version_bump(conn)


def session_key(db: Database) -> bytes:
    """The key that signs the admin pages' sessions, the same in every process."""
    with db.transaction() as conn:
        return sql.session_key_get_or_set(conn, secrets.token_bytes(32))


# --- the per-process authorizer -------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    version: int
    by_token_id: Mapping[str, StoredPrincipal]  # active principals only
    acls: Mapping[str, tuple[AclBinding, ...]]  # per principal, ``*``'s ACLs included
    wildcard: tuple[AclBinding, ...]
    # SCRAM credentials by (principal, mechanism), active principals only.
    scram: Mapping[tuple[str, str], tuple[StoredPrincipal, ScramCredential]] = field(default_factory=dict)
    by_name: Mapping[str, StoredPrincipal] = field(default_factory=dict)  # active principals only

    @classmethod
    def load(
        cls,
        version: int,
        principals: Iterable[StoredPrincipal],
        acls: Iterable[AclBinding],
        scram: Iterable[tuple[str, ScramCredential]] = (),
    ) -> "Snapshot":
        active = {p.token_id: p for p in principals if p.revoked_at_ms is None}
        by_name = {p.name: p for p in active.values()}
        credentials = {(name, c.mechanism): (by_name[name], c) for name, c in scram if name in by_name}
        everyone = tuple(a for a in acls if a.principal == WILDCARD)
        own: dict[str, list[AclBinding]] = {}
        for a in acls:
            if a.principal != WILDCARD:
                own.setdefault(a.principal, []).append(a)
        merged = {p.name: tuple(own.get(p.name, ())) + everyone for p in active.values()}
        return cls(version, active, merged, everyone, credentials, by_name)

    def acls_of(self, principal: str) -> tuple[AclBinding, ...]:
        return self.acls.get(principal, self.wildcard)


@dataclass
class Authorizer:
    """Who is asking (authentication) and may they (ACLs), from a snapshot of the database's
    principals and ACLs that a thread keeps within ``POLL_INTERVAL_S`` of the truth."""

    db: Database
    poll_interval_s: float = POLL_INTERVAL_S
    _snapshot: Snapshot | None = None
    _verified: dict[bytes, str] = field(default_factory=dict)  # SHA-256 of a checked token -> its token id
    _decisions: dict[tuple, bool] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    # the snapshot

    def refresh(self) -> bool:
        """Reload if the version moved; True if it did. The version is read first, so the rows are
        at least as new as the version recorded."""
        with self.db.read() as conn:
            version = sql.security_version_get(conn)
            if self._snapshot is not None and self._snapshot.version == version:
                return False
            snapshot = Snapshot.load(version, sql.principal_list(conn), sql.acl_list(conn), scram_sql.scram_list(conn))
        with self._lock:
            self._snapshot = snapshot
            self._decisions = {}
        return True

    def snapshot(self) -> Snapshot:
        snap = self._snapshot
        if snap is None:
            self.refresh()
            snap = self._snapshot
        assert snap is not None
        return snap

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="txlog-acl-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self.refresh()
            except Exception:  # the database away: keep the last snapshot, try again
                log.warning("could not reload principals and ACLs", exc_info=True)

    # authentication

    @staticmethod
    def _digest(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()

    def principal_if_known(self, token: str) -> StoredPrincipal | None:
        """The principal of a token this process has checked already (no scrypt), if still active."""
        token_id = self._verified.get(self._digest(token))
        return self.snapshot().by_token_id.get(token_id) if token_id is not None else None

    def authenticate(self, token: str | None) -> StoredPrincipal:
        """The active principal whose token this is, else ``SASL_AUTHENTICATION_FAILED``."""
        if not token:
            raise TxlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, "No credentials: send Authorization: Bearer <token>")
        known = self.principal_if_known(token)
        if known is not None:
            return known
        token_id, secret = token_parts(token)
        stored = self.snapshot().by_token_id.get(token_id)
        if stored is None or not hmac.compare_digest(stored.token_hash, token_hash(token_id, secret)):
            raise TxlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, "Unknown or revoked token")
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[self._digest(token)] = token_id
        return stored

    def principal_by_token_id(self, token_id: str) -> StoredPrincipal | None:
        return self.snapshot().by_token_id.get(token_id)

    def scram_credential(self, name: str, mechanism: str) -> tuple[StoredPrincipal, ScramCredential] | None:
        """The active principal ``name`` and its credential for the SCRAM ``mechanism``, if it has one."""
        return self.snapshot().scram.get((name, mechanism))

    def authenticate_signed(self, name: str, check: Callable[[str], bool]) -> StoredPrincipal:
        """The active principal ``name`` if ``check`` accepts its RocketMQ secret key (a signature
        checked with it), else ``SASL_AUTHENTICATION_FAILED``."""
        stored = self.snapshot().by_name.get(name)
        if stored is not None:
            key = rocketmq_key_of_hash(stored.token_hash)
        else:
            key = hmac.new(_UNKNOWN_KEY_SECRET, name.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()
        if not check(key) or stored is None:
            raise TxlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, f"Authentication failed: invalid signature for {name!r}")
        return stored

    # authorization

    def allowed(self, principal: str, operation: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME) -> bool:
        key = (principal, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = authorize(self.snapshot().acls_of(principal), operation, resource_type, name)
            self._remember(key, decision)
        return decision

    def allowed_some(self, principal: str, operation: Operation, resource_type: ResourceType) -> bool:
        """May ``principal`` do ``operation`` on some resource of ``resource_type`` (Kafka's
        ``authorizeByResourceType``)?"""
        key = (principal, operation, resource_type)
        decision = self._decisions.get(key)
        if decision is None:
            decision = authorize_any(self.snapshot().acls_of(principal), operation, resource_type)
            self._remember(key, decision)
        return decision

    def _remember(self, key: tuple, decision: bool) -> None:
        if len(self._decisions) > 100_000:
            self._decisions = {}
        self._decisions[key] = decision

    def decisions(self, principal: str) -> "PrincipalDecisions":
        """``principal``'s answers, through this authorizer's cache (``app.domain.acl_bindings.Decisions``)."""
        return PrincipalDecisions(self, principal)

    def check(self, principal: str, api: Api, names: Mapping[str, str | Sequence[str] | None]) -> None:
        """Raise the Kafka error of the first check ``api`` fails for ``principal``."""
        refused = denied(self.decisions(principal), api, names)
        if refused is not None:
            raise denied_error(principal, api, refused)

    def visible(self, principal: str, api: Api, name: str) -> bool:
        """May ``principal`` see the item ``name`` of the answer of ``api`` (``FILTERED``)?"""
        return shown(self.decisions(principal), api, name)


@dataclass(frozen=True)
class PrincipalDecisions:
    """One principal's ``Decisions``, cached by its ``Authorizer``."""

    authorizer: Authorizer
    principal: str

    def allowed(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return self.authorizer.allowed(self.principal, operation, resource_type, name)

    def allowed_some(self, operation: Operation, resource_type: ResourceType) -> bool:
        return self.authorizer.allowed_some(self.principal, operation, resource_type)


def denied_error(principal: str, api: Api, refused: Denied) -> TxlogError:
    """Kafka's error for a refusal: the authorization error of the resource type refused."""
    c = refused.check
    what = "some" if refused.name == WILDCARD and c.resource_type is not ResourceType.CLUSTER else repr(refused.name)
    return TxlogError(
        DENIED_ERROR[c.resource_type],
        f"Principal {principal!r} may not {c.operation.value} {c.resource_type.value} {what} ({api.value})",
    )
