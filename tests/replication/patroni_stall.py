"""A network stall of the primary under Patroni: SIGSTOP of every process of its PostgreSQL while
its Patroni keeps running; the standby is promoted once the leader key's ``ttl`` ran out, and the
old primary, resumed, takes no write as a second primary (see tests/replication/
test_patroni_failover.py, whose cluster and checks it uses). About half a minute: ``make chaos``
runs this module by name (pytest collects only ``test_*.py`` on its own); the suite runs the
``kill -9`` failover."""

from __future__ import annotations

import threading

import psycopg

from tests.replication.patroni_cluster import TTL, PatroniNode
from tests.replication.test_patroni_failover import HA, ha, rejoins, run_fault

__all__ = ["ha"]  # the module's cluster fixture


def test_a_frozen_primary_is_replaced_and_demoted_when_it_wakes(ha: HA) -> None:
    frozen: list[int] = []
    probe: dict[str, object] = {}

    def stall(old: PatroniNode, new: PatroniNode) -> None:
        frozen.extend(old.freeze())
        assert frozen, "no PostgreSQL process to freeze"
        try:
            ha.cluster.wait(new.is_primary, TTL * 3 + 30, f"{new.name} promoted")
        except BaseException:
            PatroniNode.thaw(frozen)  # the producers' requests to it end, so the test ends soon
            raise

        # The old primary wakes: a write sent to it at once must never be acknowledged (it waits for
        # a synchronous standby it no longer has, until Patroni demotes it).
        def write() -> None:
            try:
                with psycopg.connect(old.admin_url("txlog"), autocommit=True, connect_timeout=5) as conn:
                    conn.execute("CREATE TABLE IF NOT EXISTS split_brain_probe (x int)")
                    conn.execute("INSERT INTO split_brain_probe VALUES (1)")
                probe["result"] = "acknowledged"
            except psycopg.Error as exc:
                probe["result"] = f"refused: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"

        PatroniNode.thaw(frozen)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        probe["thread"] = writer

    result = run_fault(ha, "sigstop", stall)
    old, new = result["old"], result["new"]
    rejoins(ha, old, new, result["faulted_at"], "demoted by its Patroni on waking, rewound")
    writer = probe["thread"]
    assert isinstance(writer, threading.Thread)
    writer.join(60)
    assert not writer.is_alive(), "a write to the woken old primary neither answered nor ended"
    assert probe["result"] != "acknowledged", "the old primary acknowledged a write after the standby's promotion"
    assert not new.query("SELECT to_regclass('split_brain_probe') IS NOT NULL", database="txlog")[0][0] or (
        new.query("SELECT count(*) FROM split_brain_probe", database="txlog")[0][0] == 0
    )
    print(f"  a write sent to the woken old primary: {probe['result']}")
