"""Delta objects (deltaLoc): persisted delete masks with their delete timestamps.

Why (issue 14, seed `004_*` "MVCC"): a delete marks a row of a sorted block dead at its
commit_ts; a block object is immutable, so its deletes live beside it. A reader at snapshot
`ts` skips the rows deleted at or before `ts` (`BlockDeletes.deleted_at`), which is why every
deleted offset keeps its own commit_ts.

Why Parquet rather than a roaring bitmap and a timestamp array of our own: a delta object is
what DuckDB or Spark need, next to the block objects, to read checkpointed data correctly in
place (an anti-join on block and offset), and one delta object holds the masks of many blocks
(a checkpoint dumps every block changed in its interval: one put instead of one per block,
which matters on S3). The price, about 1 KiB of Parquet footer and a few hundred µs to decode,
is paid once per object, and the buffer cache keeps the decoded masks.

Layout: one row group, columns `block_id` (uint64), `offset` (uint32, the row's offset in the
block), `commit_ts` (uint64, the delete's), rows sorted by (block_id, offset), no repeats, zstd,
page checksums. Our metadata under `META_KEY` (FORMAT.md "Delta object"): per block its
deleted-row count and commit_ts range, checksummed, so `read_delta_meta` tells from the
footer alone which blocks an object covers.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from pyroaring import BitMap, FrozenBitMap

from engine.objects import limits
from engine.objects.blockfile import parquet_errors
from engine.objects.errors import ObjectCorrupt
from engine.objects.store import ObjectStore

META_KEY = b"tae.delta_meta"
MAGIC = b"TEDL"
VERSION = 1
HEADER = struct.Struct("<4sBBHQIQ")
"""magic, version, reserved u8, reserved u16, table_id, block_count, checksum (28 bytes)."""
CHECKSUM_OFFSET = 20
BLOCK_SUMMARY = struct.Struct("<QIQQ")
"""block_id, deleted_count, commit_ts_min, commit_ts_max (28 bytes)."""

SCHEMA = pa.schema(
    [
        pa.field("block_id", pa.uint64(), nullable=False),
        pa.field("offset", pa.uint32(), nullable=False),
        pa.field("commit_ts", pa.uint64(), nullable=False),
    ]
)

REASON_NO_META = "no delta metadata in the Parquet footer"
REASON_SHORT = "delta metadata shorter than its header"
REASON_TOO_LONG = "delta metadata longer than delta_meta_bytes_max"
REASON_MAGIC = "delta metadata: bad magic"
REASON_VERSION = "delta metadata: unknown version"
REASON_CHECKSUM = "delta metadata: checksum mismatch"
REASON_FIELDS = "delta metadata: field out of range"
REASON_MISMATCH = "delta rows do not match their metadata"

U64Array = npt.NDArray[np.uint64]


@dataclass(frozen=True, slots=True, eq=False)
class BlockDeletes:
    """The deleted rows of one block: `offsets` and, aligned with them in ascending offset
    order, each delete's `commit_ts`."""

    offsets: FrozenBitMap
    commit_ts: U64Array

    def __post_init__(self) -> None:
        assert len(self.offsets) == len(self.commit_ts)
        assert len(self.offsets) >= 1, "a block without deletes has no entry"

    @classmethod
    def from_pairs(cls, pairs: Mapping[int, int]) -> BlockDeletes:
        """From {offset: commit_ts}."""
        offsets = sorted(pairs)
        commit_ts = np.array([pairs[offset] for offset in offsets], dtype=np.uint64)
        commit_ts.setflags(write=False)
        return cls(FrozenBitMap(offsets), commit_ts)

    def deleted_at(self, ts: int) -> BitMap:
        """The offsets deleted by a commit at or before `ts` (dead to a snapshot at `ts`)."""
        if len(self.commit_ts) and int(self.commit_ts.max()) <= ts:
            return BitMap(self.offsets)
        ordered = np.array(self.offsets.to_array(), dtype=np.uint32)
        return BitMap(ordered[self.commit_ts <= np.uint64(ts)])

    def pairs(self) -> dict[int, int]:
        return dict(zip(self.offsets, (int(ts) for ts in self.commit_ts), strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockDeletes):
            return NotImplemented
        return self.offsets == other.offsets and bool(
            np.array_equal(self.commit_ts, other.commit_ts)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class BlockDeleteSummary:
    block_id: int
    deleted_count: int
    commit_ts_min: int
    commit_ts_max: int


@dataclass(frozen=True, slots=True)
class DeltaMeta:
    name: str
    table_id: int
    blocks: tuple[BlockDeleteSummary, ...]
    size_bytes: int


def write_deltas(
    store: ObjectStore, name: str, *, table_id: int, blocks: Mapping[int, BlockDeletes]
) -> DeltaMeta:
    """Write the delete masks of `blocks` (block_id -> its deletes) as delta object `name`."""
    assert 1 <= table_id < 2**64
    assert 1 <= len(blocks) <= limits.DELTA_BLOCKS_MAX
    block_ids = sorted(blocks)
    assert all(0 <= block_id < 2**64 for block_id in block_ids)
    total = sum(len(blocks[block_id].offsets) for block_id in block_ids)
    assert total <= limits.DELTA_ROWS_MAX
    summaries = []
    ids, offsets, stamps = [], [], []
    for block_id in block_ids:
        deletes = blocks[block_id]
        count = len(deletes.offsets)
        summaries.append(
            BlockDeleteSummary(
                block_id, count, int(deletes.commit_ts.min()), int(deletes.commit_ts.max())
            )
        )
        ids.append(np.full(count, block_id, dtype=np.uint64))
        offsets.append(np.array(deletes.offsets.to_array(), dtype=np.uint32))
        stamps.append(deletes.commit_ts)
    table = pa.table(
        [pa.array(np.concatenate(column)) for column in (ids, offsets, stamps)], schema=SCHEMA
    )
    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(
        sink,
        SCHEMA,
        compression="zstd",
        compression_level=limits.PARQUET_ZSTD_LEVEL,
        write_page_checksum=True,
    )
    writer.write_table(table, row_group_size=max(1, table.num_rows))
    writer.add_key_value_metadata({META_KEY: _encode_meta(table_id, summaries)})
    writer.close()
    payload = sink.getvalue().to_pybytes()
    store.put(name, payload)
    return DeltaMeta(name, table_id, tuple(summaries), len(payload))


def read_delta_meta(store: ObjectStore, name: str) -> DeltaMeta:
    """Which blocks delta object `name` covers, from its footer alone."""
    with parquet_errors(store, name):
        source = store.open_input(name)
        try:
            size_bytes = source.size()
            metadata = pq.read_metadata(source)
        finally:
            source.close()
    return _meta_from_footer(name, metadata, size_bytes)


def read_deltas(store: ObjectStore, name: str) -> dict[int, BlockDeletes]:
    """Every block's deletes in delta object `name`, checked against its metadata."""
    with parquet_errors(store, name):
        source = store.open_input(name)
        try:
            size_bytes = source.size()
            parquet = pq.ParquetFile(source, page_checksum_verification=True)
            meta = _meta_from_footer(name, parquet.metadata, size_bytes)
            table = parquet.read()
        finally:
            source.close()
    if not table.schema.equals(SCHEMA) or table.num_rows != sum(
        block.deleted_count for block in meta.blocks
    ):
        raise ObjectCorrupt(name, REASON_MISMATCH)
    ids = table.column("block_id").to_numpy()
    offsets = table.column("offset").to_numpy()
    stamps = table.column("commit_ts").to_numpy()
    if len(ids) > 1:
        ascending = (ids[1:] > ids[:-1]) | ((ids[1:] == ids[:-1]) & (offsets[1:] > offsets[:-1]))
        if not ascending.all():
            raise ObjectCorrupt(name, REASON_MISMATCH)
    result: dict[int, BlockDeletes] = {}
    start = 0
    for summary in meta.blocks:
        end = start + summary.deleted_count
        block_stamps = stamps[start:end].astype(np.uint64)
        if (
            not (ids[start:end] == summary.block_id).all()
            or int(block_stamps.min()) != summary.commit_ts_min
            or int(block_stamps.max()) != summary.commit_ts_max
        ):
            raise ObjectCorrupt(name, REASON_MISMATCH)
        block_stamps.setflags(write=False)
        result[summary.block_id] = BlockDeletes(FrozenBitMap(offsets[start:end]), block_stamps)
        start = end
    return result


def _meta_from_footer(name: str, metadata: pq.FileMetaData, size_bytes: int) -> DeltaMeta:
    blob = (metadata.metadata or {}).get(META_KEY)
    if blob is None:
        raise ObjectCorrupt(name, REASON_NO_META)
    table_id, summaries = _decode_meta(blob, name)
    if metadata.num_rows != sum(summary.deleted_count for summary in summaries):
        raise ObjectCorrupt(name, REASON_MISMATCH)
    return DeltaMeta(name, table_id, tuple(summaries), size_bytes)


def _encode_meta(table_id: int, summaries: Sequence[BlockDeleteSummary]) -> bytes:
    body = b"".join(
        BLOCK_SUMMARY.pack(s.block_id, s.deleted_count, s.commit_ts_min, s.commit_ts_max)
        for s in summaries
    )
    header = HEADER.pack(MAGIC, VERSION, 0, 0, table_id, len(summaries), 0)
    checksum = xxhash.xxh3_64_intdigest(header[:CHECKSUM_OFFSET] + body)
    return header[:CHECKSUM_OFFSET] + struct.pack("<Q", checksum) + body


def encode_meta(table_id: int, summaries: Sequence[BlockDeleteSummary]) -> bytes:
    """Our metadata blob (FORMAT.md "Delta object"): for golden vectors and the catalog."""
    return _encode_meta(table_id, summaries)


def _decode_meta(data: bytes, name: str) -> tuple[int, list[BlockDeleteSummary]]:
    view = memoryview(data)
    if len(view) < HEADER.size:
        raise ObjectCorrupt(name, REASON_SHORT, len(view))
    if len(view) > limits.DELTA_META_BYTES_MAX:
        raise ObjectCorrupt(name, REASON_TOO_LONG, 0)
    magic, version, reserved8, reserved16, table_id, block_count, checksum = HEADER.unpack_from(
        view
    )
    if magic != MAGIC:
        raise ObjectCorrupt(name, REASON_MAGIC, 0)
    if version != VERSION:
        raise ObjectCorrupt(name, REASON_VERSION, 4)
    hasher = xxhash.xxh3_64()
    hasher.update(view[:CHECKSUM_OFFSET])
    hasher.update(view[HEADER.size :])
    if hasher.intdigest() != checksum:
        raise ObjectCorrupt(name, REASON_CHECKSUM, CHECKSUM_OFFSET)
    if reserved8 or reserved16 or table_id == 0 or block_count == 0:
        raise ObjectCorrupt(name, REASON_FIELDS, 5)
    if len(view) != HEADER.size + block_count * BLOCK_SUMMARY.size:
        raise ObjectCorrupt(name, REASON_FIELDS, 16)
    summaries = []
    previous = -1
    for index in range(block_count):
        offset = HEADER.size + index * BLOCK_SUMMARY.size
        summary = BlockDeleteSummary(*BLOCK_SUMMARY.unpack_from(view, offset))
        if (
            summary.block_id <= previous
            or summary.deleted_count == 0
            or summary.commit_ts_min > summary.commit_ts_max
        ):
            raise ObjectCorrupt(name, REASON_FIELDS, offset)
        previous = summary.block_id
        summaries.append(summary)
    return table_id, summaries
