"""The key ranges of persisted blocks, for the blocks a table's key index does not hold yet
(engine/storage/keyindex.py: restored or replayed blocks until maintenance reads their keys):
which of them may hold a key, by range alone."""

from __future__ import annotations

import numpy as np

from engine.schema import Key
from engine.storage.blocks import PersistedBlock


class KeyRanges:
    """The key ranges of a table's persisted blocks, for point reads: vectorized over numpy
    for a one-column integer key (thousands of blocks in microseconds), a loop otherwise."""

    __slots__ = ("_blocks", "_maxs", "_mins")

    def __len__(self) -> int:
        return len(self._blocks)

    def __init__(self, blocks: list[PersistedBlock]) -> None:
        self._blocks = blocks
        self._mins: np.ndarray | None = None
        self._maxs: np.ndarray | None = None
        if blocks and all(type(b.key_min) is int and type(b.key_max) is int for b in blocks):
            try:
                self._mins = np.asarray([b.key_min for b in blocks], dtype=np.int64)
                self._maxs = np.asarray([b.key_max for b in blocks], dtype=np.int64)
            except OverflowError:  # uint64 keys past int64
                self._mins = self._maxs = None

    def holding(self, key: Key) -> list[PersistedBlock]:
        if self._mins is not None and self._maxs is not None and type(key) is int:
            if not -(1 << 63) <= key < (1 << 63):
                return []
            hits = np.flatnonzero((self._mins <= key) & (key <= self._maxs))
            return [self._blocks[i] for i in hits]
        out = []
        for block in self._blocks:
            try:
                if block.may_hold(key):
                    out.append(block)
            except TypeError:  # a key of another type cannot be in the block
                continue
        return out
