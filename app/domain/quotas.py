"""Kafka's client quotas: the entities a quota is set on, which one applies to a request, the
config keys and their validation, and the throttle time a violation costs.

- An entity is a map of entity type to name: ``user`` and/or ``client-id``, each named or the
  default (``None``), or ``ip`` alone. Kafka's precedence, first match wins, per config key:
  /users/<user>/clients/<client-id>, /users/<user>/clients/<default>, /users/<user>,
  /users/<default>/clients/<client-id>, /users/<default>/clients/<default>, /users/<default>,
  /clients/<client-id>, /clients/<default>.
- The budget of a matched entity is shared by the requests that entity's *named* parts name: a
  default part gives each user (or client id) a budget of its own. So the usage key (Kafka's metric
  tags) is the request's user where the entity has a user part, and its client id where the entity
  has a client-id part, else ``""``.
- A rate is measured as Kafka's ``Rate`` over a ``SampledStat``: ``quota.window.num`` windows of
  ``quota.window.size.seconds``; the samples still inside the last ``num × size`` are summed and
  divided by the time since the oldest one began, never less than ``num − 1`` whole windows (so a
  short history does not read as a burst). A request that takes the rate over the quota is answered
  with ``throttle_time_ms = (rate − quota) / quota × window``: the time after which the average is
  back at the quota. Kafka caps the request-time quota's throttle at one window, not the byte rates'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Iterable, Mapping

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONNECTION_CREATION_RATE = "connection_creation_rate"

# Kafka's types for the user and client-id quota keys: LONG keys must be whole numbers.
_LONG, _DOUBLE = "LONG", "DOUBLE"
USER_CLIENT_KEYS: Mapping[str, str] = {PRODUCER_BYTE_RATE: _LONG, CONSUMER_BYTE_RATE: _LONG, REQUEST_PERCENTAGE: _DOUBLE}
ENFORCED_KEYS = tuple(USER_CLIENT_KEYS)
_LONG_MAX = float(2**63 - 1)

# quota.window.num and quota.window.size.seconds, Kafka's defaults.
WINDOW_NUM = 11
WINDOW_SIZE_S = 1


class MatchType(IntEnum):
    """DescribeClientQuotas' match types."""

    EXACT = 0  # the entity of that name
    DEFAULT = 1  # the default entity
    ANY = 2  # any entity of that type, named or default


Entity = tuple[tuple[str, "str | None"], ...]  # (type, name or None for the default), sorted by type


class QuotaError(ValueError):
    """An entity, filter or value Kafka refuses: ``code`` is Kafka's error name, ``message`` its words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> QuotaError:
    return QuotaError("INVALID_REQUEST", message)


def entity_of(parts: Iterable[tuple[str, str | None]]) -> Entity:
    """An entity from (type, name) pairs, validated as Kafka's controller does."""
    seen: dict[str, str | None] = {}
    for entity_type, name in parts:
        if entity_type in seen:
            raise _invalid(f"Invalid client quota entity, duplicate entity entry {entity_type}")
        if entity_type not in ENTITY_TYPES:
            raise _invalid(f"Unhandled client quota entity type: {entity_type}")
        seen[entity_type] = name
        if name is not None and not name:
            raise _invalid(f"Empty {entity_type} not supported")
    if not seen:
        raise _invalid("Invalid empty client quota entity")
    if IP in seen and len(seen) > 1:
        raise _invalid("Invalid quota entity combination, IP entity should not be combined with User or ClientId")
    return tuple(sorted(seen.items()))


def entity_path(entity: Entity) -> str:
    """The entity as Kafka's config paths write it: ``/users/alice/clients/<default>``."""
    names = dict(entity)
    path = ""
    for entity_type, segment in ((USER, "users"), (IP, "ips"), (CLIENT_ID, "clients")):
        if entity_type in names:
            name = names[entity_type]
            path += f"/{segment}/{'<default>' if name is None else name}"
    return path


def validate_value(entity: Entity, key: str, value: float) -> None:
    """Raise Kafka's error for setting ``key`` to ``value`` on ``entity``."""
    if any(t == IP for t, _ in entity):
        raise QuotaError("INVALID_REQUEST", f"Quotas on ip entities ({CONNECTION_CREATION_RATE}) are not supported")
    kind = USER_CLIENT_KEYS.get(key)
    if kind is None:
        raise _invalid(f"Invalid configuration key {key}")
    if not value > 0.0:  # NaN too
        raise _invalid(f"Quota {key} must be greater than 0")
    if kind == _LONG:
        if value > _LONG_MAX:
            raise _invalid(f"Proposed value for {key} is too large for a LONG.")
        if math.isinf(value) or abs(math.fmod(value, 1.0)) > 1e-6:
            raise _invalid(f"{key} cannot be a fractional value.")


# --- which entity applies ---------------------------------------------------------------------------


def precedence(user: str, client_id: str) -> tuple[Entity, ...]:
    """The eight entities that may apply to a request of ``user`` with ``client_id``, first wins."""
    return (
        ((CLIENT_ID, client_id), (USER, user)),
        ((CLIENT_ID, None), (USER, user)),
        ((USER, user),),
        ((CLIENT_ID, client_id), (USER, None)),
        ((CLIENT_ID, None), (USER, None)),
        ((USER, None),),
        ((CLIENT_ID, client_id),),
        ((CLIENT_ID, None),),
    )


