"""A share group's configs (Kafka's GROUP config resource, its share.* keys, KIP-932): read, altered
key by key (IncrementalAlterConfigs) or replaced whole (AlterConfigs), each value validated by
``app.domain.share_configs`` as Kafka validates it. They take effect at each share partition's next
operation (``app.services.share`` reads them with the partition's state).
"""

from __future__ import annotations

from typing import Mapping

from app.domain.share_configs import ShareConfigs, config_of, validated
from app.services import Broker
from app.storage import share as share_store


def group_config(broker: Broker, group_id: str) -> ShareConfigs:
    """The share group's configs, defaults where none is set."""
    with broker.db.read() as conn:
        return config_of(share_store.share_group_configs(conn, group_id))


def group_configs_set(broker: Broker, group_id: str) -> dict[str, str]:
    """The configs the group has set (DescribeConfigs shows the rest as defaults)."""
    with broker.db.read() as conn:
        return share_store.share_group_configs(conn, group_id)


def alter_group_configs(broker: Broker, group_id: str, changes: Mapping[str, str | None]) -> dict[str, str]:
    """IncrementalAlterConfigs of a GROUP resource's share.* keys: each value set (validated as
    Kafka validates it: INVALID_CONFIG, the lock duration's lower bound the broker's
    TXLOG_SHARE_MIN_RECORD_LOCK_DURATION_MS), each None removed. The configs set afterwards. They take
    effect at each share partition's next operation."""
    low = broker.settings.share_min_record_lock_duration_ms
    checked = {
        name: None if value is None else validated(name, value, min_record_lock_duration_ms=low)
        for name, value in changes.items()
    }
    with broker.db.transaction() as conn:
        share_store.share_group_configs_alter(conn, group_id, checked)
        return share_store.share_group_configs(conn, group_id)


def replace_group_configs(
    broker: Broker, group_id: str, configs: Mapping[str, str], validate_only: bool = False
) -> dict[str, str]:
    """AlterConfigs (the whole-set call) of a GROUP resource: the group's share.* configs become
    exactly ``configs`` (each validated as Kafka validates it: INVALID_CONFIG, nothing changed),
    every one not given back to its default. The configs set afterwards (with ``validate_only``,
    those it would set)."""
    checked = {name: validated(name, value) for name, value in configs.items()}
    if validate_only:
        return checked
    with broker.db.transaction() as conn:
        dropped = {name: None for name in share_store.share_group_configs(conn, group_id) if name not in checked}
        share_store.share_group_configs_alter(conn, group_id, {**checked, **dropped})
        return share_store.share_group_configs(conn, group_id)
