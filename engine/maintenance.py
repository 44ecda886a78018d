"""The engine's background storage work: flushes, merges, compactions and block collection.

Why a loop of its own (decision 0006; seed "Compact & Merge": compaction runs concurrently with
writers and commits as a transaction): every `MAINTENANCE_INTERVAL_MS` it asks the pure policy
(`compaction.plan`) what each table needs, seals open blocks that are too old or when L0
memory is full, and runs at most `REWRITES_IN_FLIGHT_MAX` rewrites at once. A rewrite reads
its inputs at a snapshot, sorts and writes the output objects in a worker thread, then commits
through the engine's pipeline (`rewrite_commit.commit_rewrite`); if the commit no longer applies
(the table was dropped, the engine failed) its objects are deleted, never referenced.

Blocks dropped before the oldest open snapshot are collected here too; their objects go to
the block store, which deletes an object once nothing refers to it any more. And the keys of
persisted blocks that entered a table from their objects' footers (open, replay) are read here
into the table's key index (engine/storage/keyindex.py), one batch of blocks at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa

from engine import compaction, limits, rewrite_commit
from engine.clock import make_ts, wall_ms
from engine.compaction import COMMIT_TS_COLUMN, Policy, Rewrite, Task, WrittenBlock
from engine.schema import Schema
from engine.snapshot_reads import BlockReader
from engine.storage import TS_NEVER, Block, L0Block, PersistedBlock, PersistedMeta
from engine.storage.keyindex import KeyIndex, RunMerge, U64Array
from engine.storage.loader import BlockLoader
from engine.wal.entry import BlockLevel, CreateBlock

if TYPE_CHECKING:
    from engine.catalog import TableEntry
    from engine.checkpoint.layout import Manifest
    from engine.checkpoint.runner import Checkpointer

log = logging.getLogger("engine.maintenance")


class BlockWriter(Protocol):
    """What maintenance needs of the block store (engine/blockstore.py)."""

    def write_rewrite(
        self, table_id: int, level: BlockLevel, schema: Schema, rewrite: Rewrite
    ) -> list[WrittenBlock]:
        """Write the rewrite's outputs as one object (durable when this returns)."""
        ...

    def discard(self, names: Sequence[str]) -> None:
        """Delete objects that were written and never committed."""
        ...

    def held(self, table_id: int, block: PersistedBlock) -> None:
        """A persisted block the engine's state now holds (its object is referenced)."""
        ...

    def collected(self, table_id: int, blocks: Sequence[PersistedBlock]) -> None:
        """Persisted blocks no reader can see any more (their objects may be garbage)."""
        ...

    def key_hashes(self, block: PersistedBlock) -> U64Array:
        """The `key_hash` of each of the block's keys, read from its object (the table's
        key index takes them, for blocks restored or replayed from footers)."""
        ...


class BlockStore(BlockWriter, BlockLoader, Protocol):
    """Everything the engine needs of its objects: reads (BlockLoader), rewrites
    (BlockWriter), and a block's metadata from its object (replay of a CreateBlock)."""

    def meta(self, cmd: CreateBlock) -> PersistedMeta: ...


class MaintenanceHost(rewrite_commit.RewriteHost, BlockReader, Protocol):
    """What maintenance needs of the engine, besides a rewrite's commit (engine/engine.py
    implements it)."""

    @property
    def checkpointer(self) -> Checkpointer | None: ...

    @property
    def wal_entries_since_checkpoint(self) -> int:
        """WAL entries visible since the newest checkpoint's DSN."""
        ...

    @property
    def logtail_full(self) -> bool: ...

    def oldest_snapshot_ts(self) -> int:
        """No open transaction, snapshot or pin reads below this."""
        ...

    def history_dropped_upto(self, ts: int) -> None: ...

    async def checkpoint(self, *, global_: bool = False) -> Manifest | None: ...


