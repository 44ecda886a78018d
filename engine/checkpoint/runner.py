"""The engine's checkpoints: restore at open, take one, truncate the WAL, retire old ones,
collect orphaned objects (decision 0006; seed "Checkpoint").

Why this order (ARCHITECTURE.md §4 "Truncation is the only compaction"): the checkpoint's
objects and then its manifest are durable before the CKP WAL entry is logged, and the WAL is
truncated only after that entry is durable, at the DSN of the last commit the checkpoint
covers minus a reserve. A crash anywhere leaves either the previous checkpoint and the whole
WAL after it, or the new checkpoint and a WAL that still holds everything after it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from contextlib import AbstractContextManager
from typing import Protocol

from engine import limits
from engine.blockstore import DATA_PREFIX, ObjectBlockStore
from engine.checkpoint import files, layout, retention
from engine.checkpoint import plan as checkpoint_plan
from engine.checkpoint.errors import CheckpointCorrupt, CheckpointDamaged
from engine.checkpoint.layout import Manifest
from engine.clock import TS_MAX, HybridClock, ts_at_wall_ms, wall_ms
from engine.errors import WalFailed
from engine.objects.errors import ObjectsError
from engine.objects.store import ObjectStore
from engine.state import EngineState
from engine.storage import PersistedBlock
from engine.wal.codec import encode_entry
from engine.wal.entry import CheckpointEntry
from tae_driver import Driver
from tae_driver import errors as driver_errors

log = logging.getLogger("engine.checkpoint")


class CheckpointHost(Protocol):
    """What the checkpointer needs of the engine (engine/engine.py implements it)."""

    @property
    def state(self) -> EngineState: ...

    @property
    def visible_ts(self) -> int: ...

    @property
    def visible_dsn(self) -> int: ...

    @property
    def wal_first_dsn(self) -> int: ...

    @property
    def clock(self) -> HybridClock: ...

    @property
    def driver(self) -> Driver: ...

    def adopt_state(self, state: EngineState) -> None:
        """Make a restored checkpoint's state the engine's (before the WAL replay)."""
        ...

    def check_writable_storage(self) -> None:
        """Raise unless the engine may write (open, not failed, not read-only)."""
        ...

    def pin(self, ts: int) -> AbstractContextManager[None]:
        """Keep the versions a snapshot at `ts` reads in memory while the block runs."""
        ...

    def fail(self, exc: BaseException) -> WalFailed:
        """The WAL failed: the engine turns read-only; the error to raise."""
        ...

    def wal_truncated_below(self, dsn: int) -> None: ...

    def objects_collected_upto(self, ts: int) -> None: ...

    def checkpoint_taken(self, manifest: Manifest) -> None: ...


class Checkpointer:
    def __init__(self, engine: CheckpointHost, blocks: ObjectBlockStore) -> None:
        self._engine = engine
        self._blocks = blocks
        self._lock = asyncio.Lock()
        self.retained: list[Manifest] = []
        """Complete checkpoints kept, oldest first; the last is the newest."""
        self._previous: checkpoint_plan.Previous | None = None
        self._since_global = 0
        self.taken = 0
        self.objects_retired = 0
        self.orphans_deleted = 0
        self.skipped: list[tuple[str, CheckpointCorrupt]] = []
        """Newer checkpoints `restore` could not read (manifest name, the error), newest
        first: the engine opens from an older one only if the WAL still covers them."""
        self.fallbacks = 0
        """Opens from an older checkpoint than the newest (`engine_checkpoint_fallbacks_total`)."""
        self.last_duration_ms = 0.0
        self.last_bytes = 0
        self.wal_reserve_entries = limits.CKP_WAL_RESERVE_ENTRIES
        self.history_retention_ms = 0
        """The history retention window (decision 0010; 0: none), set by the engine."""
        self.anchor: Manifest | None = None
        """The oldest checkpoint history reads may start from: the WAL is kept from its DSN
        (None until the first checkpoint this engine takes or restores)."""
        self.pins: collections.Counter[int] = collections.Counter()
        """Timestamps open historical views read at (engine/time_travel.py): the anchor stays at
        or below each, so the WAL and objects they replay stay until they close."""

    @property
    def store(self) -> ObjectStore:
        # Looked up each time, not kept: a promoted standby's directory store is replaced
        # by a writable one (`ObjectBlockStore.writable`), and checkpoints must go there.
        return self._blocks.store

    @property
    def newest(self) -> Manifest | None:
        return self.retained[-1] if self.retained else None

    # --- open --------------------------------------------------------------------------------

    def restore(self) -> Manifest | None:
        """At open, before the WAL replay (blocking): the newest readable checkpoint's state
        becomes the engine's, and the retained checkpoints' objects are referenced.

        A newest checkpoint that cannot be read (its manifest damaged, an object it names
        missing or damaged) is remembered in `skipped` and gives way to the one before it
        (and when none can be read, to none). That older state is only a candidate: the
        WAL's first DSN is known once the replay reads it, and its gap check
        (`refuse_fallback`) then raises `CheckpointDamaged` naming the damaged object unless
        the WAL still holds everything after the older checkpoint; the open then counts the
        fallback (`fell_back`, a warning and a metric). Issue 20: a damaged checkpoint was
        skipped with a log line, then the open failed on "missing WAL entries"."""
        engine = self._engine
        names = files.manifests(self.store)
        self.skipped = []
        for position in range(len(names) - 1, -1, -1):
            try:
                newest = files.read_manifest(self.store, names[position])
                state = files.read(self.store, newest, self._blocks.meta)
            except (CheckpointCorrupt, ObjectsError) as exc:
                if isinstance(exc, CheckpointCorrupt):
                    damage = exc
                else:  # the store failed reading the manifest itself
                    damage = CheckpointCorrupt(names[position], str(exc))
                    damage.__cause__ = exc
                log.warning("checkpoint %s cannot be read: %s", names[position], exc)
                self.skipped.append((names[position], damage))
                continue
            engine.adopt_state(state)
            self._hold_blocks(state)
            older: list[Manifest] = []
            for name in names[max(0, position - self._retained_max + 1) : position]:
                with contextlib.suppress(CheckpointCorrupt, ObjectsError):
                    older.append(files.read_manifest(self.store, name))
            for manifest in _below(older, newest):
                self._retain(manifest)
            self._retain(newest)
            kept = self._keep()
            assert kept is not None
            # The previous run's anchor or a newer one: what the window kept from (its WAL
            # and objects are there); nothing older is read even if a manifest remains.
            self.anchor = self.retained[kept.anchor] if kept.anchor is not None else None
            return newest
        if self.skipped:
            # Not one readable: start from nothing; the replay's gap check refuses to open
            # if the WAL no longer starts at the beginning.
            log.error("no checkpoint can be read; replaying the whole WAL: %s", self.skipped[0])
        return None

    def read_newest(self, applied_dsn: int) -> tuple[Manifest, EngineState, list[Manifest]] | None:
        """For a standby that fell behind the WAL's truncation (engine/standby.py; blocking,
        and touching nothing of the engine): the newest checkpoint, its state and the
        retained ones before it, when it is ahead of `applied_dsn` (else None: it has
        nothing the standby lacks). The newest, not an older readable one: the WAL was
        truncated below the newest, so only it is sure to cover the gap; one that cannot be
        read raises (CheckpointCorrupt, ObjectsError) and the standby retries later."""
        names = files.manifests(self.store)
        if not names:
            return None
        newest = files.read_manifest(self.store, names[-1])
        if newest.ckp_dsn <= applied_dsn:
            return None
        state = files.read(self.store, newest, self._blocks.meta)
        older: list[Manifest] = []
        for name in names[max(0, len(names) - self._retained_max) : -1]:
            with contextlib.suppress(CheckpointCorrupt, ObjectsError):
                older.append(files.read_manifest(self.store, name))
        return newest, state, older

    def adopt(self, newest: Manifest, state: EngineState, older: list[Manifest]) -> None:
        """Make what `read_newest` read the engine's state (on the event loop): the
        references the old state held are forgotten, the new state's taken."""
        self._blocks.forget_refs()
        self.retained = []
        self.skipped = []  # what the open could not read is no longer the state's source
        self._engine.adopt_state(state)
        self._hold_blocks(state)
        for manifest in _below(older, newest):
            self._retain(manifest)
        self._retain(newest)

    def _hold_blocks(self, state: EngineState) -> None:
        for table in state.catalog.tables.values():
            for block in table.data.blocks.values():
                if isinstance(block, PersistedBlock):
                    self._blocks.held(table.table_id, block)

    def refuse_fallback(self, wal_first_dsn: int) -> None:
        """The replay found the WAL starting at `wal_first_dsn`, past what the restored
        state needs. When that state is an older checkpoint (or none) because a newer one
        was damaged, the damage is the reason: raise `CheckpointDamaged` naming the newest
        damaged checkpoint and its object (the read's error as the cause)."""
        if not self.skipped:
            return
        name, damage = self.skipped[0]
        restored = self.newest
        older = (
            f"the WAL starts at DSN {wal_first_dsn}, past the older checkpoint's DSN "
            f"{restored.ckp_dsn} ({restored.name})"
            if restored is not None
            else f"the WAL starts at DSN {wal_first_dsn} and no older checkpoint can be read"
        )
        raise CheckpointDamaged(
            name, damage.name, damage.reason, f"{older}: it cannot stand in"
        ) from damage

    def fell_back(self) -> None:
        """The open completed from an older checkpoint than the newest (the WAL covered the
        damaged one's range): say so once, loudly, and count it."""
        if not self.skipped:
            return
        name, damage = self.skipped[0]
        restored = self.newest
        self.fallbacks += 1
        log.warning(
            "checkpoint %s is damaged (%s); opened from %s and the WAL after it instead",
            name,
            damage,
            restored.name if restored is not None else "the whole WAL",
        )

    async def _catch_up(self) -> None:
        """Retain the checkpoints other writers took since this engine's restore, up to its
        state: a standby restored at its open and then followed the writer's WAL, whose CKP
        entries it skips, so at its promotion `retained` named checkpoints the writer had
        long retired, and the orphan collection deleted the writer's two newest (issue 20:
        a promoted standby that crashed before its own first checkpoint could not reopen,
        its WAL truncated past every checkpoint left)."""
        newest = self.newest
        newest_ts = newest.ckp_ts if newest is not None else -1
        visible_ts = self._engine.visible_ts
        damaged = {name for name, _ in self.skipped}

        def newer() -> list[Manifest]:
            found = []
            for name in files.manifests(self.store):
                ckp_ts = layout.ckp_ts_of(name)
                if ckp_ts is None or not newest_ts < ckp_ts <= visible_ts or name in damaged:
                    continue
                with contextlib.suppress(CheckpointCorrupt, ObjectsError):
                    found.append(files.read_manifest(self.store, name))
            return found

        for manifest in await asyncio.to_thread(newer):
            self._retain(manifest)
        while len(self.retained) > self._retained_max:
            old = self.retained.pop(0)
            for name in old.objects:
                self._blocks.refs.drop(name, ("ckp", old.ckp_ts))  # the orphans go below

    @property
    def _retained_max(self) -> int:
        if self.history_retention_ms == 0:
            return limits.CKP_RETAINED
        return limits.CKP_HISTORY_RETAINED_MAX

    def cutoff_ts(self) -> int:
        """The window's start: the snapshot timestamp of (the engine's wall clock minus the
        window), lowered to the oldest open historical view; `TS_MAX` without a window."""
        if self.history_retention_ms == 0:
            return TS_MAX
        start_ms = max(0, self._engine.clock.now_ms() - self.history_retention_ms)
        cutoff = ts_at_wall_ms(start_ms)
        return min(cutoff, *self.pins) if self.pins else cutoff

    def _keep(self) -> retention.Kept | None:
        return retention.keep(
            [m.ckp_ts for m in self.retained], self.cutoff_ts(), count_max=self._retained_max
        )

    def history_starts(self) -> list[Manifest]:
        """The retained checkpoints a historical read may start from, oldest first: at or
        above the anchor, their WAL still there (none without a window)."""
        if self.history_retention_ms == 0:
            return []
        floor_ts = self.anchor.ckp_ts if self.anchor is not None else 0
        first_dsn = self._engine.wal_first_dsn
        return [m for m in self.retained if m.ckp_ts >= floor_ts and m.ckp_dsn + 1 >= first_dsn]

    def history_from_empty(self) -> bool:
        """A historical read may start from the empty state and the whole WAL: it still
        starts at its first entry, and no anchor let objects of older history go."""
        return (
            self.history_retention_ms > 0
            and self.anchor is None
            and self._engine.wal_first_dsn <= 1
        )

    def _retain(self, manifest: Manifest) -> None:
        for name in manifest.objects:
            self._blocks.refs.add(name, ("ckp", manifest.ckp_ts))
        self.retained.append(manifest)

    async def collect_orphans(self) -> int:
        """Delete objects nothing refers to: checkpoints beyond the retained ones, and
        objects of rewrites or checkpoints a crash interrupted. At open, after the replay,
        and when a standby is promoted."""
        await self._catch_up()
        retained = {m.name for m in self.retained}
        # Objects waiting for a checkpoint to cover their drop are not orphans: the WAL after
        # the newest checkpoint may create their blocks again at the next restart (a standby
        # promoted after following flushes and merges deleted them, and its restart failed).
        referenced = self._blocks.refs.names() | retained | self._blocks.pending_names()
        orphans = await asyncio.to_thread(
            files.orphans, self.store, referenced, (DATA_PREFIX, layout.PREFIX)
        )
        newest = self.newest
        if self.history_retention_ms > 0 and newest is not None:
            # Under a history window a block object nothing holds may be created by a kept
            # WAL entry below the restored checkpoint (the replay does not decode those): it
            # waits for the window's anchor to pass that checkpoint, as a dropped block's
            # object does (decision 0010). A crash's true orphan goes then too.
            kept = [name for name in orphans if name.startswith(DATA_PREFIX)]
            self._blocks.keep_until_covered(kept, newest.ckp_ts)
            orphans = [name for name in orphans if not name.startswith(DATA_PREFIX)]
        # Older manifests first, so no checkpoint ever names a deleted object.
        orphans.sort(key=lambda name: (not name.endswith(layout.MANIFEST_NAME), name))
        for name in orphans:
            await asyncio.to_thread(files.retire, self.store, name, ())
        self.orphans_deleted += len(orphans)
        if orphans:
            log.info("deleted %d orphaned objects", len(orphans))
        return len(orphans)

    # --- taking one --------------------------------------------------------------------------

    async def checkpoint(self, *, global_: bool = False) -> Manifest | None:
        """Take a checkpoint at the visible timestamp (None when nothing was committed since
        the newest one), log its CKP entry, truncate the WAL, retire old checkpoints."""
        async with self._lock:
            return await self._checkpoint(global_)

    async def _checkpoint(self, global_: bool) -> Manifest | None:
        engine = self._engine
        engine.check_writable_storage()
        ckp_ts = engine.visible_ts
        newest = self.newest
        if newest is not None and ckp_ts <= newest.ckp_ts:
            return None
        started = asyncio.get_running_loop().time()
        globally = (
            global_ or self._previous is None or self._since_global + 1 >= limits.CKP_GLOBAL_EVERY
        )
        ckp_dsn = engine.visible_dsn
        plan = checkpoint_plan.plan(
            engine.state,
            ckp_ts,
            ckp_dsn,
            None if globally else self._previous,
            uuid.uuid4().hex[:8],
        )
        with engine.pin(ckp_ts):  # blocks dropped after ckp_ts stay until it is written
            manifest = await asyncio.to_thread(files.write, self.store, plan, wall_ms())
        self._retain(manifest)
        kept = self._keep()
        assert kept is not None
        anchor = self.retained[kept.anchor] if kept.anchor is not None else None
        # The WAL from the window's anchor on stays (decision 0010); without a window the
        # anchor is this checkpoint, as before; with no checkpoint old enough, all of it.
        truncate_dsn = (
            max(0, min(ckp_dsn, anchor.ckp_dsn) - self.wal_reserve_entries)
            if anchor is not None
            else 0
        )
        entry = CheckpointEntry(ckp_ts, truncate_dsn, manifest.name)
        try:
            await engine.driver.append(encode_entry(entry))
        except driver_errors.DriverError as exc:
            # Typed as a commit's failure is (`Fenced` when a newer writer took the lease;
            # it used to escape as the driver's DriverFailed). The manifest stays: the new
            # writer retires it (`_retire_strays`), or the next open collects it.
            raise engine.fail(exc) from exc
        if truncate_dsn:
            engine.driver.truncate(truncate_dsn)
            engine.wal_truncated_below(truncate_dsn + 1)
        self._previous = plan.previous_for_next()
        self._since_global = 0 if globally else self._since_global + 1
        self.anchor = anchor
        retired = await self._retire_old(kept)
        # Objects whose blocks were all dropped at or before the anchor: no retained
        # checkpoint names them and no retained WAL entry creates them (decision 0010).
        deleted = 0
        if anchor is not None:
            deleted = await asyncio.to_thread(self._blocks.covered, anchor.ckp_ts)
        if retired or deleted:
            # Entries below ckp_ts may create blocks whose objects are now gone: a compute
            # node behind it starts from this checkpoint (engine/logtail.py).
            engine.objects_collected_upto(ckp_ts)
        self.taken += 1
        self.last_duration_ms = (asyncio.get_running_loop().time() - started) * 1000
        self.last_bytes = sum(t.nbytes for t in plan.dumps.values())
        engine.checkpoint_taken(manifest)
        return manifest

    async def _retire_old(self, kept: retention.Kept) -> int:
        """Retire the checkpoints the window does not keep (`kept`, decision 0010); how many
        objects other than their manifests were deleted with them (block objects among
        them)."""
        deleted = 0
        keep_names = {self.retained[i].name for i in kept.indices}
        for old in [m for m in self.retained if m.name not in keep_names]:
            self.retained.remove(old)
            garbage = [
                name for name in old.objects if self._blocks.refs.drop(name, ("ckp", old.ckp_ts))
            ]
            self.objects_retired += await asyncio.to_thread(
                files.retire, self.store, old.name, garbage
            )
            deleted += len(garbage)
        newest = self.newest
        if newest is not None:
            # What is in use is read here, on the loop that changes it; the store in a thread.
            used = self._blocks.refs.names() | {m.name for m in self.retained}
            deleted += await asyncio.to_thread(self._retire_strays, newest.ckp_ts, used)
        return deleted

    def _retire_strays(self, newest_ts: int, used: set[str]) -> int:
        """Retire checkpoints this engine does not retain, older than its newest: those a
        fenced writer wrote after this engine took over (its CKP entry was refused, so no
        WAL names it, and its retirement never ran). Issue 20: a TN fenced by a promotion
        left a third checkpoint behind, kept until the next open and then retained in place
        of this engine's own older one, while nothing protected the objects it names.

        Called after this engine's CKP entry is durable: it holds the WAL's lease, so a
        writer still writing a checkpoint is fenced and will never log it. A stray's
        objects that a retained checkpoint or a block still uses stay (`used`)."""
        strays = [
            name
            for name in files.manifests(self.store)
            if name not in used and (layout.ckp_ts_of(name) or 0) <= newest_ts
        ]
        deleted = 0
        for name in strays:
            try:
                names = files.read_manifest(self.store, name).objects
            except (CheckpointCorrupt, ObjectsError):
                names = ()  # its objects go with the next open's orphans
            garbage = [o for o in names if o not in used]
            log.warning("retiring checkpoint %s: no WAL entry names it (a fenced writer's)", name)
            self.objects_retired += files.retire(self.store, name, garbage)
            deleted += len(garbage)
        return deleted


def _below(older: list[Manifest], newest: Manifest) -> list[Manifest]:
    """`older` (ascending by name) with ckp_ts strictly rising and below `newest`'s: two
    checkpoints can share a ckp_ts (a crash after one was written and before the WAL named
    it, then the same state checkpointed again), and the retained list is one per ckp_ts,
    the one restored kept (they hold the same commits)."""
    kept: list[Manifest] = []
    for manifest in older:
        if manifest.ckp_ts < newest.ckp_ts and (not kept or manifest.ckp_ts > kept[-1].ckp_ts):
            kept.append(manifest)
    return kept
