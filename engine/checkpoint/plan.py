"""What a checkpoint holds, and the state it restores: a pure core (decision 0006).

`plan` reads the engine's state at `ckp_ts` (which must be its visible timestamp, taken on the
event loop in one synchronous step, so the state is exactly the state at `ckp_ts`) and returns
everything to write: the catalog and block rows, the L0 dumps (immutable Arrow slices, safe to
write from a worker thread while commits go on) and the delta masks. An incremental
checkpoint reuses the previous one's dump of an L0 block that did not grow, and a table's
delta object when none of its blocks lost a row since; a global one rewrites them all, so
older checkpoints can be deleted whole.

`restore` is the inverse: catalog rows, block rows, dumps, deltas and the persisted blocks'
metadata in, an `EngineState` at `ckp_ts` out. WAL entries after `ckp_ts` then apply to it
unchanged, because every row keeps its `(block_id, offset)`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyroaring import FrozenBitMap

from engine.catalog import Catalog, TableEntry
from engine.checkpoint import layout
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import BlockRow, CatalogRow, Manifest
from engine.compaction import COMMIT_TS_COLUMN
from engine.objects.deltafile import BlockDeletes
from engine.state import EngineState
from engine.storage import L0Block, PersistedBlock, PersistedMeta, TableData
from engine.wal.entry import BlockLevel


@dataclass(frozen=True, slots=True)
class Previous:
    """What an incremental checkpoint may reuse of the one before it."""

    ckp_ts: int
    manifest: str
    dumps: Mapping[tuple[int, int], tuple[str, int]]
    """(table_id, block_id) -> (dump object, its rows)."""
    deltas: Mapping[int, str]
    """table_id -> its delta object."""


@dataclass(slots=True)
class CheckpointPlan:
    ckp_ts: int
    directory: str
    ckp_dsn: int
    kind: str
    previous: str | None
    next_id: int
    catalog: list[CatalogRow] = field(default_factory=list)
    blocks: list[BlockRow] = field(default_factory=list)
    dumps: dict[str, pa.Table] = field(default_factory=dict)
    """New dump objects: name -> rows (the table's columns and __commit_ts)."""
    deltas: dict[str, tuple[int, dict[int, BlockDeletes]]] = field(default_factory=dict)
    """New delta objects: name -> (table_id, block_id -> deletes)."""
    live_rows: int = 0

    def manifest(self, created_wall_ms: int) -> Manifest:
        objects = {self.directory + "catalog.parquet", self.directory + "blocks.parquet"}
        for row in self.blocks:
            objects.add(row.object)
            if row.delta_object is not None:
                objects.add(row.delta_object)
        return Manifest(
            ckp_ts=self.ckp_ts,
            ckp_dsn=self.ckp_dsn,
            kind=self.kind,
            previous=self.previous,
            catalog=self.directory + "catalog.parquet",
            blocks=self.directory + "blocks.parquet",
            next_id=self.next_id,
            tables=sum(1 for r in self.catalog if r.kind == "table"),
            block_count=len(self.blocks),
            live_rows=self.live_rows,
            objects=tuple(sorted(objects)),
            created_wall_ms=created_wall_ms,
        )

    def previous_for_next(self) -> Previous:
        dumps = {
            (r.table_id, r.block_id): (r.object, r.rows)
            for r in self.blocks
            if r.level == layout.LEVEL_L0_DUMP
        }
        deltas = {r.table_id: r.delta_object for r in self.blocks if r.delta_object is not None}
        return Previous(self.ckp_ts, layout.manifest_name(self.directory), dumps, deltas)


def plan(
    state: EngineState, ckp_ts: int, ckp_dsn: int, previous: Previous | None, tag: str
) -> CheckpointPlan:
    """Everything a checkpoint at `ckp_ts` writes. `previous`: reuse what did not change
    since it (an incremental checkpoint); None: rewrite everything (a global one)."""
    assert state.applied_ts == ckp_ts, "plan on the event loop, at the visible timestamp"
    kind = layout.KIND_GLOBAL if previous is None else layout.KIND_INCREMENTAL
    catalog = state.catalog
    out = CheckpointPlan(
        ckp_ts,
        layout.directory(ckp_ts, tag),
        ckp_dsn,
        kind,
        None if previous is None else previous.manifest,
        catalog.next_id,
    )
    for database in catalog.databases_at(ckp_ts):
        out.catalog.append(
            CatalogRow("database", database.db_id, 0, database.name, database.create_ts, None, 0, 0)
        )
        for table in catalog.tables_at(database.db_id, ckp_ts):
            data = table.data
            open_block = data.open_block
            out.catalog.append(
                CatalogRow(
                    "table",
                    table.db_id,
                    table.table_id,
                    table.name,
                    table.create_ts,
                    table.schema,
                    data.next_block_id,
                    open_block.block_id if open_block is not None else 0,
                )
            )
            _plan_table(out, table.table_id, data, ckp_ts, previous)
    return out


def _plan_table(
    out: CheckpointPlan,
    table_id: int,
    data: TableData,
    ckp_ts: int,
    previous: Previous | None,
) -> None:
    deletes: dict[int, BlockDeletes] = {}
    deletes_changed = previous is None
    rows: list[BlockRow] = []
    for block in data.scan_blocks(ckp_ts):
        if isinstance(block, L0Block):
            count = block.visible_rows(ckp_ts)
            reused = previous.dumps.get((table_id, block.block_id)) if previous else None
            if reused is not None and reused[1] == count:
                name = reused[0]
            else:
                name = layout.dump_name(out.directory, table_id, block.block_id)
                dump = block.table().slice(0, count)
                out.dumps[name] = dump.append_column(
                    COMMIT_TS_COLUMN, block.commit_ts_column(count)
                )
            level, row_group = layout.LEVEL_L0_DUMP, 0
        else:
            assert isinstance(block, PersistedBlock)
            count, name, level, row_group = (
                block.rows,
                block.object_name,
                int(block.level),
                block.row_group,
            )
        dead = block.deletes.at(ckp_ts)
        if dead:
            ts_of = block.deletes.ts_of
            offsets = sorted(dead)
            stamps = np.asarray([ts_of[o] for o in offsets], dtype=np.uint64)
            stamps.setflags(write=False)
            deletes[block.block_id] = BlockDeletes(FrozenBitMap(offsets), stamps)
            if previous is not None and int(stamps.max()) > previous.ckp_ts:
                deletes_changed = True
        out.live_rows += count - len(dead)
        rows.append(
            BlockRow(
                table_id,
                block.block_id,
                level,
                name,
                row_group,
                count,
                block.create_ts,
                None,
                len(dead),
            )
        )
    delta: str | None = None
    if deletes:
        reused_delta = previous.deltas.get(table_id) if previous is not None else None
        if deletes_changed or reused_delta is None:
            delta = layout.delta_name(out.directory, table_id)
            out.deltas[delta] = (table_id, deletes)
        else:
            delta = reused_delta
    for row in rows:
        if row.deleted:
            row = BlockRow(
                row.table_id,
                row.block_id,
                row.level,
                row.object,
                row.row_group,
                row.rows,
                row.create_ts,
                delta,
                row.deleted,
            )
        out.blocks.append(row)


# --- restore ----------------------------------------------------------------------------------


def restore_catalog(
    catalog: Catalog, rows: Sequence[CatalogRow], next_id: int, source: str
) -> dict[int, TableEntry]:
    """A checkpoint's catalog rows into an empty `catalog`: its databases, then its tables, then
    the id allocator past `next_id`; the restored tables by id. The one restore of a checkpoint's
    catalog (the engine's `restore` and spark_jobs' replay both call it). Raises
    `CheckpointCorrupt(source, ...)` for a database or table listed twice or a table of an
    unknown database."""
    tables: dict[int, TableEntry] = {}
    for row in rows:
        if row.kind == "database":
            if row.db_id in catalog.databases:
                raise CheckpointCorrupt(source, f"database {row.db_id} twice")
            catalog.restore_database(row.db_id, row.name, row.create_ts)
    for row in rows:
        if row.kind == "table":
            assert row.schema is not None  # layout.decode_catalog gives a table its schema
            if row.db_id not in catalog.databases:
                raise CheckpointCorrupt(source, f"table {row.name!r} of an unknown database")
            if row.table_id in catalog.tables:
                raise CheckpointCorrupt(source, f"table {row.table_id} twice")
            tables[row.table_id] = catalog.restore_table(
                row.table_id, row.db_id, row.name, row.schema, row.create_ts
            )
    catalog.next_id = max(catalog.next_id, next_id)
    return tables


def restore(
    manifest: Manifest,
    catalog_rows: list[CatalogRow],
    block_rows: list[BlockRow],
    dumps: Mapping[str, pa.Table],
    deltas: Mapping[str, Mapping[int, BlockDeletes]],
    metas: Mapping[tuple[str, int], PersistedMeta],
) -> EngineState:
    """The engine's state at `manifest.ckp_ts` from a checkpoint's decoded objects.
    Raises `CheckpointCorrupt` when they disagree (a block of an unknown table, a dump of
    the wrong length, a delete beyond its block)."""
    state = EngineState()
    source = manifest.name
    tables: dict[int, tuple[TableData, int]] = {}
    restored = restore_catalog(state.catalog, catalog_rows, manifest.next_id, source)
    for row in catalog_rows:
        if row.kind == "table":
            entry = restored[row.table_id]
            tables[row.table_id] = (entry.data, row.open_block_id)
            entry.data.next_block_id = row.next_block_id
    for brow in sorted(block_rows, key=lambda r: (r.table_id, r.block_id)):
        found = tables.get(brow.table_id)
        if found is None:
            raise CheckpointCorrupt(
                source, f"block {brow.block_id} of unknown table {brow.table_id}"
            )
        data = found[0]
        if brow.block_id >= data.next_block_id:
            raise CheckpointCorrupt(source, f"block {brow.block_id} beyond the table's next id")
        if brow.level == layout.LEVEL_L0_DUMP:
            dump = dumps[brow.object]
            if dump.num_rows != brow.rows:
                raise CheckpointCorrupt(
                    brow.object, f"{dump.num_rows} rows, the list says {brow.rows}"
                )
            data.restore_l0(brow.block_id, _nodes(dump, data, brow.object))
        else:
            meta = metas[(brow.object, brow.row_group)]
            data.restore_persisted(
                PersistedBlock(
                    brow.block_id,
                    BlockLevel(brow.level),
                    brow.object,
                    brow.row_group,
                    brow.rows,
                    brow.create_ts,
                    meta.key_min,
                    meta.key_max,
                    meta.zonemap,
                    bloom=meta.bloom,
                )
            )
        if brow.delta_object is not None:
            block_deletes = deltas[brow.delta_object].get(brow.block_id)
            if block_deletes is None or len(block_deletes.offsets) != brow.deleted:
                raise CheckpointCorrupt(brow.delta_object, f"block {brow.block_id}'s deletes")
            data.restore_deletes(brow.block_id, _delete_nodes(block_deletes, manifest.ckp_ts))
    for data, open_block_id in tables.values():
        data.finish_restore(open_block_id)
    state.applied_ts = manifest.ckp_ts
    return state


def _nodes(dump: pa.Table, data: TableData, source: str) -> list[tuple[int, pa.RecordBatch]]:
    """A dump's rows as append nodes: runs of one commit_ts, in offset order."""
    names = data.arrow_schema.names
    if dump.schema.names != [*names, COMMIT_TS_COLUMN]:
        raise CheckpointCorrupt(source, f"dump columns {dump.schema.names} are not the table's")
    try:
        rows = dump.select(names).cast(data.arrow_schema).combine_chunks()
        stamps = dump.column(COMMIT_TS_COLUMN).cast(pa.uint64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise CheckpointCorrupt(source, f"dump columns do not fit the table: {exc}") from None
    if len(stamps) and bool(np.any(stamps[1:] < stamps[:-1])):
        raise CheckpointCorrupt(source, "dump rows are not in commit order")
    bounds = [0, *(np.flatnonzero(stamps[1:] != stamps[:-1]) + 1).tolist(), len(stamps)]
    nodes = []
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            part = rows.slice(lo, hi - lo).combine_chunks().to_batches()
            nodes.append((int(stamps[lo]), part[0]))
    return nodes


def _delete_nodes(deletes: BlockDeletes, ckp_ts: int) -> list[tuple[int, FrozenBitMap]]:
    offsets = np.asarray(deletes.offsets.to_array(), dtype=np.uint32)
    by_ts: dict[int, list[int]] = {}
    for offset, stamp in zip(offsets.tolist(), deletes.commit_ts.tolist(), strict=True):
        if stamp > ckp_ts:
            continue
        by_ts.setdefault(int(stamp), []).append(int(offset))
    return [(stamp, FrozenBitMap(by_ts[stamp])) for stamp in sorted(by_ts)]
