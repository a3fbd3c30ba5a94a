"""RocketMQ's CreateOrderService (the transactional-message example of seed 003) written with
RocketMQ's own Python client, unmodified (``rocketmq-python-client``), against txlog's RocketMQ
gateway: create an order in a local database and send "order created" — both or neither.

    make run                                             # txlog with its RocketMQ gateway on 127.0.0.1:8081
    python examples/create_order_service_rocketmq.py     # orders in a new SQLite file (or --orders-db)

The producer sends a half message, runs the local transaction (INSERT INTO orders), then commits
the half message — or rolls it back when the insert fails. If the service stops in between (the
last order below is left so), the gateway asks the producer's TransactionChecker once the
message's CHECK_IMMUNITY_TIME_IN_SECONDS is over; the checker looks the order up: there → COMMIT;
not there (the insert failed, or is still running) → UNKNOWN, asked again later.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rocketmq
from txlog._http import Transport
from txlog.errors import KafkaException

TOPIC = "orders"
CHECK_IMMUNITY_S = 2  # how long the gateway waits before asking about a message left undecided


@dataclass(frozen=True)
class CreateOrderRequest:
    order_id: str
    item: str
    quantity: int


class OrderDao:
    """The orders table's DAO: the local transaction and the check-back's lookup."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def create_table(self) -> None:
        with self._connect() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, item TEXT NOT NULL, "
                "quantity INTEGER NOT NULL CHECK (quantity > 0))"
            )

    def create_order_in_db(self, request: CreateOrderRequest) -> None:
        with self._connect() as conn:  # one local transaction, committed on leaving
            conn.execute("INSERT INTO orders VALUES (?, ?, ?)", (request.order_id, request.item, request.quantity))

    def is_order_id_exists_in_db(self, order_id: str | None) -> bool:
        with self._connect() as conn:
            return conn.execute("SELECT 1 FROM orders WHERE order_id = ?", (order_id,)).fetchone() is not None

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)


class OrderChecker(rocketmq.TransactionChecker):  # type: ignore[misc]
    """The check-back: the local transaction's outcome, looked up by the order id the message carries."""

    def __init__(self, order_dao: OrderDao) -> None:
        self.order_dao = order_dao
        self.checked: dict[str, Any] = {}  # order id -> the last answer given
        self.answered = threading.Condition()

    def check(self, message: Any) -> Any:
        order_id = message.properties.get("orderId")
        # the order exists: commit. It does not: the local transaction failed or is still running —
        # UNKNOWN, asked again later
        resolution = (
            rocketmq.TransactionResolution.COMMIT
            if self.order_dao.is_order_id_exists_in_db(order_id)
            else rocketmq.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
        )
        with self.answered:
            self.checked[order_id] = resolution
            self.answered.notify_all()
        return resolution

    def wait_for(self, order_id: str, timeout: float) -> bool:
        with self.answered:
            return self.answered.wait_for(lambda: order_id in self.checked, timeout)


class CreateOrderService:
    def __init__(self, order_dao: OrderDao, endpoints: str) -> None:
        self.order_dao = order_dao
        self.endpoints = endpoints
        self.checker = OrderChecker(order_dao)
        self.producer: Any = None

    # @Init: the checker and the producer
    def init(self) -> None:
        config = rocketmq.ClientConfiguration(self.endpoints, rocketmq.Credentials(), request_timeout=10)
        self.producer = rocketmq.Producer(config, (TOPIC,), self.checker)
        self.producer.startup()

    # the service's entry point (@PUT createOrder); stop_before_deciding plays a service that dies
    # between its local transaction and its commit
    def create_order(self, request: CreateOrderRequest, stop_before_deciding: bool = False) -> bool:
        transaction = self.producer.begin_transaction()
        # the half message: stored, invisible to consumers until committed
        self.producer.send(self.create_message(request), transaction)
        try:
            # the local transaction: create the order
            self.order_dao.create_order_in_db(request)
        except sqlite3.Error:
            # it failed: roll the message back at once
            transaction.rollback()
            return False
        if stop_before_deciding:
            return True  # the gateway will ask the checker
        transaction.commit()
        return True

    def create_message(self, request: CreateOrderRequest) -> Any:
        message = rocketmq.Message()
        message.topic = TOPIC
        message.body = json.dumps({"order_id": request.order_id, "item": request.item, "quantity": request.quantity}).encode()
        message.tag = "created"
        message.keys = request.order_id
        message.add_property("orderId", request.order_id)
        message.add_property("CHECK_IMMUNITY_TIME_IN_SECONDS", str(CHECK_IMMUNITY_S))
        return message

    def shutdown(self) -> None:
        if self.producer is not None:
            self.producer.shutdown()


REQUESTS = [
    CreateOrderRequest("order-1", "book", 1),
    CreateOrderRequest("order-2", "lamp", 2),
    CreateOrderRequest("order-1", "book", 1),  # the same order again: the insert fails, the message is rolled back
    CreateOrderRequest("order-3", "chair", 0),  # refused by the table: rolled back
]
UNDECIDED = CreateOrderRequest("order-4", "desk", 1)  # created, then the service stops before committing


def run(endpoints: str, orders_db: Path, check_timeout: float = 30) -> list[str]:
    """The orders above, then one left undecided until the gateway checks it back; a line each."""
    dao = OrderDao(orders_db)
    dao.create_table()
    service = CreateOrderService(dao, endpoints)
    service.init()
    try:
        lines = [
            f"{r.order_id} ({r.item} x{r.quantity}): {'created and sent' if service.create_order(r) else 'neither created nor sent'}"
            for r in REQUESTS
        ]
        if not service.create_order(UNDECIDED, stop_before_deciding=True):
            return [*lines, f"{UNDECIDED.order_id}: exists already in {orders_db}, rolled back"]
        checked = service.checker.wait_for(UNDECIDED.order_id, check_timeout)
        answer = service.checker.checked.get(UNDECIDED.order_id)
        lines.append(
            f"{UNDECIDED.order_id} ({UNDECIDED.item} x{UNDECIDED.quantity}): left undecided, "
            + (f"checked back: {rocketmq.TransactionResolution.Name(answer)}" if checked else "not checked back yet")
        )
        return lines
    finally:
        service.shutdown()


def ensure_topic(txlog_url: str | None) -> None:
    """The topic, made through txlog's HTTP API (a RocketMQ client cannot make topics)."""
    with Transport(txlog_url) as t:
        try:
            t.post("/v1/topics", {"name": TOPIC, "partitions": 3})
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", default="127.0.0.1:8081", help="the RocketMQ gateway (default: %(default)s)")
    parser.add_argument(
        "--txlog-url", default=None, help="txlog's HTTP API, to make the topic (default: $TXLOG_URL or http://127.0.0.1:8080)"
    )
    parser.add_argument("--no-create-topic", action="store_true", help="the topic exists already")
    parser.add_argument("--orders-db", type=Path, default=None, help="the orders table's SQLite file (default: a new one)")
    args = parser.parse_args(argv)
    if not args.no_create_topic:
        ensure_topic(args.txlog_url)
    orders_db = args.orders_db or Path(tempfile.mkdtemp(prefix="orders-")) / "orders.sqlite3"
    for line in run(args.endpoints, orders_db):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
