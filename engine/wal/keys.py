"""The deleted rows' primary keys of a DeleteKeys command (engine/FORMAT.md "DeleteKeys",
version 3; issue 23).

Why: a Delete names rows by (block_id, offsets), which only the table's data can turn into
keys, so the change stream (spark_jobs/stream_changes.py) reading the log alone gave every
delete a NULL key. MatrixOne's tombstones carry the primary key; so do these.

The layout is AppendColumns' column bytes (engine/wal/columns.py) without nulls (key columns
are never nullable) and without its 32-row limit: the key column definitions (name, type),
then each column's values - fixed-width little-endian, bit-packed booleans, or u32 offsets and
bytes. The row count is the command's mask cardinality, not repeated here. Written straight from
the Python keys the transaction holds (no Arrow batch per commit) and read back into the same
Python values (`DeletedKeys`), so `decode(encode(x)) == x`.

`decode_keys` checks every size against the bytes that remain before it reads or allocates
(a run-length mask can claim 2^32 rows in a few bytes), refuses set padding bits, decreasing
offsets, bad UTF-8 and out-of-range dates (every byte is a field: re-encoding gives the same
bytes), and raises `KeysDamaged(reason, offset)`; the entry codec turns that into
`WalCorruption`. It does not check that the keys are distinct or are the rows' keys: that
needs the table's data (replay checks the key columns against the table's,
engine/storage/table.py `apply_delete`).
"""

from __future__ import annotations

import datetime
import itertools
import struct
from collections.abc import Callable
from typing import Any

from engine import limits
from engine.rows import date_days, timestamp_us
from engine.schema import KEY_TYPES
from engine.wal.entry import DeletedKeys

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")

_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_ORDINAL = _EPOCH.toordinal()

_FIXED: dict[str, tuple[str, int, Callable[[Any], int] | None, Callable[[int], Any] | None]] = {
    "int8": ("b", 1, None, None),
    "int16": ("h", 2, None, None),
    "int32": ("i", 4, None, None),
    "int64": ("q", 8, None, None),
    "uint8": ("B", 1, None, None),
    "uint16": ("H", 2, None, None),
    "uint32": ("I", 4, None, None),
    "uint64": ("Q", 8, None, None),
    "date32": (
        "i",
        4,
        date_days,
        lambda days: datetime.date.fromordinal(days + _EPOCH_ORDINAL),
    ),
    "timestamp[us]": (
        "q",
        8,
        timestamp_us,
        lambda us: _EPOCH + datetime.timedelta(microseconds=us),
    ),
}
"""Each fixed-width key type: struct code, bytes, value -> stored integer, and back (None:
as it is). Floats are not key types (engine.schema.KEY_TYPES)."""
assert set(_FIXED) | {"bool", "string", "binary"} == KEY_TYPES

_TYPE_NAMES = {name.encode(): name for name in KEY_TYPES}

REASON_DEFINITION = "bad key column definition"
REASON_PADDING = "padding bits set"
REASON_OFFSETS = "key offsets do not start at 0 or decrease"
REASON_VALUE = "a key value does not decode"
REASON_TRUNCATED = "field runs past the end of the body"
REASON_TRAILING = "bytes after the last key"

_DEFINITIONS_CACHED_MAX = 64
_encoded: dict[tuple[tuple[str, str], ...], bytes] = {}
"""Key columns -> their definitions' bytes (key_count and each (name, type))."""
_decoded: dict[bytes, tuple[tuple[str, str], ...]] = {}
"""Definitions' bytes -> key columns."""
_RECENT_MAX = 4
_recent: list[tuple[bytes, tuple[tuple[str, str], ...]]] = []
"""The definitions last read, newest first: matched by `startswith` before any parsing (a
log's deletes name a few tables' keys over and over)."""


