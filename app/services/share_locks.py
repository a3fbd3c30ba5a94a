"""Share groups' locks given back (KIP-932): a member that left or whose share session ended
(``release_member``), and the lock timer the sweeper runs (``expire_due``). Records go back to
Available, or are archived at the delivery-count limit, by the domain's rules
(``app.domain.share_partition.expire``, ``release_member``); each share partition in a database
transaction of its own, under its row lock, as ``app.services.share`` changes it.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from sqlalchemy.engine import Connection

from app.domain import share_partition as sp
from app.domain.share_configs import ShareConfigs
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.services.share_configs import group_config
from app.storage import share as share_store

log = logging.getLogger("txlog.share")


def _release(
    conn: Connection,
    group_id: str,
    topic: str,
    partition: int,
    change: Callable[[sp.SharePartitionState], sp.Release],
    skip_locked: bool = False,
) -> sp.Release | None:
    """``change`` (the lock timer, a member leaving) applied to the share partition under its row
    lock, persisted if it gave records back; None if there is no such share partition (or, with
    ``skip_locked``, another transaction holds it)."""
    found = share_store.share_partition_lock(conn, group_id, topic, partition, skip_locked=skip_locked)
    if found is None:
        return None
    stored = found[0]
    released: sp.Release = change(stored)
    if released.changed:
        share_store.share_partition_write(
            conn, group_id, topic, partition, stored, released.state, records_available=bool(released.released)
        )
    return released


def release_member(broker: Broker, group_id: str, member_id: str, partitions: Sequence[tuple[str, int]] | None = None) -> int:
    """A member left the share group or its session ended: every record it holds (on
    ``partitions``, or wherever it holds one) is available again now, or archived if that was its
    last delivery. How many records were given back."""
    config = group_config(broker, group_id)
    if partitions is None:
        with broker.db.read() as conn:
            partitions = share_store.share_partitions_held_by(conn, group_id, member_id)
    given_back = 0
    for topic, partition in partitions:
        with broker.db.transaction() as conn:
            change = functools.partial(sp.release_member, member_id=member_id, now_ms=broker.now(), config=config.delivery)
            released = _release(conn, group_id, topic, partition, change)
        if released is not None:
            given_back += sp.record_count(released.released) + sp.record_count(released.archived)
    return given_back


@dataclass
class ExpiryReport:
    partitions: int = 0  # share partitions whose expired locks were given back
    released: int = 0  # records available again
    archived: int = 0  # records archived at the delivery-count limit
    failed: int = 0
    more_due: bool = False


def expire_due(broker: Broker, limit: int = 100, budget_s: float = 60.0) -> ExpiryReport:
    """The lock timer, for the sweeper: share partitions holding locks expired by now (the
    database's clock), earliest first, at most ``limit`` a round; each in its own database
    transaction, its row lock taken with SKIP LOCKED (one being served is expired by the operation
    serving it, which gives expired locks back first). Expired records go back to Available, or
    are archived at the delivery-count limit; fetches waiting on the partition are woken."""
    report = ExpiryReport()
    deadline = time.monotonic() + budget_s
    with broker.db.read() as conn:
        due = share_store.share_partitions_with_expired_locks(conn, broker.now(), limit)
    configs: dict[str, ShareConfigs] = {}
    for group_id, topic, partition in due:
        if time.monotonic() >= deadline:
            report.more_due = True
            break
        try:
            config = configs.get(group_id) or configs.setdefault(group_id, group_config(broker, group_id))
            with broker.db.transaction() as conn:
                change = functools.partial(sp.expire, now_ms=broker.now(), config=config.delivery)
                released = _release(conn, group_id, topic, partition, change, skip_locked=True)
        except TxlogError as exc:
            if exc.code is ErrorCode.UNKNOWN_SERVER_ERROR:
                raise
            report.failed += 1
            log.warning("could not expire the locks of share group %r on %s-%s: %s", group_id, topic, partition, exc)
            continue
        if released is not None and released.changed:
            report.partitions += 1
            report.released += sp.record_count(released.released)
            report.archived += sp.record_count(released.archived)
    if len(due) >= limit:
        report.more_due = True
    return report
