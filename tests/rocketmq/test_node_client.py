"""RocketMQ's Node.js client (``rocketmq-client-nodejs``, unmodified, run by Node) against a real
``txlog rocketmq``: normal messages, a transactional message committed and one rolled back, a half
message its producer leaves undecided and commits when the gateway checks it back, and a
SimpleConsumer receiving and acknowledging all that landed. The script (node/round_trip.js) says
what it did; txlog's records must say the same."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from sqlalchemy import text

from app.domain.half_messages import HalfState
from app.services import Broker, share_configs
from app.services import half_messages as half_service
from app.services import topics as topic_service
from tests.rocketmq.conftest import RocketMQGatewayProcess
from tests.support import ROOT

NODE_CLIENT = "rocketmq-client-nodejs@1.0.8"
# Installed once per version, kept between runs (ignored by git); TXLOG_NODE_MODULES points elsewhere.
NODE_PREFIX = Path(os.environ.get("TXLOG_NODE_MODULES", ROOT / ".cache" / "node" / NODE_CLIENT.replace("@", "-")))
SCRIPT = Path(__file__).parent / "node" / "round_trip.js"


@pytest.fixture(scope="module")
def node_modules() -> Path:
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are not installed (scripts/system-deps.sh installs them)")
    modules = NODE_PREFIX / "node_modules"
    if not (modules / "rocketmq-client-nodejs" / "package.json").exists():
        NODE_PREFIX.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(NODE_PREFIX), "--no-audit", "--no-fund", "--loglevel=error", NODE_CLIENT],
            check=True,
            timeout=300,
        )
    return modules


@pytest.fixture(scope="module")
def gateway(rocketmq_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQGatewayProcess]:
    log = tmp_path_factory.mktemp("rocketmq-node") / "gateway.log"
    g = RocketMQGatewayProcess(rocketmq_db, env={"TXLOG_HALF_CHECK_POLL_INTERVAL_MS": "100"}, log_path=log).start()
    yield g
    assert g.stop() == 0, g.log()


def _records(store: Broker, topic: str) -> list[bytes]:
    with store.db.read() as conn:
        rows = conn.execute(text("SELECT value FROM txlog.committed_records WHERE topic = :t"), {"t": topic})
        return sorted(bytes(v) for (v,) in rows)


def test_the_node_client_sends_transacts_answers_a_check_back_and_consumes(
    store: Broker, gateway: RocketMQGatewayProcess, node_modules: Path
) -> None:
    topic, group = f"node-{uuid.uuid4().hex[:8]}", f"GID_node_{uuid.uuid4().hex[:8]}"
    topic_service.create_topic(store, topic, 2)
    half_service.register_producer_group(store, topic, None, check_interval_ms=300)  # the proxy's group: the topic
    share_configs.alter_group_configs(store, group, {"share.auto.offset.reset": "earliest"})

    env = {**os.environ, "NODE_PATH": str(node_modules), "HOME": str(node_modules.parent)}  # its logs stay there
    done = subprocess.run(
        ["node", str(SCRIPT), gateway.endpoints, topic, group], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{gateway.log()}"
    events: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_event: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_event.setdefault(e["event"], []).append(e)

    assert by_event["done"] == [{"event": "done", "missing": []}], done.stdout
    [committed], [rolled_back], [undecided] = by_event["committed"], by_event["rolled back"], by_event["left undecided"]
    assert [c["messageId"] for c in by_event["checked"]] == [undecided["messageId"]]  # asked once, about that one only
    assert half_service.describe(store, committed["transactionId"]).stored.msg.state is HalfState.COMMITTED
    assert half_service.describe(store, rolled_back["transactionId"]).stored.msg.state is HalfState.ROLLED_BACK
    checked = half_service.describe(store, undecided["transactionId"])
    assert checked.stored.msg.decided_by is not None and checked.stored.msg.decided_by.value == "check_back"
    assert [c.answer for c in checked.checks] == ["COMMIT"]

    landed = [b"checked back", b"committed", b"normal 1", b"normal 2"]
    assert _records(store, topic) == landed  # nothing of the rolled-back message
    received = {e["messageId"]: e["body"] for e in by_event["received"]}
    sent = {e["messageId"]: e["body"] for e in by_event["sent"]}
    sent.update({committed["messageId"]: "committed", undecided["messageId"]: "checked back"})
    assert received == sent
    assert not re.search(r"Traceback", gateway.log()), gateway.log()
