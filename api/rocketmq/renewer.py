"""The gateway's renewal of push consumers' receipt handles (``renewal`` has the rules).

Each message a receive with ``auto_renew`` streams is held here under its client and group, in
the gateway's memory, as a proxy holds it: a gateway that dies loses only its clients' locks, which
end by themselves. Every TXLOG_ROCKETMQ_RENEW_SCHEDULE_PERIOD_MS (the proxy's
renewSchedulePeriodMillis, 5 s) a round renews the handles due, releases those held too long and
returns those of clients gone offline (``Clients.online``: terminated, idle, or their Telemetry
stream here ended). Each acquiring member's due handles go to the store in one acknowledgement
(RENEW with the lock duration); a handle the store refuses — its lock gone, or its message done —
is forgotten. AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue of a handle
forget it (``settled``), after any renewal of it under way, so that the client's own word on the
lock is the last.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Iterable, Protocol, TypeVar

from api.rocketmq import receiving, renewal
from api.rocketmq.clients import Clients
from api.rocketmq.renewal import Held
from app.domain.share_partition import AcknowledgementBatch, AcknowledgeType
from app.services import Broker, share

T = TypeVar("T")

log = logging.getLogger("txlog.rocketmq.renewal")

RENEWED, GONE, FAILED = "renewed", "gone", "failed"


class Gateway(Protocol):
    broker: Broker
    clients: Clients

    def blocking(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...


def now_ms() -> int:
    return int(time.time() * 1000)


class Renewer:
    """The handles held for renewal, by (client id, group) then handle; used on the event loop only."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._held: dict[tuple[str, str], dict[str, Held]] = {}
        self._renewing: dict[str, asyncio.Event] = {}  # handles whose renewal is under way
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return sum(len(handles) for handles in self._held.values())

    def hold(self, client_id: str, group: str, handle: receiving.ReceiptHandle, text: str, invisible_ms: int) -> None:
        """A message streamed to ``client_id`` for ``group`` by a receive with auto_renew."""
        now = now_ms()
        held = Held(
            text, handle.topic, handle.partition, handle.offset, handle.member_id, handle.delivery_count, now, now + invisible_ms
        )
        self._held.setdefault((client_id, group), {})[text] = held

    def forget(self, client_id: str, group: str, texts: Iterable[str]) -> None:
        handles = self._held.get((client_id, group))
        if handles is None:
            return
        for text in texts:
            handles.pop(text, None)
        if not handles:
            del self._held[(client_id, group)]

    async def settled(self, client_id: str, group: str, text: str) -> None:
        """The client settles ``text`` itself: renewed no more, once a renewal under way is done."""
        self.forget(client_id, group, (text,))
        under_way = self._renewing.get(text)
        if under_way is not None:
            await under_way.wait()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rocketmq-renewal")

    async def stop(self) -> None:
        """The rounds end; the handles held are left to their locks."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        period_s = self.gateway.broker.settings.rocketmq_renew_schedule_period_ms / 1000
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:  # the next round tries again
                log.exception("renewal round failed")

    async def round(self) -> None:
        """Renew what is due, release what is held too long or by a client gone offline."""
        now = now_ms()
        ahead_ms = self.gateway.broker.settings.rocketmq_renew_ahead_ms
        released: list[tuple[str, list[tuple[Held, int]]]] = []
        due: list[tuple[tuple[str, str], list[tuple[Held, int]]]] = []
        for key, handles in list(self._held.items()):
            client_id, group = key
            if not self.gateway.clients.online(client_id):
                del self._held[key]
                log.debug("client %s of %r offline: %d handles returned", client_id, group, len(handles))
                released.append((group, renewal.cleared(handles.values())))
                continue
            plan = renewal.plan(handles.values(), now, ahead_ms)
            for h in plan.drop:
                log.warning(
                    "%s-%s@%s of %r renewed no more: %d renewals failed", h.topic, h.partition, h.offset, group, h.failures
                )
            self.forget(client_id, group, [h.handle for h in plan.drop] + [h.handle for h, _ in plan.release])
            released.append((group, plan.release))
            due.append((key, plan.renew))
        for group, handles_due in released:
            for (member_id, lock_ms), returned in renewal.by_member(handles_due).items():
                await self._renew(group, member_id, lock_ms, returned)
        for (client_id, group), handles_due in due:
            for (member_id, lock_ms), renewing in renewal.by_member(handles_due).items():
                at = now_ms()
                outcomes = await self._renew(group, member_id, lock_ms, renewing)
                current = self._held.get((client_id, group), {})
                for h in renewing:
                    was = current.get(h.handle)
                    if was is None:  # settled meanwhile
                        continue
                    outcome = outcomes[h.handle]
                    if outcome == RENEWED:
                        current[h.handle] = renewal.renewed(was, at, lock_ms)
                    elif outcome == FAILED:
                        current[h.handle] = renewal.failed(was)
                    else:
                        self.forget(client_id, group, (h.handle,))

    async def _renew(self, group: str, member_id: str, lock_ms: int, handles: list[Held]) -> dict[str, str]:
        """One acknowledgement renewing ``handles`` (all of ``member_id``) for ``lock_ms``: each
        handle RENEWED, GONE (refused: its lock gone, or its message done) or FAILED (the store not
        reached). A share partition refuses its batches whole: a partition refused with several
        handles has each tried alone, to tell which are gone."""
        under_way = asyncio.Event()
        for h in handles:
            self._renewing[h.handle] = under_way
        try:
            return await self._acknowledge(group, member_id, lock_ms, handles)
        finally:
            for h in handles:
                if self._renewing.get(h.handle) is under_way:
                    del self._renewing[h.handle]
            under_way.set()

    async def _acknowledge(self, group: str, member_id: str, lock_ms: int, handles: list[Held]) -> dict[str, str]:
        places: dict[tuple[str, int], list[Held]] = {}
        for h in sorted(handles, key=lambda h: (h.topic, h.partition, h.offset)):
            places.setdefault((h.topic, h.partition), []).append(h)
        acks = {
            place: [AcknowledgementBatch(h.offset, h.offset, (int(AcknowledgeType.RENEW),)) for h in held]
            for place, held in places.items()
        }
        try:
            answers = await self.gateway.blocking(share.acknowledge, self.gateway.broker, group, member_id, acks, lock_ms)
        except Exception as exc:
            log.warning("renewal of %d handles of %r not done: %s", len(handles), group, exc)
            return {h.handle: FAILED for h in handles}
        outcomes: dict[str, str] = {}
        for answer in answers:
            held = places[(answer.topic, answer.partition)]
            if answer.error is None:
                ranges = answer.outcome.renewed if answer.outcome is not None else ()
                for h in held:
                    renewed = any(r.first_offset <= h.offset <= r.last_offset for r in ranges)
                    outcomes[h.handle] = RENEWED if renewed else GONE
            elif answer.error.code not in receiving.EXPIRED_HANDLE_ERRORS:
                log.warning("renewal of %s-%s for %r not done: %s", answer.topic, answer.partition, group, answer.error)
                outcomes.update((h.handle, FAILED) for h in held)
            elif len(held) == 1:
                outcomes[held[0].handle] = GONE
            else:
                for h in held:
                    outcomes.update(await self._acknowledge(group, member_id, lock_ms, [h]))
        return outcomes
