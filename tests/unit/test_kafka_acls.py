"""Kafka's authorization table as the gateway reads it: a row for every served API key, Kafka 3's
idempotent producer, the implied DescribeConfigs, whole-request and per-item checks, listings,
authorized operations, and Kafka's AclBindingFilter with its wire codes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from api.kafka import versions
from api.kafka.handlers import acls as wire
from app.domain.acl_bindings import (
    CLUSTER_NAME,
    OPERATION_CODES,
    AclBinding,
    AclFilter,
    AclSet,
    PatternFilter,
    PermissionType,
    authorize,
    authorize_any,
    authorized_operations,
)
from app.domain.acl_bindings import Operation as O
from app.domain.acl_bindings import PatternType as P
from app.domain.acl_bindings import ResourceType as R
from app.domain.acls import KAFKA_APIS, Api, item_denied, request_denied, shown
from app.errors import ErrorCode, TxlogError
from app.wire.kafka.messages import ApiKey

ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY


def acl(rt: R, name: str, op: O, permission: PermissionType = ALLOW, pattern: P = P.LITERAL, who: str = "alice") -> AclBinding:
    return AclBinding(who, rt, name, pattern, op, permission)


def test_every_served_api_key_reads_the_table() -> None:
    served = {ApiKey(api.api_key).name for api in versions.APIS}
    assert served <= set(KAFKA_APIS), served - set(KAFKA_APIS)
    # the keys other parts of the gateway add: SCRAM credentials and client quotas
    assert {"DescribeUserScramCredentials", "AlterUserScramCredentials", "DescribeClientQuotas", "AlterClientQuotas"} <= set(
        KAFKA_APIS
    )


def test_describe_configs_is_implied_by_alter_configs_only() -> None:
    assert authorize([acl(R.TOPIC, "t", O.ALTER_CONFIGS)], O.DESCRIBE_CONFIGS, R.TOPIC, "t")
    assert not authorize([acl(R.TOPIC, "t", O.DESCRIBE_CONFIGS)], O.ALTER_CONFIGS, R.TOPIC, "t")
    assert not authorize([acl(R.TOPIC, "t", O.ALTER)], O.DESCRIBE_CONFIGS, R.TOPIC, "t")
    assert not authorize([acl(R.TOPIC, "t", O.ALTER_CONFIGS, DENY)], O.DESCRIBE_CONFIGS, R.TOPIC, "t")


def test_some_resource_of_a_type_as_kafkas_authorize_by_resource_type() -> None:
    assert not authorize_any([], O.WRITE, R.TOPIC)
    assert authorize_any([acl(R.TOPIC, "t", O.WRITE)], O.WRITE, R.TOPIC)
    assert authorize_any([acl(R.TOPIC, "t", O.ALL)], O.WRITE, R.TOPIC)
    assert not authorize_any([acl(R.TOPIC, "t", O.READ)], O.WRITE, R.TOPIC)
    assert not authorize_any([acl(R.GROUP, "t", O.WRITE)], O.WRITE, R.TOPIC)
    # a literal denied, or covered by a denied prefix, does not count; a wildcard DENY refuses all
    assert not authorize_any([acl(R.TOPIC, "t", O.WRITE), acl(R.TOPIC, "t", O.WRITE, DENY)], O.WRITE, R.TOPIC)
    assert not authorize_any([acl(R.TOPIC, "orders", O.WRITE), acl(R.TOPIC, "ord", O.WRITE, DENY, P.PREFIXED)], O.WRITE, R.TOPIC)
    assert authorize_any([acl(R.TOPIC, "orders", O.WRITE), acl(R.TOPIC, "pay", O.WRITE, DENY, P.PREFIXED)], O.WRITE, R.TOPIC)
    assert not authorize_any([acl(R.TOPIC, "*", O.ALL), acl(R.TOPIC, "*", O.WRITE, DENY)], O.WRITE, R.TOPIC)
    assert authorize_any([acl(R.TOPIC, "*", O.WRITE)], O.WRITE, R.TOPIC)


def test_an_idempotent_producer_on_the_wire_as_kafka_3() -> None:
    def init(*acls: AclBinding) -> object:
        return request_denied(AclSet(acls), Api.INIT_IDEMPOTENT_PRODUCER_ID, {})

    refused = init()
    assert refused is not None and refused.check.resource_type is R.CLUSTER  # CLUSTER_AUTHORIZATION_FAILED, as Kafka
    assert init(acl(R.CLUSTER, CLUSTER_NAME, O.IDEMPOTENT_WRITE)) is None
    assert init(acl(R.TOPIC, "any", O.WRITE)) is None
    assert init(acl(R.TOPIC, "any", O.READ)) is not None
    # Produce of an idempotent batch needs Write on the topic, nothing more (KIP-679)
    assert "Produce" in KAFKA_APIS and Api.PRODUCE_IDEMPOTENT not in KAFKA_APIS["Produce"]


def test_whole_request_rules_and_per_item_rules_are_apart() -> None:
    acls = AclSet([acl(R.TRANSACTIONAL_ID, "tx", O.WRITE), acl(R.TOPIC, "a", O.WRITE)])
    assert request_denied(acls, Api.PRODUCE_TRANSACTIONAL, {"transactional_id": "tx"}) is None
    refused = request_denied(acls, Api.PRODUCE_TRANSACTIONAL, {"transactional_id": "other"})
    assert refused is not None and refused.check.resource_type is R.TRANSACTIONAL_ID
    assert item_denied(acls, Api.PRODUCE_TRANSACTIONAL, "topic", "a") is None
    refused = item_denied(acls, Api.PRODUCE_TRANSACTIONAL, "topic", "b")
    assert refused is not None and (refused.check.resource_type, refused.name) == (R.TOPIC, "b")
    # "topics" rules are read per topic too; the group rule is the request's
    group_only = AclSet([acl(R.GROUP, "g", O.READ)])
    assert request_denied(group_only, Api.OFFSET_COMMIT, {"group": "g"}) is None
    assert item_denied(group_only, Api.OFFSET_COMMIT, "topic", "t") is not None
    # CreateTopics: Create on the cluster or on the topic
    assert item_denied(AclSet([acl(R.CLUSTER, CLUSTER_NAME, O.CREATE)]), Api.CREATE_TOPICS, "topic", "t") is None
    assert item_denied(AclSet([acl(R.TOPIC, "t", O.CREATE, pattern=P.PREFIXED)]), Api.CREATE_TOPICS, "topic", "t1") is None


def test_list_groups_shows_every_group_with_describe_on_the_cluster() -> None:
    assert shown(AclSet([acl(R.CLUSTER, CLUSTER_NAME, O.DESCRIBE)]), Api.LIST_GROUPS, "any")
    assert shown(AclSet([acl(R.GROUP, "g", O.READ)]), Api.LIST_GROUPS, "g")
    assert not shown(AclSet([acl(R.GROUP, "g", O.READ)]), Api.LIST_GROUPS, "h")


def test_authorized_operations_are_kafkas_bits() -> None:
    bits = authorized_operations(AclSet([acl(R.TOPIC, "t", O.READ)]), R.TOPIC, "t")
    assert bits == (1 << OPERATION_CODES[O.READ]) | (1 << OPERATION_CODES[O.DESCRIBE])
    assert authorized_operations(AclSet([]), R.TOPIC, "t") == 0
    everything = authorized_operations(AclSet([acl(R.TRANSACTIONAL_ID, "*", O.ALL)]), R.TRANSACTIONAL_ID, "x")
    assert everything == (1 << 8) | (1 << 4)  # Describe and Write, the operations a transactional id has


def test_acl_binding_filters_as_kafka_matches_them() -> None:
    lit = acl(R.TOPIC, "orders", O.READ)
    pre = acl(R.TOPIC, "ord", O.WRITE, DENY, P.PREFIXED, who="bob")
    star = acl(R.TOPIC, "*", O.READ, who="*")
    grp = acl(R.GROUP, "orders", O.READ)
    every = [lit, pre, star, grp]

    def matched(f: AclFilter) -> list[AclBinding]:
        return [a for a in every if f.matches(a)]

    assert matched(AclFilter()) == every
    assert matched(AclFilter(resource_type=R.TOPIC)) == [lit, pre, star]
    assert matched(AclFilter(resource_name="orders")) == [lit, grp]  # ANY pattern: the name itself
    assert matched(AclFilter(R.TOPIC, "orders", PatternFilter.MATCH)) == [lit, pre, star]
    assert matched(AclFilter(R.TOPIC, "ord", PatternFilter.LITERAL)) == []
    assert matched(AclFilter(R.TOPIC, "ord", PatternFilter.PREFIXED)) == [pre]
    assert matched(AclFilter(pattern=PatternFilter.PREFIXED)) == [pre]
    assert matched(AclFilter(principal="bob")) == [pre]
    assert matched(AclFilter(principal="*")) == [star]
    assert matched(AclFilter(operation=O.READ, permission=ALLOW)) == [lit, star, grp]
    assert matched(AclFilter(host="*")) == every and matched(AclFilter(host="10.0.0.1")) == []


def _creation(**fields: object) -> SimpleNamespace:
    base = {
        "resource_type": 2,
        "resource_name": "t",
        "resource_pattern_type": 3,
        "principal": "User:alice",
        "host": "*",
        "operation": 3,
        "permission_type": 3,
    }
    return SimpleNamespace(**{**base, **fields})


def _filter(**fields: object) -> SimpleNamespace:
    base = {
        "resource_type_filter": 1,
        "resource_name_filter": None,
        "pattern_type_filter": 1,
        "principal_filter": None,
        "host_filter": None,
        "operation": 1,
        "permission_type": 1,
    }
    return SimpleNamespace(**{**base, **fields})


def test_wire_creations_become_the_models_acls() -> None:
    assert wire.binding(_creation(), 3) == acl(R.TOPIC, "t", O.READ)
    assert wire.binding(_creation(resource_type=4, resource_name="kafka-cluster", operation=9), 3) == acl(
        R.CLUSTER, CLUSTER_NAME, O.CLUSTER_ACTION
    )
    assert wire.binding(_creation(principal="User:*", resource_pattern_type=4, permission_type=2), 3) == acl(
        R.TOPIC, "t", O.READ, DENY, P.PREFIXED, "*"
    )
    assert wire.binding(_creation(resource_pattern_type=4), 0).pattern_type is P.LITERAL  # v0: literal only
    for bad in (
        {"resource_type": 7},
        {"resource_type": 6},
        {"resource_type": 1},
        {"resource_type": 0},
        {"resource_pattern_type": 2},
        {"operation": 1},
        {"operation": 13},
        {"permission_type": 1},
        {"host": "10.0.0.1"},
        {"resource_name": ""},
        {"resource_type": 4, "resource_name": "other"},
        {"principal": "Group:x"},
        {"principal": "User:bad name"},
    ):
        with pytest.raises(TxlogError) as refused:
            wire.binding(_creation(**bad), 3)
        assert refused.value.code is ErrorCode.INVALID_REQUEST, bad


def test_wire_filters_become_the_models_filters() -> None:
    assert wire.acl_filter(_filter(), 3) == AclFilter()
    f = wire.acl_filter(
        _filter(
            resource_type_filter=4,
            resource_name_filter="kafka-cluster",
            pattern_type_filter=2,
            principal_filter="User:bob",
            operation=7,
            permission_type=3,
        ),
        3,
    )
    assert f == AclFilter(R.CLUSTER, CLUSTER_NAME, PatternFilter.MATCH, "bob", O.ALTER, ALLOW)
    assert wire.acl_filter(_filter(pattern_type_filter=4), 0).pattern is PatternFilter.LITERAL
    for nothing in ({"resource_type_filter": 7}, {"operation": 14}, {"principal_filter": "Group:x"}):
        with pytest.raises(wire._MatchesNothing):
            wire.acl_filter(_filter(**nothing), 3)
    for bad in ({"resource_type_filter": 0}, {"pattern_type_filter": 0}, {"operation": 0}, {"permission_type": 9}):
        with pytest.raises(TxlogError):
            wire.acl_filter(_filter(**bad), 3)
