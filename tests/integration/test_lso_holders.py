"""The admin pages' ``lso_holders`` states the last stable offset rule again, for the transaction
holding it back: here it is held equal to the log's own (``txlog.partition_status``, read by
``log.partition_status``: the least first offset of an open transaction on the partition, else the
high watermark), over random transactions left open, prepared, committed and aborted on a few
partitions, with plain appends between them."""

from __future__ import annotations

import random

from app.domain.records import NewRecord
from app.domain.transactions import OPEN_STATE_NAMES
from app.services import produce as produce_service
from app.services import topics
from app.services.produce import ProduceRequest
from app.storage import admin_reads
from app.storage import log as log_store
from tests.integration.test_transactions import Producer, describe, prepare_only

PARTITIONS = 4  # the last one only ever gets plain appends


def _agree(broker, topic: str) -> int:  # type: ignore[no-untyped-def]
    """Asserts that every partition's holder agrees with its status; the partitions held."""
    with broker.db.read() as conn:
        holders = {(h.topic, h.partition): h for h in admin_reads.lso_holders(conn)}
        statuses = [log_store.partition_status(conn, topic, p) for p in range(PARTITIONS)]
    assert set(holders) <= {(topic, p) for p in range(PARTITIONS)}
    for s in statuses:
        h = holders.get((topic, s.partition))
        if h is None:
            assert (s.last_stable_offset, s.open_transactions) == (s.high_watermark, 0), s
            continue
        assert (h.last_stable_offset, h.high_watermark) == (s.last_stable_offset, s.high_watermark), (h, s)
        assert s.open_transactions >= 1 and h.last_stable_offset < h.high_watermark
        assert h.transactional_id is not None and h.state in OPEN_STATE_NAMES
        meta = describe(broker, h.transactional_id)
        assert (meta.producer_id, meta.producer_epoch, meta.state.value) == (h.producer_id, h.producer_epoch, h.state)
        assert (topic, s.partition) in meta.partitions
    return len(holders)


def test_lso_holders_agree_with_the_partition_status_of_every_partition(broker):
    topics.create_topic(broker, "lso", PARTITIONS)
    rng = random.Random(1124)
    producers = [Producer(broker, f"tx{i}") for i in range(6)]
    prepared: dict[str, str] = {}  # transactional id: the decision it waits to complete
    ongoing: set[str] = set()
    most_held = 0
    for step in range(150):
        p = rng.choice(producers)
        if p.tid in prepared:  # only its EndTxn, retried, can move it on
            p.end(prepared.pop(p.tid))
        else:
            action = rng.choices(["send", "commit", "abort", "prepare", "plain"], weights=[5, 2, 2, 1, 2])[0]
            if action == "send":
                for partition in rng.sample(range(PARTITIONS - 1), rng.randint(1, 2)):
                    p.send("lso", partition, *(f"{p.tid}-{step}-{k}" for k in range(rng.randint(1, 3))))
                ongoing.add(p.tid)
            elif action in ("commit", "abort") and p.tid in ongoing:
                p.end(action)
                ongoing.discard(p.tid)
            elif action == "prepare" and p.tid in ongoing:
                result = rng.choice(["commit", "abort"])
                prepare_only(broker, p.tid, result)
                prepared[p.tid] = result
                ongoing.discard(p.tid)
            else:
                partition = rng.randrange(PARTITIONS)
                produce_service.produce(broker, "lso", partition, ProduceRequest([NewRecord(None, b"plain")]))
        most_held = max(most_held, _agree(broker, "lso"))
    assert most_held >= 2  # several partitions were held at once
    for p in producers:  # everything ends: nothing holds any partition back
        if p.tid in prepared:
            p.end(prepared.pop(p.tid))
        elif p.tid in ongoing:
            p.abort()
    assert _agree(broker, "lso") == 0
