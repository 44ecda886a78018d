"""Block objects round-trip (L1 and L2, every column type, scalar and compound keys), read
only what is asked, are plain Parquet to DuckDB, refuse unsorted rows before writing, and
report every kind of damage as a typed error naming the object.

How: tables of all 15 engine types with nulls are written through `write_object` to a
`MemoryObjectStore` or a `LocalDirStore` and read back with `read_meta` (footer only: the
test counts the bytes a reader pulls), `read_block` and `read_keys`; every key is found by
`may_contain`. DuckDB (a pinned dev dependency) reads the local file and sees the rows, the
hidden `__commit_ts` column and our footer key. Damage: a flipped byte at every position of a
small object must give `ObjectCorrupt`, or, where Parquet has no checksum (parts of its
footer such as statistics or the writer's name), data identical to the original: never other
rows. Every truncation is `ObjectCorrupt`; so are our metadata's bad magic, version, checksum
and field rules behind a valid checksum, a Parquet file without our key, and metadata that
disagrees with the row groups. Golden bytes of the metadata are in test_golden.py.
"""

from __future__ import annotations

import datetime
import io
import struct
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from engine.errors import SchemaError
from engine.objects import blockfile
from engine.objects.blockfile import (
    COMMIT_TS_COLUMN,
    META_KEY,
    BlockObjectReader,
    object_schema,
    read_block,
    read_keys,
    read_meta,
    write_object,
)
from engine.objects.errors import ObjectCorrupt, ObjectNotFound, RowsNotSorted
from engine.objects.store import LocalDirStore, MemoryObjectStore
from engine.schema import TYPES, Column, Schema, batch_keys

ALL_TYPES = Schema(
    [
        Column("k", "int64"),
        Column("ks", "string"),
        *(
            Column(f"c_{name.replace('[us]', '')}", name, nullable=True)
            for name in TYPES
            if name not in ("int64",)
        ),
    ],
    primary_key=["k", "ks"],
)


def _all_types_rows(count: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    arrays: dict[str, pa.Array] = {
        "k": pa.array(np.arange(count, dtype=np.int64) // 2),
        "ks": pa.array(["a" if i % 2 == 0 else "b\u00e9" for i in range(count)]),
    }
    for column in ALL_TYPES.columns[2:]:
        arrow_type = column.arrow_type
        if pa.types.is_integer(arrow_type):
            dtype = np.dtype(arrow_type.to_pandas_dtype())
            info = np.iinfo(dtype)
            values: Any = rng.integers(info.min, info.max, count, endpoint=True, dtype=dtype)
        elif pa.types.is_floating(arrow_type):
            values = rng.normal(size=count)
        elif pa.types.is_boolean(arrow_type):
            values = rng.integers(0, 2, count).astype(bool)
        elif pa.types.is_string(arrow_type):
            values = [f"s{i}" for i in rng.integers(0, 1000, count)]
        elif pa.types.is_binary(arrow_type):
            values = [bytes([i % 256]) * 3 for i in range(count)]
        elif pa.types.is_date32(arrow_type):
            values = [
                datetime.date(2026, 1, 1) + datetime.timedelta(days=int(d))
                for d in rng.integers(0, 300, count)
            ]
        else:
            values = [
                datetime.datetime(2026, 1, 1, 0, 0, 0, int(us))
                for us in rng.integers(0, 999_999, count)
            ]
        array = pa.array(values, arrow_type)
        mask = pa.array(rng.random(count) < 0.1)
        arrays[column.name] = pa.compute.if_else(mask, pa.nulls(count, arrow_type), array)
    arrays[COMMIT_TS_COLUMN] = pa.array(np.arange(count, dtype=np.uint64) + 100)
    return pa.table(arrays, schema=object_schema(ALL_TYPES))


SIMPLE = Schema([Column("id", "int64"), Column("note", "string", nullable=True)], ["id"])


def _simple_rows(ids: list[int], commit_ts: int = 5) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "note": pa.array([f"n{i}" if i % 2 else None for i in ids]),
            COMMIT_TS_COLUMN: pa.array([commit_ts] * len(ids), pa.uint64()),
        },
        schema=object_schema(SIMPLE),
    )


# --- Round trips --------------------------------------------------------------------------------


