"""read_committed stays cheap however many transactions a partition has seen: the last stable
offset comes from the partial index of open transactions, aborted ranges from a primary-key lookup
of ``aborted_txns`` (Kafka's .txnindex), records from the records' primary key. Checked with
EXPLAIN ANALYZE of every statement a fetch sends, on a partition with a few transactions and on
one with thousands, and thousands of producers."""

from __future__ import annotations

from sqlalchemy import text

from app.domain.records import NewRecord
from app.services import fetch as fetch_service
from app.services import topics
from app.services.produce import ProduceRequest, produce
from app.services.transactions import init_producer_id
from tests.integration.test_log import _explain, _statements_of
from tests.integration.test_transactions import Producer, status

# the tables that grow with the log and its transactions (``partitions`` has a row per partition)
GROWING = {"records", "producer_partitions", "aborted_txns"}


def _history(broker, topic: str, transactions: int) -> None:  # type: ignore[no-untyped-def]
    """As many idempotent producers as transactions, each leaving its producer state on the
    partition; transactions of three producers, every other one aborted; then one left open."""
    for _ in range(transactions):
        pid = init_producer_id(broker, None).producer_id
        produce(broker, topic, 0, ProduceRequest([NewRecord(None, b"plain")], pid, 0, 0))
    producers = [Producer(broker, f"{topic}-p{i}") for i in range(3)]
    for n in range(transactions):
        p = producers[n % 3]
        p.send(topic, 0, f"t{n}-a", f"t{n}-b")
        p.abort() if n % 2 else p.commit()
    Producer(broker, f"{topic}-open").send(topic, 0, "open")
    for p in producers:
        p.send(topic, 0, "after-open")
        p.commit()


def test_read_committed_cost_does_not_grow_with_the_transactions_seen(broker):  # type: ignore[no-untyped-def]
    sizes = {"few": 6, "many": 2000}
    for topic, n in sizes.items():
        topics.create_topic(broker, topic, 1)
        _history(broker, topic, n)
    # As autovacuum would have by then: statistics, and the index entries of the transactions'
    # superseded producer-state rows cleared.
    with broker.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in GROWING:
            conn.execute(text(f"VACUUM ANALYZE txlog.{table}"))

    costs: dict[tuple[str, str], int] = {}
    for topic, n in sizes.items():
        hw, lso = status(broker, topic, 0)
        assert lso == 4 * n < hw  # the open transaction holds the LSO back; records after it wait
        for where, offset in (("start", n), ("end", lso - 12)):

            def fetch() -> None:
                got = fetch_service.fetch(broker, topic, 0, offset, max_records=5, isolation_level="read_committed")
                assert got.records and all(r.value.endswith(b"-a") or r.value.endswith(b"-b") for r in got.records)
                assert all(int(r.value[1:].split(b"-")[0]) % 2 == 0 for r in got.records)  # committed ones only

            total = 0
            for statement, parameters in _statements_of(broker, fetch, touching=("txlog.",)):
                nodes, buffers = _explain(broker, statement, parameters)
                scans = [x for x in nodes if x.get("Relation Name") in GROWING]
                assert scans and not [x for x in scans if x["Node Type"] == "Seq Scan"], (statement, scans)
                total += buffers
            costs[(topic, where)] = total
    # the same fetch costs about the same after 6 transactions and after 2,000
    for where in ("start", "end"):
        assert costs[("many", where)] <= 2 * costs[("few", where)] + 10, costs
