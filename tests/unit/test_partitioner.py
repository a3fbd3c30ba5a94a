"""Kafka's key partitioner and transaction-coordinator placement, checked against Kafka's own values."""

import pytest

from app.domain.partitioner import coordinator_partition, java_string_hash, murmur2, partition_for_key, to_positive

# Kafka's UtilsTest.testMurmur2 (clients/src/test/.../common/utils/UtilsTest.java).
KAFKA_MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

# librdkafka's murmur2 unit test (rdmurmur2.c), which mirrors the Java client; as unsigned 32-bit values.
# The 1-4 byte inputs exercise every tail length of the hash.
LIBRDKAFKA_MURMUR2_VECTORS = [
    (b"kafka", 0xD067CF64),
    (b"giberish123456789", 0x8F552B0C),
    (b"1234", 0x9FC97B14),
    (b"234", 0xE7C009CA),
    (b"34", 0x873930DA),
    (b"4", 0x5A4B5CA1),
    (b"", 0x106E08D9),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafkas_test_vectors(data, expected):
    assert murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected_unsigned"), LIBRDKAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_librdkafka_vectors_for_every_tail_length(data, expected_unsigned):
    assert murmur2(data) & 0xFFFFFFFF == expected_unsigned


def test_murmur2_is_a_signed_32_bit_int_over_arbitrary_bytes():
    for i in range(2000):
        h = murmur2(i.to_bytes(4, "little") * (i % 7) + bytes([i % 256]))
        assert -(2**31) <= h < 2**31


def test_murmur2_hashes_bytes_not_text():
    assert murmur2("é".encode()) != murmur2("é".encode("latin-1"))
    assert murmur2(b"\x00") != murmur2(b"")


def test_to_positive_clears_only_the_sign_bit():
    assert to_positive(0) == 0
    assert to_positive(5) == 5
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0  # Math.abs would overflow here; Kafka masks instead
    assert to_positive(2**31 - 1) == 2**31 - 1
    assert to_positive(-973932308) == -973932308 & 0x7FFFFFFF == 1173551340


@pytest.mark.parametrize(("data", "expected"), KAFKA_MURMUR2_VECTORS)
@pytest.mark.parametrize("partitions", [1, 3, 7, 12, 48, 100])
def test_partition_for_key_is_kafkas_builtin_partitioner(data, expected, partitions):
    assert partition_for_key(data, partitions) == (expected & 0x7FFFFFFF) % partitions


def test_partition_for_key_known_placements():
    # -973932308 & 0x7fffffff = 1173551340; 1173551340 % 10 = 0, % 3 = 0
    assert partition_for_key(b"21", 10) == 0
    # -790332482 & 0x7fffffff = 1357151166 -> % 10 = 6, % 4 = 2
    assert partition_for_key(b"foobar", 10) == 6
    assert partition_for_key(b"foobar", 4) == 2
    # 479470107 % 10 = 7
    assert partition_for_key(b"abc", 10) == 7


def test_partition_for_key_spreads_keys_over_every_partition():
    partitions = 8
    seen = {partition_for_key(f"key-{i}".encode(), partitions) for i in range(500)}
    assert seen == set(range(partitions))


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("abc", 96354),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),  # the classic Java hashCode collision
        ("polygenelubricants", -(2**31)),  # hashCode == Integer.MIN_VALUE
        ("é", 233),
        ("\U0001f600", 1772899),  # a surrogate pair: two UTF-16 code units 0xD83D 0xDE00
    ],
)
def test_java_string_hash_matches_string_hashcode(s, expected):
    assert java_string_hash(s) == expected


def test_java_string_hash_wraps_like_java_int():
    # "hello world".hashCode() overflows int arithmetic: 1794106052
    assert java_string_hash("hello world") == 1794106052
    long = "x" * 1000
    assert -(2**31) <= java_string_hash(long) < 2**31


def test_coordinator_partition_is_abs_hashcode_mod_partitions():
    assert coordinator_partition("hello", 50) == 99162322 % 50 == 22
    assert coordinator_partition("", 50) == 0
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0 rather than overflowing
    assert coordinator_partition("polygenelubricants", 50) == 0
    assert coordinator_partition("polygenelubricants", 7) == 0


def test_coordinator_partition_of_negative_hash_uses_its_absolute_value():
    tid = next(s for s in (f"txn-{i}" for i in range(1000)) if java_string_hash(s) < 0)
    assert coordinator_partition(tid, 50) == abs(java_string_hash(tid)) % 50


def test_coordinator_partition_is_in_range_and_covers_every_partition():
    seen = {coordinator_partition(f"producer-{i}", 50) for i in range(2000)}
    assert seen == set(range(50))
