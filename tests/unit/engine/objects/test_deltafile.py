"""Delta objects round-trip delete masks with their timestamps, answer "dead at ts" exactly,
are plain Parquet, and report damage as `ObjectCorrupt` naming the object.

How: hypothesis writes random masks of random blocks ({offset: commit_ts}, offsets up to
2^32 - 1) and reads them back equal, as roaring bitmaps and timestamp arrays; `deleted_at(ts)`
is compared with a dict model at every timestamp that matters. DuckDB anti-joins a delta
object with its block object and counts the live rows. Damage: a flipped byte at every
position is reported or harmless (never other deletes), every truncation is reported, and
our metadata's magic, version, checksum and field rules are refused; rows out of order or
disagreeing with the metadata are refused. Golden bytes are in test_golden.py.
"""

from __future__ import annotations

import struct
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.objects.blockfile import COMMIT_TS_COLUMN, object_schema, write_object
from engine.objects.deltafile import (
    META_KEY,
    SCHEMA,
    BlockDeletes,
    BlockDeleteSummary,
    encode_meta,
    read_delta_meta,
    read_deltas,
    write_deltas,
)
from engine.objects.errors import ObjectCorrupt
from engine.objects.store import LocalDirStore, MemoryObjectStore
from engine.schema import Column, Schema

_masks = st.dictionaries(
    st.integers(0, 2**64 - 1),
    st.dictionaries(st.integers(0, 2**32 - 1), st.integers(1, 2**64 - 1), min_size=1, max_size=30),
    min_size=1,
    max_size=5,
)


@settings(max_examples=100, deadline=None)
@given(masks=_masks)
def test_round_trip_and_visibility(masks: dict[int, dict[int, int]]) -> None:
    store = MemoryObjectStore()
    blocks = {block_id: BlockDeletes.from_pairs(pairs) for block_id, pairs in masks.items()}
    written = write_deltas(store, "d/1", table_id=3, blocks=blocks)
    assert [s.block_id for s in written.blocks] == sorted(masks)
    assert read_delta_meta(store, "d/1") == written
    read = read_deltas(store, "d/1")
    assert read == blocks
    for block_id, pairs in masks.items():
        assert read[block_id].pairs() == pairs
        for ts in {0, *pairs.values(), *(t - 1 for t in pairs.values()), 2**64 - 1}:
            expected = {offset for offset, dead_at in pairs.items() if dead_at <= ts}
            assert set(read[block_id].deleted_at(ts)) == expected


def test_duckdb_applies_the_deletes_with_an_anti_join(tmp_path: Path) -> None:
    schema = Schema([Column("id", "int64")], ["id"])
    data = pa.table(
        {"id": pa.array(range(10), pa.int64()), COMMIT_TS_COLUMN: pa.array([1] * 10, pa.uint64())},
        schema=object_schema(schema),
    )
    with LocalDirStore(str(tmp_path / "o")) as store:
        write_object(store, "blk-7", schema=schema, table_id=1, level=1, data=data)
        write_deltas(store, "del-1", table_id=1, blocks={7: BlockDeletes.from_pairs({2: 5, 3: 9})})
        block_path, delta_path = store.path_of("blk-7"), store.path_of("del-1")
    live = (
        duckdb.connect()
        .execute(
            f"""select sum(id) from read_parquet('{block_path}', file_row_number = true) b
            where file_row_number not in
              (select "offset" from read_parquet('{delta_path}')
               where block_id = 7 and commit_ts <= 6)"""
        )
        .fetchall()
    )
    assert live == [(45 - 2,)]


def _delta_bytes() -> bytes:
    store = MemoryObjectStore()
    blocks = {
        1: BlockDeletes.from_pairs({0: 10, 5: 11, 70000: 12}),
        9: BlockDeletes.from_pairs({3: 20}),
    }
    write_deltas(store, "d", table_id=2, blocks=blocks)
    return store.get("d")


def _read(data: bytes) -> dict[int, BlockDeletes]:
    store = MemoryObjectStore()
    store.put("d", data)
    return read_deltas(store, "d")


def test_a_flipped_byte_anywhere_is_reported_or_harmless() -> None:
    original = _delta_bytes()
    expected = _read(original)
    reported = 0
    for index in range(len(original)):
        damaged = bytearray(original)
        damaged[index] ^= 0x5A
        try:
            found = _read(bytes(damaged))
        except ObjectCorrupt as exc:
            assert exc.name == "d"
            reported += 1
            continue
        assert found == expected, index
    assert reported > len(original) * 0.5
    for size in range(len(original)):
        with pytest.raises(ObjectCorrupt):
            _read(original[:size])


def _with(meta: bytes | None, table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(sink, table.schema)
    writer.write_table(table)
    if meta is not None:
        writer.add_key_value_metadata({META_KEY: meta})
    writer.close()
    return bytes(sink.getvalue().to_pybytes())


def _rows(rows: list[tuple[int, int, int]]) -> pa.Table:
    columns = list(zip(*rows, strict=True))
    return pa.table(
        [
            pa.array(np.array(column, dtype))
            for column, dtype in zip(columns, ["u8", "u4", "u8"], strict=True)
        ],
        schema=SCHEMA,
    )


def _reseal(meta: bytearray) -> bytes:
    meta[20:28] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(meta[:20] + meta[28:])))
    return bytes(meta)


def test_metadata_damage_and_disagreement_are_reported() -> None:
    rows = _rows([(1, 0, 10), (1, 5, 11)])
    good = encode_meta(2, [BlockDeleteSummary(1, 2, 10, 11)])
    assert _read(_with(good, rows))[1].pairs() == {0: 10, 5: 11}
    cases: list[tuple[bytes | None, pa.Table, str]] = [
        (None, rows, "no delta metadata"),
        (good[:10], rows, "shorter than its header"),
        (b"XXXX" + good[4:], rows, "bad magic"),
        (good[:4] + b"\x02" + good[5:], rows, "unknown version"),
        (good[:-1] + bytes([good[-1] ^ 1]), rows, "checksum mismatch"),
        (_reseal(bytearray(good[:5] + b"\x01" + good[6:])), rows, "field out of range"),
        (_reseal(bytearray(good + bytes(4))), rows, "field out of range"),
        (encode_meta(2, [BlockDeleteSummary(1, 2, 12, 11)]), rows, "field out of range"),
        (encode_meta(2, [BlockDeleteSummary(1, 0, 10, 11)]), rows, "field out of range"),
        (
            encode_meta(2, [BlockDeleteSummary(4, 1, 10, 10), BlockDeleteSummary(1, 1, 11, 11)]),
            rows,
            "field out of range",
        ),
        (encode_meta(2, [BlockDeleteSummary(1, 3, 10, 11)]), rows, "do not match"),
        (encode_meta(2, [BlockDeleteSummary(2, 2, 10, 11)]), rows, "do not match"),
        (encode_meta(2, [BlockDeleteSummary(1, 2, 10, 12)]), rows, "do not match"),
        (good, _rows([(1, 5, 10), (1, 0, 11)]), "do not match"),
        (good, _rows([(1, 5, 10), (1, 5, 11)]), "do not match"),
    ]
    for meta, table, reason in cases:
        with pytest.raises(ObjectCorrupt, match=reason):
            _read(_with(meta, table))
