"""RocketMQ's CreateOrderService (the transactional-message example of seed 003), line by line on
txlog: create an order in PostgreSQL and send "order created" — both or neither.

    txlog serve &                                  # a server (with its embedded PostgreSQL)
    python examples/create_order_service.py        # orders go to the database `txlog db-url` prints,
                                                   # or to --database-url

The producer sends a half message, runs the local transaction (INSERT INTO orders), then commits
the half message — or rolls it back when the insert fails. If the process dies in between, the
server asks this service's check-back endpoint (``check_local_transaction``), which looks the
order up: there → COMMIT; not there (it failed, or is still running) → UNKNOW, asked again later,
rolled back after max_checks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

import psycopg

from txlog._http import Transport
from txlog.errors import KafkaException
from txlog.rocketmq import LocalTransactionState, Message, MessageExt, SendStatus, TransactionListener, TransactionProducer

TOPIC = "orders"


@dataclass(frozen=True)
class CreateOrderRequest:
    order_id: str
    item: str
    quantity: int


class OrderDao:
    """The order table's DAO: the local transaction and the check-back's lookup."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    def create_table(self) -> None:
        with psycopg.connect(self.database_url) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS orders (order_id text PRIMARY KEY, item text NOT NULL, "
                "quantity int NOT NULL CHECK (quantity > 0), created_at timestamptz NOT NULL DEFAULT now())"
            )

    def create_order_in_db(self, request: CreateOrderRequest) -> None:
        with psycopg.connect(self.database_url) as conn:  # one local transaction, committed on leaving
            conn.execute(
                "INSERT INTO orders (order_id, item, quantity) VALUES (%s, %s, %s)",
                (request.order_id, request.item, request.quantity),
            )

    def is_order_id_exists_in_db(self, order_id: str | None) -> bool:
        with psycopg.connect(self.database_url) as conn:
            return conn.execute("SELECT 1 FROM orders WHERE order_id = %s", (order_id,)).fetchone() is not None


class CreateOrderService:
    def __init__(
        self, order_dao: OrderDao, executor_service: Executor, txlog_url: str | None = None, **producer_options: object
    ) -> None:
        self.order_dao = order_dao  # @Inject OrderDao
        self.executor_service = executor_service  # @Inject ExecutorService
        self.txlog_url = txlog_url
        self.producer_options = producer_options
        self.producer: TransactionProducer | None = None

    # @Init: the transaction listener and the producer
    def init(self) -> None:
        transaction_listener = self.create_transaction_listener()
        self.producer = TransactionProducer("myGroup", url=self.txlog_url, **self.producer_options)  # type: ignore[arg-type]
        self.producer.set_executor_service(self.executor_service)
        self.producer.set_transaction_listener(transaction_listener)
        self.producer.start()

    # the service's entry point (@PUT createOrder)
    def create_order(self, request: CreateOrderRequest) -> bool:
        # a message from the order request
        msg = self.create_message(request)
        # send it as a transactional message
        send_result = self.producer.send_message_in_transaction(msg, request)  # type: ignore[union-attr]
        # did the transaction succeed?
        return (
            send_result.send_status is SendStatus.SEND_OK
            and send_result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
        )

    def create_transaction_listener(self) -> TransactionListener:
        order_dao = self.order_dao

        class Listener(TransactionListener):
            def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
                request: CreateOrderRequest = arg  # type: ignore[assignment]
                try:
                    # the local transaction: create the order
                    order_dao.create_order_in_db(request)
                    # no exception: commit the message
                    return LocalTransactionState.COMMIT_MESSAGE
                except Exception:
                    # it failed: roll the message back at once
                    return LocalTransactionState.ROLLBACK_MESSAGE

            # the check-back: ask the local transaction's outcome
            def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
                # the order id from the message
                order_id = msg.get_user_property("orderId")
                # the order exists: commit. It does not: the local transaction failed, or is still
                # running — UNKNOW (RocketMQ's spelling), asked again later
                return (
                    LocalTransactionState.COMMIT_MESSAGE
                    if order_dao.is_order_id_exists_in_db(order_id)
                    else LocalTransactionState.UNKNOW
                )

        return Listener()

    def create_message(self, request: CreateOrderRequest) -> Message:
        msg = Message(
            TOPIC,
            body=json.dumps({"order_id": request.order_id, "item": request.item, "quantity": request.quantity}),
            key=request.order_id,
        )
        msg.put_user_property("orderId", request.order_id)
        return msg

    def shutdown(self) -> None:
        if self.producer is not None:
            self.producer.shutdown()


def ensure_topic(url: str | None) -> None:
    with Transport(url) as t:
        try:
            t.post("/v1/topics", {"name": TOPIC, "partitions": 3})
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise


def run(txlog_url: str | None, database_url: str, requests: list[CreateOrderRequest], **producer_options: object) -> list[bool]:
    """Create the orders table and the topic, then each order; whether each succeeded."""
    dao = OrderDao(database_url)
    dao.create_table()
    ensure_topic(txlog_url)
    with ThreadPoolExecutor(4) as executor:
        service = CreateOrderService(dao, executor, txlog_url, **producer_options)
        service.init()
        try:
            return [service.create_order(r) for r in requests]
        finally:
            service.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txlog-url", default=None, help="the server (default: $TXLOG_URL or http://127.0.0.1:8080)")
    parser.add_argument("--database-url", default=None, help="where the orders table lives (default: `txlog db-url`)")
    args = parser.parse_args(argv)
    database_url = (
        args.database_url or subprocess.run(["txlog", "db-url"], capture_output=True, text=True, check=True).stdout.strip()
    )
    requests = [
        CreateOrderRequest("order-1", "book", 1),
        CreateOrderRequest("order-2", "lamp", 2),
        CreateOrderRequest("order-1", "book", 1),  # the same order again: the insert fails, the message is rolled back
        CreateOrderRequest("order-3", "chair", 0),  # refused by the table: rolled back
    ]
    for request, ok in zip(requests, run(args.txlog_url, database_url, requests)):
        print(
            f"{request.order_id} ({request.item} x{request.quantity}): {'created and sent' if ok else 'neither created nor sent'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
