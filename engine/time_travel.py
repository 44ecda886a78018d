"""Snapshots by wall time, and snapshots below the engine's in-memory history (decision 0010).

Why a module of its own: `Engine.snapshot` reads the live state for any timestamp the
engine still holds in memory (every block version since `_history_floor_ts`). Below that
floor, inside the history retention window, the state is rebuilt as Delta Lake rebuilds a
version: the newest retained checkpoint at or below the timestamp, plus the WAL after it
replayed up to the timestamp, into a separate read-only state that shares the engine's
object store and buffer cache (objects are immutable). The retention window keeps exactly
what that needs (engine/checkpoint/retention.py): the checkpoints from the window's anchor
on, the WAL from the anchor's DSN, and every object a kept checkpoint or WAL entry names.

Cost of a snapshot below the floor: reading the checkpoint (its lists, L0 dumps and delta
objects; persisted blocks' footers come through the cache) and reading and applying the WAL
entries between the checkpoint and the timestamp (at most a checkpoint interval's worth
when every checkpoint in the window is kept). The last state built is kept (one entry), so
repeated reads at one timestamp pay once; at most `HISTORY_VIEWS_MAX` are held at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from engine import limits
from engine.blockstore import ObjectBlockStore
from engine.catalog import Catalog
from engine.checkpoint import files
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import Manifest
from engine.clock import HybridClock, make_ts, ts_at_datetime, ts_isoformat, ts_physical_ms
from engine.errors import (
    BadInput,
    Overloaded,
    SnapshotUnavailable,
    TimestampInFuture,
    WalCorruption,
)
from engine.limits import TxnLimits
from engine.load_scope import LoadsBlocks
from engine.objects.errors import ObjectsError
from engine.pipeline import CommitPipeline
from engine.state import ApplyError, EngineState
from engine.storage.loader import BlockLoader
from engine.txn import Transaction, TxnState
from engine.waiter import CommitWaiter
from engine.wal.codec import decode_entry
from engine.wal.entry import TxnEntry
from tae_driver import LogBackend, ReplayDecision, ReplayMode, open_driver
from tae_driver import errors as driver_errors

if TYPE_CHECKING:
    from engine.checkpoint.runner import Checkpointer
    from engine.errors import WalFailed
    from engine.maintenance import BlockStore


class TimeTravelHost(Protocol):
    """What snapshots by wall time and below the in-memory history need of the engine
    (engine/engine.py implements it)."""

    txn_limits: TxnLimits

    @property
    def visible_ts(self) -> int: ...

    @property
    def failed(self) -> WalFailed | None: ...

    @property
    def clock(self) -> HybridClock: ...

    @property
    def pipeline(self) -> CommitPipeline[CommitWaiter]: ...

    @property
    def checkpointer(self) -> Checkpointer | None: ...

    @property
    def history_floor_ts(self) -> int: ...

    @property
    def block_store(self) -> BlockStore | None: ...

    @property
    def loader(self) -> BlockLoader | None: ...

    @property
    def backend(self) -> LogBackend: ...

    @property
    def window_records(self) -> int: ...


TS_OR_WALL = int | datetime.datetime
"""What `snapshot(at)` takes: a commit timestamp, or an aware wall time."""


# --- the timestamp a snapshot reads at ------------------------------------------------------


async def resolve(engine: TimeTravelHost, at: object) -> int:
    """The snapshot timestamp of `at` (a commit timestamp, or a time-zone-aware datetime).

    A commit timestamp above `visible_ts`, or a wall time later than the engine's clock, is
    `TimestampInFuture`. A past wall time resolves to the last timestamp of its millisecond,
    capped at `visible_ts` (no commit since), after waiting for every commit in flight at or
    below it to become visible: the clock has passed that millisecond, so no later commit
    can land below it, and the same `at` always reads the same state (repeatable).
    A wall time in the current millisecond waits for the clock to leave it."""
    if isinstance(at, bool) or not isinstance(at, (int, datetime.datetime)):
        raise BadInput(f"snapshot at {at!r}: give a commit timestamp (int) or an aware datetime")
    visible = engine.visible_ts
    if isinstance(at, int):
        if at < 0:
            raise BadInput(f"snapshot at {at}: a commit timestamp is not negative")
        if at > visible:
            raise TimestampInFuture(
                f"snapshot at {at}: in the future (the newest visible commit is {visible})",
                visible,
            )
        return at
    try:
        target = ts_at_datetime(at)
    except ValueError as exc:
        raise BadInput(f"snapshot at {at!r}: {exc}") from None
    wall = ts_physical_ms(target)
    clock = engine.clock
    # A commit issued from now on gets a timestamp above both the clock's last one and the
    # current millisecond: a target below either can no longer gain a commit.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(limits.SNAPSHOT_IN_FLIGHT_WAIT_S_MAX):
            # This millisecond may still issue commit timestamps at or below `target`: wait
            # for the clock to leave it (a millisecond, unless the clock is stopped).
            while clock.now_ms() == wall and target > clock.last_ts:
                await asyncio.sleep(0.001)
    now = clock.now_ms()
    if wall >= now and target > clock.last_ts:
        raise TimestampInFuture(
            f"snapshot at {at.isoformat()}: in the future (the engine's clock is at "
            f"{ts_isoformat(make_ts(now))}; the newest visible commit is {engine.visible_ts})",
            engine.visible_ts,
        )
    if target <= engine.visible_ts:
        return target
    # Commits prepared before now, with timestamps at or below the target, not visible yet.
    waiting = [
        ticket.waiter.future
        for ticket in engine.pipeline.queued()
        if ticket.commit_ts <= target and not ticket.waiter.future.done()
    ]
    if waiting:
        done, pending = await asyncio.wait(waiting, timeout=limits.SNAPSHOT_IN_FLIGHT_WAIT_S_MAX)
        if pending:
            raise SnapshotUnavailable(
                f"snapshot at {at.isoformat()}: {len(pending)} commits at or below it are "
                f"still in flight after {limits.SNAPSHOT_IN_FLIGHT_WAIT_S_MAX:g} s",
                oldest_ts(engine),
            )
        if any(f.cancelled() or f.exception() is not None for f in done):
            # The WAL failed under them: each may or may not be durable (a reopen's replay
            # decides), so no answer now would be the one a later read gives.
            raise SnapshotUnavailable(
                f"snapshot at {at.isoformat()}: commits at or below it failed in flight "
                f"({engine.failed}); reopen the engine to learn which are durable",
                oldest_ts(engine),
            )
    return min(target, engine.visible_ts)


# --- how far back --------------------------------------------------------------------------


def _start_for(engine: TimeTravelHost, ts: int) -> Manifest | None:
    """Where a state at `ts` below the in-memory floor is rebuilt from: a retained
    checkpoint, or None (the empty state: the WAL still starts at its first entry and no
    checkpoint was ever taken or restored). `SnapshotUnavailable` when nothing can."""
    checkpointer = engine.checkpointer
    if checkpointer is None:
        raise unavailable(engine, ts)
    usable = [m for m in checkpointer.history_starts() if m.ckp_ts <= ts]
    if usable:
        return usable[-1]
    if checkpointer.history_from_empty():
        return None
    raise unavailable(engine, ts)


def oldest_ts(engine: TimeTravelHost) -> int:
    """The oldest timestamp `snapshot()` can read now: the in-memory floor, or lower, the
    oldest checkpoint the history retention window keeps with its WAL."""
    floor = engine.history_floor_ts
    checkpointer = engine.checkpointer
    if checkpointer is None or checkpointer.history_retention_ms == 0:
        return floor
    if checkpointer.history_from_empty():
        return 0
    starts = checkpointer.history_starts()
    return min(floor, starts[0].ckp_ts) if starts else floor


def unavailable(engine: TimeTravelHost, ts: int) -> SnapshotUnavailable:
    oldest = oldest_ts(engine)
    checkpointer = engine.checkpointer
    window_ms = checkpointer.history_retention_ms if checkpointer is not None else 0
    why = (
        f"the history retention window is {window_ms} ms"
        if window_ms
        else "history_retention is 0: only what the engine holds in memory"
    )
    return SnapshotUnavailable(
        f"snapshot at {ts}: older than the oldest readable timestamp {oldest} "
        f"({ts_isoformat(oldest)}; {why})",
        oldest,
    )


# --- historical states -----------------------------------------------------------------------


class HistoricalStates:
    """The engine's states rebuilt below its in-memory floor: the last one kept for reuse,
    at most `HISTORY_VIEWS_MAX` alive at once."""

    def __init__(self) -> None:
        self._cached: tuple[int, HistoricalView] | None = None
        self._open = 0
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def view(self, engine: TimeTravelHost, ts: int) -> AsyncIterator[HistoricalView]:
        """A read-only host for transactions (`txn.TxnHost`) holding the committed state at
        `ts` (below the in-memory floor); the window's anchor stays at or below `ts` while it
        is open."""
        start = _start_for(engine, ts)
        if self._open >= limits.HISTORY_VIEWS_MAX:
            raise Overloaded("historical snapshots", limits.HISTORY_VIEWS_MAX)
        checkpointer = engine.checkpointer
        assert checkpointer is not None
        pin_ts = start.ckp_ts if isinstance(start, Manifest) else 0
        checkpointer.pins[pin_ts] += 1
        self._open += 1
        try:
            async with self._lock:  # one rebuild at a time: each holds a whole state
                cached = self._cached
                if cached is not None and cached[0] == ts:
                    view = cached[1]
                else:
                    self._cached = None  # let the old state go before building the next
                    view = await _rebuild(engine, start, ts)
                    self._cached = (ts, view)
            yield view
        finally:
            self._open -= 1
            checkpointer.pins[pin_ts] -= 1
            if checkpointer.pins[pin_ts] <= 0:
                del checkpointer.pins[pin_ts]


class _Reached(Exception):
    """The replay passed the snapshot's timestamp: stop reading."""


