"""The fault suite's database faults on a Patroni cluster (``TXLOG_CHAOS_HA=1``).

The suite's database is then ``tests.replication.patroni_cluster``: etcd, a primary and its
synchronous standby, each run by its own Patroni, every txlog process given the cluster's
multi-host URL (``target_session_attrs=read-write``). Two fault kinds replace the one server's
immediate restart:

- ``fail over PostgreSQL``: the leader's PostgreSQL ``kill -9``-ed (its Patroni hands the leader
  key to the synchronous standby at once, ``primary_start_timeout`` being 0) or, at random,
  SIGSTOPped until Patroni has promoted the standby, which it does only once the leader key has
  expired (the TTL), then resumed (Patroni demotes it and rewinds it to follow). The fault is over
  when the standby is promoted and every Kafka producer delivers again; before the next fault the
  old primary has rejoined as the synchronous standby, so no fault finds a cluster that cannot
  fail over without loss.
- ``restart PostgreSQL's leader``: a clean restart of the leader in place by its Patroni (``POST
  /restart``), the leader key kept; over once the leader has its synchronous standby again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from random import Random
from typing import Callable

from tests.replication.patroni_cluster import TTL, PatroniCluster, PatroniNode


@dataclass
class Failover:
    how: str
    old: str
    new: str
    promoted_s: float  # after the fault began
    delivering_s: float  # every Kafka producer acknowledged again
    rejoined_s: float  # the old primary the synchronous standby


@dataclass
class PatroniFaults:
    cluster: PatroniCluster
    rng: Random
    wait_delivering: Callable[[float, float], None]  # (since, timeout): every Kafka producer delivered after since
    failovers: list[Failover] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)  # seconds until the restarted leader had its standby again

    def kinds(self) -> dict[str, Callable[[], str | None]]:
        return {"fail over PostgreSQL": self.fail_over, "restart PostgreSQL's leader": self.restart_leader}

    def fail_over(self) -> str:
        old, new = self.cluster.healthy()
        began = time.monotonic()
        if self.rng.random() < 0.5:
            how = "kill -9"
            old.kill9()
            self.cluster.wait(new.is_primary, TTL * 3 + 30, f"{new.name} promoted")
        else:
            how = "SIGSTOP past the TTL"
            frozen = old.freeze()
            try:
                self.cluster.wait(new.is_primary, TTL * 3 + 30, f"{new.name} promoted")
            finally:
                PatroniNode.thaw(frozen)
        promoted = time.monotonic()
        self.wait_delivering(promoted, 90)
        delivering = time.monotonic()
        self.cluster.wait_synchronous(new, old, timeout=120)
        failover = Failover(how, old.name, new.name, promoted - began, delivering - began, time.monotonic() - began)
        self.failovers.append(failover)
        return (
            f"fail over PostgreSQL: {how} of {old.name}'s, {new.name} promoted after {failover.promoted_s:.1f} s, "
            f"Kafka producers delivering after {failover.delivering_s:.1f} s, {old.name} the synchronous standby "
            f"after {failover.rejoined_s:.1f} s"
        )

    def restart_leader(self) -> str:
        self.cluster.healthy()
        began = time.monotonic()
        leader = self.cluster.restart_leader()
        self.cluster.healthy()
        self.restarts.append(time.monotonic() - began)
        return f"{leader.name}'s PostgreSQL restarted by Patroni, its synchronous standby back after {self.restarts[-1]:.1f} s"

    def summary(self) -> str:
        lines = [
            f"  {f.how} of {f.old}: {f.new} promoted {f.promoted_s:.1f} s, Kafka producers delivering "
            f"{f.delivering_s:.1f} s, {f.old} synchronous standby {f.rejoined_s:.1f} s after the fault"
            for f in self.failovers
        ]
        restarts = ", ".join(f"{s:.1f} s" for s in self.restarts) or "none"
        return f"Patroni failovers: {len(self.failovers)}\n" + "\n".join(lines) + f"\nleader restarts by Patroni: {restarts}"
