"""Block objects: L1 sorted blocks and L2 segments as Parquet files with our metadata.

Why Parquet (issue 14, shared/reference/tae-engine.md): checkpointed data must be readable by
DuckDB, pandas and Spark in place, and Parquet gives column pruning (read only the columns
asked for) and a footer that can be read alone. Our own metadata rides in the footer's
key-value metadata under `META_KEY`: per block its row count, key range, zonemap and bloom
filter, with a checksum (FORMAT.md "Block object"). So `read_meta` reads only the footer,
and the catalog can keep the same bytes (metaLoc).

Layout: one Parquet row group per block of at most `block_rows` rows, zstd, page checksums
on (a flipped byte in a data page is reported, not decoded into garbage). Rows are sorted by
primary key within and across the blocks. Columns: the table's, in schema order, then the
hidden `__commit_ts` (uint64, the commit timestamp of the row's append). An L1 object holds
one block, an L2 segment several.

No `__origin` column: a flush or merge knows where each row came from while it runs (it
computed the permutation), and it carries the deletes committed meanwhile onto the new block
in the same commit as the catalog swap (issue 14 "Compaction and merge as transactions"), so
nothing needs a row's former (block, offset) after that commit; a row's lasting identity is
its primary key. It would cost 8 bytes a row in every object for no reader.

The writer sorts nothing: it checks that the rows arrive strictly increasing by key and
raises `RowsNotSorted` otherwise, before writing anything. A typed error rather than an
`assert`: the bad rows would be persisted for good, and a flush that asserts would crash the
engine again at every restart (the same L0 rows flush again); a typed error fails that one
flush, leaves the rows in L0, and names the row.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from engine.errors import SchemaError
from engine.objects import limits, values
from engine.objects.bloom import BloomFilter
from engine.objects.errors import ObjectCorrupt, ObjectsError, ObjectStoreFailed, RowsNotSorted
from engine.objects.store import ObjectStore
from engine.objects.zonemap import ZoneMap
from engine.schema import TYPES, Schema

COMMIT_TS_COLUMN = "__commit_ts"
HIDDEN_COLUMNS = (COMMIT_TS_COLUMN,)
META_KEY = b"tae.block_meta"
"""The Parquet key-value metadata key holding our metadata (FORMAT.md)."""

MAGIC = b"TEBO"
VERSION = 1
HEADER = struct.Struct("<4sBBHQIQ")
"""magic, version, level, reserved, table_id, block_count, checksum (28 bytes)."""
CHECKSUM_OFFSET = 20
KEY_LENGTH_BYTES = 4
"""Strings and binaries in key ranges have a u32 length: keys are never cut."""

LEVELS = (1, 2)

REASON_PARQUET = "not a readable Parquet file"
REASON_NO_META = "no engine metadata in the Parquet footer"
REASON_SHORT = "block metadata shorter than its header"
REASON_TOO_LONG = "block metadata longer than block_meta_bytes_max"
REASON_MAGIC = "block metadata: bad magic"
REASON_VERSION = "block metadata: unknown version"
REASON_CHECKSUM = "block metadata: checksum mismatch"
REASON_FIELDS = "block metadata: field out of range"
REASON_TRAILING = "block metadata: bytes after the last block"
REASON_MISMATCH = "block metadata does not match the Parquet file"


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """One block: its rows, its key range [key_min, key_max] (both inclusive, as
    engine.schema keys: a scalar or a tuple), its zonemap and its key bloom filter."""

    row_count: int
    key_min: Any
    key_max: Any
    zonemap: ZoneMap
    bloom: BloomFilter

    def may_contain(self, key: Any) -> bool:
        """False if the block certainly does not hold `key` (range, then bloom)."""
        return bool(self.key_min <= key <= self.key_max) and self.bloom.might_contain(key)


@dataclass(frozen=True, slots=True)
class BlockObjectMeta:
    """What `read_meta` returns and `write_object` wrote."""

    name: str
    table_id: int
    level: int
    key_columns: tuple[str, ...]
    blocks: tuple[BlockMeta, ...]
    size_bytes: int

    @property
    def row_count(self) -> int:
        return sum(block.row_count for block in self.blocks)

    def to_bytes(self) -> bytes:
        """Our metadata blob (FORMAT.md), as stored under META_KEY: for the catalog."""
        return _encode_meta(self.table_id, self.level, self.key_columns, self.blocks)


# --- Writing ----------------------------------------------------------------------------------


def write_object(
    store: ObjectStore,
    name: str,
    *,
    schema: Schema,
    table_id: int,
    level: int,
    data: pa.Table,
    block_rows: int = limits.BLOCK_ROWS_DEFAULT,
) -> BlockObjectMeta:
    """Write `data` as block object `name` and return its metadata.

    `data` holds the table's columns in schema order, then `__commit_ts` (uint64, no nulls),
    sorted strictly by primary key (else `RowsNotSorted`, nothing written). Level 1: one
    block of at most `block_rows` rows. Level 2: blocks of `block_rows` rows (the last one
    shorter), at most `BLOCK_OBJECT_BLOCKS_MAX`. The put is the store's: atomic, durable.
    """
    assert level in LEVELS
    assert 1 <= block_rows <= limits.BLOCK_ROWS_DEFAULT
    assert 1 <= table_id < 2**64
    clash = set(schema.names) & set(HIDDEN_COLUMNS)
    if clash:
        raise SchemaError(f"column name {sorted(clash)[0]!r} is reserved for the block objects")
    arrow_schema = _object_schema(schema)
    assert data.schema.equals(arrow_schema), f"{data.schema} is not {arrow_schema}"
    assert data.num_rows >= 1, "an object holds at least one row"
    assert data.column(COMMIT_TS_COLUMN).null_count == 0
    block_count = -(-data.num_rows // block_rows)
    assert level == 2 or block_count == 1, "an L1 object is one block"
    assert block_count <= limits.BLOCK_OBJECT_BLOCKS_MAX
    key_arrays = [data.column(index).combine_chunks() for index in schema.key_indexes]
    _check_sorted(key_arrays)

    blocks = []
    slices = [data.slice(lo, block_rows) for lo in range(0, data.num_rows, block_rows)]
    for block in slices:
        keys = [block.column(index) for index in schema.key_indexes]
        blocks.append(
            BlockMeta(
                row_count=block.num_rows,
                key_min=_key_at(keys, 0),
                key_max=_key_at(keys, block.num_rows - 1),
                zonemap=ZoneMap.build(block),
                bloom=BloomFilter.build(keys),
            )
        )
    key_columns = tuple(schema.primary_key)
    meta_bytes = _encode_meta(table_id, level, key_columns, blocks)
    assert len(meta_bytes) <= limits.BLOCK_META_BYTES_MAX

    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(
        sink,
        arrow_schema,
        compression="zstd",
        compression_level=limits.PARQUET_ZSTD_LEVEL,
        write_page_checksum=True,
    )
    for block in slices:
        writer.write_table(block, row_group_size=block.num_rows)
    writer.add_key_value_metadata({META_KEY: meta_bytes})
    writer.close()
    payload = sink.getvalue().to_pybytes()
    store.put(name, payload)
    return BlockObjectMeta(name, table_id, level, key_columns, tuple(blocks), len(payload))


def object_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of a block object of a table: its columns, then the hidden ones."""
    return _object_schema(schema)


