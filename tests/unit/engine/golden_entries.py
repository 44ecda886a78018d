"""The inputs of the WAL golden vectors (tests/unit/engine/golden/*.hex).

`python -m tests.unit.engine.golden_entries` rewrites the files from these inputs: only after
a deliberate format change, together with a version bump (engine/FORMAT.md).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
from pyroaring import FrozenBitMap

from engine.schema import Column, Schema
from engine.wal.codec import encode_entry
from engine.wal.entry import (
    Append,
    AppendInfo,
    BlockLevel,
    CatalogKind,
    CatalogOp,
    CheckpointEntry,
    CreateBlock,
    Delete,
    DeletedKeys,
    DropBlock,
    MemoItem,
    Origin,
    TxnEntry,
    UpdateCatalog,
)

GOLDEN = Path(__file__).parent / "golden"

ORDERS = Schema(
    [Column("id", "int64"), Column("customer", "int32"), Column("note", "string", nullable=True)],
    primary_key=["id"],
)

ALL_TYPES = Schema(
    [
        Column("k", "int32"),
        Column("ks", "string"),
        Column("i8", "int8", nullable=True),
        Column("i16", "int16", nullable=True),
        Column("i64", "int64", nullable=True),
        Column("u8", "uint8", nullable=True),
        Column("u16", "uint16", nullable=True),
        Column("u32", "uint32", nullable=True),
        Column("u64", "uint64", nullable=True),
        Column("f32", "float32", nullable=True),
        Column("f64", "float64", nullable=True),
        Column("b", "bool", nullable=True),
        Column("bin", "binary", nullable=True),
        Column("d", "date32", nullable=True),
        Column("ts", "timestamp[us]", nullable=True),
    ],
    primary_key=["k", "ks"],
)

ALL_TYPES_ROWS = [
    {
        "k": 1,
        "ks": "a",
        "i8": -8,
        "i16": -16,
        "i64": -(1 << 40),
        "u8": 8,
        "u16": 16,
        "u32": 32,
        "u64": (1 << 64) - 1,
        "f32": 0.5,
        "f64": -2.25,
        "b": True,
        "bin": b"\x00\x01",
        "d": datetime.date(2026, 11, 24),
        "ts": datetime.datetime(2026, 11, 24, 12, 0, 0, 1),
    },
    {"k": 2, "ks": "b"},
    {"k": 3, "ks": "ü", "b": False, "bin": b"", "f64": 1e300},
]

KEY_TYPES_COLUMNS = (
    ("i8", "int8"),
    ("i16", "int16"),
    ("i32", "int32"),
    ("i64", "int64"),
    ("u8", "uint8"),
    ("u16", "uint16"),
    ("u32", "uint32"),
    ("u64", "uint64"),
    ("b", "bool"),
    ("s", "string"),
    ("bin", "binary"),
    ("d", "date32"),
    ("ts", "timestamp[us]"),
)
"""A compound key of every key type (engine.schema.KEY_TYPES), for `ac_delete_keys_types_v3`."""

KEY_TYPES_VALUES = (
    (
        -8,
        -16,
        -32,
        -(1 << 40),
        8,
        16,
        32,
        (1 << 64) - 1,
        True,
        "ü",
        b"\x00\x01",
        datetime.date(2026, 11, 24),
        datetime.datetime(2026, 11, 24, 12, 0, 0, 1),
    ),
    (
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        False,
        "",
        b"",
        datetime.date(1970, 1, 1),
        datetime.datetime(1970, 1, 1),
    ),
    (
        127,
        -(1 << 15),
        (1 << 31) - 1,
        -1,
        255,
        (1 << 16) - 1,
        (1 << 32) - 1,
        1,
        True,
        "abc",
        b"\xff",
        datetime.date(1969, 12, 31),
        datetime.datetime(1969, 12, 31, 23, 59, 59, 999999),
    ),
)

ENTRIES: dict[str, TxnEntry | CheckpointEntry] = {
    "ac_create_v1": TxnEntry(
        start_ts=100,
        commit_ts=101,
        memo=(MemoItem(1, 0, 0), MemoItem(1, 2, 0)),
        commands=(
            UpdateCatalog(CatalogKind.DATABASE, CatalogOp.CREATE, 1, 0, "shop", None),
            UpdateCatalog(CatalogKind.TABLE, CatalogOp.CREATE, 1, 2, "orders", ORDERS),
        ),
    ),
    "ac_create_types_v1": TxnEntry(
        start_ts=110,
        commit_ts=111,
        memo=(MemoItem(1, 3, 0),),
        commands=(
            UpdateCatalog(CatalogKind.TABLE, CatalogOp.CREATE, 1, 3, "all_types", ALL_TYPES),
        ),
    ),
    "ac_drop_v1": TxnEntry(
        start_ts=200,
        commit_ts=205,
        memo=(MemoItem(1, 0, 0), MemoItem(1, 2, 0)),
        commands=(
            UpdateCatalog(CatalogKind.TABLE, CatalogOp.DROP, 1, 2, "orders", None),
            UpdateCatalog(CatalogKind.DATABASE, CatalogOp.DROP, 1, 0, "shop", None),
        ),
    ),
    "ac_append_v1": TxnEntry(
        start_ts=300,
        commit_ts=301,
        memo=(MemoItem(1, 3, 1), MemoItem(1, 3, 2)),
        commands=(
            Append(
                1,
                3,
                (AppendInfo(1, 8190, 2), AppendInfo(2, 0, 1)),
                pa.RecordBatch.from_pylist(ALL_TYPES_ROWS, schema=ALL_TYPES.to_arrow()),
            ),
        ),
    ),
    "ac_delete_v1": TxnEntry(
        start_ts=400,
        commit_ts=402,
        memo=(MemoItem(1, 2, 1),),
        commands=(Delete(1, 2, 1, FrozenBitMap([1, 5, 70000])),),
    ),
    "ac_flush_v1": TxnEntry(
        # A flush of L0 block 1 of table 2 into the L1 object of block 4, which starts with
        # its rows 0 and 7 dead (deleted from block 1 while the flush ran), and the
        # merge-style second output on row group 1 of an L2 segment (decision 0006).
        start_ts=600,
        commit_ts=604,
        memo=(MemoItem(1, 2, 1), MemoItem(1, 2, 4), MemoItem(1, 2, 5)),
        commands=(
            CreateBlock(1, 2, 4, BlockLevel.L1, "data/2/4-0a1b.parquet", 0, 8192),
            CreateBlock(1, 2, 5, BlockLevel.L2, "data/2/seg-77.parquet", 1, 100),
            Delete(1, 2, 4, FrozenBitMap([0, 7])),
            DropBlock(1, 2, 1),
        ),
    ),
    "ac_origin_v1": TxnEntry(
        # A compute node's commit (issue 15): one deleted row, asked for as seq 7 of cn-a.
        start_ts=700,
        commit_ts=701,
        memo=(MemoItem(1, 2, 4),),
        commands=(Delete(1, 2, 4, FrozenBitMap([3])), Origin("cn-a", 7)),
    ),
    "ckp_v1": CheckpointEntry(ckp_ts=500, truncate_dsn=42, location="ckp/0000000500.parquet"),
    # Version 2 (issue 21): small appends as AppendColumns. Every column type, nulls, two
    # infos; and the common case, a one-row insert.
    "ac_append_columns_v2": TxnEntry(
        start_ts=800,
        commit_ts=801,
        memo=(MemoItem(1, 3, 1), MemoItem(1, 3, 2)),
        commands=(
            Append(
                1,
                3,
                (AppendInfo(1, 8190, 2), AppendInfo(2, 0, 1)),
                pa.RecordBatch.from_pylist(ALL_TYPES_ROWS, schema=ALL_TYPES.to_arrow()),
            ),
        ),
    ),
    "ac_insert_one_v2": TxnEntry(
        start_ts=900,
        commit_ts=901,
        memo=(MemoItem(1, 2, 1),),
        commands=(
            Append(
                1,
                2,
                (AppendInfo(1, 5, 1),),
                pa.RecordBatch.from_pylist(
                    [{"id": 42, "customer": 7, "note": "hi"}], schema=ORDERS.to_arrow()
                ),
            ),
        ),
    ),
    # Version 3 (issue 23): a Delete with its rows' primary keys (DeleteKeys). The worked
    # example of FORMAT.md, and three rows of a compound key of every key type.
    "ac_delete_keys_v3": TxnEntry(
        start_ts=1000,
        commit_ts=1001,
        memo=(MemoItem(1, 2, 1),),
        commands=(
            Delete(1, 2, 1, FrozenBitMap([1, 5]), DeletedKeys((("id", "int64"),), (42, 43))),
        ),
    ),
    "ac_delete_keys_types_v3": TxnEntry(
        start_ts=1100,
        commit_ts=1101,
        memo=(MemoItem(1, 4, 2),),
        commands=(
            Delete(
                1,
                4,
                2,
                FrozenBitMap([0, 9, 70000]),
                DeletedKeys(KEY_TYPES_COLUMNS, KEY_TYPES_VALUES),
            ),
        ),
    ),
}


def version_of(name: str) -> int:
    """The entry version a vector is written in: its name's `_vN` suffix."""
    return int(name.rsplit("_v", 1)[1])


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for name, entry in ENTRIES.items():
        encoded = encode_entry(entry, version=version_of(name))
        (GOLDEN / f"{name}.hex").write_text(encoded.hex() + "\n")


if __name__ == "__main__":
    main()
