"""Kafka's ACL rules as pure functions: matching, deny wins, All, implied Describe, and the table
of what each API needs."""

from __future__ import annotations

import pytest

from app.domain.acl_bindings import CLUSTER_NAME, AclBinding, PermissionType, authorize, principal_name, validate_binding
from app.domain.acl_bindings import Operation as O
from app.domain.acl_bindings import PatternType as P
from app.domain.acl_bindings import ResourceType as R
from app.domain.acls import REQUIRED, Api, check_api, init_producer_api, produce_api

ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY


def acl(rt: R, name: str, op: O, permission: PermissionType = ALLOW, pattern: P = P.LITERAL, who: str = "alice") -> AclBinding:
    return AclBinding(who, rt, name, pattern, op, permission)


def test_nothing_matching_is_refused() -> None:
    assert not authorize([], O.READ, R.TOPIC, "orders")
    assert not authorize([acl(R.TOPIC, "orders", O.READ)], O.READ, R.TOPIC, "payments")
    assert not authorize([acl(R.GROUP, "orders", O.READ)], O.READ, R.TOPIC, "orders")


def test_literal_prefixed_and_wildcard_names() -> None:
    literal = [acl(R.TOPIC, "orders", O.READ)]
    assert authorize(literal, O.READ, R.TOPIC, "orders")
    assert not authorize(literal, O.READ, R.TOPIC, "orders-eu")
    prefixed = [acl(R.TOPIC, "orders", O.READ, pattern=P.PREFIXED)]
    assert authorize(prefixed, O.READ, R.TOPIC, "orders-eu")
    assert authorize(prefixed, O.READ, R.TOPIC, "orders")
    assert not authorize(prefixed, O.READ, R.TOPIC, "order")
    wildcard = [acl(R.TOPIC, "*", O.READ)]
    assert authorize(wildcard, O.READ, R.TOPIC, "anything")
    # A prefixed "*" is a prefix like any other, not the wildcard.
    assert not authorize([acl(R.TOPIC, "*", O.READ, pattern=P.PREFIXED)], O.READ, R.TOPIC, "anything")


def test_deny_wins_over_every_allow() -> None:
    acls = [acl(R.TOPIC, "*", O.ALL), acl(R.TOPIC, "secret", O.READ, DENY, P.PREFIXED)]
    assert authorize(acls, O.READ, R.TOPIC, "public")
    assert not authorize(acls, O.READ, R.TOPIC, "secret-plans")
    assert authorize(acls, O.WRITE, R.TOPIC, "secret-plans")  # only Read is denied
    assert not authorize([acl(R.TOPIC, "x", O.READ), acl(R.TOPIC, "x", O.ALL, DENY)], O.READ, R.TOPIC, "x")


def test_all_allows_every_operation() -> None:
    acls = [acl(R.CLUSTER, CLUSTER_NAME, O.ALL)]
    for op in O:
        assert authorize(acls, op, R.CLUSTER, CLUSTER_NAME)


@pytest.mark.parametrize("op", [O.READ, O.WRITE, O.DELETE, O.ALTER])
def test_describe_is_implied_by_read_write_delete_alter(op: O) -> None:
    assert authorize([acl(R.TOPIC, "t", op)], O.DESCRIBE, R.TOPIC, "t")


@pytest.mark.parametrize("op", [O.CREATE, O.IDEMPOTENT_WRITE])
def test_describe_is_not_implied_by_the_others(op: O) -> None:
    assert not authorize([acl(R.TOPIC, "t", op)], O.DESCRIBE, R.TOPIC, "t")


def test_implied_operations_are_never_implied_the_other_way_or_by_a_deny() -> None:
    assert not authorize([acl(R.TOPIC, "t", O.DESCRIBE)], O.READ, R.TOPIC, "t")
    assert not authorize([acl(R.TOPIC, "t", O.WRITE)], O.READ, R.TOPIC, "t")
    # A DENY of Read does not deny Describe that Write allows.
    assert authorize([acl(R.TOPIC, "t", O.WRITE), acl(R.TOPIC, "t", O.READ, DENY)], O.DESCRIBE, R.TOPIC, "t")


