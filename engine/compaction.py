"""Flush, merge and compaction: what to rewrite, the rewritten rows, and where every input row
went. A pure core: Arrow tables in, Arrow tables and position maps out (the shell writes the
objects and commits; decision 0006).

Why position maps (seed "Compact & Merge": Block1 sorted at t11, Txn5/Txn6 committing deletes
during the sort, Txn7 after the swap): a rewrite reads its inputs at a snapshot `start_ts` and
keeps only the rows live then, sorted by primary key. Every input row's new place is recorded
(`Rewrite.positions[input_block][offset]` = its position in the outputs, or -1 when it was
already dead at `start_ts`), so the deletes committed on the inputs after `start_ts` are
carried onto the outputs exactly (`carried`), and a later transaction that deleted a row of an
input re-resolves its delete through the same map (`Moves`). No key is ever searched for.

The policy (`plan`) is a pure function of the table's blocks:

* flush every sealed L0 block whose rows are all applied;
* freeze the open L0 block when it is older than `flush_age_ms` or the table's L0 bytes pass
  `l0_bytes_max` (memory stays bounded whatever the write pattern);
* merge the table's L1 blocks into one L2 segment once there are `merge_l1_blocks` of them;
* compact a persisted block alone once `compact_deleted_fraction` of its rows are dead to
  every reader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

from engine import limits
from engine.clock import ts_physical_ms
from engine.schema import Schema
from engine.storage import TS_NEVER, L0Block, PersistedBlock, PersistedMeta, TableData
from engine.wal.entry import BlockLevel

COMMIT_TS_COLUMN = "__commit_ts"
"""The hidden column of every block object: the commit_ts of the row's append."""


@dataclass(frozen=True, slots=True)
class Policy:
    flush_age_ms: int = limits.FLUSH_AGE_MS
    l0_bytes_max: int = limits.L0_BYTES_MAX
    merge_l1_blocks: int = limits.MERGE_L1_BLOCKS
    compact_deleted_fraction: float = limits.COMPACT_DELETED_FRACTION
    checkpoint_interval_ms: int = limits.CKP_INTERVAL_MS
    """A checkpoint at least this often while commits arrive (a TN's `[maintenance]`: the
    demo and the distributed benchmark shorten it to see a checkpoint within seconds)."""
    checkpoint_wal_reserve_entries: int = limits.CKP_WAL_RESERVE_ENTRIES
    """WAL entries kept below a checkpoint when it truncates the WAL."""
    history_retention_ms: int = limits.HISTORY_RETENTION_MS
    """How far back `snapshot(ts)` works across restarts, checkpoints and rewrites: the WAL
    and objects are kept for it (decision 0010; 0: only since the newest checkpoint)."""
    snapshot_grace_ms: int = 0
    """Blocks a rewrite dropped stay in memory this long (wall time) after their drop even
    when no registered reader is older: a compute node's transaction begins at the TN's
    newest state and reaches the TN a round trip and its own work later, unregistered until
    then; a flush in between would refuse it with `SnapshotUnavailable`. 0 for an embedded
    engine (every reader registers when it begins); a TN's default is
    `limits.CN_SNAPSHOT_GRACE_MS`."""


@dataclass(frozen=True, slots=True)
class Task:
    """One rewrite: `inputs` (block ids) into blocks of `level`."""

    kind: str  # "flush" | "merge" | "compact"
    table_id: int
    inputs: tuple[int, ...]
    level: BlockLevel


@dataclass(slots=True)
class TablePlan:
    freeze: bool = False
    tasks: list[Task] = field(default_factory=list)


L0_KEY_BYTES_PER_ROW = 96
"""What one L0 row costs beyond its Arrow bytes: its entry in the key index (a dict slot, a
key object, a packed row id), measured with tracemalloc for int64 keys."""


def l0_bytes(data: TableData) -> int:
    """Bytes of the table's L0 blocks not flushed yet (what flushing gives back). A flushed
    block stays in memory while a snapshot older than its flush may read it, and is not
    counted: a commit waiting for flushes holds such a snapshot itself, and counting what
    only its end can free would have it wait for itself."""
    return sum(
        b.byte_size() + L0_KEY_BYTES_PER_ROW * b.rows
        for b in data.l0_blocks()
        if b.drop_ts == TS_NEVER
    )


def plan(
    table_id: int,
    data: TableData,
    *,
    now_ms: int,
    gc_ts: int,
    busy: frozenset[int],
    policy: Policy,
    memory_full: bool = False,
) -> TablePlan:
    """What to do for one table now. `gc_ts`: no reader is older than this; `busy`: blocks
    an unfinished rewrite already has as inputs; `memory_full`: the engine's L0 bytes passed
    `l0_bytes_max` and this table should give some back."""
    out = TablePlan()
    for block in data.l0_blocks():
        if block.drop_ts != TS_NEVER or block.block_id in busy:
            continue
        if data.complete(block):
            out.tasks.append(Task("flush", table_id, (block.block_id,), BlockLevel.L1))
    open_block = data.open_block
    if open_block is not None and not data.sealed(open_block) and open_block.rows:
        age_ms = now_ms - ts_physical_ms(open_block.create_ts)
        if memory_full or age_ms >= policy.flush_age_ms:
            out.freeze = True
    live = [b for b in data.persisted_blocks() if b.drop_ts == TS_NEVER]
    l1 = [b for b in live if b.level is BlockLevel.L1 and b.block_id not in busy]
    if len(l1) >= policy.merge_l1_blocks:
        chosen = l1[: policy.merge_l1_blocks]
        out.tasks.append(Task("merge", table_id, tuple(b.block_id for b in chosen), BlockLevel.L2))
        busy = busy | {b.block_id for b in chosen}
    for persisted in live:
        if persisted.block_id in busy:
            continue
        dead = len(persisted.deletes.at(gc_ts))
        if dead and dead >= policy.compact_deleted_fraction * persisted.rows:
            out.tasks.append(
                Task("compact", table_id, (persisted.block_id,), BlockLevel(persisted.level))
            )
    return out