class KeysDamaged(Exception):
    """The bytes are not a valid keys section: `reason` (a REASON_*), at `offset` (from the
    section's start)."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at {offset}")
        self.reason = reason
        self.offset = offset


def _definitions(columns: tuple[tuple[str, str], ...]) -> bytes:
    cached = _encoded.get(columns)
    if cached is not None:
        return cached
    assert 0 < len(columns) <= limits.COLUMNS_MAX
    parts = [_U16.pack(len(columns))]
    for name, type_name in columns:
        raw = name.encode()
        assert 0 < len(raw) <= limits.NAME_BYTES_MAX
        assert type_name in KEY_TYPES
        parts += (_U16.pack(len(raw)), raw, _U8.pack(len(type_name)), type_name.encode())
    out = b"".join(parts)
    if len(_encoded) >= _DEFINITIONS_CACHED_MAX:
        _encoded.pop(next(iter(_encoded)))
    _encoded[columns] = out
    return out


def encode_keys(keys: DeletedKeys) -> list[bytes]:
    """The keys section's bytes (definitions, then each column's values), for `keys.values`
    given in the mask's offset order."""
    columns = keys.columns
    values = keys.values
    count = len(values)
    assert count > 0
    parts = [_definitions(columns)]
    if len(columns) == 1:
        _encode_column(columns[0][1], values, parts)
    else:
        assert all(len(value) == len(columns) for value in values)
        for (_, type_name), column in zip(columns, zip(*values, strict=True), strict=True):
            _encode_column(type_name, column, parts)
    return parts


def _encode_column(type_name: str, values: tuple[Any, ...], parts: list[bytes]) -> None:
    count = len(values)
    fixed = _FIXED.get(type_name)
    if fixed is not None:
        code, _, convert, _ = fixed
        stored = values if convert is None else [convert(v) for v in values]
        parts.append(struct.pack(f"<{count}{code}", *stored))
    elif type_name == "bool":
        bits = bytearray((count + 7) >> 3)
        for index, value in enumerate(values):
            if value:
                bits[index >> 3] |= 1 << (index & 7)
        parts.append(bytes(bits))
    else:
        data = [v.encode() for v in values] if type_name == "string" else list(values)
        offsets = [0] * (count + 1)
        end = 0
        for index, item in enumerate(data):
            end += len(item)
            offsets[index + 1] = end
        parts.append(struct.pack(f"<{count + 1}I", *offsets))
        parts.append(b"".join(data))


_STRUCTS_CACHED_MAX = 256
_structs: dict[tuple[str, int], struct.Struct] = {}


def _unpack(code: str, count: int, data: bytes, pos: int) -> tuple[Any, ...]:
    """`count` values of struct code `code` at `pos` (the caller checked the size)."""
    if count > 64:
        return struct.unpack_from(f"<{count}{code}", data, pos)
    packer = _structs.get((code, count))
    if packer is None:
        if len(_structs) >= _STRUCTS_CACHED_MAX:
            _structs.clear()
        packer = _structs[(code, count)] = struct.Struct(f"<{count}{code}")
    return packer.unpack_from(data, pos)


