"""The hot routes (``api.v1.hot``): produce, EndTxn, fetch and a share group's acquisition answered straight from ASGI must
answer every request exactly as their FastAPI routes do, be what answers them, and count in the
metrics under the route's name. Two applications over one database: one with the hot routes, one without."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Iterator

import httpx
import pytest

from api.app import create_app
from api.metrics import REQUESTS
from api.v1 import hot
from app.config import load_settings

JSON = {"content-type": "application/json"}


class Client:
    """Requests to an application in this process, through its whole middleware stack, on one
    event loop that runs the application's lifespan (its long-poll listener) throughout."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.runner = asyncio.Runner()
        self.lifespan = app.router.lifespan_context(app)
        self.runner.run(self.lifespan.__aenter__())

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://txlog") as c:
                return await c.request(method, path, **kwargs)

        return self.runner.run(send())

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def close(self) -> None:
        self.runner.run(self.lifespan.__aexit__(None, None, None))
        self.runner.close()


@pytest.fixture
def clients(db_url: str) -> Iterator[tuple[Client, Client]]:
    """(with the hot routes, FastAPI's routes alone)."""
    settings = load_settings(database_url=db_url)
    with_hot = create_app(settings, run_sweeper=False)
    without = create_app(settings, run_sweeper=False)
    without.user_middleware = [m for m in without.user_middleware if m.cls is not hot.HotRoutes]
    assert len(without.user_middleware) == len(with_hot.user_middleware) - 1
    h, f = Client(with_hot), Client(without)
    try:
        assert h.post("/v1/topics", json={"name": "hot", "partitions": 2}).status_code == 201
        yield h, f
    finally:
        h.close()
        f.close()


def _batch(n: int = 3, **fields: Any) -> dict:
    return {**fields, "records": [{"key": f"k{i}", "value": f"v{i}", "headers": {"h": "x"}} for i in range(n)]}


# Requests whose answer does not depend on the log's state: (method, path, body bytes, headers).
SAME_ANSWER = [
    ("/v1/topics/nope/partitions/0/records", _batch(), JSON),
    ("/v1/topics/hot/partitions/7/records", _batch(), JSON),
    ("/v1/topics/hot/partitions/01/records", {"records": []}, JSON),
    ("/v1/topics/hot/partitions/-1/records", _batch(), JSON),
    ("/v1/topics/hot/partitions/x/records", _batch(), JSON),
    ("/v1/topics/hot/partitions/9999999999/records", _batch(), JSON),
    ("/v1/topics/hot/partitions/0/records", b"{not json", JSON),
    ("/v1/topics/hot/partitions/0/records", {"records": "many"}, JSON),
    ("/v1/topics/hot/partitions/0/records", {"records": []}, JSON),
    ("/v1/topics/hot/partitions/0/records", _batch(producer_id=424242, producer_epoch=0, base_sequence=5), JSON),
    ("/v1/topics/hot/partitions/0/records", _batch(producer_id=1, producer_epoch=0), JSON),
    ("/v1/topics/hot/partitions/0/records", _batch(transactional_id="t"), JSON),
    ("/v1/topics/nope/records", _batch(), JSON),
    ("/v1/topics/hot/records", {"records": [{"value": 5}]}, JSON),
    ("/v1/topics/hot/records", b"", JSON),
    ("/v1/transactions/unknown-tid/end", {"producer_id": 1, "producer_epoch": 0, "result": "commit"}, JSON),
    ("/v1/transactions/unknown-tid/end", {"producer_id": 1, "producer_epoch": 0, "result": "maybe"}, JSON),
    ("/v1/transactions/unknown-tid/end", {"producer_id": "one", "producer_epoch": 0, "result": "abort"}, JSON),
    ("/v1/transactions/unknown-tid/end", {"producer_id": 1, "result": "abort"}, JSON),
    ("/v1/transactions/unknown-tid/end", b"[1, 2]", JSON),
    ("/v1/transactions/unknown-tid/end", b"{not json", JSON),
    (
        "/v1/transactions/unknown-tid/end",
        b'{"producer_id": 1, "producer_epoch": 0, "result": "commit"}',
        {"content-type": "text/plain"},
    ),
    ("/v1/transactions/unknown-tid/end", b'{"producer_id": 1, "producer_epoch": 0, "result": "commit"}', {}),
    ("/v1/share-groups/g/acquire", {"topic": "nope", "member_id": "m"}, JSON),
    ("/v1/share-groups/g/acquire", {"partitions": [{"topic": "hot", "partition": 9}], "member_id": "m"}, JSON),
    ("/v1/share-groups/g/acquire", {"topic": "hot", "max_records": 0}, JSON),
    ("/v1/share-groups/g/acquire", {"member_id": "m"}, JSON),
    ("/v1/share-groups/g/acquire", b"{not json", JSON),
    (
        "/v1/share-groups/g/acquire",
        {"topic": "hot", "acknowledgements": [{"topic": "hot", "partition": 0, "offset": 0, "type": "accept"}]},
        JSON,
    ),
    ("/v1/share-groups/g/acquire", b'{"topic": "hot", "member_id": "m"}', {"content-type": "text/plain"}),
]


