"""I/O errors surface as typed errors, nothing unsynced is acknowledged, reads keep working.

Driven over `FaultFS` with injected errno values: EIO on fdatasync (fsyncgate: never retried
as if the data were then durable), ENOSPC in the middle of a write and when a segment file
is created, EIO while saving the vote. Also the asyncio hand-off: futures resolve only after
the fdatasync covering them returned, and fail with the store's failure.
"""

from __future__ import annotations

import asyncio
import errno
import random

import pytest

from logsvc.store import DiskFull, Entry, ShardStore, StoreFailed, StoreIOError, StoreLimits
from logsvc.store.aio import AsyncDurability, TooManyWaiters
from tests.support.faultfs import FaultFS

DIR = "/shard"
LIMITS = StoreLimits(
    segment_bytes_max=1024, group_commit_delay_ms_max=3_600_000, write_buffer_bytes_max=512
)


def entries(lo: int, hi: int, size: int = 100) -> list[Entry]:
    return [Entry(i, 1, bytes([i % 256]) * size) for i in range(lo, hi)]


def test_failed_fdatasync_fails_the_store_and_acknowledges_nothing() -> None:
    fs = FaultFS()
    store = ShardStore.open(DIR, fs=fs, limits=LIMITS)
    store.append(entries(1, 3))
    store.sync()
    fs.inject_error("fdatasync", errno.EIO)
    store.append(entries(3, 5))
    with pytest.raises((StoreFailed, StoreIOError)):
        store.sync()
    assert store.durable_index == 2
    with pytest.raises(StoreFailed) as again:
        store.append(entries(5, 6))
    assert again.value.cause.errno == errno.EIO  # type: ignore[attr-defined]
    assert store.read(1, 10, 1 << 20) == entries(1, 5)  # still readable
    assert store.stats().failed
    store.abandon()
    fs.power_loss("trunc", random.Random(0))
    with ShardStore.open(DIR, fs=fs, limits=LIMITS) as reopened:
        assert reopened.read(1, 10, 1 << 20)[:2] == entries(1, 3)


def test_disk_full_mid_write_is_typed_and_the_partial_record_is_cut_on_reopen() -> None:
    fs = FaultFS(rng=random.Random(4))
    store = ShardStore.open(DIR, fs=fs, limits=LIMITS)
    store.append(entries(1, 3))
    store.sync()
    fs.inject_error("write", errno.ENOSPC, partial=True)
    with pytest.raises(DiskFull):
        store.append(entries(3, 9))  # over the write buffer: the append writes it out
    assert store.durable_index == 2
    with pytest.raises(StoreFailed) as failed:
        store.sync()
    assert isinstance(failed.value.cause, DiskFull)
    store.abandon()
    fs.crash()
    fs.clear_injected_errors()
    with ShardStore.open(DIR, fs=fs, limits=LIMITS) as reopened:
        got = reopened.read(1, 20, 1 << 20)
        assert got == entries(1, 9)[: len(got)]
        assert len(got) >= 2


def test_disk_full_when_creating_a_segment_is_typed() -> None:
    fs = FaultFS()
    with ShardStore.open(DIR, fs=fs, limits=LIMITS) as store:
        store.append(entries(1, 2))
        store.sync()
        fs.inject_error("open_write", errno.ENOSPC, path_contains=".seg")
        store.roll()
        store.append(entries(2, 3))
        with pytest.raises(StoreFailed) as raised:
            store.sync()
        assert isinstance(raised.value.cause, DiskFull)
        assert store.durable_index == 1


def test_failed_vote_write_keeps_the_old_vote_and_fails_the_store() -> None:
    fs = FaultFS()
    store = ShardStore.open(DIR, fs=fs, limits=LIMITS)
    store.save_vote(3, "n1")
    fs.inject_error("fsync_dir", errno.EIO)
    with pytest.raises(StoreIOError):
        store.save_vote(4, "n2")
    assert (store.term, store.voted_for) == (3, "n1")  # never reported as saved
    with pytest.raises(StoreFailed):
        store.save_vote(5, "n3")
    store.close()


def test_async_waiters_resolve_only_after_their_sync() -> None:
    async def scenario() -> None:
        fs = FaultFS()
        store = ShardStore.open(DIR, fs=fs, limits=LIMITS)
        durability = AsyncDurability(store, waiters_max=2)
        syncs_at_open = fs.stats.fdatasync_count
        store.append(entries(1, 4))
        waiting = asyncio.ensure_future(durability.wait_durable(3))
        await asyncio.sleep(0)
        assert not waiting.done()  # nothing synced yet (the delay is an hour)
        assert fs.stats.fdatasync_count == syncs_at_open
        store.request_sync()
        await asyncio.wait_for(waiting, 10)
        assert store.durable_index >= 3
        await durability.wait_durable(2)  # already durable: returns at once
        store.append(entries(4, 7))
        first = asyncio.ensure_future(durability.wait_durable(5))
        second = asyncio.ensure_future(durability.wait_durable(6))
        await asyncio.sleep(0)
        with pytest.raises(TooManyWaiters):
            await durability.wait_durable(6)  # bounded: the caller sheds load
        fs.inject_error("fdatasync", errno.EIO)
        store.request_sync()
        for future in (first, second):
            with pytest.raises(StoreFailed):
                await asyncio.wait_for(future, 10)
        store.close()

    asyncio.run(scenario())
