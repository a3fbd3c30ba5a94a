"""Consumer group offset rules (app.domain.groups.offsets)."""

from dataclasses import dataclass

from app.domain.groups.offsets import last_per_partition


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


@dataclass(frozen=True)
class Committed:
    topic: str
    partition: int
    offset: int
    metadata: str = ""


def test_metadata_longer_than_the_limit_is_refused_naming_its_partitions():
    import pytest

    from app.domain.groups.offsets import check_committable
    from app.errors import ErrorCode, TxlogError

    check_committable([Committed("a", 0, 1, "x" * 10), Committed("a", 1, 1, "")], max_metadata=10)
    with pytest.raises(TxlogError) as too_large:
        check_committable(
            [Committed("a", 0, 1, "x" * 11), Committed("a", 1, 1, "ok"), Committed("b", 0, 1, "é" * 11)], max_metadata=10
        )
    assert too_large.value.code is ErrorCode.OFFSET_METADATA_TOO_LARGE
    assert too_large.value.details["partitions"] == [("a", 0), ("b", 0)]
    # counted as Kafka counts a string: UTF-16 code units, so a character beyond U+FFFF is two
    check_committable([Committed("a", 0, 1, "\U0001f600" * 5)], max_metadata=10)
    with pytest.raises(TxlogError):
        check_committable([Committed("a", 0, 1, "\U0001f600" * 5 + "x")], max_metadata=10)
    # an invalid offset is named first, with its own error
    with pytest.raises(TxlogError) as invalid:
        check_committable([Committed("a", 0, -1), Committed("a", 1, 1, "x" * 11)], max_metadata=10)
    assert invalid.value.code is ErrorCode.INVALID_REQUEST and invalid.value.details["partitions"] == [("a", 0)]
