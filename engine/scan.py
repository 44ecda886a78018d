"""A transaction's scan of a table (engine/txn.py `TableHandle.scan`): the blocks visible at
its snapshot, pruned by zonemap, minus its own deletes, plus its own inserts and spilled
rows, filtered and projected.

Persisted blocks are read a group of whole objects at a time (`SCAN_GROUP_ROWS`), each group
loaded through the buffer cache, filtered and unpinned before the next, so a table larger
than the cache is scanned through it; a group the cache cannot take next to what other
readers pin is halved.

The key path. A filter that bounds a one-column integer primary key (`id == 5`, `id >= lo
and id < hi`, either `and` anything; engine/storage/pruning.py `key_interval`) goes straight
to the persisted blocks whose key ranges meet the bounds (numpy over every block's key range
and create/drop timestamps, engine/storage/scan_ranges.py; a point also asks each block's
bloom filter), loads only those blocks' keys and scanned columns (not their whole objects),
and slices each block at the span a binary search of its sorted keys finds, masked by its
deletes at the snapshot. When the filter is nothing but those key bounds the slice is the
answer and pyarrow's filter is not run on it. Bounds that meet more rows than one group
take the grouped path over just those blocks. Both paths give the same rows (tests/unit/
engine/test_scan_key_path.py checks them against each other and a model).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

from engine import limits, snapshot_reads
from engine.catalog import TableEntry
from engine.errors import SchemaError
from engine.objects.errors import CacheFull
from engine.schema import normalize_key
from engine.storage import (
    NOTHING_LOADED,
    Block,
    PersistedBlock,
    TableData,
    pruning,
    scan_ranges,
    table_scans,
)
from engine.storage.masks import mask

if TYPE_CHECKING:
    from engine.snapshot_reads import BlockReader
    from engine.workspace import TableWrites


class ScanningTxn(Protocol):
    """What a scan needs of its transaction (engine/txn.py `Transaction`): a port, so that
    this module and txn.py, which calls it, do not import each other."""

    start_ts: int
    busy: asyncio.Lock
    """Held while a part of the scan is made (the transaction's reads and writes take turns)."""

    @property
    def host(self) -> BlockReader:
        """What the transaction runs on: reads its persisted blocks."""
        ...

    def table_writes(self, table_id: int) -> TableWrites | None:
        """The transaction's own writes to the table (merged into the scan)."""
        ...


class ScannedTable(Protocol):
    """A table as a transaction sees it (engine/txn.py `TableHandle`)."""

    entry: TableEntry

    @property
    def qualified(self) -> str:
        """`db.table`, for error messages."""
        ...

    @property
    def txn(self) -> ScanningTxn: ...

    def check(self) -> None:
        """Raise unless its transaction is open and the table is still the one it sees."""
        ...


@dataclass(slots=True)
class ScanCounts:
    """What one scan read: `blocks_visible` persisted blocks at its snapshot, of which
    `blocks_read` survived zonemap pruning and were loaded; `rows_out` rows it produced."""

    blocks_visible: int = 0
    blocks_read: int = 0
    rows_out: int = 0


async def scan(
    txn: ScanningTxn,
    handle: ScannedTable,
    columns: Sequence[str] | None,
    filter: pc.Expression | None,
) -> pa.Table:
    results = [part async for part in scan_parts(txn, handle, columns, filter)]
    return pa.concat_tables(results) if len(results) > 1 else results[0]


async def scan_stream(
    handle: ScannedTable,
    columns: Sequence[str] | None,
    filter: pc.Expression | None,
    counts: ScanCounts | None = None,
) -> AsyncGenerator[pa.Table, None]:
    """`scan`'s rows as they are made, one table per group of persisted blocks and one for
    the rest (SQL reads a table through it, engine/sql.py): memory holds one group, not the
    table. The transaction is busy while each part is made, not between parts, so two
    streams of one snapshot (a self-join) interleave instead of waiting for each other."""
    txn = handle.txn
    parts = scan_parts(txn, handle, columns, filter, counts)
    try:
        while True:
            async with txn.busy:
                try:
                    part = await anext(parts)
                except StopAsyncIteration:
                    return
            yield part
    finally:
        await parts.aclose()


async def scan_parts(
    txn: ScanningTxn,
    handle: ScannedTable,
    columns: Sequence[str] | None,
    filter: pc.Expression | None,
    counts: ScanCounts | None = None,
) -> AsyncGenerator[pa.Table, None]:
    """The scan in parts (at least one), each filtered and projected; `scan` joins them."""
    handle.check()
    entry = handle.entry
    data = entry.data
    if columns is not None:
        if isinstance(columns, str):
            raise SchemaError(f"{handle.qualified}: columns must be a list of names")
        for column in columns:
            if column not in entry.schema.names:
                raise SchemaError(f"{handle.qualified}: unknown column {column!r}")
    if filter is not None and not isinstance(filter, pc.Expression):
        raise SchemaError(f"{handle.qualified}: filter must be a pyarrow.compute.Expression")
    writes = txn.table_writes(entry.table_id)
    excluded = writes.deleted_by_block if writes else None
    node = pruning.parse(filter) if filter is not None else None
    read = _columns_to_read(data.arrow_schema, columns, filter, node)
    counts = counts if counts is not None else ScanCounts()
    checked = False
    """Whether the filter has been run once (so it binds): an empty part after that needs
    no filter run of its own (pyarrow's costs ~0.1 ms even on no rows)."""

    def finish(parts: list[pa.Table], *, exact: bool = False) -> pa.Table:
        """Parts of the scan (each with the `read` columns), filtered and projected; `exact`:
        the parts hold only matching rows already (the key path's exact bounds)."""
        nonlocal checked
        if not parts:
            table = data.arrow_schema.empty_table().select(read)
        else:
            table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        out = list(columns) if columns is not None else read
        keep = mask(node, table) if node is not None and not exact and table.num_rows else None
        if keep is not None:
            # Kernels with typed scalars, not an Acero plan (engine/storage/masks.py); only
            # the columns asked for are filtered.
            table = table.select(out).filter(keep)
            checked = True  # (numeric columns compared with numbers: the filter binds)
        elif filter is not None and not exact and (table.num_rows or not checked):
            try:
                table = table.filter(filter)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(f"{handle.qualified}: bad filter: {exc}") from None
            checked = True
        table = table.select(out)
        counts.rows_out += table.num_rows
        return table

    if entry.create_ts != 0:
        keyed = _key_range(data, node, txn.start_ts)
        if keyed is not None:
            interval, persisted, visible_count = keyed
            # The bounds are comparisons of the integer key with numbers: the filter binds.
            checked = checked or interval.exact
            counts.blocks_visible += visible_count
            counts.blocks_read += len(persisted)
            if sum(b.rows for b in persisted) <= limits.SCAN_GROUP_ROWS:
                parts = await _scan_key_blocks(txn, data, persisted, read, excluded, interval)
                if parts:
                    yield finish(parts, exact=interval.exact)
            else:
                for group in _scan_groups(persisted):
                    for part in await _scan_group(txn, data, group, read, excluded, finish):
                        yield part
            in_memory: list[Block] = list(scan_ranges.memory_blocks(data, txn.start_ts))
        else:
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
        parts = table_scans.rows_at(
            data, txn.start_ts, in_memory, NOTHING_LOADED, excluded, columns=read
        )
    else:
        parts = []
    if writes is not None and writes.spills:
        parts.extend(t.select(read) for t in await _spilled_parts(txn, entry, writes, columns))
    own = writes.live_inserts() if writes is not None else None
    if own is not None:
        parts.append(pa.Table.from_batches([own]).select(read))
    yield finish(parts)


def _key_range(
    data: TableData, node: pruning.Node | None, ts: int
) -> tuple[pruning.KeyInterval, list[PersistedBlock], int] | None:
    """For the key path (module docstring): the bounds `node` puts on the table's one-column
    integer key, the persisted blocks visible at `ts` that may hold a key within them (a
    point also asks each block's bloom filter, when the block holds it), and how many
    persisted blocks `ts` sees; None when the scan takes the grouped path."""
    if node is None or not data.persisted_held:
        return None
    key = _integer_key(data)
    if key is None:
        return None
    interval = pruning.key_interval(node, key)
    if interval is None:
        return None
    found = scan_ranges.key_range_blocks(data, interval.lo, interval.hi, ts)
    if found is None:
        return None
    blocks, visible_count = found
    if interval.lo == interval.hi:
        point = interval.lo
        blocks = [b for b in blocks if b.bloom is None or b.bloom.might_contain(point)]
    return interval, blocks, visible_count


_KEY_TYPES = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32())
"""Key types whose every value is an int64 (uint64's are not: no key path for them)."""


