"""Checkpoints: the state at ckp_ts in objects, the WAL truncated below it, restart from the
newest checkpoint plus the WAL tail (decision 0006; seed "Checkpoint").

Proves, in-process with real object stores (`MemoryObjectStore`, and `LocalDirStore` beside a
file WAL): a restart from a checkpoint and the WAL tail rebuilds the very state (digest) with
L0 blocks, persisted blocks, deletes on both and dropped tables; the WAL is truncated (the
replay reads only the tail plus the reserve); an incremental checkpoint rewrites only what
changed and the oldest checkpoints are retired with the objects only they used; a crash
before the manifest leaves a checkpoint that does not exist and whose objects are collected
at the next open; an unreadable checkpoint (a manifest failing its checksum, an object it
names missing) gives way to the WAL while the WAL is whole, and the open is refused when it
is not; a WAL truncated past the newest checkpoint is refused, not replayed with a hole; snapshots
older than the checkpoint a restart began from are refused.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import (
    CheckpointDamaged,
    Column,
    Engine,
    Fenced,
    Schema,
    SnapshotUnavailable,
    WalCorruption,
    limits,
    metrics,
)
from engine.checkpoint import layout
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import Manifest
from engine.clock import wall_ms
from engine.compaction import Policy
from engine.objects.store import MemoryObjectStore
from engine.wal.entry import BlockLevel
from tae_driver.backends.memory import MemoryBackend
from tae_driver.errors import BackendFenced

ROWS = Schema(
    [Column("id", "int64"), Column("v", "string"), Column("n", "int32", nullable=True)],
    primary_key=["id"],
)
BLOCK = limits.BLOCK_ROWS_MAX


def rows(ids: range | list[int], tag: str = "v") -> list[dict[str, object]]:
    return [{"id": i, "v": f"{tag}{i}", "n": i % 7 if i % 5 else None} for i in ids]


async def insert(eng: Engine, ids: range | list[int], table: str = "t") -> None:
    async with eng.transaction() as txn:
        await txn.table("d", table).insert(rows(ids))


async def delete(eng: Engine, ids: list[int], table: str = "t") -> None:
    async with eng.transaction() as txn:
        await txn.table("d", table).delete(ids)


async def open_engine(wal: MemoryBackend, objects: MemoryObjectStore) -> Engine:
    # No history window: these tests pin the WAL's truncation and the retirement of
    # checkpoints at the newest one (decision 0006); the window's are decision 0010's.
    return await Engine.open(
        "unused",
        wal,
        objects=objects,
        maintenance=False,
        history_retention=datetime.timedelta(0),
    )


async def populated(wal: MemoryBackend, objects: MemoryObjectStore) -> Engine:
    """Table d.t with a flushed block, an L0 block, deletes on both; table d.gone dropped."""
    eng = await open_engine(wal, objects)
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
        await txn.create_table("d", "gone", ROWS)
    await insert(eng, range(0, BLOCK))
    await insert(eng, range(0, 10), "gone")
    maintenance = eng.maintenance
    assert maintenance is not None
    await maintenance.settle()  # the full block is flushed to an L1 object
    await insert(eng, range(BLOCK, BLOCK + 500))
    await delete(eng, [1, 2, BLOCK + 3])
    async with eng.transaction() as txn:
        await txn.drop_table("d", "gone")
    return eng


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_restart_from_a_checkpoint_and_the_wal_tail_rebuilds_the_state() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await populated(wal, objects)
        manifest = await eng.checkpoint()
        assert manifest is not None and manifest.kind == layout.KIND_GLOBAL
        assert manifest.ckp_ts == eng.visible_ts
        await insert(eng, range(BLOCK + 500, BLOCK + 600))  # the tail
        await delete(eng, [5, BLOCK + 501])
        digest, ckp_ts = eng.digest(), manifest.ckp_ts
        await eng.close()

        again = await open_engine(wal, objects)
        try:
            assert again.digest() == digest
            stats = again.stats()
            assert stats.replay is not None
            assert stats.replay.entries_applied == 2  # only the tail, not the whole log
            levels = {
                b.level
                for t in again._state.catalog.tables.values()
                for b in t.data.blocks.values()
            }
            assert levels == {0, BlockLevel.L1}
            with pytest.raises(SnapshotUnavailable):
                async with again.snapshot(ckp_ts - 1):
                    pass
            async with again.snapshot(ckp_ts) as view:
                assert (await view.table("d", "t").scan()).num_rows == BLOCK + 500 - 3
            await insert(again, [10**9])  # placement and ids continue after a restore
            async with again.transaction() as txn:
                await txn.create_table("d", "new", ROWS)
        finally:
            await again.close()

    run(main)


def test_the_wal_is_truncated_and_old_checkpoints_are_retired() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await populated(wal, objects)
        assert eng.checkpointer is not None
        eng.checkpointer.wal_reserve_entries = 0
        written = eng._visible_dsn
        manifests = []
        for round_ in range(limits.CKP_RETAINED + 2):
            await insert(eng, range(10**6 + round_ * 10, 10**6 + round_ * 10 + 10))
            if round_ == 1:
                await delete(eng, [7])
            manifest = await eng.checkpoint()
            assert manifest is not None
            manifests.append(manifest)
        assert await eng.checkpoint() is None  # nothing committed since
        assert [m.kind for m in manifests][1:] == [layout.KIND_INCREMENTAL] * (len(manifests) - 1)
        # The dump of the L0 block grew each round; the flushed block's object is reused.
        assert manifests[-1].previous == manifests[-2].name
        names = {info.name for info in objects.list(layout.PREFIX)}
        kept = {m.name for m in manifests[-limits.CKP_RETAINED :]}
        assert {n for n in names if n.endswith(layout.MANIFEST_NAME)} == kept
        # What is left is exactly what the retained checkpoints need (an incremental one
        # may still use an older directory's delta or dump), and the rest was deleted.
        needed = set(kept)
        for manifest in manifests[-limits.CKP_RETAINED :]:
            needed |= {n for n in manifest.objects if n.startswith(layout.PREFIX)}
        assert names == needed
        assert eng.checkpointer is not None and eng.checkpointer.objects_retired > 0
        await eng._driver.truncation_settled()
        digest = eng.digest()
        await eng.close()
        again = await open_engine(wal, objects)
        try:
            assert again.digest() == digest
            replay = again.stats().replay
            assert replay is not None
            # The log before the newest checkpoint is gone: the replay read at most its CKP
            # entry and what shares a driver record with it, none of the earlier commits.
            assert written >= 7 and replay.entries_handled <= 2
            assert replay.entries_applied == 0
        finally:
            await again.close()

    run(main)


def test_a_checkpoint_cut_before_its_manifest_does_not_exist_and_is_collected() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await populated(wal, objects)
        await eng.checkpoint()
        await insert(eng, range(BLOCK + 500, BLOCK + 520))
        digest = eng.digest()
        # The next checkpoint dies after its dumps, before its catalog and manifest.
        original_put = objects.put

        def dying_put(name: str, data: bytes) -> None:
            if name.endswith("catalog.parquet") and not name.startswith(
                eng.checkpointer.newest.directory  # type: ignore[union-attr]
            ):
                raise RuntimeError("power cut")
            original_put(name, data)

        objects.put = dying_put  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            await eng.checkpoint(global_=True)
        objects.put = original_put  # type: ignore[method-assign]
        await eng.abort()
        leftovers = {i.name for i in objects.list(layout.PREFIX)}
        again = await open_engine(wal, objects)
        try:
            assert again.digest() == digest
            now = {i.name for i in objects.list(layout.PREFIX)}
            complete = {n.rsplit("/", 1)[0] for n in leftovers if n.endswith("manifest.json")}
            cut = {n for n in leftovers if n.rsplit("/", 1)[0] not in complete}
            assert cut  # the dumps the cut checkpoint wrote before it died...
            assert not cut & now  # ...were collected
        finally:
            await again.close()

    run(main)


def test_an_unreadable_checkpoint_gives_way_to_the_wal_only_while_the_wal_is_whole() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await populated(wal, objects)
        assert eng.checkpointer is not None
        eng.checkpointer.wal_reserve_entries = 0
        manifest = await eng.checkpoint()
        assert manifest is not None
        digest = eng.digest()
        await eng.close()
        name = manifest.name
        good = objects.get(name)
        objects.delete(name)
        objects.put(name, good.replace(b'"kind"', b'"kinD"'))  # fails its checksum
        with pytest.raises(CheckpointCorrupt, match="checksum"):
            Manifest.decode(objects.get(name), name)
        # The WAL was truncated below the checkpoint: without it there is a hole, and the
        # engine refuses to open rather than replay what is left.
        await eng._driver.truncation_settled()
        with pytest.raises(CheckpointDamaged, match="no older checkpoint can be read"):
            await open_engine(wal, objects)
        objects.delete(name)
        objects.put(name, good)
        again = await open_engine(wal, objects)
        assert again.digest() == digest
        await again.close()

        # A log that was never truncated: an unreadable checkpoint costs a whole replay.
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await populated(wal, objects)
        manifest = await eng.checkpoint()  # the default reserve keeps this small log whole
        assert manifest is not None
        digest = eng.digest()
        await eng.close()
        objects.delete(manifest.catalog)  # an object the checkpoint names is gone
        again = await open_engine(wal, objects)
        try:
            assert again.digest() == digest
            assert again.stats().replay.entries_applied > 1  # type: ignore[union-attr]
        finally:
            await again.close()

        # Someone truncated the WAL beyond the newest checkpoint: the entries in between are
        # gone, and the engine refuses to open.
        eng = await open_engine(wal, objects)
        await eng.checkpoint()
        await insert(eng, range(BLOCK + 500, BLOCK + 510))
        await insert(eng, range(BLOCK + 510, BLOCK + 520))
        eng._driver.truncate(eng._visible_dsn - 1)
        await eng._driver.truncation_settled()
        await eng.close()
        with pytest.raises(WalCorruption, match="past the newest checkpoint"):
            await open_engine(wal, objects)

    run(main)


async def two_checkpoints(
    wal: MemoryBackend, objects: MemoryObjectStore, reserve: int
) -> tuple[Manifest, Manifest, str]:
    """An engine with two checkpoints and a tail after each, closed; the WAL truncated
    below each with `reserve` entries kept. Returns both and the final digest."""
    eng = await populated(wal, objects)
    assert eng.checkpointer is not None
    eng.checkpointer.wal_reserve_entries = reserve
    older = await eng.checkpoint()
    await insert(eng, range(BLOCK + 500, BLOCK + 520))
    await delete(eng, [BLOCK + 501])
    newer = await eng.checkpoint()
    await insert(eng, range(BLOCK + 520, BLOCK + 530))
    assert older is not None and newer is not None
    await eng._driver.truncation_settled()
    digest = eng.digest()
    await eng.close()
    return older, newer, digest


def damage(objects: MemoryObjectStore, name: str) -> None:
    good = objects.get(name)
    objects.delete(name)
    objects.put(name, good[: len(good) // 2] + b"\xff" * 16 + good[len(good) // 2 + 16 :])


def fallbacks(eng: Engine) -> float:
    for family in text_string_to_metric_families(metrics.render(eng)):
        for sample in family.samples:
            if sample.name == "engine_checkpoint_fallbacks_total":
                return sample.value
    raise AssertionError("no engine_checkpoint_fallbacks_total")


@pytest.mark.parametrize("which", ["blocks", "manifest"])
def test_a_damaged_checkpoint_is_named_when_the_wal_cannot_stand_in(which: str) -> None:
    """Issue 20: the newest checkpoint's object (or manifest) damaged and the WAL truncated
    past the older checkpoint: the open fails with `CheckpointDamaged` naming the object and
    the checkpoint (it used to be a `WalCorruption` about missing entries)."""

    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        older, newer, _ = await two_checkpoints(wal, objects, reserve=0)
        broken = newer.blocks if which == "blocks" else newer.name
        damage(objects, broken)
        with pytest.raises(CheckpointDamaged) as caught:
            await open_engine(wal, objects)
        error = caught.value
        assert error.checkpoint == newer.name and error.object == broken
        assert broken in str(error) and older.name in str(error)
        assert isinstance(error.__cause__, CheckpointCorrupt)
        assert {i.name for i in objects.list(layout.PREFIX)} >= {older.name, newer.name}

    run(main)


@pytest.mark.parametrize("which", ["blocks", "manifest"])
def test_a_damaged_checkpoint_gives_way_to_an_older_one_while_the_wal_covers_it(
    which: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same damage with the WAL still holding everything after the older checkpoint:
    the engine opens from it with every row, a warning and `engine_checkpoint_fallbacks`."""

    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        older, newer, digest = await two_checkpoints(wal, objects, reserve=10_000)
        broken = newer.blocks if which == "blocks" else newer.name
        damage(objects, broken)
        with caplog.at_level(logging.WARNING, logger="engine.checkpoint"):
            again = await open_engine(wal, objects)
        try:
            assert again.digest() == digest
            async with again.snapshot(again.visible_ts) as view:
                got = await view.table("d", "t").scan(columns=["id"])
            assert got.num_rows == BLOCK + 530 - 4
            assert again.checkpointer is not None
            assert again.checkpointer.newest is not None
            assert again.checkpointer.newest.name == older.name
            assert fallbacks(again) == 1
            opened = [r for r in caplog.records if "opened from" in r.getMessage()]
            assert len(opened) == 1 and opened[0].levelno == logging.WARNING
            assert newer.name in opened[0].getMessage()
        finally:
            await again.close()

    run(main)


