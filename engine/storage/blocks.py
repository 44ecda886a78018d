"""A table's blocks (decision 0006): transient L0 blocks in memory, and persisted L1/L2 blocks
whose rows live in objects.

Every block has an id unique in its table for the engine's life, `create_ts` and `drop_ts`
(MVCC on blocks, as on catalog entries: visible at `ts` when create_ts <= ts < drop_ts), and
its delete nodes. A row's identity is `(block_id, offset)`.

* `L0Block`: rows in append order, one append node (its commit_ts and row count) per
  committed transaction that appended to it, so the rows visible at `ts` are a prefix. Rows
  are Arrow batches, except a tail of small inserts' Python values (engine/rows.py) that
  becomes one batch when something reads the block or the tail reaches
  `L0_VALUES_ROWS_MAX` rows (issue 21: a lone writer built two Arrow arrays per commit).
* `PersistedBlock`: metadata only (its object, row group, row count, key range, zonemap). Its
  columns, keys and bloom filter are loaded on demand through the engine's cache; the pure
  code here reads them from a `LoadedBlocks` view the shell filled beforehand (plan, load in a
  thread, then compute: no I/O on the event loop).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from engine import limits
from engine.rows import to_arrow
from engine.schema import Key
from engine.storage.deletes import Deletes
from engine.wal.entry import BlockLevel

TS_NEVER = (1 << 64) - 1
"""drop_ts of a block that is not dropped."""


class L0Block:
    __slots__ = (
        "_bytes",
        "_combined",
        "_combined_rows",
        "_part_ends",
        "_parts",
        "_tail",
        "_tail_rows",
        "_tail_schema",
        "block_id",
        "deletes",
        "drop_ts",
        "node_ends",
        "node_ts",
        "rows",
    )

    level = 0

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.rows = 0
        self.node_ts: list[int] = []
        self.node_ends: list[int] = []
        """Per commit (a node): its commit_ts and where its rows end, in commit order."""
        self.deletes = Deletes()
        self.drop_ts = TS_NEVER
        self._parts: list[pa.RecordBatch] = []
        """The appended batches as they came: one per commit, or one per group of commits
        (`append_group`), so `table()` joins a few pieces, not a batch per commit (8,192
        one-row batches took 24 ms to combine, on the event loop), and no Arrow object is
        kept per commit (each one the garbage collector walks)."""
        self._part_ends: list[int] = []
        self._tail: list[list[object]] = []
        """Per column, the Python values of the newest rows (`append_values`), after every
        part: empty, or `_tail_rows` values each in `_tail_schema`'s column order."""
        self._tail_rows = 0
        self._tail_schema: pa.Schema | None = None
        self._combined: pa.Table | None = None
        self._combined_rows = 0
        self._bytes = 0

    @property
    def create_ts(self) -> int:
        return self.node_ts[0] if self.node_ts else TS_NEVER

    def visible(self, ts: int) -> bool:
        return self.create_ts <= ts < self.drop_ts

    def visible_rows(self, ts: int) -> int:
        """Rows [0, n) were appended by commits with commit_ts <= ts."""
        count = bisect.bisect_right(self.node_ts, ts)
        return self.node_ends[count - 1] if count else 0

    def append(
        self,
        commit_ts: int,
        batch: pa.RecordBatch,
        *,
        shares_buffers: bool = False,
        size_bytes: int | None = None,
    ) -> None:
        """Append a commit's rows. `shares_buffers`: the batch is a slice of buffers other
        nodes share (a checkpoint dump), so its own bytes are counted, not the whole buffers'
        (slower: `nbytes` walks the slice). `size_bytes`: the caller knows the rows' share
        (a slice of a group of commits' batch, engine/storage/table.py `apply_appends`)."""
        self._flush_tail()
        self.node_ts.append(commit_ts)
        self._parts.append(batch)
        self.rows += batch.num_rows
        self.node_ends.append(self.rows)
        self._part_ends.append(self.rows)
        if size_bytes is not None:
            self._bytes += size_bytes
        else:
            self._bytes += batch.nbytes if shares_buffers else batch.get_total_buffer_size()

    def append_group(
        self, commits: list[tuple[int, int]], batch: pa.RecordBatch, size_bytes: int
    ) -> None:
        """Append the rows of consecutive commits, `commits` their (commit_ts, rows) in
        order, `batch` all their rows, `size_bytes` their bytes (engine/storage/table.py
        `apply_appends`; `nbytes` would take 5 us)."""
        assert commits
        assert sum(rows for _, rows in commits) == batch.num_rows
        self._flush_tail()
        end = self._add_nodes(commits)
        self._parts.append(batch)
        self._part_ends.append(end)
        self._bytes += size_bytes

    def _add_nodes(self, commits: list[tuple[int, int]]) -> int:
        """One MVCC node per commit, (commit_ts, rows) in order: the rows' new end."""
        end = self.rows
        for commit_ts, rows in commits:
            end += rows
            self.node_ts.append(commit_ts)
            self.node_ends.append(end)
        self.rows = end
        return end

    def append_values(
        self,
        commits: list[tuple[int, int]],
        columns: list[list[object]],
        arrow_schema: pa.Schema,
        size_bytes: int,
    ) -> None:
        """`append_group` of rows given as checked Python values per column (small inserts,
        engine/rows.py `SmallRows`), kept as values: Arrow is built once for many commits,
        when the block is read (`table`, `row`) or the tail is `L0_VALUES_ROWS_MAX` rows."""
        assert commits
        count = sum(rows for _, rows in commits)
        assert len(columns) == len(arrow_schema)
        assert all(len(values) == count for values in columns)
        if self._tail_rows and self._tail_schema is not arrow_schema:
            self._flush_tail()
        tail = self._tail
        if not tail:
            self._tail_schema = arrow_schema
            tail.extend([] for _ in columns)
        for into, values in zip(tail, columns, strict=True):
            into += values
        self._tail_rows += count
        self._add_nodes(commits)
        self._bytes += size_bytes
        if self._tail_rows >= limits.L0_VALUES_ROWS_MAX:
            self._flush_tail()

    def _flush_tail(self) -> None:
        """The tail's values become one Arrow part (one `pa.array` per column)."""
        if not self._tail_rows:
            return
        assert self._tail_schema is not None
        self._parts.append(to_arrow(self._tail_schema, self._tail))
        self._part_ends.append(self.rows)
        self._tail = []
        self._tail_rows = 0
        self._tail_schema = None

    def table(self) -> pa.Table:
        """Every appended row, as one Arrow table (recombined lazily after appends)."""
        self._flush_tail()
        if self._combined is None or self._combined_rows != self.rows:
            self._combined = pa.Table.from_batches(self._parts).combine_chunks()
            self._combined_rows = self.rows
        return self._combined

    def commit_ts_of(self, offset: int) -> int:
        return self.node_ts[bisect.bisect_right(self.node_ends, offset)]

    def commit_ts_column(self, rows: int) -> pa.Array:
        """The commit_ts of rows [0, rows), as a uint64 array (dumps, flushes)."""
        ends = np.asarray([0, *self.node_ends], dtype=np.int64)
        counts = ends[1:] - ends[:-1]
        values = np.repeat(np.asarray(self.node_ts, dtype=np.uint64), counts)[:rows]
        return pa.array(values, type=pa.uint64())

    def row(self, offset: int) -> dict[str, object]:
        self._flush_tail()
        part = bisect.bisect_right(self._part_ends, offset)
        start = self._part_ends[part - 1] if part else 0
        rows: list[dict[str, object]] = self._parts[part].slice(offset - start, 1).to_pylist()
        return rows[0]

    def byte_size(self) -> int:
        """The bytes of the appended rows, kept as they are appended (O(1): every
        maintenance step asks every L0 block)."""
        return self._bytes


