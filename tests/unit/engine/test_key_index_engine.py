"""The tables' key index in the engine (issue 21, target 4): kept current by flush, merge,
collection, checkpoint restore and replay, and what an insert's uniqueness check asks.

Proves, over a memory WAL and a memory object store with maintenance driven by hand: a table
of many persisted blocks whose key ranges all overlap (random keys) names no candidate block
for a fresh key and exactly the holding block for a present one (before the index every
overlapping block was a candidate: this fails on the old code); every held persisted block is
indexed after flushes and merges, collected blocks leave it; after a restart (replay of
CreateBlocks, then a checkpoint's restore) the blocks start unindexed and point reads are
still right (key ranges and blooms answer), and one maintenance settle indexes them all; a
duplicate insert is refused and a fresh one accepted at every stage.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any

import pyarrow as pa
import pytest

from engine import Column, DuplicateKey, Engine, Schema
from engine.objects.store import MemoryObjectStore
from engine.storage import TableData
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
