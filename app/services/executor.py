"""Where an operation's steps run: the one place that decides.

An operation that can be planned ahead (a produce, AddPartitionsToTxn, EndTxn) is defined once, as
a generator of the time it runs at (``now``): it yields its steps, is sent each step's outcome,
and returns its answer. It never touches a connection or a thread, so every way in runs the same
definition. The steps:

- ``Statement`` (``app.storage.statements``): one statement in autocommit, planned ahead against
  what this process remembers (``last_appends``); the database decides whether it still holds.
- ``Together``: such a statement for one item that may share the statement with other callers'
  items (the group commit of appends planned ahead): one statement, one commit, one WAL flush.
- ``Blocking``: work that waits on locks in a database transaction of its own (the locked path,
  SQLAlchemy) — whatever the statements planned ahead did not take.

Two drivers run them. ``run`` blocks (a worker thread, the command line, Spark's driver, a test):
statements on a pooled connection, shared statements through a thread group commit, blocking work
in place. ``LoopExecutor.run`` is awaited on an event loop (an HTTP worker, the Kafka gateway):
statements on the loop's own connections (in a worker thread when none is free), shared statements
through the loop's group commit, blocking work in a worker thread; and an operation whose time
cannot be told without asking the database (``Broker.now_without_waiting``) runs whole in a worker
thread. A step that fails is thrown into the operation at its ``yield``, so what it does on failure
(forget what it planned against) is its own, whoever drives it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generator, Generic, Hashable, Sequence, TypeVar

from app.services import Broker
from app.services.group_commit import GroupCommit, LoopGroupCommit, Pending
from app.storage.db import LoopConnections, driver
from app.storage.statements import Statement, execute, execute_async

T = TypeVar("T")
R = TypeVar("R")
I = TypeVar("I")  # noqa: E741 - an item of a group


@dataclass(frozen=True, slots=True)
class Blocking(Generic[R]):
    """Work that blocks (a database transaction under locks): in place, or in a worker thread."""

    fn: Callable[[], R]


@dataclass(frozen=True, slots=True)
class Together(Generic[I, R]):
    """``item``'s statement, which may be shared with other items of the same ``statement_of`` and
    distinct ``key`` (one per partition): ``statement_of(items)`` is the one statement for them,
    reading each item's outcome in order."""

    item: I
    key: Hashable
    statement_of: Callable[[Sequence[I]], Statement[list[R | None]]]


Step = Statement[Any] | Together[Any, Any] | Blocking[Any]
Operation = Generator[Step, Any, T]


def run(broker: Broker, operation: Callable[[int], Operation[T]]) -> T:
    """Run ``operation`` blocking, at the time ``broker`` tells."""
    op = operation(broker.now())
    outcome: Any = None
    failed: BaseException | None = None
    while True:
        done, step = _advance(op, outcome, failed)
        if done:
            return step  # the operation's result
        try:
            outcome, failed = _step(broker, step), None
        except BaseException as exc:  # noqa: BLE001 - the operation hears of it at its yield
            outcome, failed = None, exc


def _advance(op: Operation[T], outcome: Any, failed: BaseException | None) -> tuple[bool, Any]:
    """The operation's next step, sent the last one's outcome (or thrown its failure): ``(False,
    step)``, or ``(True, result)`` once it returns."""
    try:
        return False, (op.send(outcome) if failed is None else op.throw(failed))
    except StopIteration as done:
        return True, done.value


def _step(broker: Broker, step: Step) -> Any:
    if isinstance(step, Statement):
        return _in_thread(broker, step)
    if isinstance(step, Together):
        if broker.settings.produce_group_commit_batches <= 1:
            return _in_thread(broker, step.statement_of([step.item]))[0]
        return _thread_group(broker, step.statement_of).submit(step.item, step.key)
    return step.fn()


def _in_thread(broker: Broker, statement: Statement[R]) -> R:
    with broker.db.autocommit() as conn:
        return execute(driver(conn), statement)


def _thread_group(broker: Broker, statement_of: Callable[..., Statement[Any]]) -> GroupCommit[Any, Any]:
    """The threads' group commit of ``statement_of``'s statements."""
    groups = broker.extensions.setdefault("together", {})
    group = groups.get(statement_of)
    if group is None:
        run = functools.partial(_statement_for_group, functools.partial(_in_thread, broker), statement_of)
        group = groups.setdefault(statement_of, GroupCommit(run, max_items=broker.settings.produce_group_commit_batches))
    return group


def _statement_for_group(
    execute_: Callable[[Statement[Any]], Any], statement_of: Callable[..., Statement[Any]], group: Sequence[Pending[Any, Any]]
) -> Any:
    """One statement for the group (distinct keys); each item's outcome from its reading. A
    failure, which may have committed, is each caller's."""
    outcomes = execute_(statement_of([p.item for p in group]))
    for p, outcome in zip(group, outcomes):
        p.resolve(outcome)


async def _awaited_for_group(
    execute_: Callable[[Statement[Any]], Awaitable[Any]],
    statement_of: Callable[..., Statement[Any]],
    group: Sequence[Pending[Any, Any]],
) -> None:
    """``_statement_for_group``, its statement awaited."""
    outcomes = await execute_(statement_of([p.item for p in group]))
    for p, outcome in zip(group, outcomes):
        p.resolve(outcome)


class LoopExecutor:
    """The driver of one event loop: its own connections (``LoopConnections``; None: statements
    run in worker threads) and ``blocking``, which runs a function in a worker thread."""

    def __init__(self, broker: Broker, connections: LoopConnections | None, blocking: Callable[..., Awaitable[Any]]) -> None:
        self.broker = broker
        self.connections = connections
        self.blocking = blocking
        self._groups: dict[Callable[..., Statement[Any]], LoopGroupCommit[Any, Any]] = {}

    async def run(self, operation: Callable[[int], Operation[T]]) -> T:
        now = self.broker.now_without_waiting()
        if now is None:  # the clock is due a reading from the database: not on the loop
            return await self.blocking(run, self.broker, operation)
        op = operation(now)
        outcome: Any = None
        failed: BaseException | None = None
        while True:
            done, step = _advance(op, outcome, failed)
            if done:
                return step  # the operation's result
            try:
                outcome, failed = await self._step(step), None
            except BaseException as exc:  # noqa: BLE001 - the operation hears of it at its yield
                outcome, failed = None, exc

    async def _step(self, step: Step) -> Any:
        if isinstance(step, Statement):
            return await self.statement(step)
        if isinstance(step, Together):
            max_items = self.broker.settings.produce_group_commit_batches
            if max_items <= 1:
                return (await self.statement(step.statement_of([step.item])))[0]
            group = self._groups.get(step.statement_of)
            if group is None:
                run = functools.partial(_awaited_for_group, self.statement, step.statement_of)
                group = self._groups[step.statement_of] = LoopGroupCommit(run, LOOP_STATEMENTS, max_items)
            return await group.submit(step.item, step.key)
        return await self.blocking(step.fn)

    async def statement(self, statement: Statement[R]) -> R:
        """``statement`` on a connection of the loop's, or in a worker thread when none is free."""
        if self.connections is not None:
            async with self.connections.connection() as conn:
                if conn is not None:
                    return await execute_async(conn, statement)
        return await self.blocking(_in_thread, self.broker, statement)


# At most this many shared statements in flight on one event loop: the items that arrive meanwhile
# share the next one.
LOOP_STATEMENTS = 2
