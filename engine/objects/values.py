"""Typed column values in our binary metadata (zonemap bounds, block key ranges), and a
bounds-checked reader for parsing it.

Why a module of its own: the zonemap and the block metadata both store values of any column
type of engine.schema.TYPES, and must store them the same way (FORMAT.md "Values"). A value is
held in its *storage form*, the Python value Arrow's physical type gives: an `int` for every
integer type, bool, date32 (days since 1970-01-01) and timestamp[us] (microseconds since the
epoch), a `float` for float32/float64, `str` for string, `bytes` for binary. The storage form
avoids Python's datetime range (year 1..9999, narrower than Arrow's) and converts to an Arrow
scalar of the column's type exactly (`to_scalar`).
"""

from __future__ import annotations

import math
import struct

import pyarrow as pa

from engine.objects.errors import ObjectCorrupt
from engine.schema import TYPES

StorageValue = int | float | bool | str | bytes

TYPE_BY_ARROW: dict[pa.DataType, str] = {arrow: name for name, arrow in TYPES.items()}

_SIGNED = {"int8", "int16", "int32", "int64", "date32", "timestamp[us]"}
_UNSIGNED = {"uint8", "uint16", "uint32", "uint64"}
_FLOAT = {"float32", "float64"}
_BYTES = {"string", "binary"}

_STORAGE_ARROW = {"date32": pa.int32(), "timestamp[us]": pa.int64()}

_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_U8 = struct.Struct("<B")

REASON_PAST_END = "field runs past the end"
REASON_BAD_VALUE = "bad value"


def type_name(arrow_type: pa.DataType) -> str:
    """engine.schema's name of an Arrow type (AssertionError for any other type)."""
    name = TYPE_BY_ARROW.get(arrow_type)
    assert name is not None, f"not an engine column type: {arrow_type}"
    return name


def storage_array(array: pa.Array | pa.ChunkedArray, type_: str) -> pa.Array | pa.ChunkedArray:
    """The array in its storage type (date32 -> int32, timestamp[us] -> int64), so that
    `as_py` gives storage values."""
    storage = _STORAGE_ARROW.get(type_)
    return array if storage is None else array.cast(storage)


def storage_value(scalar: pa.Scalar, type_: str) -> StorageValue:
    storage = _STORAGE_ARROW.get(type_)
    value = (scalar if storage is None else scalar.cast(storage)).as_py()
    assert isinstance(value, (int, float, str, bytes)), value
    return value


def to_scalar(value: StorageValue, type_: str) -> pa.Scalar:
    """The Arrow scalar of column type `type_` holding the storage value `value`."""
    storage = _STORAGE_ARROW.get(type_)
    if storage is None:
        return pa.scalar(value, type=TYPES[type_])
    return pa.scalar(value, type=storage).cast(TYPES[type_])


def to_python(value: StorageValue, type_: str) -> object:
    """The value as engine.schema's keys hold it (`as_py` of the column type)."""
    if type_ in _STORAGE_ARROW:
        return to_scalar(value, type_).as_py()
    return value


def encode_value(out: bytearray, type_: str, value: StorageValue, length_bytes: int) -> None:
    """Append `value` of column type `type_`; strings and binaries get a little-endian length
    prefix of `length_bytes` (2 in zonemaps, 4 in key ranges)."""
    if type_ in _SIGNED:
        assert isinstance(value, int) and not isinstance(value, bool)
        out += _I64.pack(value)
    elif type_ in _UNSIGNED:
        assert isinstance(value, int) and not isinstance(value, bool)
        out += _U64.pack(value)
    elif type_ in _FLOAT:
        assert isinstance(value, float)
        assert not math.isnan(value), "NaN is never a bound"
        out += _F64.pack(value)
    elif type_ == "bool":
        assert isinstance(value, bool)
        out += _U8.pack(int(value))
    else:
        assert type_ in _BYTES, type_
        data = value.encode() if isinstance(value, str) else value
        assert isinstance(data, bytes)
        assert len(data) < 1 << (8 * length_bytes)
        out += len(data).to_bytes(length_bytes, "little") + data


class Reader:
    """A cursor over bytes that raises `ObjectCorrupt(source, reason, offset)` instead of
    reading past the end, with offsets relative to `base_offset` (where these bytes sit in
    the structure the error should name)."""

    def __init__(self, data: memoryview, source: str, base_offset: int = 0) -> None:
        self.data = data
        self.source = source
        self.base_offset = base_offset
        self.offset = 0

    def error(self, reason: str, offset: int | None = None) -> ObjectCorrupt:
        at = self.offset if offset is None else offset
        return ObjectCorrupt(self.source, reason, self.base_offset + at)

    def remaining(self) -> int:
        return len(self.data) - self.offset

    def take(self, size: int, reason: str = REASON_PAST_END) -> memoryview:
        if size < 0 or size > self.remaining():
            raise self.error(reason)
        view = self.data[self.offset : self.offset + size]
        self.offset += size
        return view

    def u8(self) -> int:
        value: int = self.take(1)[0]
        return value

    def u16(self) -> int:
        value: int = _U16.unpack(self.take(2))[0]
        return value

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def u64(self) -> int:
        value: int = _U64.unpack(self.take(8))[0]
        return value

    def str_(self, length_bytes: int) -> str:
        start = self.offset
        length = int.from_bytes(self.take(length_bytes), "little")
        try:
            return bytes(self.take(length)).decode()
        except UnicodeDecodeError:
            raise self.error(REASON_BAD_VALUE, start) from None

    def value(self, type_: str, length_bytes: int) -> StorageValue:
        """One value written by `encode_value`; ObjectCorrupt if it is not a valid value of
        the type (a bool not 0 or 1, a NaN float, a string not UTF-8, an integer outside the
        type's range)."""
        start = self.offset
        if type_ in _SIGNED or type_ in _UNSIGNED:
            raw = self.take(8)
            number: int = (_I64 if type_ in _SIGNED else _U64).unpack(raw)[0]
            try:
                to_scalar(number, type_)
            except (pa.ArrowInvalid, OverflowError):
                raise self.error(REASON_BAD_VALUE, start) from None
            return number
        if type_ in _FLOAT:
            real: float = _F64.unpack(self.take(8))[0]
            if math.isnan(real) or (type_ == "float32" and not _is_float32(real)):
                raise self.error(REASON_BAD_VALUE, start)
            return real
        if type_ == "bool":
            flag = self.u8()
            if flag > 1:
                raise self.error(REASON_BAD_VALUE, start)
            return bool(flag)
        assert type_ in _BYTES, type_
        length = int.from_bytes(self.take(length_bytes), "little")
        data = bytes(self.take(length))
        if type_ == "binary":
            return data
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise self.error(REASON_BAD_VALUE, start) from None


def _is_float32(real: float) -> bool:
    """True if `real` is exactly a float32 value (as every float32 bound is, widened)."""
    try:
        narrowed: float = _F32.unpack(_F32.pack(real))[0]
    except OverflowError:
        return False
    return narrowed == real
