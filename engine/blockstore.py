"""The engine's persisted blocks over an object store: writing rewrite outputs, loading keys,
blooms and columns through the buffer cache, and deleting objects nothing refers to.

Why here (shared/STYLE.md "I/O at the edges"): the table code (engine/storage) is pure and the
maintenance loop only plans; this shell is the one place that turns a block into reads of an
object (engine/objects: Parquet block objects, the bounded cache). Every method blocks and is
thread-safe: the engine calls it from worker threads (`asyncio.to_thread`).

Cache entries, all bounded together by the cache's bytes (issue 14 "Buffer manager"):

* ("meta", object): the object's footer metadata (key ranges, zonemaps, blooms of its blocks);
* ("keys", object, row group): a block's sorted keys (`BlockKeys`, for binary search);
* ("col", object, row group, column): one column of a block, so a scan loads only the
  columns it reads.

Objects are immutable and named by a random id, so a cache entry never goes stale; an object
is deleted only when no held block and no retained checkpoint refers to it (`ObjectRefs`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import uuid
from collections.abc import Hashable, Sequence
from typing import Any

import pyarrow as pa

from engine.compaction import COMMIT_TS_COLUMN, Rewrite, WrittenBlock
from engine.objects import blockfile
from engine.objects.blockfile import BlockObjectMeta
from engine.objects.bloom import BloomFilter, U64Array, key_hashes
from engine.objects.cache import BufferCache, CacheStats, Pin
from engine.objects.errors import ObjectNotFound
from engine.objects.store import LocalDirStore, ObjectStore
from engine.schema import Schema
from engine.storage import BlockKeys, PersistedBlock, PersistedMeta
from engine.wal.entry import BlockLevel, CreateBlock

DATA_PREFIX = "data/"
"""Block objects: data/<table_id>/<random id>.parquet."""


class ObjectRefs:
    """Which owners refer to each object; an object with none left is garbage. Owners are
    held persisted blocks `("block", table_id, block_id)` (several blocks share an L2
    object) and retained checkpoints `("ckp", ckp_ts)`. A pure class: callers delete."""

    def __init__(self) -> None:
        self._owners: dict[str, set[Hashable]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._owners

    def __len__(self) -> int:
        return len(self._owners)

    def add(self, name: str, owner: Hashable) -> None:
        self._owners.setdefault(name, set()).add(owner)

    def drop(self, name: str, owner: Hashable) -> bool:
        """Forget one owner; True when `name` has none left (it is garbage now)."""
        owners = self._owners.get(name)
        if owners is None:
            return False
        owners.discard(owner)
        if owners:
            return False
        del self._owners[name]
        return True

    def names(self) -> set[str]:
        return set(self._owners)


class _Pinned:
    """What one read loaded, pinned until `release()`. Its fields are filled by
    `ObjectBlockStore.load` (this module's own helper, hence not underscored); readers use
    the methods, by block."""

    __slots__ = ("_released", "blooms_of", "columns_of", "keys_of", "objects_of", "pins")

    def __init__(self) -> None:
        self.pins: list[Pin[Any, Any]] = []
        self.keys_of: dict[int, BlockKeys] = {}
        self.blooms_of: dict[int, BloomFilter] = {}
        self.columns_of: dict[int, pa.Table] = {}
        self.objects_of: dict[int, tuple[pa.Table, int]] = {}
        self._released = False

    def keys(self, block: PersistedBlock) -> BlockKeys:
        return self.keys_of[block.block_id]

    def bloom(self, block: PersistedBlock) -> BloomFilter | None:
        return self.blooms_of.get(block.block_id)

    def columns(self, block: PersistedBlock) -> pa.Table:
        found = self.columns_of.get(block.block_id)
        if found is None:
            table, start = self.objects_of[block.block_id]
            found = table.slice(start, block.rows)
        return found

    def object_rows(self, block: PersistedBlock) -> tuple[pa.Table, int] | None:
        """The loaded columns of the block's whole object and the block's first row in it
        (scans read whole objects, so the blocks of a segment come back as one run)."""
        return self.objects_of.get(block.block_id)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        for pin in self.pins:
            pin.release()
        self.pins.clear()


class ObjectBlockStore:
    def __init__(self, store: ObjectStore, cache_bytes: int) -> None:
        self.store = store
        self.cache: BufferCache[Hashable, Any] = BufferCache(cache_bytes)
        self.refs = ObjectRefs()
        self._pending: list[tuple[int, str]] = []
        """(drop_ts of its last block, object): garbage once a checkpoint covers the drop."""
        self._dropped_ts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.objects_written = 0
        self.objects_deleted = 0

    def writable(self) -> bool:
        """A standby promoted: reopen a read-only directory store for writing (it takes the
        directory's lock, which the dead writer's process released). True when a store was
        opened here: the engine owns it from now on and closes it."""
        if isinstance(self.store, LocalDirStore) and self.store.read_only:
            self.store = LocalDirStore(self.store.root)
            return True
        return False

    def close(self) -> None:
        """Close the object store if it has anything to close (a directory's lock)."""
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    # --- writing -------------------------------------------------------------------------------

    def write_rewrite(
        self, table_id: int, level: BlockLevel, schema: Schema, rewrite: Rewrite
    ) -> list[WrittenBlock]:
        name = f"{DATA_PREFIX}{table_id}/{uuid.uuid4().hex}.parquet"
        data = rewrite.rows.cast(blockfile.object_schema(schema))
        meta = blockfile.write_object(
            self.store, name, schema=schema, table_id=table_id, level=int(level), data=data
        )
        self.objects_written += 1
        self._seed_meta(meta)
        # The key hashes for the table's key index (issue 21): computed here, in the worker
        # thread, from the rows just written, so the commit only adds them.
        hashes = key_hashes([rewrite.rows.column(name) for name in schema.primary_key])
        out = []
        start = 0
        for index, block in enumerate(meta.blocks):
            persisted = _persisted_meta(meta, index)
            end = start + block.row_count
            persisted = dataclasses.replace(persisted, key_hashes=hashes[start:end])
            out.append(WrittenBlock(name, index, block.row_count, persisted))
            start = end
        assert start == len(hashes)
        return out

    def _seed_meta(self, meta: BlockObjectMeta) -> None:
        """The footer just written is the one a read would parse: cache it."""
        with contextlib.suppress(Exception):  # a full cache: the next read parses the footer
            self.cache.pin(("meta", meta.name), lambda: (meta, _meta_bytes(meta))).release()

    def discard(self, names: Sequence[str]) -> None:
        for name in names:
            self._delete(name)

    # --- metadata and loading --------------------------------------------------------------------

    def object_meta(self, name: str) -> BlockObjectMeta:
        pin = self._pin_meta(name)
        try:
            meta: BlockObjectMeta = pin.value
            return meta
        finally:
            pin.release()

    def _pin_meta(self, name: str) -> Pin[Any, Any]:
        return self.cache.pin(("meta", name), functools.partial(_load_meta, self.store, name))

    def meta(self, cmd: CreateBlock) -> PersistedMeta:
        meta = self.object_meta(cmd.object_name)
        return _persisted_meta(meta, cmd.row_group)

    def key_hashes(self, block: PersistedBlock) -> U64Array:
        """The `key_hash` of each key of `block`, read from its object (not through the
        cache: indexing every block after an open would only evict what reads want)."""
        keys = blockfile.read_keys(self.store, block.object_name, block.row_group)
        return key_hashes(keys.columns)

    def load(
        self,
        blocks: Sequence[PersistedBlock],
        *,
        keys: bool | str = False,
        columns: Sequence[str] | None = None,
        whole_objects: bool = False,
        cached_only: bool = False,
    ) -> _Pinned | None:
        """What a read needs of `blocks` (engine/storage/loader.py). `keys="blooms"` loads the
        bloom filters only. `cached_only`: pin what the cache holds and load nothing; None
        when something is missing (the event loop tries this before a worker thread)."""
        pinned = _Pinned()

        def pin(key: Hashable, load: Any) -> Pin[Any, Any] | None:
            found = self.cache.peek(key) if cached_only else self.cache.pin(key, load)
            if found is not None:
                pinned.pins.append(found)
            return found

        try:
            if whole_objects and columns is not None:
                if not self._load_objects(pinned, blocks, columns, pin):
                    pinned.release()
                    return None
                columns = None
            for block in blocks:
                name, group = block.object_name, block.row_group
                if keys:
                    meta_pin = pin(("meta", name), functools.partial(_load_meta, self.store, name))
                    if meta_pin is None:
                        pinned.release()
                        return None
                    pinned.blooms_of[block.block_id] = meta_pin.value.blocks[group].bloom
                if keys is True:
                    load_keys = functools.partial(_load_keys, self.store, name, group)
                    keys_pin = pin(("keys", name, group), load_keys)
                    if keys_pin is None:
                        pinned.release()
                        return None
                    pinned.keys_of[block.block_id] = keys_pin.value
                if columns is not None:
                    arrays = []
                    for column in columns:
                        column_pin = pin(
                            ("col", name, group, column),
                            functools.partial(_load_column, self.store, name, group, column),
                        )
                        if column_pin is None:
                            pinned.release()
                            return None
                        arrays.append(column_pin.value)
                    pinned.columns_of[block.block_id] = pa.table(arrays, names=list(columns))
        except BaseException:
            pinned.release()
            raise
        return pinned

    def _load_objects(
        self,
        pinned: _Pinned,
        blocks: Sequence[PersistedBlock],
        columns: Sequence[str],
        pin: Any,
    ) -> bool:
        """`columns` of every object the blocks live in, each column of each object one
        cache entry (a scan over a segment touches one entry per column, not one per block
        and column). False when `pin` found something missing (cached_only)."""
        tables: dict[str, tuple[pa.Table, list[int]]] = {}
        for block in blocks:
            name = block.object_name
            found = tables.get(name)
            if found is None:
                meta_pin = pin(("meta", name), functools.partial(_load_meta, self.store, name))
                if meta_pin is None:
                    return False
                starts = [0]
                for part in meta_pin.value.blocks:
                    starts.append(starts[-1] + part.row_count)
                arrays = []
                for column in columns:
                    column_pin = pin(
                        ("ocol", name, column),
                        functools.partial(_load_object_column, self.store, name, column),
                    )
                    if column_pin is None:
                        return False
                    arrays.append(column_pin.value)
                found = (pa.table(arrays, names=list(columns)), starts)
                tables[name] = found
            pinned.objects_of[block.block_id] = (found[0], found[1][block.row_group])
        return True

    # --- garbage -------------------------------------------------------------------------------

    def pending_names(self) -> set[str]:
        """Objects whose blocks were all dropped, waiting for a checkpoint to cover the drop:
        not garbage yet (a restart may replay their creation)."""
        with self._lock:
            return {name for _dropped, name in self._pending}

    def forget_refs(self) -> None:
        """A standby's state was replaced by a checkpoint's (engine/standby.py): what the old
        state held, and what it was waiting to delete, no longer counts."""
        with self._lock:
            self.refs = ObjectRefs()
            self._pending = []

    def held(self, table_id: int, block: PersistedBlock) -> None:
        """A block the engine's state now holds (created by a commit, or loaded at open)."""
        with self._lock:
            self.refs.add(block.object_name, ("block", table_id, block.block_id))

    def collected(self, table_id: int, blocks: Sequence[PersistedBlock]) -> None:
        """Blocks no reader sees any more. An object none of whose blocks is held is not
        deleted yet: a restart replays the WAL after the newest checkpoint, and if the
        CreateBlock of one of its blocks is in that tail, the replay reads its footer. So it
        waits until a checkpoint covers the drop of its last block (`covered`)."""
        with self._lock:
            for block in blocks:
                name = block.object_name
                dropped = max(self._dropped_ts.get(name, 0), block.drop_ts)
                if self.refs.drop(name, ("block", table_id, block.block_id)):
                    self._dropped_ts.pop(name, None)
                    self._pending.append((dropped, name))
                else:
                    self._dropped_ts[name] = dropped

    def keep_until_covered(self, names: Sequence[str], dropped_ts: int) -> None:
        """Objects nothing holds that a kept WAL entry below the restored checkpoint (at
        `dropped_ts`) may create: kept, not deleted as orphans, until the history window's
        anchor covers `dropped_ts` (decision 0010)."""
        with self._lock:
            pending = {name for _dropped, name in self._pending}
            for name in names:
                if name in self.refs or name in self._dropped_ts or name in pending:
                    continue
                pending.add(name)
                self._pending.append((dropped_ts, name))

    def covered(self, ckp_ts: int) -> int:
        """The oldest checkpoint the WAL is kept from (the newest one without a history
        window; the window's anchor with one, decision 0010) is at `ckp_ts`: objects whose
        blocks were all dropped at or before it, and that no retained checkpoint names, are
        deleted. Returns how many."""
        with self._lock:
            due = [name for dropped, name in self._pending if dropped <= ckp_ts]
            self._pending = [(d, n) for d, n in self._pending if d > ckp_ts]
            due = [name for name in due if name not in self.refs]
        for name in due:
            self._delete(name)
        return len(due)

    @property
    def pending_garbage(self) -> int:
        return len(self._pending)

    def _delete(self, name: str) -> None:
        with contextlib.suppress(ObjectNotFound):
            self.store.delete(name)
        self.objects_deleted += 1

    def cache_stats(self) -> CacheStats:
        return self.cache.stats()


def _persisted_meta(meta: BlockObjectMeta, row_group: int) -> PersistedMeta:
    block = meta.blocks[row_group]
    return PersistedMeta(block.key_min, block.key_max, block.zonemap, block.bloom)


def _meta_bytes(meta: BlockObjectMeta) -> int:
    return len(meta.to_bytes()) + 256


def _load_meta(store: ObjectStore, name: str) -> tuple[BlockObjectMeta, int]:
    meta = blockfile.read_meta(store, name)
    return meta, _meta_bytes(meta)


def _load_keys(store: ObjectStore, name: str, group: int) -> tuple[BlockKeys, int]:
    keys = BlockKeys(blockfile.read_keys(store, name, group))
    return keys, keys.byte_size()


def _load_object_column(store: ObjectStore, name: str, column: str) -> tuple[Any, int]:
    with blockfile.BlockObjectReader(store, name) as reader:
        parts = [
            reader.read_block(index, [column]).column(0) for index in range(len(reader.meta.blocks))
        ]
    # One chunk per object, not one per block: a scan's filter, its slices and the batches
    # handed to DuckDB each pay per chunk (a million rows were 128 chunks).
    array = pa.chunked_array(
        [
            pa.chunked_array(
                [c for part in parts for c in part.chunks], parts[0].type
            ).combine_chunks()
        ]
    )
    return array, array.nbytes


def _load_column(store: ObjectStore, name: str, group: int, column: str) -> tuple[Any, int]:
    table = blockfile.read_block(store, name, group, [column])
    array = table.column(0)
    return array, array.nbytes


__all__ = ["COMMIT_TS_COLUMN", "DATA_PREFIX", "ObjectBlockStore", "ObjectRefs"]
