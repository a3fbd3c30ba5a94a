"""The Kafka doors of the fault suite: two ``txlog kafka`` gateways on the suite's database, and
Kafka's own clients through them while the faults go on.

- idempotent producers writing numbered values to ``acks``: confluent-kafka through lossy proxies
  (each gateway has a second listener, advertised at a proxy in front of it that loses a share of
  its answers: the client reaches every gateway only through a proxy), kafka-python directly;
- transactional copiers (``tests/kafka/copier_*.py``, confluent-kafka and kafka-python), each
  copying its own input to its own output, one transaction per poll with its input offsets in it;
  the last of each input is written after the faults, so that every fault finds them at work. A
  copier that exits (fenced, or a call wedged past its watchdog's limit when its gateway died) is
  started again, as an application would be;
- read_committed consumers of both libraries, each assigned every partition of ``acks``, of the
  copiers' outputs and of the HTTP transformer's output, from offset 0: one session per client,
  so their offsets must only go up.

The producers, copiers and consumers are those of ``tests.chaos.database_restarts``."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tests.chaos.checker import Copier as CopierHistory
from tests.chaos.checker import Poll
from tests.chaos.database_restarts import (
    ACKS,
    REQUEST_TIMEOUT_MS,
    Acked,
    Copier,
    Load,
    create_topics,
    produce_inputs,
    wait_progressing,
)
from tests.client.proxy import LossyProxy
from tests.kafka.conftest import GatewayProcess
from tests.support import wait_until

PARTITIONS = 3
COPIERS = ("confluent-none", "kafka-python")  # names in database_restarts.COPIER_RUNS
HELD_BACK = 2 * PARTITIONS  # of each copier's input, written once the faults are over
CONSUMERS = ("confluent", "kafka-python")
ENV = {"TXLOG_KAFKA_NODE_LEASE_MS": "3000", "TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "300"}


class KafkaDoors:
    def __init__(self, db_url: str, log_dir: Path, seconds: float, seed: int) -> None:
        self.log_dir = log_dir
        self.gateways = [
            GatewayProcess(
                db_url,
                env=ENV,
                log_path=log_dir / f"gateway-{n}.log",
                node_id=n,
                listeners={"PLAINTEXT": "PLAINTEXT", "LOSSY": "PLAINTEXT"},
            )
            for n in (1, 2)
        ]
        self.proxies = [LossyProxy(g.ports["LOSSY"], drop_answer=0.03, seed=seed + 10 + i) for i, g in enumerate(self.gateways)]
        for g, proxy in zip(self.gateways, self.proxies):
            g.env["TXLOG_KAFKA_ADVERTISED_LISTENERS"] = f"LOSSY://127.0.0.1:{proxy.port}"
        self.bootstrap = ",".join(g.bootstrap for g in self.gateways)
        self.lossy_bootstrap = ",".join(f"127.0.0.1:{p.port}" for p in self.proxies)
        self.copiers = [Copier(name, self.bootstrap, log_dir) for name in COPIERS]
        for c in self.copiers:  # a call blocked past its own timeout (10 s) is wedged: start again sooner
            c.argv += ["--stuck-after-s", "15"]
        # At most 50 records a second each (batches of 10, 200 ms each): a few more than they copy
        # in the faults' window on a loaded machine.
        self.records = max(300, int(seconds * 25)) // PARTITIONS * PARTITIONS
        self.ends = [self.records // PARTITIONS] * PARTITIONS
        self.inputs: dict[str, dict[int, list[bytes]]] = {}
        self.restarts: list[str] = []
        # Not the HTTP transformer's output: as many records again to read on a machine of two cores.
        self.followed = [ACKS, *(c.output for c in self.copiers)]
        self.load = Load(self.bootstrap, self.followed, log_dir)
        self.load.producers = {"confluent-lossy": Acked("confluent-lossy"), "kafka-python": Acked("kafka-python")}
        self.load.pause_s = 0.2  # 25 values a second each: the HTTP load is the heavy one
        self.polls: dict[str, list[Poll]] = {name: [] for name in CONSUMERS}
        self.stack = contextlib.ExitStack()
        for g in self.gateways:  # started by the caller, beside its servers
            self.stack.callback(self._stop_gateway, g)
        self.supervising = threading.Event()
        self.consumers_stop = threading.Event()

    # -- the run -----------------------------------------------------------------------------------

    def start(self) -> None:
        for proxy in self.proxies:
            self.stack.enter_context(proxy)
        create_topics(self.bootstrap, self.copiers)
        produce_inputs(self.bootstrap, self.copiers, range(self.records - HELD_BACK), self.inputs)
        producers = self.load.producers
        self.load.start(
            {
                "confluent-lossy": lambda: self.load.confluent_producer(
                    producers["confluent-lossy"], "rebootstrap", self.lossy_bootstrap
                ),
                "kafka-python": lambda: self.load.kafka_python_producer(producers["kafka-python"]),
                "read-confluent": lambda: self._confluent_consumer(self.polls["confluent"]),
                "read-kafka-python": lambda: self._kafka_python_consumer(self.polls["kafka-python"]),
            }
        )
        self.stack.callback(self.load.halt)
        for c in self.copiers:
            c.start(self.ends)
            self.stack.callback(lambda c=c: c.proc.poll() is None and c.proc.kill())
        self.supervising.set()
        threading.Thread(target=self._supervise, daemon=True).start()
        self.stack.callback(self.supervising.clear)

    def _supervise(self) -> None:
        """A copier that exited short of its end is started again (it fences the one before)."""
        while self.supervising.is_set():
            for c in self.copiers:
                code = c.proc.poll()
                if code not in (None, 0) and self.supervising.is_set():
                    self.restarts.append(f"copier {c.name} exited {code}, started again")
                    c.start(self.ends)
            time.sleep(0.2)

    def _stop_gateway(self, g: GatewayProcess) -> None:
        if g.alive():
            with contextlib.suppress(Exception):
                g.signal_group(signal.SIGCONT)
            g.stop()

    def close(self) -> None:
        self.stack.close()

    def wait_delivering(self, since: float, timeout: float) -> None:
        """Every producer has been acknowledged something after ``since``."""
        wait_until(
            lambda: all(a.last_ack > since for a in self.load.producers.values()) or bool(self.load.failures),
            timeout,
            0.1,
            "every Kafka producer to deliver",
        )
        assert not self.load.failures, self.diagnosis()

    def release_tail(self) -> None:
        """The faults are over: the last of each copier's input."""
        produce_inputs(self.bootstrap, self.copiers, range(self.records - HELD_BACK, self.records), self.inputs)

    def wait_copied(self, offsets: Callable[[], Any]) -> None:
        """Every copier at its end, waited for as long as their groups' ``offsets`` move."""
        wait_progressing(
            lambda: all(c.proc.poll() == 0 for c in self.copiers),
            lambda: (len(self.restarts), offsets()),
            90,
            "every Kafka copier to copy its whole input",
        )
        self.supervising.clear()

    def stop_producers(self) -> None:
        """The producers stop and flush: every send acknowledged or failed."""
        self.load.stop.set()
        for t in self.load.threads:
            if t.name in self.load.producers:
                t.join(120)
                assert not t.is_alive(), f"Kafka producer {t.name} did not finish\n{self.diagnosis()}"
        assert not self.load.failures, self.diagnosis()

    def stop_consumers(self) -> None:
        self.consumers_stop.set()
        self.load.halt()
        assert not [t.name for t in self.load.threads if t.is_alive()], "a Kafka client thread did not stop"
        assert not self.load.failures, self.diagnosis()

    # -- consumers ---------------------------------------------------------------------------------

    def _assignment(self) -> list[tuple[str, int]]:
        return [(t, p) for t in self.followed for p in range(PARTITIONS)]

    def _confluent_consumer(self, polls: list[Poll]) -> None:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "chaos-readers-confluent",  # assigned, never committing: no member
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "socket.timeout.ms": REQUEST_TIMEOUT_MS,
            }
        )
        c.assign([TopicPartition(t, p, 0) for t, p in self._assignment()])
        try:
            while not self.consumers_stop.is_set():
                for m in c.consume(100, 0.25):
                    if m.error() is None:
                        polls.append(Poll(m.topic(), m.partition(), m.offset(), (m.value() or b"").decode()))
        finally:
            c.close()

    def _kafka_python_consumer(self, polls: list[Poll]) -> None:
        from kafka import KafkaConsumer, TopicPartition

        c = KafkaConsumer(
            bootstrap_servers=self.bootstrap.split(","),
            group_id=None,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            request_timeout_ms=REQUEST_TIMEOUT_MS + 1000,
            reconnect_backoff_ms=50,
            reconnect_backoff_max_ms=1000,
        )
        partitions = [TopicPartition(t, p) for t, p in self._assignment()]
        c.assign(partitions)
        for tp in partitions:
            c.seek(tp, 0)
        try:
            while not self.consumers_stop.is_set():
                for tp, records in c.poll(timeout_ms=250).items():
                    polls.extend(Poll(tp.topic, tp.partition, r.offset, (r.value or b"").decode()) for r in records)
        finally:
            c.close()

    # -- after the run -----------------------------------------------------------------------------

    def copier_histories(
        self, group_offsets: Callable[[str, str], dict[int, int]], transactions: Callable[[str], tuple[int, int]]
    ) -> list[CopierHistory]:
        out = []
        for c in self.copiers:
            committed, aborted = transactions(f"copier-{c.name}")
            out.append(
                CopierHistory(
                    c.name,
                    c.input,
                    c.output,
                    group_offsets(f"copier-{c.name}", c.input),
                    lambda _p, _o, v: v + "!",
                    committed,
                    aborted,
                )
            )
        return out

    def diagnosis(self) -> str:
        return "\n".join(
            [
                f"kafka producer {a.name}: {len(a.acked)} acked, {len(a.failed)} failed {dict(a.errors)}"
                for a in self.load.producers.values()
            ]
            + [f"kafka consumer {name}: {len(p)} polled" for name, p in self.polls.items()]
            + self.load.failures
            + self.restarts
            + [f"--- copier {c.name} (exit {c.proc.poll() if c.proc else None}):\n{c.log()}" for c in self.copiers]
            + [f"--- gateway {g.node_id}:\n{g.log()[-3000:]}" for g in self.gateways]
        )
