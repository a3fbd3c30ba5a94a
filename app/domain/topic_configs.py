"""Kafka's topic configs: the one table of the names a topic may be given, with Kafka's type,
default and bounds, and whether txlog acts on each. It serves every way a config comes in or goes
out: CreateTopics, AlterConfigs and IncrementalAlterConfigs on the wire, ``POST /v1/topics`` and
``PATCH /v1/topics/{topic}`` over HTTP, and DescribeConfigs. Plain functions, no I/O.

A name Kafka does not know, or a value Kafka would refuse, is INVALID_CONFIG with Kafka's message;
nothing unknown is kept. Of the names Kafka knows, txlog acts on the retention limits
(``retention.ms``, ``retention.bytes``) and refuses what it cannot do (``cleanup.policy=compact``,
``message.timestamp.type=LogAppendTime``) rather than keep it without effect. The rest are about
segments, replicas, compaction and tiered storage, which a log kept once in PostgreSQL does not
have: they are checked and kept as given, and change nothing (``applied=False``), so that tools and
frameworks that set them (Kafka Connect, Kafka Streams) can create their topics.

A kept value is a JSON value: an integer for INT and LONG configs, a number for DOUBLE ones, a
string otherwise. Wire values arrive as strings and are read as Kafka's ``ConfigDef`` reads them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, Mapping

from app.errors import ErrorCode, TxlogError

MAX_LONG = 2**63 - 1
MAX_INT = 2**31 - 1
_INTEGER = re.compile(r"-?[0-9]{1,40}")  # as Java's Long.parseLong reads it: no spaces, no "_"
_DOUBLE = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


class ConfigType(IntEnum):
    """DescribeConfigs v3+'s config_type."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class ConfigSource(IntEnum):
    """Where a described value comes from (DescribeConfigs v1+'s config_source)."""

    DYNAMIC_TOPIC_CONFIG = 1
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_GROUP_CONFIG = 8  # a group's own (KIP-848, KIP-932 group configs)


