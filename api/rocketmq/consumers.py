"""The consumer RPCs of the gateway's MessagingService (the simple consumer's, and the push
consumer's QueryAssignment), on the share groups.

A consumer group is the share group of the same name, a message queue a partition, and every
delivery is the share groups' state machine (``app.services.share``), read_committed:
ReceiveMessage is a long-polled acquisition locked for the invisible duration, AckMessage an
ACCEPT, ChangeInvisibleDuration a RENEW for the new duration, ForwardMessageToDeadLetterQueue a
copy to the group's dead-letter topic (``DLQ_PREFIX`` + group) and a REJECT (``receiving`` holds
the receipt handles and tag filters). A message a receive acquires for a delivery beyond the
group's maximum attempts is not streamed but copied to the dead-letter topic and REJECTed, as a
proxy pops it to the DLQ. A receive with auto_renew (the push consumer's) locks for
TXLOG_ROCKETMQ_DEFAULT_INVISIBLE_MS, and its messages' locks are renewed in the background while
the client holds them (``renewer``), returned promptly when it goes offline.
"""

from __future__ import annotations

import random
import time
from typing import Any, AsyncIterator

from api.rocketmq import messages, receiving
from api.rocketmq.rpc import Service, answered, client_id_of, log
from api.rocketmq.status import RocketMQError, of_error, status
from app.domain.records import NewRecord
from app.domain.share_partition import AcknowledgementBatch, AcknowledgeType
from app.errors import ErrorCode, TxlogError
from app.services import Broker, fetch, produce, share, share_configs, topics
from app.wire.rocketmq.protocol import Code, definition, service

# Consumers, as a RocketMQ 5 proxy has them: the longest invisible duration and long-polling
# timeout (a receive that names no invisible duration, auto_renew's, takes
# TXLOG_ROCKETMQ_DEFAULT_INVISIBLE_MS).
MAX_INVISIBLE_MS = 12 * 3_600_000
MAX_LONG_POLLING_MS = 20_000
LONG_POLLING_RESERVE_MS = 200  # of the call's deadline, left to answer in
ALL_QUEUES = -1  # QueryAssignment's queue: every queue of the broker, as a proxy assigns them
# A consumer group's dead-letter topic: RocketMQ names it %DLQ%<group>, which a txlog (Kafka) topic
# name cannot hold; it has one partition, as RocketMQ's has one queue.
DLQ_PREFIX = "DLQ."
DLQ_PARTITIONS = 1
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
DLQ_HOLD_MS = 30_000  # the lock held while the copy is written


