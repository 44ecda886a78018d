"""Every delete the engine commits logs its rows' primary keys (the WAL's DeleteKeys, issue 23).

How: real engines on in-memory WALs commit deletes, updates, a delete re-resolved onto a flush's
output, and a large transaction's deletes of its own spilled rows; the test decodes the WAL's
entries and finds each Delete's keys, in its mask's offset order, naming the table's key
columns (a compound key in key order, not column order). Past `DELETE_KEYS_LOGGED_MAX` rows,
or when the keys would take the entry past `TXN_ENTRY_BYTES_MAX`, the transaction still
commits, logging its deletes without keys; a rewrite's carried deletes are keyless. A replay
of the logs rebuilds the same state, and refuses a DeleteKeys naming other key columns than
the table's.
"""

from __future__ import annotations

import asyncio
import datetime
import threading

import pytest
from pyroaring import FrozenBitMap

from engine import Column, Engine, Schema, TxnLimits, WalCorruption, limits
from engine.objects.store import MemoryObjectStore
from engine.wal.codec import decode_entry, encode_entry
from engine.wal.entry import CreateBlock, Delete, DeletedKeys, DropBlock, TxnEntry, memo_of
from tae_driver.backends.memory import MemoryBackend
from tae_driver.record import EntriesRecord, encode_record
from tests.unit.engine.memory_blocks import MemoryBlocks
from tests.unit.engine.test_rewrites import BLOCK, blocks_of
from tests.unit.engine.test_rewrites import ROWS as REWRITE_ROWS

KEYED = Schema(
    [
        Column("k", "int32"),
        Column("s", "string"),
        Column("d", "date32"),
        Column("v", "string", nullable=True),
    ],
    primary_key=["s", "k"],  # key order is not column order
)
DAY0 = datetime.date(2026, 1, 1)


def row(k: int) -> dict[str, object]:
    return {"k": k, "s": f"s{k % 3}", "d": DAY0 + datetime.timedelta(days=k), "v": f"v{k}"}


def key(k: int) -> tuple[str, int]:
    return (f"s{k % 3}", k)


def logged(wal: MemoryBackend) -> list[TxnEntry]:
    out = []
    for _, record in wal.user_records():
        assert isinstance(record, EntriesRecord)
        for index, payload in enumerate(record.entries):
            entry = decode_entry(payload, record.start_dsn + index)
            if isinstance(entry, TxnEntry):
                out.append(entry)
    return out


def deletes(entry: TxnEntry) -> list[Delete]:
    return [cmd for cmd in entry.commands if isinstance(cmd, Delete)]


async def open_keyed(wal: MemoryBackend, **options: object) -> Engine:
    eng = await Engine.open("unused", wal, maintenance=False, **options)  # type: ignore[arg-type]
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", KEYED)
    return eng


def test_deletes_and_updates_log_their_rows_keys_in_offset_order() -> None:
    async def main() -> None:
        wal = MemoryBackend()
        eng = await open_keyed(wal, objects="none")
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert([row(k) for k in range(20)])  # offset k
        async with eng.transaction() as txn:
            table = txn.table("d", "t")
            assert await table.delete([key(5), key(3), key(1), key(99)]) == 3
            await table.insert([row(40)])
            assert await table.delete([key(40)]) == 1  # its own insert: nothing to log
        (delete,) = deletes(logged(wal)[-1])
        assert list(delete.rows) == [1, 3, 5]
        assert delete.keys == DeletedKeys(
            (("s", "string"), ("k", "int32")), (key(1), key(3), key(5))
        )
        async with eng.transaction() as txn:
            assert await txn.table("d", "t").update([key(7)], {"v": "new"}) == 1
        (update,) = deletes(logged(wal)[-1])
        assert list(update.rows) == [7] and update.keys is not None
        assert update.keys.values == (key(7),)
        digest = eng.digest()
        await eng.close()
        again = await Engine.open("unused", wal, maintenance=False, objects="none")
        try:
            assert again.digest() == digest
        finally:
            await again.close()

    asyncio.run(main())


def test_a_delete_re_resolved_onto_a_flushs_output_keeps_its_keys() -> None:
    async def main() -> None:
        wal, blocks = MemoryBackend(), MemoryBlocks()
        eng = await Engine.open("unused", wal, block_store=blocks, maintenance=False)
        try:
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", REWRITE_ROWS)
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert(
                    [{"id": i, "v": f"v{i}", "n": None} for i in range(BLOCK)]
                )
            late = await eng.begin()  # deletes from the L0 block, commits after the swap
            await late.table("d", "t").delete([101, 100])
            blocks.gate = threading.Event()
            maintenance = eng.maintenance
            assert maintenance is not None
            started = maintenance.step()
            await asyncio.to_thread(blocks.writing.wait, 10)
            async with eng.transaction() as txn:  # committed while the flush writes
                await txn.table("d", "t").delete([2, 1])
            blocks.gate.set()
            await asyncio.gather(*started)
            await late.commit()
            (block,) = blocks_of(eng)
            entries = logged(wal)
            during, flush, after = entries[-3:]
            id_key = (("id", "int64"),)
            assert deletes(during)[0].keys == DeletedKeys(id_key, (1, 2))
            assert any(isinstance(c, DropBlock) for c in flush.commands)
            (carried,) = deletes(flush)
            assert list(carried.rows) == [1, 2] and carried.keys is None  # logged before
            (moved,) = deletes(after)
            assert moved.block_id == block.block_id != deletes(during)[0].block_id
            assert list(moved.rows) == [100, 101]  # sorted by id: offset = id
            assert moved.keys == DeletedKeys(id_key, (100, 101))
        finally:
            await eng.close()

    asyncio.run(main())