@dataclass(slots=True, eq=False)
class PersistedBlock:
    block_id: int
    level: BlockLevel
    object_name: str
    row_group: int
    rows: int
    create_ts: int
    key_min: Key
    key_max: Key
    """The first and last key of the block (its rows are sorted by key)."""
    zonemap: Any
    """The object's zonemap of this block (engine.objects.zonemap), for scan pruning."""
    drop_ts: int = TS_NEVER
    deletes: Deletes = None  # type: ignore[assignment]  # set in __post_init__
    bloom: Bloom | None = None
    """The key bloom filter, held with the block (None: read it from the object)."""

    def __post_init__(self) -> None:
        self.deletes = Deletes()

    def visible(self, ts: int) -> bool:
        return self.create_ts <= ts < self.drop_ts

    def may_hold(self, key: Key) -> bool:
        return bool(self.key_min <= key <= self.key_max)


Block = L0Block | PersistedBlock


class BlockKeys:
    """The keys of a persisted block, sorted (its rows are), for binary search: a numpy array
    for a one-column integer key, a list of Python keys otherwise."""

    __slots__ = ("_array", "_list")

    def __init__(self, keys: pa.Table) -> None:
        self._array: np.ndarray | None = None
        self._list: list[Key] | None = None
        if keys.num_columns == 1 and pa.types.is_integer(keys.schema.field(0).type):
            self._array = keys.column(0).to_numpy()
        elif keys.num_columns == 1:
            self._list = keys.column(0).to_pylist()
        else:
            self._list = list(zip(*(c.to_pylist() for c in keys.columns), strict=True))

    def find(self, key: Key) -> int | None:
        """The offset of `key`, or None."""
        if self._array is not None:
            array = self._array
            if not isinstance(key, int):
                return None
            try:
                offset = int(np.searchsorted(array, key))
            except OverflowError:
                return None
            return offset if offset < len(array) and int(array[offset]) == key else None
        assert self._list is not None
        offset = bisect.bisect_left(self._list, key)
        return offset if offset < len(self._list) and self._list[offset] == key else None

    def span(self, lo: int, hi: int) -> tuple[int, int] | None:
        """The offsets `[start, stop)` of the keys in `[lo, hi]` (both ends included), by
        binary search; None when the keys are not one integer column."""
        if self._array is None:
            return None
        array = self._array
        info = np.iinfo(array.dtype)
        if hi < info.min or lo > info.max or lo > hi:
            return 0, 0
        # numpy refuses a Python int past the array's type: clip to it.
        lo, hi = max(lo, int(info.min)), min(hi, int(info.max))
        return int(np.searchsorted(array, lo, "left")), int(np.searchsorted(array, hi, "right"))

    def byte_size(self) -> int:
        if self._array is not None:
            return int(self._array.nbytes)
        assert self._list is not None
        return 64 * len(self._list)


