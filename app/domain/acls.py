"""Kafka's ACLs, as data and pure functions: resource types and pattern types, operations and
permission types, the matching rules of Kafka's authorizer, and ONE table of the operation each API
needs on which resource.

The rules (Kafka's ``AclAuthorizer`` / ``StandardAuthorizer``):

- An ACL binds a principal (or ``*``, every principal) to an operation on a resource pattern, with a
  permission type: ALLOW or DENY. A pattern is LITERAL (the name itself; the literal name ``*``
  matches every resource of its type) or PREFIXED (every name starting with it).
- DENY wins: one matching DENY refuses the operation whatever ALLOWs match.
- An ACL for ``All`` matches every operation, for ALLOW and DENY alike.
- Describe is implied by an ALLOW of Read, Write, Delete or Alter (a DENY is never widened).
- Nothing matches: refused (no ``allow.everyone.if.no.acl.found``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Mapping, Sequence

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

# An ALLOW of any of these also allows Describe on the same resource.
IMPLIES_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})

PRINCIPAL_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,128}$")
RESOURCE_NAME_MAX = MAX_STRING_LENGTH


def principal_name(text: str) -> str:
    """A principal as Kafka's tools write it (``User:alice``) or bare (``alice``): the bare name."""
    return text[len("User:"):] if text.startswith("User:") else text


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
        """The ACL speaks of ``operation``: its own, All, or (ALLOW only) an implied Describe."""
        if self.operation is operation or self.operation is Operation.ALL:
            return True
        return (
            self.permission is PermissionType.ALLOW
            and operation is Operation.DESCRIBE
            and self.operation in IMPLIES_DESCRIBE
        )


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


# --- which operation on which resource each API needs ---------------------------------------------


class Api(Enum):
    """The requests of txlog's API, named as Kafka's where Kafka has one."""

    CREATE_TOPICS = "CreateTopics"
    LIST_TOPICS = "ListTopics"  # Metadata without topics
    DESCRIBE_TOPIC = "DescribeTopic"  # Metadata, ListOffsets
    ALTER_TOPIC_CONFIGS = "IncrementalAlterConfigs"
    CREATE_PARTITIONS = "CreatePartitions"
    DELETE_TOPICS = "DeleteTopics"
    DELETE_RECORDS = "DeleteRecords"
    PRODUCE = "Produce"  # plain: no producer id
    PRODUCE_IDEMPOTENT = "ProduceIdempotent"  # producer id, no transactional id
    PRODUCE_TRANSACTIONAL = "ProduceTransactional"
    FETCH = "Fetch"
    INIT_PRODUCER_ID = "InitProducerId"  # without a transactional id
    INIT_TRANSACTIONAL_PRODUCER_ID = "InitProducerIdTransactional"
    ADD_PARTITIONS_TO_TXN = "AddPartitionsToTxn"
    ADD_OFFSETS_TO_TXN = "AddOffsetsToTxn"  # with TxnOffsetCommit: one request here
    END_TXN = "EndTxn"
    DESCRIBE_TRANSACTIONS = "DescribeTransactions"
    LIST_TRANSACTIONS = "ListTransactions"
    ABORT_TRANSACTION = "AbortTransaction"  # kafka-transactions.sh abort (by transactional id or partition)
    DESCRIBE_PRODUCERS = "DescribeProducers"  # open transactions, find-hanging
    OFFSET_COMMIT = "OffsetCommit"
    OFFSET_FETCH = "OffsetFetch"
    LIST_GROUPS = "ListGroups"
    DESCRIBE_GROUPS = "DescribeGroups"
    DELETE_GROUPS = "DeleteGroups"
    REGISTER_PRODUCER_GROUP = "RegisterProducerGroup"  # half messages' check-back endpoint
    DESCRIBE_PRODUCER_GROUP = "DescribeProducerGroup"
    SEND_HALF_MESSAGE = "SendHalfMessage"
    END_HALF_MESSAGE = "EndHalfMessage"  # commit or rollback
    DESCRIBE_HALF_MESSAGES = "DescribeHalfMessages"
    LIST_HALF_MESSAGES = "ListHalfMessages"
    DESCRIBE_ACLS = "DescribeAcls"  # and the principals
    ALTER_ACLS = "AlterAcls"  # CreateAcls, DeleteAcls, principals created and revoked
    DESCRIBE_CLUSTER = "DescribeCluster"  # metrics, the admin pages


@dataclass(frozen=True)
class Check:
    """``operation`` on the resource of ``resource_type`` named by the request's ``name_from``
    (``topic``, ``topics``: each of several, ``group``, ``transactional_id``; None: the cluster)."""

    resource_type: ResourceType
    operation: Operation
    name_from: str | None = None


def _on(rt: ResourceType, op: Operation, name_from: str | None) -> tuple[Check, ...]:
    return (Check(rt, op, name_from),)


T, G, X, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID, ResourceType.CLUSTER
O = Operation

