"""The gateway's share sessions (Kafka's ShareSessionCache): epoch 0 opens anew, each request sends
the next epoch (wrapping to 1), -1 closes; out of turn, unknown, and past the limit as Kafka answers."""

from __future__ import annotations

import pytest

from api.kafka.handlers.share import ShareSessionCache, _partition_max_bytes
from app.errors import ErrorCode, TxlogError
from app.services.share import DEFAULT_MAX_BYTES


def _code(fn, *args) -> ErrorCode:  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as err:
        fn(*args)
    return err.value.code


def test_epochs_follow_one_another_and_a_close_ends_the_session() -> None:
    cache = ShareSessionCache()
    assert cache.open(0, "g", "m").epoch == 1
    assert cache.use(0, "g", "m", 1).epoch == 2
    assert _code(cache.use, 0, "g", "m", 1) is ErrorCode.INVALID_SHARE_SESSION_EPOCH
    assert _code(cache.use, 0, "g", "other", 1) is ErrorCode.SHARE_SESSION_NOT_FOUND
    assert _code(cache.use, 1, "g", "m", 2) is ErrorCode.SHARE_SESSION_NOT_FOUND  # another gateway's
    cache.open(0, "g", "m")  # anew: the epoch starts over
    assert cache.use(0, "g", "m", 1).epoch == 2
    cache.close(0, "g", "m")
    assert _code(cache.close, 0, "g", "m") is ErrorCode.SHARE_SESSION_NOT_FOUND


def test_the_epoch_wraps_to_one() -> None:
    cache = ShareSessionCache()
    cache.open(0, "g", "m").epoch = 2**31 - 1
    assert cache.use(0, "g", "m", 2**31 - 1).epoch == 1


def test_past_the_limit_a_new_session_is_refused() -> None:
    cache = ShareSessionCache(limit=1)
    cache.open(0, "g", "m1")
    assert _code(cache.open, 0, "g", "m2") is ErrorCode.SHARE_SESSION_LIMIT_REACHED
    cache.open(0, "g", "m1")  # the member's own session is replaced, not added


def test_a_dropped_session_is_not_found() -> None:
    cache = ShareSessionCache()
    cache.open(0, "g", "m")
    cache.drop(0, "g", "m")
    cache.drop(0, "g", "never")  # nothing to drop: no error
    assert _code(cache.use, 0, "g", "m", 1) is ErrorCode.SHARE_SESSION_NOT_FOUND


def test_max_bytes_split_evenly_over_the_partitions() -> None:
    assert _partition_max_bytes(4_500, 2) == 2_250
    assert _partition_max_bytes(10, 3) == 3
    assert _partition_max_bytes(1, 4) == 1  # a first record is still given (KIP-74)
    assert _partition_max_bytes(2**31 - 1, 1) == DEFAULT_MAX_BYTES
    assert _partition_max_bytes(1000, 0) == 1000
