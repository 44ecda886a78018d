"""The compact column encoding of a small append (engine/FORMAT.md "AppendColumns", version 2).

Why (issue 21, issue 23): an Arrow IPC stream costs the same fixed work per entry whatever its
size - a flatbuffer schema message, a flatbuffer record batch message, and on reading a message
reader, a schema parse and a full validation - and most entries are one-row inserts. Here a
column is its Arrow buffers, bare: validity bits when the column has nulls, then fixed-width
values, bit-packed booleans, or u32 offsets and the bytes of strings. The column definitions
(name, type, nullable) ride in each command, so an entry still decodes on its own (replay,
Spark jobs reading segment files); decoded definitions are cached by their bytes.

`encode_columns` takes an Arrow batch whose arrays start at offset 0 (what `schema.to_batch`
builds) and says None to anything else and to large batches (`APPEND_COLUMNS_ROWS_MAX`): the
caller writes those as Arrow IPC. `decode_columns` checks every size against the bytes that remain
before it allocates, copies each buffer once (so Arrow sees aligned memory of its own), refuses
set padding bits and validity without nulls (every byte is a field: re-encoding gives the same
bytes), and validates the batch fully (offsets, UTF-8). Failures raise `ColumnsDamaged(reason,
offset)`; the entry codec turns them into `WalCorruption`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from engine import limits, rows
from engine.rows import SmallRows, date_days, timestamp_us
from engine.schema import TYPES

APPEND_COLUMNS_ROWS_MAX = 32
"""Largest batch written as AppendColumns; a larger one is written as Arrow IPC (Append). For
one to 10 rows AppendColumns decodes about 25% faster and is smaller (the IPC messages' fixed
bytes); at 100 rows both decode at the same speed while Arrow's C++ writer still encodes faster
than this module's Python loop over columns (`python -m engine.wal.bench`)."""
assert rows.ROWS_MAX == APPEND_COLUMNS_ROWS_MAX  # a small insert is always one AppendColumns

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<IH")  # rows, column_count

_FIXED_BYTES = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float32": 4,
    "float64": 8,
    "date32": 4,
    "timestamp[us]": 8,
}
_TYPE_NAME = {arrow_type: name for name, arrow_type in TYPES.items()}
_TYPE_NAMES = {name.encode(): name for name in TYPES}

_DEFINITIONS_CACHED_MAX = 64
_definitions: dict[bytes, tuple[pa.Schema, tuple[tuple[str, bool], ...]]] = {}
"""Column definitions' bytes -> (the Arrow schema, each column's (type name, has_validity))."""

REASON_DEFINITION = "bad column definition"
REASON_SIZE = "column bytes do not match its rows"
REASON_PADDING = "padding bits set"
REASON_VALIDITY = "validity bits on a column without nulls or not nullable"
REASON_VALUES = "column values do not validate"
REASON_TRUNCATED = "field runs past the end of the body"


