"""What the scan's key path (engine/scan.py) asks of a table's blocks, kept between scans:
the persisted blocks' key ranges and lifetimes as numpy arrays (which blocks a snapshot sees
whose key range meets `[lo, hi]`: thousands of blocks in microseconds, for a one-column
integer key), and the list of L0 blocks (so a key scan does not walk the persisted ones).

Each is rebuilt when the table's blocks changed, told by a mark rather than a hook in every
change: (next_block_id, blocks held, persisted_count, persisted_held) never repeats, since a
create raises next_block_id, a drop lowers persisted_count and a collect lowers the blocks
held, and without a create neither count rises again. Kept per `TableData` in weak maps, so
a dropped table's go with it. Like `TableData`, used on the engine's loop only."""

from __future__ import annotations

import weakref

import numpy as np

from engine.storage.blocks import L0Block, PersistedBlock
from engine.storage.table import TableData


class ScanRanges:
    __slots__ = ("_blocks", "_creates", "_drops", "_maxs", "_mins")

    def __init__(self, blocks: list[PersistedBlock]) -> None:
        self._blocks = blocks
        self._creates = np.asarray([b.create_ts for b in blocks], dtype=np.uint64)
        self._drops = np.asarray([b.drop_ts for b in blocks], dtype=np.uint64)
        self._mins: np.ndarray | None = None
        self._maxs: np.ndarray | None = None
        if all(type(b.key_min) is int and type(b.key_max) is int for b in blocks):
            try:
                self._mins = np.asarray([b.key_min for b in blocks], dtype=np.int64)
                self._maxs = np.asarray([b.key_max for b in blocks], dtype=np.int64)
            except OverflowError:  # uint64 keys past int64
                self._mins = self._maxs = None

    def __len__(self) -> int:
        return len(self._blocks)

    def visible_count(self, ts: int) -> int:
        """How many of the blocks a snapshot at `ts` sees."""
        return int(np.count_nonzero((self._creates <= ts) & (ts < self._drops)))

    def meeting(self, lo: int, hi: int, ts: int) -> list[PersistedBlock] | None:
        """The blocks visible at `ts` whose key range meets `[lo, hi]`, in id order; None
        when the keys are not integers this can compare."""
        if self._mins is None or self._maxs is None:
            return None
        hits = np.flatnonzero(
            (self._mins <= hi) & (lo <= self._maxs) & (self._creates <= ts) & (ts < self._drops)
        )
        return [self._blocks[i] for i in hits]


_RANGES: weakref.WeakKeyDictionary[TableData, tuple[tuple[int, ...], ScanRanges]] = (
    weakref.WeakKeyDictionary()
)
_L0: weakref.WeakKeyDictionary[TableData, tuple[tuple[int, ...], list[L0Block]]] = (
    weakref.WeakKeyDictionary()
)


def key_range_blocks(
    data: TableData, lo: int, hi: int, ts: int
) -> tuple[list[PersistedBlock], int] | None:
    """For a scan at `ts` bounded to keys in `[lo, hi]`: the persisted blocks whose key range
    meets it, in id order, and how many persisted blocks the snapshot sees in all; None when
    the key is not one integer column."""
    mark = (data.next_block_id, len(data.blocks), data.persisted_count, data.persisted_held)
    found = _RANGES.get(data)
    if found is None or found[0] != mark:
        held = [b for b in data.blocks.values() if isinstance(b, PersistedBlock)]
        found = (mark, ScanRanges(held))
        _RANGES[data] = found
    ranges = found[1]
    blocks = ranges.meeting(lo, hi, ts)
    if blocks is None:
        return None
    return blocks, ranges.visible_count(ts)


def memory_blocks(data: TableData, ts: int) -> list[L0Block]:
    """The L0 blocks a scan at `ts` reads, in id order."""
    mark = (data.next_block_id, len(data.blocks))
    found = _L0.get(data)
    if found is None or found[0] != mark:
        found = (mark, [b for b in data.blocks.values() if isinstance(b, L0Block)])
        _L0[data] = found
    return [b for b in found[1] if b.visible(ts)]