# Each API: a tuple of rules, each rule a tuple of checks of which one suffices. Every rule must pass.
REQUIRED: Mapping[Api, tuple[tuple[Check, ...], ...]] = {
    Api.CREATE_TOPICS: ((Check(C, O.CREATE), Check(T, O.CREATE, "topic")),),
    Api.LIST_TOPICS: (),
    Api.DESCRIBE_TOPIC: (_on(T, O.DESCRIBE, "topic"),),
    Api.ALTER_TOPIC_CONFIGS: (_on(T, O.ALTER, "topic"),),
    Api.CREATE_PARTITIONS: (_on(T, O.ALTER, "topic"),),
    Api.DELETE_TOPICS: (_on(T, O.DELETE, "topic"),),
    Api.DELETE_RECORDS: (_on(T, O.DELETE, "topic"),),
    Api.PRODUCE: (_on(T, O.WRITE, "topic"),),
    Api.PRODUCE_IDEMPOTENT: (_on(C, O.IDEMPOTENT_WRITE, None), _on(T, O.WRITE, "topic")),
    Api.PRODUCE_TRANSACTIONAL: (_on(X, O.WRITE, "transactional_id"), _on(T, O.WRITE, "topic")),
    Api.FETCH: (_on(T, O.READ, "topic"),),
    Api.INIT_PRODUCER_ID: (_on(C, O.IDEMPOTENT_WRITE, None),),
    Api.INIT_TRANSACTIONAL_PRODUCER_ID: (_on(X, O.WRITE, "transactional_id"),),
    Api.ADD_PARTITIONS_TO_TXN: (_on(X, O.WRITE, "transactional_id"), _on(T, O.WRITE, "topics")),
    Api.ADD_OFFSETS_TO_TXN: (_on(X, O.WRITE, "transactional_id"), _on(G, O.READ, "group"), _on(T, O.READ, "topics")),
    Api.END_TXN: (_on(X, O.WRITE, "transactional_id"),),
    Api.DESCRIBE_TRANSACTIONS: (_on(X, O.DESCRIBE, "transactional_id"),),
    Api.LIST_TRANSACTIONS: (),
    Api.ABORT_TRANSACTION: (_on(C, O.ALTER, None),),
    Api.DESCRIBE_PRODUCERS: (_on(C, O.DESCRIBE, None),),
    Api.OFFSET_COMMIT: (_on(G, O.READ, "group"), _on(T, O.READ, "topics")),
    Api.OFFSET_FETCH: (_on(G, O.READ, "group"),),
    Api.LIST_GROUPS: (),
    Api.DESCRIBE_GROUPS: (_on(G, O.DESCRIBE, "group"),),
    Api.DELETE_GROUPS: (_on(G, O.DELETE, "group"),),
    Api.REGISTER_PRODUCER_GROUP: (_on(G, O.ALTER, "group"),),
    Api.DESCRIBE_PRODUCER_GROUP: (_on(G, O.DESCRIBE, "group"),),
    Api.SEND_HALF_MESSAGE: (_on(T, O.WRITE, "topic"),),
    Api.END_HALF_MESSAGE: (_on(T, O.WRITE, "topic"),),
    Api.DESCRIBE_HALF_MESSAGES: (_on(T, O.READ, "topic"),),
    Api.LIST_HALF_MESSAGES: (),
    Api.DESCRIBE_ACLS: (_on(C, O.DESCRIBE, None),),
    Api.ALTER_ACLS: (_on(C, O.ALTER, None),),
    Api.DESCRIBE_CLUSTER: (_on(C, O.DESCRIBE, None),),
}

# List APIs answer only the items the principal may see: each item needs this on its resource.
FILTERED: Mapping[Api, tuple[ResourceType, Operation]] = {
    Api.LIST_TOPICS: (T, O.DESCRIBE),
    Api.LIST_TRANSACTIONS: (X, O.DESCRIBE),
    Api.LIST_GROUPS: (G, O.DESCRIBE),
    Api.LIST_HALF_MESSAGES: (T, O.READ),
    Api.OFFSET_FETCH: (T, O.DESCRIBE),  # a group's offsets of the topics the principal may describe
}


def produce_api(producer_id: int | None, transactional_id: str | None) -> Api:
    """Which produce a batch is: transactional, idempotent or plain."""
    if transactional_id is not None:
        return Api.PRODUCE_TRANSACTIONAL
    return Api.PRODUCE if producer_id is None else Api.PRODUCE_IDEMPOTENT


def init_producer_api(transactional_id: str | None) -> Api:
    return Api.INIT_PRODUCER_ID if transactional_id is None else Api.INIT_TRANSACTIONAL_PRODUCER_ID


def names_needed(api: Api) -> frozenset[str]:
    """The request names (``topic``, ``group``, …) ``api``'s checks read."""
    return frozenset(c.name_from for rule in REQUIRED[api] for c in rule if c.name_from is not None)


@dataclass(frozen=True)
class Denied:
    """Why a request is refused: the check that failed, on the resource named."""

    check: Check
    name: str


def _names(check: Check, names: Mapping[str, str | Sequence[str] | None]) -> Sequence[str]:
    if check.name_from is None:
        return (CLUSTER_NAME,)
    value = names.get(check.name_from)
    if value is None:
        raise KeyError(f"the request names no {check.name_from}")
    return (value,) if isinstance(value, str) else value


def check_api(acls: Sequence[AclBinding], api: Api, names: Mapping[str, str | Sequence[str] | None]) -> Denied | None:
    """None if ``acls`` (one principal's, ``*``'s included) allow the request, else what was refused."""
    for rule in REQUIRED[api]:
        # The rule passes when one of its checks passes for every name it reads.
        failed: Denied | None = None
        for check in rule:
            refused = next((n for n in _names(check, names) if not authorize(acls, check.operation, check.resource_type, n)), None)
            if refused is None:
                failed = None
                break
            failed = Denied(check, refused)
        if failed is not None:
            return failed
    return None


@dataclass(frozen=True)
class StoredPrincipal:
    """A principal as it is kept: its name, its token's id and hash (never the token), and when it
    was created and revoked (epoch milliseconds)."""

    name: str
    token_id: str
    token_hash: bytes
    created_at_ms: int
    revoked_at_ms: int | None
