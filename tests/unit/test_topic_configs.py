"""Kafka's topic configs (app.domain.topic_configs): the names and values a topic may be given at
create and alter, as Kafka checks them, the incremental operations, and what DescribeConfigs shows."""

import pytest

from app.domain.topic_configs import (
    MAX_LONG,
    TOPIC_CONFIGS,
    ConfigSource,
    Operation,
    altered,
    describe,
    incremental,
    kept,
    validated,
)
from app.errors import ErrorCode, TxlogError


def _invalid(config):  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        validated(config)
    assert info.value.code is ErrorCode.INVALID_CONFIG
    return info.value


@pytest.mark.parametrize("key", ["retention.ms", "retention.bytes"])
@pytest.mark.parametrize(
    "given, stored",
    [
        (-1, -1),
        (0, 0),
        (1, 1),
        (604_800_000, 604_800_000),
        (MAX_LONG, MAX_LONG),
        ("-1", -1),
        ("0", 0),
        ("1000", 1000),
        (str(MAX_LONG), MAX_LONG),
        (" 10", 10),
        ("10 ", 10),
    ],
)
def test_retention_values_are_integers_of_at_least_minus_one(key, given, stored):
    assert validated({key: given}) == {key: stored}


@pytest.mark.parametrize("key", ["retention.ms", "retention.bytes"])
@pytest.mark.parametrize("value", [-2, -(2**63), "-2"])
def test_retention_values_below_minus_one_are_invalid_config(key, value):
    assert _invalid({key: value}).message == f"Invalid value {value} for configuration {key}: Value must be at least -1"


@pytest.mark.parametrize("key", ["retention.ms", "retention.bytes"])
@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        1.5,
        1.0,
        "",
        " ",
        "1.5",
        "1e3",
        "1_000",
        "+5",
        "0x10",
        "٣",
        "abc",
        "7d",
        [],
        [1],
        {},
        {"a": 1},
        "9" * 5000,
        MAX_LONG + 1,
        str(MAX_LONG + 1),
        "99999999999999999999",
    ],
)
def test_retention_values_that_are_not_longs_are_invalid_config(key, value):
    err = _invalid({key: value})
    assert err.message.endswith(": Not a number of type LONG") and key in err.message
    assert len(err.message) < 200  # a huge value is not echoed whole


@pytest.mark.parametrize("name", ["x", "segment.byte", "", "a\x00b", "\ud800", "log.retention.ms", 5])
def test_a_name_kafka_does_not_know_is_invalid_config(name):
    assert _invalid({name: "1"}).message.startswith("Unknown topic config name: ")


def test_every_kafka_value_kind_is_read_as_kafka_reads_it():
    config = {
        "cleanup.policy": "delete",
        "segment.bytes": "1048576",
        "min.cleanable.dirty.ratio": "0.25",
        "preallocate": "TRUE",
        "compression.type": "zstd",
        "max.message.bytes": 2048,
        "message.timestamp.type": "CreateTime",
    }
    assert kept(config) == {
        "cleanup.policy": "delete",
        "segment.bytes": 1_048_576,
        "min.cleanable.dirty.ratio": 0.25,
        "preallocate": "true",
        "compression.type": "zstd",
        "max.message.bytes": 2048,
        "message.timestamp.type": "CreateTime",
    }


@pytest.mark.parametrize(
    "config, why",
    [
        ({"segment.bytes": "1000"}, "Value must be at least 1048576"),
        ({"segment.bytes": str(2**31)}, "Not a number of type INT"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "Value must be no more than 1"),
        ({"min.cleanable.dirty.ratio": "nan"}, "Not a number of type DOUBLE"),
        ({"compression.type": 5}, "Expected value to be a string, but it was a int"),
        ({"preallocate": "yes"}, "either true or false"),
        ({"compression.type": "brotli"}, "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer"),
        ({"cleanup.policy": "delete,archive"}, "Every item must be one of: delete, compact"),
        ({"cleanup.policy": ""}, "Empty list not allowed"),
        ({"min.insync.replicas": 0}, "Value must be at least 1"),
    ],
)
def test_a_value_kafka_would_refuse_is_invalid_config(config, why):
    assert why in _invalid(config).message


@pytest.mark.parametrize(
    "config", [{"cleanup.policy": "compact"}, {"cleanup.policy": "delete,compact"}, {"message.timestamp.type": "LogAppendTime"}]
)
def test_what_txlog_cannot_do_is_refused_not_kept(config):
    assert "txlog supports only" in _invalid(config).message


