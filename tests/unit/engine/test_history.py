"""The history core (engine/history.py): WAL entries in, one row per commit out, no I/O.

Proves, table-driven over hand-built entries: a user commit's rows appended and deleted per
table and its catalog changes, with names learned from the entries or the checkpoint's
catalog (an unknown table by id); a second copy of a transaction is skipped as replay skips
it; a rewrite is a flush (of an L0 block), a compaction (of a persisted one), a merge (of
several), or "rewrite" when its input's level is unknown, and the deletes it carries are not
counted as deletions; a large transaction's blocks count as appended rows net of rows it
deleted again; the filter's time range (both ends included), table and maintenance switch.
"""

from __future__ import annotations

import pyarrow as pa
from pyroaring import FrozenBitMap

from engine.history import (
    KIND_CHECKPOINT,
    KIND_COMMIT,
    KIND_COMPACT,
    KIND_FLUSH,
    KIND_MERGE,
    KIND_REWRITE,
    CatalogName,
    Filter,
    History,
    TableChange,
    row_json,
    row_text,
)
from engine.schema import Column, Schema
from engine.wal.entry import (
    Append,
    AppendInfo,
    BlockLevel,
    CatalogKind,
    CatalogOp,
    CheckpointEntry,
    Command,
    CreateBlock,
    Delete,
    DropBlock,
    Origin,
    TxnEntry,
    UpdateCatalog,
    memo_of,
)

SCHEMA = Schema([Column("id", "int64")], ["id"])
DB, ITEMS, ORDERS = 1, 2, 3


def entry(commit_ts: int, *commands: Command) -> TxnEntry:
    return TxnEntry(commit_ts - 1, commit_ts, memo_of(commands), tuple(commands))


def append(table_id: int, block_id: int, rows: int) -> Append:
    batch = pa.record_batch([pa.array(range(rows), pa.int64())], names=["id"])
    return Append(DB, table_id, (AppendInfo(block_id, 0, rows),), batch)


def delete(table_id: int, block_id: int, *rows: int) -> Delete:
    return Delete(DB, table_id, block_id, FrozenBitMap(rows))


def create_block(table_id: int, block_id: int, level: BlockLevel, rows: int) -> CreateBlock:
    return CreateBlock(DB, table_id, block_id, level, f"data/{block_id}.parquet", 0, rows)


CREATE = entry(
    100,
    UpdateCatalog(CatalogKind.DATABASE, CatalogOp.CREATE, DB, 0, "shop", None),
    UpdateCatalog(CatalogKind.TABLE, CatalogOp.CREATE, DB, ITEMS, "items", SCHEMA),
)


def test_a_commit_lists_rows_appended_and_deleted_per_table_with_names() -> None:
    core = History()
    first = core.feed(1, CREATE)
    assert first is not None and first.kind == KIND_COMMIT
    assert [(c.table, c.catalog) for c in first.changes] == [
        ("shop", "create database"),
        ("shop.items", "create table"),
    ]
    row = core.feed(2, entry(200, append(ITEMS, 1, 5), delete(ITEMS, 1, 0, 1), Origin("cn-7", 42)))
    assert row is not None
    assert row.changes == (TableChange("shop.items", ITEMS, rows_appended=5, rows_deleted=2),)
    assert row.origin == ("cn-7", 42)
    assert row_text(row).endswith("commit      shop.items +5 -2  [from cn-7 #42]")
    assert row_json(row)["tables"] == [
        {"table": "shop.items", "table_id": ITEMS, "rows_appended": 5, "rows_deleted": 2}
    ]


def test_names_come_from_the_checkpoint_catalog_else_ids() -> None:
    core = History([CatalogName(DB, 0, "shop"), CatalogName(DB, ITEMS, "items")])
    row = core.feed(7, entry(300, append(ITEMS, 1, 1), append(ORDERS, 1, 2)))
    assert row is not None
    assert [c.table for c in row.changes] == ["shop.items", f"shop.table#{ORDERS}"]


def test_a_second_copy_of_a_transaction_is_skipped() -> None:
    core = History()
    assert core.feed(1, CREATE) is not None
    assert core.feed(2, CREATE) is None
    assert core.retained.duplicates == 1 and core.retained.commits == 1