class Lease:
    """The log's lease, shared by the engines on one log: the newest epoch may write."""

    def __init__(self) -> None:
        self.epoch = 1


class LeasedBackend:
    """A `LogBackend` test double over a shared `MemoryBackend`: appends and truncations of
    an engine whose epoch is older than the lease's fail with `BackendFenced`, as logsvc's
    do; `acquire_lease` (what `promote()` calls) takes a new epoch."""

    def __init__(self, log: MemoryBackend, lease: Lease) -> None:
        self._log = log
        self._lease = lease
        self.epoch = lease.epoch

    async def acquire_lease(self) -> None:
        self._lease.epoch += 1
        self.epoch = self._lease.epoch

    def _check(self, what: str) -> None:
        if self.epoch != self._lease.epoch:
            raise BackendFenced(
                what,
                holder="old",
                epoch=self.epoch,
                current_holder="new",
                current_epoch=self._lease.epoch,
            )

    async def append(self, payload: bytes) -> int:
        self._check("append")
        return await self._log.append(payload)

    async def truncate(self, lsn: int) -> None:
        self._check("truncate")
        await self._log.truncate(lsn)

    async def close(self) -> None:
        return None  # the shared log outlives each engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


def test_a_writer_fenced_while_it_checkpoints_leaves_no_third_checkpoint() -> None:
    """Issue 20: the old TN, fenced by a promotion, writes a checkpoint's objects and
    manifest and is then refused its CKP entry. The new writer's next checkpoint retires
    that stray along with its own oldest: two checkpoints are kept (CKP_RETAINED), and a
    reopen rebuilds the state from them."""

    async def main() -> None:
        log, objects, lease = MemoryBackend(), MemoryObjectStore(), Lease()
        old = await open_engine(LeasedBackend(log, lease), objects)  # type: ignore[arg-type]
        assert old.checkpointer is not None
        old.checkpointer.wal_reserve_entries = 0
        async with old.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        await insert(old, range(0, 100))
        await old.checkpoint()
        await insert(old, range(100, 200))
        await old.checkpoint()
        new = await Engine.open(
            "unused",
            LeasedBackend(log, lease),
            objects=objects,
            maintenance=False,
            standby=True,
            history_retention=datetime.timedelta(0),
        )
        try:
            await insert(old, range(200, 300))
            for _ in range(10_000):  # the standby follows the writer
                if new.visible_ts == old.visible_ts:
                    break
                await asyncio.sleep(0.001)
            assert new.visible_ts == old.visible_ts
            await new.promote()  # fences the old writer
            with pytest.raises(Fenced):
                await old.checkpoint()  # objects and manifest written, CKP entry refused
            await old.abort()
            manifests = {i.name for i in objects.list(layout.PREFIX) if "manifest" in i.name}
            assert len(manifests) == 3  # the stray is there
            assert new.checkpointer is not None
            new.checkpointer.wal_reserve_entries = 0
            await insert(new, range(300, 400))
            mine = await new.checkpoint()
            assert mine is not None
            manifests = {i.name for i in objects.list(layout.PREFIX) if "manifest" in i.name}
            assert len(manifests) == limits.CKP_RETAINED
            assert mine.name in manifests
            digest = new.digest()
        finally:
            await new.close()
        again = await open_engine(LeasedBackend(log, lease), objects)  # type: ignore[arg-type]
        try:
            assert again.digest() == digest
            assert len(again.checkpointer.retained) == limits.CKP_RETAINED  # type: ignore[union-attr]
        finally:
            await again.close()

    run(main)