def _post(client: Client, path: str, body: Any, headers: dict[str, str]):  # type: ignore[no-untyped-def]
    if isinstance(body, bytes):
        return client.post(path, content=body, headers=headers)
    return client.post(path, json=body, headers=headers)


@pytest.mark.parametrize("path,body,headers", SAME_ANSWER, ids=range(len(SAME_ANSWER)))
def test_a_refused_request_is_answered_as_fastapi_answers_it(clients, path: str, body: Any, headers: dict) -> None:
    h, f = clients
    mine, theirs = _post(h, path, body, headers), _post(f, path, body, headers)
    assert (mine.status_code, mine.headers["content-type"], mine.json()) == (
        theirs.status_code,
        theirs.headers["content-type"],
        theirs.json(),
    )


def test_an_appended_batch_is_answered_as_fastapi_answers_it(clients) -> None:  # type: ignore[no-untyped-def]
    """The same idempotent batch sent to both: the second is a duplicate with the first's offsets."""
    h, f = clients
    pid = h.post("/v1/producers", json={}).json()
    batch = _batch(producer_id=pid["producer_id"], producer_epoch=pid["producer_epoch"], base_sequence=0)
    for first, second in ((f, h), (h, f)):
        part = 0 if first is f else 1
        original = first.post(f"/v1/topics/hot/partitions/{part}/records", json=batch)
        again = second.post(f"/v1/topics/hot/partitions/{part}/records", json=batch)
        assert original.status_code == again.status_code == 200
        assert original.headers["content-type"] == again.headers["content-type"] == "application/json"
        assert original.json()["duplicate"] is False
        assert again.json() == {**original.json(), "duplicate": True}
    plain = [c.post("/v1/topics/hot/records", json=_batch(1)) for c in (h, f)]
    assert [r.status_code for r in plain] == [200, 200]
    assert plain[0].json().keys() == plain[1].json().keys() >= {"partition", "base_offset"}


def test_an_ended_transaction_is_answered_as_fastapi_answers_it(clients) -> None:  # type: ignore[no-untyped-def]
    """EndTxn by one, its retry by the other: the retry answers the same outcome, byte for byte."""
    h, f = clients
    for first, second in ((h, f), (f, h)):
        tid = f"hot-{uuid.uuid4().hex[:8]}"
        ids = h.post("/v1/producers", json={"transactional_id": tid}).json()
        ids = {"producer_id": ids["producer_id"], "producer_epoch": ids["producer_epoch"]}
        produced = h.post("/v1/topics/hot/partitions/0/records", json=_batch(transactional_id=tid, base_sequence=0, **ids))
        assert produced.status_code == 200, produced.text
        end = first.post(f"/v1/transactions/{tid}/end", json={**ids, "result": "commit"})
        retry = second.post(f"/v1/transactions/{tid}/end", json={**ids, "result": "commit"})
        assert end.status_code == retry.status_code == 200, (end.text, retry.text)
        assert end.content == retry.content
        assert end.json()["state"] == "CompleteCommit"
        contradicted = second.post(f"/v1/transactions/{tid}/end", json={**ids, "result": "abort"})
        assert contradicted.json() == first.post(f"/v1/transactions/{tid}/end", json={**ids, "result": "abort"}).json()
        assert contradicted.json()["error"]["code"] == "INVALID_TXN_STATE"


# Fetch query strings, each answered alike (the log: 3 records, then a committed transaction of 3).
FETCHES = [
    "",
    "?offset=1",
    "?offset=2&max_records=1",
    "?max_bytes=1",
    "?isolation_level=read_committed",
    "?isolation_level=read_uncommitted&encoding=base64",
    "?offset=99",
    "?offset=7&wait_ms=50",
    "?offset=1&unknown=5",
    "?offset=-1",
    "?offset=01",
    "?offset=+1",
    "?offset=1.0",
    "?offset=",
    "?offset=9223372036854775808",
    "?offset=9223372036854775807",
    "?max_records=0",
    "?max_records=100001",
    "?max_bytes=2147483648",
    "?wait_ms=60001",
    "?isolation_level=READ_COMMITTED",
    "?encoding=hex",
    "?offset=1&offset=2",
    "?encoding=utf8&encoding=utf8",
    "?offset=%31",
    "?wait_ms=%2010",
]


def test_a_fetch_is_answered_as_fastapi_answers_it(clients) -> None:  # type: ignore[no-untyped-def]
    h, f = clients
    assert h.post("/v1/topics/hot/partitions/0/records", json=_batch()).status_code == 200
    tid = f"hot-{uuid.uuid4().hex[:8]}"
    ids = h.post("/v1/producers", json={"transactional_id": tid}).json()
    ids = {"producer_id": ids["producer_id"], "producer_epoch": ids["producer_epoch"]}
    assert (
        h.post("/v1/topics/hot/partitions/0/records", json=_batch(transactional_id=tid, base_sequence=0, **ids)).status_code
        == 200
    )
    assert h.post(f"/v1/transactions/{tid}/end", json={**ids, "result": "commit"}).status_code == 200
    for query in FETCHES:
        for path in (
            "/v1/topics/hot/partitions/0/records",
            "/v1/topics/nope/partitions/0/records",
            "/v1/topics/hot/partitions/00/records",
        ):
            mine, theirs = h.get(path + query), f.get(path + query)
            assert (mine.status_code, mine.headers["content-type"], mine.json()) == (
                theirs.status_code,
                theirs.headers["content-type"],
                theirs.json(),
            ), (path, query)
    assert h.get("/v1/topics/hot/partitions/0/records?isolation_level=read_committed").json()["next_offset"] == 7


