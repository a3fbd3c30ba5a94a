"""A share group's configs: Kafka's names, defaults and bounds, and what they decide."""

from __future__ import annotations

import pytest

from app.domain.share_configs import DEFAULTS, config_of, validated
from app.domain.share_groups import ShareGroupConfig
from app.domain.share_partition import DeliveryConfig, OffsetReset
from app.errors import ErrorCode, TxlogError


def test_defaults_are_kafkas() -> None:
    config = config_of({})
    assert config.auto_offset_reset == OffsetReset("latest")
    assert config.isolation_level == "read_uncommitted"
    assert config.delivery == DeliveryConfig(30_000, 5)
    assert config.session_timeout_ms == 45_000
    assert set(DEFAULTS) == {
        "share.auto.offset.reset",
        "share.isolation.level",
        "share.record.lock.duration.ms",
        "share.delivery.count.limit",
        "share.session.timeout.ms",
        "share.heartbeat.interval.ms",
    }
    assert config.membership == ShareGroupConfig(45_000, 5_000)


def test_set_values_decide() -> None:
    config = config_of(
        {
            "share.auto.offset.reset": "by_duration:PT1H",
            "share.isolation.level": "read_committed",
            "share.record.lock.duration.ms": "15000",
            "share.delivery.count.limit": "2",
        }
    )
    assert config.auto_offset_reset == OffsetReset("by_duration", 3_600_000)
    assert config.isolation_level == "read_committed"
    assert config.delivery == DeliveryConfig(15_000, 2)


@pytest.mark.parametrize(
    ("name", "value", "stored"),
    [
        ("share.isolation.level", " READ_COMMITTED ", "read_committed"),
        ("share.auto.offset.reset", "earliest", "earliest"),
        ("share.delivery.count.limit", "10", "10"),
        ("share.record.lock.duration.ms", "60000", "60000"),
        ("share.session.timeout.ms", "45000", "45000"),
        ("share.heartbeat.interval.ms", "15000", "15000"),
    ],
)
def test_valid_values_are_stored_normalised(name: str, value: str, stored: str) -> None:
    assert validated(name, value) == stored


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("share.isolation.level", "dirty"),
        ("share.auto.offset.reset", "sometimes"),
        ("share.delivery.count.limit", "1"),
        ("share.delivery.count.limit", "11"),
        ("share.record.lock.duration.ms", "14999"),
        ("share.session.timeout.ms", "forever"),
        ("share.heartbeat.interval.ms", "4999"),
        ("share.unknown", "1"),
    ],
)
def test_invalid_values_are_invalid_config(name: str, value: str) -> None:
    with pytest.raises(TxlogError) as err:
        validated(name, value)
    assert err.value.code is ErrorCode.INVALID_CONFIG


def test_the_broker_may_lower_the_least_lock_duration() -> None:
    """Kafka's group.share.min.record.lock.duration.ms: 15 s unless the broker sets less."""
    name = "share.record.lock.duration.ms"
    assert validated(name, "2000", min_record_lock_duration_ms=1000) == "2000"
    for value, low in (("2000", None), ("999", 1000), ("60001", 1000)):
        with pytest.raises(TxlogError) as err:
            validated(name, value, min_record_lock_duration_ms=low)
        assert err.value.code is ErrorCode.INVALID_CONFIG
