"""Kafka's ACLs as data and pure functions: resource types and pattern types, operations and
permission types, bindings and filters, principals, the matching rules of Kafka's authorizer and
Kafka's codes for them on the wire. The table of the operation each API needs on which resource is
``app.domain.acls``.

The rules (Kafka's ``AclAuthorizer`` / ``StandardAuthorizer``):

- An ACL binds a principal (or ``*``, every principal) to an operation on a resource pattern, with a
  permission type: ALLOW or DENY. A pattern is LITERAL (the name itself; the literal name ``*``
  matches every resource of its type) or PREFIXED (every name starting with it).
- DENY wins: one matching DENY refuses the operation whatever ALLOWs match.
- An ACL for ``All`` matches every operation, for ALLOW and DENY alike.
- Describe is implied by an ALLOW of Read, Write, Delete or Alter, and DescribeConfigs by an ALLOW
  of AlterConfigs (a DENY is never widened).
- Nothing matches: refused (no ``allow.everyone.if.no.acl.found``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Mapping, Protocol, Sequence

from app.domain.records import MAX_STRING_LENGTH


class ResourceType(Enum):
    TOPIC = "topic"
    GROUP = "group"
    TRANSACTIONAL_ID = "transactional_id"
    CLUSTER = "cluster"


class PatternType(Enum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(Enum):
    ALL = "All"
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    IDEMPOTENT_WRITE = "IdempotentWrite"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    CLUSTER_ACTION = "ClusterAction"

    @classmethod
    def parse(cls, text: str) -> "Operation":
        """``Read``, ``read``, ``IdempotentWrite``, ``idempotent_write``, ``idempotent-write``."""
        folded = text.replace("_", "").replace("-", "").lower()
        for op in cls:
            if op.value.lower() == folded:
                return op
        raise ValueError(f"unknown operation {text!r}: one of {', '.join(o.value for o in cls)}")


class PermissionType(Enum):
    ALLOW = "allow"
    DENY = "deny"


# The one name of the cluster resource, as in Kafka ("kafka-cluster").
CLUSTER_NAME = "txlog-cluster"
# A literal resource name or principal matching every one.
WILDCARD = "*"
# Kafka's User:ANONYMOUS: who a connection is that no one authenticated (a listener without SASL
# or client certificates). Only ACLs of ``*`` (or of ANONYMOUS) allow it anything; no principal may
# take the name.
ANONYMOUS = "ANONYMOUS"

# An ALLOW of any of these also allows Describe on the same resource.
IMPLIES_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})
# An ALLOW of an operation of a value also allows its key (Kafka's AclAuthorizer/StandardAuthorizer).
IMPLIED_BY: Mapping[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: IMPLIES_DESCRIBE,
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}

PRINCIPAL_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,128}$")
RESOURCE_NAME_MAX = MAX_STRING_LENGTH


def invalid_principal_name(name: str) -> str | None:
    """Why ``name`` cannot be a principal's, or None."""
    if not PRINCIPAL_NAME.match(name):
        return f"Principal name {name!r}: 1 to 128 of A-Z a-z 0-9 . _ @ -"
    if name == ANONYMOUS:
        return f"{ANONYMOUS} is who an unauthenticated connection is: no principal may take the name"
    return None


def principal_name(text: str) -> str:
    """A principal as Kafka's tools write it (``User:alice``) or bare (``alice``): the bare name."""
    return text[len("User:") :] if text.startswith("User:") else text


@dataclass(frozen=True)
class AclBinding:
    """One ACL: ``permission`` of ``operation`` on the resources of ``resource_type`` matched by
    ``resource_name`` / ``pattern_type``, for ``principal`` (a name, or ``*``)."""

    principal: str
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    operation: Operation
    permission: PermissionType

    def to_dict(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "resource_type": self.resource_type.value,
            "resource_name": self.resource_name,
            "pattern_type": self.pattern_type.value,
            "operation": self.operation.value,
            "permission_type": self.permission.value,
        }

    def matches(self, resource_type: ResourceType, name: str) -> bool:
        if resource_type is not self.resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name == name or self.resource_name == WILDCARD

    def covers(self, operation: Operation) -> bool:
        """The ACL speaks of ``operation``: its own, All, or (ALLOW only) one it implies (``IMPLIED_BY``)."""
        if self.operation is operation or self.operation is Operation.ALL:
            return True
        return self.permission is PermissionType.ALLOW and self.operation in IMPLIED_BY.get(operation, ())


