"""The shortest end-to-end path through a real server: create, produce, fetch, commit a transaction."""


def test_produce_and_fetch_over_http(api, topic_name):
    assert api.post("/v1/topics", json={"name": topic_name, "partitions": 2}).status_code == 201
    r = api.post(f"/v1/topics/{topic_name}/partitions/1/records", json={"records": [{"key": "k", "value": "v"}]})
    assert r.status_code == 200, r.text
    assert (r.json()["base_offset"], r.json()["last_offset"]) == (0, 0)
    got = api.get(f"/v1/topics/{topic_name}/partitions/1/records", params={"offset": 0}).json()
    assert [(x["offset"], x["key"], x["value"]) for x in got["records"]] == [(0, "k", "v")]
    assert got["next_offset"] == 1


def test_transaction_commit_becomes_visible_to_read_committed(api, topic_name):
    api.post("/v1/topics", json={"name": topic_name, "partitions": 1})
    tid = f"tx-{topic_name}"
    p = api.post("/v1/producers", json={"transactional_id": tid}).json()
    body = {
        "transactional_id": tid,
        "producer_id": p["producer_id"],
        "producer_epoch": p["producer_epoch"],
        "base_sequence": 0,
        "records": [{"value": "a"}, {"value": "b"}],
    }
    assert api.post(f"/v1/topics/{topic_name}/partitions/0/records", json=body).status_code == 200
    url = f"/v1/topics/{topic_name}/partitions/0/records"
    before = api.get(url, params={"isolation_level": "read_committed"}).json()
    assert before["records"] == [] and before["last_stable_offset"] == 0 and before["high_watermark"] == 2
    end = api.post(f"/v1/transactions/{tid}/end", json={**{k: p[k] for k in p}, "result": "commit"})
    assert end.status_code == 200 and end.json()["state"] == "CompleteCommit"
    assert end.json()["producer_epoch"] == p["producer_epoch"] + 1
    after = api.get(url, params={"isolation_level": "read_committed"}).json()
    assert [x["value"] for x in after["records"]] == ["a", "b"]
    assert after["next_offset"] == 3  # past the COMMIT marker
