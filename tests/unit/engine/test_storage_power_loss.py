"""A power loss at any moment of a flush, a merge, the collection of its inputs, a checkpoint,
the WAL truncation and the retirement of an old checkpoint: what the disks hold afterwards
reopens to the committed state, with every referenced object and no orphan (issue 14 "Tests
that must exist": the FaultFS power-loss layer).

How: the engine runs on its real file WAL (tae_driver's FileBackend, in a temporary
directory) and on a `LocalDirStore` over FaultFS (tests/support/faultfs.py), tracing every
file operation of the object store while the storage steps run. Power-loss images:

* objects: `FaultFS.crash_states` replays every prefix of the trace that ends at a sync and
  cuts the power there (unsynced bytes and names vanish; names kept or reverted; torn
  variants of the next write);
* WAL: FileBackend's `fsync` hook (the only seam it offers: it does not go through the
  FileSystem port, so FaultFS cannot hold it) records, at every fsync of a segment, its
  synced length; an image of the WAL at that instant is every segment file cut to its synced
  length (a new segment's header is synced at creation). That is the `trunc` power loss: bytes
  written and not fsynced are gone.

Each WAL image is stamped with how many traced object-store operations were done when it was
taken, so each objects state is paired only with the WAL images that could coexist with it on
the disks at one instant (taken between the state's sync and the next one), and with the one
just before. Every pair is reopened: the digest is the committed one (no user commit runs
during the trace: the storage steps change no row), every object a held block or a retained
checkpoint names is there, nothing else is. The run must also have produced restarts from
the old and from the new checkpoint, and restarts that deleted orphans: else it proved
nothing.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import os
import random
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine import Column, Engine, Schema
from engine.checkpoint import layout
from engine.compaction import Policy
from engine.objects.store import LocalDirStore
from engine.storage import PersistedBlock
from tae_driver import limits as driver_limits
from tae_driver.backends import segment
from tae_driver.backends.file import FileBackend
from tests.support.faultfs import FaultFS

ROWS = Schema([Column("id", "int64"), Column("v", "string")], primary_key=["id"])
ROOT = "/objects"
SEGMENT_BYTES = 4 * 1024
"""Small WAL segments, so that the truncation deletes whole files."""
NO_MERGE = Policy(merge_l1_blocks=1000)
MERGE = Policy(merge_l1_blocks=2)
STATES_MAX = 400
NO_HISTORY = datetime.timedelta(0)
"""These images pin the WAL's truncation and object collection at the newest checkpoint
(decision 0006), the engine without a history window (decision 0010)."""
"""A bound on the pairs reopened (the run makes about half of it)."""


class WalImages:
    """Power-loss images of a file WAL, one per fsync of a segment (module docstring)."""

    def __init__(self, wal_dir: Path, fs: FaultFS) -> None:
        self._dir = wal_dir
        self._fs = fs
        self._synced: dict[str, int] = {}
        self._lock = threading.Lock()
        self.recording = False
        self.images: list[tuple[int, dict[str, bytes]]] = []
        """(traced object-store operations done, the image) in time order."""

    def fsync(self, fd: int) -> None:
        os.fdatasync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        with self._lock:
            self._synced[os.path.basename(path)] = os.fstat(fd).st_size
            if self.recording:
                self.images.append((self._fs.trace_length(), self._image_locked()))

    def image(self) -> dict[str, bytes]:
        with self._lock:
            return self._image_locked()

    def _image_locked(self) -> dict[str, bytes]:
        image = {}
        for name in sorted(os.listdir(self._dir)):
            if segment.parse_segment_file_name(name) is None:
                continue  # LOCK, a segment being created (*.tmp)
            synced = self._synced.get(name, driver_limits.FILE_SEGMENT_HEADER_BYTES)
            try:
                with open(self._dir / name, "rb") as handle:
                    image[name] = handle.read(synced)
            except FileNotFoundError:
                continue  # deleted by a truncation meanwhile
        return image


@dataclass
class Pair:
    objects: FaultFS
    wal: dict[str, bytes]


def pairs(fs: FaultFS, base: dict[str, bytes], images: WalImages) -> Iterator[Pair]:
    """Every objects state with every WAL image that could be on disk with it."""
    states = list(fs.crash_states(random.Random(11), torn_variants=2, names=("revert", "keep")))
    ends = sorted({s.crash_ops for s in states if s.crash_point.startswith("power loss")})
    for state in states:
        done = state.crash_ops
        later = [end for end in ends if end > done]
        next_sync = later[0] if later else 1 << 62
        before = base
        during = []
        for stamp, image in images.images:
            if stamp < done:
                before = image
            elif stamp < next_sync and state.crash_point.startswith("power loss"):
                during.append(image)
        for image in [before, *during]:
            yield Pair(copy_of(state), image)


def copy_of(fs: FaultFS) -> FaultFS:
    """A FaultFS holding the same disk: a reopen changes what it opens (it deletes orphans),
    and each pair needs the state as the power loss left it."""
    clone = FaultFS(rng=random.Random(0))
    clone._state = copy.deepcopy(fs._state)
    clone.crash_point = fs.crash_point
    return clone


async def open_on(
    tmp: Path, pair: Pair, policy: Policy
) -> tuple[Engine, FileBackend, LocalDirStore]:
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, data in pair.wal.items():
        (tmp / name).write_bytes(data)
    wal = await FileBackend.open(str(tmp), segment_bytes_max=SEGMENT_BYTES)
    store = LocalDirStore(ROOT, pair.objects)
    try:
        eng = await Engine.open(
            str(tmp),
            wal,
            objects=store,
            policy=policy,
            maintenance=False,
            history_retention=NO_HISTORY,
        )
    except BaseException:
        store.close()
        await wal.close()
        raise
    return eng, wal, store


def check_objects(eng: Engine, store: LocalDirStore) -> None:
    held = {
        block.object_name
        for table in eng._state.catalog.tables.values()
        for block in table.data.blocks.values()
        if isinstance(block, PersistedBlock)
    }
    assert eng.checkpointer is not None
    needed = held.copy()
    for manifest in eng.checkpointer.retained:
        needed |= {manifest.name, *manifest.objects}
    stored = {info.name for info in store.list("")}
    assert not needed - stored, f"missing: {sorted(needed - stored)}"
    assert not stored - needed, f"orphans left: {sorted(stored - needed)}"


async def insert(eng: Engine, table: str, ids: range) -> None:
    async with eng.transaction() as txn:
        await txn.table("d", table).insert([{"id": i, "v": f"v{i}"} for i in ids])


def test_every_power_loss_image_of_rewrites_and_a_checkpoint_reopens_whole(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        fs = FaultFS()
        wal_dir = tmp_path / "wal"
        images = WalImages(wal_dir, fs)
        wal = await FileBackend.open(
            str(wal_dir), segment_bytes_max=SEGMENT_BYTES, fsync=images.fsync
        )
        store = LocalDirStore(ROOT, fs)
        eng = await Engine.open(
            str(tmp_path),
            wal,
            objects=store,
            policy=NO_MERGE,
            maintenance=False,
            history_retention=NO_HISTORY,
        )
        assert eng.checkpointer is not None and eng.maintenance is not None
        eng.checkpointer.wal_reserve_entries = 0
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
            await txn.create_table("d", "u", ROWS)
        await insert(eng, "t", range(0, 100))
        await eng.maintenance.settle(freeze_all=True)  # t: an L1 block
        first = await eng.checkpoint()
        await insert(eng, "t", range(100, 200))
        await eng.maintenance.settle(freeze_all=True)  # t: a second one
        await insert(eng, "t", range(200, 260))
        async with eng.transaction() as txn:
            await txn.table("d", "t").delete([3, 150, 210])
        # u: two L0 blocks, the first sealed, that no checkpoint will ever name once flushed.
        await insert(eng, "u", range(0, 40))
        u = next(t for t in eng._state.catalog.tables.values() if t.name == "u")
        assert u.data.freeze()
        await insert(eng, "u", range(40, 80))
        second = await eng.checkpoint()
        await insert(eng, "t", range(260, 300))
        digest = eng.digest()
        assert first is not None and second is not None

        # Traced: flushes (t's open block, u's two), merges (t's two oldest L1 blocks, which
        # the checkpoints name; u's two, which none does), the collection of their inputs, a
        # checkpoint that deletes u's inputs, truncates the WAL and retires the first one.
        base = images.image()
        fs.start_trace()
        images.recording = True
        await eng.maintenance.settle(freeze_all=True)
        eng.maintenance.policy = MERGE
        await eng.maintenance.settle()
        eng.maintenance.step()
        assert eng._block_store.pending_garbage == 2  # type: ignore[union-attr]
        third = await eng.checkpoint()
        assert third is not None
        assert eng._block_store.pending_garbage == 0  # type: ignore[union-attr]
        await eng._driver.truncation_settled()
        images.recording = False
        assert eng.digest() == digest
        assert eng.maintenance.rewrites_done == {"flush": 5, "merge": 2, "compact": 0}
        await eng.close()
        store.close()
        await wal.close()

        began_from: set[str] = set()
        orphans_deleted = 0
        count = 0
        for pair in pairs(fs, base, images):
            count += 1
            assert count <= STATES_MAX
            where = f"{pair.objects.crash_point}, WAL of {len(pair.wal)} segments"
            again, again_wal, again_store = await open_on(tmp_path / "again", pair, MERGE)
            try:
                assert again.digest() == digest, where
                check_objects(again, again_store)
                assert again.checkpointer is not None
                newest = again.checkpointer.newest
                assert newest is not None, where
                began_from.add({second.ckp_ts: "second", third.ckp_ts: "third"}[newest.ckp_ts])
                orphans_deleted += again.checkpointer.orphans_deleted
            finally:
                await again.close()
                again_store.close()
                await again_wal.close()
        assert count >= 40, count
        assert began_from == {"second", "third"}
        assert orphans_deleted > 0
        names = {info.name for info in LocalDirStore(ROOT, fs, read_only=True).list(layout.PREFIX)}
        assert first.name not in names  # the live run retired it

    asyncio.run(main())