def test_l2_segment_round_trip_of_every_type() -> None:
    store = MemoryObjectStore()
    data = _all_types_rows(2500)
    written = write_object(
        store, "t/seg-1.parquet", schema=ALL_TYPES, table_id=9, level=2, data=data, block_rows=1000
    )
    assert [block.row_count for block in written.blocks] == [1000, 1000, 500]
    meta = read_meta(store, "t/seg-1.parquet")
    assert meta.to_bytes() == written.to_bytes()
    assert (meta.table_id, meta.level, meta.key_columns) == (9, 2, ("k", "ks"))
    assert meta.row_count == 2500
    assert meta.size_bytes == store.size("t/seg-1.parquet")
    with BlockObjectReader(store, "t/seg-1.parquet") as reader:
        for index, block in enumerate(meta.blocks):
            expected = data.slice(index * 1000, 1000)
            assert reader.read_block(index).equals(expected)
            keys = batch_keys(ALL_TYPES, expected.to_batches()[0])
            assert (block.key_min, block.key_max) == (keys[0], keys[-1])
            assert all(block.may_contain(key) for key in keys)
            others = [other for i, other in enumerate(meta.blocks) if i != index]
            assert not any(other.may_contain(keys[0]) for other in others)
    assert not meta.blocks[0].may_contain((-1, "a"))
    assert read_keys(store, "t/seg-1.parquet", 2).equals(data.slice(2000).select(["k", "ks"]))


def test_read_block_reads_only_the_columns_asked_for() -> None:
    store = MemoryObjectStore()
    write_object(store, "o", schema=SIMPLE, table_id=1, level=1, data=_simple_rows([1, 2, 3]))
    table = read_block(store, "o", 0, ["note", COMMIT_TS_COLUMN])
    assert table.column_names == ["note", COMMIT_TS_COLUMN]
    assert table.column(COMMIT_TS_COLUMN).to_pylist() == [5, 5, 5]
    with pytest.raises(SchemaError, match="unknown column 'nope'"):
        read_block(store, "o", 0, ["nope"])
    with pytest.raises(ObjectNotFound):
        read_meta(store, "missing")


class _CountingStore(MemoryObjectStore):
    """Counts the bytes pyarrow pulls through `open_input`."""

    read_bytes = 0

    def open_input(self, name: str) -> pa.NativeFile:
        store = self

        class Counting(io.BytesIO):
            def read(self, size: int | None = -1) -> bytes:
                data = super().read(size)
                store.read_bytes += len(data)
                return data

        return pa.PythonFile(Counting(self.get(name)), mode="r")


def test_read_meta_reads_only_the_footer() -> None:
    store = _CountingStore()
    rng = np.random.default_rng(3)
    ids = sorted(set(rng.integers(0, 10**12, 40_000).tolist()))
    written = write_object(store, "big", schema=SIMPLE, table_id=1, level=2, data=_simple_rows(ids))
    assert len(written.blocks) == 5
    meta = read_meta(store, "big")
    # The footer: our metadata (five blooms of 12 KiB, five zonemaps) and Parquet's own.
    assert meta.to_bytes() == written.to_bytes()
    assert store.read_bytes < len(written.to_bytes()) + 8 * 1024
    assert store.read_bytes * 5 < written.size_bytes
    store.read_bytes = 0
    with BlockObjectReader(store, "big") as reader:
        opened = store.read_bytes
        reader.read_keys(3)
    # One block's key column: a fifth of the id column at most, none of the notes.
    assert store.read_bytes - opened < written.size_bytes / 8


def test_duckdb_reads_the_object_as_plain_parquet(tmp_path: Path) -> None:
    with LocalDirStore(str(tmp_path / "objects")) as store:
        write_object(
            store,
            "tables/1/seg.parquet",
            schema=SIMPLE,
            table_id=1,
            level=2,
            data=_simple_rows(list(range(100)), commit_ts=42),
            block_rows=30,
        )
        path = store.path_of("tables/1/seg.parquet")
    connection = duckdb.connect()
    rows = connection.execute(
        f"select count(*), sum(id), count(note), min(__commit_ts) from read_parquet('{path}')"
    ).fetchall()
    assert rows == [(100, 4950, 50, 42)]
    keys = connection.execute(f"select key from parquet_kv_metadata('{path}')").fetchall()
    assert (META_KEY,) in [(bytes(key),) for (key,) in keys]
    groups = connection.execute(
        f"select count(distinct row_group_id) from parquet_metadata('{path}')"
    ).fetchall()
    assert groups == [(4,)]


def test_unsorted_or_repeated_keys_are_refused_before_writing() -> None:
    store = MemoryObjectStore()
    for ids, row, word in [([1, 3, 2], 2, "below"), ([1, 2, 2], 2, "repeats"), ([2, 1], 1, "")]:
        with pytest.raises(RowsNotSorted) as info:
            write_object(store, "o", schema=SIMPLE, table_id=1, level=1, data=_simple_rows(ids))
        assert info.value.row == row
        assert word in str(info.value)
    compound = _all_types_rows(6)
    # (0,"a") (0,"bé") (1,"a") ...: swap rows 1 and 2 to break the order in the first column.
    swapped = pa.concat_tables([compound.slice(0, 1), compound.slice(2, 1), compound.slice(1, 1)])
    with pytest.raises(RowsNotSorted) as info:
        write_object(store, "o", schema=ALL_TYPES, table_id=1, level=1, data=swapped)
    assert info.value.row == 2
    assert store.names() == []


