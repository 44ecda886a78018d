"""Bounded L0 memory (decision 0006): past `L0_BYTES_HARD_MAX` of unflushed L0 rows, commits
that append wait for flushes to give memory back, and fail with `Overloaded` after
`L0_WAIT_S_MAX` if none do. The limits are made small here so that a few batches reach them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pyarrow as pa
import pytest

from engine import Column, Engine, Overloaded, Schema, limits
from engine.compaction import Policy
from engine.objects.store import MemoryObjectStore
from tae_driver.backends.memory import MemoryBackend

SCHEMA = Schema([Column("id", "int64"), Column("note", "string")], primary_key=["id"])
ROWS_PER_BATCH = 4000
NOTE = "n" * 100


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def rows(first: int, count: int) -> pa.Table:
    return pa.table(
        {"id": pa.array(range(first, first + count), pa.int64()), "note": [NOTE] * count}
    )


async def open_engine(objects: MemoryObjectStore, wal: MemoryBackend) -> Engine:
    eng = await Engine.open(
        "unused",
        wal,
        objects=objects,
        policy=Policy(flush_age_ms=3_600_000, l0_bytes_max=256 << 10),
    )
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", SCHEMA)
    return eng


async def count(eng: Engine) -> int:
    async with eng.transaction() as txn:
        table = await txn.table("d", "t").scan(columns=["id"])
        return int(table.num_rows)


@pytest.fixture
def small_l0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "L0_BYTES_HARD_MAX", 1 << 20)
    monkeypatch.setattr(limits, "L0_WAIT_S_MAX", 5.0)


@pytest.mark.usefixtures("small_l0")
def test_one_writer_loading_past_the_hard_limit_waits_for_flushes_and_finishes() -> None:
    """Every batch is about 0.8 MiB of L0 (Arrow bytes and key index), so the second one
    passes the 1 MiB hard limit. The commit that waits holds a snapshot older than the
    flushes it waits for, and the L0 blocks they replace stay in memory for it: counting
    those as unflushed made it wait for itself until `Overloaded`."""

    async def main() -> None:
        eng = await open_engine(MemoryObjectStore(), MemoryBackend())
        try:
            maintenance = eng.maintenance
            assert maintenance is not None
            for batch in range(12):
                async with eng.transaction() as txn:
                    await txn.table("d", "t").insert(rows(batch * ROWS_PER_BATCH, ROWS_PER_BATCH))
            assert maintenance.memory_waits >= 1  # the hard limit was reached
            assert await count(eng) == 12 * ROWS_PER_BATCH
            assert maintenance.rewrites_done["flush"] >= 2
            await maintenance.settle()
            assert maintenance.l0_bytes <= limits.L0_BYTES_HARD_MAX
            assert not maintenance.over_memory
        finally:
            await eng.close()

    run(main)


@pytest.mark.usefixtures("small_l0")
def test_a_commit_waiting_for_flushes_that_fail_is_overloaded_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The object store refuses every put: no flush can give memory back, so the commit
    that waits is refused with `Overloaded` after `L0_WAIT_S_MAX`, is not in the state or
    the WAL, and what was committed before stays readable; once the store is back, flushes
    catch up and commits go on."""
    monkeypatch.setattr(limits, "L0_WAIT_S_MAX", 0.5)

    async def main() -> None:
        objects, wal = MemoryObjectStore(), MemoryBackend()
        eng = await open_engine(objects, wal)
        try:
            maintenance = eng.maintenance
            assert maintenance is not None
            objects.fail_next("put", count=1_000_000)
            refused = None
            committed = 0
            for batch in range(8):
                try:
                    async with eng.transaction() as txn:
                        await txn.table("d", "t").insert(
                            rows(batch * ROWS_PER_BATCH, ROWS_PER_BATCH)
                        )
                except Overloaded as exc:
                    refused = exc
                    break
                committed += 1
            assert refused is not None, "the hard limit never refused a commit"
            assert "l0 bytes" in str(refused)
            assert maintenance.memory_waits >= 1
            assert maintenance.errors >= 1  # the failed flushes are counted, not hidden
            assert await count(eng) == committed * ROWS_PER_BATCH
            objects.crash()  # the store answers again
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert(rows(10**6, 10))
            assert await count(eng) == committed * ROWS_PER_BATCH + 10
        finally:
            await eng.close()
        again = await Engine.open("unused", wal, objects=objects)
        try:
            assert await count(again) == committed * ROWS_PER_BATCH + 10
        finally:
            await again.close()

    run(main)
