"""The conflict index: what committed (or is committing) since the oldest open snapshot,
key by key, so a commit checks only its own keys.

Why (seed "Transaction Processing": conflict detection "will not gradually decline with the
growth of table data"; issue 13): a transaction that started at `start_ts` conflicts with the
changes committed in (start_ts, now]. The index maps every key written in that window to the
commit_ts of its last writer (and, for a row key, whether that writer left the key live), so
a commit costs one dict lookup per key it wrote, never a table scan.

Keys are tuples: `(table_id, primary_key)` for a row, and tagged tuples for the catalog
(`catalog_*` below).

Bounded: writes at or below the oldest open snapshot are forgotten (`prune`); and when more
than `keys_max` row keys are remembered, the oldest visible changes of rows are forgotten
anyway and `floor_ts` rises past them: memory stays bounded however long a transaction stays
open. A transaction whose snapshot is below `floor_ts` is not refused for that (issue 21: a
transaction is never refused for the index's own bookkeeping): the engine checks its row
keys exactly against the table data up to the visible timestamp first
(engine/old_snapshots.py) and passes that timestamp as `checked_ts`; the index answers for
what is newer (the floor never passes the visible timestamp). Catalog keys (guards and
marks) are never forgotten for size, only by age: one per catalog object changed since the
oldest open snapshot (each table's `table-rows` mark is one key, rewritten by every commit),
so they are always checked here.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from engine.errors import DuplicateKey, WriteConflict

ConflictKey = Hashable


def catalog_db_name(name: str) -> ConflictKey:
    return ("db-name", name)


def catalog_db_drop(db_id: int) -> ConflictKey:
    return ("db-drop", db_id)


def catalog_db_ddl(db_id: int) -> ConflictKey:
    """Marked by every create or drop of a table in the database."""
    return ("db-ddl", db_id)


def catalog_table_name(db_id: int, name: str) -> ConflictKey:
    return ("table-name", db_id, name)


def catalog_table_drop(table_id: int) -> ConflictKey:
    return ("table-drop", table_id)


def catalog_table_rows(table_id: int) -> ConflictKey:
    """Marked by every commit that writes rows of the table."""
    return ("table-rows", table_id)


class RowWrite(NamedTuple):
    """A row key a transaction wrote. `insert_only`: the key was not live in the
    transaction's view (a plain insert); `live_after`: the key is live once it commits.
    A tuple, not a dataclass: one is made per written key of every commit, and a frozen
    dataclass costs several times as much to build (issue 21)."""

    key: ConflictKey
    insert_only: bool
    live_after: bool


class BulkInsert:
    """The keys a large transaction inserted into one table (its rows spilled to objects
    before commit, issue 14 "Large transactions"), sorted: checked against other commits
    by binary search instead of a dict entry per key (millions of keys would cost the index
    a hundred bytes each)."""

    __slots__ = ("_array", "_list", "live_after", "table_id")

    def __init__(
        self, table_id: int, keys: np.ndarray | list[object], *, live_after: bool = True
    ) -> None:
        self.table_id = table_id
        self.live_after = live_after
        """True for inserted keys (insert-only, live after the commit); False for the keys
        a large transaction deleted (issue 20: deletes as large as inserts)."""
        self._array: np.ndarray | None = keys if isinstance(keys, np.ndarray) else None
        self._list: list[object] | None = None if isinstance(keys, np.ndarray) else keys

    def __len__(self) -> int:
        return len(self._array) if self._array is not None else len(self._list or ())

    def __contains__(self, key: object) -> bool:
        if self._array is not None:
            if type(key) is not int or not -(1 << 63) <= key < (1 << 63):
                return False
            at = int(np.searchsorted(self._array, key))
            return at < len(self._array) and int(self._array[at]) == key
        keys: list[Any] = self._list or []
        at = bisect.bisect_left(keys, key)
        return bool(at < len(keys) and keys[at] == key)

    def first_common(self, other: BulkInsert) -> object | None:
        """A key both hold, or None."""
        if self._array is not None and other._array is not None:
            common = np.intersect1d(self._array, other._array, assume_unique=True)
            return int(common[0]) if len(common) else None
        small, large = (self, other) if len(self) <= len(other) else (other, self)
        for key in small.key_list():
            if key in large:
                return key
        return None

    def key_list(self) -> list[object]:
        if self._array is not None:
            return [int(k) for k in self._array]
        assert self._list is not None
        return self._list


@dataclass(frozen=True, slots=True)
class KeyConflict:
    key: ConflictKey
    commit_ts: int
    duplicate: bool
    """True when an insert-only key is live after a concurrent commit: a DuplicateKey."""


@dataclass(frozen=True, slots=True)
class SnapshotTooOld:
    start_ts: int
    floor_ts: int


class ConflictIndex:
    __slots__ = (
        "_bulk",
        "_catalog",
        "_catalog_log",
        "_last",
        "_log",
        "_size",
        "floor_ts",
        "keys_max",
    )

    def __init__(self, *, keys_max: int, floor_ts: int = 0) -> None:
        assert keys_max > 0
        self.keys_max = keys_max
        self.floor_ts = floor_ts
        """Row changes at or below it may be forgotten (catalog ones never are for size)."""
        self._last: dict[ConflictKey, tuple[int, bool]] = {}
        self._log: deque[tuple[int, tuple[ConflictKey, ...]]] = deque()
        self._catalog: dict[ConflictKey, int] = {}
        """Catalog key -> commit_ts of its last mark."""
        self._catalog_log: deque[tuple[int, tuple[ConflictKey, ...]]] = deque()
        self._bulk: deque[tuple[int, BulkInsert]] = deque()
        self._size = 0

    def __len__(self) -> int:
        return len(self._last) + len(self._catalog)

    def check(
        self,
        start_ts: int,
        rows: Iterable[RowWrite],
        guards: Iterable[ConflictKey],
        bulk: Sequence[BulkInsert] = (),
        checked_ts: int = 0,
    ) -> KeyConflict | SnapshotTooOld | None:
        """The first conflict of a transaction that started at `start_ts`, or None. `bulk`:
        the keys it inserted as spilled rows (insert-only, live after). `checked_ts`: its row
        and bulk keys were checked against the table data for changes in (start_ts,
        checked_ts] (a snapshot below `floor_ts`); `SnapshotTooOld` only if that does not
        reach the floor (a caller's bug: the floor never passes the visible timestamp)."""
        if max(start_ts, checked_ts) < self.floor_ts:
            return SnapshotTooOld(start_ts, self.floor_ts)
        last = self._last
        recent_bulk = [(ts, b) for ts, b in self._bulk if ts > start_ts]
        for row in rows:
            seen = last.get(row.key)
            if seen is not None and seen[0] > start_ts:
                return KeyConflict(row.key, seen[0], duplicate=row.insert_only and seen[1])
            if recent_bulk:
                row_key: Any = row.key
                for ts, written in recent_bulk:
                    if written.table_id == row_key[0] and row_key[1] in written:
                        duplicate = row.insert_only and written.live_after
                        return KeyConflict(row.key, ts, duplicate=duplicate)
        for mine in bulk:
            for ts, written in recent_bulk:
                if written.table_id == mine.table_id:
                    common = mine.first_common(written)
                    if common is not None:
                        duplicate = mine.live_after and written.live_after
                        return KeyConflict((mine.table_id, common), ts, duplicate=duplicate)
            for key, seen in last.items():
                if (
                    seen[0] > start_ts
                    and type(key) is tuple
                    and len(key) == 2
                    and key[0] == mine.table_id
                    and key[1] in mine
                ):
                    return KeyConflict(key, seen[0], duplicate=mine.live_after and seen[1])
        catalog = self._catalog
        for key in guards:
            marked = catalog.get(key)
            if marked is not None and marked > start_ts:
                return KeyConflict(key, marked, duplicate=False)
        return None

    def record(
        self,
        commit_ts: int,
        rows: Iterable[RowWrite],
        marks: Iterable[ConflictKey],
        bulk: Sequence[BulkInsert] = (),
    ) -> list[tuple[ConflictKey, tuple[int, bool] | None]]:
        """Remember the keys of a commit; returns what it replaced, for `undo`."""
        for written in bulk:
            assert not self._bulk or self._bulk[-1][0] <= commit_ts
            self._bulk.append((commit_ts, written))
            self._size += len(written)
        last = self._last
        replaced: list[tuple[ConflictKey, tuple[int, bool] | None]] = []
        keys: list[ConflictKey] = []
        for row in rows:
            replaced.append((row.key, last.get(row.key)))
            last[row.key] = (commit_ts, row.live_after)
            keys.append(row.key)
        if keys:
            assert not self._log or self._log[-1][0] < commit_ts
            self._log.append((commit_ts, tuple(keys)))
            self._size += len(keys)
        catalog = self._catalog
        marked: list[ConflictKey] = []
        for key in marks:
            previous = catalog.get(key)
            replaced.append((key, None if previous is None else (previous, True)))
            catalog[key] = commit_ts
            marked.append(key)
        if marked:
            assert not self._catalog_log or self._catalog_log[-1][0] < commit_ts
            self._catalog_log.append((commit_ts, tuple(marked)))
        return replaced

    def undo(
        self, commit_ts: int, replaced: list[tuple[ConflictKey, tuple[int, bool] | None]]
    ) -> None:
        """Forget the last `record` (its commit was cancelled before anything followed)."""
        while self._bulk and self._bulk[-1][0] == commit_ts:
            self._size -= len(self._bulk.pop()[1])
        if not replaced:
            return
        if self._catalog_log and self._catalog_log[-1][0] == commit_ts:
            _, marked = self._catalog_log.pop()
            for key in marked:
                del self._catalog[key]
        else:
            marked = ()
        if self._log and self._log[-1][0] == commit_ts:
            _, keys = self._log.pop()
            self._size -= len(keys)
        rows = len(replaced) - len(marked)
        for key, previous in reversed(replaced[rows:]):
            if previous is not None:
                self._catalog[key] = previous[0]
        for key, previous in reversed(replaced[:rows]):
            if previous is None:
                del self._last[key]
            else:
                self._last[key] = previous

    def prune(self, oldest_snapshot_ts: int, visible_ts: int) -> None:
        """Forget changes no open or future transaction can conflict with (commit_ts <=
        the oldest open snapshot), then, while more than `keys_max` keys are remembered, the
        oldest ones (raising `floor_ts` past them), but never a change above `visible_ts`.

        Why in this order (issue 21's cliff: 64 writers after a 1.5M-row load got practically
        nothing but "snapshot too old"): the size test once ran over the row log before the
        stale bulk inserts were forgotten by age, so it dropped every recent row key, commits
        still in flight among them, and raised the floor above the visible timestamp: every
        new transaction starts at `visible_ts` and was refused until those commits landed,
        while the writers' retries spun the event loop. Now what age forgets goes first, and
        the floor never passes `visible_ts` (in-flight commits are few: the commit queue is
        bounded), so a transaction begun now is never refused for the index's bookkeeping."""
        assert oldest_snapshot_ts <= visible_ts
        log, bulk = self._log, self._bulk
        while log and log[0][0] <= oldest_snapshot_ts:
            self._forget_row_keys()
        catalog_log, catalog = self._catalog_log, self._catalog
        while catalog_log and catalog_log[0][0] <= oldest_snapshot_ts:
            commit_ts, marked = catalog_log.popleft()
            for key in marked:
                if catalog.get(key) == commit_ts:
                    del catalog[key]
        while bulk and bulk[0][0] <= oldest_snapshot_ts:
            self._size -= len(bulk.popleft()[1])
        while self._size > self.keys_max:
            row_ts = log[0][0] if log else None
            bulk_ts = bulk[0][0] if bulk else None
            if bulk_ts is not None and (row_ts is None or bulk_ts <= row_ts):
                if bulk_ts > visible_ts:
                    break
                self._size -= len(bulk.popleft()[1])
                self.floor_ts = max(self.floor_ts, bulk_ts)
            elif row_ts is not None:
                if row_ts > visible_ts:
                    break
                self._forget_row_keys()
                self.floor_ts = max(self.floor_ts, row_ts)
            else:
                break

    def _forget_row_keys(self) -> None:
        """Forget the oldest commit's row and catalog keys (unless rewritten since)."""
        commit_ts, keys = self._log.popleft()
        self._size -= len(keys)
        last = self._last
        for key in keys:
            seen = last.get(key)
            if seen is not None and seen[0] == commit_ts:
                del last[key]


def conflict_error(
    conflict: KeyConflict | SnapshotTooOld, table_name: Callable[[int], str]
) -> Exception:
    """The engine's error for a conflict the index found (`table_name` names a table id)."""
    if isinstance(conflict, SnapshotTooOld):
        return WriteConflict(
            f"snapshot too old: start_ts {conflict.start_ts} is below the conflict index's "
            f"floor {conflict.floor_ts}"
        )
    key = conflict.key
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], int):
        if conflict.duplicate:
            return DuplicateKey(table_name(key[0]), key[1])
        return WriteConflict(
            f"key {key[1]!r} of {table_name(key[0])} was written by a commit at "
            f"{conflict.commit_ts}"
        )
    return WriteConflict(f"{key} changed by a commit at {conflict.commit_ts}")
