"""Group commit: concurrent callers' items done together, by one statement or one database
transaction, with one commit and one WAL flush for all of them.

A caller hands in one item and gets back its own outcome, a result or an exception, only once the
group that did it has committed: acknowledgements still follow the commit. At most ``senders``
groups run at once; items that arrive meanwhile wait. The caller whose item starts a group (who
"sends") takes the oldest waiters with it, up to ``max_items``, at most one per ``key`` (a second
item of a key in the group waits for a later one: two appends to one partition planned against
the same end of it cannot both hold). Once its own group is done it hands the next group to the
oldest waiter, rather than serving others, so no caller waits longer than the groups ahead of it.
With one caller at a time every group is that caller's item alone, sent at once.

Who goes together is defined once (``_Queue``, plain data and no waiting); there are two ways to
wait for it: threads (``GroupCommit``) and an event loop (``LoopGroupCommit``), whose group runs to
its end even if the caller who sent it is cancelled (the others of its group hear of it), and
whose waiter, cancelled, leaves the queue (handing on the group it was given, if it was).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Awaitable, Callable, Generic, Hashable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Pending(Generic[T, R]):
    """One caller's item, and what became of it."""

    __slots__ = ("item", "key", "result", "error", "done", "sends", "_wake")

    def __init__(self, item: T, key: Hashable = None) -> None:
        self.item = item
        self.key = key  # None: goes with any other item
        self.result: R | None = None
        self.error: BaseException | None = None
        self.done = False
        self.sends = False  # its caller sends the next group
        self._wake: threading.Event | asyncio.Future[None] | None = None

    def resolve(self, result: R) -> None:
        self.result, self.error, self.done = result, None, True

    def fail(self, error: BaseException) -> None:
        self.result, self.error, self.done = None, error, True

    def reopen(self) -> None:
        """Undecided again (its group was undone, to be done another way)."""
        self.result, self.error, self.done = None, None, False

    def outcome(self) -> R:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # resolved: R, which may itself admit None


class _Queue(Generic[T, R]):
    """The waiting items and the groups in flight: who sends, and who goes with whom."""

    def __init__(self, senders: int, max_items: int) -> None:
        self.max_items = max_items
        self._free = senders
        self._waiting: deque[Pending[T, R]] = deque()

    def arrive(self, p: Pending[T, R]) -> bool:
        """``p`` waits; True if its caller sends a group at once."""
        self._waiting.append(p)
        if self._free > 0:
            self._free -= 1
            p.sends = True
        return p.sends

    def take(self, me: Pending[T, R]) -> list[Pending[T, R]]:
        """``me`` (a sender) and the oldest waiters after it, one per key, up to the group's size. A
        waiter handed a group of its own is left to it."""
        self._waiting.remove(me)
        group = [me]
        keys = {me.key}
        later: list[Pending[T, R]] = []
        while self._waiting and len(group) < self.max_items:
            w = self._waiting.popleft()
            if w.sends or (w.key is not None and w.key in keys):
                later.append(w)
            else:
                keys.add(w.key)
                group.append(w)
        self._waiting.extendleft(reversed(later))
        return group

    def hand_on(self) -> Pending[T, R] | None:
        """A sender is done: the oldest waiter not sending yet sends the next group (returned, to
        be woken), if any waits."""
        for w in self._waiting:
            if not w.sends:
                w.sends = True
                return w
        self._free += 1
        return None

    def leave(self, me: Pending[T, R]) -> Pending[T, R] | None:
        """A waiter's caller is gone: out of the queue; handed a group already, it hands it on."""
        if me in self._waiting:
            self._waiting.remove(me)
        return self.hand_on() if me.sends else None


def _decided(group: Sequence[Pending[T, R]], error: BaseException | None) -> None:
    """After ``run``: an exception it raised fails every item it left undecided; an item left
    undecided without one fails (a mistake)."""
    for p in group:
        if not p.done:
            p.fail(error if error is not None else RuntimeError("the group commit left an item undecided"))


class GroupCommit(Generic[T, R]):
    """For threads. ``run`` takes a group of pending items and resolves or fails each of them."""

    def __init__(self, run: Callable[[Sequence[Pending[T, R]]], None], senders: int = 2, max_items: int = 16) -> None:
        self._run = run
        self._lock = threading.Lock()
        self._queue: _Queue[T, R] = _Queue(senders, max_items)

    def submit(self, item: T, key: Hashable = None) -> R:
        me: Pending[T, R] = Pending(item, key)
        woken = me._wake = threading.Event()
        with self._lock:
            sends = self._queue.arrive(me)
        if not sends:
            woken.wait()
        if not me.done:  # handed a group to send
            with self._lock:
                group = self._queue.take(me)
            try:
                self._run_group(group)
            finally:
                with self._lock:
                    heir = self._queue.hand_on()
                if heir is not None:
                    heir._wake.set()  # type: ignore[union-attr]  # a thread's: an Event
        return me.outcome()

    def _run_group(self, group: list[Pending[T, R]]) -> None:
        error = None
        try:
            self._run(group)
        except BaseException as exc:  # noqa: BLE001 - each caller of the group hears of it
            error = exc
        _decided(group, error)
        for p in group:
            p._wake.set()  # type: ignore[union-attr]  # a thread's: an Event


class LoopGroupCommit(Generic[T, R]):
    """For one event loop. ``run`` takes a group of pending items and resolves or fails each."""

    def __init__(self, run: Callable[[Sequence[Pending[T, R]]], Awaitable[None]], senders: int = 2, max_items: int = 16) -> None:
        self._run = run
        self._queue: _Queue[T, R] = _Queue(senders, max_items)

    async def submit(self, item: T, key: Hashable = None) -> R:
        me: Pending[T, R] = Pending(item, key)
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        me._wake = woken
        if not self._queue.arrive(me):
            try:
                await woken
            except asyncio.CancelledError:
                _wake(self._queue.leave(me))
                raise
        if not me.done:  # handed a group to send
            try:
                await asyncio.shield(asyncio.ensure_future(self._run_group(self._queue.take(me))))
            finally:
                _wake(self._queue.hand_on())
        return me.outcome()

    async def _run_group(self, group: list[Pending[T, R]]) -> None:
        error = None
        try:
            await self._run(group)
        except BaseException as exc:  # noqa: BLE001 - each caller of the group hears of it
            error = exc
        _decided(group, error)
        for p in group:
            _wake(p)
        if error is not None and not isinstance(error, Exception):
            raise error


def _wake(p: Pending[T, R] | None) -> None:
    """Wake a loop's waiter (its wake is a Future), if it still waits."""
    if p is not None and isinstance(p._wake, asyncio.Future) and not p._wake.done():
        p._wake.set_result(None)
