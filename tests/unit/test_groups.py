"""Consumer group offset rules (app.domain.groups)."""

from dataclasses import dataclass

from app.domain.groups import last_per_partition


@dataclass(frozen=True)
class Offset:
    topic: str
    partition: int
    offset: int


def test_a_partition_given_twice_keeps_its_last_offset_in_its_first_place():
    given = [Offset("a", 0, 5), Offset("b", 0, 1), Offset("a", 0, 9), Offset("a", 1, 2), Offset("a", 0, 7)]
    assert last_per_partition(given) == [Offset("a", 0, 7), Offset("b", 0, 1), Offset("a", 1, 2)]


def test_partitions_of_the_same_number_in_other_topics_are_distinct():
    given = [Offset("a", 0, 1), Offset("b", 0, 2), Offset("a", 1, 3)]
    assert last_per_partition(given) == given


def test_an_empty_list_stays_empty():
    assert last_per_partition([]) == []


def test_takes_any_iterable_once():
    assert last_per_partition(o for o in [Offset("a", 0, 1), Offset("a", 0, 2)]) == [Offset("a", 0, 2)]
