"""What the engine offers its own modules through their host protocols (issue 21).

Proves, in-process over the `MemoryBlocks` port double: `pin(ts)` keeps the oldest snapshot
at `ts` while any pin on it is held (nested pins counted), so blocks dropped after it are not
collected, and lets go when the last one ends; a rewrite whose submit fails goes through the
engine's one submit (`Engine.submit_commit`): it is abandoned, and what it reserved (the
block moves, the outputs' pending metadata, the block ids) is undone, the same as a
transaction's; an oversized write is refused by that same submit with `TxnTooLarge`; a
reopen's replay (through `ReplayHost`) counts the entries its checkpoint held as duplicates,
with and without a history window, and applies the rest.
"""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest

from engine import Column, Engine, Schema, WalFailed, limits
from engine.compaction import Policy
from tae_driver import errors as driver_errors
from tae_driver.backends.memory import MemoryBackend
from tests.unit.engine.memory_blocks import MemoryBlocks

ROWS = Schema([Column("id", "int64"), Column("v", "string")], primary_key=["id"])


async def fresh() -> Engine:
    eng = await Engine.open(
        "unused",
        MemoryBackend(),
        block_store=MemoryBlocks(),
        policy=Policy(),
        maintenance=False,  # the tests step it themselves
    )
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
    return eng


async def insert(eng: Engine, ids: range) -> int:
    async with eng.transaction() as txn:
        await txn.table("d", "t").insert([{"id": i, "v": f"v{i}"} for i in ids])
    return eng.visible_ts


def test_pin_holds_the_oldest_snapshot_until_the_last_pin_ends() -> None:
    async def main() -> None:
        eng = await fresh()
        try:
            first = await insert(eng, range(10))
            await insert(eng, range(10, 20))
            assert eng.oldest_snapshot_ts() == eng.visible_ts > first
            with eng.pin(first):
                with eng.pin(first):
                    assert eng.oldest_snapshot_ts() == first
                assert eng.oldest_snapshot_ts() == first  # one pin still held
                maintenance = eng.maintenance
                assert maintenance is not None
                await maintenance.settle(freeze_all=True)  # a flush drops the L0 blocks
                async with eng.snapshot(first) as view:  # still in memory: pinned
                    table = await view.table("d", "t").scan()
                assert sorted(table.column("id").to_pylist()) == list(range(10))
                assert eng.history_floor_ts < first
            assert eng.oldest_snapshot_ts() == eng.visible_ts
            maintenance.step()  # nothing pins them now: the dropped blocks are collected
            assert eng.history_floor_ts > first
        finally:
            await eng.close()

    asyncio.run(main())


def test_a_rewrite_whose_submit_fails_is_abandoned_and_undone() -> None:
    async def main() -> None:
        eng = await fresh()
        try:
            await insert(eng, range(100))
            table = eng.catalog.tables[max(eng.catalog.tables)]
            blocks_before = dict(table.data.blocks)

            def refuse(payload: bytes, on_done: object) -> object:
                raise driver_errors.DriverFailed("the log is gone")

            eng.driver.submit_direct = refuse  # type: ignore[method-assign,assignment]
            maintenance = eng.maintenance
            assert maintenance is not None
            started = maintenance.step(freeze_all=True)
            assert started, "the test needs a flush to start"
            await asyncio.gather(*started)
            assert maintenance.rewrites_abandoned == len(started)
            assert table.data.blocks == blocks_before
            assert not [b for b in blocks_before if b in table.data.moves]
            assert eng.state.pending_meta == {}
            assert isinstance(eng.failed, WalFailed)  # the same rule as a commit's
        finally:
            await eng.close()

    asyncio.run(main())


def test_an_oversized_entry_is_refused_by_the_one_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        eng = await fresh()
        try:
            monkeypatch.setattr(limits, "TXN_ENTRY_BYTES_MAX", 64)
            with pytest.raises(Exception, match="txn_entry_bytes_max"):
                await insert(eng, range(100))
            monkeypatch.undo()
            assert eng.failed is None
            assert eng.pipeline.queued() == []
            await insert(eng, range(3))  # the engine goes on
        finally:
            await eng.close()

    asyncio.run(main())


@pytest.mark.parametrize("retention", [datetime.timedelta(0), datetime.timedelta(hours=1)])
def test_a_replay_counts_what_the_checkpoint_held_and_applies_the_rest(
    tmp_path: Path, retention: datetime.timedelta
) -> None:
    """The replay handler through `ReplayHost`: entries the restored checkpoint holds are
    counted as duplicates (decoded, or skipped undecoded under a history window), the rest
    applied; the DSNs it reports are the WAL's."""

    async def main() -> None:
        policy = Policy(checkpoint_wal_reserve_entries=1000)  # the WAL keeps every entry
        eng = await Engine.open(
            str(tmp_path), policy=policy, maintenance=False, history_retention=retention
        )
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        for i in range(4):
            await insert(eng, range(i * 10, i * 10 + 10))
        manifest = await eng.checkpoint()
        assert manifest is not None
        for i in range(4, 7):
            await insert(eng, range(i * 10, i * 10 + 10))
        digest = eng.digest()
        await eng.close()

        again = await Engine.open(
            str(tmp_path), policy=policy, maintenance=False, history_retention=retention
        )
        try:
            assert again.digest() == digest
            assert again.stats().replay_duplicates == 1 + 4  # the DDL and four inserts
            assert again.wal_first_dsn == 1
            assert again.visible_dsn == again.driver.dsn()
            async with again.transaction() as txn:
                ids = (await txn.table("d", "t").scan()).column("id").to_pylist()
            assert sorted(ids) == list(range(70))
        finally:
            await again.close()

    asyncio.run(main())
