"""Transactional messages through the gateway, on txlog's half-message store
(``app.services.half_messages``), which holds every rule: what a decision does, when a check-back
is due, how many there are, what happens after the last.

- A TRANSACTION message is a half message of the ``rocketmq`` check channel. Its producer group is
  its topic's name, as RocketMQ's proxy names it (a gRPC client names no producer group): a live
  producer of the group is a producer connected to this gateway whose Settings publish the topic.
  Its transaction id is its message id, so that the client's retried send stores it once.
- EndTransaction from the client (SOURCE_CLIENT) is the store's commit or rollback; from a
  check-back (SOURCE_SERVER_CHECK) it answers the half message's latest check, as an HTTP
  check-back's answer would (an unspecified resolution is UNKNOWN: the next check will ask again).
- Check-backs (``CheckBacks``): every poll interval the gateway claims, in PostgreSQL, the due
  check-backs of the groups with a live producer here (``claim_checks``: the store's claim, under
  ``FOR UPDATE SKIP LOCKED``, counting the check and leasing the half message for one check
  interval), and pushes RecoverOrphanedTransactionCommand onto such a producer's Telemetry stream.
  Several gateways share the work that way: a slot is claimed once, by one gateway, and that
  gateway has a producer to send it to. If the producer left between the claim and the push, the
  claim is released (``release_check``: not counted, due again after one poll interval, for any
  gateway that has a producer then). A check-back no gateway with a live producer claimed within
  one gateway lease (``TXLOG_ROCKETMQ_GATEWAY_LEASE_MS``) of falling due is counted by whichever
  gateway finds it, sent to nobody (``count_orphaned_checks``), as a broker counts a check it found
  no producer for: a half message whose producers are all gone is rolled back after max_checks.
- Counters kept as RocketMQ's own TransactionProducer benchmark keeps them, from the server's side:
  an *unexpected* check is one sent for a half message decided already (told by its answer: the
  decision is older than the latest check, or the half message was never checked), a *duplicated*
  check a second send of the same check of the same half message. Both are logged as errors and
  must stay zero. An answer overtaken by a decision taken after its check was sent (the
  producer's own, or the answer to a later check) is *late*: nothing to do, counted apart.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from api.rocketmq import messages
from api.rocketmq.clients import Client, Clients
from api.rocketmq.status import RocketMQError
from app.domain.half_messages import CheckChannel, HalfState, LocalTransactionState
from app.services import Broker, half_messages, produce
from app.wire.rocketmq.protocol import Code, MessageType, definition, service

T = TypeVar("T")


class Gateway(Protocol):
    """What of the gateway (``server.Gateway``) the transactions use."""

    broker: Broker
    clients: Clients

    def blocking(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...

    def may_answer_check_back(self, client: Client, topic: str) -> bool: ...


log = logging.getLogger("txlog.rocketmq.transactions")

# Claimed per round (a round that claims this many starts the next one at once).
CLAIM_BATCH = 100
# How many sent checks are remembered to tell a duplicated one.
REMEMBERED_CHECKS = 10_000

_SOURCE_SERVER_CHECK = definition.TransactionSource.Value("SOURCE_SERVER_CHECK")
_COMMIT = definition.TransactionResolution.Value("COMMIT")
_ROLLBACK = definition.TransactionResolution.Value("ROLLBACK")


def send_half_message(gateway: Gateway, outgoing: messages.Outgoing, message: Any) -> Any:
    """Store one TRANSACTION message as a half message; its SendResultEntry. Runs in a worker thread."""
    immunity_ms = messages.check_immunity_ms(message)
    half = half_messages.send_half_message(
        gateway.broker,
        outgoing.topic,
        outgoing.topic,
        None,
        outgoing.record,
        transaction_id=outgoing.message_id,
        check_immunity_ms=immunity_ms,
        check_channel=CheckChannel.ROCKETMQ,
    )
    return service.SendResultEntry(
        status=definition.Status(code=Code.OK, message="OK"), message_id=outgoing.message_id, transaction_id=half.transaction_id
    )


def send_delayed_message(gateway: Gateway, outgoing: messages.Outgoing) -> Any:
    """Store one DELAY message until its delivery time (``half_messages.send_delayed_message``);
    its SendResultEntry, with an offset only when it was appended at once. Runs in a worker thread."""
    broker = gateway.broker
    deliver_at_ms = outgoing.deliver_at_ms if outgoing.deliver_at_ms is not None else broker.now()
    messages.check_delivery_time(deliver_at_ms, broker.now())
    sent = half_messages.send_delayed_message(broker, outgoing.topic, outgoing.record, deliver_at_ms, outgoing.message_id)
    entry = service.SendResultEntry(status=definition.Status(code=Code.OK, message="OK"), message_id=outgoing.message_id)
    if isinstance(sent, produce.ProduceResult):
        entry.offset = sent.base_offset
    return entry


@dataclass
class CheckCounters:
    sent: int = 0
    released: int = 0
    answered: int = 0
    late: int = 0  # answers overtaken by a decision taken after their check was sent
    unexpected: int = 0
    duplicated: int = 0
    unsent: int = 0  # counted with no live producer of the group on any gateway (count_orphaned_checks)


class CheckBacks:
    """This gateway's check-backs: claims, sends, releases, and the answers' counters."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.counters = CheckCounters()
        self._sent: set[tuple[str, int]] = set()
        self._sent_order: deque[tuple[str, int]] = deque()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rocketmq-check-backs")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        c = self.counters
        log.info(
            "check-backs: sent %d, released %d, answered %d (late %d), unexpected %d, duplicated %d, counted unsent %d",
            c.sent,
            c.released,
            c.answered,
            c.late,
            c.unexpected,
            c.duplicated,
            c.unsent,
        )

    def groups(self) -> list[str]:
        """The producer groups (topics) with a live producer here."""
        return sorted(t for t in self.gateway.clients.published_topics() if self._answerable(t))

    def _answerable(self, topic: str) -> bool:
        return any(self.gateway.may_answer_check_back(c, topic) for c in self.gateway.clients.publishers_of(topic))

    async def _run(self) -> None:
        interval = self.gateway.broker.settings.half_check_poll_interval_ms / 1000
        while True:
            more = False
            try:
                more = await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away, say: the next round tries again
                log.warning("check-back round failed: %s", exc)
            if not more:
                await asyncio.sleep(interval)

    async def round(self) -> bool:
        """Deliver the delayed messages whose time came, claim and send the due check-backs of the
        groups with a live producer here; True when more were due than taken."""
        broker = self.gateway.broker
        delivered = await self.gateway.blocking(half_messages.deliver_due, broker, CLAIM_BATCH)
        grace = broker.settings.rocketmq_gateway_lease_ms
        orphaned = await self.gateway.blocking(half_messages.count_orphaned_checks, broker, grace, CLAIM_BATCH)
        if orphaned.checked or orphaned.rolled_back:
            self.counters.unsent += orphaned.checked
            log.info(
                "%d check-backs counted with no live producer of their group on any gateway, %d half messages rolled back",
                orphaned.checked,
                orphaned.rolled_back,
            )
        groups = self.groups()
        if not groups:
            return delivered.more_due or orphaned.more_due
        claimed, report = await self.gateway.blocking(half_messages.claim_checks, broker, groups, CLAIM_BATCH)
        if report.rolled_back:
            log.info("rolled back %d half messages after their last check-back", report.rolled_back)
        for check in claimed:
            await self._send(check)
        return report.more_due or delivered.more_due or orphaned.more_due

    async def _send(self, check: half_messages.ClaimedCheck) -> None:
        m = check.stored.msg
        slot = (m.transaction_id, check.check_no)
        if slot in self._sent:
            self.counters.duplicated += 1
            log.error("duplicated check-back: check %d of half message %s claimed twice", check.check_no, m.transaction_id)
            return
        record = check.stored.record
        command = service.TelemetryCommand(
            recover_orphaned_transaction_command=service.RecoverOrphanedTransactionCommand(
                message=messages.as_message(m.topic, record, MessageType.TRANSACTION), transaction_id=m.transaction_id
            )
        )
        for client in self.gateway.clients.publishers_of(m.topic):
            if not self.gateway.may_answer_check_back(client, m.topic):
                continue
            if self.gateway.clients.push(client.client_id, command):
                self._remember(slot)
                self.counters.sent += 1
                log.info(
                    "check-back %d of half message %s sent to producer %s", check.check_no, m.transaction_id, client.client_id
                )
                return
        released = await self.gateway.blocking(half_messages.release_check, self.gateway.broker, m.transaction_id, check.check_no)
        self.counters.released += 1
        log.info(
            "check-back %d of half message %s released (no live producer of %s here)%s",
            check.check_no,
            m.transaction_id,
            m.topic,
            "" if released else "; it had moved on",
        )

    def _remember(self, slot: tuple[str, int]) -> None:
        self._sent.add(slot)
        self._sent_order.append(slot)
        if len(self._sent_order) > REMEMBERED_CHECKS:
            self._sent.discard(self._sent_order.popleft())

    def answered(self, transaction_id: str, kind: str) -> None:
        self.counters.answered += 1
        if kind == "unexpected":
            self.counters.unexpected += 1
            log.error("unexpected check-back: half message %s was checked when it was decided already", transaction_id)
        elif kind == "late":
            self.counters.late += 1
            log.info("check-back of half message %s answered after its decision (overtaken): nothing to do", transaction_id)
        else:
            log.info("check-back of half message %s answered: %s", transaction_id, kind)