class HistoricalView(LoadsBlocks):
    """The committed state at a timestamp below the engine's in-memory floor, as a
    read-only host for `Transaction` (engine/txn.py `TxnHost`): its reads share the
    engine's object store and cache; it never commits a write."""

    def __init__(
        self, state: EngineState, loader: BlockLoader | None, txn_limits: TxnLimits
    ) -> None:
        self.state = state
        self.txn_limits = txn_limits
        self._loader = loader

    @property
    def catalog(self) -> Catalog:
        return self.state.catalog

    @property
    def spill_writer(self) -> None:
        return None  # read-only: nothing is ever written

    async def commit_txn(self, txn: Transaction) -> None:
        # Its transactions are read-only snapshots: every write raised, the plan is empty.
        assert txn.plan().empty, "a write in a historical snapshot"
        txn.commit_ts = txn.start_ts
        txn.end(TxnState.COMMITTED)

    def txn_ended(self, txn: Transaction) -> None:
        pass  # its snapshots are not registered: nothing counts them

    def discard_objects(self, names: list[str]) -> None:
        assert not names, "a historical snapshot wrote objects"

    def check_not_closed(self) -> None:
        pass  # it lives while its snapshot is open (the engine checked it at the start)


async def _rebuild(engine: TimeTravelHost, start: Manifest | None, ts: int) -> HistoricalView:
    store = engine.block_store
    assert isinstance(store, ObjectBlockStore)
    try:
        if start is None:
            state, start_dsn = EngineState(), 0  # the whole WAL, from its first entry
        else:
            state = await asyncio.to_thread(files.read, store.store, start, store.meta)
            start_dsn = start.ckp_dsn
        # Object footers through the shared cache; no references taken: the window, not this
        # state, keeps its objects (and a rebuilt state must never make one look held).
        state.object_meta = store.meta
        await _replay_to(engine, state, start_dsn, ts)
    except (CheckpointCorrupt, ObjectsError) as exc:
        raise SnapshotUnavailable(
            f"snapshot at {ts}: its history cannot be read ({exc})", oldest_ts(engine)
        ) from exc
    return HistoricalView(state, engine.loader, engine.txn_limits)


