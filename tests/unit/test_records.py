"""Plain rules about topics, records and fetch answers (app.domain.records)."""

import base64

import pytest

from app.domain.records import (
    MAX_PARTITIONS,
    NewRecord,
    decode_bytes,
    encode_bytes,
    fetch_scan_end,
    headers_from_object,
    headers_object,
    next_offset_after_fetch,
    record_size,
    take_within_limits,
    validate_headers,
    validate_partition_count,
    validate_topic_name,
)
from app.errors import ErrorCode, TxlogError


def _code(fn, *args):  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        fn(*args)
    return info.value.code


# --- topic names and partition counts -------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "orders", "Orders.v2", "my_topic-1", "...", ".a", "a..", "x" * 249, "0", "_-."])
def test_legal_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "x" * 250,
        "has space",
        "slash/",
        "colon:",
        "tab\t",
        "nul\x00",
        "\x00",
        "trailing-newline\n",  # a regex "$" would let this through
        "\nleading",
        "ümlaut",
        "emoji\U0001f600",
        "star*",
    ],
)
def test_illegal_topic_names_are_invalid_topic_exception(name):
    assert _code(validate_topic_name, name) is ErrorCode.INVALID_TOPIC_EXCEPTION


def test_illegal_topic_name_message_names_the_rule():
    with pytest.raises(TxlogError) as info:
        validate_topic_name("bad name")
    assert "'bad name'" in info.value.message and "249" in info.value.message


@pytest.mark.parametrize("n", [1, 2, MAX_PARTITIONS])
def test_partition_counts_in_range(n):
    validate_partition_count(n)


@pytest.mark.parametrize("n", [0, -1, -(2**31), MAX_PARTITIONS + 1, 2**31 - 1])
def test_partition_counts_out_of_range_are_invalid_partitions(n):
    assert _code(validate_partition_count, n) is ErrorCode.INVALID_PARTITIONS


# --- encodings ------------------------------------------------------------------------------------


def test_none_stays_none_in_both_encodings():
    for enc in ("utf8", "base64"):
        assert decode_bytes(None, enc, "key") is None
        assert encode_bytes(None, enc) is None


@pytest.mark.parametrize("text", ["", "plain", "ünïcödé ✓", "\U0001f600", "nul\x00inside", "line\nbreak"])
def test_utf8_round_trip(text):
    raw = decode_bytes(text, "utf8", "value")
    assert raw == text.encode("utf-8")
    assert encode_bytes(raw, "utf8") == text


@pytest.mark.parametrize("raw", [b"", b"\x00", b"\x00\x01\x02\xff\xfe", bytes(range(256)), b"abc"])
def test_base64_round_trip_of_arbitrary_bytes(raw):
    text = encode_bytes(raw, "base64")
    assert text == base64.b64encode(raw).decode()
    assert decode_bytes(text, "base64", "value") == raw


def test_empty_string_is_empty_bytes_not_null():
    assert decode_bytes("", "utf8", "key") == b""
    assert decode_bytes("", "base64", "key") == b""


@pytest.mark.parametrize("bad", ["!!!", "abc", "YW Jj", "é", "YWJj\n", "====", "a"])
def test_bad_base64_is_invalid_record_naming_the_field(bad):
    with pytest.raises(TxlogError) as info:
        decode_bytes(bad, "base64", "records[3].key")
    assert info.value.code is ErrorCode.INVALID_RECORD
    assert "records[3].key" in info.value.message


def test_non_utf8_bytes_read_as_utf8_never_fail():
    assert encode_bytes(b"\xff\xfeok", "utf8") == "\ufffd\ufffdok"


# --- sizes ----------------------------------------------------------------------------------------


def test_record_size_counts_key_value_and_headers_in_bytes():
    assert record_size(None, None, None) == 0
    assert record_size(b"ab", b"cde", None) == 5
    assert record_size(b"", b"", [("h", b"vv")]) == 3
    assert record_size(None, b"x", [("é", "✓".encode()), ("k", None)]) == 1 + 2 + 3 + 1
    assert record_size(None, None, [("k", b"1"), ("k", b"22")]) == 2 + 3  # a repeated key counts each time
    assert NewRecord(b"k", b"value", (("a", b"b"),)).size() == 1 + 5 + 2