def test_rewrites_are_told_apart_and_hidden_by_default() -> None:
    core = History(row_filter=Filter(maintenance=True))
    core.feed(1, CREATE)
    core.feed(2, entry(200, append(ITEMS, 1, 10)))
    # A flush of L0 block 1 into L1 block 2, carrying a delete of 3 of its rows.
    flush = core.feed(
        3,
        entry(
            300,
            create_block(ITEMS, 2, BlockLevel.L1, 10),
            delete(ITEMS, 2, 0, 1, 2),
            DropBlock(DB, ITEMS, 1),
        ),
    )
    assert flush is not None and flush.kind == KIND_FLUSH and flush.maintenance
    assert flush.changes == (
        TableChange("shop.items", ITEMS, blocks_in=1, blocks_out=1, rows_out=7),
    )
    compact = core.feed(
        4, entry(400, create_block(ITEMS, 3, BlockLevel.L1, 5), DropBlock(DB, ITEMS, 2))
    )
    assert compact is not None and compact.kind == KIND_COMPACT
    merge = core.feed(
        5,
        entry(
            500,
            create_block(ITEMS, 9, BlockLevel.L2, 9),
            DropBlock(DB, ITEMS, 3),
            DropBlock(DB, ITEMS, 4),
        ),
    )
    assert merge is not None and merge.kind == KIND_MERGE
    unknown = core.feed(
        6, entry(600, create_block(ITEMS, 11, BlockLevel.L1, 1), DropBlock(DB, ITEMS, 77))
    )
    assert unknown is not None and unknown.kind == KIND_REWRITE
    checkpoint = core.feed(7, CheckpointEntry(600, 6, "ckp/x/manifest.json"))
    assert checkpoint is not None and checkpoint.kind == KIND_CHECKPOINT
    assert core.retained.commits == 2 and core.retained.maintenance == 4

    hidden = History()
    hidden.feed(1, CREATE)
    hidden.feed(2, entry(200, append(ITEMS, 1, 10)))
    assert (
        hidden.feed(
            3, entry(300, create_block(ITEMS, 2, BlockLevel.L1, 10), DropBlock(DB, ITEMS, 1))
        )
        is None
    )
    assert hidden.feed(4, CheckpointEntry(300, 3, "ckp/x/manifest.json")) is None
    assert hidden.retained.listed == 2


def test_a_large_transaction_appends_its_blocks_rows_net_of_those_it_deleted() -> None:
    core = History()
    core.feed(1, CREATE)
    row = core.feed(
        2,
        entry(
            200,
            create_block(ITEMS, 5, BlockLevel.L1, 1000),
            delete(ITEMS, 5, 3, 4),
            delete(ITEMS, 1, 0),
        ),
    )
    assert row is not None and row.kind == KIND_COMMIT
    assert row.changes == (
        TableChange("shop.items", ITEMS, rows_appended=998, rows_deleted=1, blocks_out=1),
    )


def test_the_filter_keeps_a_closed_time_range_and_one_table() -> None:
    core = History(row_filter=Filter(since_ts=200, until_ts=300, table="shop.orders"))
    assert core.feed(1, CREATE) is None  # before since
    orders = UpdateCatalog(CatalogKind.TABLE, CatalogOp.CREATE, DB, ORDERS, "orders", SCHEMA)
    row = core.feed(2, entry(200, orders, append(ITEMS, 1, 1)))
    assert row is not None and [c.table for c in row.changes] == ["shop.orders"]
    assert core.feed(3, entry(250, append(ITEMS, 1, 1))) is None  # another table only
    assert core.feed(4, entry(300, append(ORDERS, 1, 4))) is not None  # until is included
    assert core.feed(5, entry(301, append(ORDERS, 1, 4))) is None
    assert core.retained.listed == 2 and core.retained.commits == 5
    assert (core.retained.first_dsn, core.retained.last_dsn) == (1, 5)
    assert core.retained.first_commit_ts == 100


def test_a_dropped_table_keeps_its_name_and_forgets_its_blocks() -> None:
    core = History(row_filter=Filter(maintenance=True))
    core.feed(1, CREATE)
    core.feed(2, entry(200, append(ITEMS, 1, 3)))
    assert core.blocks_tracked == 1
    drop = UpdateCatalog(CatalogKind.TABLE, CatalogOp.DROP, DB, ITEMS, "items", None)
    row = core.feed(3, entry(300, drop))
    assert row is not None
    assert row.changes == (TableChange("shop.items", ITEMS, catalog="drop table"),)
    assert row_text(row).endswith("commit      drop table shop.items")
    assert core.blocks_tracked == 0  # memory follows live tables only
    late = core.feed(4, entry(400, delete(ITEMS, 1, 0)))  # a name still known by id
    assert late is not None and late.changes[0].table == "shop.items"
