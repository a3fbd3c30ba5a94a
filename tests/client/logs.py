"""Reading and writing topics over raw HTTP, independent of the client under test."""

from __future__ import annotations

import base64

import httpx


def create_topic(url: str, name: str, partitions: int = 1) -> None:
    r = httpx.post(f"{url}/v1/topics", json={"name": name, "partitions": partitions}, timeout=10)
    assert r.status_code == 201, r.text


def read_partition(url: str, topic: str, partition: int, isolation_level: str = "read_committed") -> list[dict]:
    """Every record a reader at ``isolation_level`` sees, keys, values and header values as bytes."""
    out: list[dict] = []
    offset = 0
    with httpx.Client(base_url=url, timeout=30) as client:
        while True:
            r = client.get(
                f"/v1/topics/{topic}/partitions/{partition}/records",
                params={"offset": offset, "max_records": 1000, "isolation_level": isolation_level, "encoding": "base64"},
            )
            assert r.status_code == 200, r.text
            page = r.json()
            for rec in page["records"]:
                out.append(
                    {
                        "offset": rec["offset"],
                        "key": _bytes(rec["key"]),
                        "value": _bytes(rec["value"]),
                        "headers": [(h["key"], _bytes(h["value"])) for h in rec["header_list"]],
                    }
                )
            offset = page["next_offset"]
            end = page["last_stable_offset"] if isolation_level == "read_committed" else page["high_watermark"]
            if offset >= end:
                return out


def read_topic(url: str, topic: str, partitions: int, isolation_level: str = "read_committed") -> dict[int, list[dict]]:
    return {p: read_partition(url, topic, p, isolation_level) for p in range(partitions)}


def group_offsets(url: str, group: str) -> dict[tuple[str, int], int]:
    r = httpx.get(f"{url}/v1/groups/{group}/offsets", timeout=10)
    assert r.status_code == 200, r.text
    return {(o["topic"], o["partition"]): o["offset"] for o in r.json()["offsets"]}


def _bytes(v: str | None) -> bytes | None:
    return None if v is None else base64.b64decode(v)