def test_a_promoted_standby_keeps_the_checkpoints_the_writer_took_after_it_opened() -> None:
    """A standby restores at its open, then follows the WAL (skipping its CKP entries). The
    writer meanwhile takes checkpoints, retires the one the standby restored from, and
    truncates its WAL. At promotion the standby adopts the writer's retained checkpoints
    instead of collecting them as orphans (it deleted every checkpoint, and a crash before
    its own first checkpoint left an engine that could not reopen)."""

    async def main() -> None:
        log, objects, lease = MemoryBackend(), MemoryObjectStore(), Lease()
        writer = await open_engine(LeasedBackend(log, lease), objects)  # type: ignore[arg-type]
        assert writer.checkpointer is not None
        writer.checkpointer.wal_reserve_entries = 0
        async with writer.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        await insert(writer, range(0, 100))
        await writer.checkpoint()
        standby = await Engine.open(
            "unused",
            LeasedBackend(log, lease),
            objects=objects,
            maintenance=False,
            standby=True,
            history_retention=datetime.timedelta(0),
        )
        for first in (100, 200):
            await insert(writer, range(first, first + 100))
            await writer.checkpoint()
        await writer._driver.truncation_settled()
        kept = {m.name for m in writer.checkpointer.retained}
        for _ in range(10_000):
            if standby.visible_ts == writer.visible_ts:
                break
            await asyncio.sleep(0.001)
        assert standby.visible_ts == writer.visible_ts
        await writer.abort()
        await standby.promote()
        manifests = {i.name for i in objects.list(layout.PREFIX) if "manifest" in i.name}
        assert manifests == kept
        digest = standby.digest()
        await standby.abort()  # a crash before its own first checkpoint
        again = await open_engine(LeasedBackend(log, lease), objects)  # type: ignore[arg-type]
        try:
            assert again.digest() == digest
        finally:
            await again.close()

    run(main)


