"""Where the rows of a block went when a flush, merge or compaction dropped it (decision 0006).

A transaction that deleted a row of a block before a rewrite swapped it out, and commits after
the swap, has its delete re-resolved at prepare through the rewrite's position map: exact, no
key searched for. Registered at the rewrite's prepare (the reserved side: the swap may still
be on its way to the log), forgotten when the dropped block is collected.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap

from engine import limits


@dataclass(slots=True)
class Move:
    """Where the rows of a dropped block went (for deletes prepared after the move)."""

    positions: np.ndarray
    output_ids: list[int]


class Moves:
    """input block id -> its Move, for blocks a prepared rewrite drops (reserved side:
    registered at the rewrite's prepare, forgotten when the block is collected)."""

    def __init__(self) -> None:
        self._moves: dict[int, Move] = {}

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._moves

    def __len__(self) -> int:
        return len(self._moves)

    def register(self, block_id: int, move: Move) -> None:
        assert block_id not in self._moves
        self._moves[block_id] = move

    def forget(self, block_id: int) -> None:
        self._moves.pop(block_id, None)

    def resolve_row(self, block_id: int, offset: int) -> tuple[int, int] | None:
        """Where row `offset` of `block_id` is now, as (block_id, offset), following moves of
        moves; None when it did not survive a move. `resolve`, row by row: a delete's keys
        follow its rows (issue 23)."""
        for _ in range(64):
            move = self._moves.get(block_id)
            if move is None:
                return block_id, offset
            position = int(move.positions[offset])
            if position < 0:
                return None
            index, offset = divmod(position, limits.BLOCK_ROWS_MAX)
            block_id = move.output_ids[index]
        raise AssertionError("a cycle of moves")

    def resolve(self, block_id: int, offsets: BitMap) -> dict[int, BitMap] | None:
        """Where `offsets` of `block_id` are now (following moves of moves), or None when
        one of them did not survive a move (it was dead at that rewrite's snapshot)."""
        pending = {block_id: offsets}
        out: dict[int, BitMap] = {}
        hops = 0
        while pending:
            hops += 1
            assert hops <= 64, "a cycle of moves"
            next_pending: dict[int, BitMap] = {}
            for source, rows in pending.items():
                move = self._moves.get(source)
                if move is None:
                    out.setdefault(source, BitMap()).update(rows)
                    continue
                for offset in rows:
                    position = int(move.positions[offset])
                    if position < 0:
                        return None
                    index, at = divmod(position, limits.BLOCK_ROWS_MAX)
                    next_pending.setdefault(move.output_ids[index], BitMap()).add(at)
            pending = next_pending
        return out