class Operation(Enum):
    """IncrementalAlterConfigs' operations, by their wire numbers."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True)
class TopicConfig:
    name: str
    type: ConfigType
    default: int | float | str | None  # Kafka's, as a kept value would be
    doc: str
    applied: bool = False  # txlog acts on it
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: tuple[str, ...] = ()  # a STRING's values, or each item of a LIST
    supported: tuple[str, ...] | None = None  # of the choices, what txlog does (the others are refused)
    broker_synonym: str | None = None  # the broker config that gives the default (log.retention.ms, ...)


_T = ConfigType
_COMPRESSION = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
_NO_EFFECT = "Kept as given; no effect: txlog keeps one copy of each record, in PostgreSQL, without segments or replicas."

TOPIC_CONFIGS: tuple[TopicConfig, ...] = (
    TopicConfig(
        "cleanup.policy",
        _T.LIST,
        "delete",
        "Old records are deleted by retention.ms and retention.bytes; txlog does not compact.",
        True,
        choices=("delete", "compact"),
        supported=("delete",),
        broker_synonym="log.cleanup.policy",
    ),
    TopicConfig("compression.gzip.level", _T.INT, -1, _NO_EFFECT, minimum=-1, maximum=9),
    TopicConfig("compression.lz4.level", _T.INT, 9, _NO_EFFECT, minimum=1, maximum=17),
    TopicConfig(
        "compression.type",
        _T.STRING,
        "producer",
        "Records are kept uncompressed; batches are compressed as the consumer asks.",
        choices=_COMPRESSION,
        broker_synonym="compression.type",
    ),
    TopicConfig("compression.zstd.level", _T.INT, 3, _NO_EFFECT, minimum=-131072, maximum=22),
    TopicConfig("delete.retention.ms", _T.LONG, 86_400_000, _NO_EFFECT, minimum=0),
    TopicConfig("file.delete.delay.ms", _T.LONG, 60_000, _NO_EFFECT, minimum=0),
    TopicConfig("flush.messages", _T.LONG, MAX_LONG, "Every acknowledged batch is committed to PostgreSQL.", minimum=1),
    TopicConfig("flush.ms", _T.LONG, MAX_LONG, "Every acknowledged batch is committed to PostgreSQL.", minimum=0),
    TopicConfig("follower.replication.throttled.replicas", _T.LIST, "", _NO_EFFECT),
    TopicConfig("index.interval.bytes", _T.INT, 4096, _NO_EFFECT, minimum=0),
    TopicConfig("leader.replication.throttled.replicas", _T.LIST, "", _NO_EFFECT),
    TopicConfig("local.retention.bytes", _T.LONG, -2, _NO_EFFECT, minimum=-2),
    TopicConfig("local.retention.ms", _T.LONG, -2, _NO_EFFECT, minimum=-2),
    TopicConfig("max.compaction.lag.ms", _T.LONG, MAX_LONG, _NO_EFFECT, minimum=1),
    TopicConfig(
        "max.message.bytes",
        _T.INT,
        1_048_588,
        "Kept as given; batches are bounded by the server's own limits (docs/kafka.md).",
        minimum=0,
        broker_synonym="message.max.bytes",
    ),
    TopicConfig("message.timestamp.after.max.ms", _T.LONG, 3_600_000, _NO_EFFECT, minimum=0),
    TopicConfig("message.timestamp.before.max.ms", _T.LONG, MAX_LONG, _NO_EFFECT, minimum=0),
    TopicConfig(
        "message.timestamp.type",
        _T.STRING,
        "CreateTime",
        "Each record keeps the timestamp its producer gave (CreateTime).",
        True,
        choices=("CreateTime", "LogAppendTime"),
        supported=("CreateTime",),
    ),
    TopicConfig("min.cleanable.dirty.ratio", _T.DOUBLE, 0.5, _NO_EFFECT, minimum=0, maximum=1),
    TopicConfig("min.compaction.lag.ms", _T.LONG, 0, _NO_EFFECT, minimum=0),
    TopicConfig("min.insync.replicas", _T.INT, 1, _NO_EFFECT, minimum=1),
    TopicConfig("preallocate", _T.BOOLEAN, "false", _NO_EFFECT),
    TopicConfig("remote.log.copy.disable", _T.BOOLEAN, "false", _NO_EFFECT),
    TopicConfig("remote.log.delete.on.disable", _T.BOOLEAN, "false", _NO_EFFECT),
    TopicConfig("remote.storage.enable", _T.BOOLEAN, "false", _NO_EFFECT),
    TopicConfig(
        "retention.bytes",
        _T.LONG,
        -1,
        "A partition's records beyond this many bytes are deleted, oldest first (-1: no limit).",
        True,
        minimum=-1,
        broker_synonym="log.retention.bytes",
    ),
    TopicConfig(
        "retention.ms",
        _T.LONG,
        604_800_000,
        "Records older than this are deleted (-1: no limit).",
        True,
        minimum=-1,
        broker_synonym="log.retention.ms",
    ),
    TopicConfig("segment.bytes", _T.INT, 1_073_741_824, _NO_EFFECT, minimum=1_048_576),
    TopicConfig("segment.index.bytes", _T.INT, 10_485_760, _NO_EFFECT, minimum=4),
    TopicConfig("segment.jitter.ms", _T.LONG, 0, _NO_EFFECT, minimum=0),
    TopicConfig("segment.ms", _T.LONG, 604_800_000, _NO_EFFECT, minimum=1),
    TopicConfig("unclean.leader.election.enable", _T.BOOLEAN, "false", _NO_EFFECT),
)

BY_NAME: Mapping[str, TopicConfig] = {c.name: c for c in TOPIC_CONFIGS}
assert len(BY_NAME) == len(TOPIC_CONFIGS), "a topic config is listed twice"


def _invalid(config: TopicConfig, value: Any, why: str) -> TxlogError:
    return TxlogError(ErrorCode.INVALID_CONFIG, f"Invalid value {_shown(value)} for configuration {config.name}: {why}")


def _shown(value: Any) -> str:
    """A given name or value as an error message shows it: as given when it is a string that can be
    sent (else as Python writes it: a lone surrogate cannot be encoded), at most 40 characters."""
    text = value if isinstance(value, str) and _utf8(value) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def config_of(name: Any) -> TopicConfig:
    """The table's entry for ``name``; INVALID_CONFIG for a name Kafka does not know."""
    config = BY_NAME.get(name) if isinstance(name, str) else None
    if config is None:
        raise TxlogError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {_shown(name)}")
    return config


