"""The lean codec of the hot paths: produce bodies decoded and fetch pages encoded without a
model object per record.

A produce body is decoded with orjson and checked field by field on the way to the records. The
pydantic models in ``schemas`` remain the declared shape (the OpenAPI document) and the judge of
every body the fast path does not take as it is: anything it does not recognise is validated by
the model, so an invalid body gets exactly the model's 422 answer.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from api.v1.schemas import MAX_BODY_RECORDS, MAX_TIMESTAMP_MS
from app.domain.log import StoredRecord
from app.domain.producer_state import MAX_EPOCH
from app.domain.records import (
    MAX_STRING_LENGTH,
    Encoding,
    Headers,
    NewRecord,
    decode_bytes,
    encode_bytes,
    headers_from_object,
    headers_object,
    valid_text,
    validate_headers,
)
from app.domain.transactions import MAX_TRANSACTIONAL_ID_LENGTH
from app.services.fetch import FetchResult


class _Unusual(Exception):
    """The fast path does not take this body as it is: let the model judge it."""


def _validated(model: type[BaseModel], obj: Any) -> BaseModel:
    """The model's reading of ``obj``, or its 422."""
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]) from None


def decode_body(raw: bytes, model: type[BaseModel]) -> dict[str, Any]:
    """The JSON object of a request body, or the 422 the model would answer."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson refuses escaped lone surrogates ("\ud800"), which are valid JSON: the standard
        # library reads them, and the records' checks then name the field that holds one.
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            pos = getattr(exc, "pos", getattr(exc, "start", 0))
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", pos),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": str(exc)},
                    }
                ]
            ) from None
    if not isinstance(obj, dict):
        _validated(model, obj)
        raise AssertionError("the model accepted a non-object body")
    return obj


def _text_or_none(v: Any) -> str | None:
    if v is None or type(v) is str:
        return v
    raise _Unusual


def _headers(h: Any, encoding: Encoding, i: int) -> Headers:
    if type(h) is dict:
        for v in h.values():
            _text_or_none(v)
        out = headers_from_object({k: None if v is None else valid_text(v, f"records[{i}].headers value") for k, v in h.items()})
    elif type(h) is list:
        items = []
        for j, e in enumerate(h):
            if type(e) is not dict or type(e.get("key")) is not str or len(e["key"]) > MAX_STRING_LENGTH:
                raise _Unusual
            items.append((e["key"], decode_bytes(_text_or_none(e.get("value")), encoding, f"records[{i}].headers[{j}].value")))
        out = tuple(items)
    else:
        raise _Unusual
    validate_headers(out, f"records[{i}].headers")
    return out


def _records(items: Any, encoding: Encoding) -> list[NewRecord]:
    if type(items) is not list or not 1 <= len(items) <= MAX_BODY_RECORDS:
        raise _Unusual
    out = []
    utf8 = encoding == "utf8"
    new = tuple.__new__  # a NamedTuple's own constructor costs twice as much
    k: bytes | None
    v: bytes | None
    for i, r in enumerate(items):
        if type(r) is not dict:
            raise _Unusual
        key, value = r.get("key"), r.get("value")
        if utf8 and type(key) is str and type(value) is str:  # the common case, inline
            k, v = key.encode("utf-8", "surrogatepass"), value.encode("utf-8", "surrogatepass")
        else:
            k = decode_bytes(_text_or_none(key), encoding, f"records[{i}].key")
            v = decode_bytes(_text_or_none(value), encoding, f"records[{i}].value")
        ts = r.get("timestamp_ms")
        if ts is not None and (type(ts) is not int or not 0 <= ts <= MAX_TIMESTAMP_MS):
            raise _Unusual
        h = r.get("headers")
        out.append(new(NewRecord, (k, v, _headers(h, encoding, i) if h is not None else (), ts)))
    return out


def _int_or_none(obj: dict[str, Any], name: str, high: int) -> int | None:
    v = obj.get(name)
    if v is None or (type(v) is int and 0 <= v <= high):
        return v
    raise _Unusual


def produce_body(raw: bytes, model: type[BaseModel]) -> tuple[dict[str, Any], list[NewRecord]]:
    """A produce body (``ProduceBody`` or ``PlainProduceBody``): its fields and its records, decoded
    to bytes. Raises the model's 422 for an invalid body, INVALID_RECORD for a value that is not
    valid base64 or text that PostgreSQL cannot store."""
    obj = decode_body(raw, model)
    try:
        return _read(obj, model)
    except _Unusual:
        # Not taken as it is: the model judges it, and what it accepts (a number sent as "12",
        # say) is read as the model reads it.
        return _read(_validated(model, obj).model_dump(), model)


def _read(obj: dict[str, Any], model: type[BaseModel]) -> tuple[dict[str, Any], list[NewRecord]]:
    encoding = obj.get("encoding", "utf8")
    if encoding not in ("utf8", "base64"):
        raise _Unusual
    fields: dict[str, Any] = {}
    if "producer_id" in model.model_fields:
        fields["producer_id"] = _int_or_none(obj, "producer_id", 2**63 - 1)
        fields["producer_epoch"] = _int_or_none(obj, "producer_epoch", MAX_EPOCH)
        fields["base_sequence"] = _int_or_none(obj, "base_sequence", 2**31 - 1)
        tid = obj.get("transactional_id")
        if tid is not None and (type(tid) is not str or not 1 <= len(tid) <= MAX_TRANSACTIONAL_ID_LENGTH):
            raise _Unusual
        fields["transactional_id"] = tid
        commit = obj.get("commit", False)
        if type(commit) is not bool:
            raise _Unusual
        fields["commit"] = commit
    return fields, _records(obj.get("records"), encoding)


def fetch_page(result: FetchResult, encoding: Encoding) -> bytes:
    """A fetch answer (``FetchResponse``) as JSON: one dict per record, no model, orjson."""
    return orjson.dumps(
        {
            "topic": result.topic,
            "partition": result.partition,
            "records": fetched_records(result.records, encoding),
            "next_offset": result.next_offset,
            "high_watermark": result.high_watermark,
            "last_stable_offset": result.last_stable_offset,
            "log_start_offset": result.log_start_offset,
        }
    )


# A record without headers shares these (orjson only reads them): two containers fewer per record
# for the allocator and the garbage collector.
_NO_HEADERS: dict[str, Any] = {}
_NO_HEADER_LIST: list[Any] = []


def fetched_records(records: list[StoredRecord], encoding: Encoding) -> list[dict[str, Any]]:
    """Records as a fetch answers them (``FetchedRecord``), in ``encoding``; the share-group
    routes answer acquired records so too."""
    out = []
    utf8 = encoding == "utf8"
    k: str | None
    v: str | None
    for r in records:
        key, value = r.key, r.value
        headers = r.headers if r.header_keys else None
        if utf8 and key is not None and value is not None:  # the common case, inline
            k, v = key.decode("utf-8", "replace"), value.decode("utf-8", "replace")
        else:
            k, v = encode_bytes(key, encoding), encode_bytes(value, encoding)
        out.append(
            {
                "offset": r.offset,
                "key": k,
                "value": v,
                "headers": headers_object(headers) if headers else _NO_HEADERS,
                "header_list": [{"key": hk, "value": encode_bytes(hv, encoding)} for hk, hv in headers]
                if headers
                else _NO_HEADER_LIST,
                "timestamp_ms": r.timestamp_ms,
            }
        )
    return out