def validate_binding(b: AclBinding) -> str | None:
    """Why this ACL cannot be stored, or None."""
    if b.principal != WILDCARD and not PRINCIPAL_NAME.match(b.principal):
        return f"principal {b.principal!r} is not a principal name ([A-Za-z0-9._@-], 1 to 128) or *"
    if not b.resource_name or len(b.resource_name) > RESOURCE_NAME_MAX:
        return f"resource name must have 1 to {RESOURCE_NAME_MAX} characters"
    if b.resource_type is ResourceType.CLUSTER and (b.resource_name != CLUSTER_NAME or b.pattern_type is not PatternType.LITERAL):
        return f"the cluster resource is the literal {CLUSTER_NAME!r}"
    if b.pattern_type is PatternType.PREFIXED and b.resource_name == WILDCARD:
        return "a prefixed pattern of '*' matches only names starting with '*': use the literal '*'"
    return None


def authorize(acls: Iterable[AclBinding], operation: Operation, resource_type: ResourceType, name: str) -> bool:
    """Kafka's decision for one principal's ACLs (its own and those of ``*``): a matching DENY
    refuses, else a matching ALLOW allows, else refused."""
    allowed = False
    for acl in acls:
        if not acl.covers(operation) or not acl.matches(resource_type, name):
            continue
        if acl.permission is PermissionType.DENY:
            return False
        allowed = True
    return allowed


def authorize_any(acls: Iterable[AclBinding], operation: Operation, resource_type: ResourceType) -> bool:
    """Kafka's ``authorizeByResourceType``: may the principal do ``operation`` on SOME resource of
    ``resource_type``? Yes when an ALLOW (its own operation or All) names a resource that no DENY
    covers: the literal ``*`` (unless a DENY of ``*`` exists, which refuses everything), a literal
    name denied neither literally nor by a denied prefix of it, or a prefix no shorter denied
    prefix covers. Implied operations do not count here, as in Kafka."""
    denied_literal: set[str] = set()
    denied_prefixes: set[str] = set()
    allowed: list[AclBinding] = []
    for acl in acls:
        if acl.resource_type is not resource_type or acl.operation not in (operation, Operation.ALL):
            continue
        if acl.permission is PermissionType.DENY:
            if acl.pattern_type is PatternType.LITERAL and acl.resource_name == WILDCARD:
                return False
            (denied_literal if acl.pattern_type is PatternType.LITERAL else denied_prefixes).add(acl.resource_name)
        else:
            allowed.append(acl)
    for acl in allowed:
        name = acl.resource_name
        if acl.pattern_type is PatternType.LITERAL and name == WILDCARD:
            return True
        if acl.pattern_type is PatternType.LITERAL and name in denied_literal:
            continue
        if not any(name[:n] in denied_prefixes for n in range(1, len(name) + 1)):
            return True
    return False


class Decisions(Protocol):
    """One principal's answers: may it do ``operation`` on the resource named, on some resource of
    the type (``authorize_any``)?"""

    def allowed(self, operation: Operation, resource_type: ResourceType, name: str) -> bool: ...

    def allowed_some(self, operation: Operation, resource_type: ResourceType) -> bool: ...