def decode_keys(section: memoryview | bytes, count: int) -> DeletedKeys:
    """The `count` keys of a keys section (the whole rest of the command). Raises
    `KeysDamaged`; `count` is the mask's cardinality, unchecked against the bytes yet."""
    assert count > 0
    section = bytes(section)  # one copy of the keys (within the entry's size): bytes read faster
    pos, columns = _read_definitions(section)
    size = len(section)
    decoded: list[tuple[Any, ...]] = []
    for _, type_name in columns:
        fixed = _FIXED.get(type_name)
        if fixed is not None:
            code, width, _, back = fixed
            if count * width > size - pos:
                raise KeysDamaged(REASON_TRUNCATED, pos)
            raw: tuple[Any, ...] = _unpack(code, count, section, pos)
            if back is not None:
                try:
                    raw = tuple(back(v) for v in raw)
                except (ValueError, OverflowError):  # beyond Python's dates: not a key
                    raise KeysDamaged(REASON_VALUE, pos) from None
            pos += count * width
        elif type_name == "bool":
            bitmap_bytes = (count + 7) >> 3
            if bitmap_bytes > size - pos:
                raise KeysDamaged(REASON_TRUNCATED, pos)
            bits = bytes(section[pos : pos + bitmap_bytes])
            if count & 7 and bits[-1] >> (count & 7):
                raise KeysDamaged(REASON_PADDING, pos + bitmap_bytes - 1)
            raw = tuple(bool(bits[index >> 3] >> (index & 7) & 1) for index in range(count))
            pos += bitmap_bytes
        else:
            if (count + 1) * 4 > size - pos:
                raise KeysDamaged(REASON_TRUNCATED, pos)
            offsets = struct.unpack_from(f"<{count + 1}I", section, pos)
            at = pos
            pos += (count + 1) * 4
            if offsets[0] != 0 or any(a > b for a, b in itertools.pairwise(offsets)):
                raise KeysDamaged(REASON_OFFSETS, at)
            end = offsets[-1]
            if end > size - pos:
                raise KeysDamaged(REASON_TRUNCATED, at + count * 4)
            data = bytes(section[pos : pos + end])
            items = [data[offsets[i] : offsets[i + 1]] for i in range(count)]
            if type_name == "string":
                try:
                    raw = tuple(item.decode() for item in items)
                except UnicodeDecodeError:
                    raise KeysDamaged(REASON_VALUE, pos) from None
            else:
                raw = tuple(items)
            pos += end
        decoded.append(raw)
    if pos != size:
        raise KeysDamaged(REASON_TRAILING, pos)
    values = decoded[0] if len(decoded) == 1 else tuple(zip(*decoded, strict=True))
    return DeletedKeys(columns, values)


def _read_definitions(section: bytes) -> tuple[int, tuple[tuple[str, str], ...]]:
    """Where the values start, and the key columns."""
    for raw, columns in _recent:
        # Definitions are read field by field from their start: the same leading bytes
        # always parse to the same definitions, ending at the same place.
        if section.startswith(raw):
            return len(raw), columns
    size = len(section)
    if size < 2:
        raise KeysDamaged(REASON_TRUNCATED, 0)
    (count,) = _U16.unpack_from(section, 0)
    if not 0 < count <= limits.COLUMNS_MAX:
        raise KeysDamaged(REASON_DEFINITION, 0)
    pos = 2
    for _ in range(count):  # their bytes are the cache key
        at = pos
        if pos + 2 > size:
            raise KeysDamaged(REASON_TRUNCATED, at)
        pos += 2 + _U16.unpack_from(section, pos)[0]
        if pos + 1 > size:
            raise KeysDamaged(REASON_TRUNCATED, at)
        pos += 1 + section[pos]
        if pos > size:
            raise KeysDamaged(REASON_TRUNCATED, at)
    raw = section[:pos]
    known = _decoded.get(raw)
    if known is None:
        known = _parse_definitions(raw, count)
        if len(_decoded) >= _DEFINITIONS_CACHED_MAX:
            _decoded.pop(next(iter(_decoded)))
        _decoded[raw] = known
    _recent.insert(0, (raw, known))
    del _recent[_RECENT_MAX:]
    return pos, known


def _parse_definitions(raw: bytes, count: int) -> tuple[tuple[str, str], ...]:
    pos = 2
    columns: list[tuple[str, str]] = []
    for _ in range(count):
        at = pos
        (name_bytes,) = _U16.unpack_from(raw, pos)
        name_raw = raw[pos + 2 : pos + 2 + name_bytes]
        pos += 2 + name_bytes
        type_name = _TYPE_NAMES.get(raw[pos + 1 : pos + 1 + raw[pos]])
        pos += 1 + raw[pos]
        try:
            name = name_raw.decode()
        except UnicodeDecodeError:
            raise KeysDamaged(REASON_DEFINITION, at) from None
        if type_name is None or not 0 < name_bytes <= limits.NAME_BYTES_MAX:
            raise KeysDamaged(REASON_DEFINITION, at)
        columns.append((name, type_name))
    if len({name for name, _ in columns}) != count:
        raise KeysDamaged(REASON_DEFINITION, 0)
    return tuple(columns)