def _object_schema(schema: Schema) -> pa.Schema:
    return schema.to_arrow().append(pa.field(COMMIT_TS_COLUMN, pa.uint64(), nullable=False))


def _key_at(keys: Sequence[pa.Array | pa.ChunkedArray], row: int) -> Any:
    parts = tuple(key[row].as_py() for key in keys)
    return parts[0] if len(parts) == 1 else parts


def _check_sorted(key_arrays: Sequence[pa.Array]) -> None:
    """RowsNotSorted unless every row's key is strictly greater than the previous row's
    (lexicographic over the key columns, Arrow's order: bytes for strings)."""
    count = len(key_arrays[0])
    if count < 2:
        return
    ascending = pa.array(np.zeros(count - 1, dtype=np.bool_))
    equal_so_far = pa.array(np.ones(count - 1, dtype=np.bool_))
    for array in key_arrays:
        before, after = array.slice(0, count - 1), array.slice(1)
        ascending = pc.or_(ascending, pc.and_(equal_so_far, pc.greater(after, before)))
        equal_so_far = pc.and_(equal_so_far, pc.equal(after, before))
    if pc.all(ascending).as_py():
        return
    row = pc.index(ascending, False).as_py() + 1
    problem = "repeats" if pc.all(equal_so_far.slice(row - 1, 1)).as_py() else "is below"
    raise RowsNotSorted(row, f"key {_key_at(key_arrays, row)!r} {problem} the key of row {row - 1}")


# --- Reading ----------------------------------------------------------------------------------