async def _replay_to(engine: TimeTravelHost, state: EngineState, start_dsn: int, ts: int) -> None:
    """Apply the WAL entries after `start_dsn` with commit timestamps up to `ts` to `state`,
    through a driver of its own on the engine's backend (reads only; it stops at the first
    entry past `ts`, since commit_ts order is DSN order)."""
    driver = open_driver(engine.backend, window=engine.window_records)
    first: list[int] = []

    def handle(dsn: int, payload: bytes) -> ReplayDecision:
        if not first:
            first.append(dsn)
            if dsn > start_dsn + 1:
                raise SnapshotUnavailable(
                    f"snapshot at {ts}: the WAL starts at DSN {dsn}, past the checkpoint's "
                    f"DSN {start_dsn}",
                    oldest_ts(engine),
                )
        entry = decode_entry(payload, dsn)
        if not isinstance(entry, TxnEntry) or entry.commit_ts <= state.applied_ts:
            return ReplayDecision.INTERNAL
        if entry.commit_ts > ts:
            raise _Reached
        try:
            state.apply(entry)
        except ApplyError as exc:
            raise WalCorruption(dsn, f"does not apply: {exc}") from None
        return ReplayDecision.APPLY

    try:
        await driver.replay(handle, ReplayMode.FOR_READ)
    except _Reached:
        pass
    except driver_errors.DriverError as exc:
        raise SnapshotUnavailable(
            f"snapshot at {ts}: the WAL cannot be read ({exc})", oldest_ts(engine)
        ) from exc
    finally:
        await driver.abort()