class ColumnsDamaged(Exception):
    """The bytes are not a valid AppendColumns body: `reason` (a REASON_*), at `offset` (in the
    command body)."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at {offset}")
        self.reason = reason
        self.offset = offset


def encode_columns(batch: pa.RecordBatch) -> list[bytes] | None:
    """The AppendColumns body after its infos (rows, definitions, then each column's bytes), or
    None when `batch` is not small or an array of it does not start at offset 0 (the caller
    writes Arrow IPC then)."""
    rows = batch.num_rows
    if not 0 < rows <= APPEND_COLUMNS_ROWS_MAX:
        return None
    columns = batch.columns
    if any(column.offset for column in columns):
        return None
    bitmap_bytes = (rows + 7) >> 3
    validity = tuple(column.null_count > 0 for column in columns)
    definitions, layout = _definitions_of(batch.schema, validity)
    parts: list[bytes] = [_HEAD.pack(rows, len(columns)), definitions]
    for column, has_validity, (width, kind) in zip(columns, validity, layout, strict=True):
        buffers = column.buffers()
        if has_validity:
            parts.append(_bits(buffers[0], rows, bitmap_bytes))
        if kind == _FIXED:
            parts.append(buffers[1].to_pybytes()[: rows * width])
        elif kind == _BOOL:
            parts.append(_bits(buffers[1], rows, bitmap_bytes))
        else:
            offsets = buffers[1].to_pybytes()[: (rows + 1) * 4]
            assert offsets[:4] == b"\x00\x00\x00\x00"
            (end,) = _U32.unpack_from(offsets, rows * 4)
            parts.append(offsets)
            values = buffers[2]
            parts.append(values.to_pybytes()[:end] if values is not None else b"")
    return parts


def encode_rows(small: SmallRows) -> list[bytes]:
    """`encode_columns` of `small.batch()`, byte for byte, written from the Python values
    (no Arrow batch: engine/rows.py). Null slots hold zero values and clear bits, as Arrow's
    builders leave them; tests/unit/engine/test_rows.py compares the two on random rows."""
    count = small.num_rows
    if count == 1:
        return _encode_row(small)
    bitmap_bytes = (count + 7) >> 3
    columns = small.columns
    validity = tuple(None in column for column in columns)
    definitions, layout = _definitions_of(small.arrow_schema, validity)
    parts: list[bytes] = [_HEAD.pack(count, len(columns)), definitions]
    for type_name, values, has_validity, (_, kind) in zip(
        small.type_names, columns, validity, layout, strict=True
    ):
        if has_validity:
            parts.append(_pack_bits([v is not None for v in values], bitmap_bytes))
        if kind == _FIXED:
            code, convert = _PACKING[type_name]
            if convert is not None:
                values = [0 if v is None else convert(v) for v in values]
            elif has_validity:
                values = [0 if v is None else v for v in values]
            parts.append(struct.pack(f"<{count}{code}", *values))
        elif kind == _BOOL:
            parts.append(_pack_bits([v is True for v in values], bitmap_bytes))
        else:
            data = [
                v.encode() if isinstance(v, str) else v if isinstance(v, bytes) else b""
                for v in values
            ]
            offsets = [0]
            end = 0
            for item in data:
                end += len(item)
                offsets.append(end)
            parts.append(struct.pack(f"<{count + 1}I", *offsets))
            parts.append(b"".join(data))
    return parts


def _encode_row(small: SmallRows) -> list[bytes]:
    """`encode_rows` of one row (most commits), without the per-column lists."""
    values = [column[0] for column in small.columns]
    validity = tuple(value is None for value in values)
    definitions, layout = _definitions_of(small.arrow_schema, validity)
    parts: list[bytes] = [_HEAD.pack(1, len(values)), definitions]
    for type_name, value, (width, kind) in zip(small.type_names, values, layout, strict=True):
        if value is None:  # a clear validity bit, then a zero value or empty string
            parts.append(_NULL_ROW[kind] if kind != _FIXED else b"\x00" + bytes(width))
        elif kind == _FIXED:
            packer, convert = _PACKERS[type_name]
            parts.append(packer.pack(value if convert is None else convert(value)))
        elif kind == _BOOL:
            parts.append(b"\x01" if value else b"\x00")
        else:
            data = value.encode() if isinstance(value, str) else value
            assert isinstance(data, bytes)
            parts.append(_U32.pack(0) + _U32.pack(len(data)))
            parts.append(data)
    return parts


def _pack_bits(bits: list[bool], size: int) -> bytes:
    """Bits LSB first, as Arrow's bitmaps; padding bits clear."""
    number = 0
    for index, bit in enumerate(bits):
        if bit:
            number |= 1 << index
    return number.to_bytes(size, "little")


_PACKING: dict[str, tuple[str, Callable[[Any], int] | None]] = {
    "int8": ("b", None),
    "int16": ("h", None),
    "int32": ("i", None),
    "int64": ("q", None),
    "uint8": ("B", None),
    "uint16": ("H", None),
    "uint32": ("I", None),
    "uint64": ("Q", None),
    "float64": ("d", None),
    "date32": ("i", date_days),
    "timestamp[us]": ("q", timestamp_us),
}
"""The struct code of each fixed-width type `engine.rows` keeps as values, and how a value
becomes the stored integer (None: as it is)."""
_PACKERS = {
    name: (struct.Struct("<" + code), convert) for name, (code, convert) in _PACKING.items()
}


_FIXED, _BOOL, _VARIABLE_KIND = 0, 1, 2
_NULL_ROW = {
    _BOOL: b"\x00\x00",  # validity, value bit
    _VARIABLE_KIND: b"\x00" + bytes(8),  # validity, offsets 0 and 0, no bytes
}
_ENCODINGS_CACHED_MAX = 16
_encodings: list[tuple[pa.Schema, tuple[bool, ...], bytes, tuple[tuple[int, int], ...]]] = []
"""Recently encoded schemas (with which columns had nulls): their definitions' bytes and each
column's (width, kind). Looked up with `Schema.equals` (tens of ns), newest first, as the IPC
schema messages are (codec.py)."""


def _definitions_of(
    schema: pa.Schema, validity: tuple[bool, ...]
) -> tuple[bytes, tuple[tuple[int, int], ...]]:
    for cached, cached_validity, cached_bytes, cached_layout in _encodings:
        if cached_validity == validity and (
            cached is schema or cached.equals(schema, check_metadata=True)
        ):
            return cached_bytes, cached_layout
    parts: list[bytes] = []
    layout: list[tuple[int, int]] = []
    for field, has_validity in zip(schema, validity, strict=True):
        type_name = _TYPE_NAME[field.type]
        name = field.name.encode()
        assert len(name) <= limits.NAME_BYTES_MAX
        parts += (
            _U16.pack(len(name)),
            name,
            _U8.pack(len(type_name)),
            type_name.encode(),
            b"\x01" if field.nullable else b"\x00",
            b"\x01" if has_validity else b"\x00",
        )
        width = _FIXED_BYTES.get(type_name, 0)
        layout.append(
            (width, _FIXED if width else _BOOL if type_name == "bool" else _VARIABLE_KIND)
        )
    entry = (schema, validity, b"".join(parts), tuple(layout))
    _encodings.insert(0, entry)
    del _encodings[_ENCODINGS_CACHED_MAX:]
    return entry[2], entry[3]


def _bits(buffer: pa.Buffer, rows: int, size: int) -> bytes:
    """The first `rows` bits of a bitmap, padding bits cleared."""
    raw = bytearray(buffer.to_pybytes()[:size])
    if rows & 7:
        raw[-1] &= (1 << (rows & 7)) - 1
    return bytes(raw)


def decode_columns(body: memoryview) -> pa.RecordBatch:
    """The batch of an AppendColumns body (after its infos). Raises `ColumnsDamaged`."""
    if len(body) < _HEAD.size:
        raise ColumnsDamaged(REASON_TRUNCATED, 0)
    rows, count = _HEAD.unpack_from(body)
    if rows == 0 or rows > APPEND_COLUMNS_ROWS_MAX or count == 0 or count > limits.COLUMNS_MAX:
        raise ColumnsDamaged(REASON_DEFINITION, 0)
    pos = _HEAD.size
    start = pos
    for _ in range(count):  # definitions: their bytes are the cache key
        pos = _skip_definition(body, pos)
    key = bytes(body[start:pos])
    cached = _definitions.get(key)
    if cached is None:
        cached = _parse_definitions(body, start, count)
        if len(_definitions) >= _DEFINITIONS_CACHED_MAX:
            _definitions.pop(next(iter(_definitions)))
        _definitions[key] = cached
    schema, kinds = cached
    bitmap_bytes = (rows + 7) >> 3
    arrays: list[pa.Array] = []
    for field, (type_name, has_validity) in zip(schema, kinds, strict=True):
        validity = None
        if has_validity:
            validity = _take_bits(body, pos, rows, bitmap_bytes)
            pos += bitmap_bytes
        width = _FIXED_BYTES.get(type_name)
        if width is not None:
            values = _take(body, pos, rows * width)
            pos += rows * width
            buffers = [validity, values]
        elif type_name == "bool":
            buffers = [validity, _take_bits(body, pos, rows, bitmap_bytes)]
            pos += bitmap_bytes
        else:
            offsets = _take(body, pos, (rows + 1) * 4)
            (first,) = _U32.unpack_from(offsets, 0)
            (end,) = _U32.unpack_from(offsets, rows * 4)
            if first != 0:
                raise ColumnsDamaged(REASON_VALUES, pos)
            pos += (rows + 1) * 4
            buffers = [validity, offsets, _take(body, pos, end)]
            pos += end
        try:
            array = pa.Array.from_buffers(field.type, rows, buffers)
        except (pa.ArrowException, ValueError):
            raise ColumnsDamaged(REASON_VALUES, pos) from None
        if has_validity and array.null_count == 0:
            raise ColumnsDamaged(REASON_VALIDITY, pos)
        arrays.append(array)
    if pos != len(body):
        raise ColumnsDamaged(REASON_SIZE, pos)
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    try:
        batch.validate(full=True)
    except (pa.ArrowException, ValueError):
        raise ColumnsDamaged(REASON_VALUES, start) from None
    return batch


def _take(body: memoryview, pos: int, size: int) -> pa.Buffer:
    """`size` bytes at `pos` in a buffer of their own (aligned, immutable)."""
    if pos + size > len(body):
        raise ColumnsDamaged(REASON_TRUNCATED, pos)
    return pa.py_buffer(bytes(body[pos : pos + size]))


def _take_bits(body: memoryview, pos: int, rows: int, size: int) -> pa.Buffer:
    buffer = _take(body, pos, size)
    if rows & 7 and body[pos + size - 1] >> (rows & 7):
        raise ColumnsDamaged(REASON_PADDING, pos + size - 1)
    return buffer


def _skip_definition(body: memoryview, pos: int) -> int:
    """Where the definition at `pos` ends; a definition running past the body is reported at
    its start."""
    at = pos
    if pos + 2 > len(body):
        raise ColumnsDamaged(REASON_TRUNCATED, at)
    pos += 2 + _U16.unpack_from(body, pos)[0]
    if pos + 1 > len(body):
        raise ColumnsDamaged(REASON_TRUNCATED, at)
    pos += 1 + body[pos] + 2
    if pos > len(body):
        raise ColumnsDamaged(REASON_TRUNCATED, at)
    return pos


def _parse_definitions(
    body: memoryview, pos: int, count: int
) -> tuple[pa.Schema, tuple[tuple[str, bool], ...]]:
    fields: list[pa.Field] = []
    kinds: list[tuple[str, bool]] = []
    for _ in range(count):
        at = pos
        (name_bytes,) = _U16.unpack_from(body, pos)
        raw_name = bytes(body[pos + 2 : pos + 2 + name_bytes])
        pos += 2 + name_bytes
        type_name = _TYPE_NAMES.get(bytes(body[pos + 1 : pos + 1 + body[pos]]))
        pos += 1 + body[pos]
        nullable, has_validity = body[pos], body[pos + 1]
        pos += 2
        try:
            name = raw_name.decode()
        except UnicodeDecodeError:
            raise ColumnsDamaged(REASON_DEFINITION, at) from None
        if (
            type_name is None
            or not 0 < name_bytes <= limits.NAME_BYTES_MAX
            or nullable not in (0, 1)
            or has_validity not in (0, 1)
            or (has_validity and not nullable)
        ):
            raise ColumnsDamaged(
                REASON_VALIDITY if has_validity == 1 and nullable == 0 else REASON_DEFINITION, at
            )
        fields.append(pa.field(name, TYPES[type_name], nullable=nullable == 1))
        kinds.append((type_name, has_validity == 1))
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise ColumnsDamaged(REASON_DEFINITION, 0)
    return pa.schema(fields), tuple(kinds)