class BlockObjectReader:
    """An open block object: its footer parsed once, blocks read on demand. Close it (or use
    it as a context manager); the engine's cache may keep readers of hot objects."""

    def __init__(self, store: ObjectStore, name: str) -> None:
        self.name = name
        self._store = store
        with parquet_errors(store, name):
            self._source = store.open_input(name)
            size_bytes = self._source.size()
            self._parquet = pq.ParquetFile(self._source, page_checksum_verification=True)
            self.meta = _meta_from_footer(name, self._parquet.metadata, size_bytes)
        self._names = frozenset(self._parquet.schema_arrow.names)

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> BlockObjectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_block(self, block_index: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows of block `block_index`: the columns asked for, in that order (hidden ones
        included when asked for), or every column."""
        assert 0 <= block_index < len(self.meta.blocks), block_index
        assert columns is None or columns, "no columns: a table of no columns has no rows"
        if columns is not None:
            unknown = [column for column in columns if column not in self._names]
            if unknown:
                raise SchemaError(f"{self.name}: unknown column {unknown[0]!r}")
        with parquet_errors(self._store, self.name):
            table = self._parquet.read_row_group(
                block_index, columns=list(columns) if columns is not None else None
            )
        if table.num_rows != self.meta.blocks[block_index].row_count:
            raise ObjectCorrupt(self.name, REASON_MISMATCH)
        return table

    def read_keys(self, block_index: int) -> pa.Table:
        """The key columns of block `block_index`, sorted (for binary search)."""
        return self.read_block(block_index, self.meta.key_columns)


def read_meta(store: ObjectStore, name: str) -> BlockObjectMeta:
    """Our metadata of object `name`, reading only its footer."""
    with parquet_errors(store, name):
        source = store.open_input(name)
        try:
            size_bytes = source.size()
            metadata = pq.read_metadata(source)
        finally:
            source.close()
    return _meta_from_footer(name, metadata, size_bytes)


def read_block(
    store: ObjectStore, name: str, block_index: int, columns: Sequence[str] | None = None
) -> pa.Table:
    with BlockObjectReader(store, name) as reader:
        return reader.read_block(block_index, columns)


def read_keys(store: ObjectStore, name: str, block_index: int) -> pa.Table:
    with BlockObjectReader(store, name) as reader:
        return reader.read_keys(block_index)


@contextlib.contextmanager
def parquet_errors(store: ObjectStore, name: str) -> Iterator[None]:
    """Errors of pyarrow while reading object `name`, typed. The store's own errors pass
    through: its `open_input` file raises them from inside pyarrow's reads too. An OSError
    carrying an errno comes from the local disk under a file pyarrow reads itself
    (`LocalDirStore` gives pyarrow a plain OS file): `ObjectStoreFailed`. Anything else
    pyarrow raises is a file that does not decode: `ObjectCorrupt`."""
    try:
        yield
    except ObjectsError:
        raise
    except OSError as exc:
        if exc.errno is not None:
            raise ObjectStoreFailed(store.description, name, _first_line(exc)) from None
        raise ObjectCorrupt(name, f"{REASON_PARQUET}: {_first_line(exc)}") from None
    except (pa.ArrowException, ValueError) as exc:
        raise ObjectCorrupt(name, f"{REASON_PARQUET}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _meta_from_footer(name: str, metadata: pq.FileMetaData, size_bytes: int) -> BlockObjectMeta:
    blob = (metadata.metadata or {}).get(META_KEY)
    if blob is None:
        raise ObjectCorrupt(name, REASON_NO_META)
    table_id, level, key_columns, blocks = _decode_meta(blob, name)
    try:
        arrow_schema = metadata.schema.to_arrow_schema()
    except (pa.ArrowException, ValueError) as exc:
        raise ObjectCorrupt(name, f"{REASON_PARQUET}: {_first_line(exc)}") from None
    arrow_names = arrow_schema.names
    # The Parquet footer has no checksum; ours covers the column names and types (in the
    # zonemaps), so a footer damaged into another type or name is caught here.
    if (
        [(field.name, field.type) for field in arrow_schema]
        != [(zone.name, TYPES[zone.type]) for zone in blocks[0].zonemap.columns]
        or metadata.num_row_groups != len(blocks)
        or any(
            metadata.row_group(index).num_rows != block.row_count
            for index, block in enumerate(blocks)
        )
        or arrow_names[-1] != COMMIT_TS_COLUMN
        or not set(key_columns) <= set(arrow_names)
    ):
        raise ObjectCorrupt(name, REASON_MISMATCH)
    return BlockObjectMeta(name, table_id, level, key_columns, tuple(blocks), size_bytes)


# --- Our metadata bytes (FORMAT.md "Block metadata") -------------------------------------------


def _encode_meta(
    table_id: int, level: int, key_columns: Sequence[str], blocks: Sequence[BlockMeta]
) -> bytes:
    body = bytearray(struct.pack("<H", len(key_columns)))
    for column in key_columns:
        encoded = column.encode()
        body += struct.pack("<H", len(encoded)) + encoded
    for block in blocks:
        zonemap = block.zonemap.to_bytes()
        bloom = block.bloom.to_bytes()
        body += struct.pack("<I", block.row_count)
        body += struct.pack("<I", len(zonemap)) + zonemap
        types = _key_types(block.zonemap, key_columns)
        for key in (block.key_min, block.key_max):
            parts = key if len(key_columns) > 1 else (key,)
            for type_, part in zip(types, parts, strict=True):
                values.encode_value(body, type_, _storage(part, type_), KEY_LENGTH_BYTES)
        body += struct.pack("<I", len(bloom)) + bloom
    header = HEADER.pack(MAGIC, VERSION, level, 0, table_id, len(blocks), 0)
    checksum = xxhash.xxh3_64_intdigest(header[:CHECKSUM_OFFSET] + body)
    return header[:CHECKSUM_OFFSET] + struct.pack("<Q", checksum) + bytes(body)


def _storage(part: Any, type_: str) -> values.StorageValue:
    return values.storage_value(pa.scalar(part, type=TYPES[type_]), type_)


def _key_types(zonemap: ZoneMap, key_columns: Sequence[str]) -> list[str]:
    return [zonemap.column(column).type for column in key_columns]


def _decode_meta(data: bytes, name: str) -> tuple[int, int, tuple[str, ...], list[BlockMeta]]:
    view = memoryview(data)
    if len(view) < HEADER.size:
        raise ObjectCorrupt(name, REASON_SHORT, len(view))
    if len(view) > limits.BLOCK_META_BYTES_MAX:
        raise ObjectCorrupt(name, REASON_TOO_LONG, 0)
    magic, version, level, reserved, table_id, block_count, checksum = HEADER.unpack_from(view)
    if magic != MAGIC:
        raise ObjectCorrupt(name, REASON_MAGIC, 0)
    if version != VERSION:
        raise ObjectCorrupt(name, REASON_VERSION, 4)
    hasher = xxhash.xxh3_64()
    hasher.update(view[:CHECKSUM_OFFSET])
    hasher.update(view[HEADER.size :])
    if hasher.intdigest() != checksum:
        raise ObjectCorrupt(name, REASON_CHECKSUM, CHECKSUM_OFFSET)
    if (
        level not in LEVELS
        or reserved
        or table_id == 0
        or not 1 <= block_count <= limits.BLOCK_OBJECT_BLOCKS_MAX
        or (level == 1 and block_count != 1)
    ):
        raise ObjectCorrupt(name, REASON_FIELDS, 4)
    reader = values.Reader(view[HEADER.size :], name, HEADER.size)
    key_count_at = reader.offset
    key_columns = tuple(reader.str_(2) for _ in range(reader.u16()))
    if not key_columns or len(set(key_columns)) != len(key_columns):
        raise reader.error(REASON_FIELDS, key_count_at)
    blocks = [_decode_block(reader, key_columns, name) for _ in range(block_count)]
    if reader.remaining():
        raise reader.error(REASON_TRAILING)
    return table_id, level, key_columns, blocks


def _decode_block(reader: values.Reader, key_columns: tuple[str, ...], name: str) -> BlockMeta:
    start = reader.offset
    row_count = reader.u32()
    zonemap_at = reader.base_offset + reader.offset + 4
    zonemap = ZoneMap.from_bytes(reader.take(reader.u32()), name)
    try:
        types = _key_types(zonemap, key_columns)
    except KeyError:
        raise reader.error(REASON_FIELDS, start) from None
    if row_count == 0 or zonemap.row_count != row_count:
        raise ObjectCorrupt(name, REASON_FIELDS, zonemap_at)
    keys: list[Any] = []
    for _ in range(2):
        parts = tuple(
            values.to_python(reader.value(type_, KEY_LENGTH_BYTES), type_) for type_ in types
        )
        keys.append(parts[0] if len(parts) == 1 else parts)
    bloom_at = reader.offset
    bloom = BloomFilter.from_bytes(reader.take(reader.u32()), name)
    if bloom.key_count != row_count:
        raise reader.error(REASON_FIELDS, bloom_at)
    if not keys[0] <= keys[1]:
        raise reader.error(REASON_FIELDS, start)
    return BlockMeta(row_count, keys[0], keys[1], zonemap, bloom)
