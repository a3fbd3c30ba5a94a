"""Reading a confluent-kafka configuration dict: Kafka's property names and aliases, values given as
Python values or as strings (``"true"``, ``"5"``), librdkafka's messages for what it refuses."""

from __future__ import annotations

from typing import Any, Callable

from txlog.errors import KafkaError, KafkaException

INT32_MAX = 2**31 - 1  # Kafka's int32: the top of many properties' ranges, and of sequence numbers

# Properties that matter to a Kafka client talking to brokers over TCP and have no meaning over
# txlog's HTTP API: accepted, so existing configurations carry over, and not used.
IGNORED = frozenset(
    {
        "client.id",
        "debug",
        "log_level",
        "logger",
        "stats_cb",
        "throttle_cb",
        "statistics.interval.ms",
        "security.protocol",
        "api.version.request",
        "broker.address.family",
        "metadata.max.age.ms",
        "topic.metadata.refresh.interval.ms",
        "compression.type",
        "compression.codec",
        "partitioner",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "partition.assignment.strategy",
        "group.instance.id",
        "client.rack",
        "allow.auto.create.topics",
        "enable.ssl.certificate.verification",
        "check.crcs",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "sticky.partitioning.linger.ms",
        "enable.gapless.guarantee",
        "delivery.report.only.error",
    }
)
IGNORED_PREFIXES = ("ssl.", "sasl.", "socket.", "reconnect.", "connections.")


def invalid(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, message))


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "t", "1", "false", "f", "0"):
        return v.strip().lower() in ("true", "t", "1")
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise ValueError


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        return int(v.strip())
    raise ValueError


def _float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        return float(v.strip())
    raise ValueError


def _str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise ValueError


def _any(v: Any) -> Any:
    return v


KINDS: dict[str, Callable[[Any], Any]] = {"bool": _bool, "int": _int, "float": _float, "str": _str, "any": _any}


class Spec:
    """One property: its kind, default, allowed range or values."""

    def __init__(
        self,
        kind: str,
        default: Any = None,
        low: int | None = None,
        high: int | None = None,
        choices: tuple[str, ...] | None = None,
    ) -> None:
        self.kind, self.default, self.low, self.high, self.choices = kind, default, low, high, choices


def read(conf: dict | None, specs: dict[str, Spec], aliases: dict[str, str]) -> tuple[dict[str, Any], set[str]]:
    """The configuration's values by canonical name (defaults filled in) and the names given."""
    if conf is None:
        conf = {}
    if not isinstance(conf, dict):
        raise TypeError("expected configuration dict")
    values = {name: spec.default for name, spec in specs.items()}
    given: set[str] = set()
    for raw_name, raw in conf.items():
        name = aliases.get(raw_name, raw_name)
        spec = specs.get(name)
        if spec is None:
            if name in IGNORED or name.startswith(IGNORED_PREFIXES):
                continue
            raise invalid(f'No such configuration property: "{raw_name}"')
        if raw is None:  # as if not given: the default
            continue
        try:
            value = KINDS[spec.kind](raw)
        except (ValueError, TypeError):
            raise invalid(f'Invalid value "{raw}" for configuration property "{raw_name}"') from None
        if spec.choices is not None:
            value = str(value).lower()
            if value not in spec.choices:
                raise invalid(f'Invalid value "{raw}" for configuration property "{raw_name}"')
        if (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high):
            raise invalid(f'Configuration property "{raw_name}" value {value} is outside allowed range {spec.low}..{spec.high}')
        values[name] = value
        given.add(name)
    return values, given
