"""Reads of a transaction's snapshot: the version of each key, and rows by version.

Why apart from engine/txn.py: these read the committed table data at a timestamp and never
the workspace; a transaction (or anything holding a `BlockReader`) calls them with its
snapshot's `start_ts`. Persisted blocks are loaded through the reader (a worker thread on a
cache miss, engine/load_scope.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from engine.catalog import TableEntry
from engine.load_scope import LoadScope
from engine.objects.bloom import key_hash
from engine.schema import Key
from engine.spill import Spill
from engine.storage import NOTHING_LOADED, PersistedBlock, RowVersion


class BlockReader(Protocol):
    """What reading persisted blocks needs of the engine (or a compute node, or a
    historical state): `engine/txn.py` `TxnHost` extends it."""

    def loaded(
        self,
        blocks: Sequence[PersistedBlock],
        *,
        keys: bool | str = False,
        columns: Sequence[str] | None = None,
        whole_objects: bool = False,
    ) -> LoadScope:
        """What a read needs of persisted blocks, pinned for an `async with`."""
        ...


async def versions_at(
    reader: BlockReader, entry: TableEntry, keys: Sequence[Key], start_ts: int
) -> list[RowVersion | None]:
    """The version of each key visible at the snapshot (None when not live). Persisted
    blocks that may hold a key are loaded first (keys and blooms, in a worker thread)."""
    if entry.create_ts == 0 or not keys:  # created in this transaction: nothing committed
        return [None] * len(keys)
    data = entry.data
    if not data.persisted_held:
        return [data.version_at(key, start_ts, NOTHING_LOADED) for key in keys]
    # Blocks the table's key index names for a key (and unindexed blocks whose key
    # range holds it); then only those whose bloom filter may hold it have their sorted
    # keys loaded (most inserted keys are new: no candidate at all).
    per_key = data.key_candidates_many(keys, start_ts)
    if not any(per_key):
        return [data.version_among(key, start_ts, [], NOTHING_LOADED) for key in keys]
    # One hash per key asks every candidate's filter.
    hashes = [key_hash(key) if found else 0 for key, found in zip(keys, per_key, strict=True)]
    if all(b.bloom is not None for found in per_key for b in found):
        maybe = [
            [b for b in found if b.bloom is not None and b.bloom.might_contain_hash(hashed)]
            for hashed, found in zip(hashes, per_key, strict=True)
        ]
    else:  # blocks whose bloom filter is read from their object
        candidates = {b.block_id: b for found in per_key for b in found}
        async with reader.loaded(list(candidates.values()), keys="blooms") as blooms:
            maybe = [
                [b for b in found if (f := blooms.bloom(b)) is None or f.might_contain_hash(hashed)]
                for hashed, found in zip(hashes, per_key, strict=True)
            ]
    wanted = {b.block_id: b for found in maybe for b in found}
    if not wanted:
        return [data.version_among(key, start_ts, [], NOTHING_LOADED) for key in keys]
    async with reader.loaded(list(wanted.values()), keys=True) as loaded:
        return [
            data.version_among(key, start_ts, found, loaded)
            for key, found in zip(keys, maybe, strict=True)
        ]


async def spilled_row(
    reader: BlockReader, entry: TableEntry, spilled: Spill, position: int
) -> dict[str, Any]:
    """The row a transaction inserted and spilled, at `position` of `spilled`."""
    index, offset = spilled.place(position)
    block = spilled.placeholders[index]
    async with reader.loaded([block], columns=entry.schema.names) as loaded:
        rows: list[dict[str, Any]] = (
            loaded.columns(block).select(entry.schema.names).slice(offset, 1).to_pylist()
        )
    return rows[0]


async def row_at(reader: BlockReader, entry: TableEntry, version: RowVersion) -> dict[str, Any]:
    """The row at `version`, as a dict of the table's columns."""
    block = entry.data.blocks[version.block_id]
    blocks = [block] if isinstance(block, PersistedBlock) else []
    async with reader.loaded(blocks, columns=entry.schema.names) as loaded:
        return entry.data.row(version, loaded)


async def rows_at(reader: BlockReader, entry: TableEntry, versions: list[RowVersion]) -> pa.Table:
    """The rows at `versions` (of the snapshot), in that order, as one Arrow table of
    the table's columns: one take per block, never a dict per row."""
    data = entry.data
    names = data.arrow_schema.names
    if not versions:
        return data.arrow_schema.empty_table()
    by_block: dict[int, list[int]] = {}
    order: dict[int, list[int]] = {}
    for at, version in enumerate(versions):
        by_block.setdefault(version.block_id, []).append(version.offset)
        order.setdefault(version.block_id, []).append(at)
    persisted = [
        block for block_id in by_block if isinstance(block := data.blocks[block_id], PersistedBlock)
    ]
    parts: list[pa.Table] = []
    positions: list[int] = []
    async with reader.loaded(persisted, columns=names) as loaded:
        for block_id, offsets in by_block.items():
            block = data.blocks[block_id]
            if isinstance(block, PersistedBlock):
                columns = loaded.columns(block).select(names)
            else:
                columns = block.table().select(names)
            taken = columns.take(pa.array(offsets, type=pa.int64()))
            parts.append(taken.cast(data.arrow_schema))
            positions.extend(order[block_id])
    rows = pa.concat_tables(parts)
    back = np.empty(len(positions), dtype=np.int64)
    back[np.array(positions, dtype=np.int64)] = np.arange(len(positions), dtype=np.int64)
    return rows.take(pa.array(back)).combine_chunks()
