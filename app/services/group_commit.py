"""Group commit: concurrent callers' items done together, in one database transaction.

A caller hands in one item and gets back its own outcome, a result or an exception, only once the
database transaction that did it has committed: acknowledgements still follow the commit. While
``leaders`` groups are running, items that arrive queue up; the next group takes up to
``max_items`` of them, oldest first. The caller whose item starts a group runs it on its own
thread; when its own item is done and more are waiting, it hands the lead to the oldest waiter
rather than serving others, so no caller waits longer than the groups ahead of it. With one caller
at a time every group is that caller's item alone.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Generic, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Pending(Generic[T, R]):
    """One caller's item, and what became of it."""

    __slots__ = ("item", "result", "error", "done", "_woken", "_lead")

    def __init__(self, item: T) -> None:
        self.item = item
        self.result: R | None = None
        self.error: BaseException | None = None
        self.done = False
        self._woken = threading.Event()
        self._lead = False

    def resolve(self, result: R) -> None:
        self.result, self.error, self.done = result, None, True

    def fail(self, error: BaseException) -> None:
        self.result, self.error, self.done = None, error, True

    def reopen(self) -> None:
        """Undecided again (its group was undone, to be done another way)."""
        self.result, self.error, self.done = None, None, False


class GroupCommit(Generic[T, R]):
    """``run`` takes a group of pending items and resolves or fails each of them; an item it leaves
    undecided fails (a mistake), and an exception it raises fails every undecided item."""

    def __init__(self, run: Callable[[Sequence[Pending[T, R]]], None], leaders: int = 2, max_items: int = 16) -> None:
        self._run = run
        self._max_items = max_items
        self._lock = threading.Lock()
        self._queue: deque[Pending[T, R]] = deque()
        self._free = leaders

    def submit(self, item: T) -> R:
        me: Pending[T, R] = Pending(item)
        with self._lock:
            self._queue.append(me)
            lead = self._free > 0
            if lead:
                self._free -= 1
        if not lead:
            me._woken.wait()
            if not me._lead:
                return _outcome(me)
        # A leader's place is this thread's until its own item is done. An heir's item was taken
        # off the queue when it was handed the lead: its first group starts with it.
        carried = [me] if me._lead else []
        while not me.done:
            with self._lock:
                take = min(self._max_items - len(carried), len(self._queue))
                group = carried + [self._queue.popleft() for _ in range(take)]
            carried = []
            self._run_group(group)
        with self._lock:
            if self._queue:
                heir = self._queue.popleft()
                heir._lead = True
                heir._woken.set()
            else:
                self._free += 1
        return _outcome(me)

    def _run_group(self, group: list[Pending[T, R]]) -> None:
        try:
            self._run(group)
        except BaseException as exc:  # noqa: BLE001 - each caller of the group hears of it
            for p in group:
                if not p.done:
                    p.fail(exc)
        for p in group:
            if not p.done:
                p.fail(RuntimeError("the group commit left an item undecided"))
            p._woken.set()


def _outcome(p: Pending[T, R]) -> R:
    if p.error is not None:
        raise p.error
    return p.result  # type: ignore[return-value]  # decided without an error: the result is set
