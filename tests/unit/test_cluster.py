"""Which gateway node leads a partition or coordinates a group (app.domain.cluster): the same
answer from any node for the same live nodes, spread over all of them, stable while they stay."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.cluster import coordinator_of, leader_of
from app.domain.partitioner import murmur2, to_positive
from app.errors import ErrorCode, TxlogError

node_sets = st.lists(st.integers(0, 1000), min_size=1, max_size=8, unique=True)


def test_a_single_node_leads_and_coordinates_everything():
    assert {leader_of("t", p, [7]) for p in range(20)} == {7}
    assert coordinator_of("g", [7]) == 7


def test_the_rule_is_the_topic_hash_plus_the_partition_over_the_ordered_node_ids():
    h = to_positive(murmur2(b"orders"))
    for p in range(10):
        assert leader_of("orders", p, [30, 10, 20]) == [10, 20, 30][(h + p) % 3]
    assert coordinator_of("my-group", [30, 10, 20]) == [10, 20, 30][to_positive(murmur2(b"my-group")) % 3]


@given(node_sets, st.text(min_size=1, max_size=30), st.integers(0, 10_000))
def test_every_node_computes_the_same_answer_whatever_order_it_lists_nodes_in(nodes, topic, partition):
    assert leader_of(topic, partition, nodes) == leader_of(topic, partition, list(reversed(nodes))) in nodes
    assert leader_of(topic, partition, nodes + nodes) == leader_of(topic, partition, nodes)
    assert coordinator_of(topic, nodes) == coordinator_of(topic, sorted(nodes)) in nodes


@given(node_sets, st.text(min_size=1, max_size=30))
def test_a_topics_partitions_go_round_every_node(nodes, topic):
    leaders = [leader_of(topic, p, nodes) for p in range(len(nodes))]
    assert sorted(leaders) == sorted(nodes)


def test_groups_spread_over_the_nodes():
    placed = [coordinator_of(f"group-{i}", [0, 1, 2]) for i in range(300)]
    assert all(placed.count(n) > 60 for n in (0, 1, 2))


def test_names_that_are_not_ascii_hash_as_utf8():
    assert coordinator_of("grüppe", [0, 1, 2, 3]) == [0, 1, 2, 3][to_positive(murmur2("grüppe".encode())) % 4]


def test_no_live_node_is_coordinator_not_available():
    for call in (lambda: leader_of("t", 0, []), lambda: coordinator_of("g", ())):
        with pytest.raises(TxlogError) as info:
            call()
        assert info.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
