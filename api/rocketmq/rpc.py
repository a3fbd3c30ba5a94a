"""What every RPC of the gateway's MessagingService shares (``server``, ``consumers``): the client
id a call carries, a failure answered as a RocketMQ status, the signer's check, and the one logical
broker whose queues every topic is routed to."""

from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from api.rocketmq import identity
from api.rocketmq.clients import Clients
from api.rocketmq.renewer import Renewer
from api.rocketmq.status import RocketMQError, of_error, status
from app.domain.acl_bindings import StoredPrincipal
from app.errors import TxlogError
from app.services import Broker
from app.services.notify import AppendNotifier
from app.services.security import Authorizer
from app.wire.rocketmq.protocol import Code, MessageType, Permission, definition

log = logging.getLogger("txlog.rocketmq")

BROKER_NAME = "txlog"
MASTER_BROKER_ID = 0
# The message types a topic's queues accept, as QueryRoute answers them: every topic is served as
# a RocketMQ 5 topic of the MIXED type (the client refuses to send a type its queue does not list).
ACCEPTED_MESSAGE_TYPES = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)
CLIENT_ID = "x-mq-client-id"

T = TypeVar("T")


class Gateway(Protocol):
    """What of the gateway (``server.Gateway``) the RPCs use."""

    broker: Broker
    clients: Clients
    renewer: Renewer
    notifier: AppendNotifier | None
    authorizer: Authorizer | None
    advertised: tuple[str, int] | None

    @property
    def listen_host(self) -> str: ...

    def blocking(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...

    def endpoints(self, asked: Any = None) -> Any: ...


def call_metadata(context: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in context.invocation_metadata() or ()}


def client_id_of(context: Any, required: bool = True) -> str:
    client_id = call_metadata(context).get(CLIENT_ID, "")
    if not client_id and required:
        raise RocketMQError(Code.CLIENT_ID_REQUIRED, f"the call carries no {CLIENT_ID}")
    return client_id


def answered(response: Callable[..., Any]) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """A unary RPC whose failures are answered as ``response(status=...)``, never raised."""

    def wrap(rpc: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(rpc)
        async def answering(self: Service, request: Any, context: Any) -> Any:
            try:
                return await rpc(self, request, context)
            except RocketMQError as exc:
                return response(status=status(exc.code, exc.message))
            except TxlogError as exc:
                return response(status=of_error(exc))
            except Exception:
                log.exception("%s failed", rpc.__name__)
                return response(status=status(Code.INTERNAL_SERVER_ERROR, "internal error (logged by the gateway)"))

        return answering

    return wrap


class Service:
    """The RPCs' common ground: the gateway, and the checks every RPC makes first."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.broker = gateway.broker
        self.clients = gateway.clients

    async def _authorize(
        self, context: Any, rpc: str, topic: str | None = None, group: str | None = None
    ) -> StoredPrincipal | None:
        """With TXLOG_AUTH=token: the call's signer, allowed ``rpc`` on ``topic`` for ``group``
        (``identity``); without, nothing is checked (None)."""
        authorizer = self.gateway.authorizer
        if authorizer is None:
            return None
        return await self.gateway.blocking(identity.authorize, authorizer, call_metadata(context), rpc, topic, group)

    def _queue(self, topic: str, queue_id: int, asked: Any) -> Any:
        """Queue ``queue_id`` of ``topic`` on the logical broker, readable and writable, accepting
        every type served, its endpoints the gateways (``Gateway.endpoints``, ``asked`` the access
        point the client asked through)."""
        broker = definition.Broker(name=BROKER_NAME, id=MASTER_BROKER_ID, endpoints=self.gateway.endpoints(asked))
        return definition.MessageQueue(
            topic=definition.Resource(name=topic),
            id=queue_id,
            permission=Permission.READ_WRITE,
            broker=broker,
            accept_message_types=ACCEPTED_MESSAGE_TYPES,
        )
