"""Zonemaps: per-column min, max and null count of a block, and pruning blocks by a filter.

Why (issue 14 "Reads", seed `004_*` "Indexing and Metadata Management"): `scan(columns,
filter)` must not read a block whose rows cannot match. A zonemap is tiny, lives in the
object's footer and in the catalog entry (metaLoc), and turns into a pyarrow *guarantee*: an
expression true for every row of the block, `(x >= min) & (x <= max) & ...`. pyarrow's
dataset layer simplifies a filter against a guarantee in C++ (`SimplifyWithGuarantee`), which
is exactly "may this block match?": `prune` builds a dataset of one fragment per block with
its guarantee as the fragment's partition expression (the paths are never opened) and asks
for the fragments compatible with the filter.

A guarantee must hold for *every* row, so a column contributes:

* no nulls, no NaN: `x >= min` and `x <= max` (each when known);
* only nulls: `is_null(x)`;
* some nulls, or a NaN (NaN compares false with everything, yet `x != 5` matches it): nothing.

A filter holding a NaN literal prunes nothing (pyarrow 26 simplifies comparisons with NaN
wrongly against a guarantee; `prune` says more).

Strings and binaries longer than `limits.ZONEMAP_STRING_PREFIX_BYTES` are cut: the min to a
prefix (at a character boundary), the max to a prefix rounded up (its last character or byte
incremented), or no max when it cannot be rounded up (all 0xFF bytes, all U+10FFFF). Both stay
bounds, so pruning stays correct; it only prunes less on long common prefixes.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from engine.errors import SchemaError
from engine.objects import limits, values
from engine.objects.errors import ObjectCorrupt
from engine.objects.values import StorageValue
from engine.schema import TYPES, check_name

MAGIC = b"TEZM"
VERSION = 1
HEADER = struct.Struct("<4sBBHQQ")
"""magic, version, reserved, column_count, row_count, checksum (24 bytes)."""
CHECKSUM_OFFSET = 16
VALUE_LENGTH_BYTES = 2
"""Strings and binaries in a zonemap have a u16 length (they are cut well below 64 KiB)."""

FLAG_MIN = 1
FLAG_MAX = 2
FLAG_NAN = 4
FLAG_MIN_TRUNCATED = 8
FLAG_MAX_TRUNCATED = 16
_FLAGS_ALL = FLAG_MIN | FLAG_MAX | FLAG_NAN | FLAG_MIN_TRUNCATED | FLAG_MAX_TRUNCATED

REASON_SHORT = "zonemap shorter than its header"
REASON_TOO_LONG = "zonemap longer than zonemap_bytes_max"
REASON_MAGIC = "zonemap: bad magic"
REASON_VERSION = "zonemap: unknown version"
REASON_CHECKSUM = "zonemap: checksum mismatch"
REASON_FIELDS = "zonemap: field out of range"
REASON_TRAILING = "zonemap: bytes after the last column"

_FLOATS = {"float32", "float64"}
_BYTES = {"string", "binary"}


@dataclass(frozen=True, slots=True)
class ColumnZone:
    """One column's bounds over a block. `min`/`max` are storage values (values.py), None
    when unknown (no non-null value, a NaN present, or a max that could not be rounded up)."""

    name: str
    type: str
    null_count: int
    min: StorageValue | None
    max: StorageValue | None
    has_nan: bool = False
    min_truncated: bool = False
    max_truncated: bool = False


@dataclass(frozen=True)
class ZoneMap:
    """The zonemap of one block of `row_count` rows. Not slotted: `guarantee` is cached on
    the instance (a frozen dataclass allows `cached_property`)."""

    row_count: int
    columns: tuple[ColumnZone, ...]

    @classmethod
    def build(cls, table: pa.Table | pa.RecordBatch) -> ZoneMap:
        """The zonemap of every column of `table` (engine.schema types only)."""
        zones = []
        for field, column in zip(table.schema, table.columns, strict=True):
            zones.append(_column_zone(field.name, values.type_name(field.type), column))
        return cls(table.num_rows, tuple(zones))

    def column(self, name: str) -> ColumnZone:
        for zone in self.columns:
            if zone.name == name:
                return zone
        raise KeyError(name)

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(zone.name, TYPES[zone.type]) for zone in self.columns])

    @functools.cached_property
    def guarantee(self) -> pc.Expression:
        """An expression true for every row of the block (module docstring)."""
        if self.row_count == 0:
            return pc.scalar(False)  # no row: true of every row, and prunes the empty block
        terms: list[pc.Expression] = []
        for zone in self.columns:
            field = pc.field(zone.name)
            if zone.null_count == self.row_count:
                terms.append(field.is_null())
                continue
            if zone.null_count or zone.has_nan:
                continue
            if zone.min is not None:
                terms.append(field >= values.to_scalar(zone.min, zone.type))
            if zone.max is not None:
                terms.append(field <= values.to_scalar(zone.max, zone.type))
        if not terms:
            return pc.scalar(True)
        return functools.reduce(lambda a, b: a & b, terms)

    # --- Bytes (FORMAT.md "Zonemap") -----------------------------------------------------------

    def to_bytes(self) -> bytes:
        body = bytearray()
        for zone in self.columns:
            _encode_zone(body, zone)
        header = HEADER.pack(MAGIC, VERSION, 0, len(self.columns), self.row_count, 0)
        checksum = xxhash.xxh3_64_intdigest(header[:CHECKSUM_OFFSET] + body)
        return header[:CHECKSUM_OFFSET] + struct.pack("<Q", checksum) + bytes(body)

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, source: str) -> ZoneMap:
        """Decode, or raise `ObjectCorrupt(source, REASON_*, offset)`; offsets are in `data`."""
        view = memoryview(data)
        if len(view) < HEADER.size:
            raise ObjectCorrupt(source, REASON_SHORT, len(view))
        if len(view) > limits.ZONEMAP_BYTES_MAX:
            raise ObjectCorrupt(source, REASON_TOO_LONG, 0)
        magic, version, reserved, column_count, row_count, checksum = HEADER.unpack_from(view)
        if magic != MAGIC:
            raise ObjectCorrupt(source, REASON_MAGIC, 0)
        if version != VERSION:
            raise ObjectCorrupt(source, REASON_VERSION, 4)
        hasher = xxhash.xxh3_64()
        hasher.update(view[:CHECKSUM_OFFSET])
        hasher.update(view[HEADER.size :])
        if hasher.intdigest() != checksum:
            raise ObjectCorrupt(source, REASON_CHECKSUM, CHECKSUM_OFFSET)
        if reserved:
            raise ObjectCorrupt(source, REASON_FIELDS, 5)
        reader = values.Reader(view[HEADER.size :], source, HEADER.size)
        zones = [_decode_zone(reader, row_count) for _ in range(column_count)]
        if reader.remaining():
            raise reader.error(REASON_TRAILING)
        return cls(row_count, tuple(zones))


def prune(zonemaps: Sequence[ZoneMap], filter_: pc.Expression) -> list[int]:
    """Indexes of the blocks whose rows may match `filter_`, in order. Never drops a block
    holding a matching row (tests: brute force under hypothesis). Every zonemap must have the
    same columns; the filter may use any of them (another name is `SchemaError`). For many
    filters over the same blocks, build a `Pruner` once."""
    return Pruner(zonemaps).prune(filter_)


class Pruner:
    """`prune` over a fixed list of blocks: the pyarrow dataset of their guarantees is built
    once (about half the cost of one `prune` of 1,000 blocks), each `prune` call then only
    simplifies the filter against each guarantee."""

    def __init__(self, zonemaps: Sequence[ZoneMap]) -> None:
        for zonemap in zonemaps[1:]:
            assert [(z.name, z.type) for z in zonemap.columns] == [
                (z.name, z.type) for z in zonemaps[0].columns
            ], "blocks of one table share their columns"
        # pyarrow keeps a fragment whose guarantee is the literal false: empty blocks go here.
        self._candidates = [index for index, zonemap in enumerate(zonemaps) if zonemap.row_count]
        self._dataset = None
        if self._candidates:
            import pyarrow.dataset as ds  # here: it imports pandas (~0.2 s), which a reader
            # that never prunes (a Spark worker, the CLI) should not pay

            parquet, never_opened = _dataset_parts()
            self._dataset = ds.FileSystemDataset.from_paths(
                [str(index) for index in self._candidates],
                schema=zonemaps[0].arrow_schema(),
                format=parquet,
                filesystem=never_opened,
                partitions=[zonemaps[index].guarantee for index in self._candidates],
            )

    def prune(self, filter_: pc.Expression) -> list[int]:
        if self._dataset is None:
            return []
        if _NAN_LITERAL.search(str(filter_)):
            # pyarrow 26 simplifies `f < nan` against a range guarantee to true (found by the
            # brute-force test: `~(f < nan)` pruned a block of 1.0 and 2.0), so a filter with
            # a NaN literal prunes nothing. The check is on the text, so a string literal
            # "nan" also turns pruning off: wrong only in the safe direction.
            return list(self._candidates)
        try:
            fragments = self._dataset.get_fragments(filter=filter_)
            return [int(fragment.path) for fragment in fragments]
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(f"filter {filter_} does not apply to the table: {exc}") from None


_NAN_LITERAL = re.compile(r"\bnan\b", re.IGNORECASE)


@functools.cache
def _dataset_parts() -> tuple[Any, Any]:
    """The file format and file system of `prune`'s datasets (made once): its paths ("0",
    "1", ...) are never opened."""
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    return ds.ParquetFileFormat(), pafs.LocalFileSystem()


# --- Building -----------------------------------------------------------------------------------


def _column_zone(name: str, type_: str, column: pa.Array | pa.ChunkedArray) -> ColumnZone:
    null_count = column.null_count
    if null_count == len(column):
        return ColumnZone(name, type_, null_count, None, None)
    if type_ in _FLOATS and pc.any(pc.is_nan(column)).as_py():
        return ColumnZone(name, type_, null_count, None, None, has_nan=True)
    bounds = pc.min_max(values.storage_array(column, type_))
    low: StorageValue = bounds["min"].as_py()
    high: StorageValue = bounds["max"].as_py()
    if type_ not in _BYTES:
        return ColumnZone(name, type_, null_count, low, high)
    assert isinstance(low, (str, bytes))
    assert isinstance(high, (str, bytes))
    low_cut = _cut(low)
    high_cut = _cut(high)
    high_rounded = _round_up(high_cut) if high_cut != high else high
    return ColumnZone(
        name,
        type_,
        null_count,
        low_cut,
        high_rounded,
        min_truncated=low_cut != low,
        max_truncated=high_cut != high,
    )


def _cut(value: str | bytes) -> str | bytes:
    """The longest prefix of at most ZONEMAP_STRING_PREFIX_BYTES bytes (whole characters)."""
    keep = limits.ZONEMAP_STRING_PREFIX_BYTES
    if isinstance(value, bytes):
        return value[:keep]
    data = value.encode()
    if len(data) <= keep:
        return value
    while keep > 0 and data[keep] & 0xC0 == 0x80:  # a continuation byte: inside a character
        keep -= 1
    return data[:keep].decode()


def _round_up(prefix: str | bytes) -> str | bytes | None:
    """The smallest value greater than every value starting with `prefix` that is itself a
    short prefix-plus-one, or None if there is none (the prefix is all maximal units)."""
    if isinstance(prefix, bytes):
        trimmed = prefix.rstrip(b"\xff")
        if not trimmed:
            return None
        return trimmed[:-1] + bytes([trimmed[-1] + 1])
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are not characters
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


# --- Bytes ------------------------------------------------------------------------------------


def _encode_zone(out: bytearray, zone: ColumnZone) -> None:
    name = zone.name.encode()
    type_name = zone.type.encode()
    out += struct.pack("<H", len(name)) + name + struct.pack("<B", len(type_name)) + type_name
    flags = (
        (FLAG_MIN if zone.min is not None else 0)
        | (FLAG_MAX if zone.max is not None else 0)
        | (FLAG_NAN if zone.has_nan else 0)
        | (FLAG_MIN_TRUNCATED if zone.min_truncated else 0)
        | (FLAG_MAX_TRUNCATED if zone.max_truncated else 0)
    )
    out += struct.pack("<BQ", flags, zone.null_count)
    if zone.min is not None:
        values.encode_value(out, zone.type, zone.min, VALUE_LENGTH_BYTES)
    if zone.max is not None:
        values.encode_value(out, zone.type, zone.max, VALUE_LENGTH_BYTES)


def _decode_zone(reader: values.Reader, row_count: int) -> ColumnZone:
    start = reader.offset
    name = reader.str_(2)
    type_ = reader.str_(1)
    try:
        check_name("column", name)
    except SchemaError:
        raise reader.error(REASON_FIELDS, start) from None
    if type_ not in TYPES:
        raise reader.error(REASON_FIELDS, start)
    flags_at = reader.offset
    flags = reader.u8()
    null_count = reader.u64()
    low = reader.value(type_, VALUE_LENGTH_BYTES) if flags & FLAG_MIN else None
    high = reader.value(type_, VALUE_LENGTH_BYTES) if flags & FLAG_MAX else None
    valid = (
        not flags & ~_FLAGS_ALL
        and null_count <= row_count
        and (type_ in _FLOATS or not flags & FLAG_NAN)
        and (type_ in _BYTES or not flags & (FLAG_MIN_TRUNCATED | FLAG_MAX_TRUNCATED))
        and (flags & FLAG_MIN or not flags & FLAG_MIN_TRUNCATED)
        and not (flags & FLAG_NAN and flags & (FLAG_MIN | FLAG_MAX))
        and (low is None or high is None or low <= high)  # type: ignore[operator]
    )
    if not valid:
        raise reader.error(REASON_FIELDS, flags_at)
    return ColumnZone(
        name,
        type_,
        null_count,
        low,
        high,
        has_nan=bool(flags & FLAG_NAN),
        min_truncated=bool(flags & FLAG_MIN_TRUNCATED),
        max_truncated=bool(flags & FLAG_MAX_TRUNCATED),
    )
