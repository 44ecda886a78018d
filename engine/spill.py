"""Large transactions: rows written to objects before commit (issue 14 "Large transactions";
seed 003_* Part 7, "the CN writes data to the object store first, then commits metadata").

Why: a transaction's rows otherwise ride in its one WAL entry (at most
`TXN_ENTRY_BYTES_MAX`) and sit in memory until it commits. Past `TXN_SPILL_BYTES` of inserted
data in one table, the workspace sorts those rows by key and writes them as a block object
(the same Parquet as a flush's, `__commit_ts` 0 meaning "committed with the block"); only
metadata stays: the object's blocks and their sorted keys. The commit then logs a
CreateBlock per block (plus Deletes on them, with their keys, for rows the transaction
deleted again), and its conflict check uses the sorted keys (`conflicts.BulkInsert`)
instead of a key entry per row. An object whose transaction does not commit is deleted
(rollback, conflict) or collected as an orphan at the next open (a crash).
"""

from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap, FrozenBitMap

from engine import limits
from engine.compaction import COMMIT_TS_COLUMN, Rewrite, WrittenBlock
from engine.conflicts import BulkInsert
from engine.schema import Key, Schema
from engine.storage import PersistedBlock
from engine.wal.entry import BlockLevel, CreateBlock, Delete, DeletedKeys

if TYPE_CHECKING:
    from engine.catalog import TableEntry
    from engine.storage import PersistedMeta


class SpillWriter(Protocol):
    """What a spill needs of the block store (engine/blockstore.py): one rewrite's object."""

    def write_rewrite(
        self, table_id: int, level: BlockLevel, schema: Schema, rewrite: Rewrite
    ) -> list[WrittenBlock]:
        """Write the rewrite's outputs as one object (durable when this returns)."""
        ...


@dataclass(slots=True)
class Spill:
    """One object of a transaction's spilled rows of one table, sorted by key."""

    table_id: int
    written: list[WrittenBlock]
    keys: BulkInsert
    sorted_keys: np.ndarray | list[Key]
    starts: list[int]
    """The first position of each block in the object (positions count rows in key order)."""
    deleted: BitMap = field(default_factory=BitMap)
    """Positions the transaction deleted again since."""
    placeholders: list[PersistedBlock] = field(default_factory=list)
    """The blocks as `PersistedBlock`s with negative ids, to read them through the loader
    before they exist in the table."""

    @property
    def rows(self) -> int:
        return self.starts[-1]

    @property
    def live_rows(self) -> int:
        return self.rows - len(self.deleted)

    def position(self, key: Key) -> int | None:
        """The key's position when the object holds it and it was not deleted since."""
        keys = self.sorted_keys
        if isinstance(keys, np.ndarray):
            if type(key) is not int or not -(1 << 63) <= key < (1 << 63):
                return None
            at = int(np.searchsorted(keys, key))
            found = at < len(keys) and int(keys[at]) == key
        else:
            at = bisect.bisect_left(keys, key)
            found = at < len(keys) and keys[at] == key
        return at if found and at not in self.deleted else None

    def place(self, position: int) -> tuple[int, int]:
        """(block index, offset) of a position."""
        index = bisect.bisect_right(self.starts, position) - 1
        return index, position - self.starts[index]


def sort_rows(schema: Schema, rows: pa.Table) -> pa.Table:
    """The rows sorted by key, with a `__commit_ts` of 0 (the block's create@ on commit)."""
    order = pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in schema.primary_key])
    ordered = rows.take(order)
    stamps = pa.array(np.zeros(ordered.num_rows, dtype=np.uint64), type=pa.uint64())
    return ordered.append_column(COMMIT_TS_COLUMN, stamps).combine_chunks()


def rewrite_of(rows: pa.Table) -> Rewrite:
    """`rows` (sorted) as a rewrite with no inputs, for the block store's writer."""
    total = rows.num_rows
    block_rows = [
        min(limits.BLOCK_ROWS_MAX, total - at) for at in range(0, total, limits.BLOCK_ROWS_MAX)
    ]
    return Rewrite(rows, block_rows, {})


