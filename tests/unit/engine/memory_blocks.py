"""`MemoryBlocks`: the engine's block store port (engine/maintenance.py `BlockStore`) over a
dict of Arrow tables, for tests of the storage logic without an object store.

A test double of a port (shared/STYLE.md): objects are lists of row groups (Arrow tables with
the hidden `__commit_ts` column), written whole or not at all; `gate` lets a test hold a
rewrite between reading its inputs and writing its outputs, so commits can land meanwhile.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from engine.compaction import Rewrite, WrittenBlock
from engine.objects.bloom import key_hashes
from engine.objects.zonemap import ZoneMap
from engine.schema import Schema
from engine.storage import (
    BlockKeys,
    Bloom,
    PersistedBlock,
    PersistedMeta,
)
from engine.wal.entry import BlockLevel, CreateBlock


class _Pinned:
    def __init__(
        self, owner: MemoryBlocks, blocks: Sequence[PersistedBlock], keys: bool | str
    ) -> None:
        self._owner = owner
        self._tables = {b.block_id: owner.row_group(b.object_name, b.row_group) for b in blocks}
        self._keys: dict[int, BlockKeys] = {}
        if keys:
            for block in blocks:
                schema = owner.schemas[block.object_name]
                table = self._tables[block.block_id]
                self._keys[block.block_id] = BlockKeys(table.select(list(schema.primary_key)))
        owner.loads += 1

    def keys(self, block: PersistedBlock) -> BlockKeys:
        return self._keys[block.block_id]

    def bloom(self, block: PersistedBlock) -> Bloom | None:
        return None

    def columns(self, block: PersistedBlock) -> pa.Table:
        return self._tables[block.block_id]

    def object_rows(self, block: PersistedBlock) -> tuple[pa.Table, int] | None:
        return None  # the double loads blocks one by one

    def release(self) -> None:
        pass


class MemoryBlocks:
    def __init__(self) -> None:
        self.objects: dict[str, list[pa.Table]] = {}
        self.schemas: dict[str, Schema] = {}
        self.discarded: list[str] = []
        self.collected_blocks: list[int] = []
        self.held_blocks: list[int] = []
        self.loads = 0
        self.gate: threading.Event | None = None
        """When set by a test: a rewrite waits on it before writing (bounded, 10 s)."""
        self.writing = threading.Event()
        """Set when a rewrite reached its write (and waits on `gate`, if any)."""
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def row_group(self, name: str, row_group: int) -> pa.Table:
        with self._lock:
            return self.objects[name][row_group]

    def write_rewrite(
        self, table_id: int, level: BlockLevel, schema: Schema, rewrite: Rewrite
    ) -> list[WrittenBlock]:
        self.writing.set()
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        name = f"data/{table_id}/{next(self._ids):06d}-L{int(level)}.parquet"
        groups = []
        start = 0
        for rows in rewrite.block_rows:
            groups.append(rewrite.rows.slice(start, rows).combine_chunks())
            start += rows
        with self._lock:
            self.objects[name] = groups
            self.schemas[name] = schema
        return [
            WrittenBlock(name, index, group.num_rows, self._meta_of(schema, group))
            for index, group in enumerate(groups)
        ]

    @staticmethod
    def _meta_of(schema: Schema, group: pa.Table) -> PersistedMeta:
        first, last = group.slice(0, 1), group.slice(group.num_rows - 1, 1)
        return PersistedMeta(_key(schema, first), _key(schema, last), ZoneMap.build(group))

    def meta(self, cmd: CreateBlock) -> PersistedMeta:
        name = cmd.object_name
        return self._meta_of(self.schemas[name], self.row_group(name, cmd.row_group))

    def load(
        self,
        blocks: Sequence[PersistedBlock],
        *,
        keys: bool | str = False,
        columns: Sequence[str] | None = None,
        whole_objects: bool = False,
        cached_only: bool = False,
    ) -> _Pinned:
        return _Pinned(self, blocks, keys)

    def discard(self, names: Sequence[str]) -> None:
        with self._lock:
            for name in names:
                self.objects.pop(name, None)
                self.discarded.append(name)

    def held(self, table_id: int, block: PersistedBlock) -> None:
        self.held_blocks.append(block.block_id)

    def collected(self, table_id: int, blocks: Sequence[PersistedBlock]) -> None:
        self.collected_blocks.extend(b.block_id for b in blocks)

    def key_hashes(self, block: PersistedBlock) -> np.ndarray:
        schema = self.schemas[block.object_name]
        table = self.row_group(block.object_name, block.row_group)
        return key_hashes([table.column(name) for name in schema.primary_key])


def _key(schema: Schema, row: pa.Table) -> object:
    values = [row.column(name)[0].as_py() for name in schema.primary_key]
    return values[0] if len(values) == 1 else tuple(values)
