"""Where a leader epoch ends (app.domain.log.epoch_end_offset): Kafka's OffsetForLeaderEpoch for a
log written at one leader epoch, and the fence on the client's current leader epoch."""

from __future__ import annotations

import pytest

from app.domain.log import LEADER_EPOCH, NO_EPOCH, NO_EPOCH_OFFSET, EpochEndOffset, epoch_end_offset
from app.errors import ErrorCode, TxlogError

UNDEFINED = EpochEndOffset(NO_EPOCH, NO_EPOCH_OFFSET)


@pytest.mark.parametrize("current", [NO_EPOCH, LEADER_EPOCH])
def test_the_leaders_epoch_ends_at_the_log_end(current: int) -> None:
    assert epoch_end_offset(LEADER_EPOCH, current, 3, 17) == EpochEndOffset(LEADER_EPOCH, 17)
    assert epoch_end_offset(LEADER_EPOCH, current, 0, 0) == EpochEndOffset(LEADER_EPOCH, 0)  # an empty log


@pytest.mark.parametrize("requested", [NO_EPOCH, LEADER_EPOCH + 1, 2**31 - 1])
def test_no_epoch_or_one_above_the_leaders_has_no_end_and_no_error(requested: int) -> None:
    assert epoch_end_offset(requested, NO_EPOCH, 3, 17) == UNDEFINED


def test_an_epoch_below_the_first_known_ends_where_the_first_begins_keeping_its_number() -> None:
    assert epoch_end_offset(-5, NO_EPOCH, 3, 17) == EpochEndOffset(-5, 3)
    # a later leader epoch, as the rule is written for any: an older epoch ends at the log start
    assert epoch_end_offset(2, NO_EPOCH, 3, 17, leader_epoch=5) == EpochEndOffset(2, 3)
    assert epoch_end_offset(5, 5, 3, 17, leader_epoch=5) == EpochEndOffset(5, 17)


@pytest.mark.parametrize(
    ("current", "code"),
    [
        (LEADER_EPOCH + 1, ErrorCode.UNKNOWN_LEADER_EPOCH),  # the client knows a newer leader than this one
        (-2, ErrorCode.FENCED_LEADER_EPOCH),  # older than the leader's (below -1: not "none")
    ],
)
def test_the_clients_current_leader_epoch_is_fenced_before_anything(current: int, code: ErrorCode) -> None:
    for requested in (NO_EPOCH, LEADER_EPOCH, LEADER_EPOCH + 1):
        with pytest.raises(TxlogError) as info:
            epoch_end_offset(requested, current, 0, 10)
        assert info.value.code is code
        assert info.value.code.retriable


def test_fenced_when_older_with_a_later_leader_epoch() -> None:
    with pytest.raises(TxlogError) as info:
        epoch_end_offset(3, 3, 0, 10, leader_epoch=4)
    assert info.value.code is ErrorCode.FENCED_LEADER_EPOCH
    assert "older" in info.value.message