def end_transaction(gateway: Gateway, request: Any) -> str | None:
    """EndTransaction: the client's decision, or its answer to a check-back. Runs in a worker
    thread; answers what a check-back's answer did (None for the client's own decision)."""
    topic = messages.topic_of(request.topic)
    tid = request.transaction_id
    if not tid.strip():
        raise RocketMQError(Code.INVALID_TRANSACTION_ID, "the transaction id is blank")
    broker = gateway.broker
    detail = half_messages.describe(broker, tid)
    if detail.stored.msg.producer_group != topic or detail.stored.msg.check_channel is not CheckChannel.ROCKETMQ:
        raise RocketMQError(
            Code.INVALID_TRANSACTION_ID, f"no transactional message of topic {topic!r} has transaction id {tid!r}"
        )
    resolution = request.resolution
    if request.source == _SOURCE_SERVER_CHECK:
        answer = {_COMMIT: LocalTransactionState.COMMIT, _ROLLBACK: LocalTransactionState.ROLLBACK}.get(
            resolution, LocalTransactionState.UNKNOWN
        )
        return half_messages.answer_check(broker, tid, answer)
    if resolution == _COMMIT:
        half_messages.end_transaction(broker, tid, HalfState.COMMITTED)
    elif resolution == _ROLLBACK:
        half_messages.end_transaction(broker, tid, HalfState.ROLLED_BACK)
    # An unspecified resolution from the client decides nothing (the proxy's UNKNOWN): its
    # check-backs will ask.
    return None
