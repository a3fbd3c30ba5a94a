"""The lean produce-body codec reads every body as the pydantic model declares it: the same records
for what the model accepts (whether or not the fast path takes it as it is), the model's 422 for
what it refuses."""

from __future__ import annotations

import base64
import json

import pytest
from fastapi.exceptions import RequestValidationError

from api.v1 import codec
from api.v1.schemas import PlainProduceBody, ProduceBody
from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError


def body(**fields) -> bytes:  # type: ignore[no-untyped-def]
    return json.dumps(fields).encode()


def test_the_common_body_becomes_records():
    fields, records = codec.produce_body(
        body(producer_id=7, producer_epoch=1, base_sequence=5, records=[{"key": "k", "value": "v"}, {"value": None}]), ProduceBody
    )
    assert fields == {"producer_id": 7, "producer_epoch": 1, "base_sequence": 5, "transactional_id": None, "commit": False}
    assert records == [NewRecord(b"k", b"v"), NewRecord(None, None)]


def test_headers_timestamps_and_base64():
    b64 = lambda s: base64.b64encode(s).decode()  # noqa: E731
    _, records = codec.produce_body(
        body(
            encoding="base64",
            records=[
                {
                    "value": b64(b"\x00\xff"),
                    "headers": [{"key": "h", "value": b64(b"1")}, {"key": "h", "value": None}],
                    "timestamp_ms": 5,
                },
                {"value": b64(b"x"), "headers": {}},
            ],
        ),
        PlainProduceBody,
    )
    assert records == [NewRecord(None, b"\x00\xff", (("h", b"1"), ("h", None)), 5), NewRecord(None, b"x")]
    _, records = codec.produce_body(body(records=[{"value": "v", "headers": {"a": "x", "b": None}}]), PlainProduceBody)
    assert records == [NewRecord(None, b"v", (("a", b"x"), ("b", None)))]


def test_what_the_model_accepts_and_the_fast_path_does_not_take_is_read_as_the_model_reads_it():
    fields, records = codec.produce_body(
        body(producer_id="7", producer_epoch=0, base_sequence=0.0, records=[{"value": "v", "timestamp_ms": "12"}]), ProduceBody
    )
    assert (fields["producer_id"], fields["base_sequence"]) == (7, 0)
    assert records == [NewRecord(None, b"v", (), 12)]
    for sent, read in ((True, True), ("true", True), (0, False)):
        assert codec.produce_body(body(commit=sent, records=[{"value": "v"}]), ProduceBody)[0]["commit"] is read


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        body(records=[]),
        body(records="x"),
        body(records=[{"value": 5}]),
        body(records=[{"value": "v", "timestamp_ms": -1}]),
        body(records=[{"value": "v", "headers": [{"value": "no key"}]}]),
        body(records=[{"value": "v"}], producer_epoch=40_000),
        body(records=[{"value": "v"}], encoding="latin1"),
        body(records=[{"value": "v"}], transactional_id=""),
    ],
)
def test_what_the_model_refuses_is_its_422(raw):
    with pytest.raises(RequestValidationError) as exc:
        codec.produce_body(raw, ProduceBody)
    assert all(e["loc"][0] == "body" for e in exc.value.errors())


def test_record_content_errors_are_named():
    with pytest.raises(TxlogError) as exc:
        codec.produce_body(body(encoding="base64", records=[{"value": "!!"}]), PlainProduceBody)
    assert exc.value.code is ErrorCode.INVALID_RECORD
    with pytest.raises(TxlogError) as exc:
        codec.produce_body(b'{"records": [{"value": "v", "headers": {"\\ud800": "x"}}]}', PlainProduceBody)
    assert exc.value.code is ErrorCode.INVALID_RECORD
