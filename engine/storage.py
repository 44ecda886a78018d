"""A table's rows in memory: blocks of Arrow batches with per-transaction commit timestamps,
delete masks with delete timestamps, and a primary-key index over row versions.

Why this shape (the seed's TAE "MVCC" and "Transaction Processing" sections, shared/reference/
tae-engine.md): rows are appended, never changed in place. A block holds up to
`limits.BLOCK_ROWS_MAX` rows as a list of *append nodes* (one per committed transaction that
appended to it, in commit order, each an Arrow batch with the transaction's commit_ts), and a
list of *delete nodes* (one per committed transaction that deleted rows of it: commit_ts plus a
roaring bitmap of row offsets). So the rows of a block visible at `ts` are a prefix (the
append nodes with commit_ts <= ts) minus the union of the delete nodes with commit_ts <= ts.
A row id is `(block_id, offset)`; the WAL's Append and Delete commands name rows by it, which is
why placement is decided when a transaction is prepared (`allocate`, in commit order) and
checked again when it is applied, and why replay reproduces every row id exactly.

Until issue 14 (objects, compaction) every version stays in memory; nothing is reclaimed.

`apply_*` validate what they apply and raise `ApplyError`: on the commit path that is a bug
(the engine asserts), on replay it is a corrupt WAL entry (the engine names the DSN).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import pyarrow as pa
from pyroaring import BitMap, FrozenBitMap

from engine import limits
from engine.schema import Key, Schema, batch_keys
from engine.wal.entry import Append, AppendInfo, Delete

_OFFSET_BITS = 32
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1


def _row_id(block_id: int, offset: int) -> int:
    return (block_id << _OFFSET_BITS) | offset


class ApplyError(Exception):
    """A command does not fit the state it is applied to (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class RowVersion:
    """One version of a key: the row at (block_id, offset), appended at commit_ts."""

    commit_ts: int
    block_id: int
    offset: int


class Block:
    __slots__ = (
        "_combined",
        "_combined_rows",
        "block_id",
        "delete_ts",
        "deleted_all",
        "deletes",
        "node_batches",
        "node_ends",
        "node_ts",
        "rows",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.rows = 0
        self.node_ts: list[int] = []
        self.node_ends: list[int] = []
        self.node_batches: list[pa.RecordBatch] = []
        self.deletes: list[tuple[int, FrozenBitMap]] = []
        self.deleted_all = BitMap()
        self.delete_ts: dict[int, int] = {}
        self._combined: pa.Table | None = None
        self._combined_rows = 0

    def visible_rows(self, ts: int) -> int:
        """Rows [0, n) were appended by commits with commit_ts <= ts."""
        count = bisect.bisect_right(self.node_ts, ts)
        return self.node_ends[count - 1] if count else 0

    def deleted_at(self, ts: int) -> BitMap | FrozenBitMap:
        if not self.deletes or self.deletes[-1][0] <= ts:
            return self.deleted_all
        out = BitMap()
        for delete_ts, rows in self.deletes:
            if delete_ts > ts:
                break
            out |= rows
        return out

    def table(self) -> pa.Table:
        """Every appended row, as one Arrow table (recombined lazily after appends)."""
        if self._combined is None or self._combined_rows != self.rows:
            self._combined = pa.Table.from_batches(self.node_batches).combine_chunks()
            self._combined_rows = self.rows
        return self._combined

    def commit_ts_of(self, offset: int) -> int:
        return self.node_ts[bisect.bisect_right(self.node_ends, offset)]

    def row(self, offset: int) -> dict[str, object]:
        node = bisect.bisect_right(self.node_ends, offset)
        start = self.node_ends[node - 1] if node else 0
        rows: list[dict[str, object]] = self.node_batches[node].slice(offset - start, 1).to_pylist()
        return rows[0]


class TableData:
    """The rows of one table. Not thread-safe; one event loop owns it."""

    def __init__(self, name: str, schema: Schema) -> None:
        self.name = name
        self.schema = schema
        self.arrow_schema = schema.to_arrow()
        self.blocks: list[Block] = []
        self.keys: dict[Key, int | tuple[int, ...]] = {}
        """Every version of every key, oldest first, as packed row ids (`_row_id`): ints and
        tuples of ints, so a table of millions of rows adds no objects for the garbage
        collector to walk (one RowVersion object per row made full collections grow
        with the table, and with them the commit latency tail)."""
        self.live_rows = 0
        self._reserved_block = 1
        self._reserved_offset = 0

    # --- placement ----------------------------------------------------------------------------

    def allocate(self, rows: int) -> tuple[AppendInfo, ...]:
        """Reserve the next `rows` row ids, in commit order (called when a transaction is
        prepared; its Append command carries them)."""
        assert rows > 0
        infos = []
        block_id, offset = self._reserved_block, self._reserved_offset
        while rows:
            if offset == limits.BLOCK_ROWS_MAX:
                block_id, offset = block_id + 1, 0
            take = min(rows, limits.BLOCK_ROWS_MAX - offset)
            infos.append(AppendInfo(block_id, offset, take))
            offset += take
            rows -= take
        self._reserved_block, self._reserved_offset = block_id, offset
        return tuple(infos)

    def unallocate(self, infos: tuple[AppendInfo, ...]) -> None:
        """Give back the last allocation (a prepare that was cancelled before anything
        else was prepared)."""
        first, last = infos[0], infos[-1]
        assert (self._reserved_block, self._reserved_offset) == (
            last.block_id,
            last.offset + last.rows,
        )
        self._reserved_block, self._reserved_offset = first.block_id, first.offset

    def _applied_position(self) -> tuple[int, int]:
        if not self.blocks:
            return 1, 0
        block = self.blocks[-1]
        return block.block_id, block.rows

    # --- applying committed commands ---------------------------------------------------------

    def apply_append(self, cmd: Append, commit_ts: int) -> None:
        batch = cmd.batch
        if not batch.schema.equals(self.arrow_schema):
            raise ApplyError(
                f"append to {self.name}: batch schema {batch.schema} is not the table's"
            )
        if sum(info.rows for info in cmd.infos) != batch.num_rows or not cmd.infos:
            raise ApplyError(f"append to {self.name}: infos do not cover the batch")
        keys = batch_keys(self.schema, batch)
        for key in keys:
            if self._live_version(key) is not None:
                raise ApplyError(f"append to {self.name}: key {key!r} is already live")
        if len(set(keys)) != len(keys):
            raise ApplyError(f"append to {self.name}: a key repeats within the batch")
        start = 0
        for info in cmd.infos:
            block_id, offset = self._applied_position()
            if offset == limits.BLOCK_ROWS_MAX:
                block_id, offset = block_id + 1, 0
            if (info.block_id, info.offset) != (block_id, offset) or info.rows <= 0:
                raise ApplyError(
                    f"append to {self.name}: rows placed at {info.block_id}:{info.offset}, "
                    f"expected {block_id}:{offset}"
                )
            if info.offset + info.rows > limits.BLOCK_ROWS_MAX:
                raise ApplyError(f"append to {self.name}: block {info.block_id} overflows")
            if info.offset == 0:
                self.blocks.append(Block(info.block_id))
            block = self.blocks[-1]
            part = batch.slice(start, info.rows)
            block.node_ts.append(commit_ts)
            block.node_batches.append(part)
            block.rows += info.rows
            block.node_ends.append(block.rows)
            index_keys = self.keys
            base = _row_id(info.block_id, info.offset)
            for index in range(info.rows):
                key = keys[start + index]
                row_id = base + index
                old = index_keys.get(key)
                if old is None:
                    index_keys[key] = row_id
                elif type(old) is int:
                    index_keys[key] = (old, row_id)
                else:
                    assert isinstance(old, tuple)
                    index_keys[key] = (*old, row_id)
            start += info.rows
        self.live_rows += batch.num_rows
        if (self._reserved_block, self._reserved_offset) < self._applied_position():
            # Replay: nothing was allocated ahead of what the log holds.
            self._reserved_block, self._reserved_offset = self._applied_position()

    def apply_delete(self, cmd: Delete, commit_ts: int) -> None:
        index = cmd.block_id - 1
        if not 0 <= index < len(self.blocks) or not cmd.rows:
            raise ApplyError(f"delete in {self.name}: no block {cmd.block_id}, or no rows")
        block = self.blocks[index]
        if cmd.rows.max() >= block.rows:
            raise ApplyError(
                f"delete in {self.name}: row {cmd.rows.max()} beyond block {cmd.block_id}"
            )
        if not cmd.rows.isdisjoint(block.deleted_all):
            raise ApplyError(
                f"delete in {self.name}: a row of block {cmd.block_id} is already deleted"
            )
        block.deletes.append((commit_ts, cmd.rows))
        block.deleted_all |= cmd.rows
        for offset in cmd.rows:
            block.delete_ts[offset] = commit_ts
        self.live_rows -= len(cmd.rows)

    # --- reads at a timestamp ------------------------------------------------------------------

    def _row_ids(self, key: Key) -> tuple[int, ...]:
        found = self.keys.get(key)
        if found is None:
            return ()
        if type(found) is int:
            return (found,)
        assert isinstance(found, tuple)
        return found

    def _live_version(self, key: Key) -> int | None:
        row_ids = self._row_ids(key)
        if not row_ids:
            return None
        last = row_ids[-1]
        if (last & _OFFSET_MASK) in self.blocks[(last >> _OFFSET_BITS) - 1].delete_ts:
            return None
        return last

    def version_at(self, key: Key, ts: int) -> RowVersion | None:
        """The version of `key` visible at `ts`, or None."""
        for row_id in reversed(self._row_ids(key)):
            block = self.blocks[(row_id >> _OFFSET_BITS) - 1]
            offset = row_id & _OFFSET_MASK
            commit_ts = block.commit_ts_of(offset)
            if commit_ts > ts:
                continue
            delete_ts = block.delete_ts.get(offset)
            if delete_ts is None or delete_ts > ts:
                return RowVersion(commit_ts, block.block_id, offset)
            return None  # at most one version is live at a time; older ones died before
        return None

    def row(self, version: RowVersion) -> dict[str, object]:
        return self.blocks[version.block_id - 1].row(version.offset)

    def scan_at(self, ts: int, excluded: dict[int, BitMap] | None = None) -> list[pa.Table]:
        """The rows visible at `ts`, minus `excluded` (block_id -> offsets: the reading
        transaction's own deletes), as one Arrow table per block."""
        parts = []
        for block in self.blocks:
            visible = block.visible_rows(ts)
            if not visible:
                break  # later blocks were appended even later
            deleted = block.deleted_at(ts)
            own = excluded.get(block.block_id) if excluded else None
            table = block.table()
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