@dataclass(frozen=True, slots=True)
class WrittenBlock:
    """One output block, durable in the object store: row group `row_group` of
    `object_name`, with what its CreateBlock needs beyond the command (`meta`)."""

    object_name: str
    row_group: int
    rows: int
    meta: PersistedMeta


@dataclass(slots=True)
class Rewrite:
    """The outputs of one rewrite, sorted by key, and where every input row went."""

    rows: pa.Table
    """The output rows: the table's columns then `__commit_ts`, sorted by primary key."""
    block_rows: list[int]
    """Rows of each output block, in order (all `BLOCK_ROWS_MAX` but the last)."""
    positions: dict[int, np.ndarray]
    """input block id -> for each of its offsets, the row's position in `rows`, or -1."""

    def place(self, position: int) -> tuple[int, int]:
        """(output block index, offset) of a position in `rows`."""
        return divmod(position, limits.BLOCK_ROWS_MAX)

    def carried(self, deleted: Mapping[int, BitMap]) -> dict[int, BitMap]:
        """Deletes committed on the inputs after the snapshot (input block -> offsets),
        carried onto the outputs (output block index -> offsets)."""
        out: dict[int, BitMap] = {}
        for block_id, offsets in deleted.items():
            where = self.positions[block_id]
            for offset in offsets:
                position = int(where[offset])
                assert position >= 0, "a row dead at the snapshot was deleted again"
                index, at = self.place(position)
                out.setdefault(index, BitMap()).add(at)
        return out


def l0_rows(block: L0Block, schema: Schema, ts: int) -> tuple[pa.Table, np.ndarray]:
    """The rows of an L0 block live at `ts` with their `__commit_ts`, in offset order, and
    their offsets."""
    visible = block.visible_rows(ts)
    table = block.table().slice(0, visible)
    table = table.append_column(COMMIT_TS_COLUMN, block.commit_ts_column(visible))
    keep = BitMap(range(visible))
    keep -= block.deletes.at(ts)
    offsets = np.asarray(keep.to_array(), dtype=np.int64)
    if len(offsets) != visible:
        table = table.take(pa.array(offsets, type=pa.int64()))
    return table, offsets


def persisted_rows(block: PersistedBlock, loaded: pa.Table, ts: int) -> tuple[pa.Table, np.ndarray]:
    """The rows of a persisted block (all its columns and `__commit_ts`, as loaded) live at
    `ts`, and their offsets."""
    keep = BitMap(range(block.rows))
    keep -= block.deletes.at(ts)
    offsets = np.asarray(keep.to_array(), dtype=np.int64)
    table = loaded
    if len(offsets) != block.rows:
        table = loaded.take(pa.array(offsets, type=pa.int64()))
    stamps = table.column(COMMIT_TS_COLUMN)
    if pc.any(pc.equal(stamps, 0)).as_py():
        # A large transaction's rows were written before its commit_ts was known (0: "the
        # block's"): the rewrite gives them their real one.
        fixed = pc.if_else(pc.equal(stamps, 0), pa.scalar(block.create_ts, pa.uint64()), stamps)
        table = table.set_column(
            table.schema.get_field_index(COMMIT_TS_COLUMN), COMMIT_TS_COLUMN, fixed
        )
    return table, offsets


def rewrite(schema: Schema, inputs: Sequence[tuple[int, int, pa.Table, np.ndarray]]) -> Rewrite:
    """Sort the live rows of the inputs (block id, block rows, live rows, their offsets) by
    key into one output run, and map every input row to its output position."""
    names = [*schema.names, COMMIT_TS_COLUMN]
    tables = [rows.select(names) for _, _, rows, _ in inputs]
    combined = pa.concat_tables(tables).combine_chunks() if tables else None
    assert combined is not None
    order = pc.sort_indices(combined, sort_keys=[(k, "ascending") for k in schema.primary_key])
    ordered = combined.take(order)
    rank = np.empty(len(order), dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int64)
    positions: dict[int, np.ndarray] = {}
    start = 0
    for block_id, block_rows, rows, offsets in inputs:
        where = np.full(block_rows, -1, dtype=np.int64)
        where[offsets] = rank[start : start + rows.num_rows]
        positions[block_id] = where
        start += rows.num_rows
    total = ordered.num_rows
    block_rows_list = [
        min(limits.BLOCK_ROWS_MAX, total - at) for at in range(0, total, limits.BLOCK_ROWS_MAX)
    ]
    return Rewrite(ordered, block_rows_list, positions)
