"""The gateway's gRPC server: RocketMQ 5's MessagingService (grpc.aio), one translation per RPC.

- Served: QueryRoute, Heartbeat, Telemetry (a client's Settings answered, ``settings``; the
  gateway's check-backs pushed, ``transactions``), NotifyClientTermination, SendMessage of NORMAL,
  FIFO and TRANSACTION messages, EndTransaction. Every other RPC answers gRPC's UNIMPLEMENTED
  (``UNSERVED``), which the clients report as such.
- Every RPC answers a RocketMQ status: a condition of the protocol (``RocketMQError``) with its
  code, a txlog error with its RocketMQ counterpart (``status.of_error``), anything else
  INTERNAL_SERVER_ERROR, logged. No RPC ends the process.
- Services run in a thread pool the size of the database pool, never on the event loop.
- Routing: every topic is served by every gateway, its queues the topic's partitions, each
  readable and writable, accepting NORMAL, FIFO and TRANSACTION messages. The queues' broker is one logical broker
  (``BROKER_NAME``, id 0: the master, as clients require) whose endpoints are this gateway's
  advertised address — TXLOG_ROCKETMQ_ADVERTISED_HOST, else the listen host, or, listening on
  every address, the access point the client asked through (as RocketMQ's proxy answers).
- Sends: a message's partition is chosen by the produce path (round-robin over the topic's
  partitions for a record without a key, as the proxy spreads messages over queues; a FIFO
  message's key, its message group, by Kafka's murmur2 partitioner); a TRANSACTION message is a
  half message (``transactions``); the
  receipt carries the client's message id and the record's offset. RocketMQ's answer names no
  queue: the receipt's queue is the one the client picked to route the call, as against a proxy.
- SIGTERM or SIGINT: stop accepting, let calls in progress finish (a few seconds at most).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import grpc

from api.rocketmq import messages, settings, transactions
from api.rocketmq.clients import Clients
from api.rocketmq.status import RocketMQError, of_error, status
from app.errors import TxlogError
from app.services import Broker, produce, topics
from app.wire.rocketmq.protocol import AddressScheme, Code, MessageType, Permission, definition, service, service_grpc

log = logging.getLogger("txlog.rocketmq")

DEFAULT_PORT = 8081  # RocketMQ proxy's gRPC port
BROKER_NAME = "txlog"
MASTER_BROKER_ID = 0
SHUTDOWN_GRACE_S = 5.0
# The message types a topic's queues accept, as QueryRoute answers them: every topic is served as
# a RocketMQ 5 topic of the MIXED type (NORMAL, FIFO, DELAY, TRANSACTION), less DELAY until
# delayed delivery is served (the client refuses to send a type its queue does not list).
ACCEPTED_MESSAGE_TYPES = (MessageType.NORMAL, MessageType.FIFO, MessageType.TRANSACTION)
CLIENT_ID = "x-mq-client-id"
SENT_TYPES = frozenset(ACCEPTED_MESSAGE_TYPES)

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


def endpoints(host: str, port: int) -> Any:
    return definition.Endpoints(scheme=_address_scheme(host), addresses=[definition.Address(host=host.strip("[]"), port=port)])


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

    # -- routing -------------------------------------------------------------------------------

    @_answered(service.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        topic = messages.topic_of(request.topic)
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
        group = request.group.name if request.HasField("group") else None
        self.clients.seen(_client_id(context), request.client_type, group)
        return service.HeartbeatResponse(status=status())

    @_answered(service.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        self.clients.terminated(_client_id(context))
        return service.NotifyClientTerminationResponse(status=status())

    async def Telemetry(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """The client's commands in, the gateway's out: a Settings is answered with the server's
        settings (``settings.answer``); the gateway's own commands are pushed through
        ``Clients.push``. The stream lasts until either side ends it."""
        try:
            client_id = _client_id(context)
        except RocketMQError as exc:
            yield service.TelemetryCommand(status=status(exc.code, exc.message))
            return
        outgoing = self.clients.open_stream(client_id)
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
                    answer = settings.answer(command.settings, self.broker.settings.max_value_bytes)
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
        for o in outgoing:
            if o.message_type not in SENT_TYPES:
                raise RocketMQError(
                    Code.UNSUPPORTED,
                    f"{messages.message_type_name(o.message_type)} messages are not served yet (NORMAL, FIFO and TRANSACTION are)",
                )
        if outgoing[0].message_type == MessageType.TRANSACTION:
            return await self._send_half_messages(request, outgoing)
        if any(o.message_type == MessageType.TRANSACTION for o in outgoing):
            raise RocketMQError(Code.BAD_REQUEST, "transactional and other messages cannot share a request")
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

    @_answered(service.EndTransactionResponse)
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        client_id = _client_id(context, required=False)
        if client_id:
            self.clients.seen(client_id)
        answered = await self.gateway.blocking(transactions.end_transaction, self.gateway, request)
        if answered is not None:
            self.gateway.check_backs.answered(request.transaction_id, answered)
        return service.EndTransactionResponse(status=status())


# The MessagingService's other RPCs: answered UNIMPLEMENTED by name, as the generated servicer
# would, without the traceback it logs for each.
UNSERVED = (
    "QueryAssignment",
    "ReceiveMessage",
    "AckMessage",
    "ForwardMessageToDeadLetterQueue",
    "PullMessage",
    "UpdateOffset",
    "GetOffset",
    "QueryOffset",
    "ChangeInvisibleDuration",
    "RecallMessage",
    "SyncLiteSubscription",
)


def _unserved(name: str) -> Callable[..., Awaitable[None]]:
    async def rpc(self: MessagingService, request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not served by txlog's RocketMQ gateway yet")

    rpc.__name__ = rpc.__qualname__ = name
    return rpc


for _name in UNSERVED:
    setattr(MessagingService, _name, _unserved(_name))


class Gateway:
    """The gRPC server of one gateway process and what its RPCs share."""

    def __init__(self, broker: Broker, executor: ThreadPoolExecutor | None = None) -> None:
        self.broker = broker
        self.executor = executor
        self.clients = Clients()
        self.check_backs = transactions.CheckBacks(self)
        self.advertised: tuple[str, int] | None = None
        self._listen_host = ""
        self._server: grpc.aio.Server | None = None

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))

    def endpoints(self, asked: Any = None) -> Any:
        """Where clients are routed: the advertised address, else (listening on every address)
        the access point the client asked through, on this gateway's port."""
        assert self.advertised is not None
        host, port = self.advertised
        if host or asked is None or not asked.addresses:
            return endpoints(host or self._listen_host, port)
        return endpoints(asked.addresses[0].host, port)

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
        await server.start()
        self._server = server
        self.check_backs.start()
        self._listen_host = host
        every = host in ("", "0.0.0.0", "::")
        self.advertised = (advertised_host or ("" if every else host), bound)
        return int(bound)

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        await self.check_backs.stop()
        self.clients.close()  # Telemetry streams end now, not after the grace
        if self._server is not None:
            await self._server.stop(grace_s)


async def serve(broker: Broker, host: str, port: int, advertised_host: str | None = None) -> None:
    """Run a gateway on ``host:port`` until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    with ThreadPoolExecutor(max_workers=broker.settings.db_pool_size, thread_name_prefix="txlog-rocketmq") as executor:
        gateway = Gateway(broker, executor)
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
