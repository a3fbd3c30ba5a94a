"""RocketMQ's transactional producer over txlog's half messages: "run my local transaction and send
the message — both or neither".

Shaped as RocketMQ's ``TransactionMQProducer`` so that code written for it reads the same::

    producer = TransactionProducer("myGroup")             # new TransactionMQProducer("myGroup")
    producer.set_executor_service(executor)               # producer.setExecutorService(...)
    producer.set_transaction_listener(listener)           # producer.setTransactionListener(...)
    producer.start()                                      # producer.start()
    result = producer.send_message_in_transaction(msg, request)
    ok = result.send_status is SendStatus.SEND_OK

``send_message_in_transaction`` sends a half message (its transaction id chosen here, so a lost
answer is retried safely), runs ``listener.execute_local_transaction(msg, arg)``, then commits or
rolls back the half message — or, on UNKNOW or an exception, leaves it to the check-back. Losing
the commit or rollback is harmless: the server's checker asks the producer group
(``listener.check_local_transaction(msg)``) through the check-back endpoint that ``start()`` serves
and registers, as RocketMQ's broker asks its producers.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Executor
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from app.domain.records import decode_bytes
from txlog._http import Transport, segment
from txlog.errors import KafkaError, KafkaException
from txlog.message import b64


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the server's checker may ask about many half messages at once


log = logging.getLogger("txlog.rocketmq")

__all__ = [
    "CheckBackListener",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]


class LocalTransactionState(Enum):
    """RocketMQ's answer about a local transaction, with its names (UNKNOW, sic)."""

    COMMIT_MESSAGE = "COMMIT"
    ROLLBACK_MESSAGE = "ROLLBACK"
    UNKNOW = "UNKNOWN"


class SendStatus(Enum):
    SEND_OK = "SEND_OK"


def _as_bytes(v: bytes | str | None) -> bytes | None:
    return v.encode("utf-8") if isinstance(v, str) else v


@dataclass
class Message:
    """A message: topic, body, key (picks the partition, as Kafka's key does), user properties
    (sent as headers) and, optionally, the partition."""

    topic: str
    body: bytes | str | None = None
    key: bytes | str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    partition: int | None = None
    transaction_id: str | None = None  # set by send_message_in_transaction

    def put_user_property(self, name: str, value: str) -> None:
        self.properties[name] = value

    def get_user_property(self, name: str) -> str | None:
        return self.properties.get(name)


@dataclass
class MessageExt(Message):
    """A half message as a check-back delivers it (RocketMQ's MessageExt)."""

    producer_group: str = ""
    check_count: int = 0  # which check-back this is, from 1
    born_timestamp_ms: int = 0

    @classmethod
    def from_check(cls, payload: dict[str, Any]) -> "MessageExt":
        enc = payload.get("encoding", "utf8")

        def decode(v: str | None) -> bytes | None:
            return decode_bytes(v, enc, "a check-back field")

        properties = {}
        for h in payload.get("header_list") or []:
            value = decode(h.get("value"))
            properties[h["key"]] = value.decode("utf-8", "replace") if value is not None else None
        return cls(
            topic=payload["topic"],
            body=decode(payload.get("value")),
            key=decode(payload.get("key")),
            properties=properties,  # type: ignore[arg-type]  # a header sent without a value comes back as None
            partition=payload.get("partition"),
            transaction_id=payload.get("transaction_id"),
            producer_group=payload.get("producer_group", ""),
            check_count=int(payload.get("check_count") or 0),
            born_timestamp_ms=int(payload.get("timestamp_ms") or 0),
        )