class Consumers(Service):
    """The consumer RPCs (``server.MessagingService`` serves them)."""

    async def _max_delivery_attempts(self, sent: Any) -> int | None:
        """A consumer group's maximum delivery attempts (``receiving.max_attempts`` of its
        share.delivery.count.limit; None for a producer, or with the database away: the answer
        goes without it)."""
        if not sent.HasField("subscription") or not sent.subscription.group.name:
            return None
        try:
            config = await self.gateway.blocking(share_configs.group_config, self.broker, sent.subscription.group.name)
        except TxlogError as exc:
            log.debug("settings of group %r without its delivery limit: %s", sent.subscription.group.name, exc)
            return None
        return receiving.max_attempts(config.delivery.delivery_count_limit)

    @answered(service.QueryAssignmentResponse)
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        """One assignment, every queue of the topic (queue id -1), as a proxy assigns a non-FIFO
        group's consumers: the share group spreads the messages over them, not the assignment."""
        topic = messages.topic_of(request.topic)
        group = _group_of(request.group)
        await self._authorize(context, "QueryAssignment", topic, group)
        self.clients.seen(client_id_of(context), group=group)
        await self.gateway.blocking(topics.partition_count, self.broker, topic)
        queue = self._queue(topic, ALL_QUEUES, request.endpoints)
        return service.QueryAssignmentResponse(status=status(), assignments=[definition.Assignment(message_queue=queue)])

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """As a proxy streams it: a status (OK, or MESSAGE_NOT_FOUND when the long poll found
        nothing), the messages, then the delivery timestamp."""
        try:
            found = await self._received(request, context)
            yield service.ReceiveMessageResponse(status=status() if found else status(Code.MESSAGE_NOT_FOUND, "no new message"))
            held = self._hold(request, context, found)
            streamed = 0
            try:
                for message in found:
                    yield service.ReceiveMessageResponse(message=message)
                    streamed += 1
            finally:
                if held is not None and streamed < len(found):  # the caller went away: not its to renew
                    client_id, group = held
                    self.gateway.renewer.forget(client_id, group, [m.system_properties.receipt_handle for m in found[streamed:]])
        except RocketMQError as exc:
            yield service.ReceiveMessageResponse(status=status(exc.code, exc.message))
        except TxlogError as exc:
            yield service.ReceiveMessageResponse(status=of_error(exc))
        except Exception:
            log.exception("ReceiveMessage failed")
            yield service.ReceiveMessageResponse(
                status=status(Code.INTERNAL_SERVER_ERROR, "internal error (logged by the gateway)")
            )
        stamp = service.ReceiveMessageResponse()
        stamp.delivery_timestamp.GetCurrentTime()
        yield stamp

    def _hold(self, request: Any, context: Any, found: list[Any]) -> tuple[str, str] | None:
        """A receive with auto_renew (the push consumer's): its messages held for renewal
        (``renewer``) under its client and group, which it answers; None for any other."""
        if not request.auto_renew or not found:
            return None
        client_id, group = client_id_of(context), _group_of(request.group)
        for message in found:
            props = message.system_properties
            handle = receiving.ReceiptHandle.decode(props.receipt_handle)
            self.gateway.renewer.hold(client_id, group, handle, props.receipt_handle, props.invisible_duration.ToMilliseconds())
        return client_id, group

    async def _received(self, request: Any, context: Any) -> list[Any]:
        """Acquire up to the batch size of the topic's records for an acquisition of this client,
        locked for the invisible duration, long-polled; the records the tag filter leaves out (and
        offsets with no record) acknowledged for the group at once, as a broker skips them. A
        record acquired for a delivery beyond the group's maximum attempts
        (``receiving.dead_lettered``) is not streamed: copied to the group's dead-letter topic, then
        REJECTed (archived), as a proxy sends a message popped beyond its maximum to the DLQ."""
        client_id = client_id_of(context)
        group = _group_of(request.group)
        topic = messages.topic_of(request.message_queue.topic)
        await self._authorize(context, "ReceiveMessage", topic, group)
        self.clients.seen(client_id, group=group)
        tags = receiving.TagFilter.of(request.filter_expression)
        if request.batch_size < 1:
            raise RocketMQError(Code.BAD_REQUEST, f"batch size {request.batch_size} is not positive")
        invisible_ms = _invisible_ms(request, self.broker.settings.rocketmq_default_invisible_ms)
        wait_ms = _polling_ms(request, context)
        count = await self.gateway.blocking(topics.partition_count, self.broker, topic)
        # From the queue asked (a simple consumer turns over the queues), else (the push
        # consumer's queue -1) from a random one: every partition is reached first in turn.
        first = request.message_queue.id if 0 <= request.message_queue.id < count else random.randrange(count)
        wanted = [(topic, (first + i) % count) for i in range(count)]
        member = receiving.acquisition_member(client_id)
        host, port = self.gateway.advertised or ("", 0)
        store_host = f"{host or self.gateway.listen_host}:{port}"
        config = await self.gateway.blocking(share_configs.group_config, self.broker, group)
        limit = config.delivery.delivery_count_limit
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            got = await share.acquire_waiting(
                self.broker,
                self.gateway.notifier,
                self.gateway.blocking,
                group,
                member,
                wanted,
                left_ms,
                max_records=request.batch_size,
                isolation_level="read_committed",
                lock_duration_ms=invisible_ms,
            )
            failed = [p.error for p in got if p.error is not None]
            if failed and len(failed) == len(got):
                raise failed[0]
            found: list[Any] = []
            skipped: dict[tuple[str, int], list[AcknowledgementBatch]] = {}
            dead: dict[tuple[str, int], list[AcknowledgementBatch]] = {}
            for part in got:
                records = {r.offset: (r, c) for r, c in zip(part.records, part.delivery_counts)}
                for run in part.acquired:
                    for offset in range(run.first_offset, run.last_offset + 1):
                        held = records.get(offset)
                        if held is not None and tags.matches(held[0]) and receiving.dead_lettered(held[1], limit):
                            await self.gateway.blocking(_to_dead_letter_topic, self.broker, group, topic, part.partition, held[0])
                            dead.setdefault((topic, part.partition), []).append(
                                AcknowledgementBatch(offset, offset, (int(AcknowledgeType.REJECT),))
                            )
                        elif held is not None and tags.matches(held[0]):
                            record, delivery_count = held
                            handle = receiving.ReceiptHandle(topic, part.partition, offset, delivery_count, member)
                            found.append(
                                receiving.message_of(
                                    topic, part.partition, record, delivery_count, handle.encode(), invisible_ms, store_host
                                )
                            )
                        else:
                            kind = AcknowledgeType.GAP if held is None else AcknowledgeType.ACCEPT
                            skipped.setdefault((topic, part.partition), []).append(
                                AcknowledgementBatch(offset, offset, (int(kind),))
                            )
            for settled, why in ((skipped, "filtered out"), (dead, "dead-lettered")):
                if not settled:
                    continue
                for answer in await self.gateway.blocking(share.acknowledge, self.broker, group, member, settled):
                    if answer.error is not None:
                        log.warning(
                            "records of %s-%s %s for %r not acknowledged: %s", topic, answer.partition, why, group, answer.error
                        )
            if found or left_ms == 0:
                return found

    async def _settle(
        self, client_id: str, group: str, topic: str, text: str, kind: AcknowledgeType, lock_ms: int | None = None
    ) -> receiving.ReceiptHandle:
        """Acknowledge the record a receipt handle names, as the acquisition that received it. A
        handle whose lock is gone (expired, acknowledged, delivered again since) is refused
        INVALID_RECEIPT_HANDLE, as a proxy refuses an expired one. The client settles the handle
        itself: it is renewed in the background no more (``renewer``)."""
        handle = receiving.ReceiptHandle.decode(text)
        if handle.topic != topic:
            raise RocketMQError(Code.INVALID_RECEIPT_HANDLE, f"the receipt handle is of topic {handle.topic!r}, not {topic!r}")
        await self.gateway.renewer.settled(client_id, group, text)
        batch = AcknowledgementBatch(handle.offset, handle.offset, (int(kind),))
        acks = {(topic, handle.partition): [batch]}
        [answer] = await self.gateway.blocking(share.acknowledge, self.broker, group, handle.member_id, acks, lock_ms)
        if answer.error is not None:
            if answer.error.code in receiving.EXPIRED_HANDLE_ERRORS:
                raise RocketMQError(Code.INVALID_RECEIPT_HANDLE, f"receipt handle is expired: {answer.error.message}")
            raise answer.error
        if kind is AcknowledgeType.RENEW and answer.outcome is not None and not answer.outcome.renewed:
            # Below the share partition's start offset: acknowledged or archived already, nothing
            # left to hold (an ACCEPT or REJECT of it is answered OK: done is done).
            raise RocketMQError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is expired: the message is done")
        return handle

    @answered(service.AckMessageResponse)
    async def AckMessage(self, request: Any, context: Any) -> Any:
        """Each entry ACCEPTed on its own; the answer's status is the entries' one code, or
        MULTIPLE_RESULTS, as a proxy answers."""
        group = _group_of(request.group)
        topic = messages.topic_of(request.topic)
        await self._authorize(context, "AckMessage", topic, group)
        client_id = client_id_of(context)
        self.clients.seen(client_id, group=group)
        if not request.entries:
            raise RocketMQError(Code.BAD_REQUEST, "the request carries no entry")
        entries = []
        for entry in request.entries:
            try:
                await self._settle(client_id, group, topic, entry.receipt_handle, AcknowledgeType.ACCEPT)
                result = status()
            except RocketMQError as exc:
                result = status(exc.code, exc.message)
            except TxlogError as exc:
                result = of_error(exc)
            entries.append(
                service.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=result)
            )
        codes = {e.status.code for e in entries}
        code = codes.pop() if len(codes) == 1 else Code.MULTIPLE_RESULTS
        return service.AckMessageResponse(status=status(code, Code.Name(code)), entries=entries)

    @answered(service.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        """The lock renewed for the new duration from now (RENEW): the message comes again when
        it ends, unless acknowledged. The handle answered names the same acquisition."""
        group = _group_of(request.group)
        topic = messages.topic_of(request.topic)
        await self._authorize(context, "ChangeInvisibleDuration", topic, group)
        client_id = client_id_of(context)
        self.clients.seen(client_id, group=group)
        ms = _checked_invisible_ms(request.invisible_duration.ToMilliseconds())
        handle = await self._settle(client_id, group, topic, request.receipt_handle, AcknowledgeType.RENEW, ms)
        return service.ChangeInvisibleDurationResponse(status=status(), receipt_handle=handle.encode())

    @answered(service.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        """The message copied to the group's dead-letter topic (made with one partition when
        missing), then REJECTed (archived, never delivered again). The lock is renewed first, so
        a handle that no longer holds the message writes no copy. A group whose name no topic
        name can hold (RocketMQ allows ``%`` and ``|``) has its message archived without a copy."""
        group = _group_of(request.group)
        topic = messages.topic_of(request.topic)
        await self._authorize(context, "ForwardMessageToDeadLetterQueue", topic, group)
        client_id = client_id_of(context)
        self.clients.seen(client_id, group=group)
        handle = await self._settle(client_id, group, topic, request.receipt_handle, AcknowledgeType.RENEW, DLQ_HOLD_MS)
        page = await self.gateway.blocking(
            fetch.fetch, self.broker, topic, handle.partition, handle.offset, 1, 1_048_576, "read_committed"
        )
        record = next((r for r in page.records if r.offset == handle.offset), None)
        if record is not None:
            await self.gateway.blocking(_to_dead_letter_topic, self.broker, group, topic, handle.partition, record)
        await self._settle(client_id, group, topic, request.receipt_handle, AcknowledgeType.REJECT)
        return service.ForwardMessageToDeadLetterQueueResponse(status=status())


def _group_of(resource: Any) -> str:
    """A consumer group's name: the share group of the same name."""
    if resource.resource_namespace:
        raise RocketMQError(Code.BAD_REQUEST, f"namespaces are not served (namespace {resource.resource_namespace!r})")
    if not resource.name:
        raise RocketMQError(Code.ILLEGAL_CONSUMER_GROUP, "the consumer group is blank")
    return str(resource.name)


def _checked_invisible_ms(ms: int) -> int:
    if not 0 < ms <= MAX_INVISIBLE_MS:
        raise RocketMQError(Code.ILLEGAL_INVISIBLE_TIME, f"the invisible duration must be above 0 and at most 12 h, not {ms} ms")
    return ms


def _invisible_ms(request: Any, default_ms: int) -> int:
    """A receive's invisible duration: the request's, else (auto_renew, the push consumer)
    ``default_ms``, TXLOG_ROCKETMQ_DEFAULT_INVISIBLE_MS (the proxy's default)."""
    if not request.HasField("invisible_duration") and request.auto_renew:
        return default_ms
    return _checked_invisible_ms(request.invisible_duration.ToMilliseconds())


def _polling_ms(request: Any, context: Any) -> int:
    """How long a receive waits for messages: the request's long-polling timeout (else the
    proxy's longest), at most the proxy's longest and what the call's deadline leaves."""
    wanted = request.long_polling_timeout.ToMilliseconds() if request.HasField("long_polling_timeout") else MAX_LONG_POLLING_MS
    if wanted < 0:
        raise RocketMQError(Code.ILLEGAL_POLLING_TIME, f"the long-polling timeout {wanted} ms is negative")
    wanted = min(wanted, MAX_LONG_POLLING_MS)
    remaining = context.time_remaining()
    if remaining is not None:
        wanted = min(wanted, max(0, int(remaining * 1000) - LONG_POLLING_RESERVE_MS))
    return wanted


def _to_dead_letter_topic(broker: Broker, group: str, topic: str, partition: int, record: Any) -> None:
    """``record`` appended to the group's dead-letter topic (made first if missing), with where it
    came from as RocketMQ's DLQ properties."""
    dlq = DLQ_PREFIX + group
    try:
        topics.partition_count(broker, dlq)
    except TxlogError as exc:
        if exc.code is not ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise
        try:
            topics.create_topic(broker, dlq, DLQ_PARTITIONS)
        except TxlogError as made:
            if made.code is ErrorCode.INVALID_TOPIC_EXCEPTION:
                log.warning(
                    "group %r has no dead-letter topic (%s): %s-%s@%s archived without a copy",
                    group,
                    made.message,
                    topic,
                    partition,
                    record.offset,
                )
                return
            if made.code is not ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
    origin = (
        (DLQ_ORIGIN_TOPIC, topic.encode()),
        (DLQ_ORIGIN_MESSAGE_ID, receiving.message_id_of(topic, partition, record).encode()),
    )
    headers = tuple((k, v) for k, v in record.headers if k not in (DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID)) + origin
    produce.produce_to_topic(broker, dlq, [NewRecord(record.key, record.value, headers, record.timestamp_ms)])