def test_hidden_column_names_are_reserved() -> None:
    schema = Schema([Column("id", "int64"), Column(COMMIT_TS_COLUMN, "uint64")], ["id"])
    with pytest.raises(SchemaError, match="reserved"):
        write_object(
            MemoryObjectStore(), "o", schema=schema, table_id=1, level=1, data=pa.table({})
        )


# --- Damage -----------------------------------------------------------------------------------


def _object_bytes() -> tuple[bytes, pa.Table, bytes]:
    store = MemoryObjectStore()
    data = _simple_rows(list(range(0, 60, 3)))
    meta = write_object(store, "o", schema=SIMPLE, table_id=1, level=2, data=data, block_rows=8)
    return store.get("o"), data, meta.to_bytes()


def _read_all(store: MemoryObjectStore, name: str) -> tuple[bytes, pa.Table]:
    meta = read_meta(store, name)
    with BlockObjectReader(store, name) as reader:
        blocks = [reader.read_block(index) for index in range(len(meta.blocks))]
    return meta.to_bytes(), pa.concat_tables(blocks)


def test_a_flipped_byte_anywhere_is_reported_or_harmless() -> None:
    original, data, meta_bytes = _object_bytes()
    reported = 0
    for index in range(len(original)):
        damaged = bytearray(original)
        damaged[index] ^= 0x5A
        store = MemoryObjectStore()
        store.put("o", bytes(damaged))
        try:
            read_meta_bytes, table = _read_all(store, "o")
        except ObjectCorrupt as exc:
            assert exc.name == "o"
            reported += 1
            continue
        assert read_meta_bytes == meta_bytes, index
        assert table.equals(data), index
    assert reported > len(original) * 0.6  # the rest: statistics, the writer name, ...


def test_every_truncation_is_reported() -> None:
    original, _, _ = _object_bytes()
    for size in [*range(0, 64), *range(64, len(original), 17)]:
        store = MemoryObjectStore()
        store.put("o", original[:size])
        with pytest.raises(ObjectCorrupt) as info:
            _read_all(store, "o")
        assert info.value.name == "o"


def _with_meta(meta: bytes | None, data: pa.Table | None = None) -> MemoryObjectStore:
    """A Parquet object like the writer's, with other metadata bytes (a writer bug)."""
    data = data if data is not None else _simple_rows(list(range(10)))
    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(sink, data.schema)
    writer.write_table(data, row_group_size=data.num_rows)
    if meta is not None:
        writer.add_key_value_metadata({META_KEY: meta})
    writer.close()
    store = MemoryObjectStore()
    store.put("o", sink.getvalue().to_pybytes())
    return store


def _reseal(meta: bytearray) -> bytes:
    checksum = xxhash.xxh3_64_intdigest(bytes(meta[:20] + meta[28:]))
    meta[20:28] = struct.pack("<Q", checksum)
    return bytes(meta)


def test_our_metadata_damage_is_reported() -> None:
    store = MemoryObjectStore()
    data = _simple_rows(list(range(10)))
    good = write_object(store, "x", schema=SIMPLE, table_id=1, level=1, data=data).to_bytes()
    assert read_meta(_with_meta(good, data), "o").to_bytes() == good
    cases: list[tuple[bytes | None, str]] = [
        (None, "no engine metadata"),
        (b"", "shorter than its header"),
        (b"XXXX" + good[4:], "bad magic"),
        (good[:4] + b"\x09" + good[5:], "unknown version"),
        (good[:-1] + bytes([good[-1] ^ 1]), "checksum mismatch"),
        (_reseal(bytearray(good[:5] + b"\x03" + good[6:])), "field out of range"),  # level 3
        (_reseal(bytearray(good[:6] + b"\x01" + good[7:])), "field out of range"),  # reserved
        (_reseal(bytearray(good[:8] + bytes(8) + good[16:])), "field out of range"),  # table 0
        (_reseal(bytearray(good + b"\x00")), "bytes after the last block"),
        (_reseal(bytearray(good[:16] + struct.pack("<I", 2) + good[20:])), "field out of range"),
    ]
    for meta, reason in cases:
        with pytest.raises(ObjectCorrupt, match=reason):
            read_meta(_with_meta(meta, data), "o")
    # Valid metadata of another object: the row groups disagree with it.
    with pytest.raises(ObjectCorrupt, match="does not match"):
        read_meta(_with_meta(good, _simple_rows(list(range(11)))), "o")


def test_level_1_holds_exactly_one_block() -> None:
    with pytest.raises(AssertionError):
        write_object(
            MemoryObjectStore(),
            "o",
            schema=SIMPLE,
            table_id=1,
            level=1,
            data=_simple_rows(list(range(20))),
            block_rows=8,
        )
    assert blockfile.LEVELS == (1, 2)
