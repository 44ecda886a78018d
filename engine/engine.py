"""The engine: an asyncio shell around the pure cores (catalog, pipeline, conflict index,
storage) and the WAL driver.

    eng = await Engine.open("DIR")                                 # WAL: file backend in DIR/wal
    eng = await Engine.open("DIR", wal="logsvc", client_config="client.toml", shard=1)
    eng = await Engine.open("DIR", wal="memory")                   # tests and benchmarks
    async with eng.transaction() as txn: ...
    async with eng.snapshot(ts) as ro: ...
    await eng.close()

What the shell does, and why here (shared/STYLE.md "Pure cores, I/O at the edges"):

* **open**: opens the backend, replays the driver (`ReplayMode.FOR_WRITE`, or FOR_READ for a
  read-only engine) through `EngineState.apply`, the same function a live commit uses, so
  the state after a restart is exactly the committed state. An entry that does not decode
  or apply is a `WalCorruption` naming its DSN; the engine does not open. The clock is raised
  past the highest replayed commit_ts. Over logsvc the backend takes the shard's lease with a
  new epoch, which fences every older engine on that shard.
* **commit**: `CommitPipeline.prepare` (conflict check, commit_ts) -> encode the entry ->
  `driver.submit` (no waiting; the driver packs concurrent entries into one record and one
  fsync, or one Raft entry) -> when the driver completes the entry (in DSN order), the
  pipeline releases the visible prefix of its queue and the shell applies each entry and
  answers its waiter. Everything from prepare to submit is synchronous, so no other commit
  can slip between the commit_ts order and the DSN order.
* **failure**: a failed driver append fails every queued commit with `WalFailed` (`Fenced`
  when a newer engine holds the lease) and the engine turns read-only: nothing not durable is
  ever acknowledged, reads go on, and a reopen lets replay decide what survived.

The engine's state, and the rules by which the modules it hosts (replay, standby, maintenance,
the checkpointer, rewrites, time travel, compute nodes' write sets) read and change it, are
`EngineCore` (engine/core.py); each of those modules names what it needs as a Protocol and
none imports this one (issue 21).

Single event loop; not thread-safe (`engine.SyncEngine` runs one on a thread for scripts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from engine import (
    limits,
    old_snapshots,
    opening,
    replay,
    rewrite_commit,
    spill,
    time_travel,
    writeset,
)
from engine import standby as standby_wal
from engine.blockstore import ObjectBlockStore
from engine.checkpoint.layout import Manifest
from engine.checkpoint.runner import Checkpointer
from engine.clock import HybridClock, wall_ms
from engine.compaction import Policy
from engine.conflicts import BulkInsert, KeyConflict, RowWrite, conflict_error
from engine.core import EngineCore
from engine.errors import (
    BadInput,
    EngineClosed,
    NotFound,
    Overloaded,
    SnapshotUnavailable,
    StandbyFailed,
    TxnTooLarge,
    WalFailed,
    WriteConflict,
)
from engine.layout import WAL_DIR_NAME
from engine.load_scope import LoadScope
from engine.logtail import Logtail, LogtailUnavailable, TailEntry
from engine.logtail import answer as logtail_answer
from engine.maintenance import BlockStore, Maintenance
from engine.objects.store import ObjectStore
from engine.pipeline import Ticket
from engine.state import ApplyError
from engine.storage import PersistedBlock
from engine.txn import Transaction, TransactionScope, TxnState
from engine.waiter import CommitWaiter, wal_failure
from engine.wal.codec import encode_entry
from engine.wal.entry import Append, AppendRows, Origin, TxnEntry, memo_of, without_delete_keys
from engine.writeset import WriteSet
from tae_driver import LogBackend, open_driver
from tae_driver import errors as driver_errors
from tae_driver.completion import Completion
from tae_driver.driver import DriverStats, ReplaySummary


@dataclass(frozen=True, slots=True)
class EngineStats:
    visible_ts: int
    read_only: bool
    failed: str | None
    databases: int
    tables: int
    live_rows: int
    txns_open: int
    commits: int
    conflicts: int
    commit_queue: int
    conflict_keys: int
    replay: ReplaySummary | None
    replay_duplicates: int
    wal: DriverStats
    standby_failure: str | None = None
    """Why a standby's tail of the WAL is failing now (None: it follows, or no standby)."""
    standby_catchups: int = 0
    """Times a standby fell behind the WAL's truncation and caught up from a checkpoint."""
    standby_tail_failures: int = 0
    """Failed attempts of a standby's tail (each retried, or the last one given up)."""


