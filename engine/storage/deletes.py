"""The delete nodes of one block: which offsets died at which commit timestamp.

Why nodes (the seed's TAE "MVCC": a block's deletes are a chain of delete nodes, one per
committing transaction): a reader at `ts` sees the union of the nodes committed at or before
`ts`, so deletes never change a past snapshot; the newest reader (the common case) reads one
cached union. `ts_of` answers "is this offset dead at ts" in one dict lookup (point reads).
"""

from __future__ import annotations

import bisect

from pyroaring import BitMap, FrozenBitMap


class Deletes:
    __slots__ = ("_node_ts", "all", "nodes", "ts_of")

    def __init__(self) -> None:
        self.nodes: list[tuple[int, FrozenBitMap]] = []
        """(commit_ts, offsets), commit_ts ascending."""
        self._node_ts: list[int] = []
        self.all = BitMap()
        """Every deleted offset (the union of the nodes)."""
        self.ts_of: dict[int, int] = {}
        """offset -> the commit_ts that deleted it."""

    def __len__(self) -> int:
        return len(self.all)

    @property
    def last_ts(self) -> int:
        return self._node_ts[-1] if self._node_ts else 0

    def add(self, commit_ts: int, rows: FrozenBitMap) -> None:
        """A node; the caller checked that `rows` are not deleted already."""
        assert not self._node_ts or self._node_ts[-1] < commit_ts
        assert rows.isdisjoint(self.all)
        self.nodes.append((commit_ts, rows))
        self._node_ts.append(commit_ts)
        self.all |= rows
        for offset in rows:
            self.ts_of[offset] = commit_ts

    def at(self, ts: int) -> BitMap | FrozenBitMap:
        """The offsets deleted at or before `ts` (do not modify the result)."""
        if not self._node_ts or self._node_ts[-1] <= ts:
            return self.all
        count = bisect.bisect_right(self._node_ts, ts)
        out = BitMap()
        for _, rows in self.nodes[:count]:
            out |= rows
        return out

    def since(self, ts: int) -> list[tuple[int, FrozenBitMap]]:
        """The nodes committed after `ts`."""
        return self.nodes[bisect.bisect_right(self._node_ts, ts) :]

    def dead_at(self, offset: int, ts: int) -> bool:
        deleted = self.ts_of.get(offset)
        return deleted is not None and deleted <= ts
