"""How a confluent-kafka (librdkafka) transactional copier takes its gateways restarting, per
``metadata.recovery.strategy``: the measurement behind docs/kafka.md's advice.

Two gateways on a PostgreSQL of their own; a copier (``tests/kafka/copier_confluent.py``) copies
an input topic to an output topic, one transaction per poll with the input offsets in it. Every
few seconds both gateways are killed with ``kill -9``, one after the other, each started again on
its port a second after its kill, so that for a moment the client has no broker it can reach.
The copier must finish in its first run with its output its input copied exactly once; a call
blocked for 30 s ends it (exit 3: librdkafka #5511 / #5456 with the default ``rebootstrap``).

    python -m tests.chaos.gateway_restarts --strategy none [--rounds 4]

Exits 0 when the copier went on through every restart and copied exactly once, 1 otherwise.
``make chaos`` runs it with ``none``, the setting docs/kafka.md recommends.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from app.storage import migrate
from app.storage.embedded import EmbeddedPostgres
from tests.kafka.conftest import GatewayProcess
from tests.support import ROOT, destroy_embedded

COPIER = ROOT / "tests" / "kafka" / "copier_confluent.py"
PARTITIONS = 3


def measure(strategy: str, rounds: int, records: int) -> bool:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    work = Path(tempfile.mkdtemp(prefix="txlog-gateway-restarts-"))
    pg = EmbeddedPostgres(work / "pg")
    pg.start()
    migrate.upgrade(pg.url)
    env = {"TXLOG_KAFKA_NODE_LEASE_MS": "3000"}
    gateways = [GatewayProcess(pg.url, env=env, log_path=work / f"gateway-{n}.log", node_id=n) for n in (1, 2)]
    try:
        for g in gateways:
            g.start()
        bootstrap = ",".join(g.bootstrap for g in gateways)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(t, PARTITIONS) for t in ("in", "out")]).values():
            future.result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
        for i in range(records):
            producer.produce("in", b"v-%d" % i, partition=i % PARTITIONS)
            producer.poll(0)
        assert producer.flush(60) == 0
        log_path = work / "copier.log"
        with open(log_path, "wb") as out:
            copier = subprocess.Popen(
                [
                    sys.executable,
                    str(COPIER),
                    "--bootstrap",
                    bootstrap,
                    "--input",
                    "in",
                    "--output",
                    "out",
                    "--group",
                    "g",
                    "--transactional-id",
                    "t",
                    "--ends",
                    ",".join([str(records // PARTITIONS)] * PARTITIONS),
                    "--max-batch",
                    "10",
                    "--pause-ms",
                    "100",
                    "--metadata-recovery",
                    strategy,
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        time.sleep(5)
        for r in range(rounds):
            if copier.poll() is not None:
                print(f"the copier finished before round {r + 1}: give it more --records", flush=True)
                break
            began = time.monotonic()
            for g in gateways:
                g.stop(signal.SIGKILL)
                time.sleep(1.0)
                g.start()
            print(f"round {r + 1}: both gateways killed and back within {time.monotonic() - began:.1f} s", flush=True)
            time.sleep(8)
        code = copier.wait(600)
        lines = log_path.read_text(errors="replace").splitlines()
        print("\n".join(line for line in lines if "blocked" in line or "done at" in line or "fatal" in line))
        with psycopg.connect(pg.url) as conn:
            copied = conn.execute(
                "SELECT count(*), count(DISTINCT value) FROM txlog.committed_records WHERE topic = 'out'"
            ).fetchone()
        exact = copied == (records, records)
        print(f"metadata.recovery.strategy={strategy}: copier exit {code}, {copied[0] if copied else 0} copies of {records}")
        return code == 0 and exact
    finally:
        for g in gateways:
            g.stop()
        destroy_embedded(pg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos.gateway_restarts")
    ap.add_argument("--strategy", choices=("none", "rebootstrap"), default="none")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--records", type=int, default=6000)
    args = ap.parse_args(argv)
    return 0 if measure(args.strategy, args.rounds, args.records) else 1


if __name__ == "__main__":
    sys.exit(main())