def spill_of(
    table_id: int, schema: Schema, rows: pa.Table, written: list[WrittenBlock], first_id: int
) -> Spill:
    """The workspace's record of a written spill (`rows` sorted as written)."""
    starts = [0]
    for block in written:
        starts.append(starts[-1] + block.rows)
    key_columns = [rows.column(name) for name in schema.primary_key]
    sorted_keys: np.ndarray | list[Any]
    if (
        len(key_columns) == 1
        and pa.types.is_integer(key_columns[0].type)
        and not (pa.types.is_uint64(key_columns[0].type))
    ):
        sorted_keys = key_columns[0].to_numpy().astype(np.int64)
    elif len(key_columns) == 1:
        sorted_keys = key_columns[0].to_pylist()
    else:
        sorted_keys = list(zip(*(c.to_pylist() for c in key_columns), strict=True))
    spill = Spill(table_id, written, BulkInsert(table_id, sorted_keys), sorted_keys, starts)
    for index, block in enumerate(written):
        spill.placeholders.append(
            PersistedBlock(
                first_id - index,
                BlockLevel.L1 if len(written) == 1 else BlockLevel.L2,
                block.object_name,
                block.row_group,
                block.rows,
                0,
                block.meta.key_min,
                block.meta.key_max,
                block.meta.zonemap,
                bloom=block.meta.bloom,
            )
        )
    return spill


def spill_commands(
    pending_meta: dict[tuple[str, int], PersistedMeta], entry: TableEntry, spilled: Spill
) -> list[Any]:
    """A spill's CreateBlock commands (ids in commit order), and Deletes on the new
    blocks for rows the transaction deleted again (dead from the blocks' birth). Each
    block's metadata goes to `pending_meta` (the state's, read when the entry applies)."""
    ids = entry.data.allocate_block_ids(len(spilled.written))
    level = BlockLevel.L1 if len(spilled.written) == 1 else BlockLevel.L2
    commands: list[Any] = []
    for block_id, written in zip(ids, spilled.written, strict=True):
        commands.append(
            CreateBlock(
                entry.db_id,
                entry.table_id,
                block_id,
                level,
                written.object_name,
                written.row_group,
                written.rows,
            )
        )
        pending_meta[(written.object_name, written.row_group)] = written.meta
    dead: dict[int, tuple[BitMap, list[Key]]] = {}
    sorted_keys = spilled.sorted_keys
    numeric = isinstance(sorted_keys, np.ndarray)
    # Their keys, as a transaction's deletes have (issue 23), within the same bound.
    with_keys = len(spilled.deleted) <= limits.DELETE_KEYS_LOGGED_MAX
    for position in spilled.deleted:  # ascending: each block's offsets too
        index, offset = spilled.place(position)
        offsets, keys = dead.setdefault(index, (BitMap(), []))
        offsets.add(offset)
        if with_keys:
            key = sorted_keys[position]
            keys.append(int(key) if numeric else key)
    key_columns = entry.schema.key_columns
    for index, (offsets, keys) in sorted(dead.items()):
        deleted = DeletedKeys(key_columns, tuple(keys)) if with_keys else None
        commands.append(
            Delete(entry.db_id, entry.table_id, ids[index], FrozenBitMap(offsets), deleted)
        )
    return commands


async def write_spill(
    store: SpillWriter, entry: TableEntry, rows: pa.Table, first_id: int
) -> Spill:
    """Write a large transaction's sorted rows as a block object (engine/spill.py)."""
    written = await asyncio.to_thread(
        store.write_rewrite,
        entry.table_id,
        BlockLevel.L2,
        entry.schema,
        rewrite_of(rows),
    )
    return spill_of(entry.table_id, entry.schema, rows, written, first_id)