def parse(config: TopicConfig, value: Any) -> int | float | str:
    """A given value (a wire string, or a JSON value over HTTP) as it is kept, checked as Kafka
    checks it, and refused where txlog cannot do what it asks."""
    kept: int | float | str
    if config.type in (_T.INT, _T.SHORT, _T.LONG):
        integer = isinstance(value, int) or (isinstance(value, str) and _INTEGER.fullmatch(value.strip()))
        bound = MAX_INT if config.type is _T.INT else MAX_LONG
        if isinstance(value, bool) or not integer or not -(bound + 1) <= int(value) <= bound:
            raise _invalid(config, value, f"Not a number of type {config.type.name}")
        kept = int(value)
    elif config.type is _T.DOUBLE:
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if isinstance(value, str) and _DOUBLE.fullmatch(value.strip()):
            number = float(value)
        if number is None or not math.isfinite(number):
            raise _invalid(config, value, "Not a number of type DOUBLE")
        kept = float(number)
    elif config.type is _T.BOOLEAN:
        text = value if isinstance(value, str) else ("true" if value is True else "false" if value is False else None)
        if text is None or text.strip().lower() not in ("true", "false"):
            raise _invalid(config, value, "Expected value to be either true or false")
        kept = text.strip().lower()
    else:
        if not isinstance(value, str):
            raise _invalid(config, value, f"Expected value to be a string, but it was a {type(value).__name__}")
        if "\x00" in value or not _utf8(value):
            raise _invalid(config, value, "A NUL character or a lone surrogate cannot be kept")
        kept = value.strip() if config.type is _T.LIST else value
    _check_bounds(config, value, kept)
    return kept


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_bounds(config: TopicConfig, given: Any, kept: int | float | str) -> None:
    if isinstance(kept, (int, float)):
        if config.minimum is not None and kept < config.minimum:
            raise _invalid(config, given, f"Value must be at least {config.minimum}")
        if config.maximum is not None and kept > config.maximum:
            raise _invalid(config, given, f"Value must be no more than {config.maximum}")
        return
    if not config.choices:
        return
    items = list_items(kept) if config.type is _T.LIST else [kept]
    for item in items:
        if item not in config.choices:
            allowed = ", ".join(config.choices)
            raise _invalid(config, given, f"{'Every item' if config.type is _T.LIST else 'String'} must be one of: {allowed}")
    if config.type is _T.LIST and not items:
        raise _invalid(config, given, "Empty list not allowed")
    refused = [item for item in items if config.supported is not None and item not in config.supported]
    if refused:
        raise _invalid(config, given, f"txlog supports only {' or '.join(config.supported or ())}, not {', '.join(refused)}")


def list_items(value: str) -> list[str]:
    """A LIST config's items, as Kafka splits them (comma-separated, spaces around each ignored)."""
    return [item.strip() for item in value.split(",") if item.strip()]


def validated(config: Mapping[Any, Any]) -> dict[str, int | float | str | None]:
    """A config as given at create or alter, each value as kept; a null value (alter only) stays
    null: the key is removed, so its default applies again."""
    return {config_of(name).name: None if value is None else parse(config_of(name), value) for name, value in config.items()}


