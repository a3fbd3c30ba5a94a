"""The cluster the Kafka gateway's processes form, through the services on a real PostgreSQL: one
cluster id per database, a topic id per topic, and node ids held by leases (refused to a second
live process, free once the holder stops renewing)."""

from __future__ import annotations

import re
import time
import uuid

from sqlalchemy import text

from app.domain.cluster import coordinator_of, leader_of
from app.errors import ErrorCode
from app.services import cluster, topics
from tests.integration.test_transactions import error_of


def test_the_cluster_id_is_kafkas_form_made_once(broker):
    first = cluster.cluster_id(broker)
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", first)
    assert cluster.cluster_id(broker) == first
    with broker.db.transaction() as conn:  # a schema built without the migration's row
        conn.execute(text("DELETE FROM txlog.cluster"))
    made = cluster.cluster_id(broker)
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", made) and made != first
    assert cluster.cluster_id(broker) == made


def test_each_topic_has_its_own_id_fixed_at_creation(broker):
    topics.create_topic(broker, "b", 2)
    topics.create_topic(broker, "a", 1)
    every = topics.topics_metadata(broker)
    assert [(t.name, t.partitions) for t in every] == [("a", 1), ("b", 2)]
    assert all(isinstance(t.topic_id, uuid.UUID) and t.topic_id.int != 0 for t in every)
    assert every[0].topic_id != every[1].topic_id
    assert topics.topics_metadata(broker, ["b", "nope"]) == [every[1]]
    assert topics.topics_metadata(broker, []) == []
    assert topics.topics_metadata(broker, topic_ids=[every[0].topic_id, uuid.uuid4()]) == [every[0]]
    assert topics.topics_metadata(broker, ["b"], [every[0].topic_id]) == every
    assert topics.topics_metadata(broker) == every


def test_a_node_id_is_held_by_one_live_process(broker):
    one = cluster.register_node(broker, 1, "gw-1.example", 9092, 60_000)
    two = cluster.register_node(broker, 2, "gw-2.example", 9093, 60_000)
    zero = cluster.register_node(broker, 0, "127.0.0.1", 9094, 60_000)
    assert cluster.live_nodes(broker) == [(0, "127.0.0.1", 9094), (1, "gw-1.example", 9092), (2, "gw-2.example", 9093)]
    err = error_of(cluster.register_node, broker, 1, "intruder", 9999, 60_000)
    assert (err.code, err.details["reason"]) == (ErrorCode.INVALID_REQUEST, "node_id_in_use")
    assert "Node id 1 is held by another live gateway process (gw-1.example:9092)" in err.message
    cluster.renew_node(broker, one, 60_000)  # its own process renews it
    cluster.deregister_node(broker, two)
    assert [n for n, _, _ in cluster.live_nodes(broker)] == [0, 1]
    again = cluster.register_node(broker, 2, "gw-2b.example", 9095, 60_000)  # free again at once
    assert again.token != two.token
    cluster.deregister_node(broker, two)  # the old holder's late goodbye leaves the new holder alone
    assert (2, "gw-2b.example", 9095) in cluster.live_nodes(broker)
    assert zero.token not in (one.token, again.token)


def test_a_node_id_whose_lease_ended_is_free_and_its_late_renewal_refused(broker):
    stopped = cluster.register_node(broker, 5, "old", 9092, 50)
    time.sleep(0.2)
    assert cluster.live_nodes(broker) == []
    cluster.renew_node(broker, stopped, 60_000)  # late, but nobody took it: taken again
    assert cluster.live_nodes(broker) == [(5, "old", 9092)]
    with broker.db.transaction() as conn:
        conn.execute(text("UPDATE txlog.kafka_nodes SET expires_at = now() - interval '1 second'"))
    taker = cluster.register_node(broker, 5, "new", 9093, 60_000)
    err = error_of(cluster.renew_node, broker, stopped, 60_000)
    assert err.details["reason"] == "node_id_in_use"  # that process is no longer node 5
    assert cluster.live_nodes(broker) == [(5, "new", 9093)]
    cluster.renew_node(broker, taker, 60_000)


def test_registrations_are_checked(broker):
    for node_id, host, port, lease in (
        (-1, "h", 9092, 1000),
        (1, "", 9092, 1000),
        (1, "h", 0, 1000),
        (1, "h", 70_000, 1000),
        (1, "h", 9092, 0),
    ):
        assert error_of(cluster.register_node, broker, node_id, host, port, lease).code is ErrorCode.INVALID_REQUEST


def test_every_gateway_computes_the_same_leaders_from_the_registry(broker):
    topics.create_topic(broker, "spread", 6)
    for node_id in (3, 1, 2):
        cluster.register_node(broker, node_id, f"gw-{node_id}", 9090 + node_id, 60_000)
    ids = [n for n, _, _ in cluster.live_nodes(broker)]
    leaders = [leader_of("spread", p, ids) for p in range(6)]
    assert sorted(set(leaders)) == [1, 2, 3] and leaders == [leader_of("spread", p, list(reversed(ids))) for p in range(6)]
    assert coordinator_of("group-a", ids) in ids