class Bloom(Protocol):
    def might_contain(self, key: Key) -> bool: ...

    def might_contain_hash(self, hashed: int) -> bool:
        """`might_contain` of a key by its `engine.objects.bloom.key_hash`."""
        ...


class LoadedBlocks(Protocol):
    """What the shell loaded for one read (pinned while the read runs)."""

    def keys(self, block: PersistedBlock) -> BlockKeys: ...

    def bloom(self, block: PersistedBlock) -> Bloom | None: ...

    def columns(self, block: PersistedBlock) -> pa.Table:
        """The block's columns loaded for this read (at least those the read asked for)."""
        ...

    def object_rows(self, block: PersistedBlock) -> tuple[pa.Table, int] | None:
        """When the read loaded whole objects: the object's columns and the block's first
        row in them; None otherwise."""
        ...


class NothingLoaded:
    """A read that needs no persisted block."""

    def keys(self, block: PersistedBlock) -> BlockKeys:
        raise AssertionError(f"block {block.block_id} was not loaded")

    def bloom(self, block: PersistedBlock) -> Bloom | None:
        raise AssertionError(f"block {block.block_id} was not loaded")

    def columns(self, block: PersistedBlock) -> pa.Table:
        raise AssertionError(f"block {block.block_id} was not loaded")

    def object_rows(self, block: PersistedBlock) -> tuple[pa.Table, int] | None:
        raise AssertionError(f"block {block.block_id} was not loaded")


NOTHING_LOADED = NothingLoaded()


@dataclass(slots=True)
class MappedLoadedBlocks:
    """`LoadedBlocks` over dicts (tests, and the shell's prefetch result)."""

    keys_by_block: Mapping[int, BlockKeys]
    columns_by_block: Mapping[int, pa.Table]
    blooms_by_block: Mapping[int, Bloom]

    def keys(self, block: PersistedBlock) -> BlockKeys:
        return self.keys_by_block[block.block_id]

    def bloom(self, block: PersistedBlock) -> Bloom | None:
        return self.blooms_by_block.get(block.block_id)

    def columns(self, block: PersistedBlock) -> pa.Table:
        return self.columns_by_block[block.block_id]

    def object_rows(self, block: PersistedBlock) -> tuple[pa.Table, int] | None:
        return None
