"""The groups of transaction states are defined once, in app.domain.transactions; the SQL that names
them is built from there. The migrations are history and keep their own literal copies of the
partial indexes' predicates: these tests hold those copies equal to the domain's groups (as the
migrated schema is held equal to app.storage.tables by tests/migration)."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest

from app.domain.transactions import ENDED_STATES, OPEN_STATE_NAMES, OPEN_STATES, PREPARED_STATES, STATE_NAMES, TxnState
from app.storage import _sql, tables


def test_the_groups_are_kafkas():
    assert {s.value for s in OPEN_STATES} == {"Ongoing", "PrepareCommit", "PrepareAbort"}
    assert {s.value for s in PREPARED_STATES} == {"PrepareCommit", "PrepareAbort"}
    assert {s.value for s in ENDED_STATES} == {"Empty", "CompleteCommit", "CompleteAbort"}
    for s in TxnState:
        assert s.is_open == (s in OPEN_STATES)
        assert s.is_prepared == (s in PREPARED_STATES)
        assert s.expiration_allowed == (s in ENDED_STATES)
        assert s.is_open != (s in ENDED_STATES or s is TxnState.DEAD)
    assert STATE_NAMES == ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead")
    assert OPEN_STATE_NAMES == ("Ongoing", "PrepareCommit", "PrepareAbort")


def _names(sql: str) -> set[str]:
    return set(re.findall(r"'(\w+)'", sql))


def test_the_sql_lists_are_built_from_the_groups():
    assert _sql.OPEN_STATES_SQL == "('Ongoing', 'PrepareCommit', 'PrepareAbort')"
    assert _names(_sql.OPEN_STATES_SQL) == {s.value for s in OPEN_STATES}
    assert _names(_sql.PREPARED_STATES_SQL) == {s.value for s in PREPARED_STATES}
    assert _names(_sql.IDLE_STATES_SQL) == {s.value for s in TxnState} - {s.value for s in OPEN_STATES}
    assert _names(_sql.ONGOING_SQL) == {TxnState.ONGOING.value}


# Each partial index of txlog.transactions: the states its predicate names.
INDEXED_STATES = {
    "transactions_deadline": frozenset({TxnState.ONGOING}),
    "transactions_prepared": PREPARED_STATES,
    "transactions_idle": frozenset(TxnState) - OPEN_STATES,
    "transactions_open_by_principal": OPEN_STATES,
}


class _RecordingOp:
    """Stands in for alembic's ``op`` while a migration's ``upgrade`` runs: records the indexes it
    creates, ignores everything else."""

    def __init__(self) -> None:
        self.indexes: dict[str, str | None] = {}

    def create_index(self, name: str, *args: Any, postgresql_where: Any = None, **kwargs: Any) -> None:
        self.indexes[name] = None if postgresql_where is None else str(postgresql_where)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _migration_predicates(monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for revision in ("migrations.versions.0001_initial_schema", "migrations.versions.0006_limits"):
        module = importlib.import_module(revision)
        op = _RecordingOp()
        monkeypatch.setattr(module, "op", op)
        module.upgrade()
        found.update(op.indexes)
    return found


@pytest.mark.parametrize("index", sorted(INDEXED_STATES))
def test_the_migrations_literal_predicates_name_the_domains_groups(monkeypatch, index):  # type: ignore[no-untyped-def]
    migrated = _migration_predicates(monkeypatch)[index]
    assert migrated is not None
    assert _names(migrated) == {s.value for s in INDEXED_STATES[index]}
    declared = {i.name: str(i.dialect_options["postgresql"]["where"]) for i in tables.transactions.indexes}
    assert migrated == declared[index]
