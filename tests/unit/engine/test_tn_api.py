"""What the TN needs of the engine (issue 15, decision 0007): logtail, compute nodes' write
sets with their origins, and a standby that tails the WAL and takes over.

Proves, in-process: the logtail buffer answers (t0, t1] with exactly the entries committed
in it, drops its oldest past its bound but keeps what follows the newest checkpoint, and a
node behind it is sent the checkpoint plus the entries after it; an engine's logtail replayed
on a fresh state gives the same digest; a write set runs with the outcome a local transaction
would have (conflicts, duplicates, DDL by name) and a retry of the same (client_id, seq) gets
the first commit_ts back, also after a restart and after a failover; a standby on the same
WAL follows every commit, serves reads at them, is refused commits, and once promoted
commits after the old writer's last entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import (
    BadInput,
    Column,
    DuplicateKey,
    Engine,
    Schema,
    SnapshotUnavailable,
    WriteConflict,
)
from engine import limits as engine_limits
from engine.blockstore import ObjectBlockStore
from engine.compaction import Policy
from engine.logtail import LogtailBuffer, LogtailUnavailable, TailEntry, answer
from engine.objects.store import LocalDirStore, MemoryObjectStore
from engine.state import EngineState
from engine.wal.codec import decode_entry
from engine.wal.entry import TxnEntry
from engine.writeset import Op, WriteSet
from tae_driver.backends.memory import MemoryBackend

ROWS = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], primary_key=["id"])


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def entry(ts: int, size: int = 10) -> TailEntry:
    return TailEntry(ts, ts, b"x" * size)


def test_the_buffer_answers_ranges_and_drops_its_oldest_but_not_after_the_checkpoint() -> None:
    buffer = LogtailBuffer(0, bytes_max=50)
    for ts in range(1, 6):
        buffer.append(entry(ts), keep_after_ts=0)
    assert [e.commit_ts for e in buffer.between(1, 4)] == [2, 3, 4]
    assert [e.commit_ts for e in buffer.between(0, 99)] == [1, 2, 3, 4, 5]
    for ts in range(6, 11):  # no checkpoint yet: all of it is kept, up to twice the bound
        buffer.append(entry(ts), keep_after_ts=0)
    assert buffer.base_ts == 0 and len(buffer) == 10
    buffer.append(entry(11), keep_after_ts=0)  # past twice the bound: the oldest goes
    assert buffer.base_ts == 1 and not buffer.covers(0)
    buffer.append(entry(12), keep_after_ts=6)  # a checkpoint at 6: what precedes it goes
    assert buffer.base_ts == 6 and buffer.full()
    assert [e.commit_ts for e in buffer.between(6, 99)] == [7, 8, 9, 10, 11, 12]
    got = answer(buffer, 2, 99, visible_ts=11, checkpoints=[(4, "old"), (6, "ckp6")])
    assert got.checkpoint == "ckp6" and got.checkpoint_ts == 6
    assert [e.commit_ts for e in got.entries] == [7, 8, 9, 10, 11] and got.upto_ts == 11
    with pytest.raises(LogtailUnavailable):
        answer(buffer, 2, 99, visible_ts=12, checkpoints=[(4, "old")])
    assert answer(buffer, 9, 10, visible_ts=11, checkpoints=[]).upto_ts == 10
    assert answer(buffer, 9, 99, visible_ts=10, checkpoints=[]).upto_ts == 10  # clamped


async def fresh(wal: MemoryBackend, objects: MemoryObjectStore, **options: Any) -> Engine:
    return await Engine.open("unused", wal, objects=objects, maintenance=False, **options)


async def shop(eng: Engine) -> None:
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)


def rows(*ids: int, v: str = "v") -> pa.Table:
    return pa.table({"id": list(ids), "v": [f"{v}{i}" for i in ids]}, schema=ROWS.to_arrow())


def test_a_logtail_rebuilds_the_engine_state_on_a_fresh_one() -> None:
    async def main() -> None:
        eng = await fresh(MemoryBackend(), MemoryObjectStore())
        await shop(eng)
        middle = 0
        for i in range(5):
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert(rows(i))
                if i:
                    await txn.table("d", "t").delete([i - 1])
            if i == 2:
                middle = eng.visible_ts
        tail = eng.logtail(0, eng.visible_ts)
        assert tail.checkpoint is None and tail.upto_ts == eng.visible_ts
        mirror = EngineState()
        for got in tail.entries:
            decoded = decode_entry(got.payload, got.dsn)
            assert isinstance(decoded, TxnEntry)
            mirror.apply(decoded)
        assert mirror.digest(eng.visible_ts, None) == eng.digest()
        assert mirror.digest(middle, None) == eng._state.digest(middle, None)
        part = eng.logtail(middle, eng.visible_ts)
        assert [e.commit_ts for e in part.entries] == [e.commit_ts for e in tail.entries][-2:]
        await eng.close()

    run(main)


def test_write_sets_run_as_local_transactions_and_retries_get_the_first_outcome() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await fresh(wal, objects)
        ddl = WriteSet(
            eng.visible_ts,
            (Op("create_database", "d"), Op("create_table", "d", "t", schema=ROWS)),
            "cn-1",
            1,
        )
        created = await eng.execute(ddl)
        assert await eng.execute(ddl) == created  # a retry: the same outcome, not AlreadyExists
        start = eng.visible_ts
        first = await eng.execute(
            WriteSet(start, (Op("insert", "d", "t", rows=rows(1, 2)),), "cn-1", 2)
        )
        # A second node, from the same snapshot, inserting a key the first one did: it loses.
        with pytest.raises(DuplicateKey):
            await eng.execute(WriteSet(start, (Op("insert", "d", "t", rows=rows(2)),), "cn-2", 1))
        later = eng.visible_ts
        update = WriteSet(
            later, (Op("update", "d", "t", keys=(1,), values={"v": "new"}),), "cn-2", 3
        )
        updated = await eng.execute(update)
        assert updated > first
        with pytest.raises(WriteConflict):  # the same row from the same snapshot: second loses
            await eng.execute(
                WriteSet(later, (Op("update", "d", "t", keys=(1,), values={"v": "x"}),), "cn-3", 1)
            )
        with pytest.raises(SnapshotUnavailable):
            await eng.execute(WriteSet(eng.visible_ts + 10, (), "cn-3", 2))
        with pytest.raises(BadInput):
            Op("truncate", "d")
        async with eng.transaction() as txn:
            assert await txn.table("d", "t").get(1) == {"id": 1, "v": "new"}
        await eng.close()
        again = await fresh(wal, objects)  # origins are rebuilt by replay
        try:
            assert await again.execute(update) == updated
            assert await again.execute(ddl) == created
        finally:
            await again.close()

    run(main)


def test_a_retry_while_a_cancelled_callers_commit_waits_for_the_wal_gets_its_outcome() -> None:
    """The first caller is cancelled while its commit waits for the WAL (a connection that
    dropped): the commit goes on, and a retry of the same origin in that window waits for it
    and answers its commit_ts, instead of running the write set again (DuplicateKey)."""

    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await fresh(wal, objects)
        try:
            await shop(eng)
            write_set = WriteSet(eng.visible_ts, (Op("insert", "d", "t", rows=rows(7)),), "cn-1", 5)
            wal.hold_appends = True
            first = asyncio.get_running_loop().create_task(eng.execute(write_set))
            await wal.wait_held(1)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            retry = asyncio.get_running_loop().create_task(eng.execute(write_set))
            await asyncio.sleep(0)
            assert not retry.done()  # waiting for the first commit, not running again
            (held,) = wal.held()
            wal.hold_appends = False
            await wal.release(held)
            commit_ts = await retry
            assert await eng.execute(write_set) == commit_ts
            async with eng.transaction() as txn:
                table = await txn.table("d", "t").scan()
            assert table.column("id").to_pylist() == [7]
        finally:
            await eng.close()

    run(main)


def test_a_subscriber_leaving_from_its_callback_does_not_make_the_next_one_miss_it() -> None:
    async def main() -> None:
        eng = await fresh(MemoryBackend(), MemoryObjectStore())
        try:
            heard: list[str] = []
            leave: list[Callable[[], None]] = []

            def first(tail: TailEntry) -> None:
                heard.append("first")
                leave[0]()

            leave.append(eng.subscribe(first))
            eng.subscribe(lambda tail: heard.append("second"))
            await shop(eng)
            assert heard[:2] == ["first", "second"]
            assert heard.count("first") == 1
        finally:
            await eng.close()

    run(main)


def test_a_standby_follows_the_writer_and_takes_over_when_promoted() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        active = await fresh(wal, objects)
        await shop(active)
        standby = await fresh(wal, objects, standby=True)
        try:
            for i in range(3):
                async with active.transaction() as txn:
                    await txn.table("d", "t").insert(rows(i))
            insert = WriteSet(active.visible_ts, (Op("insert", "d", "t", rows=rows(10)),), "cn", 7)
            landed = await active.execute(insert)
            for _ in range(200):
                if standby.visible_ts == active.visible_ts:
                    break
                await asyncio.sleep(0.01)
            assert standby.visible_ts == active.visible_ts
            assert standby.digest() == active.digest()
            async with standby.transaction() as txn:
                assert await txn.table("d", "t").get(10) == {"id": 10, "v": "v10"}
                with pytest.raises(BadInput):
                    await txn.table("d", "t").insert(rows(99))
                    await txn.commit()
            await active.abort()  # the writer dies
            await standby.promote()
            assert await standby.execute(insert) == landed  # the retry finds the first outcome
            async with standby.transaction() as txn:
                await txn.table("d", "t").insert(rows(11))
            assert standby.visible_ts > landed
            with pytest.raises(BadInput):
                await standby.promote()
        finally:
            await standby.close()
        again = await fresh(wal, objects)
        try:
            async with again.transaction() as txn:
                got = await txn.table("d", "t").scan(columns=["id"])
            assert sorted(got.column("id").to_pylist()) == [0, 1, 2, 10, 11]
        finally:
            await again.close()

    run(main)


def test_a_node_behind_the_buffer_starts_from_a_checkpoint() -> None:
    async def main() -> None:
        eng = await fresh(MemoryBackend(), MemoryObjectStore())
        await shop(eng)
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert(rows(1, 2, 3))
        manifest = await eng.checkpoint()
        assert manifest is not None
        eng._logtail.reset(manifest.ckp_ts)  # as if the older entries had been dropped
        async with eng.transaction() as txn:
            await txn.table("d", "t").delete([2])
        tail = eng.logtail(0, eng.visible_ts)
        assert tail.checkpoint == manifest.name and tail.checkpoint_ts == manifest.ckp_ts
        assert len(tail.entries) == 1
        await eng.close()

    run(main)


def test_a_promoted_standby_closes_the_store_it_opened_for_writing(tmp_path: Path) -> None:
    async def main() -> None:
        wal = MemoryBackend()
        writer_store = LocalDirStore(str(tmp_path))
        active = await Engine.open("unused", wal, objects=writer_store, maintenance=False)
        await shop(active)
        reader_store = LocalDirStore(str(tmp_path), read_only=True)
        standby = await Engine.open(
            "unused", wal, objects=reader_store, maintenance=False, standby=True
        )
        await active.abort()
        writer_store.close()  # the caller's store: the caller closes it
        await standby.promote()
        assert isinstance(standby._block_store, ObjectBlockStore)
        promoted = standby._block_store.store
        assert isinstance(promoted, LocalDirStore) and not promoted.read_only
        assert promoted._lock is not None  # the directory's lock, taken at promotion
        await standby.close()
        assert promoted._lock is None  # released by the engine that opened it

    run(main)


@pytest.mark.parametrize("grace_ms", [0, engine_limits.CN_SNAPSHOT_GRACE_MS])
def test_a_flush_between_a_cn_begin_and_its_write_set_refuses_it_only_without_the_grace(
    grace_ms: int,
) -> None:
    """A compute node begins at the TN's newest state; its write set arrives later, and the
    TN does not know of it until then. A flush in between drops the L0 block that snapshot
    reads, and with nobody registered below, the next maintenance round collects it: with no
    grace every in-flight CN transaction is then refused (what the distributed benchmark
    showed); a TN's grace keeps the dropped blocks, so the write set runs."""

    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await fresh(wal, objects, policy=Policy(snapshot_grace_ms=grace_ms))
        try:
            await shop(eng)
            await eng.execute(
                WriteSet(eng.visible_ts, (Op("insert", "d", "t", rows=rows(1)),), "c", 1)
            )
            start = eng.visible_ts  # what the compute node's begin saw
            maintenance = eng.maintenance
            assert maintenance is not None
            await maintenance.settle(freeze_all=True)  # the flush drops the L0 block
            maintenance.step()  # and collects what no registered reader holds
            write = WriteSet(start, (Op("insert", "d", "t", rows=rows(2)),), "c", 2)
            if not grace_ms:
                assert eng.history_floor_ts > start
                with pytest.raises(SnapshotUnavailable):
                    await eng.execute(write)
                return
            assert eng.history_floor_ts <= start
            assert await eng.execute(write) > start
            async with eng.transaction() as txn:
                assert await txn.table("d", "t").get(2) == {"id": 2, "v": "v2"}
        finally:
            await eng.close()

    run(main)
