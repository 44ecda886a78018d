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

from engine import (
    BadInput,
    Column,
    DuplicateKey,
    Engine,
    Schema,
    Transaction,
    TxnLimits,
    TxnTooLarge,
    WriteConflict,
)
from engine.objects.store import MemoryObjectStore
from engine.wal.codec import decode_entry
from engine.wal.entry import CreateBlock, TxnEntry
from tae_driver.backends import segment
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


async def fresh(
    wal: MemoryBackend, objects: MemoryObjectStore, txn_limits: TxnLimits | None = None
) -> Engine:
    eng = await Engine.open(
        "unused", wal, objects=objects, maintenance=False, txn_limits=txn_limits
    )
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


def test_the_spill_limit_is_named_and_raisable_at_open() -> None:
    async def main() -> None:
        low = TxnLimits(rows_max=50_000)
        eng = await fresh(MemoryBackend(), MemoryObjectStore(), txn_limits=low)
        try:
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert(batch(0, 40_000))
                with pytest.raises(TxnTooLarge) as caught:
                    await txn.table("d", "t").insert(batch(40_000, 20_000))
                assert caught.value.limit == "txn_spill_rows_max"
                assert "TxnLimits(rows_max=" in str(caught.value)
        finally:
            await eng.close()
        with pytest.raises(BadInput, match="spill_bytes"):
            await Engine.open("unused", MemoryBackend(), txn_limits=TxnLimits(spill_bytes=0))

    run(main)


# --- Large updates and deletes (issue 20) -------------------------------------------------------

WIDE = Schema(
    [Column("id", "int64"), *(Column(f"c{i}", "string") for i in range(40))],
    primary_key=["id"],
)


async def loaded(eng: Engine, count: int, step: int = 50_000) -> None:
    """Table d.t holds ids [0, count), committed in transactions of `step` rows."""
    for first in range(0, count, step):
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert(batch(first, min(step, count - first)))


def test_an_update_of_many_rows_commits_in_one_transaction_and_survives_a_reopen() -> None:
    """An update is a delete and an insert of new versions: the new versions spill like a
    large insert's rows (it failed at the 1 MiB workspace), the old ones are masks. The
    rows come from L0 blocks, flushed blocks and the transaction's own spill."""

    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await fresh(wal, objects)
        count = 60_000
        await loaded(eng, count)
        assert eng.maintenance is not None
        await eng.maintenance.settle()  # most rows in flushed L1 blocks, the tail in L0
        async with eng.transaction() as txn:
            table = txn.table("d", "t")
            await table.insert(batch(count, 40_000))  # spilled in this transaction
            assert await table.update(list(range(count + 40_000)), {"v": "new"}) == 100_000
            assert await table.update([5, count + 5, 10**9], {"v": "twice"}) == 2
            assert await table.get(7) == {"id": 7, "v": "new"}
        async with eng.snapshot(eng.visible_ts) as view:
            got = await view.table("d", "t").scan()
        assert got.num_rows == 100_000
        values = got.column("v").to_pylist()
        assert values.count("new") == 99_998 and values.count("twice") == 2
        digest = eng.digest()
        await eng.close()
        again = await Engine.open("unused", wal, objects=objects, maintenance=False)
        try:
            assert again.digest() == digest
        finally:
            await again.close()

    run(main)


def test_a_delete_of_150k_keys_commits_in_one_transaction() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await fresh(wal, objects)
        await loaded(eng, 160_000, step=80_000)
        async with eng.transaction() as txn:
            table = txn.table("d", "t")
            assert await table.delete(range(150_000)) == 150_000
            assert await table.get(149_999) is None
            await table.insert(batch(3, 1, "back"))  # deleted here: may come back
        async with eng.snapshot(eng.visible_ts) as view:
            ids = (await view.table("d", "t").scan(columns=["id"])).column("id").to_pylist()
        assert sorted(ids) == [3, *range(150_000, 160_000)]
        digest = eng.digest()
        await eng.close()
        again = await Engine.open("unused", wal, objects=objects, maintenance=False)
        try:
            assert again.digest() == digest
        finally:
            await again.close()

    run(main)


