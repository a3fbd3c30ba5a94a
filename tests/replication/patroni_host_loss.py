"""The loss of the primary's whole host under Patroni: its Patroni dies with its PostgreSQL, so the
standby is promoted only once the leader key's ``ttl`` ran out, and the old node rejoins when its
Patroni is started again. Longer than the suite's failovers: ``make chaos`` runs this module by
name (pytest collects only ``test_*.py`` on its own), with the cluster and checks of
tests/replication/test_patroni_failover.py."""

from __future__ import annotations

from tests.replication.patroni_cluster import PatroniNode
from tests.replication.test_patroni_failover import HA, ha, rejoins, run_fault

__all__ = ["ha"]  # the module's cluster fixture


def test_the_primary_host_dies_and_comes_back(ha: HA) -> None:
    def host_dies(old: PatroniNode, new: PatroniNode) -> None:
        old.kill_patroni()
        old.kill9()

    result = run_fault(ha, "host", host_dies)
    old = result["old"]
    assert not old.patroni_alive()
    old.start_patroni()
    rejoins(ha, old, result["new"], result["faulted_at"], "Patroni started again")
