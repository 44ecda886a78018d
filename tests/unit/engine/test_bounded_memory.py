"""Bounded memory (decision 0006): past `L0_BYTES_HARD_MAX` of unflushed L0 rows, commits
that append wait for flushes to give memory back, and fail with `Overloaded` after
`L0_WAIT_S_MAX` if none do; scans read a table larger than the buffer cache through it, and
only the columns they need. The limits are made small here so that a few batches reach them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import Column, Engine, Overloaded, Schema, limits, scan
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


@pytest.mark.parametrize("group_rows", [limits.SCAN_GROUP_ROWS, 2 * limits.BLOCK_ROWS_MAX])
def test_a_scan_of_a_table_larger_than_the_buffer_cache_streams_through_it(
    monkeypatch: pytest.MonkeyPatch, group_rows: int
) -> None:
    """About 5 MiB of note column in 6 objects through a 2 MiB cache: the scan loads,
    filters and unpins a group of objects at a time (the default group, the whole table
    here, is halved until it fits; the small one fits at once). Pinning the whole scan at
    once was `CacheFull`, so no query could read a table larger than the cache."""
    monkeypatch.setattr(limits, "SCAN_GROUP_ROWS", group_rows)
    total = 6 * limits.BLOCK_ROWS_MAX

    async def main() -> None:
        eng = await Engine.open(
            "unused",
            MemoryBackend(),
            objects=MemoryObjectStore(),
            maintenance=False,
            cache_bytes=2 << 20,
        )
        try:
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", SCHEMA)
            for first in range(0, total, limits.BLOCK_ROWS_MAX):
                async with eng.transaction() as txn:
                    await txn.table("d", "t").insert(rows(first, limits.BLOCK_ROWS_MAX))
                assert eng.maintenance is not None
                await eng.maintenance.settle(freeze_all=True)
            async with eng.transaction() as txn:
                await txn.table("d", "t").delete([5, total - 1])
            async with eng.transaction() as txn:
                table = txn.table("d", "t")
                everything = await table.scan()
                assert everything.num_rows == total - 2
                assert set(everything.column("note").to_pylist()) == {NOTE}
                assert everything.nbytes > 2 * (2 << 20)  # twice the cache
                window = (pc.field("id") >= 3) & (pc.field("id") < total)
                ids = await table.scan(["id"], filter=window)
                expected = [i for i in range(3, total) if i not in (5, total - 1)]
                assert sorted(ids.column("id").to_pylist()) == expected
        finally:
            await eng.close()

    run(main)


def test_a_filtered_scan_reads_the_columns_asked_for_and_those_its_filter_names() -> None:
    """Not every column: reading the wide string column for `customer == 42` thrashed the
    buffer cache of the 10M-row scan bench (1 s a query instead of 80 ms)."""
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("customer", pa.int32()),
            ("amount", pa.float64()),
            ("note", pa.string()),
        ]
    )
    customer = pc.field("customer") == 42
    assert scan._columns_to_read(schema, ["amount"], customer) == ["customer", "amount"]
    both = customer & (pc.field("id") > 1)
    assert scan._columns_to_read(schema, ["amount"], both) == ["id", "customer", "amount"]
    assert scan._columns_to_read(schema, ["amount"], pc.field("amount") > 1) == ["amount"]
    assert scan._columns_to_read(schema, None, customer) == schema.names
    # A filter naming no column of the table reads them all, and the scan then fails on it.
    assert scan._columns_to_read(schema, ["amount"], pc.field("nope") == 1) == schema.names
