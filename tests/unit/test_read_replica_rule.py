"""Which read replica a consumer fetches a partition from (KIP-392): the pure rule
(``app.domain.cluster.preferred_read_replica``), and the gateway's cluster view that applies it to
the live nodes (leaders and coordinators among the gateways of the primary only)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from api.kafka.cluster import _view
from api.kafka.handlers import Node
from app.domain.cluster import coordinator_of, leader_of, preferred_read_replica
from app.services.cluster import LiveNode

RACKS = {0: "r0", 1: "r1", 2: None, 10: "r1", 11: "r2", 12: "r1"}
REPLICAS = [10, 11, 12]


def test_a_client_without_a_rack_stays_with_the_leader():
    assert preferred_read_replica("t", 0, None, 0, RACKS, REPLICAS) == -1
    assert preferred_read_replica("t", 0, "", 0, RACKS, REPLICAS) == -1


def test_a_client_in_the_leaders_rack_stays_with_the_leader():
    assert preferred_read_replica("t", 0, "r0", 0, RACKS, REPLICAS) == -1
    assert preferred_read_replica("t", 0, "r1", 1, RACKS, REPLICAS) == -1  # replicas in r1 too: the leader


def test_a_client_in_a_rack_without_a_replica_stays_with_the_leader():
    assert preferred_read_replica("t", 0, "r9", 0, RACKS, REPLICAS) == -1
    assert preferred_read_replica("t", 0, "r1", 0, RACKS, []) == -1


def test_a_client_in_a_replicas_rack_is_sent_to_it():
    assert preferred_read_replica("t", 3, "r2", 0, RACKS, REPLICAS) == 11
    assert preferred_read_replica("t", 3, "r2", 2, RACKS, REPLICAS) == 11  # a leader without a rack


def test_the_partitions_spread_over_the_replicas_of_a_rack_as_leadership_does():
    chosen = [preferred_read_replica("orders", p, "r1", 0, RACKS, REPLICAS) for p in range(12)]
    assert chosen == [leader_of("orders", p, [10, 12]) for p in range(12)]
    assert set(chosen) == {10, 12}


def test_a_primary_node_in_the_clients_rack_is_no_read_replica():
    # node 1 is in r1 but is no replica: only the replicas are candidates
    assert preferred_read_replica("t", 0, "r1", 0, RACKS, [11]) == -1


@given(
    st.text(min_size=1, max_size=20),
    st.integers(0, 1000),
    st.sampled_from(["r0", "r1", "r2", "r9", None]),
    st.sampled_from([0, 1, 2]),
    st.permutations(REPLICAS),
)
def test_the_answer_is_a_replica_of_the_clients_rack_or_the_leader_whatever_the_order(topic, partition, rack, leader, replicas):
    chosen = preferred_read_replica(topic, partition, rack, leader, RACKS, replicas)
    assert chosen == preferred_read_replica(topic, partition, rack, leader, RACKS, sorted(replicas))
    if chosen == -1:
        assert not rack or RACKS[leader] == rack or all(RACKS[r] != rack for r in replicas)
    else:
        assert chosen in replicas and RACKS[chosen] == rack != RACKS[leader]


def test_the_view_leads_and_coordinates_on_the_primarys_gateways_only():
    rows = [
        LiveNode(0, "p0", 9092, {}, "r0"),
        LiveNode(1, "p1", 9093, {}, "r1"),
        LiveNode(5, "rep", 9094, {}, "r1", read_replica=True),
        LiveNode(6, "rep2", 9095, {}, "r2", read_replica=True),
    ]
    view = _view(rows, Node(0, "p0", 9092, "r0"), {})
    assert view.ids == (0, 1) and view.replicas == {5, 6}
    assert [n.rack for n in view.nodes] == ["r0", "r1", "r1", "r2"]
    for p in range(8):
        leader = leader_of("t", p, [0, 1])
        expected = -1 if leader == 1 else 5  # node 1 is in r1 itself
        assert view.preferred_read_replica("t", p, "r1") == expected
        assert view.preferred_read_replica("t", p, "r2") == 6
        assert view.preferred_read_replica("t", p, None) == -1
    assert coordinator_of("g", view.ids) in (0, 1)
    # seen from the replica itself: the same leaders, and it is a replica
    own = _view(rows[:2], Node(5, "rep", 9094, "r1"), {}, own_replica=True)
    assert own.ids == (0, 1) and own.replicas == {5}
