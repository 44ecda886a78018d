"""Which checkpoints the history retention window keeps: a pure core (decision 0010).

Why this shape (Delta Lake's time travel: the state at version v is a checkpoint at or below v
plus the log up to v): a snapshot at `ts` below the engine's in-memory history is served from
the newest retained checkpoint at or below `ts` and the WAL after it. So the window keeps its
**anchor**, the newest checkpoint at or below the window's start (`cutoff_ts`), every newer
checkpoint, and the WAL from the anchor on. Older checkpoints and the WAL below the anchor
cover only timestamps outside the window: they go. A window of 0 (`cutoff_ts` = `TS_MAX`)
makes the newest checkpoint the anchor: the engine before issue 24.

The count is bounded (`CKP_HISTORY_RETAINED_MAX`): past it the kept checkpoint whose
neighbours are closest in time is dropped, so the gaps stay even and the window's start (the
anchor) stays readable; a snapshot in a wider gap replays more WAL, nothing becomes wrong.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from engine import limits


@dataclass(frozen=True, slots=True)
class Kept:
    indices: tuple[int, ...]
    """Positions in the ascending `ckp_ts` list that stay, ascending."""
    anchor: int | None
    """The position of the window's anchor: the WAL is kept from its DSN on. None when every
    checkpoint is newer than the window's start: then the whole WAL is kept (history from
    the engine's first commit, if the WAL still starts there)."""


def keep(
    ckp_ts: Sequence[int],
    cutoff_ts: int,
    *,
    newest_max: int = limits.CKP_RETAINED,
    count_max: int = limits.CKP_HISTORY_RETAINED_MAX,
) -> Kept | None:
    """Which of the checkpoints at `ckp_ts` (ascending) to keep for a window starting at
    `cutoff_ts`; None when there are none. The `newest_max` newest are always kept (a
    damaged newest falls back to the one before it, decision 0006)."""
    count = len(ckp_ts)
    if count == 0:
        return None
    assert all(a < b for a, b in itertools.pairwise(ckp_ts))
    assert 1 <= newest_max <= count_max
    # The newest at or below the cutoff; None when every checkpoint is newer (all are kept).
    anchor = max((i for i, ts in enumerate(ckp_ts) if ts <= cutoff_ts), default=None)
    newest = range(max(0, count - newest_max), count)
    kept = sorted({*range(anchor or 0, count), *newest})
    fixed = {*newest} if anchor is None else {anchor, *newest}
    while len(kept) > count_max:
        # Drop the thinnable checkpoint whose neighbours are closest (ties: the older).
        best, best_gap = -1, 0
        for position in range(1, len(kept) - 1):
            if kept[position] in fixed:
                continue
            gap = ckp_ts[kept[position + 1]] - ckp_ts[kept[position - 1]]
            if best < 0 or gap < best_gap:
                best, best_gap = position, gap
        assert best >= 0, "count_max leaves room for the fixed checkpoints"
        del kept[best]
    return Kept(tuple(kept), anchor)
