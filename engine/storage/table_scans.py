"""A table's rows at a snapshot, read from the blocks a scan chose (engine/scan.py).

Why apart from engine/storage/table.py: `TableData` holds a table's blocks and versions and
applies committed changes to them; these read a snapshot's rows out of blocks already chosen
and loaded, as Arrow tables: every visible row of each block (`rows_at`), or the rows of a
key range found by binary search in sorted persisted blocks (`rows_in_key_range`).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from pyroaring import BitMap

from engine.storage.blocks import Block, L0Block, LoadedBlocks, PersistedBlock
from engine.storage.table import TableData


def rows_at(
    data: TableData,
    ts: int,
    blocks: Iterable[Block],
    loaded: LoadedBlocks,
    excluded: dict[int, BitMap] | None = None,
    columns: list[str] | None = None,
) -> list[pa.Table]:
    """The rows of `blocks` visible at `ts`, minus `excluded` (block_id -> offsets: the
    reading transaction's own deletes), as one Arrow table per block (with `columns`, all
    by default)."""
    names = columns if columns is not None else data.arrow_schema.names
    parts = []
    ordered = list(blocks)
    index = 0
    while index < len(ordered):
        block = ordered[index]
        index += 1
        if isinstance(block, L0Block):
            visible = block.visible_rows(ts)
            if not visible:
                continue
            table = block.table()
        else:
            run = _persisted_run(block, ordered, index, ts, loaded, excluded)
            if run is not None:
                # Whole blocks in a row of one object, nothing deleted: one slice.
                table, start, rows, index = run
                parts.append(table.slice(start, rows).select(names).cast(data.arrow_subset(names)))
                continue
            visible = block.rows
            # Read back from Parquet every field is nullable: relabel (no copy) so that
            # the parts concatenate with L0 blocks' batches.
            table = loaded.columns(block).select(names).cast(data.arrow_subset(names))
        deleted = block.deletes.at(ts)
        own = excluded.get(block.block_id) if excluded else None
        table = table.select(names)
        if not deleted and not own:
            parts.append(table.slice(0, visible))
            continue
        keep = BitMap(range(visible))
        keep -= deleted
        if own:
            keep -= own
        if len(keep) == visible:
            parts.append(table.slice(0, visible))
        elif keep:
            indices = pa.array(keep.to_array(), type=pa.uint32())
            parts.append(table.take(indices))
    return parts


def rows_in_key_range(
    data: TableData,
    ts: int,
    blocks: Iterable[PersistedBlock],
    loaded: LoadedBlocks,
    lo: int,
    hi: int,
    excluded: dict[int, BitMap] | None = None,
    columns: list[str] | None = None,
) -> list[pa.Table]:
    """The rows of persisted `blocks` visible at `ts` whose key is in `[lo, hi]`, minus
    `excluded`, one table per block that has any: each block's rows are sorted by key,
    so its keys (`loaded.keys`) give the span by binary search and only that span is
    sliced and masked by the deletes. `loaded` holds the keys and the `columns` of every
    block; the key is one integer column (engine/storage/scan_ranges.py said so)."""
    names = columns if columns is not None else data.arrow_schema.names
    schema = data.arrow_subset(names)
    parts = []
    for block in blocks:
        span = loaded.keys(block).span(lo, hi)
        assert span is not None
        start, stop = span
        if start >= stop:
            continue
        table = loaded.columns(block).select(names)
        deleted = block.deletes.at(ts)
        own = excluded.get(block.block_id) if excluded else None
        if not deleted and not own:
            table = table.slice(start, stop - start)
        else:
            keep = BitMap(range(start, stop))
            keep -= deleted
            if own:
                keep -= own
            if not keep:
                continue
            table = table.take(pa.array(keep.to_array(), type=pa.uint32()))
        # Read back from Parquet every field is nullable: relabel (no copy), as rows_at.
        parts.append(table.cast(schema))
    return parts


def _persisted_run(
    first: PersistedBlock,
    ordered: list[Block],
    index: int,
    ts: int,
    loaded: LoadedBlocks,
    excluded: dict[int, BitMap] | None,
) -> tuple[pa.Table, int, int, int] | None:
    """(object table, first row, rows, next index) for `first` and the blocks after it
    that continue it in its object with nothing deleted at `ts`; None when `first` has
    deletes or its whole object was not loaded."""

    def clean(block: PersistedBlock) -> bool:
        if excluded and block.block_id in excluded:
            return False
        return not block.deletes or block.deletes.at(ts).__len__() == 0

    if not clean(first):
        return None
    found = loaded.object_rows(first)
    if found is None:
        return None
    table, start = found
    rows = first.rows
    last = first
    while index < len(ordered):
        block = ordered[index]
        if (
            not isinstance(block, PersistedBlock)
            or block.object_name != last.object_name
            or block.row_group != last.row_group + 1
            or not clean(block)
        ):
            break
        rows += block.rows
        last = block
        index += 1
    return table, start, rows, index