def test_alter_sets_the_keys_given_and_removes_those_given_as_null():
    current = {"retention.ms": 1000, "cleanup.policy": "delete"}
    assert altered(current, {"retention.bytes": "2048"}) == {
        "retention.ms": 1000,
        "cleanup.policy": "delete",
        "retention.bytes": 2048,
    }
    assert altered(current, {"retention.ms": None}) == {"cleanup.policy": "delete"}
    assert current == {"retention.ms": 1000, "cleanup.policy": "delete"}  # not changed in place


def test_alter_changes_nothing_when_one_change_is_invalid():
    current = {"retention.ms": 1000}
    with pytest.raises(TxlogError):
        altered(current, {"retention.bytes": 10, "retention.ms": -5})
    assert current == {"retention.ms": 1000}


def test_incremental_operations():
    current = {"retention.ms": 1000}
    assert incremental(current, [("retention.ms", Operation.DELETE, None), ("segment.ms", Operation.SET, "5")]) == {
        "segment.ms": 5
    }
    appended = incremental({}, [("leader.replication.throttled.replicas", Operation.APPEND, "0:1,0:2")])
    assert appended == {"leader.replication.throttled.replicas": "0:1,0:2"}
    subtracted = incremental(appended, [("leader.replication.throttled.replicas", Operation.SUBTRACT, "0:1")])
    assert subtracted == {"leader.replication.throttled.replicas": "0:2"}
    # the default ("delete") is where an append starts; compact is still refused
    with pytest.raises(TxlogError, match="txlog supports only delete"):
        incremental({}, [("cleanup.policy", Operation.APPEND, "compact")])


@pytest.mark.parametrize(
    "ops, why",
    [
        ([("retention.ms", Operation.APPEND, "5")], "append is not allowed"),
        ([("retention.ms", Operation.SET, "1"), ("retention.ms", Operation.DELETE, None)], "more than once"),
        ([("retention.ms", Operation.SET, None)], "Null value not supported"),
        ([("nope", Operation.DELETE, None)], "Unknown topic config name: nope"),
    ],
)
def test_incremental_refusals(ops, why):
    with pytest.raises(TxlogError, match=why) as info:
        incremental({}, ops)
    assert info.value.code is ErrorCode.INVALID_CONFIG


def test_describe_names_every_config_with_its_source():
    described = {d.name: d for d in describe({"retention.ms": 5000}, {"log.retention.bytes": -1})}
    assert list(described) == sorted(c.name for c in TOPIC_CONFIGS)
    ms = described["retention.ms"]
    assert (ms.value, ms.source) == ("5000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert [s[0] for s in ms.synonyms] == ["retention.ms", "log.retention.ms"]
    size = described["retention.bytes"]
    assert (size.value, size.source) == ("-1", ConfigSource.STATIC_BROKER_CONFIG)
    assert described["min.cleanable.dirty.ratio"].value == "0.5"
    assert described["segment.bytes"].source is ConfigSource.DEFAULT_CONFIG
    assert not any(d.read_only for d in described.values())


def test_the_table_is_in_name_order_and_each_default_is_valid():
    names = [c.name for c in TOPIC_CONFIGS]
    assert names == sorted(names)
    for c in TOPIC_CONFIGS:
        if c.supported is None or str(c.default) in c.supported:
            assert validated({c.name: str(c.default)}) is not None


def test_a_setting_the_server_was_given_is_a_static_broker_config_and_its_defaults_are_its_own() -> None:
    from types import SimpleNamespace

    from app.config import Settings
    from app.services.topics import described_config

    given = {
        d.name: (d.value, d.source) for d in described_config(SimpleNamespace(settings=Settings(log_retention_ms=60_000)), {})
    }  # type: ignore[arg-type]
    assert given["retention.ms"] == ("60000", ConfigSource.STATIC_BROKER_CONFIG)
    assert given["retention.bytes"] == ("-1", ConfigSource.DEFAULT_CONFIG)  # the server's default: keep everything
    assert given["max.message.bytes"] == ("1048576", ConfigSource.DEFAULT_CONFIG)
    assert given["segment.bytes"] == ("1073741824", ConfigSource.DEFAULT_CONFIG)  # Kafka's