def test_a_large_delete_still_conflicts_with_a_concurrent_write_of_one_of_its_keys() -> None:
    """Past TXN_BULK_KEYS_MIN deleted rows a table's deleted keys reach the conflict index
    as one sorted array: checked both ways, first committer wins, other keys pass."""

    async def main() -> None:
        eng = await fresh(MemoryBackend(), MemoryObjectStore())
        try:
            await loaded(eng, 30_000)
            big = await eng.begin()
            await big.table("d", "t").delete(range(10_000))
            async with eng.transaction() as other:  # commits first, on one of its keys
                await other.table("d", "t").update([9_999], {"v": "first"})
            with pytest.raises(WriteConflict):
                await big.commit()

            small = await eng.begin()
            big = await eng.begin()
            await big.table("d", "t").delete(range(10_000, 20_000))
            async with eng.transaction() as other:  # not one of its keys
                await other.table("d", "t").update([0], {"v": "after"})
            await big.commit()  # the large delete commits first...
            await small.table("d", "t").update([15_000], {"v": "late"})
            with pytest.raises(WriteConflict):
                await small.commit()  # ...and a concurrent write of one of its keys loses

            async with eng.snapshot(eng.visible_ts) as view:
                ids = (await view.table("d", "t").scan(columns=["id"])).column("id")
            assert sorted(ids.to_pylist()) == [*range(10_000), *range(20_000, 30_000)]
        finally:
            await eng.close()

    run(main)


def test_updating_one_column_of_5000_wide_rows() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await Engine.open("unused", wal, objects=objects, maintenance=False)
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "w", WIDE)
        wide_rows = [
            {"id": i, **{f"c{c}": f"{c}-{i:06d}" * 4 for c in range(40)}} for i in range(5_000)
        ]
        async with eng.transaction() as txn:
            await txn.table("d", "w").insert(wide_rows)  # ~8 MiB: spilled
        async with eng.transaction() as txn:
            assert await txn.table("d", "w").update(range(5_000), {"c7": "x"}) == 5_000
        async with eng.snapshot(eng.visible_ts) as view:
            got = await view.table("d", "w").scan(columns=["c7", "c8"])
        assert set(got.column("c7").to_pylist()) == {"x"}
        assert got.column("c8").to_pylist()[:1] != ["x"]
        await eng.close()

    run(main)


def test_a_too_large_delete_or_update_is_refused_before_any_work() -> None:
    """The sizes are checked from the keys given, before any row is looked up; the message
    names the limit and says how to split the transaction; raising the limit at open lets
    the same transaction through."""

    async def main() -> None:
        low = TxnLimits(deletes_max=5_000, rows_max=5_000)
        eng = await fresh(MemoryBackend(), MemoryObjectStore(), txn_limits=low)
        try:
            await loaded(eng, 8_000, step=4_000)
            lookups = 0
            original = Transaction._find_live

            async def counting(self: Transaction, *args: Any) -> Any:
                nonlocal lookups
                lookups += 1
                return await original(self, *args)

            Transaction._find_live = counting  # type: ignore[method-assign,assignment]
            try:
                async with eng.transaction() as txn:
                    table = txn.table("d", "t")
                    with pytest.raises(TxnTooLarge) as caught:
                        await table.delete(range(6_000))
                    assert caught.value.limit == "txn_deletes_max"
                    message = str(caught.value)
                    assert "6000 > 5000" in message and "split it into transactions" in message
                    assert "TxnLimits(deletes_max=" in message
                    with pytest.raises(TxnTooLarge, match="txn_deletes_max"):
                        await table.update(range(6_000), {"v": "x"})
                    assert lookups == 0  # refused before any lookup
                    assert await table.delete(range(3_000)) == 3_000  # the transaction goes on
                    with pytest.raises(TxnTooLarge, match="txn_deletes_max 6000 > 5000"):
                        await table.update(range(3_000, 6_000), {"v": "x"})
                    assert lookups == 1
            finally:
                Transaction._find_live = original  # type: ignore[method-assign]
        finally:
            await eng.close()
        high = TxnLimits(deletes_max=10_000, rows_max=10_000)
        eng = await fresh(MemoryBackend(), MemoryObjectStore(), txn_limits=high)
        try:
            await loaded(eng, 8_000)
            async with eng.transaction() as txn:
                assert await txn.table("d", "t").update(range(6_000), {"v": "x"}) == 6_000
        finally:
            await eng.close()

    run(main)


def written_bytes(path: Path) -> int:
    return segment.read_segment_frames(path.read_bytes(), str(path), newest=True).end_offset


def test_large_transactions_over_a_file_wal_and_a_directory(tmp_path: Path) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path), maintenance=False)
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        async with eng.transaction() as txn:
            for first in range(0, BIG, 50_000):
                await txn.table("d", "t").insert(batch(first, 50_000))
        segments = (tmp_path / "wal").glob("wal-*.seg")  # preallocated: count what is written
        wal_bytes = sum(written_bytes(p) for p in segments)
        assert wal_bytes < 1 << 20  # the rows went to objects, not to the log
        digest = eng.digest()
        await eng.close()
        again = await Engine.open(str(tmp_path))
        try:
            assert again.digest() == digest
        finally:
            await again.close()

    run(main)
