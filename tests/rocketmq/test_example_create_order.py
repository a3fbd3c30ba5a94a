"""examples/create_order_service_rocketmq.py (seed 003's CreateOrderService with RocketMQ's own
Python client) run as a program against a real ``txlog rocketmq``: the orders it created are the
messages that landed, once each; the failed ones left nothing; the one it left undecided was
committed by its TransactionChecker's answer."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import text

from app.services import Broker
from app.services import topics as topic_service
from tests.rocketmq.conftest import RocketMQGatewayProcess
from tests.support import ROOT

pytest.importorskip("rocketmq")

EXAMPLE = ROOT / "examples" / "create_order_service_rocketmq.py"


@pytest.fixture(scope="module")
def gateway(rocketmq_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQGatewayProcess]:
    log = tmp_path_factory.mktemp("rocketmq-example") / "gateway.log"
    g = RocketMQGatewayProcess(rocketmq_db, env={"TXLOG_HALF_CHECK_POLL_INTERVAL_MS": "100"}, log_path=log).start()
    yield g
    assert g.stop() == 0, g.log()


def test_the_create_order_service_sends_each_created_order_once_and_nothing_else(
    store: Broker, gateway: RocketMQGatewayProcess, tmp_path: Path
) -> None:
    topic_service.create_topic(store, "orders", 3)
    orders_db = tmp_path / "orders.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}  # the client writes its logs under HOME
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--endpoints", gateway.endpoints, "--no-create-topic", "--orders-db", str(orders_db)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{gateway.log()}"
    assert done.stdout.splitlines() == [
        "order-1 (book x1): created and sent",
        "order-2 (lamp x2): created and sent",
        "order-1 (book x1): neither created nor sent",
        "order-3 (chair x0): neither created nor sent",
        "order-4 (desk x1): left undecided, checked back: COMMIT",
    ]
    with sqlite3.connect(orders_db) as conn:
        created = sorted(r[0] for r in conn.execute("SELECT order_id FROM orders"))
    with store.db.read() as conn:
        rows = conn.execute(text("SELECT value FROM txlog.committed_records WHERE topic = 'orders'")).scalars()
        sent = sorted(json.loads(bytes(v))["order_id"] for v in rows)
    assert created == sent == ["order-1", "order-2", "order-4"]
