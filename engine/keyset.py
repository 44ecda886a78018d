"""The keys a transaction deleted from one table, held compactly (issue 20).

Why: a workspace used to keep a dict entry and a `RowVersion` per deleted key (about 200
bytes each), which is why deletes were capped at 100,000 rows. What a transaction needs of
its deleted keys is membership (a get, an insert or a delete of the same key later in the
transaction) and, at commit, the keys for the conflict check. So integer keys that fit in
int64 (the common primary key) are kept in a sorted numpy array, 8 bytes each, merged in
from a small set every `_MERGE_AT` keys; other keys (strings, compound keys) stay in a set.
The rows themselves are named by the block masks (`workspace.TableWrites.deleted_by_block`).

A pure data structure: no I/O, no engine state.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from engine.schema import Key

_MERGE_AT = 8192
"""Keys gathered in the set before its integers are sorted into an array. The arrays merge
geometrically (`_merge`), so every key is copied O(log n) times however many there are."""


_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class KeySet:
    """A set of keys, integers in int64 range stored in sorted numpy arrays."""

    __slots__ = ("_arrays", "_recent", "_recent_ints", "_size")

    def __init__(self) -> None:
        self._recent: set[Key] = set()
        """Keys not yet merged into an array, and every key that is not an int64."""
        self._arrays: list[np.ndarray] = []
        """Sorted int64 arrays, disjoint; each at least twice the length of the next (a
        log-structured merge: every key is copied O(log n) times, never O(n))."""
        self._recent_ints = 0
        """How many of `_recent` are int64s (a merge is due at `_MERGE_AT` of them: other
        keys never leave the set, and must not make every addition try a merge)."""
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __contains__(self, key: object) -> bool:
        if key in self._recent:
            return True
        if type(key) is not int or not _INT64_MIN <= key <= _INT64_MAX:
            return False
        for array in self._arrays:
            at = int(np.searchsorted(array, key))
            if at < len(array) and int(array[at]) == key:
                return True
        return False

    def contains_many(self, keys: list[Key]) -> list[bool]:
        """`[key in self for key in keys]`, one numpy pass per array when the keys are
        int64s (an update's insert asks this of every key it deleted)."""
        if not self._arrays or not keys:
            recent = self._recent
            return [key in recent for key in keys]
        try:
            probe = np.fromiter(keys, dtype=np.int64, count=len(keys))
        except (TypeError, ValueError, OverflowError):
            return [key in self for key in keys]
        if any(type(key) is not int for key in keys):  # floats, bools convert too
            return [key in self for key in keys]
        found = np.zeros(len(keys), dtype=bool)
        for array in self._arrays:
            found |= np.isin(probe, array, assume_unique=False)
        if self._recent:
            recent = self._recent
            return [bool(hit) or key in recent for hit, key in zip(found, keys, strict=True)]
        out: list[bool] = found.tolist()
        return out

    def add_new(self, keys: Iterable[Key]) -> None:
        """Add keys the set does not hold (the caller checked each; a programmer error
        otherwise, caught by the size assertion at the next merge)."""
        recent = self._recent
        for key in keys:
            recent.add(key)
            self._size += 1
            if type(key) is int and _INT64_MIN <= key <= _INT64_MAX:
                self._recent_ints += 1
                if self._recent_ints >= _MERGE_AT:
                    self._merge()

    def _merge(self) -> None:
        ints = [k for k in self._recent if type(k) is int and _INT64_MIN <= k <= _INT64_MAX]
        self._recent_ints = 0
        merged = np.sort(np.fromiter(ints, dtype=np.int64, count=len(ints)))
        self._recent.difference_update(ints)
        arrays = self._arrays
        while arrays and len(arrays[-1]) <= 2 * len(merged):
            merged = np.union1d(arrays.pop(), merged)  # sorted; the two are disjoint
        arrays.append(merged)
        assert self._size == len(self._recent) + sum(len(a) for a in arrays)

    def __iter__(self) -> Iterator[Key]:
        for array in self._arrays:
            yield from (int(k) for k in array)
        yield from self._recent

    def sorted_keys(self) -> np.ndarray | list[Key]:
        """Every key, sorted: an int64 array when every key is an int64, else a list (the
        form `conflicts.BulkInsert` takes)."""
        if not self._recent:
            if not self._arrays:
                return np.empty(0, dtype=np.int64)
            return np.sort(np.concatenate(self._arrays))
        self._merge_all_ints()
        if not self._recent:
            return np.sort(np.concatenate(self._arrays))
        if self._arrays:
            return sorted([*self._recent, *(int(k) for a in self._arrays for k in a)])
        return sorted(self._recent)

    def _merge_all_ints(self) -> None:
        ints = [k for k in self._recent if type(k) is int and _INT64_MIN <= k <= _INT64_MAX]
        if len(ints) != len(self._recent):
            return
        self._arrays.append(np.sort(np.fromiter(ints, dtype=np.int64, count=len(ints))))
        self._recent.clear()
        self._recent_ints = 0
