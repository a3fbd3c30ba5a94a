"""The gateway's gRPC server: RocketMQ 5's MessagingService (grpc.aio), one translation per RPC.

- Served: QueryRoute, Heartbeat, Telemetry (a client's Settings answered, ``settings``; the
  gateway's check-backs pushed, ``transactions``), NotifyClientTermination, SendMessage of NORMAL,
  FIFO, DELAY and TRANSACTION messages, EndTransaction. Every other RPC answers gRPC's UNIMPLEMENTED
  (``UNSERVED``), which the clients report as such.
- Every RPC answers a RocketMQ status: a condition of the protocol (``RocketMQError``) with its
  code, a txlog error with its RocketMQ counterpart (``status.of_error``), anything else
  INTERNAL_SERVER_ERROR, logged. No RPC ends the process.
- Identity (TXLOG_AUTH=token): every RPC's call is signed by a principal and checked by the ACL
  rule of its Kafka counterpart before it does anything else with the store (``identity``);
  check-backs go only to producers whose signer may answer them. Without it nothing is checked.
- Services run in a thread pool the size of the database pool, never on the event loop.
- Routing: every topic is served by every gateway, its queues the topic's partitions, each
  readable and writable, accepting NORMAL, FIFO, DELAY and TRANSACTION messages. The queues' broker is one logical broker
  (``BROKER_NAME``, id 0: the master, as clients require) whose endpoints are this gateway's
  advertised address — TXLOG_ROCKETMQ_ADVERTISED_HOST, else the listen host, or, listening on
  every address, the access point the client asked through (as RocketMQ's proxy answers).
- Sends: a message's partition is chosen by the produce path (round-robin over the topic's
  partitions for a record without a key, as the proxy spreads messages over queues; a FIFO
  message's key, its message group, by Kafka's murmur2 partitioner); a TRANSACTION message is a
  half message (``transactions``), and so is a DELAY message until its delivery time; the
  receipt carries the client's message id and the record's offset. RocketMQ's answer names no
  queue: the receipt's queue is the one the client picked to route the call, as against a proxy.
- Consumers (the simple consumer's RPCs, and the push consumer's QueryAssignment): a consumer
  group is the share group of the same name, a message queue a partition, and every delivery is
  the share groups' state machine (``app.services.share``), read_committed: ReceiveMessage is a
  long-polled acquisition locked for the invisible duration, AckMessage an ACCEPT,
  ChangeInvisibleDuration a RENEW for the new duration, ForwardMessageToDeadLetterQueue a copy to
  the group's dead-letter topic (``DLQ_PREFIX`` + group) and a REJECT (``receiving`` holds the
  receipt handles and tag filters). A message a receive acquires for a delivery beyond the
  group's maximum attempts is not streamed but copied to the dead-letter topic and REJECTed, as
  a proxy pops it to the DLQ. A receive with auto_renew (the push consumer's) locks for
  TXLOG_ROCKETMQ_DEFAULT_INVISIBLE_MS, and its messages' locks are renewed in the background while
  the client holds them (``renewer``), returned promptly when it goes offline.
- SIGTERM or SIGINT: stop accepting, let calls in progress finish (a few seconds at most).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import grpc

from api.rocketmq import identity, messages, peers, receiving, renewer, settings, transactions
from api.rocketmq.clients import Client, Clients
from api.rocketmq.status import RocketMQError, of_error, status
from app.domain.acls import StoredPrincipal
from app.domain.records import NewRecord
from app.domain.share_partition import AcknowledgementBatch, AcknowledgeType
from app.errors import ErrorCode, TxlogError
from app.services import Broker, fetch, produce, share, topics
from app.services.notify import AppendNotifier
from app.services.security import Authorizer
from app.wire.rocketmq.protocol import AddressScheme, Code, MessageType, Permission, definition, service, service_grpc

log = logging.getLogger("txlog.rocketmq")

DEFAULT_PORT = 8081  # RocketMQ proxy's gRPC port
BROKER_NAME = "txlog"
MASTER_BROKER_ID = 0
SHUTDOWN_GRACE_S = 5.0
# The message types a topic's queues accept, as QueryRoute answers them: every topic is served as
# a RocketMQ 5 topic of the MIXED type (the client refuses to send a type its queue does not list).
ACCEPTED_MESSAGE_TYPES = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)
CLIENT_ID = "x-mq-client-id"
SENT_TYPES = frozenset(ACCEPTED_MESSAGE_TYPES)
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

T = TypeVar("T")


class ListenError(OSError):
    """The gateway cannot listen on the address it was given."""


def _metadata(context: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in context.invocation_metadata() or ()}


def _client_id(context: Any, required: bool = True) -> str:
    client_id = _metadata(context).get(CLIENT_ID, "")
    if not client_id and required:
        raise RocketMQError(Code.CLIENT_ID_REQUIRED, f"the call carries no {CLIENT_ID}")
    return client_id


def _address_scheme(host: str) -> int:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return AddressScheme.DOMAIN_NAME
    return AddressScheme.IPv4 if ip.version == 4 else AddressScheme.IPv6


def endpoints(host: str, port: int, others: list[tuple[str, int]] | None = None) -> Any:
    """``host``:``port`` first, then each of ``others`` of the same address scheme: one Endpoints
    names addresses of one scheme, and a domain name alone (the clients refuse several)."""
    scheme = _address_scheme(host)
    addresses = [(host.strip("[]"), port)]
    if scheme != AddressScheme.DOMAIN_NAME:
        addresses += [
            (h.strip("[]"), p) for h, p in others or () if _address_scheme(h) == scheme and (h.strip("[]"), p) not in addresses
        ]
    return definition.Endpoints(scheme=scheme, addresses=[definition.Address(host=h, port=p) for h, p in addresses])


def _answered(response: Callable[..., Any]) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """A unary RPC whose failures are answered as ``response(status=...)``, never raised."""

    def wrap(rpc: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(rpc)
        async def answered(self: MessagingService, request: Any, context: Any) -> Any:
            try:
                return await rpc(self, request, context)
            except RocketMQError as exc:
                return response(status=status(exc.code, exc.message))
            except TxlogError as exc:
                return response(status=of_error(exc))
            except Exception:
                log.exception("%s failed", rpc.__name__)
                return response(status=status(Code.INTERNAL_SERVER_ERROR, "internal error (logged by the gateway)"))

        return answered

    return wrap


class MessagingService(service_grpc.MessagingServiceServicer):  # generated (untyped)
    """``apache.rocketmq.v2.MessagingService``: each RPC translated into service calls."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.broker = gateway.broker
        self.clients = gateway.clients

    # -- identity ------------------------------------------------------------------------------

    async def _authorize(
        self, context: Any, rpc: str, topic: str | None = None, group: str | None = None
    ) -> StoredPrincipal | None:
        """With TXLOG_AUTH=token: the call's signer, allowed ``rpc`` on ``topic`` for ``group``
        (``identity``); without, nothing is checked (None)."""
        authorizer = self.gateway.authorizer
        if authorizer is None:
            return None
        return await self.gateway.blocking(identity.authorize, authorizer, _metadata(context), rpc, topic, group)

    # -- routing -------------------------------------------------------------------------------

    @_answered(service.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        topic = messages.topic_of(request.topic)
        await self._authorize(context, "QueryRoute", topic)
        client_id = _client_id(context, required=False)
        if client_id:
            self.clients.seen(client_id)
        partitions = await self.gateway.blocking(topics.partition_count, self.broker, topic)
        broker = definition.Broker(name=BROKER_NAME, id=MASTER_BROKER_ID, endpoints=self.gateway.endpoints(request.endpoints))
        queues = [
            definition.MessageQueue(
                topic=definition.Resource(name=topic),
                id=partition,
                permission=Permission.READ_WRITE,
                broker=broker,
                accept_message_types=ACCEPTED_MESSAGE_TYPES,
            )
            for partition in range(partitions)
        ]
        return service.QueryRouteResponse(status=status(), message_queues=queues)

    # -- clients -------------------------------------------------------------------------------

    @_answered(service.HeartbeatResponse)
    async def Heartbeat(self, request: Any, context: Any) -> Any:
        await self._authorize(context, "Heartbeat")
        group = request.group.name if request.HasField("group") else None
        self.clients.seen(_client_id(context), request.client_type, group)
        return service.HeartbeatResponse(status=status())

    @_answered(service.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        await self._authorize(context, "NotifyClientTermination")
        self.clients.terminated(_client_id(context))
        return service.NotifyClientTerminationResponse(status=status())

    async def Telemetry(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """The client's commands in, the gateway's out: a Settings is answered with the server's
        settings (``settings.answer``); the gateway's own commands are pushed through
        ``Clients.push``. The stream lasts until either side ends it."""
        try:
            client_id = _client_id(context)
            principal = await self._authorize(context, "Telemetry")
        except RocketMQError as exc:
            yield service.TelemetryCommand(status=status(exc.code, exc.message))
            return
        except TxlogError as exc:
            yield service.TelemetryCommand(status=of_error(exc))
            return
        outgoing = self.clients.open_stream(client_id)
        self.clients.seen(client_id).principal = principal.name if principal is not None else None
        reader = asyncio.create_task(self._read_telemetry(client_id, request_iterator, outgoing))
        try:
            while True:
                command = await outgoing.get()
                if command is None:
                    return
                yield command
        finally:
            reader.cancel()
            self.clients.close_stream(client_id, outgoing)

    async def _read_telemetry(self, client_id: str, commands: AsyncIterator[Any], outgoing: asyncio.Queue[Any]) -> None:
        try:
            async for command in commands:
                if command.HasField("settings"):
                    self.clients.settings(client_id, command.settings)
                    attempts = await self._max_delivery_attempts(command.settings)
                    answer = settings.answer(command.settings, self.broker.settings.max_value_bytes, attempts)
                    await outgoing.put(service.TelemetryCommand(status=status(), settings=answer))
                else:
                    self.clients.seen(client_id)
                    log.debug("telemetry from %s: %s not served", client_id, command.WhichOneof("command"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away mid-stream
            log.debug("telemetry from %s ended: %s", client_id, exc)
        await outgoing.put(None)

    # -- producers -----------------------------------------------------------------------------

    @_answered(service.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        client_id = _client_id(context, required=False)
        if client_id:
            self.clients.seen(client_id)
        if not request.messages:
            raise RocketMQError(Code.BAD_REQUEST, "the request carries no message")
        limit = self.broker.settings.max_value_bytes
        outgoing = [messages.translate(m, limit) for m in request.messages]
        topic = outgoing[0].topic
        if any(o.topic != topic for o in outgoing):
            raise RocketMQError(Code.BAD_REQUEST, "the messages of one request must share their topic")
        transactional = outgoing[0].message_type == MessageType.TRANSACTION
        await self._authorize(context, "SendHalfMessage" if transactional else "SendMessage", topic)
        for o in outgoing:
            if o.message_type not in SENT_TYPES:
                raise RocketMQError(
                    Code.UNSUPPORTED,
                    f"{messages.message_type_name(o.message_type)} messages are not served (NORMAL, FIFO, DELAY and TRANSACTION are)",
                )
        if outgoing[0].message_type == MessageType.TRANSACTION:
            return await self._send_half_messages(request, outgoing)
        if any(o.message_type == MessageType.TRANSACTION for o in outgoing):
            raise RocketMQError(Code.BAD_REQUEST, "transactional and other messages cannot share a request")
        if any(o.message_type == MessageType.DELAY for o in outgoing):
            return await self._send_delayed_messages(outgoing)
        entries = []
        # A batch goes to one partition: NORMAL messages together, a FIFO message with its group's.
        batches: list[list[messages.Outgoing]] = []
        for o in outgoing:
            if batches and batches[-1][0].record.key == o.record.key:
                batches[-1].append(o)
            else:
                batches.append([o])
        for batch in batches:
            result = await self.gateway.blocking(produce.produce_to_topic, self.broker, topic, [o.record for o in batch])
            entries += [
                service.SendResultEntry(status=status(), message_id=o.message_id, offset=result.base_offset + i)
                for i, o in enumerate(batch)
            ]
        return service.SendMessageResponse(status=status(), entries=entries)

    async def _send_half_messages(self, request: Any, outgoing: list[messages.Outgoing]) -> Any:
        """TRANSACTION messages: half messages in the store (``transactions``)."""
        if any(o.message_type != MessageType.TRANSACTION for o in outgoing):
            raise RocketMQError(Code.BAD_REQUEST, "transactional and other messages cannot share a request")
        entries = [
            await self.gateway.blocking(transactions.send_half_message, self.gateway, o, m)
            for o, m in zip(outgoing, request.messages)
        ]
        return service.SendMessageResponse(status=status(), entries=entries)

    async def _send_delayed_messages(self, outgoing: list[messages.Outgoing]) -> Any:
        """DELAY messages: held in the half-message store until their delivery time (``transactions``)."""
        if any(o.message_type != MessageType.DELAY for o in outgoing):
            raise RocketMQError(Code.BAD_REQUEST, "delayed and other messages cannot share a request")
        entries = [await self.gateway.blocking(transactions.send_delayed_message, self.gateway, o) for o in outgoing]
        return service.SendMessageResponse(status=status(), entries=entries)

    @_answered(service.EndTransactionResponse)
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        await self._authorize(context, "EndTransaction", messages.topic_of(request.topic))
        client_id = _client_id(context, required=False)
        if client_id:
            self.clients.seen(client_id)
        answered = await self.gateway.blocking(transactions.end_transaction, self.gateway, request)
        if answered is not None:
            self.gateway.check_backs.answered(request.transaction_id, answered)
        return service.EndTransactionResponse(status=status())

    # -- consumers -----------------------------------------------------------------------------

    async def _max_delivery_attempts(self, sent: Any) -> int | None:
        """A consumer group's maximum delivery attempts (``receiving.max_attempts`` of its
        share.delivery.count.limit; None for a producer, or with the database away: the answer
        goes without it)."""
        if not sent.HasField("subscription") or not sent.subscription.group.name:
            return None
        try:
            config = await self.gateway.blocking(share.group_config, self.broker, sent.subscription.group.name)
        except TxlogError as exc:
            log.debug("settings of group %r without its delivery limit: %s", sent.subscription.group.name, exc)
            return None
        return receiving.max_attempts(config.delivery.delivery_count_limit)

    @_answered(service.QueryAssignmentResponse)
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        """One assignment, every queue of the topic (queue id -1), as a proxy assigns a non-FIFO
        group's consumers: the share group spreads the messages over them, not the assignment."""
        topic = messages.topic_of(request.topic)
        group = _group_of(request.group)
        await self._authorize(context, "QueryAssignment", topic, group)
        self.clients.seen(_client_id(context), group=group)
        await self.gateway.blocking(topics.partition_count, self.broker, topic)
        broker = definition.Broker(name=BROKER_NAME, id=MASTER_BROKER_ID, endpoints=self.gateway.endpoints(request.endpoints))
        queue = definition.MessageQueue(
            topic=definition.Resource(name=topic),
            id=ALL_QUEUES,
            permission=Permission.READ_WRITE,
            broker=broker,
            accept_message_types=ACCEPTED_MESSAGE_TYPES,
        )
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
        client_id, group = _client_id(context), _group_of(request.group)
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
        client_id = _client_id(context)
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
        config = await self.gateway.blocking(share.group_config, self.broker, group)
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

    @_answered(service.AckMessageResponse)
    async def AckMessage(self, request: Any, context: Any) -> Any:
        """Each entry ACCEPTed on its own; the answer's status is the entries' one code, or
        MULTIPLE_RESULTS, as a proxy answers."""
        group = _group_of(request.group)
        topic = messages.topic_of(request.topic)
        await self._authorize(context, "AckMessage", topic, group)
        client_id = _client_id(context)
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

    @_answered(service.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        """The lock renewed for the new duration from now (RENEW): the message comes again when
        it ends, unless acknowledged. The handle answered names the same acquisition."""
        group = _group_of(request.group)
        topic = messages.topic_of(request.topic)
        await self._authorize(context, "ChangeInvisibleDuration", topic, group)
        client_id = _client_id(context)
        self.clients.seen(client_id, group=group)
        ms = _checked_invisible_ms(request.invisible_duration.ToMilliseconds())
        handle = await self._settle(client_id, group, topic, request.receipt_handle, AcknowledgeType.RENEW, ms)
        return service.ChangeInvisibleDurationResponse(status=status(), receipt_handle=handle.encode())

    @_answered(service.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        """The message copied to the group's dead-letter topic (made with one partition when
        missing), then REJECTed (archived, never delivered again). The lock is renewed first, so
        a handle that no longer holds the message writes no copy. A group whose name no topic
        name can hold (RocketMQ allows ``%`` and ``|``) has its message archived without a copy."""
        group = _group_of(request.group)
        topic = messages.topic_of(request.topic)
        await self._authorize(context, "ForwardMessageToDeadLetterQueue", topic, group)
        client_id = _client_id(context)
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


# The MessagingService's other RPCs: answered UNIMPLEMENTED by name, as the generated servicer
# would, without the traceback it logs for each.
UNSERVED = ("PullMessage", "UpdateOffset", "GetOffset", "QueryOffset", "RecallMessage", "SyncLiteSubscription")


def _unserved(name: str) -> Callable[..., Awaitable[None]]:
    async def rpc(self: MessagingService, request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not served by txlog's RocketMQ gateway yet")

    rpc.__name__ = rpc.__qualname__ = name
    return rpc


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


for _name in UNSERVED:
    setattr(MessagingService, _name, _unserved(_name))


class Gateway:
    """The gRPC server of one gateway process and what its RPCs share."""

    def __init__(self, broker: Broker, executor: ThreadPoolExecutor | None = None, authorizer: Authorizer | None = None) -> None:
        self.broker = broker
        self.executor = executor
        self.clients = Clients()
        self.check_backs = transactions.CheckBacks(self)
        self.renewer = renewer.Renewer(self)  # push consumers' receipt handles
        self.peers = peers.Peers(self)
        self.advertised: tuple[str, int] | None = None
        self.notifier: AppendNotifier | None = None  # wakes receives waiting for records
        # Principals and ACLs (TXLOG_AUTH=token); None: no one is authenticated, all is allowed.
        self.authorizer = authorizer
        self._listen_host = ""
        self._server: grpc.aio.Server | None = None

    def may_answer_check_back(self, client: Client, topic: str) -> bool:
        """A check-back carries the half message: with TXLOG_AUTH=token it goes only to a producer
        whose signer may answer it (EndTransaction's rule on the topic)."""
        if self.authorizer is None:
            return True
        return client.principal is not None and identity.allowed(self.authorizer, client.principal, "EndTransaction", topic)

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))

    def endpoints(self, asked: Any = None) -> Any:
        """Where clients are routed: this gateway — its advertised address, else (listening on
        every address) the access point the client asked through, on its port — then every other
        live gateway of the registry (``peers``)."""
        assert self.advertised is not None
        host, port = self.advertised
        if not host:
            host = self._listen_host if asked is None or not asked.addresses else asked.addresses[0].host
        return endpoints(host, port, self.peers.others)

    async def start(self, host: str, port: int, advertised_host: str | None = None) -> int:
        """Listen on ``host:port``; answer the bound port (the one chosen when ``port`` is 0)."""
        limit = self.broker.settings.rocketmq_max_inbound_message_bytes
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)])
        service_grpc.add_MessagingServiceServicer_to_server(MessagingService(self), server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ListenError(f"cannot listen on {address}: {exc}") from exc
        if not bound:
            raise ListenError(f"cannot listen on {address}")
        if self.authorizer is not None:
            await self.blocking(self.authorizer.refresh)
            self.authorizer.start()
        await server.start()
        self._server = server
        self.check_backs.start()
        self.renewer.start()
        self._listen_host = host
        every = host in ("", "0.0.0.0", "::")
        self.advertised = (advertised_host or ("" if every else host), bound)
        await self.peers.start((self.advertised[0], bound) if self.advertised[0] else None)
        self._start_notifier()
        return int(bound)

    @property
    def listen_host(self) -> str:
        return self._listen_host

    def _start_notifier(self) -> None:
        """The process's listener for appends, as the HTTP API's and the Kafka gateway's: one
        long-poll wait for every way in."""
        if self.broker.settings.database_url:
            self.notifier = AppendNotifier(
                self.broker.settings.database_url, functools.partial(fetch.listen, self.broker), self.blocking
            )
            self.notifier.start()

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        await self.peers.stop()
        await self.check_backs.stop()
        await self.renewer.stop()  # before the clients are closed: their locks are left to end
        self.clients.close()  # Telemetry streams end now, not after the grace
        if self._server is not None:
            await self._server.stop(grace_s)
        if self.notifier is not None:
            await self.notifier.stop()
        if self.authorizer is not None:
            self.authorizer.stop()


async def serve(broker: Broker, host: str, port: int, advertised_host: str | None = None) -> None:
    """Run a gateway on ``host:port`` until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    with ThreadPoolExecutor(max_workers=broker.settings.db_pool_size, thread_name_prefix="txlog-rocketmq") as executor:
        authorizer = Authorizer(broker.db) if broker.settings.auth == "token" else None
        gateway = Gateway(broker, executor, authorizer)
        bound = await gateway.start(host, port, advertised_host)
        log.info("RocketMQ gateway listening on %s:%d (MessagingService over gRPC)", host, bound)
        try:
            await stop.wait()
        finally:
            log.info("RocketMQ gateway stopping")
            await gateway.stop()
            log.info("RocketMQ gateway stopped")


def run(broker: Broker, host: str, port: int, advertised_host: str | None = None) -> None:
    asyncio.run(serve(broker, host, port, advertised_host))
