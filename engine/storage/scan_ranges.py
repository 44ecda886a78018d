"""The key ranges and lifetimes of a table's persisted blocks as numpy arrays, for the scan's
key path (engine/scan.py): which blocks a snapshot sees whose key range meets `[lo, hi]`,
over thousands of blocks in microseconds, for a one-column integer key. `TableData` keeps
one, rebuilt when its blocks change (`TableData._scan_ranges_now`)."""

from __future__ import annotations

import numpy as np

from engine.storage.blocks import PersistedBlock


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
