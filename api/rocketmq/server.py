"""The gateway's gRPC server: RocketMQ 5's MessagingService (grpc.aio), one translation per RPC.

- Served: QueryRoute, Heartbeat, Telemetry (a client's Settings answered, ``settings``; the
  gateway's check-backs pushed, ``transactions``), NotifyClientTermination, SendMessage of NORMAL,
  FIFO, DELAY and TRANSACTION messages, EndTransaction. Every other RPC answers gRPC's UNIMPLEMENTED
  (``UNSERVED``), which the clients report as such.
- Every RPC answers a RocketMQ status: a condition of the protocol (``RocketMQError``) with its
  code, a txlog error with its RocketMQ counterpart (``status.of_error``), anything else
  INTERNAL_SERVER_ERROR, logged (``rpc.answered``). No RPC ends the process.
- Identity (TXLOG_AUTH=token): every RPC's call is signed by a principal and checked by the ACL
  rule of its Kafka counterpart before it does anything else with the store (``identity``);
  check-backs go only to producers whose signer may answer them. Without it nothing is checked.
- Services run in a thread pool the size of the database pool, never on the event loop.
- Routing: every topic is served by every gateway, its queues the topic's partitions, each
  readable and writable, accepting NORMAL, FIFO, DELAY and TRANSACTION messages. The queues' broker is one logical broker
  (``rpc.BROKER_NAME``, id 0: the master, as clients require) whose endpoints are this gateway's
  advertised address — TXLOG_ROCKETMQ_ADVERTISED_HOST, else the listen host, or, listening on
  every address, the access point the client asked through (as RocketMQ's proxy answers).
- Sends: a message's partition is chosen by the produce path (round-robin over the topic's
  partitions for a record without a key, as the proxy spreads messages over queues; a FIFO
  message's key, its message group, by Kafka's murmur2 partitioner); a TRANSACTION message is a
  half message (``transactions``), and so is a DELAY message until its delivery time; the
  receipt carries the client's message id and the record's offset. RocketMQ's answer names no
  queue: the receipt's queue is the one the client picked to route the call, as against a proxy.
- Consumers (the simple consumer's RPCs, and the push consumer's QueryAssignment): a consumer
  group is the share group of the same name, a message queue a partition, every delivery the
  share groups' state machine (``consumers``).
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

from api.rocketmq import identity, messages, peers, renewer, settings, transactions
from api.rocketmq.clients import Client, Clients
from api.rocketmq.consumers import Consumers
from api.rocketmq.rpc import ACCEPTED_MESSAGE_TYPES, answered, client_id_of
from api.rocketmq.status import RocketMQError, of_error, status
from app.errors import TxlogError
from app.services import Broker, fetch, produce, topics
from app.services.notify import AppendNotifier
from app.services.security import Authorizer
from app.wire.rocketmq.protocol import AddressScheme, Code, MessageType, definition, service, service_grpc

log = logging.getLogger("txlog.rocketmq")

DEFAULT_PORT = 8081  # RocketMQ proxy's gRPC port
SHUTDOWN_GRACE_S = 5.0
SENT_TYPES = frozenset(ACCEPTED_MESSAGE_TYPES)

T = TypeVar("T")


class ListenError(OSError):
    """The gateway cannot listen on the address it was given."""


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


class MessagingService(Consumers, service_grpc.MessagingServiceServicer):  # generated (untyped)
    """``apache.rocketmq.v2.MessagingService``: each RPC translated into service calls."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(gateway)
        self.gateway: Gateway = gateway  # the whole gateway: check-backs too

    # -- routing -------------------------------------------------------------------------------

    @answered(service.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        topic = messages.topic_of(request.topic)
        await self._authorize(context, "QueryRoute", topic)
        client_id = client_id_of(context, required=False)
        if client_id:
            self.clients.seen(client_id)
        partitions = await self.gateway.blocking(topics.partition_count, self.broker, topic)
        queues = [self._queue(topic, partition, request.endpoints) for partition in range(partitions)]
        return service.QueryRouteResponse(status=status(), message_queues=queues)

    # -- clients -------------------------------------------------------------------------------

    @answered(service.HeartbeatResponse)
    async def Heartbeat(self, request: Any, context: Any) -> Any:
        await self._authorize(context, "Heartbeat")
        group = request.group.name if request.HasField("group") else None
        self.clients.seen(client_id_of(context), request.client_type, group)
        return service.HeartbeatResponse(status=status())

    @answered(service.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        await self._authorize(context, "NotifyClientTermination")
        self.clients.terminated(client_id_of(context))
        return service.NotifyClientTerminationResponse(status=status())

    async def Telemetry(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """The client's commands in, the gateway's out: a Settings is answered with the server's
        settings (``settings.answer``); the gateway's own commands are pushed through
        ``Clients.push``. The stream lasts until either side ends it."""
        try:
            client_id = client_id_of(context)
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

    @answered(service.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        client_id = client_id_of(context, required=False)
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

    @answered(service.EndTransactionResponse)
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        await self._authorize(context, "EndTransaction", messages.topic_of(request.topic))
        client_id = client_id_of(context, required=False)
        if client_id:
            self.clients.seen(client_id)
        answered = await self.gateway.blocking(transactions.end_transaction, self.gateway, request)
        if answered is not None:
            self.gateway.check_backs.answered(request.transaction_id, answered)
        return service.EndTransactionResponse(status=status())


# The MessagingService's other RPCs: answered UNIMPLEMENTED by name, as the generated servicer
# would, without the traceback it logs for each.
UNSERVED = ("PullMessage", "UpdateOffset", "GetOffset", "QueryOffset", "RecallMessage", "SyncLiteSubscription")


def _unserved(name: str) -> Callable[..., Awaitable[None]]:
    async def rpc(self: MessagingService, request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not served by txlog's RocketMQ gateway yet")

    rpc.__name__ = rpc.__qualname__ = name
    return rpc


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