UsageKey = tuple[str, str, str]  # (user tag, client-id tag, quota key): whose budget a request spends


@dataclass(frozen=True)
class Applied:
    """The quota that applies to a request for one key, and whose budget it spends."""

    entity: Entity
    limit: float
    usage: UsageKey


def applicable(configs: Mapping[Entity, Mapping[str, float]], user: str, client_id: str, key: str) -> Applied | None:
    """The first entity in Kafka's precedence with a value for ``key``, or None: no quota."""
    for entity in precedence(user, client_id):
        limit = configs.get(entity, {}).get(key)
        if limit is not None:
            types = dict(entity)
            usage = (user if USER in types else "", client_id if CLIENT_ID in types else "", key)
            return Applied(entity, limit, usage)
    return None


# --- DescribeClientQuotas' filter ------------------------------------------------------------------


@dataclass(frozen=True)
class FilterComponent:
    entity_type: str
    match_type: int
    match: str | None


def validate_filter(components: Iterable[FilterComponent]) -> None:
    """Raise Kafka's error for a filter it refuses."""
    seen: set[str] = set()
    for c in components:
        if not c.entity_type:
            raise _invalid("Invalid empty entity type.")
        if c.entity_type in seen:
            raise _invalid(f"Entity type {c.entity_type} cannot appear more than once in the filter.")
        seen.add(c.entity_type)
        if c.entity_type not in ENTITY_TYPES:
            raise QuotaError("UNSUPPORTED_VERSION", f"Unsupported entity type {c.entity_type}")
        if c.match_type not in tuple(MatchType):
            raise _invalid(f"Unexpected match type: {c.match_type}")
        if c.match_type == MatchType.EXACT and c.match is None:
            raise _invalid("Unexpected null match string for exact match type")
        if c.match_type != MatchType.EXACT and c.match is not None:
            raise _invalid(f"Unexpected match string for {MatchType(c.match_type).name.lower()} match type")
    if IP in seen and (USER in seen or CLIENT_ID in seen):
        raise _invalid(
            "Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component."
        )


def matches(entity: Entity, components: Iterable[FilterComponent], strict: bool) -> bool:
    """Whether ``entity`` is one the filter selects: every component matches, and with ``strict``
    the entity has no other types."""
    names = dict(entity)
    wanted = list(components)
    if strict and len(names) != len(wanted):
        return False
    for c in wanted:
        if c.entity_type not in names:
            return False
        if c.match_type == MatchType.EXACT and names[c.entity_type] != c.match:
            return False
        if c.match_type == MatchType.DEFAULT and names[c.entity_type] is not None:
            return False
    return True


# --- rates and throttle time -----------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaWindow:
    """quota.window.num and quota.window.size.seconds."""

    num: int = WINDOW_NUM
    size_s: int = WINDOW_SIZE_S

    @property
    def size_ms(self) -> int:
        return self.size_s * 1000

    def index(self, now_ms: float) -> int:
        """The window ``now_ms`` falls in (windows are aligned on the epoch, the same in every process)."""
        return int(now_ms // self.size_ms)

    def oldest_kept(self, now_ms: float) -> int:
        """The oldest window still inside the last ``num × size``."""
        return self.index(now_ms) - self.num + 1

    def measured_ms(self, oldest_index: int, now_ms: float) -> float:
        """Kafka's ``Rate.windowSize``: the time since the oldest sample began, at least ``num − 1``
        whole windows plus the current one's elapsed part, and at least 1 ms."""
        elapsed = now_ms - oldest_index * self.size_ms
        full = int(elapsed // self.size_ms)
        if full < self.num - 1:
            elapsed += (self.num - 1 - full) * self.size_ms
        return max(elapsed, 1.0)

    def rate(self, samples: Mapping[int, float], now_ms: float) -> float:
        """The rate per second of ``samples`` (window index -> amount) at ``now_ms``."""
        oldest = self.oldest_kept(now_ms)
        kept = {w: v for w, v in samples.items() if w >= oldest}
        if not kept:
            return 0.0
        return sum(kept.values()) / (self.measured_ms(min(kept), now_ms) / 1000.0)

    def throttle_ms(self, samples: Mapping[int, float], now_ms: float, limit: float, capped: bool = False) -> int:
        """Kafka's throttle time for a rate measured over ``samples`` against ``limit`` (0 within
        it); ``capped``: at most one window, as Kafka caps the request-time quota's."""
        oldest = self.oldest_kept(now_ms)
        kept = {w: v for w, v in samples.items() if w >= oldest}
        if not kept:
            return 0
        measured = self.measured_ms(min(kept), now_ms)
        observed = sum(kept.values()) / (measured / 1000.0)
        if observed <= limit:
            return 0
        throttle = round((observed - limit) / limit * measured)
        return min(throttle, self.size_ms) if capped else throttle

    def max_value(self, limit: float) -> float:
        """Kafka's ``getMaxValueInQuotaWindow``: the most one request may take without being
        throttled for sure (what caps a throttled principal's Fetch)."""
        return limit * (self.num - 1) * self.size_s


def request_percentage(handler_seconds: float) -> float:
    """A request's handler time as Kafka records it against request_percentage: percent of one
    handler thread, per second of the window."""
    return handler_seconds * 100.0
