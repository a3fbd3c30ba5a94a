"""A topic-partition repeated in an offsets list, over HTTP: the last entry wins (as in Kafka), the
commit answers the offsets as stored, and nothing is a 500."""

from __future__ import annotations

import uuid


def test_group_offset_commit_answers_the_offsets_as_stored(api, topic_name):
    api.post("/v1/topics", json={"name": topic_name, "partitions": 2})
    group = f"g-{uuid.uuid4().hex[:8]}"
    body = {
        "offsets": [
            {"topic": topic_name, "partition": 0, "offset": 5, "metadata": "first"},
            {"topic": topic_name, "partition": 1, "offset": 2},
            {"topic": topic_name, "partition": 0, "offset": 9, "metadata": "last"},
        ]
    }
    stored = [
        {"topic": topic_name, "partition": 0, "offset": 9, "metadata": "last"},
        {"topic": topic_name, "partition": 1, "offset": 2, "metadata": ""},
    ]
    r = api.post(f"/v1/groups/{group}/offsets", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"offsets": stored}
    assert api.get(f"/v1/groups/{group}/offsets").json() == {"offsets": stored}


def test_txn_offset_commit_keeps_the_last_offset_of_a_repeated_partition(api, topic_name):
    api.post("/v1/topics", json={"name": topic_name, "partitions": 1})
    group, tid = f"g-{uuid.uuid4().hex[:8]}", f"tx-{uuid.uuid4().hex[:8]}"
    ids = api.post("/v1/producers", json={"transactional_id": tid}).json()
    offsets = [{"topic": topic_name, "partition": 0, "offset": n} for n in (3, 7, 4)]
    r = api.post(f"/v1/transactions/{tid}/offsets", json={**ids, "group_id": group, "offsets": offsets})
    assert r.status_code == 200, r.text
    assert r.json()["groups"] == [group]
    assert api.post(f"/v1/transactions/{tid}/end", json={**ids, "result": "commit"}).status_code == 200
    r = api.get(f"/v1/groups/{group}/offsets", params={"require_stable": "true"})
    assert r.json() == {"offsets": [{"topic": topic_name, "partition": 0, "offset": 4, "metadata": ""}]}
