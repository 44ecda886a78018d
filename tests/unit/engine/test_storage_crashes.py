"""A crash at every step of a flush, a merge, a compaction, a checkpoint, the WAL truncation
and the collection of garbage loses nothing committed, leaves nothing dangling, and its
leftovers are collected (issue 14 "Tests that must exist"; decision 0006).

How, in-process and deterministic: the engine runs on tae_driver's `MemoryBackend` (the WAL:
an append it holds is "submitted, not durable"; one it commits without telling the engine is
"durable, not told"; `HeldTruncation` holds the truncation a checkpoint asks for) and on a
`MemoryObjectStore` behind `CrashingStore` (tests/support/crashpoints.py), which kills the
engine at a chosen put or delete, before the call had any effect ("cut") or after it took
effect ("landed"). The test then aborts the engine (the in-process SIGKILL: nothing after
the crash point runs, the dead engine's threads can touch nothing) and opens a new one on the
same WAL and objects. Each case is one row of a table: the step, where the crash comes, and
what the restarted engine must have made of it (blocks per level, which checkpoint it began
from, how many orphans it deleted). For every case the restarted engine must have:

* the state digest of the committed state (flushes, merges, compactions and checkpoints
  change no row, so it is the digest before the step);
* every object that a block it holds (live, or dropped and kept) or a retained checkpoint
  refers to, readable (the digest reads every block);
* nothing else under data/ and ckp/: whatever the crash left behind was deleted at open;
* and then it finishes the work (flush, checkpoint), and a second restart has the same digest.

The directory store over the FaultFS power-loss layer and the file WAL are in
test_storage_power_loss.py; real processes killed with SIGKILL in
tests/e2e/test_engine_storage_processes.py.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from engine import Column, Engine, Schema
from engine.checkpoint import layout
from engine.compaction import Policy
from engine.objects.store import MemoryObjectStore, ObjectStore
from engine.storage import TS_NEVER, L0Block, PersistedBlock
from engine.wal.codec import decode_entry
from engine.wal.entry import BlockLevel, CheckpointEntry, CreateBlock, TxnEntry
from tae_driver.record import EntriesRecord
from tests.support.crashpoints import (
    CrashingStore,
    CrashPoint,
    HeldTruncation,
    ProcessKilled,
    contains,
    prefix,
)

ROWS = Schema(
    [Column("id", "int64"), Column("v", "string"), Column("n", "int32", nullable=True)],
    primary_key=["id"],
)
NO_MERGE = Policy(merge_l1_blocks=1000, compact_deleted_fraction=1.0)
MERGE = Policy(merge_l1_blocks=2, compact_deleted_fraction=1.0)
COMPACT = Policy(merge_l1_blocks=1000, compact_deleted_fraction=0.5)
WAIT_S_MAX = 10.0


def rows(ids: range | list[int]) -> list[dict[str, object]]:
    return [{"id": i, "v": f"v{i}", "n": i % 7 if i % 5 else None} for i in ids]


@dataclass
class World:
    """What outlives a crash: the WAL and the objects; and the object store port the running
    engine writes through (a new `CrashingStore` per engine "process")."""

    wal: HeldTruncation
    objects: MemoryObjectStore
    store: CrashingStore | None = None


async def open_engine(world: World, policy: Policy, store: CrashingStore | None = None) -> Engine:
    world.store = store if store is not None else CrashingStore(world.objects)
    eng = await Engine.open(
        "unused",
        world.wal,
        objects=world.store,
        policy=policy,
        maintenance=False,  # the test runs every step itself
        # No history window: these tests pin the WAL's truncation and the collection of
        # objects at the newest checkpoint (decision 0006); the window's are decision 0010's.
        history_retention=datetime.timedelta(0),
    )
    assert eng.checkpointer is not None
    eng.checkpointer.wal_reserve_entries = 0  # truncate right at the checkpoint: the hard case
    return eng


async def insert(eng: Engine, ids: range | list[int]) -> None:
    async with eng.transaction() as txn:
        await txn.table("d", "t").insert(rows(ids))


async def delete(eng: Engine, ids: list[int]) -> None:
    async with eng.transaction() as txn:
        await txn.table("d", "t").delete(ids)


async def settle(eng: Engine, *, freeze_all: bool = False) -> None:
    assert eng.maintenance is not None
    await eng.maintenance.settle(freeze_all=freeze_all)


def levels(eng: Engine) -> dict[str, int]:
    """Live blocks of d.t by level."""
    out = {"l0": 0, "l1": 0, "l2": 0}
    for table in eng._state.catalog.tables.values():
        for block in table.data.blocks.values():
            if block.drop_ts != TS_NEVER:
                continue
            if isinstance(block, L0Block):
                out["l0"] += 1
            else:
                out["l2" if block.level == BlockLevel.L2 else "l1"] += 1
    return out


def check_objects(eng: Engine, objects: ObjectStore) -> None:
    """Every object the engine refers to is there, and nothing else is (computed from the
    engine's state and its checkpoints, independently of its own reference counts, which
    must agree)."""
    held = {
        block.object_name
        for table in eng._state.catalog.tables.values()
        for block in table.data.blocks.values()
        if isinstance(block, PersistedBlock)
    }
    assert eng.checkpointer is not None
    retained = eng.checkpointer.retained
    needed = held | {m.name for m in retained}
    for manifest in retained:
        needed |= set(manifest.objects)
    stored = {info.name for info in objects.list("") if info.name.startswith(("data/", "ckp/"))}
    assert not needed - stored, f"referenced objects are missing: {sorted(needed - stored)}"
    assert not stored - needed, f"orphans were not collected: {sorted(stored - needed)}"
    store = eng._block_store
    assert store is not None
    assert store.refs.names() | {m.name for m in retained} == needed  # type: ignore[attr-defined]


async def restart(world: World, policy: Policy, digest: str) -> Engine:
    eng = await open_engine(world, policy)
    assert eng.digest() == digest
    check_objects(eng, world.objects)
    return eng


async def finish(eng: Engine, world: World, policy: Policy, digest: str) -> None:
    """The restarted engine does what the crash interrupted, checkpoints, and restarts
    again to the same state."""
    await settle(eng, freeze_all=True)
    await eng.checkpoint()
    assert eng.digest() == digest
    await eng.close()
    again = await restart(world, policy, digest)
    await again.close()


def held_entry(wal: HeldTruncation) -> TxnEntry | CheckpointEntry:
    (held,) = wal.held()
    record = held.decoded()
    assert isinstance(record, EntriesRecord) and len(record.entries) == 1
    return decode_entry(record.entries[0], record.start_dsn)


@dataclass(frozen=True)
class Crash:
    """Where the crash comes: at an object store call (`point`), or at the WAL entry the step
    appends: "submitted" (held, not durable), "durable" (in the log, the engine not told) or
    "applied" (the engine was told and applied it; the crash comes right after the step)."""

    point: CrashPoint | None = None
    wal: str | None = None
    truncation: str = "free"
    """"held": the WAL's truncation waits (the crash comes before it happens); "done": the
    crash waits until the WAL was truncated; "free": whatever happens first."""


async def crash_during(
    eng: Engine, world: World, step: Callable[[], Awaitable[Any]], crash: Crash
) -> None:
    """Run `step` until the crash point, then kill the engine there."""
    store = world.store
    assert store is not None
    if crash.truncation == "held":
        world.wal.hold()
    if crash.point is not None:
        store.arm(crash.point)
    else:
        world.wal.hold_appends = True
    task = asyncio.ensure_future(step())
    try:
        if crash.point is not None:
            await store.wait_crashed()
        else:
            await asyncio.wait_for(world.wal.wait_held(1), WAIT_S_MAX)
            entry = held_entry(world.wal)
            assert isinstance(entry, CheckpointEntry) or any(
                isinstance(c, CreateBlock) for c in entry.commands
            ), entry
            if crash.wal == "durable":
                world.wal.commit(world.wal.held()[0])
            elif crash.wal == "applied":
                world.wal.hold_appends = False
                await world.wal.release(world.wal.held()[0])
                await asyncio.wait_for(task, WAIT_S_MAX)
        if crash.truncation == "done":
            await asyncio.wait_for(_truncated(world.wal), WAIT_S_MAX)
        await eng.abort()
    finally:
        store.kill()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # cancelled, or killed
        world.wal.hold_appends = False
        world.wal.let_go()


async def _truncated(wal: HeldTruncation) -> None:
    while not wal.truncate_calls:
        await asyncio.sleep(0.001)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


# --- flush, merge, compaction ------------------------------------------------------------------


async def table_with_l0(world: World) -> tuple[Engine, str]:
    """d.t: 300 rows in an open L0 block (3 deleted), a checkpoint taken in the middle."""
    eng = await open_engine(world, NO_MERGE)
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
    await insert(eng, range(0, 200))
    await eng.checkpoint()
    await insert(eng, range(200, 300))
    await delete(eng, [5, 150, 250])
    return eng, eng.digest()


async def table_with_two_l1(world: World) -> tuple[Engine, str]:
    """d.t: two L1 blocks (one with deletes), flushed after a checkpoint (so the WAL tail
    holds their CreateBlocks), and an L0 block."""
    eng, _ = await table_with_l0(world)
    await settle(eng, freeze_all=True)
    await insert(eng, range(300, 400))
    await settle(eng, freeze_all=True)
    await delete(eng, [310])
    await insert(eng, range(400, 420))
    assert levels(eng) == {"l0": 1, "l1": 2, "l2": 0}
    return eng, eng.digest()


async def table_with_dead_l1(world: World) -> tuple[Engine, str]:
    """d.t: one L1 block of 300 rows, 200 of them deleted."""
    eng, _ = await table_with_l0(world)
    await settle(eng, freeze_all=True)
    await delete(eng, list(range(0, 200)))
    return eng, eng.digest()


CUT, LANDED = False, True
DATA_PUT_CUT = Crash(CrashPoint("put", prefix("data/"), landed=CUT))
DATA_PUT_LANDED = Crash(CrashPoint("put", prefix("data/"), landed=LANDED))
ENTRY_SUBMITTED = Crash(wal="submitted")
ENTRY_DURABLE = Crash(wal="durable")
ENTRY_APPLIED = Crash(wal="applied")

REWRITE_CASES = [
    # (name, setup, policy, crash, levels after the restart, orphans it deletes)
    ("flush: object put cut", table_with_l0, NO_MERGE, DATA_PUT_CUT, (1, 0, 0), 0),
    ("flush: object written, not logged", table_with_l0, NO_MERGE, DATA_PUT_LANDED, (1, 0, 0), 1),
    ("flush: entry submitted", table_with_l0, NO_MERGE, ENTRY_SUBMITTED, (1, 0, 0), 1),
    ("flush: entry durable, not told", table_with_l0, NO_MERGE, ENTRY_DURABLE, (0, 1, 0), 0),
    ("flush: entry applied", table_with_l0, NO_MERGE, ENTRY_APPLIED, (0, 1, 0), 0),
    ("merge: object put cut", table_with_two_l1, MERGE, DATA_PUT_CUT, (1, 2, 0), 0),
    ("merge: object written", table_with_two_l1, MERGE, DATA_PUT_LANDED, (1, 2, 0), 1),
    ("merge: entry submitted", table_with_two_l1, MERGE, ENTRY_SUBMITTED, (1, 2, 0), 1),
    ("merge: entry durable", table_with_two_l1, MERGE, ENTRY_DURABLE, (1, 0, 1), 0),
    ("merge: entry applied", table_with_two_l1, MERGE, ENTRY_APPLIED, (1, 0, 1), 0),
    ("compact: object written", table_with_dead_l1, COMPACT, DATA_PUT_LANDED, (0, 1, 0), 1),
    ("compact: entry submitted", table_with_dead_l1, COMPACT, ENTRY_SUBMITTED, (0, 1, 0), 1),
    ("compact: entry durable", table_with_dead_l1, COMPACT, ENTRY_DURABLE, (0, 1, 0), 0),
]


@pytest.mark.parametrize(
    ("setup", "policy", "crash", "expected_levels", "orphans"),
    [case[1:] for case in REWRITE_CASES],
    ids=[case[0] for case in REWRITE_CASES],
)
def test_a_crash_at_each_step_of_a_rewrite(
    setup: Callable[[World], Awaitable[tuple[Engine, str]]],
    policy: Policy,
    crash: Crash,
    expected_levels: tuple[int, int, int],
    orphans: int,
) -> None:
    async def main() -> None:
        world = World(HeldTruncation(), MemoryObjectStore())
        eng, digest = await setup(world)
        assert eng.maintenance is not None
        eng.maintenance.policy = policy
        # A flush seals the open block first; a merge or a compaction leaves it alone, so
        # that it is the only rewrite in flight.
        freeze = setup is table_with_l0
        await crash_during(eng, world, lambda: settle(eng, freeze_all=freeze), crash)
        again = await restart(world, policy, digest)
        assert tuple(levels(again).values()) == expected_levels
        assert again.checkpointer is not None
        assert again.checkpointer.orphans_deleted == orphans
        if policy is COMPACT and crash is ENTRY_DURABLE:  # the compaction is in: dead rows gone
            assert sum(b.rows for b in _live_persisted(again)) == again.stats().live_rows
        await finish(again, world, policy, digest)

    run(main)


def _live_persisted(eng: Engine) -> list[PersistedBlock]:
    return [
        b
        for t in eng._state.catalog.tables.values()
        for b in t.data.blocks.values()
        if isinstance(b, PersistedBlock) and b.drop_ts == TS_NEVER
    ]


def test_a_crash_after_a_merge_before_a_checkpoint_covers_its_inputs_keeps_them() -> None:
    """The merge's inputs were collected (no reader needs them) but no checkpoint covers
    their drop: their CreateBlocks are still in the WAL tail, so the restart reads their
    objects, which must still be there."""

    async def main() -> None:
        world = World(HeldTruncation(), MemoryObjectStore())
        eng, digest = await table_with_two_l1(world)
        assert eng.maintenance is not None
        eng.maintenance.policy = MERGE
        await settle(eng)
        eng.maintenance.step()  # collects the dropped inputs
        assert eng._block_store.pending_garbage == 2  # type: ignore[union-attr]
        await eng.abort()
        again = await restart(world, MERGE, digest)
        assert levels(again) == {"l0": 1, "l1": 0, "l2": 1}
        assert again.checkpointer is not None and again.checkpointer.orphans_deleted == 0
        await finish(again, world, MERGE, digest)

    run(main)


@pytest.mark.parametrize("landed", [CUT, LANDED], ids=["cut", "landed"])
def test_a_crash_while_deleting_garbage_a_checkpoint_covers(landed: bool) -> None:
    """A checkpoint covers the drop of a merge's inputs and deletes their objects; the crash
    comes at the first delete. The restart begins from that checkpoint, which no longer
    names them: they are orphans, deleted at open."""

    async def main() -> None:
        world = World(HeldTruncation(), MemoryObjectStore())
        eng, digest = await table_with_two_l1(world)
        assert eng.maintenance is not None
        eng.maintenance.policy = MERGE
        await settle(eng)
        eng.maintenance.step()
        point = CrashPoint("delete", prefix("data/"), landed=landed)
        await crash_during(eng, world, eng.checkpoint, Crash(point))
        again = await restart(world, MERGE, digest)
        assert again.checkpointer is not None
        assert again.checkpointer.orphans_deleted == (1 if landed else 2)
        assert again.stats().replay.entries_applied == 0  # type: ignore[union-attr]
        await finish(again, world, MERGE, digest)

    run(main)


# --- checkpoints, WAL truncation, retirement ---------------------------------------------------


async def table_with_two_checkpoints(world: World) -> tuple[Engine, str, list[str]]:
    """d.t with an L1 block and an L0 block, deletes on both, two checkpoints taken (so the
    third retires the first), and commits after the second."""
    eng = await open_engine(world, NO_MERGE)
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
        await txn.create_table("d", "gone", ROWS)
    await insert(eng, range(0, 200))
    await settle(eng, freeze_all=True)
    await insert(eng, range(200, 300))
    await delete(eng, [1, 250])
    manifests = []
    for round_ in range(2):
        manifest = await eng.checkpoint()
        assert manifest is not None
        manifests.append(manifest.name)
        await insert(eng, range(300 + 50 * round_, 350 + 50 * round_))
        await delete(eng, [2 + round_, 260 + round_])
    async with eng.transaction() as txn:
        await txn.drop_table("d", "gone")
    return eng, eng.digest(), manifests


def _put(part: str, landed: bool) -> Crash:
    return Crash(CrashPoint("put", contains(part), landed=landed, label=part))


RETIRE_MANIFEST_CUT = CrashPoint("delete", contains(layout.MANIFEST_NAME), landed=CUT)

CHECKPOINT_CASES = [
    # (name, crash, the checkpoint the restart begins from: "old" (the second) or "new")
    ("first dump put cut", _put("/l0-", CUT), "old"),
    ("a dump written", _put("/l0-", LANDED), "old"),
    ("a delta object written", _put("/delta-", LANDED), "old"),
    ("the catalog written", _put("/catalog.parquet", LANDED), "old"),
    ("the block list written", _put("/blocks.parquet", LANDED), "old"),
    ("manifest put cut", _put("/" + layout.MANIFEST_NAME, CUT), "old"),
    ("manifest written, CKP not logged", _put("/" + layout.MANIFEST_NAME, LANDED), "new"),
    ("CKP entry submitted", Crash(wal="submitted"), "new"),
    ("CKP entry durable, not told", Crash(wal="durable"), "new"),
    ("CKP logged, WAL not truncated", Crash(RETIRE_MANIFEST_CUT, truncation="held"), "new"),
    ("WAL truncated, nothing retired", Crash(RETIRE_MANIFEST_CUT, truncation="done"), "new"),
    (
        "old manifest deleted, its objects not",
        Crash(CrashPoint("delete", contains(layout.MANIFEST_NAME), landed=LANDED)),
        "new",
    ),
    (
        "retirement half done",
        Crash(CrashPoint("delete", prefix(layout.PREFIX), nth=2, landed=LANDED)),
        "new",
    ),
]


@pytest.mark.parametrize(
    ("crash", "begins_from"),
    [case[1:] for case in CHECKPOINT_CASES],
    ids=[case[0] for case in CHECKPOINT_CASES],
)
def test_a_crash_at_each_step_of_a_checkpoint(crash: Crash, begins_from: str) -> None:
    async def main() -> None:
        world = World(HeldTruncation(), MemoryObjectStore())
        eng, digest, (first, second) = await table_with_two_checkpoints(world)
        visible_ts = eng.visible_ts
        truncated = await world.wal.truncated()  # at the second checkpoint
        await crash_during(eng, world, lambda: eng.checkpoint(), crash)
        if crash.truncation == "held":
            assert await world.wal.truncated() == truncated
        if crash.truncation == "done":
            assert await world.wal.truncated() > truncated
        again = await restart(world, NO_MERGE, digest)
        assert again.checkpointer is not None
        newest = again.checkpointer.newest
        assert newest is not None
        if begins_from == "new":
            assert newest.ckp_ts == visible_ts
            replay = again.stats().replay
            assert replay is not None and replay.entries_applied == 0
        else:
            assert newest.name == second
            orphans = again.checkpointer.orphans_deleted
            assert orphans >= (1 if crash.point and crash.point.landed else 0)
        # The retained checkpoints are left, no more (a retirement the crash cut is finished
        # by the orphan collection at open).
        manifests = [i.name for i in world.objects.list(layout.PREFIX) if i.name.endswith("json")]
        kept = [second, newest.name] if begins_from == "new" else [first, second]
        assert manifests == kept
        await finish(again, world, NO_MERGE, digest)

    run(main)


def test_a_crash_while_the_open_collects_orphans_is_finished_by_the_next_open() -> None:
    async def main() -> None:
        world = World(HeldTruncation(), MemoryObjectStore())
        eng, digest, _ = await table_with_two_checkpoints(world)
        await crash_during(eng, world, lambda: eng.checkpoint(), _put("/blocks.parquet", LANDED))
        leftovers = {i.name for i in world.objects.list(layout.PREFIX)}
        store = CrashingStore(world.objects, CrashPoint("delete", prefix("ckp/"), landed=LANDED))
        opening = asyncio.ensure_future(open_engine(world, NO_MERGE, store))
        await store.wait_crashed()
        store.kill()
        with pytest.raises(ProcessKilled):
            await opening
        assert store.crashed_on not in {i.name for i in world.objects.list(layout.PREFIX)}
        again = await restart(world, NO_MERGE, digest)
        assert again.checkpointer is not None and again.checkpointer.orphans_deleted >= 1
        assert leftovers - {i.name for i in world.objects.list(layout.PREFIX)}
        await finish(again, world, NO_MERGE, digest)

    run(main)


def test_a_put_that_landed_but_failed_leaves_an_orphan_until_the_next_open() -> None:
    """Not a crash: the store stored the object and answered with an error (a timeout after
    the request landed: `fail_next(after_effect=True)`). The flush fails and is retried with
    a new object; the first one is referred to by nothing. The running engine does not know
    it exists (it never got a name back it could trust); the next open lists the store and
    deletes it."""

    async def main() -> None:
        world = World(HeldTruncation(), MemoryObjectStore())
        eng, digest = await table_with_l0(world)
        assert eng.maintenance is not None
        world.objects.fail_next("put", after_effect=True)
        await asyncio.gather(*eng.maintenance.step(freeze_all=True))
        assert eng.maintenance.errors == 1
        assert levels(eng) == {"l0": 1, "l1": 0, "l2": 0}
        await settle(eng)  # the next round flushes it, to a new object
        assert levels(eng) == {"l0": 0, "l1": 1, "l2": 0}
        data = [n for n in world.objects.names() if n.startswith("data/")]
        assert len(data) == 2  # the flushed block's object, and the orphan
        await eng.close()
        again = await restart(world, NO_MERGE, digest)
        assert again.checkpointer is not None and again.checkpointer.orphans_deleted == 1
        await finish(again, world, NO_MERGE, digest)

    run(main)
