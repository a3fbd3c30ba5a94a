"""One-dimensional arrays handed to PostgreSQL already in its binary array format.

psycopg dumps a Python list element by element, in Python (finding the element type, then a
dumper call per element): for a batch of 100 records that was most of what the append's parameters
cost. An append's columns are known to be ``bytea``, ``text``, ``int4`` or ``int8``, so they are
packed here in one pass each (``struct`` for the integers, one ``bytes.join`` for the rest; in C
where txlog's C part is built, ``app.native``) and psycopg passes the bytes on unchanged, with the
array's type.

The format (PostgreSQL's ``array_send``): the number of dimensions, a has-nulls flag, the element
type's oid; per dimension its length and lower bound (1); then each element as a 4-byte length
(-1 for NULL) and its bytes. Use a packed array with a binary placeholder (``%(name)b``).
"""

from __future__ import annotations

import struct
from typing import Sequence, TypeVar

from psycopg import adapters
from psycopg.adapt import Dumper
from psycopg.pq import Format

from app.native import native

_HEADER = struct.Struct(">iiiii")  # ndim = 1, has nulls, element oid, length, lower bound = 1
_EMPTY = struct.Struct(">iii")  # ndim = 0, no nulls, element oid
_LENGTH = struct.Struct(">i").pack
_NULL = _LENGTH(-1)

_BYTEA, _TEXT, _INT4, _INT8 = 17, 25, 23, 20


class PackedArray(bytes):
    """An array in PostgreSQL's binary format; a subclass per element type says which."""


class ByteaArray(PackedArray):
    pass


class TextArray(PackedArray):
    pass


class Int4Array(PackedArray):
    pass


class Int8Array(PackedArray):
    pass


_A = TypeVar("_A", bound=PackedArray)


def _register(cls: type[PackedArray], array_oid: int) -> None:
    class _Dumper(Dumper):
        format = Format.BINARY
        oid = array_oid

        def dump(self, obj: bytes) -> bytes:
            return obj

    adapters.register_dumper(cls, _Dumper)


_register(ByteaArray, 1001)
_register(TextArray, 1009)
_register(Int4Array, 1007)
_register(Int8Array, 1016)


def _varlena(cls: type[_A], oid: int, items: Sequence[bytes | None]) -> _A:
    packed = native.array(oid, 0, items) if native else None
    if packed is not None:
        return cls(packed)
    n = len(items)
    if not n:
        return cls(_EMPTY.pack(0, 0, oid))
    parts: list[bytes] = [b""] * (2 * n + 1)
    if None in items:
        parts[1::2] = [_NULL if item is None else _LENGTH(len(item)) for item in items]
        parts[2::2] = [b"" if item is None else item for item in items]
        parts[0] = _HEADER.pack(1, 1, oid, n, 1)
    else:
        parts[1::2] = map(_LENGTH, map(len, items))  # type: ignore[arg-type]  # no None among them: the branch above took those
        parts[2::2] = items  # type: ignore[assignment]  # no None among them, as above
        parts[0] = _HEADER.pack(1, 0, oid, n, 1)
    return cls(b"".join(parts))


def bytea_array(items: Sequence[bytes | None]) -> ByteaArray:
    return _varlena(ByteaArray, _BYTEA, items)


def text_array(items: Sequence[str | None]) -> TextArray:
    return _varlena(TextArray, _TEXT, [None if s is None else s.encode() for s in items])


_FIXED: dict[tuple[str, int], struct.Struct] = {}


def _fixed(cls: type[_A], oid: int, code: str, width: int, items: Sequence[int | None]) -> _A:
    packed = native.array(oid, width, items) if native else None
    if packed is not None:
        return cls(packed)
    n = len(items)
    if not n:
        return cls(_EMPTY.pack(0, 0, oid))
    if None in items:
        if items.count(None) == n:
            body = _NULL * n
        else:
            body = b"".join(_NULL if v is None else _LENGTH(width) + struct.pack(">" + code, v) for v in items)
        return cls(_HEADER.pack(1, 1, oid, n, 1) + body)
    packer = _FIXED.get((code, n))
    if packer is None:
        packer = struct.Struct(">" + ("i" + code) * n)
        if len(_FIXED) < 4096:
            _FIXED[(code, n)] = packer
    values: list[int] = [width] * (2 * n)
    values[1::2] = items  # type: ignore[assignment]  # no None among them: the branch above took those
    return cls(_HEADER.pack(1, 0, oid, n, 1) + packer.pack(*values))


def int4_array(items: Sequence[int | None]) -> Int4Array:
    return _fixed(Int4Array, _INT4, "i", 4, items)


def int8_array(items: Sequence[int | None]) -> Int8Array:
    return _fixed(Int8Array, _INT8, "q", 8, items)
