"""Kafka's client quotas: DescribeClientQuotas and AlterClientQuotas over the database, and the
``QuotaManager`` each server process (a gateway, an HTTP worker) asks on Produce and Fetch.

The budget is the cluster's, not a process's: every process adds what it recorded to
``client_quota_usage`` (per budget, quota key and window) every ``FLUSH_INTERVAL_S`` and reads the
sums of all processes back in the same statement, so the rate a request is measured against is the
total, at most one flush interval old plus this process's own counts since. Only budgets that have a
quota are recorded: without any quota configured a request costs one attribute check, and a
principal without one a dictionary look-up.

The quota values are a snapshot too, reloaded when ``security_version`` (raised by every change,
as for principals and ACLs) moved: a change applies everywhere within a poll interval.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from app.domain.acl_bindings import ANONYMOUS
from app.domain.quotas import (
    REQUEST_PERCENTAGE,
    Applied,
    Entity,
    FilterComponent,
    QuotaError,
    QuotaWindow,
    UsageKey,
    applicable,
    entity_of,
    entity_path,
    matches,
    validate_filter,
    validate_value,
)
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import quotas as sql
from app.storage import security as security_sql
from app.storage.db import Database

log = logging.getLogger("txlog.quotas")

FLUSH_INTERVAL_S = 0.2
# A budget spending fast is flushed sooner: once this process recorded this part of a window's quota
# since its last flush, but not more often than every EARLY_FLUSH_MIN_S. Otherwise processes would
# learn of each other's bursts a whole interval late, and the burst's excess is forgiven once its
# window is no longer counted.
EARLY_FLUSH_FRACTION = 0.05
EARLY_FLUSH_MIN_S = 0.02


def _error(exc: QuotaError) -> TxlogError:
    return TxlogError(ErrorCode[exc.code], exc.message)


# --- DescribeClientQuotas / AlterClientQuotas --------------------------------------------------------


def describe_quotas(db: Database, components: Sequence[FilterComponent], strict: bool) -> list[tuple[Entity, dict[str, float]]]:
    """Kafka's DescribeClientQuotas: the entities the filter selects, with their values."""
    try:
        validate_filter(components)
    except QuotaError as exc:
        raise _error(exc) from None
    with db.read() as conn:
        configs = sql.quota_list(conn)
    return sorted(((e, v) for e, v in configs.items() if matches(e, components, strict)), key=lambda item: entity_path(item[0]))


@dataclass(frozen=True)
class QuotaOp:
    key: str
    value: float
    remove: bool = False


@dataclass(frozen=True)
class QuotaAlteration:
    entity: Sequence[tuple[str, str | None]]  # (type, name or None: the default) as the request gave them
    ops: Sequence[QuotaOp] = field(default_factory=tuple)


def _validated(alteration: QuotaAlteration) -> Entity:
    entity = entity_of(alteration.entity)
    for op in alteration.ops:
        if not op.remove:
            validate_value(entity, op.key, op.value)
    return entity


def alter_quotas(db: Database, alterations: Sequence[QuotaAlteration], validate_only: bool = False) -> list[TxlogError | None]:
    """Kafka's AlterClientQuotas: each entry's error, or None where it was applied (or, with
    ``validate_only``, would be). An entry in error changes nothing; the others are applied together."""
    results: list[TxlogError | None] = []
    valid: list[tuple[Entity, QuotaAlteration]] = []
    for alteration in alterations:
        try:
            valid.append((_validated(alteration), alteration))
            results.append(None)
        except QuotaError as exc:
            results.append(_error(exc))
    if validate_only or not valid:
        return results
    with db.transaction() as conn:
        changed = False
        for entity, alteration in valid:
            for op in alteration.ops:
                if op.remove:
                    changed = sql.quota_remove(conn, entity, op.key) or changed
                else:
                    changed = sql.quota_put(conn, entity, op.key, op.value) or changed
        if changed:
            security_sql.security_version_bump(conn)
    return results


# --- the per-process manager ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    version: int | None
    configs: dict[Entity, dict[str, float]]