def test_a_large_transactions_deletes_of_its_spilled_rows_log_their_keys() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await Engine.open(
            "unused",
            wal,
            objects=objects,
            maintenance=False,
            txn_limits=TxnLimits(spill_bytes=64 * 1024),
        )
        try:
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", REWRITE_ROWS)
            async with eng.transaction() as txn:
                table = txn.table("d", "t")
                for first in range(0, 20_000, 5_000):
                    await table.insert(
                        [{"id": i, "v": f"v{i}", "n": 1} for i in range(first, first + 5_000)]
                    )
                assert await table.delete([7, 5]) == 2
            entry = logged(wal)[-1]
            created = {c.block_id for c in entry.commands if isinstance(c, CreateBlock)}
            (dead,) = deletes(entry)
            assert dead.block_id in created  # dead from the block's birth
            assert list(dead.rows) == [5, 7]
            assert dead.keys == DeletedKeys((("id", "int64"),), (5, 7))
        finally:
            await eng.close()

    asyncio.run(main())


def test_past_the_keys_limit_a_transaction_logs_its_deletes_without_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "DELETE_KEYS_LOGGED_MAX", 3)

    async def main() -> None:
        wal = MemoryBackend()
        eng = await open_keyed(wal, objects="none")
        try:
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert([row(k) for k in range(20)])
            async with eng.transaction() as txn:
                await txn.table("d", "t").delete([key(0), key(1), key(2)])
            (at_limit,) = deletes(logged(wal)[-1])
            assert at_limit.keys is not None and len(at_limit.keys.values) == 3
            async with eng.transaction() as txn:
                await txn.table("d", "t").delete([key(3), key(4)])
                await txn.table("d", "t").delete([key(5), key(6)])
            (past,) = deletes(logged(wal)[-1])
            assert list(past.rows) == [3, 4, 5, 6] and past.keys is None
            async with eng.transaction() as txn:
                assert (await txn.table("d", "t").scan()).num_rows == 13
        finally:
            await eng.close()

    asyncio.run(main())


def test_keys_that_would_not_fit_the_entry_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    wide = Schema([Column("s", "string"), Column("n", "int32")], primary_key=["s"])
    entry_bytes_max = 8 * 1024

    async def main() -> None:
        wal = MemoryBackend()
        eng = await Engine.open("unused", wal, maintenance=False, objects="none")
        try:
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", wide)
            names = [f"{i:04d}" + "x" * 500 for i in range(40)]  # 20 KB of keys
            for name in names:
                async with eng.transaction() as txn:
                    await txn.table("d", "t").insert([{"s": name, "n": 1}])
            monkeypatch.setattr(limits, "TXN_ENTRY_BYTES_MAX", entry_bytes_max)
            async with eng.transaction() as txn:
                await txn.table("d", "t").delete(names[:5])  # 2.5 KB: they fit
            (fits,) = deletes(logged(wal)[-1])
            assert fits.keys is not None and fits.keys.values == tuple(names[:5])
            async with eng.transaction() as txn:
                await txn.table("d", "t").delete(names[5:])
            (keyless,) = deletes(logged(wal)[-1])
            assert len(keyless.rows) == 35 and keyless.keys is None
            async with eng.transaction() as txn:
                assert (await txn.table("d", "t").scan()).num_rows == 0
        finally:
            await eng.close()

    asyncio.run(main())


def test_replay_refuses_keys_of_other_columns_than_the_tables_key() -> None:
    async def main() -> None:
        wal = MemoryBackend()
        eng = await open_keyed(wal, objects="none")
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert([row(k) for k in range(3)])
        async with eng.transaction() as txn:
            await txn.table("d", "t").delete([key(1)])
        (good,) = deletes(logged(wal)[-1])
        assert good.keys is not None
        await eng.close()
        lsn, record = wal.user_records()[-1]
        assert isinstance(record, EntriesRecord)
        dsn = record.start_dsn + len(record.entries)
        # Row 2 of the same block, its key given in column order instead of key order.
        wrong_columns = DeletedKeys((("k", "int32"), ("s", "string")), ((2, "s2"),))
        commands = (
            Delete(good.db_id, good.table_id, good.block_id, FrozenBitMap([2]), wrong_columns),
        )
        entry = TxnEntry(1 << 60, (1 << 60) + 1, memo_of(commands), commands)
        wal.put(lsn + 1, encode_record(dsn, dsn - 1, [encode_entry(entry)]))
        with pytest.raises(WalCorruption, match="keys name columns"):
            await Engine.open("unused", wal, maintenance=False, objects="none")

    asyncio.run(main())