def test_produce_needs_write_on_the_topic_and_more_by_kind() -> None:
    write_t = acl(R.TOPIC, "t", O.WRITE)
    assert check_api([write_t], Api.PRODUCE, {"topic": "t"}) is None
    denied = check_api([write_t], Api.PRODUCE_IDEMPOTENT, {"topic": "t"})
    assert denied is not None and denied.check.resource_type is R.CLUSTER
    assert check_api([write_t, acl(R.CLUSTER, CLUSTER_NAME, O.IDEMPOTENT_WRITE)], Api.PRODUCE_IDEMPOTENT, {"topic": "t"}) is None
    denied = check_api([write_t], Api.PRODUCE_TRANSACTIONAL, {"topic": "t", "transactional_id": "tx"})
    assert denied is not None and denied.check.resource_type is R.TRANSACTIONAL_ID and denied.name == "tx"
    allowed = [write_t, acl(R.TRANSACTIONAL_ID, "tx", O.WRITE)]
    assert check_api(allowed, Api.PRODUCE_TRANSACTIONAL, {"topic": "t", "transactional_id": "tx"}) is None
    denied = check_api(
        [acl(R.TRANSACTIONAL_ID, "tx", O.WRITE)], Api.PRODUCE_TRANSACTIONAL, {"topic": "t", "transactional_id": "tx"}
    )
    assert denied is not None and denied.check.resource_type is R.TOPIC


def test_which_produce_and_which_init() -> None:
    assert produce_api(None, None) is Api.PRODUCE
    assert produce_api(7, None) is Api.PRODUCE_IDEMPOTENT
    assert produce_api(7, "tx") is Api.PRODUCE_TRANSACTIONAL
    assert init_producer_api(None) is Api.INIT_PRODUCER_ID
    assert init_producer_api("tx") is Api.INIT_TRANSACTIONAL_PRODUCER_ID


def test_create_topics_needs_create_on_the_cluster_or_on_the_topic() -> None:
    assert check_api([acl(R.CLUSTER, CLUSTER_NAME, O.CREATE)], Api.CREATE_TOPICS, {"topic": "t"}) is None
    assert check_api([acl(R.TOPIC, "t", O.CREATE, pattern=P.PREFIXED)], Api.CREATE_TOPICS, {"topic": "t1"}) is None
    denied = check_api([acl(R.TOPIC, "u", O.CREATE)], Api.CREATE_TOPICS, {"topic": "t"})
    assert denied is not None and denied.check.resource_type is R.TOPIC  # Kafka answers TOPIC_AUTHORIZATION_FAILED


def test_every_topic_of_a_multi_topic_request_is_checked() -> None:
    acls = [acl(R.TRANSACTIONAL_ID, "tx", O.WRITE), acl(R.TOPIC, "a", O.WRITE)]
    assert check_api(acls, Api.ADD_PARTITIONS_TO_TXN, {"transactional_id": "tx", "topics": ["a"]}) is None
    denied = check_api(acls, Api.ADD_PARTITIONS_TO_TXN, {"transactional_id": "tx", "topics": ["a", "b"]})
    assert denied is not None and denied.name == "b"


def test_txn_offset_commit_needs_read_on_the_group() -> None:
    acls = [acl(R.TRANSACTIONAL_ID, "tx", O.WRITE), acl(R.TOPIC, "t", O.READ)]
    names = {"transactional_id": "tx", "group": "g", "topics": ["t"]}
    denied = check_api(acls, Api.ADD_OFFSETS_TO_TXN, names)
    assert denied is not None and denied.check.resource_type is R.GROUP
    assert check_api([*acls, acl(R.GROUP, "g", O.READ)], Api.ADD_OFFSETS_TO_TXN, names) is None


def test_every_api_has_its_rules() -> None:
    assert set(REQUIRED) == set(Api)


def test_bindings_that_cannot_be_stored() -> None:
    assert validate_binding(acl(R.CLUSTER, "other", O.ALTER)) is not None
    assert validate_binding(acl(R.TOPIC, "t", O.READ, who="bad name")) is not None
    assert validate_binding(acl(R.TOPIC, "*", O.READ, who="*")) is None
    assert principal_name("User:alice") == "alice" and principal_name("bob") == "bob"
    assert O.parse("idempotent-write") is O.IDEMPOTENT_WRITE and O.parse("READ") is O.READ
    with pytest.raises(ValueError):
        O.parse("Frobnicate")
