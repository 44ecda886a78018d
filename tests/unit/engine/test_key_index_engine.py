"""The tables' key index in the engine (issue 21, target 4): kept current by flush, merge,
collection, checkpoint restore and replay, and what an insert's uniqueness check asks.

Proves, over a memory WAL and a memory object store with maintenance driven by hand: a table
of many persisted blocks whose key ranges all overlap (random keys) names no candidate block
for a fresh key and exactly the holding block for a present one (before the index every
overlapping block was a candidate: this fails on the old code); every held persisted block is
indexed after flushes and merges, collected blocks leave it; after a restart (replay of
CreateBlocks, then a checkpoint's restore) the blocks start unindexed and point reads are
still right (key ranges and blooms answer), and one maintenance settle indexes them all; a
duplicate insert is refused and a fresh one accepted at every stage. A large merge of the
index's runs runs in a worker thread: held there on an event, the event loop meanwhile
commits, reads and refuses a duplicate, and the result is swapped in once released.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pyarrow as pa
import pytest

from engine import Column, DuplicateKey, Engine, Schema, limits
from engine.objects.store import MemoryObjectStore
from engine.storage import TableData, keyindex
from tae_driver.backends.memory import MemoryBackend

ROWS = Schema([Column("id", "int64"), Column("v", "int64")], primary_key=["id"])
ARROW = ROWS.to_arrow()
BLOCKS = 40
ROWS_PER_BLOCK = 150


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def data_of(eng: Engine) -> TableData:
    (table,) = [t for t in eng._state.catalog.tables.values() if t.name == "t"]
    return table.data


async def load(eng: Engine, rng: random.Random) -> list[int]:
    """BLOCKS flushed blocks of random keys (every key range spans nearly everything)."""
    keys: list[int] = []
    maintenance = eng.maintenance
    assert maintenance is not None
    for _ in range(BLOCKS):
        chunk = rng.sample(range(-(2**40), 2**40), ROWS_PER_BLOCK)
        keys.extend(chunk)
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert(
                pa.RecordBatch.from_arrays(
                    [pa.array(chunk, pa.int64()), pa.array(chunk, pa.int64())], schema=ARROW
                )
            )
        await maintenance.settle(freeze_all=True)
    await maintenance.settle()
    return keys


async def check_reads(eng: Engine, present: list[int], rng: random.Random) -> None:
    async with eng.transaction() as txn:
        table = txn.table("d", "t")
        for key in present:
            assert await table.get(key) == {"id": key, "v": key}
            with pytest.raises(DuplicateKey):
                await table.insert({"id": key, "v": 0})
        for _ in range(20):
            fresh = rng.randrange(2**41, 2**42)
            assert await table.get(fresh) is None
    # A fresh key is accepted (committed, then read back).
    fresh = rng.randrange(2**42, 2**43)
    async with eng.transaction() as txn:
        await txn.table("d", "t").insert({"id": fresh, "v": 1})
    async with eng.transaction() as txn:
        assert await txn.table("d", "t").get(fresh) == {"id": fresh, "v": 1}


def assert_fully_indexed(data: TableData) -> None:
    assert not data.unindexed_blocks()
    assert len(data.key_index) == data.persisted_held


def test_the_index_follows_flush_merge_collect_replay_and_checkpoint() -> None:
    async def main() -> None:
        rng = random.Random(21)
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await Engine.open("unused", wal, objects=objects, maintenance=False)
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        keys = await load(eng, rng)
        data = data_of(eng)
        ts = eng.visible_ts
        live = data.persisted_blocks()
        live = [b for b in live if b.visible(ts)]
        assert len(live) >= 3, "merges left several blocks"
        assert all(b.may_hold(0) for b in live), "random keys: every range overlaps"
        assert_fully_indexed(data)
        # Merged-away blocks were collected: the index holds only what the table holds.
        assert len(data.key_index) == len(data.persisted_blocks())
        # A fresh key: no candidate at all (the old code named every overlapping block).
        for _ in range(50):
            assert data.key_candidates(rng.randrange(2**41, 2**42), ts) == []
        present = rng.sample(keys, 30)
        for key in present:
            (holding,) = data.key_candidates(key, ts)
            assert holding.visible(ts)
            assert data.blocks_for_key(key) == [holding]
        await check_reads(eng, present, rng)
        await eng.close()

        # Restart: replay of the CreateBlocks (footers hold no keys): unindexed at first.
        eng = await Engine.open("unused", wal, objects=objects, maintenance=False)
        data = data_of(eng)
        assert data.unindexed_blocks()
        assert len(data.key_index) == 0
        await check_reads(eng, present, rng)
        maintenance = eng.maintenance
        assert maintenance is not None
        await maintenance.settle()
        assert_fully_indexed(data)
        assert data.key_candidates(rng.randrange(2**41, 2**42), eng.visible_ts) == []
        await check_reads(eng, present, rng)
        assert await eng.checkpoint() is not None
        await eng.close()

        # Restart from the checkpoint: restored blocks, indexed by maintenance.
        eng = await Engine.open("unused", wal, objects=objects, maintenance=False)
        data = data_of(eng)
        assert data.unindexed_blocks()
        await check_reads(eng, present, rng)
        maintenance = eng.maintenance
        assert maintenance is not None
        await maintenance.settle()
        assert_fully_indexed(data)
        await check_reads(eng, present, rng)
        await eng.close()

    run(main)


def test_a_snapshot_below_a_merge_still_finds_its_keys_in_the_dropped_blocks() -> None:
    """A merge drops blocks an open snapshot still reads: they stay in the index (with
    their ids) until collected, and the snapshot's uniqueness check finds keys in them."""

    async def main() -> None:
        rng = random.Random(5)
        eng = await Engine.open(
            "unused", MemoryBackend(), objects=MemoryObjectStore(), maintenance=False
        )
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        maintenance = eng.maintenance
        assert maintenance is not None
        keys: list[int] = []
        for _ in range(15):  # one short of a merge
            chunk = rng.sample(range(2**40), ROWS_PER_BLOCK)
            keys.extend(chunk)
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert([{"id": k, "v": k} for k in chunk])
            await maintenance.settle(freeze_all=True)
        old = await eng.begin()
        chunk = rng.sample(range(2**40, 2**41), ROWS_PER_BLOCK)
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert([{"id": k, "v": k} for k in chunk])
        await maintenance.settle(freeze_all=True)  # the 16th block: merged into L2
        data = data_of(eng)
        assert any(b.drop_ts != 2**64 - 1 for b in data.persisted_blocks()), "merged"
        for key in rng.sample(keys, 10):
            found = data.key_candidates(key, old.start_ts)
            assert len(found) == 1 and found[0].drop_ts != 2**64 - 1
            with pytest.raises(DuplicateKey):
                await old.table("d", "t").insert({"id": key, "v": 0})
        await old.rollback()
        maintenance.step()  # nothing reads the merged-away blocks: collected
        assert_fully_indexed(data)
        assert len(data.key_index) == len(data.persisted_blocks())
        await eng.close()

    run(main)


