"""A connection's Produce requests in flight: appended while the connection reads on, their answers
written in the order the requests came (``Gateway._serve_requests`` decides which requests may go
ahead: Produce requests naming no partition already in flight, up to ``PIPELINED_PRODUCE``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

PIPELINED_PRODUCE = 5  # Produce requests of one connection appended at once (librdkafka's in-flight limit)


class InFlight:
    """The Produce requests of one connection appended while it reads on (``Gateway._serve``), and
    the writing of their answers in the order the requests came.

    A failure (a ``CloseConnection``, a lost socket) is kept in ``failure`` once the answers before
    it have left; the connection's task then stops: at once if it is waiting in ``make_room`` or
    ``drain``, by cancellation if it is reading the next request."""

    def __init__(self, writer: asyncio.StreamWriter, connection: asyncio.Task, on_idle: Callable[[], None]) -> None:
        self._writer = writer
        self._connection = connection
        self._on_idle = on_idle
        self._entries: deque[tuple[asyncio.Task, frozenset[tuple[str, int]]]] = deque()
        self.failure: BaseException | None = None
        self.reading = False  # the connection waits for its next request
        self.cancelled_connection = False

    def __bool__(self) -> bool:
        while self._entries and self._entries[0][0].done():
            self._entries.popleft()
        return bool(self._entries)

    def add(self, answering: Coroutine[Any, Any, bytes | bytearray | None], partitions: frozenset[tuple[str, int]]) -> None:
        previous = self._entries[-1][0] if self._entries else None
        written = asyncio.create_task(self._write(asyncio.create_task(answering), previous))
        written.add_done_callback(self._written)
        self._entries.append((written, partitions))

    async def make_room(self, partitions: frozenset[tuple[str, int]]) -> None:
        """Wait until none in flight names one of ``partitions`` and there is room for one more."""
        while self and (len(self._entries) >= PIPELINED_PRODUCE or any(partitions & named for _, named in self._entries)):
            await self._wait(self._entries[0][0])

    async def drain(self) -> None:
        """Wait until every answer has left."""
        if self:
            await self._wait(self._entries[-1][0])

    async def settle(self) -> None:
        """Wait until every answer has left or failed."""
        if self:
            await asyncio.wait([self._entries[-1][0]])

    async def _wait(self, written: asyncio.Task) -> None:
        await asyncio.wait([written])
        if self.failure is not None:
            raise self.failure

    async def _write(self, answering: asyncio.Task, previous: asyncio.Task | None) -> None:
        try:
            try:
                answer = await answering
                failure: BaseException | None = None
            except Exception as exc:
                answer, failure = None, exc
            if previous is not None:
                await asyncio.wait([previous])
            if self.failure is not None:
                return
            if failure is None and answer is not None:
                try:
                    self._writer.write(answer)
                    await self._writer.drain()
                except Exception as exc:
                    failure = exc
            if failure is not None:
                self.failure = failure
                if self.reading:
                    self.cancelled_connection = True
                    self._connection.cancel()
        except asyncio.CancelledError:
            answering.cancel()
            raise

    def _written(self, written: asyncio.Task) -> None:
        _retrieved(written)
        if self.reading and self.failure is None and not self:
            self._on_idle()  # the last answer left while the connection waits for a request

    def cancel(self) -> None:
        for written, _ in self._entries:
            written.cancel()


def _retrieved(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()
