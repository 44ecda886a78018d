"""Large transactions write their rows to objects before commit (issue 14 "Large
transactions"; engine/spill.py).

Proves, over real object stores (`MemoryObjectStore`; a directory beside a file WAL): a
transaction far past the WAL entry's size commits, its entry carries CreateBlock metadata
instead of rows, and every row is there after a restart; before commit the transaction
reads its own spilled rows (get, scan) and deletes or updates them, and a second insert of a
spilled key is a `DuplicateKey`; the commit's conflict check uses the spilled keys both ways
(a concurrent insert of one of them loses, whichever commits first); a rollback deletes the
objects and a crash leaves orphans the next open collects; the spill limit is named.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import Column, DuplicateKey, Engine, Schema, TxnTooLarge, limits
from engine.objects.store import MemoryObjectStore
from engine.wal.codec import decode_entry
from engine.wal.entry import CreateBlock, TxnEntry
from tae_driver.backends.memory import MemoryBackend
from tae_driver.record import EntriesRecord

ROWS = Schema([Column("id", "int64"), Column("v", "string")], primary_key=["id"])
ARROW = ROWS.to_arrow()


def batch(first: int, count: int, tag: str = "v") -> pa.RecordBatch:
    ids = list(range(first, first + count))
    return pa.RecordBatch.from_arrays(
        [pa.array(ids, pa.int64()), pa.array([f"{tag}{i:08d}" for i in ids])], schema=ARROW
    )


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


async def fresh(wal: MemoryBackend, objects: MemoryObjectStore) -> Engine:
    eng = await Engine.open("unused", wal, objects=objects, maintenance=False)
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
    return eng


BIG = 200_000  # about 4 MiB of rows: past the WAL entry's 2 MiB and four spill thresholds


def test_a_large_transaction_commits_its_rows_as_objects_and_keeps_them() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await fresh(wal, objects)
        async with eng.transaction() as txn:
            table = txn.table("d", "t")
            for first in range(0, BIG, 20_000):
                await table.insert(batch(first, 20_000))
            # Its own spilled rows, before commit:
            assert await table.get(12_345) == {"id": 12_345, "v": "v00012345"}
            assert (await table.scan(columns=["id"])).num_rows == BIG
            assert await table.delete([5, 6, 150_000]) == 3
            assert await table.update([7], {"v": "updated"}) == 1
            assert await table.get(6) is None
            assert await table.get(7) == {"id": 7, "v": "updated"}
            with pytest.raises(DuplicateKey):
                await table.insert(batch(100, 1))
            await table.insert(batch(6, 1, "again"))  # deleted in this txn: may come back
            got = await table.scan(filter=pc.field("id") < 10)
            assert sorted(got.column("id").to_pylist()) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
        (_, record) = wal.user_records()[-1]
        assert isinstance(record, EntriesRecord)
        last = decode_entry(record.entries[-1], 0)
        assert isinstance(last, TxnEntry)
        assert sum(isinstance(c, CreateBlock) for c in last.commands) >= 4
        assert len(record.entries[-1]) < 1 << 20  # metadata, not 200,000 rows
        assert eng.stats().live_rows == BIG - 2  # 5 and 150,000 deleted
        digest = eng.digest()
        await eng.close()
        again = await Engine.open("unused", wal, objects=objects, maintenance=False)
        try:
            assert again.digest() == digest
            async with again.transaction() as txn:
                table = txn.table("d", "t")
                assert await table.get(199_999) == {"id": 199_999, "v": "v00199999"}
                assert await table.get(6) == {"id": 6, "v": "again00000006"}
                with pytest.raises(DuplicateKey):  # committed spilled keys are live keys
                    await table.insert(batch(42, 1))
        finally:
            await again.close()

    run(main)


def test_spilled_keys_conflict_both_ways_with_concurrent_inserts() -> None:
    async def main() -> None:
        eng = await fresh(MemoryBackend(), MemoryObjectStore())
        try:
            big = await eng.begin()
            small = await eng.begin()
            for first in range(0, 60_000, 20_000):
                await big.table("d", "t").insert(batch(first, 20_000))
            await small.table("d", "t").insert(batch(30_000, 1, "small"))
            await small.commit()  # first committer wins
            with pytest.raises(DuplicateKey):
                await big.commit()

            big = await eng.begin()
            late = await eng.begin()
            for first in range(100_000, 160_000, 20_000):
                await big.table("d", "t").insert(batch(first, 20_000))
            await big.commit()
            await late.table("d", "t").insert(batch(120_000, 1, "late"))
            with pytest.raises(DuplicateKey):
                await late.commit()
        finally:
            await eng.close()

    run(main)


def test_a_rolled_back_or_crashed_large_transaction_leaves_no_object_behind() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await fresh(wal, objects)
        async with eng.transaction() as txn:
            for first in range(0, 60_000, 20_000):
                await txn.table("d", "t").insert(batch(first, 20_000))
            assert objects.list("data/")
            await txn.rollback()
        for _ in range(50):  # the discard runs in the background
            if not objects.list("data/"):
                break
            await asyncio.sleep(0.02)
        assert not objects.list("data/")

        txn = await eng.begin()
        for first in range(0, 60_000, 20_000):
            await txn.table("d", "t").insert(batch(first, 20_000))
        assert objects.list("data/")
        await eng.abort()  # a crash before the commit
        again = await Engine.open("unused", wal, objects=objects, maintenance=False)
        try:
            assert not objects.list("data/")  # orphans collected at open
            assert again.stats().live_rows == 0
        finally:
            await again.close()

    run(main)


def test_the_spill_limit_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "TXN_SPILL_ROWS_MAX", 50_000)

    async def main() -> None:
        eng = await fresh(MemoryBackend(), MemoryObjectStore())
        try:
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert(batch(0, 40_000))
                with pytest.raises(TxnTooLarge) as caught:
                    await txn.table("d", "t").insert(batch(40_000, 20_000))
                assert caught.value.limit == "txn_spill_rows_max"
        finally:
            await eng.close()

    run(main)


def test_large_transactions_over_a_file_wal_and_a_directory(tmp_path: Path) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path), maintenance=False)
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        async with eng.transaction() as txn:
            for first in range(0, BIG, 50_000):
                await txn.table("d", "t").insert(batch(first, 50_000))
        wal_bytes = sum(p.stat().st_size for p in (tmp_path / "wal").rglob("*") if p.is_file())
        assert wal_bytes < 1 << 20  # the rows went to objects, not to the log
        digest = eng.digest()
        await eng.close()
        again = await Engine.open(str(tmp_path))
        try:
            assert again.digest() == digest
        finally:
            await again.close()

    run(main)
