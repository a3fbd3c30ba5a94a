"""Retention rules (app.domain.retention): topic config validation at create and alter, Kafka's
incremental alter, and where retention moves a partition's log start."""

import pytest

from app.domain.retention import MAX_LONG, altered_config, log_start_for_retention, validate_topic_config
from app.errors import ErrorCode, TxlogError


def _invalid(config):  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        validate_topic_config(config)
    assert info.value.code is ErrorCode.INVALID_CONFIG
    return info.value


# --- validate_topic_config ------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["retention.ms", "retention.bytes"])
@pytest.mark.parametrize(
    "given, stored",
    [(-1, -1), (0, 0), (1, 1), (604_800_000, 604_800_000), (MAX_LONG, MAX_LONG),
     ("-1", -1), ("0", 0), ("1000", 1000), (str(MAX_LONG), MAX_LONG)],
)
def test_retention_values_are_integers_of_at_least_minus_one(key, given, stored):
    assert validate_topic_config({key: given}) == {key: stored}


@pytest.mark.parametrize("key", ["retention.ms", "retention.bytes"])
@pytest.mark.parametrize("value", [-2, -(2**63), MAX_LONG + 1, "-2", str(MAX_LONG + 1), "99999999999999999999"])
def test_retention_values_out_of_range_are_invalid_config(key, value):
    assert "from -1 (no limit) to 9223372036854775807" in _invalid({key: value}).message


@pytest.mark.parametrize("key", ["retention.ms", "retention.bytes"])
@pytest.mark.parametrize(
    "value",
    [True, False, 1.5, 1.0, "", " ", "1.5", "1e3", " 10", "10 ", "1_000", "+5", "0x10", "٣", "abc", "7d",
     [], [1], {}, {"a": 1}, "9" * 5000],
)
def test_retention_values_that_are_not_integers_are_invalid_config(key, value):
    err = _invalid({key: value})
    assert "must be an integer" in err.message
    assert len(err.message) < 200  # a huge value is not echoed whole


def test_other_keys_are_kept_as_given():
    config = {"cleanup.policy": "delete", "segment.bytes": 1024, "x": {"nested": [1, "two", None]}, "flag": True}
    assert validate_topic_config(config) == config


def test_null_values_pass_through_for_alter_to_remove():
    assert validate_topic_config({"retention.ms": None, "other": None}) == {"retention.ms": None, "other": None}


@pytest.mark.parametrize("key", ["", "a\x00b", "\ud800"])
def test_config_names_must_be_storable(key):
    assert "Invalid config name" in _invalid({key: "1"}).message


@pytest.mark.parametrize("value", ["a\x00b", "\udfff", ["ok", "\x00"], {"k": "\x00"}, {"\x00": 1}, float("nan"), float("inf"), [float("-inf")]])
def test_config_values_must_be_storable_as_json(value):
    assert "cannot be stored" in _invalid({"other.key": value}).message


def test_an_empty_config_is_valid():
    assert validate_topic_config({}) == {}


# --- altered_config: Kafka's IncrementalAlterConfigs ------------------------------------------------

def test_alter_sets_the_keys_given_and_keeps_the_rest():
    current = {"retention.ms": 1000, "cleanup.policy": "delete"}
    assert altered_config(current, {"retention.bytes": "2048"}) == {"retention.ms": 1000, "cleanup.policy": "delete", "retention.bytes": 2048}
    assert altered_config(current, {"retention.ms": 5}) == {"retention.ms": 5, "cleanup.policy": "delete"}
    assert current == {"retention.ms": 1000, "cleanup.policy": "delete"}  # not changed in place


def test_alter_removes_keys_given_as_null_and_ignores_absent_ones():
    current = {"retention.ms": 1000, "cleanup.policy": "delete"}
    assert altered_config(current, {"retention.ms": None, "never.set": None}) == {"cleanup.policy": "delete"}


def test_alter_with_nothing_changes_nothing():
    assert altered_config({"retention.ms": 1}, {}) == {"retention.ms": 1}


def test_alter_validates_the_changes_and_changes_nothing_when_one_is_invalid():
    current = {"retention.ms": 1000}
    with pytest.raises(TxlogError) as info:
        altered_config(current, {"retention.bytes": 10, "retention.ms": -5})
    assert info.value.code is ErrorCode.INVALID_CONFIG
    assert current == {"retention.ms": 1000}


# --- log_start_for_retention ---------------------------------------------------------------------

def test_no_limit_does_not_move_the_log_start():
    assert log_start_for_retention(0, 100, None, None) is None


def test_the_further_of_the_two_limits_wins():
    assert log_start_for_retention(0, 100, 30, None) == 30
    assert log_start_for_retention(0, 100, None, 40) == 40
    assert log_start_for_retention(0, 100, 30, 40) == 40
    assert log_start_for_retention(0, 100, 50, 40) == 50


def test_never_past_the_last_stable_offset():
    assert log_start_for_retention(0, 10, 30, None) == 10
    assert log_start_for_retention(0, 10, None, 1000) == 10
    assert log_start_for_retention(10, 10, 30, 30) is None  # already at the LSO


def test_never_backwards():
    assert log_start_for_retention(50, 100, 30, 40) is None
    assert log_start_for_retention(50, 100, 50, None) is None
    assert log_start_for_retention(50, 100, 51, None) == 51
    assert log_start_for_retention(50, 40, 60, None) is None  # an LSO below the log start never moves it back
