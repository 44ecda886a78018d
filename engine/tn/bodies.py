"""The TN protocol's msgpack bodies (engine/tn/messages.py, FORMAT.md "Values"): a body packed
with the two ext types msgpack lacks (dates, timestamps), unpacked within bounds into an array
of tuples, and read field by field by `Fields`, every problem a typed refusal naming the field.
Pure, no I/O."""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable
from typing import NoReturn

# msgpack ships no type information; it is imported here only (and by logsvc's codecs).
import msgpack
import pyarrow as pa

from engine.tn import limits
from engine.tn.errors import BadRequest, ErrorCode

EXT_DATE = 1
"""A `date`: int32 little-endian, days since 1970-01-01 (Arrow's date32)."""
EXT_TIMESTAMP_US = 2
"""A `datetime`: int64 little-endian, microseconds since 1970-01-01T00:00 (Arrow's
timestamp[us]; an aware datetime is converted to UTC, as Arrow does)."""

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH_DATETIME = datetime.datetime(1970, 1, 1)


class Fields:
    """Reads a body's array left to right; every problem is `fail(reason)` naming the field."""

    __slots__ = ("_at", "_fail", "_values", "_where")

    def __init__(
        self, values: tuple[object, ...], fail: Callable[[str], Exception], where: str
    ) -> None:
        self._values = values
        self._fail = fail
        self._where = where
        self._at = 0

    def _raise(self, reason: str) -> NoReturn:
        raise self._fail(reason)

    def op(self) -> int:
        if not self._values:
            self._raise("empty body array")
        op = self._values[0]
        if type(op) is not int:
            self._raise(f"op is {kind_of(op)}, not an integer")
        self._at = 1
        return op

    def expect(self, name: str, count: int, *, counts_op: bool = True) -> None:
        got = len(self._values) - (1 if counts_op else 0)
        if got != count:
            self._raise(f"{name} has {count} fields, got {got}")
        self._where = name if counts_op else self._where

    def _next(self) -> object:
        value = self._values[self._at]
        self._at += 1
        return value

    def uint(self, name: str) -> int:
        value = self._next()
        if type(value) is not int:
            self._raise(f"{self._where}.{name} must be an unsigned integer, not {kind_of(value)}")
        if not 0 <= value <= limits.U64_MAX:
            self._raise(f"{self._where}.{name} must be an unsigned integer, got {value}")
        return value

    def boolean(self, name: str) -> bool:
        value = self._next()
        if type(value) is not bool:
            self._raise(f"{self._where}.{name} must be a bool, not {kind_of(value)}")
        return value

    def text(self, name: str, bytes_max: int, *, bytes_min: int = 0) -> str:
        value = self._next()
        if type(value) is not str:
            self._raise(f"{self._where}.{name} must be a str, not {kind_of(value)}")
        size = len(value.encode("utf-8", "surrogatepass"))
        if not bytes_min <= size <= bytes_max:
            self._raise(f"{self._where}.{name}: {size} bytes, must be {bytes_min}..{bytes_max}")
        return value

    def optional_text(self, name: str, bytes_max: int) -> str | None:
        if self._values[self._at] is None:
            self._at += 1
            return None
        return self.text(name, bytes_max)

    def optional_bin(self, name: str, bytes_max: int) -> bytes | None:
        value = self._next()
        if value is None:
            return None
        if type(value) is not bytes:
            self._raise(f"{self._where}.{name} must be bin or nil, not {kind_of(value)}")
        if len(value) > bytes_max:
            raise BadRequest(
                f"{self._where}.{name}: {len(value)} bytes, over {bytes_max}", ErrorCode.TOO_LARGE
            )
        return value

    def array(self, name: str, count_max: int) -> tuple[object, ...]:
        value = self._next()
        if type(value) is not tuple:
            self._raise(f"{self._where}.{name} must be an array, not {kind_of(value)}")
        if len(value) > count_max:
            self._raise(f"{self._where}.{name}: {len(value)} items, over {count_max}")
        return value


def kind_of(value: object) -> str:
    return "nil" if value is None else type(value).__name__


# --- msgpack --------------------------------------------------------------------------------------


def _default(value: object) -> msgpack.ExtType:
    """Dates and timestamps, which msgpack lacks (FORMAT.md "Values")."""
    if isinstance(value, datetime.datetime):  # before date: a datetime is a date
        micros = pa.scalar(value, type=pa.timestamp("us")).value
        return msgpack.ExtType(EXT_TIMESTAMP_US, _I64.pack(micros))
    if isinstance(value, datetime.date):
        return msgpack.ExtType(EXT_DATE, _I32.pack((value - _EPOCH_DATE).days))
    raise TypeError(f"a value of type {type(value).__name__} does not travel")


def _ext_hook(code: int, data: bytes) -> object:
    try:
        if code == EXT_DATE and len(data) == _I32.size:
            return _EPOCH_DATE + datetime.timedelta(days=_I32.unpack(data)[0])
        if code == EXT_TIMESTAMP_US and len(data) == _I64.size:
            return _EPOCH_DATETIME + datetime.timedelta(microseconds=_I64.unpack(data)[0])
    except OverflowError:
        raise ValueError(f"ext {code}: out of the range of Python's dates") from None
    raise ValueError(f"unknown ext type {code} of {len(data)} bytes")


def pack(fields: tuple[object, ...], fail: Callable[[str], Exception]) -> bytes:
    try:
        packed = msgpack.packb(fields, use_bin_type=True, default=_default, datetime=False)
    except (TypeError, ValueError, OverflowError) as exc:
        # An int out of msgpack's range, a lone surrogate, a value of another type.
        raise fail(f"does not encode: {type(exc).__name__}: {exc}") from None
    assert isinstance(packed, bytes)
    return packed


_UNPACK_OPTIONS: dict[str, object] = {
    "raw": False,
    "use_list": False,
    "strict_map_key": True,
    "ext_hook": _ext_hook,
    # A string or a bin cannot be longer than the body holding it; the fields' own bounds
    # are checked after.
    "max_str_len": limits.REPLY_BODY_BYTES_MAX,
    "max_bin_len": limits.REPLY_BODY_BYTES_MAX,
    # Tight: an element can be one byte, and a tuple costs 8 bytes a pointer.
    "max_array_len": limits.ARRAY_LEN_MAX,
    "max_map_len": 0,
    "max_ext_len": limits.EXT_BYTES_MAX,
}


def unpack(body: bytes, fail: Callable[[str], Exception]) -> tuple[object, ...]:
    """The array a body holds; maps are refused (`max_map_len` 0), arrays become tuples."""
    try:
        decoded = msgpack.unpackb(body, **_UNPACK_OPTIONS)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # ValueError covers truncated input, trailing bytes, the limits, bad UTF-8, our
        # ext hook, and msgpack's FormatError and StackError.
        raise fail(f"bad msgpack body: {type(exc).__name__}: {exc}") from None
    if type(decoded) is not tuple:
        raise fail(f"body is {kind_of(decoded)}, not an array")
    return decoded