class Engine(EngineCore):
    """Build with `await Engine.open(...)`."""

    # --- opening ------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: str,
        wal: str | LogBackend = "file",
        *,
        client_config: str | None = None,
        shard: int | None = None,
        read_only: bool = False,
        create: bool = True,
        now_ms: Callable[[], int] = wall_ms,
        window_records: int = limits.WAL_WINDOW_RECORDS,
        holder: str | None = None,
        objects: str | ObjectStore | None = None,
        cache_bytes: int = limits.CACHE_BYTES,
        block_store: BlockStore | None = None,
        policy: Policy | None = None,
        maintenance: bool = True,
        standby: bool = False,
        txn_limits: limits.TxnLimits | None = None,
        history_retention: datetime.timedelta | None = None,
    ) -> Engine:
        """Open (creating if needed) the engine whose WAL is `wal`:

        * "file": tae_driver's file backend in `path/wal` (the embedded default);
        * "logsvc": shard `shard` of the logsvc cluster in `client_config` (a client.toml);
          the engine takes the shard's lease, fencing any older engine on it;
        * "memory": an in-memory log that dies with the engine (tests, benchmarks);
        * a `tae_driver.LogBackend` the caller owns (tests: reopen on the same backend).

        `path` must be an engine's directory, or missing or empty (then it becomes one,
        unless `create=False`: `NotFound`); a file or a directory of other things is
        `NotAnEngine` (`opening.check_engine_dir`). Every failure is an `EngineError`: a file
        WAL another process has open is `EngineLocked` (naming its pid), a WAL that cannot be
        opened or read is `OpenFailed` with the backend's error as its cause. A read-only
        open writes nothing (issue 20): a file WAL is read without its lock (a standby's
        excepted), beside a running writer, as it was at open; a torn tail is not read,
        never cut.

        Table data outlives memory in `objects` (decision 0006): "dir" (the default for the
        file and logsvc WALs: a durable directory `path/objects`), "memory" (the default for
        the memory WAL and for a caller's LogBackend), "none" (part 1's engine: every row in
        memory, the WAL never truncated), or an `engine.objects` store (S3: `S3ObjectStore`).
        Blocks are read through a cache of `cache_bytes`. `block_store` (tests) replaces the
        object store with any `maintenance.BlockStore`; `policy` tunes flushes, merges and
        checkpoints; `maintenance=False` leaves them to the caller (`engine.maintenance.step()`).

        `read_only` replays for reading and refuses commits (and over logsvc takes no
        lease, so it fences nobody; a directory of objects is opened without its lock).
        `standby` is read-only too and keeps tailing the WAL (a standby TN, issue 15): its
        state follows the writer's commits until `promote()` makes it the writer.

        `txn_limits` (`engine.TxnLimits`) raises or lowers the per-transaction limits: rows
        inserted or updated, rows deleted, workspace bytes (engine/limits.py).

        `history_retention` (a `timedelta`; default the policy's `history_retention_ms`, an
        hour, `limits.HISTORY_RETENTION_MS`) is how far back `snapshot()` reads across
        restarts, checkpoints, merges and compactions: the WAL, checkpoints and objects are
        kept for it and collected once out of it (decision 0010). `timedelta(0)` keeps
        history only since the newest checkpoint, as before issue 24."""
        if not __debug__:
            raise RuntimeError("the engine refuses to run with assertions disabled (python -O)")
        path = os.fspath(path)
        read_only = read_only or standby
        txn_limits = txn_limits or limits.TxnLimits()
        if (problem := txn_limits.problem()) is not None:
            raise BadInput(problem)
        if history_retention is not None:
            policy = dataclasses.replace(
                policy or Policy(), history_retention_ms=_retention_ms(history_retention)
            )
        if read_only and wal == "file" and not os.path.isdir(os.path.join(path, WAL_DIR_NAME)):
            # Looking must not create: a read-only open of a missing engine is an error.
            raise NotFound(f"no engine here: {os.path.join(path, WAL_DIR_NAME)} does not exist")
        with opening.typed_open_errors(path):
            if opening.uses_directory(wal, objects):
                opening.check_engine_dir(path, wal, create=create or read_only)
            if not read_only:
                os.makedirs(path, exist_ok=True)
            backend, owns = await opening.open_backend(
                path, wal, client_config, shard, read_only, holder, standby=standby
            )
        try:
            driver = open_driver(backend, window=window_records)
            engine = cls(path, backend, owns, driver, HybridClock(now_ms), read_only=read_only)
            engine.standby = standby
            engine._window_records = window_records
            engine.txn_limits = txn_limits
            store = block_store
            if store is None:
                store = await asyncio.to_thread(
                    opening.open_block_store, path, objects, wal, read_only, cache_bytes
                )
            if store is not None:
                engine._attach(store, policy or Policy())
                engine._owns_objects = block_store is None and (
                    objects is None or isinstance(objects, str)
                )
            if engine._checkpointer is not None:
                manifest = await asyncio.to_thread(engine._checkpointer.restore)
                if manifest is not None:
                    engine.restored_from(manifest)
            if standby:
                engine._standby_tail = standby_wal.start(engine)
            else:
                engine._replay = await replay.replay_wal(engine)
            if engine._checkpointer is not None:
                engine._checkpointer.fell_back()
            if engine._checkpointer is not None and not read_only:
                await engine._checkpointer.collect_orphans()
            if engine._maintenance is not None and maintenance and not read_only:
                engine._maintenance.start()
        except BaseException as exc:
            if owns:
                with contextlib.suppress(Exception):
                    await backend.close()
            if "engine" in locals():
                engine._close_objects()
            typed = opening.typed_open_error(path, exc)
            if typed is None:
                raise
            raise typed from exc
        return engine

    def _attach(self, store: BlockStore, policy: Policy) -> None:
        self._loader = store
        self._block_store = store
        self._maintenance = Maintenance(self, store, policy)
        if isinstance(store, ObjectBlockStore):
            self._checkpointer = Checkpointer(self, store)
            self._checkpointer.wal_reserve_entries = policy.checkpoint_wal_reserve_entries
            self._checkpointer.history_retention_ms = policy.history_retention_ms
        self._hook_state()

    # --- logtail and standby (issue 15, decision 0007) -----------------------------------------

    def subscribe(self, callback: Callable[[TailEntry], None]) -> Callable[[], None]:
        """Call `callback` with every entry from now on as it becomes visible (on the event
        loop, in commit order; it must not block). Returns the unsubscribe function."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def logtail(self, t0: int, t1: int) -> Logtail:
        """The committed changes in (t0, t1] for a compute node (engine/logtail.py); t1 is
        clamped to `visible_ts`. `LogtailUnavailable` when neither memory nor a checkpoint
        can answer (the engine takes a checkpoint; ask again)."""
        self.check_not_closed()
        checkpoints = (
            [(m.ckp_ts, m.name) for m in self._checkpointer.retained]
            if self._checkpointer is not None
            else []
        )
        checkpoints += self._logged_checkpoints
        try:
            return logtail_answer(
                self._logtail, t0, t1, self.visible_ts, checkpoints, self._objects_floor_ts
            )
        except LogtailUnavailable:
            if self._maintenance is not None:
                self._maintenance.want_checkpoint()
            raise

    async def promote(self) -> None:
        """A standby becomes the writer (TN failover, issue 15; engine/standby.py)."""
        await standby_wal.promote(self)

    async def confirm_lease(self) -> bool:
        """A writer over a leased log (logsvc) asks whether it still holds the lease; False,
        and the engine fails with `Fenced` (read-only, as after a fenced append), when a
        newer writer took it. An idle writer learns of a fencing only this way: the TN asks
        when a peer says it is active too (issue 20: a fenced TN said "active" for 19 s)."""
        self.check_not_closed()
        confirm = getattr(self._backend, "confirm_lease", None)
        if confirm is None or self.read_only or self._failure is not None:
            return self._failure is None
        try:
            await confirm()
        except driver_errors.BackendFenced as exc:
            self._fail(exc)
            return False
        return True

    @property
    def standby_failure(self) -> str | None:
        """Why a standby's tail of the WAL is failing now (it retries, or gave up), or None
        while it follows the WAL (or the engine is no standby)."""
        tail = self._standby_tail
        return tail.failure if tail is not None and self.standby else None

    @property
    def standby_gave_up(self) -> StandbyFailed | None:
        """Set when a standby's tail stopped for good: it can neither follow nor take over."""
        tail = self._standby_tail
        return tail.gave_up if tail is not None and self.standby else None

    async def checkpoint(self, *, global_: bool = False) -> Manifest | None:
        """Take a checkpoint now (the engine also takes them by itself, decision 0006):
        the state at `visible_ts` in objects, a CKP WAL entry, the WAL truncated below it.
        None when nothing was committed since the last one. Needs an object store."""
        if self._checkpointer is None:
            raise BadInput("checkpoints need an object store (objects='dir', 'memory', ...)")
        return await self._checkpointer.checkpoint(global_=global_)

    # --- observations -----------------------------------------------------------------------

    def digest(self, ts: int | None = None) -> str:
        """A hash of the committed state visible at `ts` (default: now)."""
        self.check_not_closed()
        return self._state.digest(self.visible_ts if ts is None else ts, self._loader)

    def driver_stats(self) -> DriverStats:
        return self._driver.stats()

    def stats(self) -> EngineStats:
        catalog = self._state.catalog
        ts = self.visible_ts
        databases = catalog.databases_at(ts)
        tables = [t for d in databases for t in catalog.tables_at(d.db_id, ts)]
        pipeline = self._pipeline
        tail = self._standby_tail
        return EngineStats(
            visible_ts=ts,
            read_only=self.read_only,
            failed=str(self._failure) if self._failure else None,
            databases=len(databases),
            tables=len(tables),
            live_rows=sum(t.data.live_rows for t in tables),
            txns_open=len(self._open_txns),
            commits=pipeline.commits_visible,
            conflicts=pipeline.conflicts_found,
            commit_queue=len(pipeline),
            conflict_keys=len(pipeline.conflicts),
            replay=self._replay,
            replay_duplicates=self._replay_duplicates,
            wal=self._driver.stats(),
            standby_failure=self.standby_failure,
            standby_catchups=tail.catchups if tail is not None else 0,
            standby_tail_failures=tail.failures if tail is not None else 0,
        )

    # --- transactions -----------------------------------------------------------------------

    async def begin(self) -> Transaction:
        """A new transaction reading the snapshot at `visible_ts`."""
        self.check_not_closed()
        if len(self._open_txns) >= limits.TXNS_OPEN_MAX:
            raise Overloaded("open transactions", limits.TXNS_OPEN_MAX)
        txn = Transaction(self, self.visible_ts, read_only=self.read_only)
        self._open_txns.add(txn)
        return txn

    async def begin_at(self, start_ts: int | datetime.datetime) -> Transaction:
        """A transaction reading the snapshot at a past `start_ts` (a commit timestamp or an
        aware wall time, as `snapshot`; a compute node's, issue 15): its commit checks
        conflicts with everything committed since. Only the in-memory history can be
        written from: older is `SnapshotUnavailable` naming `oldest_ts`, the oldest
        timestamp a transaction can start at."""
        self.check_not_closed()
        if len(self._open_txns) >= limits.TXNS_OPEN_MAX:
            raise Overloaded("open transactions", limits.TXNS_OPEN_MAX)
        start_ts = await time_travel.resolve(self, start_ts)
        floor = self._history_floor_ts
        if start_ts < floor:
            raise SnapshotUnavailable(
                f"transaction at {start_ts}: older than the oldest timestamp a transaction "
                f"can start at, {floor} (older history is read-only: use snapshot())",
                floor,
            )
        txn = Transaction(self, start_ts, read_only=self.read_only)
        self._open_txns.add(txn)
        return txn

    async def execute(self, write_set: WriteSet) -> int:
        """Run a compute node's transaction (engine/writeset.py); its commit_ts."""
        return await writeset.execute(self, write_set)

    def transaction(self) -> TransactionScope[Transaction]:
        """`async with engine.transaction() as txn`: commits on normal exit (unless the
        transaction already ended), rolls back on an exception."""
        return TransactionScope(self.begin)

    @contextlib.asynccontextmanager
    async def snapshot(
        self,
        ts: int | datetime.datetime | None = None,
        *,
        at: int | datetime.datetime | None = None,
    ) -> AsyncIterator[Transaction]:
        """A read-only view of the committed state at `ts` or `at` (one of them): a commit
        timestamp up to `visible_ts`, or a time-zone-aware wall time (`engine.time_travel.
        resolve`: the last timestamp of its millisecond, waiting for commits in flight
        below it, so the same wall time always reads the same state).

        Since `_history_floor_ts` the state comes from memory (blocks dropped by flushes,
        merges and compactions stay while a view reads below their drop). Older, inside the
        history retention window (decision 0010), it is rebuilt from a checkpoint and the
        WAL (`engine.time_travel`). A timestamp or wall time past what has happened is
        `TimestampInFuture`; one older than `oldest_ts` is `SnapshotUnavailable` naming it."""
        self.check_not_closed()
        if (ts is None) == (at is None):
            raise BadInput("snapshot takes one of ts and at")
        read_ts = await time_travel.resolve(self, ts if at is None else at)
        if read_ts < self._history_floor_ts:
            async with self._histories.view(self, read_ts) as past:
                past_txn = Transaction(past, read_ts, read_only=True, registered=False)
                try:
                    yield past_txn
                finally:
                    past_txn.state = TxnState.ROLLED_BACK
            return
        txn = Transaction(self, read_ts, read_only=True, registered=False)
        with self.pin(read_ts):
            try:
                yield txn
            finally:
                txn.state = TxnState.ROLLED_BACK

    async def sql(self, query: str, at: int | datetime.datetime | None = None) -> pa.Table:
        """One SELECT over the snapshot at `at` (None: `visible_ts`; a commit timestamp; an
        aware datetime), every table as `db.table` (and its bare name when unambiguous),
        read with its columns and filters pushed into `scan` (engine/sql.py). `SqlError` for a
        bad or writing query, `SqlUnavailable` without DuckDB (`pip install 'logsvc[sql]'`)."""
        scope = self.snapshot(self.visible_ts) if at is None else self.snapshot(at=at)
        async with scope as view:
            # engine/sql.py pulls in pyarrow.dataset and pandas (~0.3 s): imported by the
            # first query, not by every process that opens an engine.
            from engine import sql

            return await sql.run(view, query)

    @property
    def oldest_ts(self) -> int:
        """The oldest timestamp `snapshot()` can read now (decision 0010)."""
        return time_travel.oldest_ts(self)

    # --- commit -------------------------------------------------------------------------------

    async def commit_txn(self, txn: Transaction) -> None:
        if self._closed:  # not WalFailed from the closed driver: the caller closed it
            txn.end(TxnState.ROLLED_BACK)
            raise EngineClosed("engine is closed")
        maintenance = self._maintenance
        if (
            maintenance is not None
            and maintenance.over_memory
            and txn.appends_rows()
            and not await maintenance.wait_for_memory()
        ):
            txn.end(TxnState.ROLLED_BACK)
            raise Overloaded("l0 bytes", limits.L0_BYTES_HARD_MAX)
        plan = txn.plan()
        if plan.empty:
            txn.commit_ts = txn.start_ts
            txn.end(TxnState.COMMITTED)
            return
        if self._failure is not None:
            txn.end(TxnState.ROLLED_BACK)
            raise self._failure_again()
        if self.read_only:
            txn.end(TxnState.ROLLED_BACK)
            raise BadInput("the engine was opened read-only")
        loop = asyncio.get_running_loop()
        commit = CommitWaiter(txn, loop.create_future())
        pipeline = self._pipeline
        bulk = (
            [*plan.bulk, *[spilled.keys for _, spilled in plan.spills]]
            if plan.spills
            else plan.bulk
        )
        checked_ts = 0
        if self._history_floor_ts <= txn.start_ts < pipeline.conflicts.floor_ts:
            # Below the index's floor: the table data decides (engine/old_snapshots.py),
            # then the index from `checked_ts` on; no suspension between the two. (Below
            # `_history_floor_ts` the table data no longer holds every change since: such
            # a transaction cannot have begun here, and stays refused as too old.)
            try:
                verdict = await self._check_old_snapshot(txn.start_ts, plan.rows, bulk)
            except BaseException:  # an object store error, or blocks that kept changing
                txn.end(TxnState.ROLLED_BACK)
                raise
            if isinstance(verdict, KeyConflict):
                txn.end(TxnState.ROLLED_BACK)
                raise conflict_error(verdict, self._table_name)
            checked_ts = verdict
        try:
            prepared = pipeline.prepare(
                txn.start_ts,
                plan.rows,
                plan.guards,
                plan.marks,
                self._clock.next,
                commit,
                bulk,
                checked_ts,
            )
        except Overloaded:
            txn.end(TxnState.ROLLED_BACK)
            raise
        if not isinstance(prepared, Ticket):
            txn.end(TxnState.ROLLED_BACK)
            raise conflict_error(prepared, self._table_name)
        ticket = prepared
        deletes = (
            rewrite_commit.resolve_moved(self._state.catalog.tables, plan.deletes)
            if plan.deletes
            else plan.deletes
        )
        if deletes is None:
            pipeline.cancel(ticket)
            txn.end(TxnState.ROLLED_BACK)
            raise WriteConflict(
                "a row this transaction deletes was rewritten by a flush or merge and is no "
                "longer where the transaction saw it"
            )
        allocations = []
        commands: list[Any] = list(plan.catalog_commands)
        if txn.origin is not None:
            commands.append(Origin(*txn.origin))
        commands.extend(deletes)
        for entry, spilled in plan.spills:
            allocations.append((entry.data, entry.data.reservation()))
            commands.extend(spill.spill_commands(self._state.pending_meta, entry, spilled))
        for entry, batch in plan.appends:
            allocations.append((entry.data, entry.data.reservation()))
            infos = entry.data.allocate(batch.num_rows)
            if type(batch) is pa.RecordBatch:
                commands.append(Append(entry.db_id, entry.table_id, infos, batch))
            else:
                commands.append(AppendRows(entry.db_id, entry.table_id, infos, batch))
        txn_entry = TxnEntry(txn.start_ts, ticket.commit_ts, memo_of(commands), tuple(commands))

        def undo() -> None:
            for data, mark in reversed(allocations):
                data.restore(mark)
            for _, spilled in plan.spills:
                for written in spilled.written:
                    self._state.pending_meta.pop((written.object_name, written.row_group), None)
            txn.end(TxnState.ROLLED_BACK)

        self.submit_commit(ticket, txn_entry, undo)
        txn.state = TxnState.COMMITTING
        self._since_prune += 1 + len(plan.rows) // 256
        if self._since_prune >= 64:  # every 64 commits, or every ~16k keys written
            self._prune()
        # Not shielded: a caller that is cancelled only stops waiting; the commit goes on
        # and becomes visible in its turn (`_on_durable` never needs its waiter).
        await commit.future

    def submit_commit(
        self, ticket: Ticket[CommitWaiter], entry: TxnEntry, undo: Callable[[], None]
    ) -> None:
        """Encode the prepared `entry` and hand it to the driver; once durable, `_on_durable`
        makes it visible in its turn and answers `ticket`'s waiter. The one submit of every
        commit: a transaction's (`commit_txn`) and a rewrite's (engine/rewrite_commit.py).

        If it cannot be submitted, `undo` reverts what the caller reserved for it and the
        ticket leaves the pipeline, then: `TxnTooLarge` (the entry is over
        `TXN_ENTRY_BYTES_MAX` even without its deleted rows' keys, which are left out when
        they alone do not fit), `Overloaded` (the driver's intake is full), `WalFailed` or
        `Fenced` (the driver failed: the engine is now read-only), or the error itself."""
        try:
            payload = encode_entry(entry)
            if len(payload) > limits.TXN_ENTRY_BYTES_MAX:
                keyless = without_delete_keys(entry)
                if keyless is not None:  # the deleted rows' keys did not fit: logged without
                    entry = keyless
                    payload = encode_entry(entry)
            if len(payload) > limits.TXN_ENTRY_BYTES_MAX:
                raise TxnTooLarge("txn_entry_bytes_max", len(payload), limits.TXN_ENTRY_BYTES_MAX)
            durable = self._driver.submit_direct(
                payload, lambda done: self._on_durable(ticket, done)
            )
        except BaseException as exc:
            undo()
            self._pipeline.cancel(ticket)
            if isinstance(exc, driver_errors.Overloaded):
                raise Overloaded("wal intake", exc.size_max) from None
            if isinstance(exc, (driver_errors.DriverFailed, driver_errors.DriverClosed)):
                self._fail(exc)
                raise self._failure_again() from exc
            raise
        commit = ticket.waiter
        commit.entry = entry
        commit.payload = payload
        commit.durable = durable  # its callback runs in a later turn: this is set by then

    async def _check_old_snapshot(
        self, start_ts: int, rows: list[RowWrite], bulk: list[BulkInsert]
    ) -> KeyConflict | int:
        tables = self._state.catalog.tables
        datas = {
            table_id: tables[table_id].data
            for table_id in {r.key[0] for r in rows if isinstance(r.key, tuple)}
            | {b.table_id for b in bulk}
            if table_id in tables
        }

        def load(blocks: list[PersistedBlock]) -> LoadScope:
            return self.loaded(blocks, keys=True, columns=old_snapshots.COLUMNS)

        return await old_snapshots.check(datas, load, lambda: self.visible_ts, start_ts, rows, bulk)

    def discard_objects(self, names: list[str]) -> None:
        """Objects written for a transaction that will never commit: deleted in the
        background (a failure leaves orphans, collected at the next open)."""
        store = self._block_store
        if store is None or self._closed:
            return
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(store.discard, names))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _on_durable(self, ticket: Ticket[CommitWaiter], done: Completion) -> None:
        """The driver learned `ticket`'s entry durable (or failed), in this very loop turn
        (tae_driver/completion.py: no turn between durable and visible)."""
        exc = done.exception()
        if exc is not None:
            self._fail(exc)
            return
        if self._failure is not None:
            return  # every queued commit was failed already
        ticket.waiter.dsn = done.result()
        visible = self._pipeline.durable(ticket, CommitWaiter.resolved)
        if visible:
            self._make_visible(visible)

    def _make_visible(self, visible: list[Ticket[CommitWaiter]]) -> None:
        """Apply durable commits (one pass for the group: engine/state.py `apply_group`)
        and answer their waiters, in commit order."""
        entries = []
        for made_visible in visible:
            commit = made_visible.waiter
            assert commit.entry is not None
            entries.append(commit.entry)
        try:
            self._state.apply_group(entries)
        except ApplyError as error:
            # A bug (the workspace checks make it impossible): stop acknowledging,
            # answer every waiter, and crash loudly rather than leave commits hanging.
            bug = AssertionError(f"committed entry does not apply: {error}")
            self._fail(bug)
            for left in visible:
                if not left.waiter.future.done():
                    left.waiter.future.set_exception(WalFailed(str(bug)))
            raise bug from error
        filled = False
        for made_visible, entry in zip(visible, entries, strict=True):
            commit = made_visible.waiter
            self._visible_dsn = max(self._visible_dsn, commit.dsn)
            if commit.txn is not None:
                commit.txn.commit_ts = made_visible.commit_ts
                commit.txn.end(TxnState.COMMITTED)
            self.became_visible(TailEntry(made_visible.commit_ts, commit.dsn, commit.payload))
            if not commit.future.done():
                commit.future.set_result(None)
            filled = filled or _fills_a_block(entry)
        if filled and self._maintenance is not None:
            # A full block may be flushed now, not at the next interval: a bulk load fills
            # blocks faster than MAINTENANCE_INTERVAL_MS.
            self._maintenance.poke()

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            held = self._pipeline.take_durable()
            if held:  # durable before the failure, held back for their group: acknowledged
                self._make_visible(held)
        if self._failure is None:
            self._failure = wal_failure(exc)
        for ticket in self._pipeline.fail():
            commit = ticket.waiter
            if commit.txn is not None:
                commit.txn.end(TxnState.UNKNOWN)
            if not commit.future.done():
                error = type(self._failure)(str(self._failure))
                error.__cause__ = exc
                commit.future.set_exception(error)
                commit.future.exception()  # retrieved even if nobody awaits it any more

    def _prune(self) -> None:
        self._since_prune = 0
        oldest = min((txn.start_ts for txn in self._open_txns), default=self.visible_ts)
        self._pipeline.prune(oldest)

    def fail(self, exc: BaseException) -> WalFailed:
        """The WAL failed with `exc`: the engine turns read-only (`_fail`); the error to raise."""
        self._fail(exc)
        return self._failure_again()

    # --- closing -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for commits in flight, then close the WAL. Open transactions are abandoned."""
        if self._closed:
            return
        if self._maintenance is not None:
            await self._maintenance.stop()
        self._closed = True
        await self._stop_tailing()
        with contextlib.suppress(driver_errors.DriverError):
            await self._driver.close()
        if self._owns_backend:
            with contextlib.suppress(driver_errors.DriverError):
                await self._backend.close()
        self._close_objects()

    async def _stop_tailing(self) -> None:
        tail, self._standby_tail = self._standby_tail, None
        if tail is not None:
            await tail.stop()

    def _close_objects(self) -> None:
        if self._owns_objects and isinstance(self._block_store, ObjectBlockStore):
            self._block_store.close()

    async def abort(self) -> None:
        """Stop at once, as a crash would: commits in flight are abandoned (each may or may
        not be durable; a reopen's replay decides, all or nothing per transaction)."""
        self._closed = True
        if self._maintenance is not None:
            await self._maintenance.stop()
        await self._stop_tailing()
        await self._driver.abort()
        if self._owns_backend:
            with contextlib.suppress(BaseException):
                await self._backend.close()
        self._close_objects()

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _retention_ms(retention: object) -> int:
    if not isinstance(retention, datetime.timedelta):
        raise BadInput(f"history_retention must be a datetime.timedelta, not {retention!r}")
    retention_ms = retention // datetime.timedelta(milliseconds=1)
    if not 0 <= retention_ms <= limits.HISTORY_RETENTION_MS_MAX:
        raise BadInput(
            f"history_retention must be in 0..{limits.HISTORY_RETENTION_MS_MAX} ms "
            f"(30 days), not {retention}"
        )
    return retention_ms


def _fills_a_block(entry: TxnEntry) -> bool:
    """`entry` appended the last row of some L0 block."""
    return any(
        info.offset + info.rows == limits.BLOCK_ROWS_MAX
        for command in entry.commands
        if type(command) is Append or type(command) is AppendRows
        for info in command.infos
    )