# --- headers --------------------------------------------------------------------------------------


def test_headers_object_keeps_the_last_value_of_each_key_as_text():
    headers = (("k", b"1"), ("bin", b"\xff"), ("k", b"2"), ("none", None))
    assert headers_object(headers) == {"k": "2", "bin": "\ufffd", "none": None}
    assert headers_object(()) == {}


def test_headers_from_the_object_form_are_utf8_text_in_order():
    assert headers_from_object({"b": "✓", "a": None}) == (("b", "✓".encode()), ("a", None))


def test_header_keys_must_be_text_without_nul():
    validate_headers([("ok", b"\x00 values may hold anything")], "records[0].headers")
    for bad in ("a\x00b", "\ud800"):
        with pytest.raises(TxlogError) as info:
            validate_headers([(bad, b"")], "records[0].headers")
        assert info.value.code is ErrorCode.INVALID_RECORD and "records[0].headers" in info.value.message


# --- the fetch window -----------------------------------------------------------------------------


def test_a_fetch_reads_a_window_bounded_by_the_request_not_the_log():
    assert fetch_scan_end(0, 10, 500) == 10  # everything up to the end
    assert fetch_scan_end(100, 10**9, 500) == 100 + 4 * 501  # a window of the request's size
    assert fetch_scan_end(100, 10**9, 1) == 100 + 1000  # never smaller than the minimum
    assert fetch_scan_end(7, 7, 500) == 7


# --- fetch limits ---------------------------------------------------------------------------------


def test_take_everything_that_fits():
    assert take_within_limits([10, 10, 10], max_records=5, max_bytes=100) == (3, False)
    assert take_within_limits([], max_records=5, max_bytes=100) == (0, False)


def test_take_stops_at_max_records():
    assert take_within_limits([1] * 10, max_records=3, max_bytes=100) == (3, True)
    assert take_within_limits([1] * 3, max_records=3, max_bytes=100) == (3, False)


def test_take_stops_before_exceeding_max_bytes():
    assert take_within_limits([40, 40, 40], max_records=10, max_bytes=100) == (2, True)
    assert take_within_limits([50, 50, 1], max_records=10, max_bytes=100) == (2, True)
    assert take_within_limits([50, 50], max_records=10, max_bytes=100) == (2, False)  # exactly at the limit


def test_first_record_is_returned_even_when_larger_than_max_bytes():
    assert take_within_limits([5000, 1], max_records=10, max_bytes=100) == (1, True)
    assert take_within_limits([5000], max_records=10, max_bytes=1) == (1, False)


def test_take_consumes_lazily_and_only_what_it_needs():
    consumed = []

    def sizes():  # type: ignore[no-untyped-def]
        for i in range(100):
            consumed.append(i)
            yield 1

    assert take_within_limits(sizes(), max_records=3, max_bytes=100) == (3, True)
    assert len(consumed) == 4  # one look past the limit tells it was truncated


# --- where the next fetch starts ------------------------------------------------------------------


def test_next_offset_after_a_truncated_answer_is_right_after_the_last_record():
    assert next_offset_after_fetch(returned_last_offset=7, upper=20, truncated=True, start=5) == 8


def test_next_offset_after_a_complete_answer_is_the_upper_bound():
    # everything below upper was examined, control and aborted records included
    assert next_offset_after_fetch(returned_last_offset=7, upper=20, truncated=False, start=5) == 20
    assert next_offset_after_fetch(returned_last_offset=None, upper=20, truncated=False, start=5) == 20


def test_next_offset_never_moves_backwards_below_the_start():
    # read_committed from an offset between the last stable offset and the high watermark
    assert next_offset_after_fetch(returned_last_offset=None, upper=3, truncated=False, start=9) == 9


def test_next_offset_at_the_end_of_the_log_stays_put():
    assert next_offset_after_fetch(returned_last_offset=None, upper=4, truncated=False, start=4) == 4
