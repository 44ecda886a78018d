"""The conflict index below its floor (engine/conflicts.py, issue 21): what the engine's
exact check hands it (`checked_ts`) and what it never forgets for size.

Proves, with no engine (the index and the pipeline driven directly): a snapshot below the
floor is let through once its rows were checked up to a timestamp at or above the floor, and
the index still finds the conflicts newer than that; catalog marks (what guards check: a
table dropped, a name taken) survive the size-based forgetting that raises the floor, so a
guard is always checked exactly; `undo` takes back a commit's marks and rows alike.
"""

from __future__ import annotations

import itertools

from engine.conflicts import (
    ConflictIndex,
    KeyConflict,
    RowWrite,
    SnapshotTooOld,
    catalog_table_drop,
    catalog_table_rows,
)


def upd(key: int) -> RowWrite:
    return RowWrite((1, key), insert_only=False, live_after=True)


def fill(index: ConflictIndex, ts: itertools.count[int], keys: range) -> int:
    commit_ts = 0
    for key in keys:
        commit_ts = next(ts)
        index.record(commit_ts, [upd(key)], [catalog_table_rows(1)])
    return commit_ts


def test_checked_ts_at_the_floor_lets_an_old_snapshot_through_and_newer_conflicts_count() -> None:
    index, ts = ConflictIndex(keys_max=3), itertools.count(10)
    dropped_at = next(ts)
    index.record(dropped_at, [], [catalog_table_drop(7)])
    last = fill(index, ts, range(8))
    index.prune(oldest_snapshot_ts=0, visible_ts=last)
    floor = index.floor_ts
    assert floor > 5
    assert isinstance(index.check(5, [upd(100)], ()), SnapshotTooOld)
    assert index.check(5, [upd(100)], (), checked_ts=floor - 1) == SnapshotTooOld(5, floor)
    assert index.check(5, [upd(100)], (), checked_ts=floor) is None
    # Key 7 was written at `last` (> floor): still remembered, still a conflict.
    found = index.check(5, [upd(7)], (), checked_ts=floor)
    assert isinstance(found, KeyConflict) and found.commit_ts == last
    # The table-drop mark at 10 was never forgotten for size: the guard still sees it.
    guarded = index.check(5, [], [catalog_table_drop(7)], checked_ts=floor)
    assert isinstance(guarded, KeyConflict) and guarded.commit_ts == dropped_at
    # Forgotten by age only: once no snapshot is that old.
    index.prune(oldest_snapshot_ts=dropped_at, visible_ts=last)
    assert index.check(dropped_at, [], [catalog_table_drop(7)], checked_ts=floor) is None


def test_undo_takes_back_marks_and_rows() -> None:
    index, ts = ConflictIndex(keys_max=100), itertools.count(10)
    first = next(ts)
    index.record(first, [upd(1)], [catalog_table_rows(1)])
    second = next(ts)
    replaced = index.record(
        second, [upd(1), upd(2)], [catalog_table_rows(1), catalog_table_drop(1)]
    )
    index.undo(second, replaced)
    assert (
        index.check(first, [upd(1), upd(2)], [catalog_table_rows(1), catalog_table_drop(1)]) is None
    )
    found = index.check(first - 1, [], [catalog_table_rows(1)])
    assert isinstance(found, KeyConflict) and found.commit_ts == first
    assert len(index) == 2  # row key 1 and the table-rows mark