def test_hot_requests_count_under_their_route(clients) -> None:  # type: ignore[no-untyped-def]
    h, _ = clients
    counter = REQUESTS.labels("POST", "/v1/topics/{topic}/partitions/{partition}/records", "200")
    before = counter._value.get()
    assert h.post("/v1/topics/hot/partitions/0/records", json=_batch()).status_code == 200
    assert counter._value.get() == before + 1


def test_the_hot_routes_answer_without_fastapi(db_url: str) -> None:
    """Called as ASGI with an application behind that fails if reached: produce and EndTxn are
    answered; what they leave to FastAPI (another content type for EndTxn) reaches it."""
    app = create_app(load_settings(database_url=db_url), run_sweeper=False)
    reached: list[str] = []

    async def fastapi(scope: dict, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 599, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    client = Client(app)
    try:
        assert client.post("/v1/topics", json={"name": "hot", "partitions": 1}).status_code == 201
        middleware = hot.HotRoutes(fastapi, hot.executor(app.state.settings))

        def call(
            path: str, body: bytes, content_type: bytes = b"application/json", method: str = "POST", query: bytes = b""
        ) -> int:
            scope = {
                "type": "http",
                "method": method,
                "path": path,
                "raw_path": path.encode(),
                "root_path": "",
                "query_string": query,
                "headers": [(b"content-type", content_type)],
                "app": app,
            }
            messages = [{"type": "http.request", "body": body, "more_body": False}]
            sent: list[dict] = []

            async def receive() -> dict:
                return messages.pop(0) if messages else {"type": "http.disconnect"}

            async def send(message: dict) -> None:
                sent.append(message)

            client.runner.run(middleware(scope, receive, send))
            return sent[0]["status"]

        end = b'{"producer_id": 1, "producer_epoch": 0, "result": "commit"}'
        assert call("/v1/topics/hot/partitions/0/records", b'{"records": [{"value": "a"}]}') == 200
        assert call("/v1/topics/hot/partitions/0/records", b"", method="GET", query=b"offset=0&max_records=1") == 200
        assert call("/v1/topics/hot/records", b'{"records": [{"value": "a"}]}') == 200
        assert call("/v1/topics/hot/partitions/0/records", b"{}") == 422
        assert call("/v1/transactions/nobody/end", end) == 409
        assert call("/v1/share-groups/g/acquire", b'{"topic": "hot", "member_id": "m"}') == 200
        assert reached == []
        assert call("/v1/transactions/nobody/end", end, b"text/plain") == 599
        assert call("/v1/topics/hot/partitions/00/records", b"{}") == 599
        assert call("/v1/topics/hot/partitions/0/delete-records", b"{}") == 599
        assert call("/v1/topics/hot/partitions/0/records", b"", method="GET", query=b"offset=x") == 599
        assert reached == [
            "/v1/transactions/nobody/end",
            "/v1/topics/hot/partitions/00/records",
            "/v1/topics/hot/partitions/0/delete-records",
            "/v1/topics/hot/partitions/0/records",
        ]
    finally:
        client.close()


def test_a_share_acquisition_is_answered_as_fastapi_answers_it(clients) -> None:  # type: ignore[no-untyped-def]
    """Acquisitions carrying the acknowledgements of the one before, alternately through each."""
    h, f = clients
    assert (
        h.request(
            "PATCH", "/v1/share-groups/hot-share/configs", json={"configs": {"share.auto.offset.reset": "earliest"}}
        ).status_code
        == 200
    )
    assert h.post("/v1/topics/hot/partitions/0/records", json=_batch(4)).status_code == 200
    answers = []
    acks: list[dict] = []
    for client in (h, f, h, f):
        body: dict[str, Any] = {"partitions": [{"topic": "hot", "partition": 0}], "member_id": "m", "max_records": 1}
        if acks:
            body["acknowledgements"] = acks
        r = client.post("/v1/share-groups/hot-share/acquire", json=body)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
        doc = r.json()
        answers.append(([x["offset"] for x in doc["records"]], doc.get("acknowledgements")))
        acks = [{"topic": "hot", "partition": 0, "offset": x["offset"], "type": "accept"} for x in doc["records"]]
    accepted = {"topic": "hot", "partition": 0, "accepted": 1, "released": 0, "archived": 0, "renewed": 0, "error": None}
    assert answers == [([0], None), ([1], [accepted]), ([2], [accepted]), ([3], [accepted])]