def kept(config: Mapping[Any, Any]) -> dict[str, int | float | str]:
    """A new topic's config as it is kept: checked, the keys given as null left out."""
    return {k: v for k, v in validated(config).items() if v is not None}


def altered(current: Mapping[str, Any], changes: Mapping[Any, Any]) -> dict[str, Any]:
    """IncrementalAlterConfigs' SET and DELETE: set each key given, remove each key given as null."""
    merged = dict(current)
    for key, value in validated(changes).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def incremental(current: Mapping[str, Any], ops: list[tuple[Any, Operation, Any]]) -> dict[str, Any]:
    """IncrementalAlterConfigs: each (name, operation, value) in turn. APPEND and SUBTRACT are for
    LIST configs only (INVALID_CONFIG otherwise, as Kafka): an item appended once, every copy of an
    item subtracted, starting from the current value or the default."""
    merged = dict(current)
    names = [name for name, _, _ in ops]
    for name, op, value in ops:
        config = config_of(name)
        if names.count(name) > 1:
            raise TxlogError(ErrorCode.INVALID_CONFIG, f"Config {name} appears more than once in the request")
        if op is Operation.DELETE:
            merged.pop(config.name, None)
        elif op is Operation.SET:
            if value is None:
                raise TxlogError(ErrorCode.INVALID_CONFIG, f"Null value not supported for : {config.name}")
            merged[config.name] = parse(config, value)
        else:
            if config.type is not _T.LIST:
                raise TxlogError(ErrorCode.INVALID_CONFIG, f"Config value append is not allowed for config key: {config.name}")
            have = list_items(str(merged.get(config.name, config.default or "")))
            given = list_items(value or "")
            items = have + [i for i in given if i not in have] if op is Operation.APPEND else [i for i in have if i not in given]
            merged[config.name] = parse(config, ",".join(items))
    return merged


@dataclass(frozen=True)
class DescribedConfig:
    name: str
    value: str | None
    source: ConfigSource
    read_only: bool
    type: ConfigType
    doc: str
    synonyms: tuple[tuple[str, str | None, ConfigSource], ...]  # (name, value, source), most specific first


def shown(value: Any) -> str | None:
    """A kept value as Kafka shows it (a string; DOUBLE as Java prints it)."""
    if value is None:
        return None
    if isinstance(value, float):
        return repr(value)
    return str(value)


def describe(
    config: Mapping[str, Any],
    broker_set: Mapping[str, Any] = {},
    server_defaults: Mapping[str, Any] = {},  # noqa: B006
) -> list[DescribedConfig]:
    """Every topic config, in name order, with its value: the topic's own (DYNAMIC_TOPIC_CONFIG),
    else the broker config its default comes from where the server was given it
    (STATIC_BROKER_CONFIG, ``broker_set`` by broker config name), else the default
    (DEFAULT_CONFIG): the server's own where it has one (``server_defaults``, by broker config name:
    txlog keeps every record unless told otherwise), else Kafka's."""
    out = []
    for c in TOPIC_CONFIGS:
        synonyms: list[tuple[str, str | None, ConfigSource]] = []
        if c.name in config:
            synonyms.append((c.name, shown(config[c.name]), ConfigSource.DYNAMIC_TOPIC_CONFIG))
        if c.broker_synonym is not None and c.broker_synonym in broker_set:
            synonyms.append((c.broker_synonym, shown(broker_set[c.broker_synonym]), ConfigSource.STATIC_BROKER_CONFIG))
        default = server_defaults.get(c.broker_synonym, c.default) if c.broker_synonym is not None else c.default
        synonyms.append((c.broker_synonym or c.name, shown(default), ConfigSource.DEFAULT_CONFIG))
        _, value, source = synonyms[0]
        out.append(DescribedConfig(c.name, value, source, False, c.type, c.doc, tuple(synonyms)))
    return out
