"""A transaction's scan of a table (`TableHandle.scan`): the blocks visible at its snapshot,
pruned by zonemap, minus its own deletes, plus its own inserts and spilled rows, filtered
and projected.

Persisted blocks are read a group of whole objects at a time (`SCAN_GROUP_ROWS`), each group
loaded through the buffer cache, filtered and unpinned before the next, so a table larger
than the cache is scanned through it; a group the cache cannot take next to what other
readers pin is halved.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

from engine import limits
from engine.catalog import TableEntry
from engine.errors import SchemaError
from engine.objects.errors import CacheFull
from engine.storage import NOTHING_LOADED, PersistedBlock, TableData

if TYPE_CHECKING:
    from engine.txn import TableHandle, Transaction, _TableWrites


@dataclass(slots=True)
class ScanCounts:
    """What one scan read: `blocks_visible` persisted blocks at its snapshot, of which
    `blocks_read` survived zonemap pruning and were loaded; `rows_out` rows it produced."""

    blocks_visible: int = 0
    blocks_read: int = 0
    rows_out: int = 0


async def scan(
    txn: Transaction,
    handle: TableHandle,
    columns: Sequence[str] | None,
    filter: pc.Expression | None,
) -> pa.Table:
    results = [part async for part in scan_parts(txn, handle, columns, filter)]
    return pa.concat_tables(results) if len(results) > 1 else results[0]


async def scan_stream(
    handle: TableHandle,
    columns: Sequence[str] | None,
    filter: pc.Expression | None,
    counts: ScanCounts | None = None,
) -> AsyncIterator[pa.Table]:
    """`scan`'s rows as they are made, one table per group of persisted blocks and one for
    the rest (SQL reads a table through it, engine/sql.py): memory holds one group, not the
    table. The transaction is busy while each part is made, not between parts, so two
    streams of one snapshot (a self-join) interleave instead of waiting for each other."""
    txn = handle._txn
    parts = scan_parts(txn, handle, columns, filter, counts)
    try:
        while True:
            async with txn._busy:
                try:
                    part = await anext(parts)
                except StopAsyncIteration:
                    return
            yield part
    finally:
        await parts.aclose()


async def scan_parts(
    txn: Transaction,
    handle: TableHandle,
    columns: Sequence[str] | None,
    filter: pc.Expression | None,
    counts: ScanCounts | None = None,
) -> AsyncGenerator[pa.Table, None]:
    """The scan in parts (at least one), each filtered and projected; `scan` joins them."""
    txn._check_open()
    txn._check_handle(handle)
    entry = handle._entry
    data = entry.data
    if columns is not None:
        if isinstance(columns, str):
            raise SchemaError(f"{handle.qualified}: columns must be a list of names")
        for column in columns:
            if column not in entry.schema.names:
                raise SchemaError(f"{handle.qualified}: unknown column {column!r}")
    if filter is not None and not isinstance(filter, pc.Expression):
        raise SchemaError(f"{handle.qualified}: filter must be a pyarrow.compute.Expression")
    writes = txn._writes.get(entry.table_id)
    excluded = writes.deleted_by_block if writes else None
    read = _columns_to_read(data.arrow_schema, columns, filter)
    counts = counts if counts is not None else ScanCounts()

    def finish(parts: list[pa.Table]) -> pa.Table:
        """Parts of the scan (each with the `read` columns), filtered and projected."""
        table = pa.concat_tables(parts) if parts else data.arrow_schema.empty_table()
        if filter is not None:
            try:
                table = table.filter(filter)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(f"{handle.qualified}: bad filter: {exc}") from None
        table = table.select(list(columns) if columns is not None else read)
        counts.rows_out += table.num_rows
        return table

    if entry.create_ts != 0:
        blocks = data.scan_blocks(txn.start_ts)
        persisted = [b for b in blocks if isinstance(b, PersistedBlock)]
        counts.blocks_visible += len(persisted)
        if persisted and filter is not None:
            # Zonemaps: skip the persisted blocks the filter cannot match.
            persisted = data.prune(persisted, filter)
        counts.blocks_read += len(persisted)
        # Persisted blocks in groups, each loaded, filtered and unpinned before the next:
        # a table larger than the buffer cache is scanned through it.
        for group in _scan_groups(persisted):
            for part in await _scan_group(txn, data, group, read, excluded, finish):
                yield part
        in_memory = [b for b in blocks if not isinstance(b, PersistedBlock)]
        parts = data.scan_at(txn.start_ts, in_memory, NOTHING_LOADED, excluded, columns=read)
    else:
        parts = []
    if writes is not None and writes.spills:
        parts.extend(t.select(read) for t in await _spilled_parts(txn, entry, writes, columns))
    own = writes.live_inserts() if writes is not None else None
    if own is not None:
        parts.append(pa.Table.from_batches([own]).select(read))
    yield finish(parts)


async def _scan_group(
    txn: Transaction,
    data: TableData,
    group: list[PersistedBlock],
    read: list[str],
    excluded: dict[int, BitMap] | None,
    finish: Callable[[list[pa.Table]], pa.Table],
) -> list[pa.Table]:
    """One group of a scan's persisted blocks, finished; halved while the buffer cache
    cannot hold it next to what other readers pin (one object that does not fit alone
    is `CacheFull`)."""
    try:
        async with txn._engine._loaded(group, columns=read, whole_objects=True) as loaded:
            return [finish(data.scan_at(txn.start_ts, group, loaded, excluded, columns=read))]
    except CacheFull:
        halves = _split_by_object(group)
        if halves is None:
            raise
        out = []
        for half in halves:
            out.extend(await _scan_group(txn, data, half, read, excluded, finish))
        return out


async def _spilled_parts(
    txn: Transaction, entry: TableEntry, writes: _TableWrites, columns: Sequence[str] | None
) -> list[pa.Table]:
    """The transaction's spilled rows still live in it, as tables of the scanned columns
    (all of them here: the filter runs on the whole scan afterwards)."""
    names = entry.schema.names
    schema = entry.data.arrow_schema
    out = []
    for spilled in writes.spills:
        blocks = spilled.placeholders
        async with txn._engine._loaded(blocks, columns=names) as loaded:
            for index, block in enumerate(blocks):
                table = loaded.columns(block).select(names).cast(schema)
                start = spilled.starts[index]
                dead = [p - start for p in spilled.deleted if start <= p < start + block.rows]
                if dead:
                    keep = BitMap(range(block.rows))
                    keep -= BitMap(dead)
                    table = table.take(pa.array(keep.to_array(), type=pa.uint32()))
                out.append(table)
    return out


def _scan_groups(blocks: list[PersistedBlock]) -> list[list[PersistedBlock]]:
    """`blocks` (in id order) in groups of whole objects of about `SCAN_GROUP_ROWS` rows."""
    groups: list[list[PersistedBlock]] = []
    group: list[PersistedBlock] = []
    rows = 0
    for block in blocks:
        if group and rows >= limits.SCAN_GROUP_ROWS and block.object_name != group[-1].object_name:
            groups.append(group)
            group, rows = [], 0
        group.append(block)
        rows += block.rows
    if group:
        groups.append(group)
    return groups


def _split_by_object(
    group: list[PersistedBlock],
) -> tuple[list[PersistedBlock], list[PersistedBlock]] | None:
    """`group` in two halves of whole objects, or None if it holds one object."""
    names = list(dict.fromkeys(b.object_name for b in group))
    if len(names) < 2:
        return None
    first = set(names[: len(names) // 2])
    return [b for b in group if b.object_name in first], [
        b for b in group if b.object_name not in first
    ]


def _columns_to_read(
    schema: pa.Schema, columns: Sequence[str] | None, filter: pc.Expression | None
) -> list[str]:
    """The columns a scan loads from persisted blocks: those asked for, plus those its filter
    needs. pyarrow does not list an expression's fields, so they are found by binding it to
    empty tables: every column not asked for is dropped unless the filter no longer binds
    without it (a filter on `customer` selecting `amount` must not read a wide `note`
    column). A filter that binds to nothing reads every column (and fails on the data)."""
    if columns is None:
        return list(schema.names)
    asked = set(columns)
    wanted = [name for name in schema.names if name in asked] or schema.names[:1]
    if filter is None:
        return wanted  # (at least one column: a table of none cannot count its rows)
    empty = schema.empty_table()

    def binds(names: list[str]) -> bool:
        try:
            empty.select(names).filter(filter)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, KeyError):
            return False
        return True

    if binds(wanted):
        return wanted
    needed = list(schema.names)
    if not binds(needed):
        return needed
    for name in schema.names:
        if name in wanted:
            continue
        without = [n for n in needed if n != name]
        if binds(without):
            needed = without
    return needed