class QuotaManager:
    """What a request spends of its quotas and how long its answer throttles the client."""

    def __init__(
        self,
        db: Database,
        window: QuotaWindow | None = None,
        interval_s: float = FLUSH_INTERVAL_S,
        clock: Callable[[], float] = time.time,
        sync_clock: Callable[[], object] | None = None,
    ) -> None:
        self.db = db
        self.window = window or QuotaWindow()
        self.interval_s = interval_s
        self.clock = clock  # seconds: numbers the windows
        self.sync_clock = sync_clock  # called by the flush thread, which may wait on the database
        # False while no quota is configured anywhere: the only check a request then costs.
        self.enabled = False
        self._snapshot = _Snapshot(None, {})
        self._applied: dict[tuple[str, str, str], Applied | None] = {}
        self._lock = threading.Lock()
        self._pending: dict[UsageKey, dict[int, float]] = {}  # recorded here, not yet flushed
        self._inflight: dict[UsageKey, dict[int, float]] = {}  # being flushed
        self._totals: dict[UsageKey, dict[int, float]] = {}  # every process's, as of the last flush
        self._watched: dict[UsageKey, int] = {}  # budget -> the last window it was recorded in here
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="txlog-quotas", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        failing = False
        while True:
            try:
                if self.sync_clock is not None:
                    self.sync_clock()
                self.refresh()
                self.flush()
                failing = False
            except Exception:  # the database away: keep the last snapshot and counts, try again
                if not failing:  # once per outage, not every interval
                    log.warning("could not reload client quotas or record their usage", exc_info=True)
                failing = True
            if self._stop.wait(EARLY_FLUSH_MIN_S):
                return
            self._wake.wait(self.interval_s - EARLY_FLUSH_MIN_S)
            self._wake.clear()
            if self._stop.is_set():
                return

    # the quota values

    def refresh(self) -> bool:
        """Reload the quota values if ``security_version`` moved; True if it did."""
        with self.db.read() as conn:
            version = security_sql.security_version_get(conn)
            if version == self._snapshot.version:
                return False
            configs = sql.quota_list(conn)
        self._snapshot = _Snapshot(version, configs)
        self._applied = {}
        self.enabled = bool(configs)
        return True

    def applied(self, user: str | None, client_id: str | None, key: str) -> Applied | None:
        """The quota on ``key`` that applies to ``user`` (None: Kafka's anonymous user) with ``client_id``."""
        cache_key = (user or ANONYMOUS, client_id or "", key)
        try:
            return self._applied[cache_key]
        except KeyError:
            found = applicable(self._snapshot.configs, cache_key[0], cache_key[1], key)
            if len(self._applied) > 100_000:
                self._applied = {}
            self._applied[cache_key] = found
            return found

    # recording

    def record(self, user: str | None, client_id: str | None, key: str, amount: float) -> int:
        """Record ``amount`` against the quota on ``key`` that applies, if any; the throttle time
        (ms) the request is answered with: 0 while the rate is within the quota."""
        if not self.enabled:
            return 0
        applied = self.applied(user, client_id, key)
        if applied is None:
            return 0
        now_ms = self.clock() * 1000.0
        window = self.window.index(now_ms)
        with self._lock:
            pending = self._pending.setdefault(applied.usage, {})
            pending[window] = pending.get(window, 0.0) + amount
            self._watched[applied.usage] = window
            samples = self._samples(applied.usage)
            if pending[window] > applied.limit * self.window.size_s * EARLY_FLUSH_FRACTION:
                self._wake.set()
        return self.window.throttle_ms(samples, now_ms, applied.limit, capped=key == REQUEST_PERCENTAGE)

    def unrecord(self, user: str | None, client_id: str | None, key: str, amount: float) -> None:
        """Take back what ``record`` counted for an answer that is not sent (a throttled Fetch is
        answered empty, as Kafka does)."""
        if self.enabled and self.applied(user, client_id, key) is not None:
            self.record(user, client_id, key, -amount)

    def throttle_ms(self, user: str | None, client_id: str | None, key: str) -> int:
        """The throttle time of the rate as it stands, without recording anything."""
        return self.record(user, client_id, key, 0.0)

    def max_value(self, user: str | None, client_id: str | None, key: str) -> float | None:
        """The most a single request may take of ``key`` without being throttled for sure, or None
        (no quota)."""
        if not self.enabled:
            return None
        applied = self.applied(user, client_id, key)
        return None if applied is None else self.window.max_value(applied.limit)

    def _samples(self, usage: UsageKey) -> dict[int, float]:
        samples = dict(self._totals.get(usage, ()))
        for part in (self._inflight.get(usage), self._pending.get(usage)):
            for w, amount in (part or {}).items():
                samples[w] = samples.get(w, 0.0) + amount
        return samples

    def flush(self) -> None:
        """Add this process's counts to the table and read every process's sums back."""
        now_ms = self.clock() * 1000.0
        oldest = self.window.oldest_kept(now_ms)
        with self._lock:
            for usage, last in list(self._watched.items()):
                if last < oldest:
                    del self._watched[usage]
                    self._totals.pop(usage, None)
            if not self._watched and not self._pending:
                return
            self._inflight, self._pending = self._pending, {}
            counts = [
                (usage, w, amount) for usage, windows in self._inflight.items() for w, amount in windows.items() if w >= oldest
            ]
            watched = sorted(self._watched)
        try:
            with self.db.autocommit() as conn:
                totals = sql.usage_flush(conn, counts, watched, oldest)
        except BaseException:
            with self._lock:  # counted again at the next flush
                for usage, windows in self._inflight.items():
                    pending = self._pending.setdefault(usage, {})
                    for w, amount in windows.items():
                        pending[w] = pending.get(w, 0.0) + amount
                self._inflight = {}
            raise
        with self._lock:
            self._totals = totals
            self._inflight = {}


class DatabaseSeconds:
    """The database's clock in seconds, as the quota windows are numbered: every process on every
    host numbers a window alike, whatever its own clock says. Never waits (requests call it on the
    event loop): while the database clock's next reading is due, it carries its last answer
    forward with this process's monotonic clock; ``sync`` (the flush thread) takes the reading."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._base: tuple[int, float] | None = None  # the database's ms at a monotonic time

    def __call__(self) -> float:
        ms, mono = self.broker.now_without_waiting(), time.monotonic()
        if ms is not None:
            self._base = (ms, mono)
            return ms / 1000.0
        if self._base is None:  # no reading yet (the database away since the start)
            return time.time()
        base_ms, base_mono = self._base
        return base_ms / 1000.0 + (mono - base_mono)

    def sync(self) -> None:
        self.broker.now()


def manager_from_settings(broker: Broker) -> QuotaManager:
    """A process's manager with the settings' quota.window.num and quota.window.size.seconds, its
    windows numbered by the database's clock."""
    settings = broker.settings
    clock = DatabaseSeconds(broker)
    return QuotaManager(
        broker.db, QuotaWindow(settings.quota_window_num, settings.quota_window_size_seconds), clock=clock, sync_clock=clock.sync
    )