class TransactionListener:
    """What a transactional producer implements (RocketMQ's TransactionListener)."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        raise NotImplementedError

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        raise NotImplementedError


@dataclass(frozen=True)
class TransactionSendResult:
    send_status: SendStatus
    transaction_id: str
    topic: str
    partition: int
    local_transaction_state: LocalTransactionState
    offset: int | None = None  # where the message was appended, when this call committed it
    end_error: KafkaError | None = None  # the commit or rollback that could not be sent (the check-back decides)


class CheckBackListener:
    """Serves a producer group's check-back endpoint: the server POSTs a half message, the
    listener's ``check_local_transaction`` answers, and the answer goes back as
    ``{"state": "COMMIT" | "ROLLBACK" | "UNKNOWN"}``. An exception in the listener answers UNKNOWN
    (the server asks again later). Runs in its own threads; ``url`` is where it listens."""

    def __init__(
        self, listener: TransactionListener, host: str = "127.0.0.1", port: int = 0, executor: Executor | None = None
    ) -> None:
        self.listener = listener
        self.executor = executor
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                length = int(self.headers.get("content-length") or 0)
                try:
                    msg = MessageExt.from_check(orjson.loads(self.rfile.read(min(length, 16 * 1024 * 1024))))
                except (ValueError, KeyError, TypeError) as exc:
                    self._answer(400, {"error": f"not a half message: {exc}"})
                    return
                self._answer(200, {"state": owner.check(msg).value})

            def _answer(self, status: int, body: dict) -> None:
                data = orjson.dumps(body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("check-back: " + format, *args)

        self._server = _Server((host, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = str(self._server.server_address[0]), self._server.server_port  # an IP server's: a str
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/"

    def check(self, msg: MessageExt) -> LocalTransactionState:
        try:
            if self.executor is not None:
                state = self.executor.submit(self.listener.check_local_transaction, msg).result()
            else:
                state = self.listener.check_local_transaction(msg)
        except Exception:
            log.exception("check_local_transaction failed for %s; answering UNKNOW", msg.transaction_id)
            return LocalTransactionState.UNKNOW
        return state if isinstance(state, LocalTransactionState) else LocalTransactionState.UNKNOW

    def start(self) -> "CheckBackListener":
        self._thread = threading.Thread(target=self._server.serve_forever, name="txlog-check-back-listener", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class TransactionProducer:
    """RocketMQ's TransactionMQProducer on txlog. ``url``/``token`` find the server as every txlog
    client does (``$TXLOG_URL``, ``$TXLOG_TOKEN``). ``check_host``/``check_port``: where ``start()``
    serves the check-back endpoint (``check_url``: the URL to register instead, when the server
    reaches this process by another address). ``check_interval_ms``, ``check_immunity_ms``,
    ``max_checks``: the producer group's knobs (RocketMQ's defaults when not given)."""

    def __init__(
        self,
        producer_group: str,
        url: str | None = None,
        token: str | None = None,
        check_host: str = "127.0.0.1",
        check_port: int = 0,
        check_url: str | None = None,
        check_interval_ms: int | None = None,
        check_immunity_ms: int | None = None,
        max_checks: int | None = None,
        retries: int = 3,
        retry_backoff_ms: int = 100,
        timeout_s: float = 30.0,
    ) -> None:
        self.producer_group = producer_group
        self._transport = Transport(url, token, timeout_s=timeout_s)
        self._check_host, self._check_port, self._check_url = check_host, check_port, check_url
        self._knobs = {"check_interval_ms": check_interval_ms, "check_immunity_ms": check_immunity_ms, "max_checks": max_checks}
        self._retries, self._backoff_s = retries, retry_backoff_ms / 1000
        self._listener: TransactionListener | None = None
        self._executor: Executor | None = None
        self._check_back: CheckBackListener | None = None

    def set_transaction_listener(self, listener: TransactionListener) -> None:
        self._listener = listener

    def set_executor_service(self, executor: Executor) -> None:
        """Check-backs run on this executor (RocketMQ's checkExecutor)."""
        self._executor = executor

    @property
    def check_url(self) -> str | None:
        return self._check_url or (self._check_back.url if self._check_back else None)

    def start(self) -> None:
        """Serve the check-back endpoint and register it for the producer group."""
        if self._listener is None:
            raise KafkaException(KafkaError(KafkaError._STATE, "set_transaction_listener first"))
        if self._check_back is None:
            self._check_back = CheckBackListener(self._listener, self._check_host, self._check_port, self._executor).start()
        body = {"check_url": self.check_url, **{k: v for k, v in self._knobs.items() if v is not None}}
        self._with_retries(
            lambda: self._transport.request("PUT", f"/v1/producer-groups/{segment(self.producer_group)}", body=body)
        )

    def shutdown(self) -> None:
        if self._check_back is not None:
            self._check_back.stop()
            self._check_back = None
        self._transport.close()

    def _with_retries(self, call: Any) -> Any:
        for attempt in range(self._retries + 1):
            try:
                return call()
            except KafkaException as exc:
                if not exc.args[0].retriable() or attempt == self._retries:
                    raise
                time.sleep(self._backoff_s * (attempt + 1))

    def send_half_message(self, msg: Message) -> dict:
        """Store ``msg`` as a half message (retried safely: its transaction id is chosen here)."""
        msg.transaction_id = msg.transaction_id or uuid.uuid4().hex.upper()
        key, value = _as_bytes(msg.key), _as_bytes(msg.body)
        body = {
            "producer_group": self.producer_group,
            "transaction_id": msg.transaction_id,
            "topic": msg.topic,
            "partition": msg.partition,
            "encoding": "base64",
            "key": b64(key),
            "value": b64(value),
            "headers": [
                {"key": k, "value": b64(v.encode("utf-8") if v is not None else None)} for k, v in msg.properties.items()
            ],
        }
        return self._with_retries(lambda: self._transport.post("/v1/half-messages", body))

    def end_transaction(self, transaction_id: str, state: LocalTransactionState) -> dict | None:
        """Commit or roll back a half message (UNKNOW: nothing to send)."""
        if state is LocalTransactionState.UNKNOW:
            return None
        action = "commit" if state is LocalTransactionState.COMMIT_MESSAGE else "rollback"
        return self._with_retries(lambda: self._transport.post(f"/v1/half-messages/{segment(transaction_id)}/{action}"))

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Send ``msg`` as a half message, run the local transaction, end the half message as it
        says. A half message that cannot be sent raises ``KafkaException`` (the local transaction
        does not run). An exception in the local transaction is UNKNOW: the check-back decides. A
        commit or rollback that cannot be sent is logged and left to the check-back too
        (``end_error``)."""
        if self._listener is None:
            raise KafkaException(KafkaError(KafkaError._STATE, "set_transaction_listener first"))
        sent = self.send_half_message(msg)
        state = LocalTransactionState.UNKNOW
        try:
            state = self._listener.execute_local_transaction(msg, arg) or LocalTransactionState.UNKNOW
        except Exception:
            log.exception("the local transaction of half message %s failed; the check-back decides", msg.transaction_id)
        if state is not LocalTransactionState.COMMIT_MESSAGE:
            log.info("local transaction of half message %s: %s", msg.transaction_id, state.name)
        offset, end_error = None, None
        try:
            ended = self.end_transaction(sent["transaction_id"], state)
            offset = ended.get("offset") if ended else None
        except KafkaException as exc:
            end_error = exc.args[0]
            log.warning("local transaction %s, but ending half message %s failed: %s", state.name, msg.transaction_id, exc)
        return TransactionSendResult(
            SendStatus.SEND_OK, sent["transaction_id"], sent["topic"], sent["partition"], state, offset, end_error
        )


TransactionMQProducer = TransactionProducer
