"""Flushes, merges and compactions are transactions that readers cannot see happen (decision
0006; seed "Compact & Merge").

Proves, in-process over the `MemoryBlocks` port double (so with no object store): a flush of
L0 blocks and a merge into an L2 segment leave every read equal, at the newest timestamp and
at every older one still open; a delete committed while a flush runs is carried onto its
output (Txn5/Txn6 of the seed), and one committed after the swap by a transaction that saw the
old block is re-resolved (Txn7), never lost; compaction drops dead rows; a rewrite of a table
dropped meanwhile is abandoned and its objects discarded; replay of a log holding rewrites
rebuilds the same state; collection forgets dropped blocks only once no reader needs them,
and snapshots below that are refused.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pyarrow.compute as pc
import pytest

from engine import Column, Engine, Schema, SnapshotUnavailable, limits
from engine.compaction import Policy
from engine.storage import L0Block, PersistedBlock
from engine.wal.entry import BlockLevel
from tae_driver.backends.memory import MemoryBackend
from tests.unit.engine.memory_blocks import MemoryBlocks

ROWS = Schema(
    [Column("id", "int64"), Column("v", "string"), Column("n", "int32", nullable=True)],
    primary_key=["id"],
)
BLOCK = limits.BLOCK_ROWS_MAX


def rows(ids: range | list[int], tag: str = "v") -> list[dict[str, object]]:
    return [{"id": i, "v": f"{tag}{i}", "n": i % 7 if i % 5 else None} for i in ids]


async def open_engine(backend: MemoryBackend, blocks: MemoryBlocks, **policy: object) -> Engine:
    return await Engine.open(
        "unused",
        backend,
        block_store=blocks,
        policy=Policy(**policy),  # type: ignore[arg-type]
        maintenance=False,  # the tests step it themselves
    )


async def fresh() -> tuple[Engine, MemoryBackend, MemoryBlocks]:
    backend, blocks = MemoryBackend(), MemoryBlocks()
    eng = await open_engine(backend, blocks)
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
    return eng, backend, blocks


def run(test: Callable[[Engine, MemoryBackend, MemoryBlocks], Awaitable[None]]) -> None:
    """Run `test` on a fresh engine with table d.t, closing it afterwards."""

    async def main() -> None:
        eng, backend, blocks = await fresh()
        try:
            await test(eng, backend, blocks)
        finally:
            await eng.close()

    asyncio.run(main())


async def scan_all(eng: Engine, ts: int | None = None) -> list[dict[str, object]]:
    if ts is None:
        async with eng.transaction() as txn:
            table = await txn.table("d", "t").scan()
    else:
        async with eng.snapshot(ts) as view:
            table = await view.table("d", "t").scan()
    return sorted(table.to_pylist(), key=lambda row: row["id"])


def blocks_of(eng: Engine) -> list[L0Block | PersistedBlock]:
    table = next(iter(t for t in eng._state.catalog.tables.values() if t.name == "t"))
    return [b for b in table.data.blocks.values() if b.drop_ts == (1 << 64) - 1]


async def insert(eng: Engine, ids: range | list[int], tag: str = "v") -> int:
    async with eng.transaction() as txn:
        await txn.table("d", "t").insert(rows(ids, tag))
    return eng.visible_ts


async def delete(eng: Engine, ids: list[int]) -> int:
    async with eng.transaction() as txn:
        await txn.table("d", "t").delete(ids)
    return eng.visible_ts


def test_flush_and_merge_change_no_read_at_any_timestamp() -> None:
    run(_flush_and_merge_change_no_read_at_any_timestamp)


async def _flush_and_merge_change_no_read_at_any_timestamp(
    eng: Engine, backend: MemoryBackend, blocks: MemoryBlocks
) -> None:
    ts_a = await insert(eng, range(0, BLOCK))
    ts_b = await insert(eng, range(BLOCK, 2 * BLOCK + 100))
    ts_c = await delete(eng, [3, 4, BLOCK + 7])
    before = {ts: await scan_all(eng, ts) for ts in (ts_a, ts_b, ts_c)}
    async with eng.snapshot(ts_b) as old_view:  # an open reader from before the flush
        maintenance = eng.maintenance
        assert maintenance is not None
        await maintenance.settle(freeze_all=True)
        levels = sorted(b.level for b in blocks_of(eng))
        assert levels == [BlockLevel.L1] * 3  # two full blocks and the sealed tail
        assert maintenance.rewrites_done["flush"] == 3
        assert (await old_view.table("d", "t").scan()).num_rows == 2 * BLOCK + 100
        for ts, expected in before.items():
            assert await scan_all(eng, ts) == expected
        assert await scan_all(eng) == before[ts_c]
    async with eng.transaction() as txn:
        table = txn.table("d", "t")
        assert await table.get(5) == {"id": 5, "v": "v5", "n": None}
        assert await table.get(3) is None
        assert await table.get(BLOCK + 8) == rows([BLOCK + 8])[0]
        got = await table.scan(columns=["id"], filter=pc.field("id") >= 2 * BLOCK + 95)
        assert sorted(got.column("id").to_pylist()) == list(range(2 * BLOCK + 95, 2 * BLOCK + 100))
    assert blocks.loads > 0

    merge = Policy(merge_l1_blocks=3)
    maintenance.policy = merge
    await maintenance.settle()
    live = blocks_of(eng)
    assert [b.level for b in live] == [BlockLevel.L2] * 3
    assert len({b.object_name for b in live if isinstance(b, PersistedBlock)}) == 1
    assert await scan_all(eng) == before[ts_c]


def test_deletes_during_and_after_a_flush_are_carried_or_re_resolved() -> None:
    run(_deletes_during_and_after_a_flush_are_carried_or_re_resolved)


async def _deletes_during_and_after_a_flush_are_carried_or_re_resolved(
    eng: Engine, backend: MemoryBackend, blocks: MemoryBlocks
) -> None:
    await insert(eng, range(0, BLOCK))  # one full block, sealed
    late = await eng.begin()  # Txn7: sees the L0 block, commits after the swap
    await late.table("d", "t").delete([100, 101])
    blocks.gate = threading.Event()
    maintenance = eng.maintenance
    assert maintenance is not None
    started = maintenance.step()
    assert len(started) == 1
    await asyncio.to_thread(blocks.writing.wait, 10)
    await delete(eng, [1, 2])  # Txn5/Txn6: committed while the flush writes
    blocks.gate.set()
    await asyncio.gather(*started)
    assert maintenance.rewrites_done["flush"] == 1
    (block,) = blocks_of(eng)
    assert isinstance(block, PersistedBlock)
    assert sorted(block.deletes.all) == [1, 2]  # carried (sorted by id: offset = id)
    await late.commit()  # re-resolved onto the new block
    assert sorted(block.deletes.all) == [1, 2, 100, 101]
    remaining = {row["id"] for row in await scan_all(eng)}
    assert remaining == set(range(BLOCK)) - {1, 2, 100, 101}


def test_replay_of_a_log_with_rewrites_rebuilds_the_same_state() -> None:
    run(_replay_of_a_log_with_rewrites_rebuilds_the_same_state)


async def _replay_of_a_log_with_rewrites_rebuilds_the_same_state(
    eng: Engine, backend: MemoryBackend, blocks: MemoryBlocks
) -> None:
    await insert(eng, range(0, BLOCK + 10))
    await delete(eng, [0, BLOCK + 1])
    maintenance = eng.maintenance
    assert maintenance is not None
    await maintenance.settle(freeze_all=True)
    await delete(eng, [5])
    await insert(eng, range(BLOCK + 10, BLOCK + 20))
    digest = eng.digest()
    await eng.close()
    again = await open_engine(backend, blocks)
    try:
        assert again.digest() == digest
        assert {type(b) for b in blocks_of(again)} == {PersistedBlock, L0Block}
        async with again.transaction() as txn:
            await txn.table("d", "t").insert(rows([10**9]))  # placement continues
    finally:
        await again.close()


def test_compaction_drops_dead_rows_and_collection_forgets_old_blocks() -> None:
    run(_compaction_drops_dead_rows_and_collection_forgets_old_blocks)


async def _compaction_drops_dead_rows_and_collection_forgets_old_blocks(
    eng: Engine, backend: MemoryBackend, blocks: MemoryBlocks
) -> None:
    await insert(eng, range(0, BLOCK))
    maintenance = eng.maintenance
    assert maintenance is not None
    await maintenance.settle(freeze_all=True)
    before_deletes = eng.visible_ts
    await delete(eng, [*range(0, BLOCK, 2), 1])
    maintenance.policy = Policy(compact_deleted_fraction=0.5)
    await maintenance.settle()
    (block,) = blocks_of(eng)
    assert isinstance(block, PersistedBlock) and block.rows == BLOCK // 2 - 1
    assert not block.deletes.all
    assert [r["id"] for r in await scan_all(eng)] == list(range(3, BLOCK, 2))
    maintenance.step()  # no reader is older: the dropped blocks are collected
    assert len(blocks.collected_blocks) >= 1
    with pytest.raises(SnapshotUnavailable):
        async with eng.snapshot(before_deletes):
            pass


def test_a_rewrite_of_a_dropped_table_is_abandoned_and_its_objects_discarded() -> None:
    run(_a_rewrite_of_a_dropped_table_is_abandoned_and_its_objects_discarded)


async def _a_rewrite_of_a_dropped_table_is_abandoned_and_its_objects_discarded(
    eng: Engine, backend: MemoryBackend, blocks: MemoryBlocks
) -> None:
    await insert(eng, range(0, BLOCK))
    blocks.gate = threading.Event()
    maintenance = eng.maintenance
    assert maintenance is not None
    started = maintenance.step()
    await asyncio.to_thread(blocks.writing.wait, 10)
    async with eng.transaction() as txn:
        await txn.drop_table("d", "t")
    blocks.gate.set()
    await asyncio.gather(*started)
    assert maintenance.rewrites_abandoned == 1
    assert blocks.discarded and not blocks.objects