def test_checkpoints_over_a_file_wal_and_a_directory_of_objects(tmp_path: Path) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path), maintenance=False)
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        await insert(eng, range(0, BLOCK + 100))
        assert eng.maintenance is not None
        await eng.maintenance.settle()
        await delete(eng, [0, BLOCK])
        await eng.checkpoint()
        await insert(eng, range(BLOCK + 100, BLOCK + 200))
        digest = eng.digest()
        await eng.close()
        assert any((tmp_path / "objects" / "ckp").rglob("manifest.json"))
        again = await Engine.open(str(tmp_path))
        try:
            assert again.digest() == digest
            assert len(list((tmp_path / "objects" / ".tmp").iterdir())) == 1  # its own
        finally:
            await again.close()
        # Issue 20: each open left its `objects/.tmp/<uuid>/` behind.
        assert list((tmp_path / "objects" / ".tmp").iterdir()) == []

    run(main)


def test_the_policy_sets_the_checkpoint_interval_and_the_wal_reserve() -> None:
    """A TN's `[checkpoint]` (engine/tn/config.py) reaches the engine as its `Policy`: the
    maintenance loop checkpoints by itself within the interval, keeping the reserve."""

    async def main() -> None:
        policy = Policy(checkpoint_interval_ms=100, checkpoint_wal_reserve_entries=2)
        eng = await Engine.open(
            "unused", MemoryBackend(), objects=MemoryObjectStore(), policy=policy
        )
        try:
            assert eng.checkpointer is not None
            assert eng.checkpointer.wal_reserve_entries == 2
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", ROWS)
            await insert(eng, range(10))
            async with asyncio.timeout(10):  # the loop wakes every MAINTENANCE_INTERVAL_MS
                while eng.checkpointer.newest is None:
                    await asyncio.sleep(0.05)
            assert eng.checkpointer.newest.ckp_ts <= eng.visible_ts
        finally:
            await eng.close()

    run(main)


