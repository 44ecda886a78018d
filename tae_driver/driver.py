"""The WAL driver: a thin asyncio shell around the pure cores.

Why a shell (shared/STYLE.md "Pure cores, I/O at the edges"): every decision lives in
`pipeline.WritePipeline` (DSNs, group commit, window, in-order completion),
`truncation.TruncationPlanner` (DSN intent -> backend LSN) and `replay.Replayer` (records ->
strict DSN order). This module only moves bytes between them and a `LogBackend`, owns the
futures the engine awaits, and runs two kinds of background work on the event loop:

* one task per in-flight record (at most `window` of them) awaiting `backend.append`, or,
  over a backend that implements `DirectAppender` (the file backend), no task at all: the
  record is handed over with `append_direct` and completed from its callback, in the loop
  turn the backend learns it durable (issue 21: 2 loop turns per append instead of 6);
* one truncation task that turns `truncate(dsn)` intents into `backend.truncate(lsn)` calls.

The contract the engine sees (reference/matrixone-wal.md §1 `driver.Driver`, §4 scenario 13):

* `await replay(handle, mode)` first. `handle(dsn, entry) -> ReplayDecision` is called in
  strictly increasing DSN order. FOR_WRITE makes the driver writable; FOR_READ leaves it
  read-only; FOREVER tails until `stop_tailing(mode)` (promotion, scenario 28), and raises
  `TailTruncated` when the log was truncated past the next record it had to read (the
  reader catches up from a checkpoint; it never skips over the hole). A second
  replay, concurrent or later, raises `ReplayStateError`.
* `await append(entry) -> dsn` completes in DSN order whatever order the backend finishes in
  (scenario 11). It waits while the intake is full (back-pressure from the window);
  `submit(entry)` is the non-waiting form that raises `Overloaded` instead, and
  `submit_direct(entry, on_done)` the same without a future: its callback runs in the turn
  the entry is learned durable (tae_driver/completion.py; the engine's commits use it).
* `truncate(dsn)` records an intent (monotonic, never fails, MO semantics); a read-only driver
  never truncates the backend. `truncate_intent()` is that intent; `truncated_lsn()` is what
  the backend confirmed (MO conflated the two, §2.7 Q6).
* If a backend append fails, the driver fails (`DriverFailed`) rather than leave a hole
  behind later records (§5: "a hole in the DSN sequence cannot be patched while running");
  the engine reopens and replays, which discards the trailing records durably.

Time enters only through the `sleep` callable used to poll a backend that cannot wake a
tailing reader (`TailWaiter`); tests never need it.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

from tae_driver import limits
from tae_driver.backend import DirectAppender, LogBackend, TailWaiter
from tae_driver.completion import Completion, Ticket, fire_all
from tae_driver.errors import (
    AlreadyTruncated,
    BackendError,
    DriverClosed,
    DriverFailed,
    EntryTooLarge,
    NeedReplayForWrite,
    OutOfRange,
    Overloaded,
    ReplayStateError,
    TailTruncated,
)
from tae_driver.pipeline import Dispatch, WritePipeline
from tae_driver.record import encode_skip
from tae_driver.replay import Apply, Finished, ReplayDecision, Replayer, ReplayMode, Wait
from tae_driver.truncation import KnownRecord, NeedCoverage, TruncateAt, TruncationPlanner

ReplayHandle = Callable[[int, bytes], ReplayDecision]
Sleep = Callable[[float], Awaitable[None]]

_TRUNCATE_PASSES_MAX = 64
"""Truncations attempted per wake-up of the truncation task; each pass moves the truncated
LSN up, so this only bounds the loop, it never limits correctness."""


@dataclass(frozen=True, slots=True)
class DriverConfig:
    window_records: int = limits.WINDOW_RECORDS_DEFAULT
    read_batch_bytes: int = limits.READ_BATCH_BYTES_DEFAULT
    record_entries_max: int = limits.RECORD_ENTRIES_MAX
    record_bytes_max: int = limits.RECORD_BYTES_MAX
    intake_entries_max: int = limits.INTAKE_ENTRIES_MAX
    tail_poll_delay_ms_min: int = limits.TAIL_POLL_DELAY_MS_MIN
    tail_poll_delay_ms_max: int = limits.TAIL_POLL_DELAY_MS_MAX

    def __post_init__(self) -> None:
        _check_range("window_records", self.window_records, 1, limits.WINDOW_RECORDS_MAX)
        _check_range("read_batch_bytes", self.read_batch_bytes, 1, limits.READ_BATCH_BYTES_MAX)
        _check_range("record_entries_max", self.record_entries_max, 1, limits.RECORD_ENTRIES_MAX)
        _check_range(
            "record_bytes_max",
            self.record_bytes_max,
            limits.RECORD_HEADER_BYTES + limits.ENTRY_SIZE_PREFIX_BYTES + 1,
            limits.RECORD_BYTES_MAX,
        )
        _check_range("intake_entries_max", self.intake_entries_max, 1, limits.INTAKE_ENTRIES_MAX)
        _check_range("tail_poll_delay_ms_min", self.tail_poll_delay_ms_min, 1, 60_000)
        _check_range(
            "tail_poll_delay_ms_max",
            self.tail_poll_delay_ms_max,
            self.tail_poll_delay_ms_min,
            60_000,
        )


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name}={value} is outside [{low}, {high}]")


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    mode: ReplayMode
    """The mode replay finished in (FOR_WRITE or FOR_READ; FOREVER ends in one of them)."""
    last_dsn: int
    entries_handled: int
    entries_applied: int
    records_read: int
    duplicates_ignored: int
    trailing_records: int
    skip_lsn: int | None
    truncated_lsn: int


@dataclass(frozen=True, slots=True)
class DriverStats:
    state: str
    dsn: int
    committed_dsn: int
    truncate_intent_dsn: int
    truncated_lsn: int
    intake_entries: int
    records_in_flight: int
    records_appended: int
    coverage_records: int
    truncate_calls: int
    truncate_errors: int


class _State(enum.Enum):
    NEW = "new"
    REPLAYING = "replaying"
    READ_ONLY = "read-only"
    WRITABLE = "writable"
    CLOSING = "closing"
    FAILED = "failed"
    CLOSED = "closed"


class _Activity:
    """Counts internal work that is runnable now (a scheduled pump, a record task that has not
    reached the backend yet, a truncation pass), so tests and `close` can wait for quiet
    without sleeping."""

    __slots__ = ("_count", "_idle")

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def begin(self) -> None:
        self._count += 1
        self._idle.clear()

    def end(self) -> None:
        assert self._count > 0
        self._count -= 1
        if self._count == 0:
            self._idle.set()

    def reset(self) -> None:
        self._count = 0
        self._idle.set()

    async def wait(self) -> None:
        while self._count:
            await self._idle.wait()


class Driver:
    """Build with `open_driver`. Not thread-safe: use from one event loop."""

    def __init__(self, backend: LogBackend, config: DriverConfig, *, sleep: Sleep) -> None:
        self._backend = backend
        self._direct = backend if isinstance(backend, DirectAppender) else None
        self._to_fire: list[Completion] = []
        """Completions marked done whose callbacks have not run (`_fire`)."""
        self._fire_scheduled = False
        self._config = config
        self._sleep = sleep
        self._state = _State.NEW
        self._failure: BaseException | None = None
        self._pipeline: WritePipeline[Ticket] | None = None
        self._planner: TruncationPlanner | None = None
        self._replayer: Replayer | None = None
        self._read_only_dsn = 0
        self._intent_dsn = 0
        self._truncated_lsn = 0
        self._tail_target = ReplayMode.FOREVER
        self._tailing = False
        self._tail_reads = 0
        """This replay began as FOREVER (a standby's tail), whatever it finishes in."""
        self._tail_wake = asyncio.Event()
        self._activity = _Activity()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump_scheduled = False
        self._truncate_kicked = False
        self._truncate_retry_on_return = False
        self._truncate_event = asyncio.Event()
        self._intake_space = asyncio.Event()
        self._drained = asyncio.Event()
        self._returned = asyncio.Event()
        self._records_appended = 0
        self._coverage_records = 0
        self._truncate_calls = 0
        self._truncate_errors = 0
        self.last_truncate_error: BaseException | None = None

    # --- observations ---------------------------------------------------------------------

    def dsn(self) -> int:
        """The last allocated DSN: after replay, the last replayed one; while tailing, how far
        the tail has got."""
        if self._pipeline is not None:
            return self._pipeline.allocated_dsn
        if self._replayer is not None:
            return self._replayer.last_dsn
        return self._read_only_dsn

    def committed_dsn(self) -> int:
        """Every DSN <= this has completed (in order)."""
        if self._pipeline is not None:
            return self._pipeline.committed_dsn
        return self.dsn()

    @property
    def writable(self) -> bool:
        return self._state is _State.WRITABLE

    @property
    def tail_reads(self) -> int:
        """Reads of the log this driver's replay has made (a standby's health: a tail that
        reads is a tail that works)."""
        return self._tail_reads

    def truncate_intent(self) -> int:
        return self._intent_dsn

    def truncated_lsn(self) -> int:
        """The backend's truncated LSN as last confirmed to this driver."""
        return self._truncated_lsn

    def lsn_map(self) -> list[KnownRecord]:
        """Known durable records above the truncation point (for tests and status)."""
        return self._planner.records() if self._planner is not None else []

    def stats(self) -> DriverStats:
        pipeline = self._pipeline
        return DriverStats(
            state=self._state.value,
            dsn=self.dsn(),
            committed_dsn=self.committed_dsn(),
            truncate_intent_dsn=self._intent_dsn,
            truncated_lsn=self._truncated_lsn,
            intake_entries=pipeline.intake_size if pipeline else 0,
            records_in_flight=pipeline.records_in_flight if pipeline else 0,
            records_appended=self._records_appended,
            coverage_records=self._coverage_records,
            truncate_calls=self._truncate_calls,
            truncate_errors=self._truncate_errors,
        )

    async def wait_idle(self) -> None:
        """Return when the driver has no internal work it can do right now: packing is done,
        every dispatched record has been handed to the backend, the truncation task waits."""
        await self._activity.wait()

    # --- replay ---------------------------------------------------------------------------

    async def replay(
        self, handle: ReplayHandle, mode: ReplayMode = ReplayMode.FOR_WRITE
    ) -> ReplaySummary:
        if self._state is _State.REPLAYING:
            raise ReplayStateError("concurrent replay")
        if self._state is not _State.NEW:
            raise ReplayStateError(f"replay already done (driver is {self._state.value})")
        self._state = _State.REPLAYING
        self._tailing = mode is ReplayMode.FOREVER
        if mode is not ReplayMode.FOREVER or self._tail_target is ReplayMode.FOREVER:
            self._tail_target = mode
        try:
            return await self._replay(handle)
        except BaseException as exc:
            if self._state is _State.REPLAYING:
                self._state = _State.FAILED
                self._failure = exc
            raise
        finally:
            self._replayer = None

    def stop_tailing(self, mode: ReplayMode = ReplayMode.FOR_READ) -> None:
        """End a FOREVER replay once it has caught up, finishing in `mode`: FOR_WRITE promotes
        the reader to the writer (TN migration, §4 scenario 28)."""
        assert mode is not ReplayMode.FOREVER
        self._tail_target = mode
        self._tail_wake.set()

    async def _replay(self, handle: ReplayHandle) -> ReplaySummary:
        backend = self._backend
        truncated = await backend.truncated()
        replayer = Replayer(truncated_lsn=truncated)
        self._replayer = replayer
        next_lsn = truncated + 1
        delay_ms = self._config.tail_poll_delay_ms_min
        while True:
            self._check_open_during_replay()
            try:
                records, resume_lsn = await backend.read(next_lsn, self._config.read_batch_bytes)
                self._tail_reads += 1
            except OutOfRange:
                truncated = await backend.truncated()
                if truncated < next_lsn:
                    raise
                if self._tailing:
                    # A tail that fell behind the writer's truncation (issue 25): the records
                    # it never read are gone. Resuming above them would leave a hole behind
                    # applied entries; the reader must catch up from a checkpoint instead.
                    raise TailTruncated(next_lsn, truncated, replayer.last_dsn) from None
                # Truncated under a one-shot replay: resume above the new truncation point;
                # what is missing is judged by the replay rules like any other gap.
                replayer.note_truncated(truncated)
                next_lsn = truncated + 1
                continue
            for rec in records:
                # Resolve after every record, not every batch: then what the engine sees
                # cannot depend on where batches end (§4: "never depends on the batch size").
                replayer.offer(rec)
                _drain(replayer, handle, at_end=False)
            if records:
                next_lsn = max(resume_lsn, records[-1].lsn + 1)
                delay_ms = self._config.tail_poll_delay_ms_min
                continue
            if self._tail_target is not ReplayMode.FOREVER:
                break
            replayer.note_truncated(await backend.truncated())
            await self._wait_for_growth(next_lsn - 1, delay_ms)
            delay_ms = min(2 * delay_ms, self._config.tail_poll_delay_ms_max)
        finished = _drain(replayer, handle, at_end=True)
        assert finished is not None
        mode = self._tail_target
        skip_lsn: int | None = None
        if mode is ReplayMode.FOR_WRITE and finished.skip_pairs:
            # Durably discard the trailing records before any DSN is reused (§2.5).
            skip_lsn = await backend.append(encode_skip(finished.skip_pairs))
            replayer.note_skip_written(skip_lsn)
        truncated = await backend.truncated()
        replayer.note_truncated(truncated)
        self._truncated_lsn = truncated
        summary = ReplaySummary(
            mode=mode,
            last_dsn=replayer.last_dsn,
            entries_handled=replayer.entries_handled,
            entries_applied=replayer.entries_applied,
            records_read=replayer.records_read,
            duplicates_ignored=replayer.duplicates_ignored,
            trailing_records=finished.trailing_records,
            skip_lsn=skip_lsn,
            truncated_lsn=truncated,
        )
        self._check_open_during_replay()
        if mode is ReplayMode.FOR_WRITE:
            latest = await backend.latest()
            self._pipeline = WritePipeline(
                last_dsn=replayer.last_dsn,
                lsn_acked_max=max(latest, replayer.last_lsn, skip_lsn or 0),
                window_records_max=self._config.window_records,
                record_entries_max=self._config.record_entries_max,
                record_bytes_max=self._config.record_bytes_max,
                intake_entries_max=self._config.intake_entries_max,
            )
            self._planner = TruncationPlanner(
                truncated, replayer.known_records(), truncated_dsn_max=replayer.skipped_dsn_max
            )
            self._intent_dsn = max(self._intent_dsn, replayer.clean_prefix_dsn)
            self._state = _State.WRITABLE
            self._spawn(self._truncation_loop())
            self._kick_truncation()
        else:
            self._read_only_dsn = replayer.last_dsn
            self._state = _State.READ_ONLY
        return summary

    def _check_open_during_replay(self) -> None:
        if self._state is not _State.REPLAYING:
            raise DriverClosed("driver closed during replay")

    async def _wait_for_growth(self, lsn: int, delay_ms: int) -> None:
        self._tail_wake.clear()
        if self._tail_target is not ReplayMode.FOREVER or self._state is not _State.REPLAYING:
            return
        backend = self._backend
        growth: Coroutine[Any, Any, None]
        if isinstance(backend, TailWaiter):
            growth = backend.wait_past(lsn)
        else:
            growth = _as_none(self._sleep(delay_ms / 1000))
        waiters = {asyncio.ensure_future(growth), asyncio.ensure_future(self._tail_wake.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    # --- appends --------------------------------------------------------------------------

    def submit(self, entry: bytes) -> asyncio.Future[int]:
        """Enqueue `entry` now; the future resolves to its DSN once it and every earlier entry
        are durable. Raises `Overloaded` when the intake is full (see `append`)."""
        pipeline = self._writable_pipeline()
        if len(entry) > pipeline.entry_bytes_max:
            raise EntryTooLarge(len(entry), pipeline.entry_bytes_max)
        if pipeline.intake_full():
            raise Overloaded("intake", self._config.intake_entries_max)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        pipeline.enqueue(bytes(entry), future)
        self._drained.clear()
        self._schedule_pump()
        return future

    def submit_direct(self, entry: bytes, on_done: Callable[[Completion], None]) -> Completion:
        """`submit` without a future: `on_done(completion)` runs in the loop turn the entry
        is learned durable (or failed), not a turn later (tae_driver/completion.py). Raises
        as `submit` does, and then `on_done` is never called."""
        pipeline = self._writable_pipeline()
        if len(entry) > pipeline.entry_bytes_max:
            raise EntryTooLarge(len(entry), pipeline.entry_bytes_max)
        if pipeline.intake_full():
            raise Overloaded("intake", self._config.intake_entries_max)
        completion = Completion(on_done)
        pipeline.enqueue(bytes(entry), completion)
        self._drained.clear()
        self._schedule_pump()
        return completion

    async def append(self, entry: bytes) -> int:
        """Append `entry`; return its DSN when it and every earlier entry are durable."""
        while True:
            pipeline = self._writable_pipeline()
            if len(entry) > pipeline.entry_bytes_max:
                raise EntryTooLarge(len(entry), pipeline.entry_bytes_max)
            if not pipeline.intake_full():
                break
            self._intake_space.clear()
            await self._intake_space.wait()
        return await self.submit(entry)

    def _writable_pipeline(self) -> WritePipeline[Ticket]:
        if self._state is _State.WRITABLE:
            assert self._pipeline is not None
            return self._pipeline
        if self._state is _State.FAILED:
            raise DriverFailed(f"driver failed: {self._failure!r}") from self._failure
        if self._state in (_State.CLOSING, _State.CLOSED):
            raise DriverClosed("driver is closed")
        raise NeedReplayForWrite(f"driver is {self._state.value}; replay for write first")

    def _schedule_pump(self) -> None:
        if self._pump_scheduled:
            return
        self._pump_scheduled = True
        self._activity.begin()
        asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Dispatch every record the window allows. Runs once per loop turn at most, so the
        entries submitted in one turn share records (group commit, scenario 12)."""
        self._pump_scheduled = False
        try:
            pipeline = self._pipeline
            if pipeline is None or self._state not in (_State.WRITABLE, _State.CLOSING):
                return
            direct = self._direct
            while (dispatch := pipeline.next_dispatch()) is not None:
                if dispatch.count == 0:
                    self._coverage_records += 1
                if direct is None:
                    self._activity.begin()
                    self._spawn(self._append_record(dispatch))
                    continue
                # No task per record: the backend calls back in the loop turn it learns the
                # record durable, and the callers' futures complete in that turn (issue 21).
                try:
                    direct.append_direct(dispatch.payload, partial(self._direct_done, dispatch))
                except Exception as exc:
                    self._fail(exc)
                    return
        finally:
            self._activity.end()

    def _direct_done(self, dispatch: Dispatch, lsn: int, error: BaseException | None) -> None:
        if error is not None:
            self._fail(error)
            return
        try:
            self._record_returned(dispatch, lsn)
        except BaseException as exc:  # a bug (an assert) in the core: fail loudly, never hang
            self._fail(exc)

    async def _append_record(self, dispatch: Dispatch) -> None:
        try:
            appending = self._backend.append(dispatch.payload)
        finally:
            # The backend sees the record during the first step of `appending`, which runs
            # before this task yields: from here on the work is the backend's.
            self._activity.end()
        try:
            lsn = await appending
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
            return
        self._record_returned(dispatch, lsn)

    def _record_returned(self, dispatch: Dispatch, lsn: int) -> None:
        """The backend made `dispatch` durable at `lsn`: deliver what is now in order."""
        if self._state not in (_State.WRITABLE, _State.CLOSING):
            return
        pipeline, planner = self._pipeline, self._planner
        assert pipeline is not None
        assert planner is not None
        self._records_appended += 1
        # Known as soon as it returns, not when delivered: the truncation walk must never
        # pass an LSN of ours it has not learned (§2.7 Q3).
        planner.note(KnownRecord(lsn, dispatch.start_dsn, dispatch.end_dsn, dispatch.safe_dsn))
        direct: list[Completion] = []
        for delivery in pipeline.on_returned(dispatch.token, lsn):
            for index, ticket in enumerate(delivery.tickets):
                if not ticket.done():
                    ticket.set_result(delivery.start_dsn + index)
                    if type(ticket) is Completion:
                        direct.append(ticket)
        self._intake_space.set()
        self._returned.set()
        if pipeline.idle():
            self._drained.set()
        self._schedule_pump()
        if self._truncate_retry_on_return:
            self._kick_truncation()
        self._fire(direct, now=pipeline.records_in_flight == 0)  # last: the driver is consistent

    def _fire(self, completions: list[Completion], *, now: bool) -> None:
        """Run the callbacks of `completions` (marked done), after any held before, in order.
        `now` when no record is in flight any more (a lone writer: in this very turn);
        otherwise in the next turn, so that the other records a backend hands back in this
        turn (the file backend: every record of one fsync) are marked first and the engine
        sees one group, not one per record."""
        pending = self._to_fire
        pending.extend(completions)
        if not pending:
            return
        if now:
            self._to_fire = []
            fire_all(pending)
        elif not self._fire_scheduled:
            self._fire_scheduled = True
            asyncio.get_running_loop().call_soon(self._fire_held)

    def _fire_held(self) -> None:
        self._fire_scheduled = False
        self._fire([], now=True)

    def _fail(self, exc: BaseException) -> None:
        if self._state in (_State.FAILED, _State.CLOSED):
            return
        self._state = _State.FAILED
        self._failure = exc
        orphans = self._pipeline.fail() if self._pipeline is not None else []
        direct: list[Completion] = []
        for ticket in orphans:
            if not ticket.done():
                error = DriverFailed(f"append failed: {exc!r}")
                error.__cause__ = exc
                ticket.set_exception(error)
                if type(ticket) is Completion:
                    direct.append(ticket)
        self._wake_all()
        self._fire(direct, now=True)

    def _wake_all(self) -> None:
        self._intake_space.set()
        self._drained.set()
        self._returned.set()
        self._tail_wake.set()

    # --- truncation -----------------------------------------------------------------------

    def truncate(self, dsn: int) -> None:
        """Every entry with DSN <= `dsn` may go: an intent, acted on in the background by a
        writable driver; intents only move up. Never fails."""
        assert dsn >= 0
        if dsn <= self._intent_dsn:
            return
        self._intent_dsn = dsn
        self._kick_truncation()

    async def truncation_settled(self) -> int:
        """Wait until truncation has gone as far as it can for the current intent (including
        writing a safe marker if one is needed); return the backend's truncated LSN."""
        while self._state in (_State.WRITABLE, _State.CLOSING):
            await self.wait_idle()
            pipeline, planner = self._pipeline, self._planner
            assert pipeline is not None
            assert planner is not None
            intent = min(self._intent_dsn, pipeline.committed_dsn)
            plan = planner.plan(intent, pipeline.horizon_lsn())
            if plan is None or isinstance(plan, TruncateAt) or pipeline.records_in_flight == 0:
                break  # done, or the last attempt failed (see last_truncate_error)
            self._returned.clear()
            await self._returned.wait()
        return self._truncated_lsn

    def _kick_truncation(self) -> None:
        if self._state is not _State.WRITABLE or self._truncate_kicked:
            return
        self._truncate_kicked = True
        self._activity.begin()
        self._truncate_event.set()

    async def _truncation_loop(self) -> None:
        while True:
            await self._truncate_event.wait()
            self._truncate_event.clear()
            self._truncate_kicked = False
            try:
                await self._truncate_passes()
            finally:
                self._activity.end()

    async def _truncate_passes(self) -> None:
        """Plan and truncate until nothing more can be done now. A plan costs O(records since
        the last truncation), so it runs when the intent moves, and again on record returns
        only while the last pass waited for one (coverage, or the horizon)."""
        self._truncate_retry_on_return = False
        for _ in range(_TRUNCATE_PASSES_MAX):
            if self._state is not _State.WRITABLE:
                return
            pipeline, planner = self._pipeline, self._planner
            assert pipeline is not None
            assert planner is not None
            intent = min(self._intent_dsn, pipeline.committed_dsn)
            horizon = pipeline.horizon_lsn()
            plan = planner.plan(intent, horizon)
            if plan is None:
                # Blocked by an in-flight record, or by the committed watermark: retry as
                # records return. Otherwise wait for the next intent.
                self._truncate_retry_on_return = intent < self._intent_dsn or (
                    horizon is not None and planner.walk(intent) != planner.walk(intent, horizon)
                )
                return
            if isinstance(plan, NeedCoverage):
                if not pipeline.coverage_pending:
                    pipeline.request_coverage()
                    self._schedule_pump()
                self._truncate_retry_on_return = True  # the coverage record's return
                return
            done_lsn = await self._truncate_backend(plan.lsn)
            if done_lsn is None:
                return
            planner.on_truncated(done_lsn)
            self._truncated_lsn = max(self._truncated_lsn, done_lsn)

    async def _truncate_backend(self, lsn: int) -> int | None:
        self._truncate_calls += 1
        try:
            await self._backend.truncate(lsn)
        except AlreadyTruncated as exc:
            if exc.truncated_lsn >= lsn:
                return exc.truncated_lsn  # done by someone else: success (§4 scenario 15)
            self._note_truncate_error(exc)
            return None
        except BackendError as exc:
            # Retried at the next intent or return; appends are unaffected.
            self._note_truncate_error(exc)
            return None
        return lsn

    def _note_truncate_error(self, exc: BaseException) -> None:
        self._truncate_errors += 1
        self.last_truncate_error = exc

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> Coroutine[Any, Any, None]:
        """Refuse new appends from this call on; the returned coroutine waits for every
        accepted append to complete, then stops background work. Use `await driver.close()`.
        The backend stays open (its owner closes it)."""
        if self._state is _State.WRITABLE:
            self._state = _State.CLOSING
        return self._close()

    async def _close(self) -> None:
        if self._state is _State.CLOSED:
            return
        pipeline = self._pipeline
        while self._state is _State.CLOSING and pipeline is not None and not pipeline.idle():
            self._drained.clear()
            await self._drained.wait()
        await self._stop()

    async def abort(self) -> None:
        """Stop at once, as a crash would: in-flight appends are abandoned (the backend may
        or may not complete them) and every waiting future fails with `DriverClosed`."""
        await self._stop()

    async def _stop(self) -> None:
        self._state = _State.CLOSED
        orphans = self._pipeline.fail() if self._pipeline is not None else []
        direct: list[Completion] = []
        for ticket in orphans:
            if not ticket.done():
                ticket.set_exception(DriverClosed("driver closed"))
                if type(ticket) is Completion:
                    direct.append(ticket)
        self._wake_all()
        self._fire(direct, now=True)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._activity.reset()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            # A bug (an assert) in background work: fail loudly rather than hang.
            self._fail(exc)


def _drain(replayer: Replayer, handle: ReplayHandle, *, at_end: bool) -> Finished | None:
    """Hand every resolvable record to the engine; None when more records are needed."""
    while True:
        step = replayer.step(at_end=at_end)
        if isinstance(step, Wait):
            return None
        if isinstance(step, Finished):
            return step
        assert isinstance(step, Apply)
        decisions: list[ReplayDecision] = []
        for index, entry in enumerate(step.entries):
            decision = handle(step.start_dsn + index, entry)
            if not isinstance(decision, ReplayDecision):
                raise TypeError(f"replay handle returned {decision!r}, not a ReplayDecision")
            decisions.append(decision)
        replayer.decided(decisions)


async def _as_none(awaitable: Awaitable[object]) -> None:
    await awaitable


def open_driver(
    backend: LogBackend,
    *,
    window: int = limits.WINDOW_RECORDS_DEFAULT,
    read_batch_bytes: int = limits.READ_BATCH_BYTES_DEFAULT,
    record_entries_max: int = limits.RECORD_ENTRIES_MAX,
    record_bytes_max: int = limits.RECORD_BYTES_MAX,
    intake_entries_max: int = limits.INTAKE_ENTRIES_MAX,
    tail_poll_delay_ms_min: int = limits.TAIL_POLL_DELAY_MS_MIN,
    tail_poll_delay_ms_max: int = limits.TAIL_POLL_DELAY_MS_MAX,
    sleep: Sleep = asyncio.sleep,
) -> Driver:
    """A new driver over `backend`; call `replay` before anything else.

    `window` is in records (not entries). Refuses to run under `python -O`: the invariant
    checks are asserts and must stay on (shared/STYLE.md)."""
    if not __debug__:
        raise RuntimeError("tae_driver refuses to run with assertions disabled (python -O)")
    config = DriverConfig(
        window_records=window,
        read_batch_bytes=read_batch_bytes,
        record_entries_max=record_entries_max,
        record_bytes_max=record_bytes_max,
        intake_entries_max=intake_entries_max,
        tail_poll_delay_ms_min=tail_poll_delay_ms_min,
        tail_poll_delay_ms_max=tail_poll_delay_ms_max,
    )
    return Driver(backend, config, sleep=sleep)