class Maintenance:
    def __init__(self, engine: MaintenanceHost, writer: BlockWriter, policy: Policy) -> None:
        self._engine = engine
        self._writer = writer
        self.policy = policy
        self._busy: set[tuple[int, int]] = set()
        """(table_id, block_id) of every input of a rewrite in flight."""
        self._running: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._index_task: asyncio.Task[None] | None = None
        """Reading the keys of persisted blocks the tables' key indexes lack (one at a
        time, `KEY_INDEX_BLOCKS_PER_TASK` blocks each)."""
        self._merge_task: asyncio.Task[None] | None = None
        """A large merge of a table's key index runs in a worker thread (one at a time over
        every table: at most one merged copy of two runs in memory; issue 21)."""
        self._wake = asyncio.Event()
        self.l0_bytes = 0
        """Bytes of live L0 blocks over every table, as of the last step."""
        self._relieved = asyncio.Event()
        self._relieved.set()
        self._last_checkpoint_ms = wall_ms()
        self._checkpoint_wanted = False
        self.rewrites_done: dict[str, int] = {"flush": 0, "merge": 0, "compact": 0}
        self.rewrites_abandoned = 0
        self.errors = 0
        self.memory_waits = 0
        """Commits that waited for flushes to bring L0 under `L0_BYTES_HARD_MAX`."""
        self.last_error: str | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        assert self._loop_task is None
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        running = list(self._running)
        if self._checkpoint_task is not None:
            running.append(self._checkpoint_task)
        if self._index_task is not None:
            running.append(self._index_task)
        if self._merge_task is not None:
            running.append(self._merge_task)
        for rewrite in running:
            rewrite.cancel()
        for rewrite in running:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await rewrite

    async def _loop(self) -> None:
        while True:
            # Every interval, and at once when a rewrite finishes while more work waits
            # (flushes must keep up with a bulk load, or L0 grows until commits are held).
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns the inner result when
            # the wake and stop()'s cancel come together, the cancel is lost and stop()
            # waits forever (a close hung that way once blocks filled up fast).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limits.MAINTENANCE_INTERVAL_MS / 1000):
                    await self._wake.wait()
            self._wake.clear()
            try:
                self.step()
            except Exception as exc:  # a bug: keep the engine serving, say so
                self.errors += 1
                self.last_error = repr(exc)
                log.exception("maintenance step failed")

    async def wait_for_memory(self) -> bool:
        """Commits that append wait here while L0 holds more than `L0_BYTES_HARD_MAX`
        (flushes give it back); False if that did not happen within `L0_WAIT_S_MAX`."""
        if self._relieved.is_set():
            return True
        self.memory_waits += 1
        self._wake.set()
        try:
            async with asyncio.timeout(limits.L0_WAIT_S_MAX):
                await self._relieved.wait()
        except TimeoutError:
            return False
        return True

    @property
    def over_memory(self) -> bool:
        return not self._relieved.is_set()

    @property
    def backlog(self) -> int:
        """Rewrites in flight."""
        return len(self._running)

    # --- one step ----------------------------------------------------------------------------

    def step(self, *, freeze_all: bool = False) -> list[asyncio.Task[None]]:
        """Plan every table and start what fits; returns the rewrites started. Collects
        blocks no reader can see. `freeze_all` seals every open block first (tests,
        shutdown flushes)."""
        engine = self._engine
        if not engine.accepts_commits:
            return []
        state = engine.state
        now_ms = wall_ms()
        gc_ts = engine.oldest_snapshot_ts()
        grace_ms = self.policy.snapshot_grace_ms
        if grace_ms:
            gc_ts = min(gc_ts, make_ts(max(0, now_ms - grace_ms)))
        tables = [t for t in state.catalog.tables.values() if t.visible(engine.visible_ts)]
        l0_total = sum(compaction.l0_bytes(t.data) for t in tables)
        self.l0_bytes = l0_total
        if l0_total <= limits.L0_BYTES_HARD_MAX:
            self._relieved.set()
        else:
            self._relieved.clear()
        memory_full = l0_total >= self.policy.l0_bytes_max
        started: list[asyncio.Task[None]] = []
        for table in state.catalog.tables.values():
            if table.delete_ts <= gc_ts and table.data.blocks:
                # Dropped before every reader's snapshot: its blocks are unreachable.
                self._release(table.table_id, table.data.release_all(), table.delete_ts)
        for table in tables:
            data = table.data
            gone = data.collect(gc_ts)
            if gone:
                self._release(table.table_id, gone, max(b.drop_ts for b in gone))
            busy = frozenset(b for (t, b) in self._busy if t == table.table_id)

            plan = compaction.plan(
                table.table_id,
                data,
                now_ms=now_ms,
                gc_ts=gc_ts,
                busy=busy,
                policy=self.policy,
                memory_full=memory_full,
            )
            if (plan.freeze or freeze_all) and data.freeze():
                # The sealed block may be complete already: plan again to flush it now.
                plan = compaction.plan(
                    table.table_id,
                    data,
                    now_ms=now_ms,
                    gc_ts=gc_ts,
                    busy=busy,
                    policy=self.policy,
                )
            for task in plan.tasks:
                if len(self._running) >= limits.REWRITES_IN_FLIGHT_MAX:
                    break
                started.append(self._start(task))
        self._maybe_checkpoint(now_ms)
        self._maybe_index(tables)
        self._maybe_merge_index(tables)
        return started

    def _maybe_index(self, tables: Sequence[TableEntry]) -> None:
        """Start reading the keys of blocks a table's key index lacks (after an open or a
        replay: footers hold no keys). Until then point reads test those blocks' key ranges
        and blooms, as before the index (correct, one probe per such block)."""
        if self._index_task is not None:
            return
        for table in tables:
            waiting = table.data.unindexed_blocks()
            if waiting:
                batch = waiting[: limits.KEY_INDEX_BLOCKS_PER_TASK]
                loop = asyncio.get_running_loop()
                self._index_task = loop.create_task(self._index(table.table_id, batch))
                return

    async def _index(self, table_id: int, blocks: Sequence[PersistedBlock]) -> None:
        writer = self._writer
        try:
            hashes = await asyncio.to_thread(lambda: [writer.key_hashes(b) for b in blocks])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an object store error: retried by a later step
            self.errors += 1
            self.last_error = f"key index of table {table_id}: {exc!r}"
            log.warning("%s", self.last_error)
            return
        finally:
            self._index_task = None
        table = self._engine.state.catalog.tables.get(table_id)
        if table is not None:
            for block, block_hashes in zip(blocks, hashes, strict=True):
                table.data.index_block(block.block_id, block_hashes)
        self._wake.set()  # more may wait

    def _maybe_merge_index(self, tables: Sequence[TableEntry]) -> None:
        """Start the large key index merge a table wants (engine/storage/keyindex.py), in a
        worker thread: the event loop only swaps the result in."""
        if self._merge_task is not None:
            return
        for table in tables:
            index = table.data.key_index
            job = index.take_merge()
            if job is not None:
                loop = asyncio.get_running_loop()
                self._merge_task = loop.create_task(self._merge_index(index, job))
                return

    async def _merge_index(self, index: KeyIndex, job: RunMerge) -> None:
        try:
            merged = await asyncio.to_thread(job.run)
        except BaseException as exc:  # cancelled (stop), or no memory: offered again
            index.merge_abandoned(job)
            if not isinstance(exc, Exception):
                raise
            self.errors += 1
            self.last_error = f"key index merge: {exc!r}"
            log.warning("%s", self.last_error)
            return
        finally:
            self._merge_task = None
        # The index may have been purged, cleared or its table released meanwhile: then
        # the job is stale and `merged` drops it.
        index.merged(job, merged)
        self._wake.set()  # the next merge may be wanted

    def _maybe_checkpoint(self, now_ms: int) -> None:
        """Start a checkpoint when the WAL grew by `CKP_WAL_ENTRIES` since the last one, or
        the policy's `checkpoint_interval_ms` (default `CKP_INTERVAL_MS`) passed with anything
        new (issue 14: the WAL stays a bounded window; restart replays a bounded tail)."""
        engine = self._engine
        checkpointer = engine.checkpointer
        if checkpointer is None or self._checkpoint_task is not None:
            return
        entries = engine.wal_entries_since_checkpoint
        due = (
            entries >= limits.CKP_WAL_ENTRIES
            or (
                entries > 0
                and now_ms - self._last_checkpoint_ms >= self.policy.checkpoint_interval_ms
            )
            or (entries > 0 and (self._checkpoint_wanted or engine.logtail_full))
        )
        self._checkpoint_wanted = False
        if not due:
            return
        self._last_checkpoint_ms = now_ms
        task = asyncio.get_running_loop().create_task(self._checkpoint())
        self._checkpoint_task = task

    def poke(self) -> None:
        """Plan at once rather than at the next interval (a block filled)."""
        self._wake.set()

    def want_checkpoint(self) -> None:
        """Take a checkpoint at the next step (a compute node is behind the logtail)."""
        self._checkpoint_wanted = True
        self._wake.set()

    async def _checkpoint(self) -> None:
        try:
            await self._engine.checkpoint()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an object store error, a failed WAL: retried later
            self.errors += 1
            self.last_error = f"checkpoint: {exc!r}"
            log.warning("%s", self.last_error)
        finally:
            self._checkpoint_task = None

    def _release(self, table_id: int, gone: Sequence[Block], dropped_ts: int) -> None:
        """`gone` left memory; history at or below `dropped_ts` is no longer complete."""
        self._engine.history_dropped_upto(dropped_ts)
        persisted = [b for b in gone if isinstance(b, PersistedBlock)]
        if persisted:
            self._writer.collected(table_id, persisted)

    def _start(self, task: Task) -> asyncio.Task[None]:
        for block_id in task.inputs:
            self._busy.add((task.table_id, block_id))
        running = asyncio.get_running_loop().create_task(self._run(task))
        self._running.add(running)
        running.add_done_callback(self._running.discard)
        return running

    async def _run(self, task: Task) -> None:
        written: list[WrittenBlock] = []
        committed = False
        try:
            written, committed = await self._rewrite(task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an object store error: retried by a later step
            self.errors += 1
            self.last_error = f"{task.kind} of table {task.table_id}: {exc!r}"
            log.warning("%s", self.last_error)
        finally:
            for block_id in task.inputs:
                self._busy.discard((task.table_id, block_id))
            self._wake.set()
            if written and not committed:
                self.rewrites_abandoned += 1
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self._writer.discard, [w.object_name for w in written])

    async def _rewrite(self, task: Task) -> tuple[list[WrittenBlock], bool]:
        engine = self._engine
        table = engine.state.catalog.tables.get(task.table_id)
        if table is None:
            return [], False
        data = table.data
        start_ts = engine.visible_ts
        blocks: list[Block] = []
        for block_id in task.inputs:
            block = data.blocks.get(block_id)
            if block is None or block.drop_ts != TS_NEVER:
                return [], False
            blocks.append(block)
        persisted = [b for b in blocks if isinstance(b, PersistedBlock)]
        names = [*table.schema.names, COMMIT_TS_COLUMN]
        inputs: list[tuple[int, int, pa.Table, np.ndarray]] = []
        async with engine.loaded(persisted, columns=names) as loaded:
            for block in blocks:
                if isinstance(block, L0Block):
                    rows, offsets = compaction.l0_rows(block, table.schema, start_ts)
                else:
                    rows, offsets = compaction.persisted_rows(
                        block, loaded.columns(block), start_ts
                    )
                inputs.append((block.block_id, block.rows, rows, offsets))
        rewrite = await asyncio.to_thread(compaction.rewrite, table.schema, inputs)
        written: list[WrittenBlock] = []
        if rewrite.rows.num_rows:
            written = await asyncio.to_thread(
                self._writer.write_rewrite, table.table_id, task.level, table.schema, rewrite
            )
        commit_ts = await rewrite_commit.commit_rewrite(engine, task, start_ts, rewrite, written)
        if commit_ts is None:
            return written, False
        self.rewrites_done[task.kind] += 1
        return written, True

    async def settle(self, *, freeze_all: bool = False, rounds_max: int = 64) -> None:
        """Run steps until nothing is left to do (tests, checkpoints, benchmarks): every
        sealed block flushed, every merge and compaction done. Bounded by `rounds_max`."""
        for _ in range(rounds_max):
            started = self.step(freeze_all=freeze_all)
            running = list(self._running)
            if self._index_task is not None:
                running.append(self._index_task)
            if self._merge_task is not None:
                running.append(self._merge_task)
            if not started and not running:
                return
            await asyncio.gather(*running, return_exceptions=True)
            freeze_all = False
