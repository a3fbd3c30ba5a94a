"""ACLs on the Kafka wire, against real gateways with TXLOG_AUTH=token: clients sign in with SASL
PLAIN (a principal's name and token) and every request is checked by Kafka's table, the one the
HTTP API reads (``app.domain.acls``). The ACL admin APIs through confluent-kafka's AdminClient,
kafka-python's and raw frames; an ACL made at one door holds at the other."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from typing import Any, Iterator

import httpx
import pytest

from app.domain.acl_bindings import CLUSTER_NAME, AclBinding, Operation, PatternType, PermissionType, ResourceType
from app.errors import ErrorCode as E
from app.services import Broker, security, topics
from app.wire.kafka.messages import ApiKey
from tests.conftest import fresh_database, make_broker
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.kafka.test_transactions import batch, produce
from tests.support import ServerProcess, wait_until

ADMIN_TOKEN = "admin-" + secrets.token_hex(16)
O, R = Operation, ResourceType
ANY_FILTER = {
    "resource_type_filter": 1,
    "resource_name_filter": None,
    "pattern_type_filter": 1,
    "principal_filter": None,
    "host_filter": None,
    "operation": 1,
    "permission_type": 1,
}


class Doors:
    """One database, a gateway and an HTTP server on it, and the services to make principals,
    topics and ACLs with."""

    def __init__(self, gateway: GatewayProcess, server: ServerProcess, broker: Broker) -> None:
        self.gateway, self.server, self.broker = gateway, server, broker

    def principal(self, prefix: str) -> tuple[str, str]:
        made = security.create_principal(self.broker.db, f"{prefix}-{uuid.uuid4().hex[:6]}")
        return made.principal.name, made.token

    def topic(self, prefix: str = "t", partitions: int = 1) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        topics.create_topic(self.broker, name, partitions)
        return name

    def grant(self, who: str, rt: ResourceType, name: str, *ops: Operation, prefixed: bool = False, deny: bool = False) -> None:
        security.add_acls(
            self.broker.db,
            [
                AclBinding(
                    who,
                    rt,
                    CLUSTER_NAME if rt is R.CLUSTER else name,
                    PatternType.PREFIXED if prefixed else PatternType.LITERAL,
                    op,
                    PermissionType.DENY if deny else PermissionType.ALLOW,
                )
                for op in ops
            ],
        )

    def signed_in(self, name: str, token: str) -> RawConnection:
        """A raw connection signed in as ``name`` (once the gateway's snapshot knows the principal)."""

        def attempt() -> RawConnection | None:
            conn = self.gateway.connect()
            conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"})
            if (
                conn.request(
                    ApiKey.SaslAuthenticate, 2, {"auth_bytes": b"\0" + name.encode() + b"\0" + token.encode()}
                ).error_code
                == 0
            ):
                return conn
            conn.close()
            return None

        return wait_until(attempt, 10, 0.1, f"{name} to sign in")

    def http(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def confluent(self, name: str, token: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.gateway.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": name,
            "sasl.password": token,
        }

    def kafka_python(self, name: str, token: str) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.gateway.bootstrap,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": name,
            "sasl_plain_password": token,
        }


@pytest.fixture(scope="module")
def doors(pg_admin_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    logs = tmp_path_factory.mktemp("acls")
    env = {
        "TXLOG_AUTH": "token",
        "TXLOG_ADMIN_TOKEN": ADMIN_TOKEN,
        "TXLOG_KAFKA_AUTO_CREATE_TOPICS": "true",
        "TXLOG_KAFKA_NUM_PARTITIONS": "1",
        "TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "600000",
    }
    with fresh_database(pg_admin_url, template_db) as url:
        broker = make_broker(url)
        try:
            with (
                GatewayProcess(url, env=env, log_path=logs / "gateway.log") as g,
                ServerProcess(url, env=env, log_path=logs / "server.log") as s,
            ):
                yield Doors(g, s, broker)
        finally:
            broker.db.dispose()


def eventually(fn: Any, expected: Any, timeout: float = 10) -> Any:
    """``fn()`` once it answers ``expected`` (ACL changes reach the gateway within its poll)."""
    last: list[Any] = []

    def check() -> bool:
        last[:] = [fn()]
        return last[0] == expected

    try:
        wait_until(check, timeout, 0.1, f"{expected!r}")
    except AssertionError:
        raise AssertionError(f"answered {last[0]!r}, not {expected!r}") from None
    return last[0]


# -- the ACL admin APIs ----------------------------------------------------------------------------


def test_admin_client_creates_describes_and_deletes_acls_and_both_doors_hold_them(doors: Doors) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AclBinding as KafkaAcl
    from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, AdminClient, ResourcePatternType
    from confluent_kafka.admin import ResourceType as KafkaResource

    bob, bob_token = doors.principal("bob")
    topic = doors.topic("door")
    admin = AdminClient(doors.confluent("admin", ADMIN_TOKEN))
    read = KafkaAcl(
        KafkaResource.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{bob}", "*", AclOperation.READ, AclPermissionType.ALLOW
    )
    for future in admin.create_acls([read]).values():
        future.result(timeout=30)
    bobs = AclBindingFilter(
        KafkaResource.ANY, None, ResourcePatternType.ANY, f"User:{bob}", None, AclOperation.ANY, AclPermissionType.ANY
    )
    assert admin.describe_acls(bobs).result(timeout=30) == [read]
    matching = AclBindingFilter(
        KafkaResource.TOPIC, topic, ResourcePatternType.MATCH, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    assert read in admin.describe_acls(matching).result(timeout=30)

    # Made on the wire, it holds over HTTP: bob reads the topic there.
    with doors.http(bob_token) as http:
        eventually(lambda: http.get(f"/v1/topics/{topic}/partitions/0/records").status_code, 200)
        assert http.post(f"/v1/topics/{topic}/records", json={"records": [{"value": "x"}]}).status_code == 403
    # Made over HTTP, it holds on the wire, and DescribeAcls answers it in Kafka's words.
    with doors.http(ADMIN_TOKEN) as http:
        acl = {"principal": bob, "resource_type": "topic", "resource_name": topic, "operation": "Write"}
        assert http.post("/v1/acls", json={"acls": [acl]}).status_code == 200
    write = KafkaAcl(
        KafkaResource.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{bob}", "*", AclOperation.WRITE, AclPermissionType.ALLOW
    )
    assert sorted(admin.describe_acls(bobs).result(timeout=30), key=str) == sorted([read, write], key=str)
    with doors.signed_in(bob, bob_token) as conn:
        eventually(lambda: produce(conn, topic, 0, batch(-1, -1, -1, [b"over the wire"]))[0], 0)

    # Deleted on the wire: gone at both doors.
    deleted = admin.delete_acls([bobs])[bobs].result(timeout=30)
    assert sorted(deleted, key=str) == sorted([read, write], key=str)
    with doors.http(ADMIN_TOKEN) as http:
        assert http.get("/v1/acls", params={"principal": bob}).json() == {"acls": []}
    with doors.http(bob_token) as http:
        eventually(lambda: http.get(f"/v1/topics/{topic}/partitions/0/records").status_code, 403)

    # bob may not touch the ACLs: CLUSTER_AUTHORIZATION_FAILED (confluent-kafka's describe_acls
    # answers a refused DescribeAcls as an empty list: its error is read here from the frame).
    bobs_admin = AdminClient(doors.confluent(bob, bob_token))
    with pytest.raises(KafkaException) as refused:
        for future in bobs_admin.create_acls([read]).values():
            future.result(timeout=30)
    assert refused.value.args[0].code() == E.CLUSTER_AUTHORIZATION_FAILED.kafka_code
    with doors.signed_in(bob, bob_token) as conn:
        assert conn.request(ApiKey.DescribeAcls, 3, ANY_FILTER).error_code == E.CLUSTER_AUTHORIZATION_FAILED.kafka_code
        assert [r.error_code for r in conn.request(ApiKey.DeleteAcls, 3, {"filters": [ANY_FILTER]}).filter_results] == [
            E.CLUSTER_AUTHORIZATION_FAILED.kafka_code
        ]


def test_acl_apis_over_raw_frames_answer_each_creation_and_filter(doors: Doors) -> None:
    dave, _ = doors.principal("dave")
    with doors.signed_in("admin", ADMIN_TOKEN) as conn:
        creations = [
            {
                "resource_type": 2,
                "resource_name": "dave-",
                "resource_pattern_type": 4,
                "principal": f"User:{dave}",
                "host": "*",
                "operation": 4,
                "permission_type": 3,
            },
            {
                "resource_type": 7,
                "resource_name": "u",
                "resource_pattern_type": 3,
                "principal": f"User:{dave}",
                "host": "*",
                "operation": 3,
                "permission_type": 3,
            },  # USER: a resource type Kafka has and txlog does not keep
            {
                "resource_type": 4,
                "resource_name": "kafka-cluster",
                "resource_pattern_type": 3,
                "principal": f"User:{dave}",
                "host": "*",
                "operation": 9,
                "permission_type": 3,
            },  # ClusterAction
            {
                "resource_type": 2,
                "resource_name": "x",
                "resource_pattern_type": 3,
                "principal": f"User:{dave}",
                "host": "10.0.0.1",
                "operation": 3,
                "permission_type": 3,
            },
        ]
        codes = [r.error_code for r in conn.request(ApiKey.CreateAcls, 3, {"creations": creations}).results]
        assert codes == [0, E.INVALID_REQUEST.kafka_code, 0, E.INVALID_REQUEST.kafka_code]
        described = conn.request(ApiKey.DescribeAcls, 3, {**ANY_FILTER, "principal_filter": f"User:{dave}"})
        assert described.error_code == 0
        got = sorted(
            (r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation, a.permission_type)
            for r in described.resources
            for a in r.acls
        )
        assert got == [(2, "dave-", 4, f"User:{dave}", "*", 4, 3), (4, "kafka-cluster", 3, f"User:{dave}", "*", 9, 3)]
        with doors.http(ADMIN_TOKEN) as http:  # the same ACLs over HTTP, in its words
            listed = http.get("/v1/acls", params={"principal": dave})
            assert listed.status_code == 200, listed.text
            assert sorted((a["resource_type"], a["resource_name"], a["operation"]) for a in listed.json()["acls"]) == [
                ("cluster", CLUSTER_NAME, "ClusterAction"),
                ("topic", "dave-", "Write"),
            ]
        # MATCH: every pattern covering the name; USER: matches nothing; a filter per result
        match = conn.request(
            ApiKey.DescribeAcls,
            3,
            {
                **ANY_FILTER,
                "resource_type_filter": 2,
                "resource_name_filter": "dave-topic",
                "pattern_type_filter": 2,
                "principal_filter": f"User:{dave}",
            },
        )
        assert [(r.resource_name, r.pattern_type) for r in match.resources] == [("dave-", 4)]
        deleted = conn.request(
            ApiKey.DeleteAcls,
            3,
            {
                "filters": [
                    {**ANY_FILTER, "resource_type_filter": 7},
                    {**ANY_FILTER, "principal_filter": f"User:{dave}", "operation": 9},
                    {**ANY_FILTER, "operation": 0},
                ]
            },
        ).filter_results
        assert [(f.error_code, [(a.resource_type, a.operation) for a in f.matching_acls]) for f in deleted] == [
            (0, []),
            (0, [(4, 9)]),
            (E.INVALID_REQUEST.kafka_code, []),
        ]
        left = conn.request(ApiKey.DescribeAcls, 1, {**ANY_FILTER, "principal_filter": f"User:{dave}"})
        assert [r.resource_name for r in left.resources] == ["dave-"]


def test_without_acls_the_acl_apis_are_security_disabled(raw: RawConnection) -> None:
    assert raw.request(ApiKey.DescribeAcls, 3, ANY_FILTER).error_code == E.SECURITY_DISABLED.kafka_code
    assert [r.error_code for r in raw.request(ApiKey.DeleteAcls, 2, {"filters": [ANY_FILTER]}).filter_results] == [
        E.SECURITY_DISABLED.kafka_code
    ]


# -- every API checked ------------------------------------------------------------------------------


def test_metadata_hides_and_refuses_what_may_not_be_described(doors: Doors) -> None:
    erin, token = doors.principal("erin")
    mine, other = doors.topic("erin"), doors.topic("hidden")
    doors.grant(erin, R.TOPIC, mine, O.READ)
    doors.grant(erin, R.TOPIC, "erin-auto-", O.CREATE, O.DESCRIBE, prefixed=True)  # Create does not imply Describe
    with doors.signed_in(erin, token) as conn:

        def listed() -> list[str]:
            return sorted(t.name for t in conn.request(ApiKey.Metadata, 12, {"topics": None}).topics)

        eventually(listed, [mine])
        asked = conn.request(
            ApiKey.Metadata,
            12,
            {
                "topics": [{"name": mine}, {"name": other}, {"name": "no-such-topic"}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": True,
            },
        )
        by_name = {t.name: t for t in asked.topics}
        # existing or not, a topic erin may not describe is TOPIC_AUTHORIZATION_FAILED: no existence leak
        assert by_name[other].error_code == by_name["no-such-topic"].error_code == E.TOPIC_AUTHORIZATION_FAILED.kafka_code
        assert by_name[other].partitions == [] and by_name[mine].error_code == 0
        assert by_name[mine].authorized_operations == {3, 8}  # Read, and the Describe it implies
        auto = conn.request(ApiKey.Metadata, 12, {"topics": [{"name": "erin-auto-1"}], "allow_auto_topic_creation": True}).topics
        assert auto[0].error_code == 0 and len(auto[0].partitions) == 1
        doors.grant(erin, R.TOPIC, "elsewhere-", O.DESCRIBE, prefixed=True)
        refused = eventually(
            lambda: (
                conn.request(ApiKey.Metadata, 12, {"topics": [{"name": "elsewhere-1"}], "allow_auto_topic_creation": True})
                .topics[0]
                .error_code
            ),
            E.TOPIC_AUTHORIZATION_FAILED.kafka_code,
        )
        assert refused  # described, but not creatable: Create on the cluster or the topic is needed
        pages = conn.request(
            ApiKey.DescribeTopicPartitions, 0, {"topics": [], "response_partition_limit": 100, "cursor": None}
        ).topics
        assert [t.name for t in pages] == sorted(["erin-auto-1", mine])
        asked = conn.request(
            ApiKey.DescribeTopicPartitions, 0, {"topics": [{"name": other}], "response_partition_limit": 100, "cursor": None}
        )
        assert [(t.name, t.error_code) for t in asked.topics] == [(other, E.TOPIC_AUTHORIZATION_FAILED.kafka_code)]
    from confluent_kafka.admin import AdminClient

    seen = AdminClient(doors.confluent(erin, token)).list_topics(timeout=30).topics
    assert mine in seen and other not in seen


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic(doors: Doors) -> None:
    frank, token = doors.principal("frank")
    with doors.signed_in(frank, token) as conn:

        def init() -> int:
            return conn.request(
                ApiKey.InitProducerId,
                4,
                {"transactional_id": None, "transaction_timeout_ms": 60_000, "producer_id": -1, "producer_epoch": -1},
            ).error_code

        assert init() == E.CLUSTER_AUTHORIZATION_FAILED.kafka_code
        doors.grant(frank, R.TOPIC, "frank-only", O.WRITE)
        eventually(init, 0)
    grace, grace_token = doors.principal("grace")
    doors.grant(grace, R.CLUSTER, "", O.IDEMPOTENT_WRITE)
    with doors.signed_in(grace, grace_token) as conn:
        eventually(
            lambda: (
                conn.request(
                    ApiKey.InitProducerId,
                    4,
                    {"transactional_id": None, "transaction_timeout_ms": 60_000, "producer_id": -1, "producer_epoch": -1},
                ).error_code
            ),
            0,
        )


def test_produce_without_write_is_topic_authorization_failed_in_every_client(doors: Doors) -> None:
    from confluent_kafka import KafkaError, Producer

    heidi, token = doors.principal("heidi")
    allowed, refused = doors.topic("heidi"), doors.topic("nope")
    doors.grant(heidi, R.TOPIC, allowed, O.WRITE)
    reports: list[Any] = []
    producer = Producer({**doors.confluent(heidi, token), "enable.idempotence": True, "message.timeout.ms": 15_000})
    eventually(
        lambda: (producer.produce(allowed, b"ok", on_delivery=lambda e, m: reports.append(e)), producer.flush(20), reports[-1])[
            2
        ],
        None,
    )
    producer.produce(refused, b"no", on_delivery=lambda e, m: reports.append(e))
    producer.flush(20)
    assert reports[-1] is not None and reports[-1].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    from kafka.errors import TopicAuthorizationFailedError

    from kafka import KafkaProducer

    kp = KafkaProducer(**doors.kafka_python(heidi, token), max_block_ms=10_000)
    try:
        kp.send(allowed, b"kafka-python").get(timeout=30)
        with pytest.raises(TopicAuthorizationFailedError):
            kp.send(refused, b"no").get(timeout=30)
    finally:
        kp.close()

    async def aiokafka() -> None:
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import TopicAuthorizationFailedError as AioRefused

        p = AIOKafkaProducer(
            bootstrap_servers=doors.gateway.bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username=heidi,
            sasl_plain_password=token,
        )
        await p.start()
        try:
            await p.send_and_wait(allowed, b"aiokafka")
            with pytest.raises(AioRefused):
                await p.send_and_wait(refused, b"no")
        finally:
            await p.stop()

    asyncio.run(aiokafka())


def test_consume_needs_read_on_the_topic_and_on_the_group(doors: Doors) -> None:
    from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    from kafka import KafkaConsumer, TopicPartition

    ivan, token = doors.principal("ivan")
    topic = doors.topic("ivan")
    group = f"ivan-group-{uuid.uuid4().hex[:6]}"
    doors.grant(ivan, R.TOPIC, topic, O.DESCRIBE)
    doors.signed_in(ivan, token).close()
    consumer = KafkaConsumer(**doors.kafka_python(ivan, token), auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        with pytest.raises(TopicAuthorizationFailedError):
            for _ in range(20):
                consumer.poll(timeout_ms=500)
    finally:
        consumer.close()
    doors.grant(ivan, R.TOPIC, topic, O.READ)
    with doors.signed_in(ivan, token) as conn:
        join = {
            "group_id": group,
            "session_timeout_ms": 10_000,
            "rebalance_timeout_ms": 10_000,
            "member_id": "",
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
        }
        assert conn.request(ApiKey.JoinGroup, 5, join).error_code == E.GROUP_AUTHORIZATION_FAILED.kafka_code
        commit = {
            "group_id": group,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "retention_time_ms": -1,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1, "committed_metadata": ""}
                    ],
                }
            ],
        }
        got = conn.request(ApiKey.OffsetCommit, 8, commit)
        assert [p.error_code for t in got.topics for p in t.partitions] == [E.GROUP_AUTHORIZATION_FAILED.kafka_code]
        doors.grant(ivan, R.GROUP, group, O.READ)
        other = doors.topic("not-ivans")
        commit["topics"].append(
            {
                "name": other,
                "partitions": [
                    {"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1, "committed_metadata": ""}
                ],
            }
        )
        codes = eventually(
            lambda: {t.name: t.partitions[0].error_code for t in conn.request(ApiKey.OffsetCommit, 8, commit).topics},
            {topic: 0, other: E.TOPIC_AUTHORIZATION_FAILED.kafka_code},
        )
        assert codes
        fetched = conn.request(
            ApiKey.OffsetFetch, 8, {"groups": [{"group_id": group, "topics": None}], "require_stable": False}
        ).groups[0]
        assert [(t.name, t.partitions[0].committed_offset) for t in fetched.topics] == [(topic, 0)]
    with pytest.raises(GroupAuthorizationFailedError):
        denied = KafkaConsumer(**doors.kafka_python(ivan, token), group_id=f"not-{group}", consumer_timeout_ms=5_000)
        try:
            denied.subscribe([topic])
            for _ in range(20):
                denied.poll(timeout_ms=500)
        finally:
            denied.close()


def test_init_transactions_needs_write_on_the_transactional_id(doors: Doors) -> None:
    from confluent_kafka import KafkaException, Producer

    judy, token = doors.principal("judy")
    doors.grant(judy, R.TOPIC, "judy-", O.WRITE, prefixed=True)
    doors.signed_in(judy, token).close()
    producer = Producer({**doors.confluent(judy, token), "transactional.id": f"judy-tx-{uuid.uuid4().hex[:6]}"})
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(30)
    assert refused.value.args[0].code() == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.kafka_code


def test_list_groups_and_list_transactions_show_only_what_may_be_described(doors: Doors) -> None:
    kim, token = doors.principal("kim")
    mine, theirs = f"kim-g-{uuid.uuid4().hex[:6]}", f"other-g-{uuid.uuid4().hex[:6]}"
    tid_mine, tid_theirs = f"kim-tx-{uuid.uuid4().hex[:6]}", f"other-tx-{uuid.uuid4().hex[:6]}"
    with doors.signed_in("admin", ADMIN_TOKEN) as admin:
        for group in (mine, theirs):
            admin.request(
                ApiKey.OffsetCommit,
                8,
                {
                    "group_id": group,
                    "generation_id_or_member_epoch": -1,
                    "member_id": "",
                    "group_instance_id": None,
                    "retention_time_ms": -1,
                    "topics": [],
                },
            )
        producers = {}
        for tid in (tid_mine, tid_theirs):
            got = admin.request(
                ApiKey.InitProducerId,
                4,
                {"transactional_id": tid, "transaction_timeout_ms": 60_000, "producer_id": -1, "producer_epoch": -1},
            )
            assert got.error_code == 0
            producers[tid] = got
        # kim's transaction in flight on a topic kim may describe and one it may not
        seen_topic, unseen_topic = doors.topic("kim-seen"), doors.topic("kim-unseen")
        added = admin.request(
            ApiKey.AddPartitionsToTxn,
            3,
            {
                "v3_and_below_transactional_id": tid_mine,
                "v3_and_below_producer_id": producers[tid_mine].producer_id,
                "v3_and_below_producer_epoch": producers[tid_mine].producer_epoch,
                "v3_and_below_topics": [{"name": seen_topic, "partitions": [0]}, {"name": unseen_topic, "partitions": [0]}],
            },
        )
        assert [r.partition_error_code for t in added.results_by_topic_v3_and_below for r in t.results_by_partition] == [0, 0]
    from app.domain.groups.offsets import GroupOffset
    from app.services import groups as groups_service

    topic = doors.topic("kim")
    for group in (mine, theirs):
        groups_service.offset_commit(doors.broker, group, [GroupOffset(topic, 0, 0, "", -1)])
    # The group's grant last: once the gateway lists the group, it has the grants made before it.
    doors.grant(kim, R.TOPIC, "kim-seen-", O.DESCRIBE, prefixed=True)
    doors.grant(kim, R.TRANSACTIONAL_ID, tid_mine, O.DESCRIBE)
    doors.grant(kim, R.GROUP, mine, O.READ)
    with doors.signed_in(kim, token) as conn:

        def groups() -> list[str]:
            return sorted(g.group_id for g in conn.request(ApiKey.ListGroups, 4, {"states_filter": []}).groups)

        eventually(groups, [mine])
        listed = conn.request(ApiKey.ListTransactions, 1, {"state_filters": [], "producer_id_filters": [], "duration_filter": -1})
        assert [t.transactional_id for t in listed.transaction_states] == [tid_mine]
        described = conn.request(ApiKey.DescribeTransactions, 0, {"transactional_ids": [tid_mine, tid_theirs]}).transaction_states
        assert [(t.transactional_id, t.error_code) for t in described] == [
            (tid_mine, 0),
            (tid_theirs, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.kafka_code),
        ]
        assert [(t.topic, t.partitions) for t in described[0].topics] == [(seen_topic, [0])]
        with doors.http(token) as http:  # the HTTP API leaves out the same partition, once its server has the grants
            eventually(
                lambda: http.get(f"/v1/transactions/{tid_mine}").json().get("partitions"), [{"topic": seen_topic, "partition": 0}]
            )
        groups_described = conn.request(
            ApiKey.DescribeGroups, 5, {"groups": [mine, theirs], "include_authorized_operations": True}
        ).groups
        assert sorted((g.group_id, g.error_code) for g in groups_described) == sorted(
            [(mine, 0), (theirs, E.GROUP_AUTHORIZATION_FAILED.kafka_code)]
        )
        assert conn.request(ApiKey.DescribeLogDirs, 4, {"topics": None}).error_code == E.CLUSTER_AUTHORIZATION_FAILED.kafka_code
        doors.grant(kim, R.CLUSTER, "", O.DESCRIBE)  # Describe on the cluster: every group listed
        wait_until(lambda: {mine, theirs} <= set(groups()), 10, 0.1, "every group listed")
