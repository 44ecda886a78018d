"""A transaction is never refused for the conflict index's bookkeeping (issue 21, "A cliff
under concurrency"; engine/old_snapshots.py).

Proves, over a memory WAL and a memory object store (real Parquet objects with their
`__commit_ts` column) with a conflict index of a few keys, so that its floor rises past
open snapshots all the time: a transaction below the floor that wrote keys nobody changed
since its start commits; one whose key was inserted or deleted since (in L0, or already
flushed to a persisted block, or moved by a merge) is refused with WriteConflict or
DuplicateKey as first-committer-wins says. The hypothesis test drives random interleavings
of transactions, flushes and churn (commits of other keys that push the floor) against a
model of snapshot isolation: outcomes must be identical. On the old code every transaction
below the floor was refused with "snapshot too old": these tests fail there.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine import Column, DuplicateKey, Engine, Schema, Transaction, TxnLimits, WriteConflict
from engine.objects.store import MemoryObjectStore
from tae_driver.backends.memory import MemoryBackend

ROWS = Schema([Column("id", "int64"), Column("v", "int64")], primary_key=["id"])
KEYS_MAX = 3


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


async def fresh() -> Engine:
    eng = await Engine.open(
        "unused", MemoryBackend(), objects=MemoryObjectStore(), maintenance=False
    )
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
    eng._pipeline.conflicts.keys_max = KEYS_MAX
    return eng


async def churn(eng: Engine, keys: list[int]) -> None:
    """Commit other keys, then prune: the index forgets and its floor rises."""
    async with eng.transaction() as txn:
        await txn.table("d", "t").insert([{"id": k, "v": 0} for k in keys])
    eng._prune()


async def flush(eng: Engine) -> None:
    maintenance = eng.maintenance
    assert maintenance is not None
    await maintenance.settle(freeze_all=True)


def test_below_the_floor_disjoint_keys_commit_and_changed_keys_conflict() -> None:
    async def main() -> None:
        eng = await fresh()
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert([{"id": k, "v": 0} for k in (1, 2, 3)])
        await flush(eng)
        fresh_keys = itertools.count(1000)
        disjoint, inserts, deletes = await eng.begin(), await eng.begin(), await eng.begin()
        async with eng.transaction() as txn:  # after their start: insert 10, delete 2
            await txn.table("d", "t").insert({"id": 10, "v": 1})
            assert await txn.table("d", "t").delete([2]) == 1
        await flush(eng)  # the insert of 10 is in a persisted block now
        for _ in range(4):
            await churn(eng, [next(fresh_keys) for _ in range(KEYS_MAX + 1)])
        floor = eng._pipeline.conflicts.floor_ts
        assert floor > disjoint.start_ts, "the floor rose past the open snapshots"

        await disjoint.table("d", "t").insert({"id": 20, "v": 2})
        assert await disjoint.table("d", "t").delete([3]) == 1
        await disjoint.commit()  # refused as "snapshot too old" before

        await inserts.table("d", "t").insert({"id": 10, "v": 3})  # not live at its start
        with pytest.raises(DuplicateKey):
            await inserts.commit()

        assert await deletes.table("d", "t").delete([2]) == 1  # live at its start
        with pytest.raises(WriteConflict):
            await deletes.commit()

        async with eng.transaction() as txn:
            rows = await txn.table("d", "t").get(20)
            assert rows == {"id": 20, "v": 2}
            assert await txn.table("d", "t").get(3) is None
        await eng.close()

    run(main)


@dataclass
class _Open:
    txn: Transaction
    start_seq: int
    snapshot: set[int]
    inserted: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)

    def view(self) -> set[int]:
        return (self.snapshot - self.deleted) | self.inserted


KINDS = ("begin", "begin", "insert", "insert", "delete", "commit", "commit", "churn", "flush")
"""Weighted: transactions must often stay open across churn and then commit."""
OPS = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 2), st.integers(0, 7)),
    min_size=10,
    max_size=50,
)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_random_interleavings_match_snapshot_isolation(ops: list[tuple[Any, ...]]) -> None:
    async def main() -> None:
        eng = await fresh()
        live: set[int] = set()
        last_write: dict[int, int] = {}
        seq = 0
        slots: dict[int, _Open] = {}
        fresh_keys = itertools.count(1000)
        below_floor_commits = 0
        for op in ops:
            kind, slot_no, key = op
            if kind == "begin" and slot_no not in slots:
                slots[slot_no] = _Open(await eng.begin(), seq, set(live))
            elif kind == "insert" and slot_no in slots:
                slot = slots[slot_no]
                handle = slot.txn.table("d", "t")
                if key in slot.view():
                    with pytest.raises(DuplicateKey):
                        await handle.insert({"id": key, "v": 1})
                else:
                    await handle.insert({"id": key, "v": 1})
                    slot.inserted.add(key)
            elif kind == "delete" and slot_no in slots:
                slot = slots[slot_no]
                count = await slot.txn.table("d", "t").delete([key])
                assert count == (1 if key in slot.view() else 0)
                if key in slot.inserted:
                    slot.inserted.discard(key)
                elif key in slot.snapshot:
                    slot.deleted.add(key)
            elif kind == "commit" and slot_no in slots:
                slot = slots.pop(slot_no)
                writes = slot.inserted | slot.deleted
                conflict = any(last_write.get(k, 0) > slot.start_seq for k in writes)
                below = slot.txn.start_ts < eng._pipeline.conflicts.floor_ts
                below_floor_commits += below
                if conflict:
                    with pytest.raises((WriteConflict, DuplicateKey)) as raised:
                        await slot.txn.commit()
                    assert "snapshot too old" not in str(raised.value)
                else:
                    await slot.txn.commit()
                    if writes:
                        seq += 1
                        for written in writes:
                            last_write[written] = seq
                        live -= slot.deleted
                        live |= slot.inserted
            elif kind == "flush":
                await flush(eng)
            elif kind == "churn":
                await churn(eng, [next(fresh_keys) for _ in range(KEYS_MAX + 1)])
                seq += 1
        event(f"commits tried below the floor: {min(below_floor_commits, 3)}+")
        async with eng.transaction() as txn:
            for probe in range(8):
                found = await txn.table("d", "t").get(probe)
                assert (found is not None) == (probe in live), probe
        for slot in slots.values():
            await slot.txn.rollback()
        await eng.close()

    run(main)


def test_below_the_floor_a_spilled_insert_conflicts_and_a_merged_copy_does_not() -> None:
    """Changes only in persisted blocks: a large transaction's rows (written as objects,
    `__commit_ts` 0 standing for the block's create_ts) conflict with an old snapshot's
    insert of one of their keys; rows a merge copied after the snapshot started (their
    commit_ts older than it) are no change, so deleting one commits."""

    async def main() -> None:
        eng = await Engine.open(
            "unused",
            MemoryBackend(),
            objects=MemoryObjectStore(),
            maintenance=False,
            txn_limits=TxnLimits(spill_bytes=4096),
        )
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        eng._pipeline.conflicts.keys_max = KEYS_MAX
        for first in range(0, 15 * 10, 10):  # 15 L1 blocks: one short of a merge
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert(
                    [{"id": k, "v": 0} for k in range(first, first + 10)]
                )
            await flush(eng)
        old_insert, old_delete = await eng.begin(), await eng.begin()
        async with eng.transaction() as txn:  # a large transaction: spilled to objects
            await txn.table("d", "t").insert([{"id": k, "v": 1} for k in range(500, 1500)])
        data = next(t for t in eng._state.catalog.tables.values() if t.name == "t").data
        assert not data.l0_blocks() or all(b.rows == 0 for b in data.l0_blocks())
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert([{"id": k, "v": 0} for k in range(2000, 2010)])
        await flush(eng)  # the 16th L1 block: the 15 before and it merged into L2
        assert data.persisted_blocks()[0].drop_ts != 2**64 - 1, "merged"
        for _ in range(3):
            await churn(eng, [10_000 + i for i in range(KEYS_MAX + 1)])
            async with eng.transaction() as txn:
                await txn.table("d", "t").delete(list(range(10_000, 10_000 + KEYS_MAX + 1)))
        assert eng._pipeline.conflicts.floor_ts > old_insert.start_ts

        await old_insert.table("d", "t").insert({"id": 777, "v": 2})
        with pytest.raises(DuplicateKey):
            await old_insert.commit()

        assert await old_delete.table("d", "t").delete([42]) == 1
        await old_delete.commit()
        async with eng.transaction() as txn:
            assert await txn.table("d", "t").get(42) is None
            assert await txn.table("d", "t").get(777) == {"id": 777, "v": 1}
        await eng.close()

    run(main)


def test_a_delete_a_rewrite_copied_is_not_a_change_but_the_original_is() -> None:
    """`TableData.last_change_after` on hand-built blocks: key 5's row sits in block 1
    (inserted at 100), is deleted at 200, and a merge committed at 300 copies the row and
    its delete into block 2 (the delete at 300, the block's create_ts). A snapshot at 250
    sees no change (the copy is not one); a snapshot at 150 sees the delete at 200."""
    import pyarrow as pa
    from pyroaring import FrozenBitMap

    from engine.storage import BlockKeys, MappedLoadedBlocks, PersistedMeta, TableData
    from engine.wal.entry import BlockLevel, CreateBlock, Delete, DropBlock

    data = TableData("t", ROWS)
    rows = pa.table(
        {
            "id": pa.array([4, 5, 6], pa.int64()),
            "v": pa.array([0, 0, 0], pa.int64()),
            "__commit_ts": pa.array([100, 100, 100], pa.uint64()),
        }
    )

    def meta(cmd: CreateBlock) -> PersistedMeta:
        return PersistedMeta(4, 6, None, key_hashes=None)

    data.apply_create(CreateBlock(1, 1, 1, BlockLevel.L1, "a", 0, 3), 100, meta)
    data.apply_delete(Delete(1, 1, 1, FrozenBitMap([1])), 200)
    data.apply_create(CreateBlock(1, 1, 2, BlockLevel.L2, "b", 0, 3), 300, meta)
    data.apply_delete(Delete(1, 1, 2, FrozenBitMap([1])), 300)
    data.apply_drop(DropBlock(1, 1, 1), 300)
    keys = BlockKeys(rows.select(["id"]))
    loaded = MappedLoadedBlocks({1: keys, 2: keys}, {1: rows, 2: rows}, {})
    for start_ts, expected in ((250, None), (150, (200, False)), (50, (200, False))):
        (found,) = data.change_candidates_many([5], start_ts)
        assert data.last_change_after(5, start_ts, 400, found, loaded) == expected
    # Key 4 was never changed after 100; a version inserted at 350 in a block of its own is.
    assert (
        data.last_change_after(4, 150, 400, data.change_candidates_many([4], 150)[0], loaded)
        is None
    )
    later = rows.set_column(2, "__commit_ts", pa.array([350, 350, 350], pa.uint64()))
    data.apply_create(CreateBlock(1, 1, 3, BlockLevel.L1, "c", 0, 3), 350, meta)
    loaded = MappedLoadedBlocks({1: keys, 2: keys, 3: keys}, {1: rows, 2: rows, 3: later}, {})
    (found,) = data.change_candidates_many([4], 150)
    assert [b.block_id for b in found] == [1, 2, 3]  # 1 was dropped at 300, after 150
    assert data.last_change_after(4, 150, 400, found, loaded) == (350, True)