def key_rows_bound(handle: ScannedTable, filter: pc.Expression) -> int | None:
    """For SQL's direct path (engine/sql_direct.py): how many persisted rows a scan of
    `handle` with `filter` loads through the key path (whole blocks, before slicing; 0 when
    the table has no persisted block); None when it would not take the key path. Bounds, not
    counts: it reads nothing."""
    data = handle.entry.data
    if handle.entry.create_ts == 0 or not data.persisted_held:
        return 0
    keyed = _key_range(data, pruning.parse(filter), handle.txn.start_ts)
    if keyed is None:
        return None
    return sum(b.rows for b in keyed[1])


async def key_point(handle: ScannedTable, key: int, columns: Sequence[str]) -> pa.Table | None:
    """The row of the integer key `key` visible to the handle's transaction, found as `get`
    finds it (the table's key index and blooms, one block's keys), as a table of `columns`
    (no row: empty); None when the transaction has written to the table itself (the scan
    merges its own rows). For SQL's direct path: a point through the key index costs a
    fraction of a key-path scan (no block ranges, no filter, no part to finish)."""
    txn = handle.txn
    async with txn.busy:
        handle.check()
        entry = handle.entry
        if txn.table_writes(entry.table_id) is not None:
            return None
        normalized = normalize_key(entry.schema, key, handle.qualified)
        (version,) = await snapshot_reads.versions_at(txn.host, entry, [normalized], txn.start_ts)
        rows = await snapshot_reads.rows_at(
            txn.host, entry, [version] if version is not None else []
        )
    return rows.select(list(columns))


