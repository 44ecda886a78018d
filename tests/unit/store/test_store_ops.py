"""Each store operation does what the issue says, on real files with real fsync.

Append/sync/read round trips (from cache and, after reopen, from disk), reads bounded by
max_bytes, segment rolls, suffix and prefix truncation (logical and physical) surviving a
reopen, term/vote persistence and its invariants, the directory lock, size limits, and
group commit sharing one fdatasync among many concurrent writers.
"""

from __future__ import annotations

import os
import threading

import pytest

from logsvc.store import (
    Compacted,
    Entry,
    RecordTooLarge,
    ShardStore,
    StoreClosed,
    StoreLimits,
    StoreLocked,
)

from .conftest import SMALL, open_store


def payload(index: int, size: int = 100) -> bytes:
    return (f"{index}:".encode() * size)[:size]


def fill(store: ShardStore, lo: int, hi: int, term: int = 1, size: int = 100) -> None:
    store.append([Entry(i, term, payload(i, size)) for i in range(lo, hi)])


def segment_files(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".seg"))


def test_append_is_not_durable_until_synced(store_dir: str) -> None:
    store = ShardStore.open(store_dir, limits=StoreLimits(group_commit_delay_ms_max=60_000))
    try:
        fill(store, 1, 11)
        assert (store.last_index, store.durable_index) == (10, 0)
        assert store.sync() == 10
        assert store.durable_index == 10
    finally:
        store.close()


def test_read_round_trip_from_cache_and_from_disk(store_dir: str) -> None:
    with open_store(store_dir) as store:
        fill(store, 1, 201)
        store.sync()
        cached = store.read(1, 201, 1 << 30)
        assert [e.index for e in cached] == list(range(1, 201))
        assert len(segment_files(store_dir)) > 5  # 2 KiB segments rolled
    with open_store(store_dir) as store:  # cold: every read goes to disk
        assert store.read(1, 201, 1 << 30) == cached
        assert store.read(57, 60, 1 << 30) == cached[56:59]


def test_read_is_bounded_by_max_bytes_but_returns_at_least_one(store_dir: str) -> None:
    with open_store(store_dir) as store:
        fill(store, 1, 51)
        store.sync()
        assert [e.index for e in store.read(1, 51, 250)] == [1, 2]
        assert [e.index for e in store.read(5, 51, 0)] == [5]
    with open_store(store_dir) as store:
        assert [e.index for e in store.read(1, 51, 250)] == [1, 2]
        assert [e.index for e in store.read(5, 51, 0)] == [5]
        assert store.read(51, 60, 1000) == []  # at the end: nothing, no error


def test_cache_stays_bounded_and_evicted_entries_come_from_disk(store_dir: str) -> None:
    with open_store(store_dir) as store:
        fill(store, 1, 1001)
        store.sync()
        stats = store.stats()
        assert stats.cache_bytes <= SMALL.cache_bytes_max
        assert stats.cache_entries < 1000
        assert store.read(1, 2, 1000)[0] == Entry(1, 1, payload(1))


def test_truncate_suffix_is_durable_and_the_log_continues(store_dir: str) -> None:
    with open_store(store_dir) as store:
        fill(store, 1, 101, term=1)
        store.sync()
        files_before = segment_files(store_dir)
        store.truncate_suffix(40)
        assert (store.last_index, store.durable_index) == (39, 39)
        assert len(segment_files(store_dir)) < len(files_before)
        fill(store, 40, 61, term=2, size=30)
        store.sync()
    with open_store(store_dir) as store:
        entries = store.read(1, 100, 1 << 30)
        assert [e.index for e in entries] == list(range(1, 61))
        assert entries[38] == Entry(39, 1, payload(39))
        assert entries[39] == Entry(40, 2, payload(40, 30))
        assert (store.term_at(39), store.term_at(40)) == (1, 2)


def test_truncate_suffix_of_unsynced_entries(store_dir: str) -> None:
    with open_store(store_dir) as store:
        fill(store, 1, 21)
        store.truncate_suffix(11)
        assert store.read(1, 100, 1 << 30)[-1].index == 10
    with open_store(store_dir) as store:
        assert store.last_index == 10