class _GatedStore(MemoryObjectStore):
    """Puts wait (in the checkpoint's worker thread) until `gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def put(self, name: str, data: bytes) -> None:
        assert self.gate.wait(30), "the test never opened the gate"
        super().put(name, data)


def test_commits_made_while_a_checkpoint_is_written_make_the_next_one_due() -> None:
    """The engine counts WAL entries since the newest checkpoint's ckp_dsn, not since the
    moment it finished: a commit that lands while a checkpoint is written is not in it, and
    an engine that then goes idle still takes one that covers it after the interval."""

    async def test() -> None:
        objects = _GatedStore()
        eng = await open_engine(MemoryBackend(), objects)
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        await insert(eng, range(10))
        objects.gate.clear()
        checkpoint = asyncio.ensure_future(eng.checkpoint())
        try:
            await asyncio.sleep(0)  # it took its ckp_ts and waits on the store
            await insert(eng, range(10, 20))
            late_ts = eng.visible_ts
        finally:
            objects.gate.set()
        first = await checkpoint
        assert first is not None and first.ckp_ts < late_ts
        maintenance = eng.maintenance
        assert maintenance is not None
        maintenance._maybe_checkpoint(wall_ms() + limits.CKP_INTERVAL_MS)
        task = maintenance._checkpoint_task
        assert task is not None, "no checkpoint due for the commit the first one missed"
        await task
        checkpointer = eng.checkpointer
        assert checkpointer is not None and checkpointer.newest is not None
        assert checkpointer.newest.ckp_ts == late_ts
        maintenance._maybe_checkpoint(wall_ms() + 2 * limits.CKP_INTERVAL_MS)
        assert maintenance._checkpoint_task is None  # idle and covered: none due
        await eng.close()

    run(test)