def integer_key(handle: ScannedTable) -> str | None:
    """The table's primary key column when it is one integer column the key path serves."""
    return _integer_key(handle.entry.data)


def _integer_key(data: TableData) -> str | None:
    primary_key = data.schema.primary_key
    if len(primary_key) != 1:
        return None
    name = primary_key[0]
    return name if data.arrow_schema.field(name).type in _KEY_TYPES else None


async def _scan_key_blocks(
    txn: ScanningTxn,
    data: TableData,
    blocks: list[PersistedBlock],
    read: list[str],
    excluded: dict[int, BitMap] | None,
    interval: pruning.KeyInterval,
) -> list[pa.Table]:
    """The key path's read of `blocks` (at most a group's rows): their keys and `read`
    columns loaded, each block sliced at its keys in the interval; halved while the buffer
    cache cannot hold them next to what other readers pin."""
    if not blocks:
        return []
    try:
        async with txn.host.loaded(blocks, keys=True, columns=read) as loaded:
            return table_scans.rows_in_key_range(
                data, txn.start_ts, blocks, loaded, interval.lo, interval.hi, excluded, columns=read
            )
    except CacheFull:
        if len(blocks) == 1:
            raise
        half = len(blocks) // 2
        first = await _scan_key_blocks(txn, data, blocks[:half], read, excluded, interval)
        return first + await _scan_key_blocks(txn, data, blocks[half:], read, excluded, interval)


async def _scan_group(
    txn: ScanningTxn,
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
        async with txn.host.loaded(group, columns=read, whole_objects=True) as loaded:
            return [
                finish(
                    table_scans.rows_at(data, txn.start_ts, group, loaded, excluded, columns=read)
                )
            ]
    except CacheFull:
        halves = _split_by_object(group)
        if halves is None:
            raise
        out = []
        for half in halves:
            out.extend(await _scan_group(txn, data, half, read, excluded, finish))
        return out


async def _spilled_parts(
    txn: ScanningTxn, entry: TableEntry, writes: TableWrites, columns: Sequence[str] | None
) -> list[pa.Table]:
    """The transaction's spilled rows still live in it, as tables of the scanned columns
    (all of them here: the filter runs on the whole scan afterwards)."""
    names = entry.schema.names
    schema = entry.data.arrow_schema
    out = []
    for spilled in writes.spills:
        blocks = spilled.placeholders
        async with txn.host.loaded(blocks, columns=names) as loaded:
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
    schema: pa.Schema,
    columns: Sequence[str] | None,
    filter: pc.Expression | None,
    node: pruning.Node | None = None,
) -> list[str]:
    """The columns a scan loads from persisted blocks: those asked for, plus those its filter
    needs. A filter the pruner parsed (`node`) names its columns; pyarrow does not list an
    expression's fields, so any other filter's are found by binding it to empty tables:
    every column not asked for is dropped unless the filter no longer binds without it (a
    filter on `customer` selecting `amount` must not read a wide `note` column). A filter
    that binds to nothing reads every column (and fails on the data)."""
    if columns is None:
        return list(schema.names)
    asked = set(columns)
    wanted = [name for name in schema.names if name in asked] or schema.names[:1]
    if filter is None:
        return wanted  # (at least one column: a table of none cannot count its rows)
    if node is not None:
        named = pruning.columns_of(node)
        if named <= set(schema.names):
            return [name for name in schema.names if name in asked or name in named]
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
