"""The gateway's listener: Kafka's framing over TCP, one request at a time per connection.

- A frame is a 4-byte size and that many bytes. A size below a request header or above
  TXLOG_KAFKA_MAX_FRAME_BYTES, or a frame that does not decode, closes that connection only.
- A connection is served one request at a time, as Kafka mutes a channel until it has answered:
  answers leave in the order the requests came. One exception: a Produce request read while
  earlier Produce requests of the same connection are being appended, none of them naming a
  partition it names, is appended at once beside them (up to ``in_flight.PIPELINED_PRODUCE`` at a time),
  so that the loop's group commit shares their commits; its answer still leaves after theirs.
  A client sends a partition's batches in order and Kafka's sequences are per partition, so
  appending distinct partitions together changes no outcome. A request naming a partition in
  flight, and any other request, waits until every answer before it has left; so does every
  Produce while client quotas are set (a throttled answer mutes the connection before the next
  request is read). librdkafka puts one partition in each Produce request and keeps up to five
  in flight with idempotence: over many partitions, several small batches to commit at once.
- Every request is answered, an error included (a ``TxlogError`` with its Kafka code, anything
  else UNKNOWN_SERVER_ERROR, logged), except Produce with acks=0, which is never answered (and
  whose failure closes the connection, as Kafka does, so the client notices).
- A key or version not in the table (``versions``) is answered UNSUPPORTED_VERSION when the codec
  can write that API's answer; ApiVersions of any version is answered (a v0 body with the list),
  and otherwise the connection is closed.
- Services run in a thread pool the size of the database pool, never on the event loop; only an
  append, an AddPartitionsToTxn or an EndTxn planned ahead awaits its one statement on the loop,
  on connections of its own (at most as many as the pool has).
- One LISTEN connection per process (``app.services.notify``), started and stopped with the
  listener, wakes the fetches that long-poll (Fetch's max_wait_ms and min_bytes).
- At most TXLOG_KAFKA_MAX_CONNECTIONS connections: one beyond is closed at once.
- Listeners (``app.domain.listeners``): one server per listener, each of a security protocol.
  TLS (SSL, SASL_SSL) is Python's ``ssl``, TLS 1.2 and later; a handshake not finished within
  TXLOG_KAFKA_SSL_HANDSHAKE_TIMEOUT_MS is cut off by the event loop before any task serves the
  connection. A connection counts against TXLOG_KAFKA_MAX_CONNECTIONS once its handshake is done:
  handshakes under way are bounded by that time, not by the count. On an SSL listener a client
  certificate is the connection's principal, its subject mapped by
  TXLOG_KAFKA_SSL_PRINCIPAL_MAPPING_RULES to an active principal's name (none: the connection is
  closed); with TXLOG_AUTH=token a connection without one (PLAINTEXT, or SSL without a client
  certificate) is Kafka's ANONYMOUS, left to the ACLs.
- Sign-in (SASL_* listeners): before it, a frame is bounded by Kafka's sasl.server.max.receive.size
  and the whole exchange by TXLOG_KAFKA_AUTHENTICATION_TIMEOUT_MS from the accept. A session
  with a lifetime (KIP-368, TXLOG_KAFKA_CONNECTIONS_MAX_REAUTH_MS) that ended closes the
  connection at its next request, as Kafka's ``SocketServer`` does ("expired channel"), unless a
  re-authentication begun in time is under way.
- SIGTERM or SIGINT: give the node id up, stop accepting, let each request in progress be answered
  (a few seconds at most), close the connections.

A read replica (TXLOG_REPLICA_DATABASE_URL, docs/operations.md, Read replicas) reads Fetch and ListOffsets
from that hot standby, on a pool of its own; everything else, its registration and its long
polls' listener included, goes to the primary.

``Cluster`` is the view of the brokers that Metadata and FindCoordinator answer with: the live
gateways of the node registry (``api.kafka.cluster``), in which ``process.serve`` takes its node id before
it answers anyone and which it leaves when it stops; ``SingleNode`` (this process alone) where no
registry is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api.kafka import versions
from api.kafka.cluster import Cluster, SingleNode
from api.kafka.handlers import Node, RequestContext, error_code
from api.kafka.handlers import sasl as sasl_handlers
from api.kafka.handlers.bootstrap import KnownTopics
from api.kafka.handlers.sasl import Session
from api.kafka.in_flight import InFlight
from app.config import Settings
from app.domain import ssl_principal
from app.domain.acl_bindings import ANONYMOUS
from app.domain.listeners import Listener, single
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.services import fetch as fetch_service
from app.services import quotas as quota_service
from app.services.executor import LoopExecutor
from app.services.notify import AppendNotifier
from app.services.security import Authorizer
from app.storage.db import Database, LoopConnections, SessionLimits
from app.wire.kafka.error_responses import api_versions_fallback, error_response
from app.wire.kafka.messages import ApiKey, api_name, has_codec
from app.wire.kafka.requests import HEADER_MIN_BYTES, FrameError, RequestHeader, decode_request, read_header
from app.wire.kafka.structs import encode_response

log = logging.getLogger("txlog.kafka")

IDLE_TIMEOUT_S = 600.0  # Kafka's connections.max.idle.ms
SASL_MAX_RECEIVE_BYTES = 524_288  # Kafka's sasl.server.max.receive.size: a frame before sign-in
SHUTDOWN_GRACE_S = 5.0  # how long a request in progress has to be answered at shutdown


class ListenError(OSError):
    """The gateway cannot listen on the address it was given."""


class CloseConnection(Exception):
    """End this connection without an answer."""


class _Listening:
    """One listener being served: how clients of it see this node and the cluster."""

    def __init__(self, listener: Listener, node: Node, cluster: Cluster) -> None:
        self.listener = listener
        self.node = node
        self.cluster = cluster


_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def _tls_contexts(settings: Settings) -> dict[str, ssl.SSLContext]:
    """The server's TLS, TLS 1.2 and later, by security protocol: SSL asks for client certificates
    as TXLOG_KAFKA_SSL_CLIENT_AUTH says (Kafka's ssl.client.auth); SASL_SSL asks for none, as
    Kafka applies ssl.client.auth to SASL_SSL listeners only when set for the listener alone
    (KIP-684), and its clients sign in with SASL."""
    if not settings.kafka_ssl_certfile or not settings.kafka_ssl_keyfile:
        raise ListenError("TLS listeners need TXLOG_KAFKA_SSL_CERTFILE and TXLOG_KAFKA_SSL_KEYFILE")
    contexts = {}
    for name, client_auth in (("SSL", settings.kafka_ssl_client_auth), ("SASL_SSL", "none")):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile)
            if client_auth != "none":
                if not settings.kafka_ssl_cafile:
                    raise ListenError("client certificates (TXLOG_KAFKA_SSL_CLIENT_AUTH) need TXLOG_KAFKA_SSL_CAFILE")
                context.load_verify_locations(settings.kafka_ssl_cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ListenError(f"cannot load the gateway's TLS files: {exc}") from exc
        context.verify_mode = _CLIENT_AUTH[client_auth]
        contexts[name] = context
    return contexts


class Gateway:
    """The listener and the dispatch of one gateway process."""

    def __init__(
        self,
        broker: Broker,
        node: Node,
        cluster: Cluster | None = None,
        executor: ThreadPoolExecutor | None = None,
        groups: Any = None,
    ) -> None:
        self.broker = broker
        self.settings: Settings = broker.settings
        self.node = node
        self.cluster = cluster or SingleNode(node)
        self.executor = executor
        self.groups = groups
        self.notifier: AppendNotifier | None = None
        self.loop_executor = LoopExecutor(broker, None, self._run_blocking)
        self.known_topics = KnownTopics()
        # Principals and ACLs (TXLOG_AUTH=token); None: no one is authenticated, all is allowed.
        self.authorizer = Authorizer(broker.db) if self.settings.auth == "token" else None
        self.quotas = quota_service.manager_from_settings(broker) if self.settings.database_url else None
        # A read replica (TXLOG_REPLICA_DATABASE_URL): Fetch and ListOffsets read its hot standby,
        # on a pool of their own; everything else goes to the primary (``broker``).
        self.replica = replica_broker(self.settings) if self.settings.replica_database_url else None
        self._muted: dict[asyncio.Task, int] = {}  # connection -> throttle time of the answer just sent
        self.routes = versions.resolve()
        self.api_keys = versions.advertised()
        self._servers: list[asyncio.AbstractServer] = []
        self.listeners: dict[str, _Listening] = {}
        self._mapping_rules = ssl_principal.parse_rules(self.settings.kafka_ssl_principal_mapping_rules)
        self._connections: dict[asyncio.Task, bool] = {}  # task -> busy answering a request
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` as the one listener of ``--listen`` (PLAINTEXT, or
        SASL_PLAINTEXT when authenticating); answer the port (the one chosen when ``port`` is 0)."""
        listener = single(host, port, self.authorizer is not None)
        bound = await self.start_listeners([listener], {listener.name: (self.node.host, port)})
        return bound[listener.name]

    async def start_listeners(self, listeners: list[Listener], advertised: dict[str, tuple[str, int]]) -> dict[str, int]:
        """Listen on each listener, advertised at ``advertised[name]`` (a port 0 there: the bound
        one); the bound port of each, by name. Nothing is left listening if one fails."""
        tls = _tls_contexts(self.settings) if any(listener.tls for listener in listeners) else {}
        bound: dict[str, int] = {}
        try:
            for listener in listeners:
                context = tls.get(listener.security_protocol)
                try:
                    server = await asyncio.start_server(
                        functools.partial(self._connection, listener.name),
                        listener.host or None,
                        listener.port,
                        reuse_address=True,
                        ssl=context,
                        ssl_handshake_timeout=self.settings.kafka_ssl_handshake_timeout_ms / 1000 if context else None,
                    )
                except OSError as exc:
                    raise ListenError(f"cannot listen on {listener}: {exc.strerror or exc}") from exc
                self._servers.append(server)
                port = server.sockets[0].getsockname()[1]
                bound[listener.name] = port
                host, advertised_port = advertised.get(listener.name, (advertised_host(listener.host), 0))
                node = Node(self.node.node_id, host, advertised_port or port, self.node.rack)
                cluster = (
                    self.cluster.for_listener(listener.name)
                    if hasattr(self.cluster, "for_listener")
                    else (SingleNode(node, self.cluster.cluster_id))
                )
                self.listeners[listener.name] = _Listening(listener, node, cluster)
        except BaseException:
            for started in self._servers:
                started.close()
            self._servers.clear()
            raise
        if self.settings.database_url:
            self.notifier = AppendNotifier(
                self.settings.database_url, functools.partial(fetch_service.listen, self.broker), self._run_blocking
            )
            self.notifier.start()
            if self.authorizer is not None:
                self.authorizer.start()
            if self.quotas is not None:
                self.quotas.start()
            self.loop_executor.connections = LoopConnections(
                self.settings.database_url, self.settings.db_pool_size, SessionLimits.from_settings(self.settings)
            )
        return bound

    def _run_blocking(self, fn: Any, *args: Any) -> Any:
        return asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting; connections waiting for a request close now, those answering one close
        once it is answered, or after ``grace_s``."""
        self._closing = True
        for server in self._servers:
            server.close()
        if self.groups is not None:
            self.groups.close()  # parked JoinGroup/SyncGroup requests are answered now, not after the grace
        for task, busy in list(self._connections.items()):
            if not busy:
                task.cancel()
        tasks = list(self._connections)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        if self.notifier is not None:
            await self.notifier.stop()
        if self.authorizer is not None:
            self.authorizer.stop()
        if self.quotas is not None:
            self.quotas.stop()
        connections, self.loop_executor.connections = self.loop_executor.connections, None
        if connections is not None:
            await connections.close()
        if self.replica is not None:
            self.replica.db.dispose()

    # -- connections -------------------------------------------------------------------------------

    async def _connection(self, listener: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if self._closing or len(self._connections) >= self.settings.kafka_max_connections:
            log.warning("refusing a connection from %s: %d connections open", client, len(self._connections))
            writer.close()
            return
        self._connections[task] = False
        try:
            session = await self._session(listener, writer, client)
            await self._serve(reader, writer, client, session)
        except asyncio.CancelledError:
            pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or sent no whole request for IDLE_TIMEOUT_S (or did not sign in in time)
        except CloseConnection as exc:
            log.info("closing the connection from %s: %s", client, exc)
        except FrameError as exc:
            log.warning("closing the connection from %s: %s", client, exc)
        except Exception:
            log.exception("closing the connection from %s", client)
        finally:
            self._connections.pop(task, None)
            self._muted.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _session(self, listener: str, writer: asyncio.StreamWriter, client: str) -> Session:
        """A new connection's authentication, as its listener gives it: SASL listeners sign in
        later; with TXLOG_AUTH=token, a client certificate on an SSL listener is its principal,
        and a connection with none is ANONYMOUS."""
        listening = self.listeners[listener]
        protocol_name = listening.listener.security_protocol
        session = Session(
            listener=listener,
            sasl=listening.listener.sasl,
            sign_in_deadline=time.monotonic() + self.settings.kafka_authentication_timeout_ms / 1000,
        )
        if self.authorizer is None or session.sasl:
            return session
        certificate = writer.get_extra_info("peercert") if protocol_name == "SSL" else None
        if not certificate:
            session.principal = ANONYMOUS
            return session
        name = ssl_principal.distinguished_name(certificate.get("subject", ()))
        try:
            mapped = ssl_principal.map_name(self._mapping_rules, name)
        except ssl_principal.NoMatchingRule as exc:
            raise CloseConnection(f"Failed to authenticate the client certificate of {name}: {exc}") from None
        if not await self._run_blocking(self._is_active_principal, mapped):
            raise CloseConnection(f"The client certificate of {name} maps to {mapped!r}, which is no active principal")
        session.principal = mapped
        return session

    def _is_active_principal(self, name: str) -> bool:
        assert self.authorizer is not None
        return any(p.name == name for p in self.authorizer.snapshot().by_token_id.values())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: str, session: Session) -> None:
        task = asyncio.current_task()
        assert task is not None
        in_flight = InFlight(writer, task, functools.partial(self._connections.__setitem__, task, False))
        try:
            await self._serve_requests(reader, writer, client, session, task, in_flight)
        except asyncio.CancelledError:
            if not in_flight.cancelled_connection:
                raise
            task.uncancel()
        except FrameError:
            await in_flight.settle()  # the answers before a malformed request leave first
            raise
        finally:
            in_flight.cancel()
        if in_flight.failure is not None:
            raise in_flight.failure

    async def _serve_requests(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: str,
        session: Session,
        task: asyncio.Task,
        in_flight: InFlight,
    ) -> None:
        while not self._closing:
            signing_in = self.authorizer is not None and session.principal is None
            # Before sign-in a frame is bounded as Kafka bounds it (sasl.server.max.receive.size),
            # and the whole sign-in by the authentication timeout.
            exchanging = signing_in or session.exchange is not None  # a re-authentication's tokens too
            max_frame = (
                min(self.settings.kafka_max_frame_bytes, SASL_MAX_RECEIVE_BYTES)
                if exchanging
                else (self.settings.kafka_max_frame_bytes)
            )
            wait_s = min(IDLE_TIMEOUT_S, session.sign_in_deadline - time.monotonic()) if signing_in else IDLE_TIMEOUT_S
            in_flight.reading = True
            async with asyncio.timeout(max(wait_s, 0)):  # the next request, whole, within the idle time
                prefix = await reader.readexactly(4)
                size = int.from_bytes(prefix, "big", signed=True)
                if size < (0 if session.raw_tokens else HEADER_MIN_BYTES):
                    raise FrameError(f"a frame of {size} bytes is shorter than a request header")
                if size > max_frame:
                    raise FrameError(f"a frame of {size} bytes is above the {max_frame} bytes allowed")
                frame = await reader.readexactly(size)
            in_flight.reading = False
            throttle_ms = self._muted.pop(task, 0)
            if throttle_ms:  # a Produce appended beside others was throttled as this request came in
                await asyncio.sleep(throttle_ms / 1000)
            if session.expired(time.monotonic()):
                raise CloseConnection(f"Disconnecting expired channel: the session of {session.principal!r} ended")
            self._connections[task] = True
            produce = None if session.raw_tokens else self._pipelinable(frame, session)
            if produce is not None:
                request, partitions = produce
                await in_flight.make_room(partitions)
                in_flight.add(self.answer(frame, client, session, request=request, connection=task), partitions)
            else:
                await in_flight.drain()  # every answer before this one has left
                if session.raw_tokens:
                    answer: bytes | bytearray | None = await self._raw_token(frame, client, session)
                else:
                    answer = await self.answer(frame, client, session)
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
                if session.close_after_answer:
                    raise CloseConnection("after a failed SASL authentication")
            if not in_flight:
                self._connections[task] = False
            throttle_ms = self._muted.pop(task, 0)
            if throttle_ms:  # KIP-219: answered at once, then nothing more is read for that long
                await asyncio.sleep(throttle_ms / 1000)

    def _pipelinable(self, frame: bytes, session: Session) -> tuple[Any, frozenset[tuple[str, int]]] | None:
        """A signed-in connection's Produce request, decoded, and the partitions it names; None for
        any other request (answered in turn)."""
        header = read_header(frame)
        if header.api_key != ApiKey.Produce or session.reauthenticating:
            return None
        if self.authorizer is not None and session.principal is None:
            return None
        if self.quotas is not None and self.quotas.enabled:
            return None  # a throttled answer mutes the connection before its next request is read (KIP-219)
        route = self.routes.get(header.api_key)
        if route is None or not route[0].serves(header.api_version):
            return None
        request = decode_request(frame)
        return request, frozenset((t.name, p.index) for t in request.body.topic_data for p in t.partition_data)

    async def _raw_token(self, token: bytes, client: str, session: Session) -> bytes:
        """A SASL token sent bare after a SaslHandshake v0, and its answer framed the same way."""
        ctx = self._context(ApiKey.SaslAuthenticate, 0, 0, None, client, session)
        try:
            answer, _ = await sasl_handlers.authenticate(ctx, token)
        except TxlogError:
            session.close_after_answer = True
            return b""
        return len(answer).to_bytes(4, "big") + answer

    def _context(
        self, api_key: int, api_version: int, correlation_id: int, client_id: str | None, client: str, session: Session
    ) -> RequestContext:
        # Metadata, FindCoordinator and DescribeCluster name the endpoints of the connection's listener.
        listening = self.listeners.get(session.listener)
        return RequestContext(
            broker=self.broker,
            node=listening.node if listening else self.node,
            api_key=api_key,
            api_version=api_version,
            correlation_id=correlation_id,
            client_id=client_id,
            client_host=client.rpartition(":")[0],
            executor=self.executor,
            cluster=listening.cluster if listening else self.cluster,
            groups=self.groups,
            notifier=self.notifier,
            loop_executor=self.loop_executor,
            known_topics=self.known_topics,
            authorizer=self.authorizer,
            principal=session.principal,
            session=session,
            quotas=self.quotas,
            replica=self.replica,
        )

    # -- requests ----------------------------------------------------------------------------------

    async def answer(
        self,
        frame: bytes,
        client: str = "",
        session: Session | None = None,
        request: Any = None,
        connection: asyncio.Task | None = None,
    ) -> bytes | bytearray | None:
        """The framed answer to one request frame, or None (Produce with acks=0). Raises
        ``FrameError`` or ``CloseConnection`` when the connection must close instead. ``request``:
        the frame already decoded; ``connection``: the task serving the connection, muted by a
        throttled answer (the current task when not given)."""
        header = read_header(frame)
        if session is None:
            session = Session()
        if (
            self.authorizer is not None
            and session.principal is None
            and header.api_key not in sasl_handlers.BEFORE_AUTHENTICATION
        ):
            raise CloseConnection(f"Unexpected Kafka request of type {api_name(header.api_key)} during SASL handshake")
        if session.reauthenticating and header.api_key != ApiKey.SaslAuthenticate:
            raise CloseConnection(f"Unexpected Kafka request of type {api_name(header.api_key)} during SASL re-authentication")
        route = self.routes.get(header.api_key)
        if route is None or not route[0].serves(header.api_version):
            return self._unsupported(frame, header)
        if request is None:
            request = decode_request(frame)
        api, handler = route
        task = connection or asyncio.current_task()
        ctx = self._context(header.api_key, header.api_version, header.correlation_id, header.client_id, client, session)
        no_answer = header.api_key == ApiKey.Produce and request.body.acks == 0
        try:
            body = await handler(ctx, request.body)
            if ctx.throttle_ms and task is not None:
                self._muted[task] = ctx.throttle_ms
            if body is None and not no_answer:
                raise RuntimeError(f"the {api.name} handler gave no answer")
            return None if body is None else encode_response(header, body)
        except TxlogError as exc:
            code, message = error_code(header.api_key, exc), exc.message
        except Exception:
            log.exception("%s v%d from %s (%s) failed", api.name, header.api_version, client, header.client_id)
            code, message = ErrorCode.UNKNOWN_SERVER_ERROR, ErrorCode.UNKNOWN_SERVER_ERROR.value.default_message
        if no_answer:
            raise CloseConnection(f"Produce with acks=0 failed: {code.name}: {message}")
        return error_response(header, code.kafka_code, message, request.body)

    def _unsupported(self, frame: bytes, header: RequestHeader) -> bytes | bytearray:
        code = ErrorCode.UNSUPPORTED_VERSION
        name = api_name(header.api_key)
        if header.api_key == ApiKey.ApiVersions:
            return api_versions_fallback(header, self.api_keys, code.kafka_code)
        if not has_codec(header.api_key, header.api_version):
            raise CloseConnection(f"{name} v{header.api_version} is not served (API key {header.api_key})")
        request = decode_request(frame)
        served = versions.BY_KEY.get(header.api_key)
        message = f"{name} v{header.api_version} is not served" + (
            f" (versions {served.min_version} to {served.max_version} are)" if served else ""
        )
        answer = error_response(header, code.kafka_code, message, request.body)
        assert answer is not None
        return answer


# -- the process -------------------------------------------------------------------------------------


def advertised_host(host: str) -> str:
    """The host clients are told to connect to when none is set: the listen host, or this machine's
    name when listening on every address."""
    return socket.getfqdn() if host in ("0.0.0.0", "::", "") else host


def replica_broker(settings: Settings) -> Broker:
    """The hot standby a read replica gateway reads: TXLOG_REPLICA_DATABASE_URL with the pool and
    session limits of the primary's. Only read transactions run on it."""
    return Broker(Database.from_settings(settings.model_copy(update={"database_url": settings.replica_database_url})), settings)
