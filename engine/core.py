"""The engine's state, and the rules by which the engine's own modules read and change it.

`Engine` (engine/engine.py) is this plus the asyncio shell: opening, transactions, the commit
path, closing. What is here is what the modules the engine hosts need of it, each through the
small Protocol it declares (txn.TxnHost, replay.ReplayHost, standby.StandbyHost,
rewrite_commit.RewriteHost, maintenance.MaintenanceHost, checkpoint.runner.CheckpointHost,
time_travel.TimeTravelHost, writeset.WriteSetHost), so that none of them imports the engine
(issue 21: engine.py was the hub of a 13-module import cycle).

The public names below are for those modules, not for the engine's users (engine/__init__.py
documents that surface). The state stays private; each change to it from outside is a method
that names the rule it follows (`replayed`, `wal_truncated_below`, `history_dropped_upto`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from engine import limits, time_travel
from engine import standby as standby_wal
from engine.catalog import Catalog
from engine.checkpoint.layout import Manifest
from engine.checkpoint.runner import Checkpointer
from engine.clock import HybridClock
from engine.conflicts import ConflictIndex
from engine.errors import BadInput, EngineClosed, WalFailed
from engine.load_scope import LoadsBlocks
from engine.logtail import LogtailBuffer, TailEntry
from engine.maintenance import BlockStore, Maintenance
from engine.pipeline import CommitPipeline
from engine.state import EngineState
from engine.storage.loader import BlockLoader
from engine.txn import Transaction
from engine.waiter import CommitWaiter
from tae_driver import Driver, LogBackend, open_driver
from tae_driver.driver import ReplaySummary


class EngineCore(LoadsBlocks):
    """The engine's state (`Engine` builds it; see engine/engine.py)."""

    def __init__(
        self,
        path: str,
        backend: LogBackend,
        owns_backend: bool,
        driver: Driver,
        clock: HybridClock,
        *,
        read_only: bool,
    ) -> None:
        self.path = path
        self._backend = backend
        self._owns_backend = owns_backend
        self._driver = driver
        self._clock = clock
        self.read_only = read_only
        self._state = EngineState()
        self._loader: BlockLoader | None = None
        """The object store behind persisted blocks (engine/blockstore.py); None until the
        engine has one."""
        self._maintenance: Maintenance | None = None
        self._block_store: BlockStore | None = None
        self._owns_objects = False
        self._background: set[asyncio.Future[Any]] = set()
        self._checkpointer: Checkpointer | None = None
        self._visible_dsn = 0
        """The DSN of the last visible transaction's WAL entry."""
        self._wal_entries_at_ckp = 0
        self._logtail = LogtailBuffer(0, limits.LOGTAIL_BYTES_MAX)
        self._subscribers: list[Callable[[TailEntry], None]] = []
        self._origins_running: dict[tuple[str, int], asyncio.Future[int]] = {}
        self.standby = False
        self._standby_tail: standby_wal.StandbyTail | None = None
        """A standby's supervised tail of the WAL (engine/standby.py), until promotion."""
        self._window_records = limits.WAL_WINDOW_RECORDS
        self.txn_limits = limits.TxnLimits()
        """Per-transaction limits (`Engine.open(..., txn_limits=...)`)."""
        self._pipeline: CommitPipeline[CommitWaiter] = CommitPipeline(
            visible_ts=0,
            queue_max=limits.COMMIT_QUEUE_MAX,
            conflicts=ConflictIndex(keys_max=limits.CONFLICT_KEYS_MAX),
        )
        self._open_txns: weakref.WeakSet[Transaction] = weakref.WeakSet()
        """Transactions begun and not ended. Weak: a transaction its caller dropped without
        committing or rolling back stops counting (and stops pinning the conflict index)
        once it is garbage, instead of holding an open-transaction slot forever."""
        self._pins: collections.Counter[int] = collections.Counter()
        """Snapshot timestamps pinned (`pin`), with how many pins each: `snapshot()` views
        and checkpoints being written keep blocks like open transactions do."""
        self._history_floor_ts = 0
        """The oldest timestamp the in-memory state still holds every version for (blocks
        dropped at or before it left memory); older ones come from `engine.time_travel`."""
        self._wal_first_dsn = 1
        """The WAL holds every entry from this DSN on (the first replayed; raised as the
        checkpoints truncate it)."""
        self._histories = time_travel.HistoricalStates()
        self._objects_floor_ts = 0
        """Objects of blocks dropped at or before this were deleted (engine/logtail.py)."""
        self._logged_checkpoints: collections.deque[tuple[int, str]] = collections.deque(
            maxlen=limits.CKP_RETAINED
        )
        """A standby's view of the writer's newest checkpoints (ckp_ts, manifest name), from
        the CKP entries it tails: its own `retained` is what it restored at open."""
        self._since_prune = 0
        self._closed = False
        self._failure: WalFailed | None = None
        self._replay: ReplaySummary | None = None
        self._replay_duplicates = 0

    # --- the state a checkpoint or the WAL brings ---------------------------------------------

    def _hook_state(self) -> None:
        store = self._block_store
        if store is not None:
            self._state.object_meta = store.meta
            self._state.block_created = store.held

    def adopt_state(self, state: EngineState) -> None:
        """The state a checkpoint restored (before the WAL replay)."""
        self._state = state
        self._hook_state()

    def restored_from(self, manifest: Manifest) -> None:
        """The state is the checkpoint `manifest` (at open, or a standby's catch-up): the
        logtail, the DSNs, the history floor, `visible_ts` and the clock start from it."""
        self._logtail.reset(manifest.ckp_ts)
        self._visible_dsn = manifest.ckp_dsn
        self._wal_entries_at_ckp = manifest.ckp_dsn
        self._history_floor_ts = manifest.ckp_ts
        self._pipeline.visible_ts = manifest.ckp_ts
        self._clock.observe(manifest.ckp_ts)

    def became_visible(self, tail: TailEntry) -> None:
        """A committed entry is visible (or replayed): the logtail keeps it, and every
        subscriber hears of it, in commit order."""
        newest = self._checkpointer.newest if self._checkpointer is not None else None
        self._logtail.append(tail, keep_after_ts=newest.ckp_ts if newest is not None else 0)
        for subscriber in tuple(self._subscribers):  # a callback may unsubscribe
            subscriber(tail)

    def checkpoint_logged(self, ckp_ts: int, name: str) -> None:
        """A standby tailed the writer's CKP entry: compute nodes behind it may be sent that
        checkpoint, and, since the writer may have deleted objects whose drop it covers, no
        entries from below it (engine/logtail.py)."""
        self._logged_checkpoints.append((ckp_ts, name))
        self._objects_floor_ts = max(self._objects_floor_ts, ckp_ts)

    # --- checks and observations --------------------------------------------------------------

    def check_writable_storage(self) -> None:
        """Raise unless the engine may write objects and the WAL: `EngineClosed`, its
        `WalFailed` after a failure, `BadInput` when opened read-only."""
        self.check_not_closed()
        if self._failure is not None:
            raise self._failure_again()
        if self.read_only:
            raise BadInput("the engine was opened read-only")

    def checkpoint_taken(self, manifest: Manifest) -> None:
        # The checkpoint's own DSN, not `_visible_dsn` now: commits that landed while it was
        # being written are not in it, and must count towards the next one. (Counting them
        # as covered left a TN that went idle after a bulk load without a checkpoint of its
        # last commits for as long as it stayed idle: the distributed benchmark waited.)
        self._wal_entries_at_ckp = manifest.ckp_dsn

    @property
    def checkpointer(self) -> Checkpointer | None:
        return self._checkpointer

    @property
    def maintenance(self) -> Maintenance | None:
        """Flushes, merges, compactions (None without an object store)."""
        return self._maintenance

    @property
    def visible_ts(self) -> int:
        """The newest commit timestamp visible to new transactions; every commit at or below
        it is visible."""
        return self._pipeline.visible_ts

    @property
    def failed(self) -> WalFailed | None:
        return self._failure

    @property
    def skip_decoding_below_checkpoint(self) -> bool:
        """A replay skips the entries the restored checkpoint holds without decoding them
        (engine/replay.py): under a history window the WAL kept below it is long."""
        return self._checkpointer is not None and self._checkpointer.history_retention_ms > 0

    def txn_ended(self, txn: Transaction) -> None:
        self._open_txns.discard(txn)

    def _table_name(self, table_id: int) -> str:
        catalog = self._state.catalog
        table = catalog.tables.get(table_id)
        if table is None:
            return f"table id {table_id}"
        database = catalog.databases.get(table.db_id)
        return f"{database.name if database else table.db_id}.{table.name}"

    def check_not_closed(self) -> None:
        if self._closed:
            raise EngineClosed("engine is closed")

    def _failure_again(self) -> WalFailed:
        """A fresh copy of the engine's failure to raise, with its cause (who fenced it)."""
        assert self._failure is not None
        error = type(self._failure)(str(self._failure))
        error.__cause__ = self._failure.__cause__
        return error

    def oldest_snapshot_ts(self) -> int:
        """No open transaction, snapshot or pin (`pin`) reads below this: blocks dropped at or
        before it can be collected (`Maintenance` then raises `history_floor_ts` past them)."""
        oldest = self.visible_ts
        for txn in self._open_txns:
            oldest = min(oldest, txn.start_ts)
        if self._pins:
            oldest = min(oldest, *self._pins)
        return oldest

    # --- what the hosted modules read ---------------------------------------------------------

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def catalog(self) -> Catalog:
        return self._state.catalog

    @property
    def pipeline(self) -> CommitPipeline[CommitWaiter]:
        return self._pipeline

    @property
    def clock(self) -> HybridClock:
        return self._clock

    @property
    def driver(self) -> Driver:
        return self._driver

    @property
    def backend(self) -> LogBackend:
        return self._backend

    @property
    def window_records(self) -> int:
        return self._window_records

    @property
    def block_store(self) -> BlockStore | None:
        return self._block_store

    @property
    def spill_writer(self) -> BlockStore | None:
        return self._block_store

    @property
    def loader(self) -> BlockLoader | None:
        return self._loader

    @property
    def standby_tail(self) -> standby_wal.StandbyTail | None:
        return self._standby_tail

    @property
    def origins_running(self) -> dict[tuple[str, int], asyncio.Future[int]]:
        """A compute node's commits on their way, by origin (engine/writeset.py)."""
        return self._origins_running

    @property
    def replay_summary(self) -> ReplaySummary | None:
        """What the replay at open (or a standby's, at promotion) read; None before it."""
        return self._replay

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def accepts_commits(self) -> bool:
        """Neither failed, closed nor read-only: a rewrite may commit."""
        return self._failure is None and not self._closed and not self.read_only

    @property
    def visible_dsn(self) -> int:
        """The DSN of the last visible (or replayed) transaction's WAL entry."""
        return self._visible_dsn

    @property
    def wal_first_dsn(self) -> int:
        return self._wal_first_dsn

    @property
    def wal_entries_since_checkpoint(self) -> int:
        return self._visible_dsn - self._wal_entries_at_ckp

    @property
    def logtail_full(self) -> bool:
        return self._logtail.full()

    @property
    def history_floor_ts(self) -> int:
        """The oldest timestamp the in-memory state holds every version for."""
        return self._history_floor_ts

    # --- changes from the hosted modules, each naming its rule --------------------------------

    def replayed(self, dsn: int) -> None:
        """A replay read the entry at `dsn` (applied, or already held)."""
        self._visible_dsn = max(self._visible_dsn, dsn)

    def replayed_duplicate(self, dsn: int) -> None:
        """A replay read an entry the state already holds (a checkpoint's, or a copy)."""
        self._visible_dsn = max(self._visible_dsn, dsn)
        self._replay_duplicates += 1

    def wal_starts_at(self, dsn: int) -> None:
        """A replay's first entry: the WAL holds every entry from `dsn` on."""
        self._wal_first_dsn = dsn

    def wal_truncated_below(self, dsn: int) -> None:
        """A checkpoint truncated the WAL below `dsn`."""
        self._wal_first_dsn = max(self._wal_first_dsn, dsn)

    def objects_collected_upto(self, ts: int) -> None:
        """Objects of blocks dropped at or before `ts` may be gone (engine/logtail.py)."""
        self._objects_floor_ts = max(self._objects_floor_ts, ts)

    def history_dropped_upto(self, ts: int) -> None:
        """Blocks dropped at or before `ts` left memory: history there is incomplete."""
        self._history_floor_ts = max(self._history_floor_ts, ts)

    def promoted(self, summary: ReplaySummary) -> None:
        """A standby's tail read the WAL to its end (`summary`): it is the writer now."""
        self._replay = summary
        self.standby = False
        self.read_only = False

    def took_objects(self) -> None:
        """A promoted standby owns its object store's lock (released at close)."""
        self._owns_objects = True

    def forget_logged_checkpoints(self) -> None:
        """A promoted standby's own retained checkpoints say what it has from now on."""
        self._logged_checkpoints.clear()

    def new_driver(self) -> None:
        """A fresh driver on the same backend (a standby's next tail: a replay runs once per
        driver). The caller aborted the old one."""
        self._driver = open_driver(self._backend, window=self._window_records)

    @contextlib.contextmanager
    def pin(self, ts: int) -> Iterator[None]:
        """`with engine.pin(ts):` the versions a snapshot at `ts` reads stay in memory (blocks
        dropped after `ts` are not collected) until the block ends (a checkpoint being written
        at `ts`, a read-only view)."""
        self._pins[ts] += 1
        try:
            yield
        finally:
            self._pins[ts] -= 1
            if self._pins[ts] <= 0:
                del self._pins[ts]