@dataclass(frozen=True)
class AclSet:
    """``Decisions`` read from one principal's ACLs (``*``'s included), uncached."""

    acls: Sequence[AclBinding]

    def allowed(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return authorize(self.acls, operation, resource_type, name)

    def allowed_some(self, operation: Operation, resource_type: ResourceType) -> bool:
        return authorize_any(self.acls, operation, resource_type)


# --- Kafka's codes ---------------------------------------------------------------------------------

T, G, X, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID, ResourceType.CLUSTER
O = Operation

# Kafka's codes of resource types, pattern types, operations and permission types on the wire
# (org.apache.kafka.common.{resource,acl}). Codes Kafka has and txlog does not (DELEGATION_TOKEN and
# USER resources, CreateTokens and DescribeTokens) are not in these tables.
ANY_CODE, MATCH_CODE = 1, 2
RESOURCE_TYPE_CODES: Mapping[ResourceType, int] = {T: 2, G: 3, C: 4, X: 5}
KAFKA_ONLY_RESOURCE_TYPES: Mapping[int, str] = {6: "DELEGATION_TOKEN", 7: "USER"}
PATTERN_TYPE_CODES: Mapping[PatternType, int] = {PatternType.LITERAL: 3, PatternType.PREFIXED: 4}
OPERATION_CODES: Mapping[Operation, int] = {
    O.ALL: 2,
    O.READ: 3,
    O.WRITE: 4,
    O.CREATE: 5,
    O.DELETE: 6,
    O.ALTER: 7,
    O.DESCRIBE: 8,
    O.CLUSTER_ACTION: 9,
    O.DESCRIBE_CONFIGS: 10,
    O.ALTER_CONFIGS: 11,
    O.IDEMPOTENT_WRITE: 12,
}
KAFKA_ONLY_OPERATIONS: Mapping[int, str] = {13: "CREATE_TOKENS", 14: "DESCRIBE_TOKENS"}
PERMISSION_TYPE_CODES: Mapping[PermissionType, int] = {PermissionType.DENY: 2, PermissionType.ALLOW: 3}

# The operations each resource type has (Kafka's AclEntry.supportedOperations): what an answer's
# authorized operations are chosen from.
SUPPORTED_OPERATIONS: Mapping[ResourceType, tuple[Operation, ...]] = {
    T: (O.READ, O.WRITE, O.CREATE, O.DESCRIBE, O.DELETE, O.ALTER, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS),
    G: (O.READ, O.DESCRIBE, O.DELETE, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS),
    C: (O.CREATE, O.CLUSTER_ACTION, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS, O.IDEMPOTENT_WRITE, O.ALTER, O.DESCRIBE),
    X: (O.DESCRIBE, O.WRITE),
}


def authorized_operations(decide: Decisions, resource_type: ResourceType, name: str = CLUSTER_NAME) -> int:
    """Kafka's int32 bit set of the operations the principal may do on the resource (bit = code)."""
    bits = 0
    for op in SUPPORTED_OPERATIONS[resource_type]:
        if decide.allowed(op, resource_type, name):
            bits |= 1 << OPERATION_CODES[op]
    return bits


# --- Kafka's AclBindingFilter ----------------------------------------------------------------------


class PatternFilter(Enum):
    """How a filter's resource name matches a stored pattern (Kafka's PatternType in a filter)."""

    ANY = "any"  # any pattern type, the name itself
    MATCH = "match"  # every pattern that matches the name: itself, the literal ``*``, its prefixes
    LITERAL = "literal"
    PREFIXED = "prefixed"


@dataclass(frozen=True)
class AclFilter:
    """Kafka's AclBindingFilter: a None field (Kafka's null or ANY) matches every value. The host
    is not kept (every ACL holds for every host, ``*``): only a null or ``*`` host filter matches."""

    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern: PatternFilter = PatternFilter.ANY
    principal: str | None = None
    operation: Operation | None = None
    permission: PermissionType | None = None
    host: str | None = None

    def matches(self, b: AclBinding) -> bool:
        if self.host is not None and self.host != WILDCARD:
            return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.operation is not None and self.operation is not b.operation:
            return False
        if self.permission is not None and self.permission is not b.permission:
            return False
        if self.resource_type is not None and self.resource_type is not b.resource_type:
            return False
        if self.pattern in (PatternFilter.LITERAL, PatternFilter.PREFIXED) and self.pattern.value != b.pattern_type.value:
            return False
        if self.resource_name is None:
            return True
        if self.pattern is not PatternFilter.MATCH:
            return self.resource_name == b.resource_name
        return b.matches(b.resource_type, self.resource_name)


@dataclass(frozen=True)
class StoredPrincipal:
    """A principal as it is kept: its name, its token's id and hash (never the token), and when it
    was created and revoked (epoch milliseconds)."""

    name: str
    token_id: str
    token_hash: bytes
    created_at_ms: int
    revoked_at_ms: int | None
