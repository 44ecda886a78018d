"""A table's rows: its blocks, placement of new rows, applying committed commands, and reads
at a timestamp.

Why this shape (decision 0006; the seed's TAE "MVCC", "Storage Engine Architecture"): rows are
appended, never changed in place; a row keeps its identity `(block_id, offset)` for life, so
the WAL names rows by it and replay reproduces every identity. Placement is decided when a
transaction is prepared (`allocate`, in commit order, carried by the Append command's infos)
and checked when it is applied. Flushes, merges and compactions move rows only by creating
blocks (CreateBlock) and dropping others (DropBlock) in one committed entry.

Two sides of placement:

* *reserved* (prepare side): where the next allocated rows go; `freeze()` seals the open block
  so that the next allocation starts a new block (the flush of a block waits until every row
  reserved in it is applied: `FrozenBlock.rows`);
* *applied*: the blocks as the committed entries built them. An Append info either continues
  the applied open block at its end or starts block `next_block_id` at offset 0; a
  CreateBlock takes `next_block_id` too. Both sides agree because both follow commit order.

Reads take the persisted blocks' keys, blooms and columns from a `LoadedBlocks` view the shell
filled beforehand (`key_candidates` / `scan_blocks` tell it what to load): no I/O here.

`apply_*` validate what they apply and raise `ApplyError`: on the commit path that is a bug
(the engine asserts), on replay it is a corrupt WAL entry (the engine names the DSN).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import FrozenBitMap

from engine import limits
from engine.objects.blockfile import COMMIT_TS_COLUMN
from engine.objects.bloom import key_hash
from engine.objects.zonemap import prune as zonemap_prune
from engine.rows import SmallRows
from engine.schema import Key, Schema, batch_keys
from engine.storage import pruning
from engine.storage.blocks import (
    TS_NEVER,
    Block,
    Bloom,
    L0Block,
    LoadedBlocks,
    PersistedBlock,
)
from engine.storage.keyindex import KeyIndex, U64Array
from engine.storage.keyranges import KeyRanges
from engine.storage.moves import Moves
from engine.wal.entry import Append, AppendInfo, AppendRows, CreateBlock, Delete, DropBlock

_OFFSET_BITS = 32
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1


def _row_id(block_id: int, offset: int) -> int:
    return (block_id << _OFFSET_BITS) | offset


PRUNE_BY_PYARROW_BLOCKS_MAX = 64
"""A filter the fast pruner does not read is pruned by pyarrow only over this many blocks
(about 20 us each): beyond, reading every block is cheaper than deciding which to skip."""


KEY_LOOKUPS_ONE_BY_ONE_MAX = 16
"""Up to this many keys are looked up in the key index one by one (about 2 us a run each);
more in one vectorized pass (about 5 us a run for the pass, then ~1 us a key)."""


_Group = tuple[pa.RecordBatch | None, list[list[object]] | None, int, int]
"""The rows `apply_appends` applies: an Arrow batch or values per column (one of them), their
count and bytes."""


class ApplyError(Exception):
    """A command does not fit the state it is applied to (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class RowVersion:
    """One version of a key: the row at (block_id, offset)."""

    block_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class PersistedMeta:
    """What a CreateBlock needs beyond its command: the block's key range and zonemap, from
    the object (read from its footer on replay; known in memory when the engine wrote it)."""

    key_min: Key
    key_max: Key
    zonemap: object
    bloom: Bloom | None = None
    """The block's key bloom filter (in the catalog entry, as the seed's metaLoc: about
    1.5 bytes a row, so an insert's dedupe asks each block without touching the cache)."""
    key_hashes: U64Array | None = None
    """The `key_hash` of each of the block's keys, when the engine just wrote it (the
    table's key index takes them); None when read from a footer (replay), which holds no
    keys: the block stays out of the index until maintenance reads its keys."""


MetaSource = Callable[[CreateBlock], PersistedMeta]


class Reservation(NamedTuple):
    """The reserved placement state, to restore when a prepared commit is cancelled. A
    tuple: every commit that appends takes one (issue 21: a frozen dataclass cost more)."""

    open_block: int | None
    open_offset: int
    next_block_id: int
    pending: dict[int, int]


class TableData:
    """The rows of one table. Not thread-safe; one event loop owns it."""

    def __init__(self, name: str, schema: Schema) -> None:
        self.name = name
        self.schema = schema
        self.arrow_schema = schema.to_arrow()
        self.blocks: dict[int, Block] = {}
        """Every block not yet collected, by id; ids only grow, so this is id order."""
        self.next_block_id = 1
        self.open_block: L0Block | None = None
        self.l0_keys: dict[Key, int | tuple[int, ...]] = {}
        """Every version of every key in an L0 block, oldest first, as packed row ids
        (`_row_id`): ints and tuples of ints, so millions of rows add no objects for the
        garbage collector to walk."""
        self.live_rows = 0
        self.persisted_count = 0
        """Persisted blocks live now."""
        self.persisted_held = 0
        """Persisted blocks held (live, or dropped and still readable by a snapshot): none
        means point reads need no loading at all."""
        self._res_open: int | None = None
        self._res_offset = 0
        self._res_next = 1
        self._pending: dict[int, int] = {}
        """L0 block id -> rows reserved in it, while more are reserved than applied (a few
        blocks at most: the open one and those sealed with appends still in flight)."""
        self.key_index = KeyIndex()
        """Which persisted blocks may hold a key (issue 21: never one probe per block)."""
        self._unindexed: dict[int, PersistedBlock] = {}
        """Held persisted blocks not in `key_index` yet (restored or replayed from objects
        whose keys are not read yet, or with an id too large for it): point reads test
        their key ranges instead (`_ranges`)."""
        self._ranges: KeyRanges | None = None
        self._bounds: tuple[tuple[int, ...], pruning.Bounds] | None = None
        self.moves = Moves()
        """Blocks a prepared rewrite drops, and where their rows went."""

    # --- placement (reserved side) -----------------------------------------------------------

    def reservation(self) -> Reservation:
        return Reservation(self._res_open, self._res_offset, self._res_next, dict(self._pending))

    def restore(self, mark: Reservation) -> None:
        """Take back every allocation since `mark` (a prepare cancelled before anything else
        was prepared)."""
        assert mark.next_block_id <= self._res_next
        self._res_open, self._res_offset, self._res_next = (
            mark.open_block,
            mark.open_offset,
            mark.next_block_id,
        )
        self._pending = mark.pending

    def allocate(self, rows: int) -> tuple[AppendInfo, ...]:
        """Reserve the next `rows` row ids, in commit order (called when a transaction is
        prepared; its Append command carries them)."""
        assert rows > 0
        infos = []
        while rows:
            if self._res_open is None or self._res_offset == limits.BLOCK_ROWS_MAX:
                self._res_open, self._res_offset = self._res_next, 0
                self._res_next += 1
            take = min(rows, limits.BLOCK_ROWS_MAX - self._res_offset)
            infos.append(AppendInfo(self._res_open, self._res_offset, take))
            self._res_offset += take
            self._pending[self._res_open] = self._res_offset
            rows -= take
        return tuple(infos)

    def allocate_block_ids(self, count: int) -> list[int]:
        """Ids for `count` persisted blocks a prepared commit creates."""
        first = self._res_next
        self._res_next += count
        return list(range(first, first + count))

    def freeze(self) -> bool:
        """Seal the open block: later allocations start a new one. False if none is open."""
        if self._res_open is None:
            return False
        self._res_open = None
        self._res_offset = 0
        return True

    def sealed(self, block: L0Block) -> bool:
        """No more rows will be placed in `block`."""
        return block.block_id != self._res_open or self._res_offset >= limits.BLOCK_ROWS_MAX

    def complete(self, block: L0Block) -> bool:
        """`block` is sealed and every row placed in it is applied: a flush may read it."""
        return self.sealed(block) and block.block_id not in self._pending

    def _sync_reservation(self) -> None:
        """Replay: nothing is reserved ahead of what the log holds."""
        if self._res_next < self.next_block_id:
            self._res_next = self.next_block_id
            open_block = self.open_block
            if open_block is None:
                self._res_open, self._res_offset = None, 0
            else:
                self._res_open, self._res_offset = open_block.block_id, open_block.rows
        elif self.open_block is not None and self._res_open == self.open_block.block_id:
            self._res_offset = max(self._res_offset, self.open_block.rows)

    # --- applying committed commands ---------------------------------------------------------

    def apply_append(self, cmd: Append, commit_ts: int) -> None:
        self.apply_appends([(commit_ts, cmd)])

    def apply_appends(self, appends: Sequence[tuple[int, Append | AppendRows]]) -> None:
        """Apply the appends of consecutive commits (commit_ts ascending) as one: each
        commit's rows a node of the L0 blocks, so a reader at any commit_ts still sees
        exactly the rows committed at or below it. When they are all small inserts' values
        (engine/rows.py) the rows stay values in the block (`L0Block.append_values`: Arrow
        is built when the block is read, for many commits at once; issue 21); otherwise they
        become one Arrow batch, each commit's rows a slice of it."""
        assert appends
        values: list[list[object]] | None = None
        batch: pa.RecordBatch | None = None
        small: list[SmallRows] = []
        info_rows = 0
        for _, cmd in appends:  # one pass: a lone commit's group is one command
            if type(cmd) is AppendRows:
                small.append(cmd.rows)
            if not cmd.infos:
                raise ApplyError(f"append to {self.name}: an append without infos")
            for info in cmd.infos:
                info_rows += info.rows
        if len(small) == len(appends):
            for rows in small:
                if rows.arrow_schema is not self.arrow_schema and not rows.arrow_schema.equals(
                    self.arrow_schema
                ):
                    raise ApplyError(f"append to {self.name}: rows are not the table's schema")
            if len(small) == 1:
                values = small[0].columns
                keys = small[0].primary_keys()
            else:
                values = [[] for _ in self.arrow_schema]
                for rows in small:
                    for into, column in zip(values, rows.columns, strict=True):
                        into += column
                keys = [key for rows in small for key in rows.primary_keys()]
            count = len(keys)
            size_bytes = sum(rows.size_bytes() for rows in small)
        else:
            batches = [
                cmd.batch if type(cmd) is Append else cmd.rows.batch()  # type: ignore[union-attr]
                for _, cmd in appends
            ]
            for part in batches:
                if not part.schema.equals(self.arrow_schema):
                    raise ApplyError(
                        f"append to {self.name}: batch schema {part.schema} is not the table's"
                    )
            batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
            keys = batch_keys(self.schema, batch)
            count = batch.num_rows
            size_bytes = batch.get_total_buffer_size()
        if info_rows != count:
            raise ApplyError(f"append to {self.name}: infos do not cover the batch")
        # Only L0 versions are checked here: persisted blocks would need I/O, and the
        # prepare-time checks (workspace, snapshot, conflict index) are what keeps keys unique.
        for key in keys:
            if self._live_l0_version(key) is not None:
                raise ApplyError(f"append to {self.name}: key {key!r} is already live")
        if len(keys) > 1 and len(set(keys)) != len(keys):
            raise ApplyError(f"append to {self.name}: a key repeats within the batch")
        # One piece of the rows per block they fill (most groups: one), each commit's rows a
        # node of the block (its commit_ts), the piece appended once.
        group: _Group = (batch, values, count, size_bytes)
        start = 0
        index_keys = self.l0_keys
        piece: list[tuple[int, int]] = []
        piece_block: L0Block | None = None
        piece_start = 0
        for commit_ts, cmd in appends:
            for info in cmd.infos:
                block = self._block_for_append(info)
                if block is not piece_block:
                    if piece_block is not None:
                        self._append_piece(piece_block, piece, group, piece_start, start)
                    piece, piece_block, piece_start = [], block, start
                piece.append((commit_ts, info.rows))
                # Counted ahead (given back in `_append_piece`): `_block_for_append` checks
                # the next info starts where this one ends.
                block.rows += info.rows
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
        assert piece_block is not None
        self._append_piece(piece_block, piece, group, piece_start, start)
        self.live_rows += count
        self._sync_reservation()

    def _append_piece(
        self,
        block: L0Block,
        commits: list[tuple[int, int]],
        group: _Group,
        start: int,
        end: int,
    ) -> None:
        """Rows [start, end) of the group (its batch, or its values per column) into
        `block`; each piece counts its share of the group's bytes."""
        block.rows -= end - start  # counted ahead while the piece was gathered
        batch, values, count, size_bytes = group
        share = size_bytes if start == 0 and end == count else size_bytes * (end - start) // count
        if values is not None:
            if start != 0 or end != count:
                values = [column[start:end] for column in values]
            block.append_values(commits, values, self.arrow_schema, share)
        else:
            assert batch is not None
            if start != 0 or end != count:
                batch = batch.slice(start, end - start)
            block.append_group(commits, batch, share)
        reserved = self._pending.get(block.block_id)
        if reserved is not None and block.rows >= reserved:
            del self._pending[block.block_id]

    def _block_for_append(self, info: AppendInfo) -> L0Block:
        if info.rows <= 0 or info.offset + info.rows > limits.BLOCK_ROWS_MAX:
            raise ApplyError(f"append to {self.name}: block {info.block_id} overflows")
        open_block = self.open_block
        if (
            open_block is not None
            and info.block_id == open_block.block_id
            and info.offset == open_block.rows
        ):
            return open_block
        if info.block_id == self.next_block_id and info.offset == 0:
            block = L0Block(info.block_id)
            self.blocks[block.block_id] = block
            self.next_block_id += 1
            self.open_block = block
            return block
        expected = f"{open_block.block_id}:{open_block.rows} or " if open_block is not None else ""
        raise ApplyError(
            f"append to {self.name}: rows placed at {info.block_id}:{info.offset}, expected "
            f"{expected}{self.next_block_id}:0"
        )

    def apply_create(self, cmd: CreateBlock, commit_ts: int, meta: MetaSource) -> PersistedBlock:
        if cmd.block_id != self.next_block_id:
            raise ApplyError(
                f"create in {self.name}: block {cmd.block_id}, expected {self.next_block_id}"
            )
        if cmd.rows > limits.BLOCK_ROWS_MAX:
            raise ApplyError(f"create in {self.name}: block {cmd.block_id} has {cmd.rows} rows")
        found = meta(cmd)
        block = PersistedBlock(
            cmd.block_id,
            cmd.level,
            cmd.object_name,
            cmd.row_group,
            cmd.rows,
            commit_ts,
            found.key_min,
            found.key_max,
            found.zonemap,
            bloom=found.bloom,
        )
        self.blocks[block.block_id] = block
        self.next_block_id += 1
        self.live_rows += cmd.rows
        self.persisted_count += 1
        self.persisted_held += 1
        hashes = found.key_hashes
        if hashes is not None and len(hashes) == cmd.rows and KeyIndex.fits(block.block_id):
            self.key_index.add(block.block_id, hashes)
        else:
            self._unindexed[block.block_id] = block
            self._ranges = None
        self._sync_reservation()
        return block

    def apply_delete(self, cmd: Delete, commit_ts: int) -> None:
        block = self.blocks.get(cmd.block_id)
        if block is None or not block.visible(commit_ts) or not cmd.rows:
            raise ApplyError(f"delete in {self.name}: no live block {cmd.block_id}, or no rows")
        if cmd.rows.max() >= block.rows:
            raise ApplyError(
                f"delete in {self.name}: row {cmd.rows.max()} beyond block {cmd.block_id}"
            )
        if not cmd.rows.isdisjoint(block.deletes.all):
            raise ApplyError(
                f"delete in {self.name}: a row of block {cmd.block_id} is already deleted"
            )
        if cmd.keys is not None and cmd.keys.columns != self.schema.key_columns:
            # The keys themselves are the log's word (checking them would read the block).
            raise ApplyError(
                f"delete in {self.name}: its keys name columns {list(cmd.keys.columns)}, "
                f"the table's key is {list(self.schema.key_columns)}"
            )
        block.deletes.add(commit_ts, cmd.rows)
        self.live_rows -= len(cmd.rows)

    def apply_drop(self, cmd: DropBlock, commit_ts: int) -> None:
        block = self.blocks.get(cmd.block_id)
        if block is None or not block.visible(commit_ts):
            raise ApplyError(f"drop in {self.name}: no live block {cmd.block_id}")
        block.drop_ts = commit_ts
        self.live_rows -= block.rows - len(block.deletes)
        if block is self.open_block:
            self.open_block = None
        if self._res_open == cmd.block_id:
            # Replay: the reservation followed the applied open block, which a flush just
            # took away (live, the flush had sealed it on the reserved side already).
            self._res_open, self._res_offset = None, 0
        if isinstance(block, PersistedBlock):
            # Still in the key index (and `_unindexed`): snapshots below the drop read it.
            self.persisted_count -= 1

    # --- restoring from a checkpoint (engine/checkpoint/plan.py `restore`) ---------------------

    def restore_l0(self, block_id: int, nodes: list[tuple[int, pa.RecordBatch]]) -> None:
        """An L0 block as a checkpoint dumped it: its append nodes, in order."""
        assert block_id not in self.blocks
        block = L0Block(block_id)
        for commit_ts, batch in nodes:
            block.append(commit_ts, batch, shares_buffers=True)
            keys = batch_keys(self.schema, batch)
            base = _row_id(block_id, block.rows - batch.num_rows)
            for index, key in enumerate(keys):
                row_id = base + index
                old = self.l0_keys.get(key)
                if old is None:
                    self.l0_keys[key] = row_id
                elif type(old) is int:
                    self.l0_keys[key] = (old, row_id)
                else:
                    assert isinstance(old, tuple)
                    self.l0_keys[key] = (*old, row_id)
        self.blocks[block_id] = block
        self.live_rows += block.rows

    def restore_persisted(self, block: PersistedBlock) -> None:
        assert block.block_id not in self.blocks
        self.blocks[block.block_id] = block
        self.live_rows += block.rows
        self.persisted_count += 1
        self.persisted_held += 1
        self._unindexed[block.block_id] = block
        self._ranges = None

    def restore_deletes(self, block_id: int, nodes: list[tuple[int, FrozenBitMap]]) -> None:
        block = self.blocks[block_id]
        for commit_ts, rows in nodes:
            if rows.max() >= block.rows:
                raise ApplyError(f"{self.name}: a delete beyond block {block_id}")
            block.deletes.add(commit_ts, rows)
            self.live_rows -= len(rows)

    def finish_restore(self, open_block_id: int) -> None:
        """Every block is back: the open block, and nothing reserved beyond the state."""
        block = self.blocks.get(open_block_id) if open_block_id else None
        self.open_block = block if isinstance(block, L0Block) else None
        self._sync_reservation()

    # --- garbage -----------------------------------------------------------------------------

    def collect(self, oldest_snapshot_ts: int) -> list[Block]:
        """Forget blocks dropped at or before `oldest_snapshot_ts` (no reader can see them
        any more); returns them (their objects may become garbage)."""
        gone = [b for b in self.blocks.values() if b.drop_ts <= oldest_snapshot_ts]
        for block in gone:
            del self.blocks[block.block_id]
            self.moves.forget(block.block_id)
            if isinstance(block, L0Block):
                self._forget_l0_keys(block)
            else:
                self.persisted_held -= 1
                self.key_index.remove(block.block_id)
                if self._unindexed.pop(block.block_id, None) is not None:
                    self._ranges = None
        return gone

    def release_all(self) -> list[Block]:
        """Forget every block (the table was dropped before every reader's snapshot)."""
        gone = list(self.blocks.values())
        self.blocks.clear()
        self.l0_keys.clear()
        self.open_block = None
        self.persisted_held = 0
        self.persisted_count = 0
        self.key_index.clear()
        self._unindexed.clear()
        self._ranges = None
        self.moves = Moves()
        return gone

    def _forget_l0_keys(self, block: L0Block) -> None:
        low, high = _row_id(block.block_id, 0), _row_id(block.block_id + 1, 0)
        index = self.l0_keys
        # The block's rows as one table (a flush built it already): one key list, not one
        # per commit.
        for key in batch_keys(self.schema, block.table()):
            found = index.get(key)
            if found is None:
                continue
            if type(found) is int:
                if low <= found < high:
                    del index[key]
                continue
            assert isinstance(found, tuple)
            kept = tuple(r for r in found if not low <= r < high)
            if not kept:
                del index[key]
            else:
                index[key] = kept[0] if len(kept) == 1 else kept

    # --- reads at a timestamp ------------------------------------------------------------------

    def _l0_row_ids(self, key: Key) -> tuple[int, ...]:
        found = self.l0_keys.get(key)
        if found is None:
            return ()
        if type(found) is int:
            return (found,)
        assert isinstance(found, tuple)
        return found

    def _live_l0_version(self, key: Key) -> int | None:
        row_ids = self._l0_row_ids(key)
        if not row_ids:
            return None
        last = row_ids[-1]
        block = self.blocks[last >> _OFFSET_BITS]
        if block.drop_ts != TS_NEVER or (last & _OFFSET_MASK) in block.deletes.ts_of:
            return None
        return last

    def key_candidates(self, key: Key, ts: int) -> list[PersistedBlock]:
        """Persisted blocks visible at `ts` that may hold `key` (what a point read must
        load: keys and bloom): those the key index names, and the unindexed ones whose key
        range holds it. A superset; the block's keys decide."""
        return self.key_candidates_many([key], ts)[0]

    def key_candidates_many(self, keys: Sequence[Key], ts: int) -> list[list[PersistedBlock]]:
        """`key_candidates` of each key (one binary search per index run for all)."""
        if not self.persisted_held or not keys:
            return [[] for _ in keys]
        return [[b for b in found if b.visible(ts)] for found in self._blocks_for_keys(keys)]

    def blocks_for_key(self, key: Key) -> list[PersistedBlock]:
        """Every held persisted block that may hold `key`, whatever its visibility (a
        scan's point lookup filters by its timestamp): a superset, the block's keys decide."""
        return self._blocks_for_keys([key])[0]

    def _blocks_for_keys(self, keys: Sequence[Key]) -> list[list[PersistedBlock]]:
        index = self.key_index
        out: list[list[PersistedBlock]] = []
        if len(index):
            if len(keys) <= KEY_LOOKUPS_ONE_BY_ONE_MAX:
                per_key = [index.blocks_for_hash(key_hash(k)) for k in keys]
            else:
                hashes = np.fromiter((key_hash(k) for k in keys), np.uint64, count=len(keys))
                per_key = index.blocks_for_hashes(hashes)
            blocks = self.blocks
            for ids in per_key:
                found = []
                for block_id in ids:
                    block = blocks[block_id]
                    assert isinstance(block, PersistedBlock)
                    found.append(block)
                out.append(found)
        else:
            out = [[] for _ in keys]
        if self._unindexed:
            ranges = self._key_ranges()
            for key, found in zip(keys, out, strict=True):
                found.extend(ranges.holding(key))
        return out

    def change_candidates_many(
        self, keys: Sequence[Key], start_ts: int
    ) -> list[list[PersistedBlock]]:
        """For each key, the persisted blocks that may hold a version of it inserted or
        deleted after `start_ts` (`last_change_after` needs their keys and commit_ts
        column): every held one that may hold it and was not dropped at or before
        `start_ts`."""
        return [[b for b in f if b.drop_ts > start_ts] for f in self._blocks_for_keys(keys)]

    def last_change_after(
        self,
        key: Key,
        start_ts: int,
        now_ts: int,
        candidates: Sequence[PersistedBlock],
        loaded: LoadedBlocks,
    ) -> tuple[int, bool] | None:
        """(commit_ts, live at `now_ts`) of the newest commit in (start_ts, now_ts] that
        inserted or deleted `key`, or None: what the conflict index would have said of a
        transaction that started at `start_ts`, from the rows themselves (issue 21: a
        snapshot below the index's floor is checked exactly, never refused). `candidates`
        are `change_candidates_many([key], start_ts)[0]`; `loaded` holds their keys and their
        `__commit_ts` column.

        Every change is on a held block: a version inserted after `start_ts` keeps its
        commit_ts through flushes and merges (`__commit_ts`; 0 in a large transaction's
        object: the block's create_ts); a delete after `start_ts` is a node of the block the
        row was in, which stays held while a snapshot at `start_ts` is open. A rewrite
        copies deletes that landed on its inputs meanwhile onto its outputs at its own
        commit_ts (the block's create_ts): a copy, not a change, so skipped."""
        newest = 0
        for row_id in self._l0_row_ids(key):
            block = self.blocks[row_id >> _OFFSET_BITS]
            assert isinstance(block, L0Block)
            offset = row_id & _OFFSET_MASK
            inserted = block.commit_ts_of(offset)
            if start_ts < inserted <= now_ts:
                newest = max(newest, inserted)
            deleted = block.deletes.ts_of.get(offset)
            if deleted is not None and start_ts < deleted <= now_ts:
                newest = max(newest, deleted)
        for block in candidates:
            found = loaded.keys(block).find(key)
            if found is None:
                continue
            stamp = loaded.columns(block).column(COMMIT_TS_COLUMN)[found].as_py()
            inserted = stamp or block.create_ts
            if start_ts < inserted <= now_ts:
                newest = max(newest, inserted)
            deleted = block.deletes.ts_of.get(found)
            copied = deleted == block.create_ts and inserted < block.create_ts
            if deleted is not None and not copied and start_ts < deleted <= now_ts:
                newest = max(newest, deleted)
        if not newest:
            return None
        visible = [b for b in candidates if b.visible(now_ts)]
        live = self.version_among(key, now_ts, visible, loaded) is not None
        return newest, live

    def unindexed_blocks(self) -> list[PersistedBlock]:
        """Held persisted blocks the key index lacks and could take (their ids fit)."""
        return [b for b in self._unindexed.values() if KeyIndex.fits(b.block_id)]

    def index_block(self, block_id: int, hashes: U64Array) -> bool:
        """Put a block in the key index, by the `key_hash` of each of its keys (read from
        its object by the shell). False when the block is no longer waiting for it
        (collected meanwhile, or indexed already)."""
        block = self._unindexed.get(block_id)
        if block is None or not KeyIndex.fits(block_id):
            return False
        assert len(hashes) == block.rows, "a block's keys are its rows"
        self.key_index.add(block_id, hashes)
        del self._unindexed[block_id]
        self._ranges = None
        return True

    def _key_ranges(self) -> KeyRanges:
        if self._ranges is None:
            self._ranges = KeyRanges(list(self._unindexed.values()))
        return self._ranges

    def version_at(self, key: Key, ts: int, loaded: LoadedBlocks) -> RowVersion | None:
        """The version of `key` visible at `ts`, or None. `loaded` holds the keys (and
        blooms) of `key_candidates(key, ts)`."""
        if not self.persisted_held:
            return self.version_among(key, ts, [], loaded)
        candidates = []
        for candidate in self.key_candidates(key, ts):
            bloom = candidate.bloom or loaded.bloom(candidate)
            if bloom is None or bloom.might_contain(key):
                candidates.append(candidate)
        return self.version_among(key, ts, candidates, loaded)

    def version_among(
        self, key: Key, ts: int, candidates: list[PersistedBlock], loaded: LoadedBlocks
    ) -> RowVersion | None:
        """`version_at`, searching persisted blocks among `candidates` only (those whose
        key range and bloom filter may hold `key`, the caller asked; `loaded` holds their
        keys)."""
        for row_id in reversed(self._l0_row_ids(key)):
            block = self.blocks[row_id >> _OFFSET_BITS]
            if not block.visible(ts):
                continue
            assert isinstance(block, L0Block)
            offset = row_id & _OFFSET_MASK
            if block.commit_ts_of(offset) > ts or block.deletes.dead_at(offset, ts):
                continue
            return RowVersion(block.block_id, offset)
        for candidate in candidates:
            found = loaded.keys(candidate).find(key)
            if found is not None and not candidate.deletes.dead_at(found, ts):
                return RowVersion(candidate.block_id, found)
        return None

    def row(self, version: RowVersion, loaded: LoadedBlocks) -> dict[str, object]:
        block = self.blocks[version.block_id]
        if isinstance(block, L0Block):
            return block.row(version.offset)
        table = loaded.columns(block).select(self.arrow_schema.names)
        rows: list[dict[str, object]] = table.slice(version.offset, 1).to_pylist()
        return rows[0]

    def scan_blocks(
        self, ts: int, pruned: Callable[[PersistedBlock], bool] | None = None
    ) -> list[Block]:
        """The blocks a scan at `ts` reads, in id order; `pruned(block)` drops a persisted
        block the scan's filter cannot match (its zonemap)."""
        out: list[Block] = []
        for block in self.blocks.values():
            if not block.visible(ts):
                continue
            if isinstance(block, PersistedBlock) and pruned is not None and pruned(block):
                continue
            out.append(block)
        return out

    def prune(self, blocks: list[PersistedBlock], filter_: pc.Expression) -> list[PersistedBlock]:
        """The blocks whose zonemaps let them hold a row matching `filter_` (decision 0006):
        comparisons with numbers in microseconds (engine/storage/pruning.py); any other
        filter through pyarrow's simplification when the blocks are few, else no pruning."""
        node = pruning.parse(filter_)
        if node is None:
            if len(blocks) > PRUNE_BY_PYARROW_BLOCKS_MAX:
                return blocks
            return [blocks[i] for i in zonemap_prune([b.zonemap for b in blocks], filter_)]
        key = tuple(id(b) for b in blocks)
        if self._bounds is None or self._bounds[0] != key:
            self._bounds = (key, pruning.Bounds([b.zonemap for b in blocks]))
        mask = pruning.may_match(node, self._bounds[1])
        return [block for block, keep in zip(blocks, mask.tolist(), strict=True) if keep]

    def arrow_subset(self, names: list[str]) -> pa.Schema:
        """The Arrow schema of the columns `names` (the table's own when all of them)."""
        schema = self.arrow_schema
        if names == schema.names:
            return schema
        return pa.schema([schema.field(name) for name in names])

    def l0_blocks(self) -> list[L0Block]:
        return [b for b in self.blocks.values() if isinstance(b, L0Block)]

    def persisted_blocks(self) -> list[PersistedBlock]:
        return [b for b in self.blocks.values() if isinstance(b, PersistedBlock)]
