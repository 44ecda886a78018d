"""`StoreJournal` keeps the newest entries in memory (pysyncobj reads each new entry back per
follower, and the last one many times per tick): what it serves from there is what the store
holds, it stays within its bounds, and a truncation or reset forgets all of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from logsvc.shard.raft.journal import (
    MEMO_BYTES_MAX,
    MEMO_ENTRIES_MAX,
    MEMO_NEWEST_KEPT,
    StoreJournal,
)
from logsvc.store import ShardStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ShardStore]:
    opened = ShardStore.open(str(tmp_path / "journal"))
    try:
        yield opened
    finally:
        opened.close()


class CountingStore:
    """The store, counting the reads that reach it."""

    def __init__(self, store: ShardStore) -> None:
        self._store = store
        self.reads = 0

    def read(self, lo: int, hi: int, max_bytes: int) -> object:
        self.reads += 1
        return self._store.read(lo, hi, max_bytes)

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


def entries(journal: StoreJournal, lo: int, hi: int) -> list[tuple[bytes, int, int]]:
    return list(journal.read(lo, hi))


def test_the_newest_entries_are_served_from_memory_as_the_store_holds_them(
    store: ShardStore,
) -> None:
    counting = CountingStore(store)
    journal = StoreJournal(counting)  # type: ignore[arg-type]
    for index in range(1, 11):
        journal.add(b"c%d" % index, index, 1)
    assert entries(journal, 1, 11) == [(b"c%d" % i, i, 1) for i in range(1, 11)]
    assert journal[-1] == (b"c10", 10, 1) and journal.entry(3) == (b"c3", 3, 1)
    assert counting.reads == 0, "the newest entries were read back from the store"
    stored = store.read(1, 11, 1 << 20)
    assert entries(journal, 1, 11) == [(e.payload, e.index, e.term) for e in stored]


def test_a_truncation_forgets_what_was_kept(store: ShardStore) -> None:
    journal = StoreJournal(store)
    for index in range(1, 6):
        journal.add(b"old%d" % index, index, 1)
    journal.deleteEntriesFrom(2)  # positions: entries 3.. go (the store's first index is 1)
    journal.add(b"new3", 3, 2)
    assert entries(journal, 1, 4) == [(b"old1", 1, 1), (b"old2", 2, 1), (b"new3", 3, 2)]
    assert journal[-1] == (b"new3", 3, 2)
    journal.clear()  # a snapshot's reset: empty until the next add
    journal.add(b"after", 9, 3)
    assert journal[-1] == (b"after", 9, 3) and entries(journal, 9, 10) == [(b"after", 9, 3)]


def test_what_is_kept_stays_within_its_bounds(store: ShardStore) -> None:
    counting = CountingStore(store)
    journal = StoreJournal(counting)  # type: ignore[arg-type]
    for index in range(1, MEMO_ENTRIES_MAX * 2 + 1):
        journal.add(b"x", index, 1)
    assert len(journal._memo) == MEMO_ENTRIES_MAX
    big = MEMO_BYTES_MAX // 3 + 1
    for index in range(MEMO_ENTRIES_MAX * 2 + 1, MEMO_ENTRIES_MAX * 2 + 4):
        journal.add(bytes(big), index, 1)
    assert journal._memo_bytes <= MEMO_BYTES_MAX
    assert sum(len(e[0]) for e in journal._memo.values()) == journal._memo_bytes
    # The oldest went first; what is no longer kept is read from the store, unchanged.
    assert entries(journal, 1, 3) == [(b"x", 1, 1), (b"x", 2, 1)]
    assert counting.reads == 1


def test_the_last_entry_is_kept_whatever_its_size(store: ShardStore) -> None:
    """The last entry is read many times a tick: a group of large records bigger than the
    whole byte bound is still served from memory, and only the newest few are kept so."""
    counting = CountingStore(store)
    journal = StoreJournal(counting)  # type: ignore[arg-type]
    big = MEMO_BYTES_MAX + 1
    for index in range(1, 5):
        journal.add(bytes([index]) * big, index, 1)
    assert len(journal._memo) == MEMO_NEWEST_KEPT
    for _ in range(10):
        assert journal[-1] == (bytes([4]) * big, 4, 1)
    assert entries(journal, 3, 5) == [(bytes([i]) * big, i, 1) for i in (3, 4)]
    assert counting.reads == 0, "the newest large entries were read back from the store"