def test_a_large_index_merge_runs_in_a_thread_while_the_loop_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two blocks' runs (300 entries) are more than the index merges on the loop here
    (150): maintenance runs the merge in a worker thread, held on an event until the loop
    has committed, read, and refused a duplicate (a merge on the loop could not let any of
    that happen before it finished: on the old code the thread never starts)."""
    monkeypatch.setattr(limits, "KEY_INDEX_MERGE_ON_LOOP_ENTRIES_MAX", ROWS_PER_BLOCK)
    started, release = threading.Event(), threading.Event()
    merged_on: list[threading.Thread] = []
    merge_runs = keyindex.merge_runs

    def held_merge(older: Any, newer: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            merged_on.append(threading.current_thread())
            started.set()
            assert release.wait(30), "the test never released the merge"
        return merge_runs(older, newer)

    monkeypatch.setattr(keyindex, "merge_runs", held_merge)

    async def main() -> None:
        rng = random.Random(8)
        eng = await Engine.open(
            "unused", MemoryBackend(), objects=MemoryObjectStore(), maintenance=False
        )
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        maintenance = eng.maintenance
        assert maintenance is not None
        keys = [rng.sample(range(2**40), ROWS_PER_BLOCK) for _ in range(2)]
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert([{"id": k, "v": k} for k in keys[0]])
        await maintenance.settle(freeze_all=True)
        data = data_of(eng)
        assert data.key_index.run_count == 1 and not started.is_set()
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert([{"id": k, "v": k} for k in keys[1]])
        settling = asyncio.get_running_loop().create_task(maintenance.settle(freeze_all=True))
        assert await asyncio.to_thread(started.wait, 30), "the merge never left the loop"
        # The merge is held in its thread: the loop is free, the runs not yet merged.
        assert data.key_index.run_count == 2
        fresh = rng.randrange(2**41, 2**42)
        async with eng.transaction() as txn:
            table = txn.table("d", "t")
            await table.insert({"id": fresh, "v": 1})
            assert await table.get(keys[1][0]) == {"id": keys[1][0], "v": keys[1][0]}
            with pytest.raises(DuplicateKey):
                await table.insert({"id": keys[0][0], "v": 0})
        assert not settling.done()
        release.set()
        await settling
        assert merged_on and merged_on[0] is not threading.main_thread()
        assert data.key_index.merges_offloaded == 1
        assert data.key_index.run_count == 1
        assert_fully_indexed(data)
        for key in (keys[0][1], keys[1][1]):
            (holding,) = data.key_candidates(key, eng.visible_ts)
            assert data.blocks_for_key(key) == [holding]
        await eng.close()

    run(main)