def test_truncate_prefix_is_logical_at_once_and_physical_later(store_dir: str) -> None:
    with open_store(store_dir) as store:
        fill(store, 1, 201)
        store.sync()
        assert store.truncate_prefix(120) == 120
        assert store.truncate_prefix(50) == 120  # monotonic: lower is a no-op
        with pytest.raises(Compacted) as raised:
            store.read(119, 130, 1000)
        assert raised.value.first_index == 120
        assert store.read(120, 121, 1000)[0].index == 120
    # After close (which finishes deletion) no file wholly below 120 remains.
    names = segment_files(store_dir)
    assert int(names[0].split(".")[0]) <= 120
    assert all(int(b.split(".")[0]) > 120 for b in names[1:])
    with open_store(store_dir) as store:
        assert (store.first_index, store.last_index) == (120, 200)
        with pytest.raises(Compacted):
            store.term_at(100)


def test_truncate_prefix_past_the_end_resets_the_log(store_dir: str) -> None:
    with open_store(store_dir) as store:
        fill(store, 1, 31)
        store.truncate_prefix(1000)
        assert (store.first_index, store.last_index, store.durable_index) == (1000, 999, 999)
        assert store.read(1000, 1010, 100) == []
        fill(store, 1000, 1005)
        store.sync()
    with open_store(store_dir) as store:
        assert (store.first_index, store.last_index) == (1000, 1004)
        assert segment_files(store_dir) == ["00000000000000001000.seg"]


def test_term_and_vote_survive_reopen(store_dir: str) -> None:
    with open_store(store_dir) as store:
        assert (store.term, store.voted_for) == (0, None)
        store.save_vote(3, "n2")
        store.save_vote(3, "n2")  # repeating the same vote is fine
        store.save_vote(4, None)
    with open_store(store_dir) as store:
        assert (store.term, store.voted_for) == (4, None)
        with pytest.raises(AssertionError, match="backwards"):
            store.save_vote(3, "n1")
        store.save_vote(4, "n1")
        with pytest.raises(AssertionError, match="one vote"):
            store.save_vote(4, "n3")


def test_append_must_continue_the_log(store_dir: str) -> None:
    with open_store(store_dir) as store:
        fill(store, 1, 4)
        with pytest.raises(AssertionError, match="continue"):
            store.append([Entry(5, 1, b"gap")])
        with pytest.raises(AssertionError, match="terms"):
            store.append([Entry(4, 0, b"older term")])


def test_oversize_payload_is_rejected_and_nothing_is_appended(store_dir: str) -> None:
    with open_store(store_dir) as store:
        too_big = b"x" * (SMALL.record_payload_bytes_max + 1)
        with pytest.raises(RecordTooLarge):
            store.append([Entry(1, 1, b"ok"), Entry(2, 1, too_big)])
        assert store.last_index == 0


def test_a_directory_is_opened_by_one_store_at_a_time(store_dir: str) -> None:
    with open_store(store_dir), pytest.raises(StoreLocked):
        open_store(store_dir)
    open_store(store_dir).close()


def test_closed_store_refuses_writes(store_dir: str) -> None:
    store = open_store(store_dir)
    store.close()
    with pytest.raises(StoreClosed):
        fill(store, 1, 2)


def test_roll_starts_a_new_segment(store_dir: str) -> None:
    limits = StoreLimits(segment_bytes_max=1 << 20)
    with ShardStore.open(store_dir, limits=limits) as store:
        fill(store, 1, 4)
        store.roll()
        fill(store, 4, 6)
        store.sync()
        assert segment_files(store_dir) == [
            "00000000000000000001.seg",
            "00000000000000000004.seg",
        ]


def test_concurrent_writers_share_fsyncs(store_dir: str) -> None:
    """64 threads each append and wait for durability, 20 times: far fewer syncs than
    appends, and every waiter returns only after its entry is durable."""
    limits = StoreLimits(group_commit_delay_ms_max=2)
    store = ShardStore.open(store_dir, limits=limits)
    lock = threading.Lock()
    next_index = [1]
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(20):
                with lock:
                    index = next_index[0]
                    next_index[0] += 1
                    store.append([Entry(index, 1, payload(index))])
                store.wait_durable(index)
                assert store.durable_index >= index
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stats = store.stats()
    store.close()
    assert not errors
    assert stats.durable_index == 1280
    assert stats.syncs < 1280 // 4, stats
