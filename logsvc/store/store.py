"""The shard store: a directory of segment files that is the Raft journal of one replica.

What it promises (ARCHITECTURE.md §3):

* `append()` puts entries (dense Raft indexes, non-decreasing terms) in a write buffer and
  returns at once. Nothing is durable yet.
* `wait_durable(index)` returns once every entry up to `index` was made durable by an
  fdatasync that *returned*; `sync()` does the same for everything appended so far and asks
  for it now. One background thread, the syncer, runs the syncs; one fdatasync covers every
  entry appended since the previous one (group commit, `group_commit.py`).
* `read(lo, hi, max_bytes)` serves `[lo, hi)` from the recent-entry cache or from disk
  through a per-segment offset index (4 bytes per entry; no payload is held in memory
  except in the bounded cache and write buffer). Bytes read from disk are checked again.
* `truncate_suffix(index)` removes `[index, ...)` durably before it returns (Raft conflict
  resolution; rare). `truncate_prefix(index)` durably moves the log start; the segment
  files wholly below it are deleted later by the syncer thread.
* `save_vote(term, voted_for)` is durable before it returns.
* Any failed write or sync poisons the store (`StoreFailed`): no later write is
  acknowledged, reads keep working, and reopening recovers from what is really on disk.

Order of durability for a segment roll: the old segment is fdatasynced before the new file
is created, and the directory is fsynced before any entry in the new file is reported
durable. So a sealed segment is always whole, and only the newest can have a torn tail.

With a node journal (`open(..., journal=)`, journal.py, docs/decisions/0011): appends, vote
saves and suffix truncations are also handed to the node's shared journal, and durability
(`wait_durable`, `sync`, `save_vote`) means "the journal's fdatasync covering it returned";
the segment files and `meta` become the checkpoint, written lazily and fdatasynced by
`checkpoint()` (the journal's checkpointer, or `close()`). The segment records' durable-index
hints then count only what the segment files themselves hold durably, so the torn-tail rule
of a segment stays true. No syncer thread runs in this mode.

Threads: any number of threads may call any method. Locks, always taken in this order:
`_io_lock` (serializes file mutations) -> `_meta_lock` -> `_mu` (in-memory state; never held
during I/O).
"""

from __future__ import annotations

import array
import bisect
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from logsvc.failpoints import failpoint
from logsvc.store import records
from logsvc.store.errors import (
    Compacted,
    Corruption,
    EntryTruncated,
    JournalSyncTimeout,
    RecordTooLarge,
    StoreClosed,
    StoreError,
    StoreFailed,
    StoreLocked,
    SyncTimeout,
    io_error,
)
from logsvc.store.fs import DirLock, FileSystem, OsFileSystem, WritableFile
from logsvc.store.group_commit import GroupCommitPolicy, SyncNow, WaitUntil
from logsvc.store.limits import DEFAULT_LIMITS, StoreLimits
from logsvc.store.meta import Meta, save_meta
from logsvc.store.records import Entry
from logsvc.store.recovery import RecoveryReport, recover, segment_file_name
from logsvc.store.segment import Segment
from logsvc.store.waiters import Waiters

if TYPE_CHECKING:  # journal.py imports this module; the store only holds what it is given
    from logsvc.store.journal import JournalLink, NodeJournal

log = logging.getLogger("logsvc.store")

# A read that races with a suffix truncation is retried this many times before giving up.
READ_RETRIES_MAX = 3
# How long close() waits for the syncer thread to stop.
SYNCER_JOIN_S_MAX = 30.0


@dataclass(frozen=True, slots=True)
class StoreStats:
    first_index: int
    last_index: int
    durable_index: int
    segments: int
    obsolete_segments: int  # below the log start, not yet deleted
    physical_first_index: int  # lowest index still in a file on disk
    cache_entries: int
    cache_bytes: int
    buffered_bytes: int  # appended, not yet written to the OS
    syncs: int
    fdatasyncs: int
    synced_bytes: int
    sync_seconds_total: float
    failed: bool
    recovery: RecoveryReport


class ShardStore:
    """See the module docstring. Create with `ShardStore.open(dir_path)`."""

    @classmethod
    def open(
        cls,
        dir_path: str,
        *,
        fs: FileSystem | None = None,
        limits: StoreLimits = DEFAULT_LIMITS,
        clock_ms: Callable[[], float] | None = None,
        background_sync: bool = True,
        journal: NodeJournal | None = None,
    ) -> ShardStore:
        """`background_sync=False` starts no syncer thread: syncs (and the deletion of
        segments below the log start) then happen only inside `sync()` / `wait_durable()`,
        on the caller's thread. For the deterministic simulator (tests/chaos/dst/), which
        runs every replica in one thread; the Raft tick syncs the store once per tick."""
        limits.validate()
        fs = fs if fs is not None else OsFileSystem()
        try:
            fs.makedirs(dir_path)
        except OSError as exc:
            raise io_error(exc, "mkdir", dir_path) from exc
        try:
            lock = fs.lock_dir(dir_path)
        except BlockingIOError:
            raise StoreLocked(dir_path) from None
        except OSError as exc:
            raise io_error(exc, "lock", dir_path) from exc
        try:
            recovered = recover(fs, dir_path, limits)
            store = cls(dir_path, fs, limits, clock_ms or _monotonic_ms, recovered.meta)
            store._adopt(recovered.segments, recovered.report)
        except BaseException:
            lock.release()
            raise
        store._lock = lock
        if journal is not None:
            store._background_sync = False  # the journal makes appends durable
            try:
                store._attach(journal)
            except BaseException:
                store.abandon()
                raise
        elif background_sync:
            store._start_syncer()
        else:
            store._background_sync = False
        return store

    def __init__(
        self,
        dir_path: str,
        fs: FileSystem,
        limits: StoreLimits,
        clock_ms: Callable[[], float],
        meta: Meta,
    ) -> None:
        self._dir = dir_path
        self._fs = fs
        self._limits = limits
        self._clock_ms = clock_ms
        self._io_lock = threading.Lock()
        self._meta_lock = threading.Lock()
        self._mu = threading.Lock()
        self._waiters = Waiters()
        self._listeners: list[Callable[[int, StoreFailed | None], None]] = []
        self._syncer_cv = threading.Condition(self._mu)
        self._meta = meta
        self._segments: list[Segment] = []
        self._obsolete: list[Segment] = []
        self._first_index = meta.first_index
        self._last_index = meta.first_index - 1
        self._written_index = self._last_index
        self._durable_index = self._last_index
        self._buffered_bytes = 0
        self._roll_requested = False
        self._cache: dict[int, Entry] = {}
        self._cache_lo = self._first_index
        self._cache_bytes = 0
        self._policy = GroupCommitPolicy(
            bytes_max=limits.group_commit_bytes_max,
            delay_ms_max=limits.group_commit_delay_ms_max,
        )
        self._suffix_generation = 0
        self._failed: StoreFailed | None = None
        self._closing = False
        self._closed = False
        self._syncer: threading.Thread | None = None
        self._background_sync = True  # False: syncs run inline in sync()/wait_durable()
        self._lock: DirLock | None = None
        self._dir_dirty = False  # a segment was created; the directory needs an fsync
        self._recovery = RecoveryReport()
        self._syncs = 0
        self._fdatasyncs = 0
        self._synced_bytes = 0
        self._sync_seconds_total = 0.0
        # Journal mode (docs/decisions/0011): the link, and (journal position, last index)
        # of each append not yet known durable, oldest first.
        self._link: JournalLink | None = None
        self._journal_marks: deque[tuple[int, int]] = deque()
        self._journal_position_last = 0  # of this store's latest journaled operation
        self._segment_durable_index = self._last_index  # durable in the segment files
        self._meta_saved = meta  # what the `meta` file holds

    # ----------------------------------------------------------------- public: writes

    def append(self, entries: Sequence[Entry]) -> int:
        """Buffer entries that continue the log; return the new last index. Not durable
        until `wait_durable`/`sync` says so."""
        payload_max = self._limits.record_payload_bytes_max
        for entry in entries:
            if len(entry.payload) > payload_max:
                raise RecordTooLarge(len(entry.payload), payload_max)
        with self._mu:
            self._check_writable()
            now_ms = self._clock_ms()
            for entry in entries:
                self._append_locked(entry, now_ms)
            if entries:
                self._syncer_cv.notify()
                if self._link is not None:
                    position = self._link.submit_entries(list(entries))
                    self._journal_marks.append((position, entries[-1].index))
                    self._journal_position_last = position
            flush = self._buffered_bytes > self._limits.write_buffer_bytes_max
            last = self._last_index
        if self._link is not None and entries:
            self._link.after_submit()
        if flush:
            # Back-pressure: the appending thread writes the buffer out itself (no fsync),
            # so the buffer stays bounded however fast entries arrive.
            with self._io_lock:
                self._write_out_locked(sync=False)
        return last

    def wait_durable(self, index: int, timeout_ms: int | None = None) -> None:
        """Block until every entry up to `index` is durable (group commit)."""
        waited_ms_max = self._limits.sync_wait_ms_max if timeout_ms is None else timeout_ms
        if self._link is not None:
            self._wait_journal(index, waited_ms_max)
            self._link.after_wait()
        elif not self._background_sync:
            self._sync_inline()
        started_ms = self._clock_ms()
        while True:
            with self._mu:
                if self._durable_index >= index:
                    return
                if self._failed is not None:
                    raise self._failed
                if self._closed:
                    raise StoreClosed()
                if index > self._last_index:
                    raise EntryTruncated(index, self._last_index)
                remaining_ms = started_ms + waited_ms_max - self._clock_ms()
                if remaining_ms <= 0:
                    raise SyncTimeout(index, waited_ms_max)
                gate = self._waiters.add(index)
            gate.acquire(timeout=remaining_ms / 1000.0)

    def sync(self, timeout_ms: int | None = None) -> int:
        """Make everything appended so far durable now; return the durable index."""
        target = self.request_sync()
        self.wait_durable(target, timeout_ms)
        return target

    def request_sync(self) -> int:
        """Ask for a sync of everything appended so far without waiting for it (callers on
        an event loop wait with `aio.AsyncDurability`); return the index it will cover.
        Without a syncer thread (`background_sync=False`, or a journal) the sync happens
        here and now."""
        if self._link is not None:
            target = self.last_index
            self.wait_durable(target)
            return target
        if not self._background_sync:
            return self._sync_inline()
        with self._mu:
            target = self._last_index
            if self._durable_index < target:
                self._check_writable()
                self._policy.request_urgent()
                self._syncer_cv.notify()
            return target

    def truncate_suffix(self, index: int) -> None:
        """Remove every entry at or after `index`, durably, before returning."""
        with self._io_lock:
            with self._mu:
                self._check_writable()
                assert index >= self._first_index, "cannot cut into the truncated prefix"
                if index > self._last_index:
                    return
                position = None if self._link is None else self._link.submit_truncate(index)
                if position is not None:
                    self._journal_position_last = position
            if position is not None and self._link is not None:
                # Journaled first: a crash after the cut below replays it (decision 0011).
                try:
                    self._link.sync_upto(position)
                except StoreError as exc:
                    raise self._fail(exc) from exc
            self._write_out_locked(sync=True)
            with self._mu:
                victims = [s for s in self._segments if s.first_index >= index]
                keep = [s for s in self._segments if s.first_index < index]
                tail = keep[-1] if keep and keep[-1].last_index >= index else None
                last_before = self._last_index
            try:
                # Newest first, each deletion durable before the next: whatever a crash
                # leaves is a gap-free log.
                for segment in reversed(victims):
                    self._close_file(segment)
                    self._fs.unlink(segment.path)
                    self._fs.fsync_dir(self._dir)
                if tail is not None:
                    handle = self._writable(tail)
                    handle.truncate(tail.offsets[index - tail.first_index])
                    handle.fdatasync()
            except OSError as exc:
                raise self._fail(io_error(exc, "truncate_suffix", self._dir)) from exc
            with self._mu:
                # The Raft layer appends and truncates from one thread; an append racing a
                # truncation would be a bug there, not an operating condition.
                assert self._last_index == last_before, "append raced with truncate_suffix"
                self._segments = keep
                if tail is not None:
                    new_size = tail.cut(index)
                    tail.written_bytes = tail.synced_bytes = new_size
                for dropped in range(max(index, self._cache_lo), self._last_index + 1):
                    self._cache_bytes -= len(self._cache.pop(dropped).payload)
                self._cache_lo = min(self._cache_lo, index)
                self._last_index = self._written_index = self._durable_index = index - 1
                self._segment_durable_index = index - 1
                self._journal_marks.clear()  # everything before the cut is durable
                self._suffix_generation += 1
                self._waiters.release_all()
        log.info("truncated suffix of %s from index %d", self._dir, index)

    def truncate_prefix(self, index: int) -> int:
        """Make `index` the durable log start (no-op if not above it); return the start.
        Whole segments below it are deleted later, asynchronously. `index` may be past the
        end: the log is then empty and the next append must be `index`."""
        with self._io_lock:
            with self._mu:
                self._check_writable()
                if index <= self._first_index:
                    return self._first_index
            # The log start must never pass entries that could still vanish.
            self._write_out_locked(sync=True)
            with self._meta_lock:
                meta = dataclasses.replace(self._meta, first_index=index)
                failpoint("store_truncate_prefix_before_meta")
                try:
                    save_meta(self._fs, self._dir, meta)
                except StoreError as exc:
                    raise self._fail(exc) from exc
                self._meta = self._meta_saved = meta
                failpoint("store_truncate_prefix_after_meta")
            with self._mu:
                self._apply_prefix_locked(index)
                self._syncer_cv.notify()
        return index

    def roll(self) -> None:
        """Start a new segment at the next append (a new segment also starts by size)."""
        with self._mu:
            self._roll_requested = True

    def save_vote(self, term: int, voted_for: str | None) -> None:
        """Persist Raft's currentTerm and votedFor; durable on return."""
        with self._meta_lock:
            current = self._meta
            assert term >= current.term, "term must never go backwards"
            assert term > current.term or current.voted_for in (None, voted_for), (
                "at most one vote per term"
            )
            with self._mu:
                self._check_writable()
            meta = dataclasses.replace(current, term=term, voted_for=voted_for)
            failpoint("meta_before_save")
            try:
                if self._link is not None:
                    # Durable in the journal; `meta` gets it at the next checkpoint.
                    with self._mu:
                        position = self._link.submit_vote(term, voted_for)
                        self._journal_position_last = position
                    self._link.sync_upto(position)
                else:
                    save_meta(self._fs, self._dir, meta)
                    self._meta_saved = meta
            except StoreError as exc:
                raise self._fail(exc) from exc
            self._meta = meta
            failpoint("meta_after_save")

    # ----------------------------------------------------------------- public: reads

    @property
    def first_index(self) -> int:
        with self._mu:
            return self._first_index

    @property
    def last_index(self) -> int:
        with self._mu:
            return self._last_index

    @property
    def durable_index(self) -> int:
        with self._mu:
            return self._durable_index

    @property
    def shares_journal(self) -> bool:
        """Whether this store writes through the node journal (decision 0011): then one
        journal sync makes every linked store's appends so far durable at once."""
        return self._link is not None

    @property
    def sync_needed(self) -> bool:
        """Whether `sync()` has anything to do: entries appended and not yet durable, or
        segments below the log start still to delete."""
        with self._mu:
            return self._durable_index < self._last_index or bool(self._obsolete)

    @property
    def term(self) -> int:
        return self._meta.term

    @property
    def voted_for(self) -> str | None:
        return self._meta.voted_for

    def term_at(self, index: int) -> int:
        with self._mu:
            if index < self._first_index:
                raise Compacted(index, self._first_index)
            assert index <= self._last_index, f"no entry {index}"
            return self._segment_of(index).term_at(index)

    def read(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries in `[lo, hi)`, in order, whose payloads total at most `max_bytes`, but
        always at least one if `lo` exists. Stops at the end of the log."""
        assert lo >= 1
        assert hi >= lo
        result: list[Entry] = []
        budget = max_bytes
        retries = 0
        while lo < hi:
            with self._mu:
                if lo < self._first_index:
                    raise Compacted(lo, self._first_index)
                end = min(hi, self._last_index + 1)
                if lo >= end:
                    break
                if lo >= self._cache_lo:
                    self._read_cache_locked(lo, end, budget, result)
                    break
                plan = self._plan_disk_read_locked(lo, min(end, self._cache_lo), budget, result)
                if plan.count == 0:
                    break  # the budget is spent
                generation = self._suffix_generation
            got = self._read_disk(plan)
            if isinstance(got, tuple):
                retries += 1
                with self._mu:
                    if lo < self._first_index:
                        raise Compacted(lo, self._first_index)
                    raced = generation != self._suffix_generation
                if raced and retries <= READ_RETRIES_MAX:
                    continue
                offset, reason = got
                raise Corruption(plan.path, offset, reason)
            result.extend(got)
            budget -= sum(len(entry.payload) for entry in got)
            lo = got[-1].index + 1
        return result

    def add_durable_listener(self, listener: Callable[[int, StoreFailed | None], None]) -> None:
        """Call `listener(durable_index, failure)` from the syncer thread after every sync
        and once when the store fails. It must be quick and must not call back into the
        store: it is the hand-off to another thread or an event loop (see `aio.py`)."""
        with self._mu:
            self._listeners.append(listener)
            durable, failed = self._durable_index, self._failed
        listener(durable, failed)

    def stats(self) -> StoreStats:
        with self._mu:
            physical = (
                self._obsolete[0].first_index
                if self._obsolete
                else (self._segments[0].first_index if self._segments else self._first_index)
            )
            return StoreStats(
                first_index=self._first_index,
                last_index=self._last_index,
                durable_index=self._durable_index,
                segments=len(self._segments),
                obsolete_segments=len(self._obsolete),
                physical_first_index=physical,
                cache_entries=len(self._cache),
                cache_bytes=self._cache_bytes,
                buffered_bytes=self._buffered_bytes,
                syncs=self._syncs,
                fdatasyncs=self._fdatasyncs,
                synced_bytes=self._synced_bytes,
                sync_seconds_total=self._sync_seconds_total,
                failed=self._failed is not None,
                recovery=self._recovery,
            )

    def close(self) -> None:
        """Sync what was appended (unless failed), stop the syncer, close every file."""
        self._shut_down(flush=True)

    def abandon(self) -> None:
        """Stop without writing or syncing anything more: the state a kill -9 leaves behind.
        An in-flight sync may finish (it would have, had the process died a moment later);
        nothing is started. For crash paths and crash tests; `close()` is the clean stop."""
        self._shut_down(flush=False)

    def _shut_down(self, *, flush: bool) -> None:
        with self._mu:
            if self._closed or self._closing:
                return
            self._closing = True
            self._syncer_cv.notify_all()
        if self._syncer is not None:
            self._syncer.join(SYNCER_JOIN_S_MAX)
        if self._link is not None:
            link, checkpointed = self._link, False
            if flush and self._failed is None:
                try:
                    self._checkpoint_now()
                    checkpointed = True
                except StoreError as exc:
                    log.error("final checkpoint of %s failed: %s", self._dir, exc)
            link.detach(checkpointed=checkpointed)
        with self._io_lock:
            if flush and self._failed is None:
                try:
                    self._write_out_locked(sync=True)
                    self._delete_obsolete_locked()
                    self._trim_zero_tail()
                except StoreError as exc:
                    log.error("final sync of %s failed: %s", self._dir, exc)
                except OSError as exc:
                    log.error("cutting the zero-ahead space of %s failed: %s", self._dir, exc)
            with self._mu:
                for segment in self._segments + self._obsolete:
                    self._close_file(segment)
                self._closed = True
                self._waiters.release_all()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> ShardStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- journal mode

    def _attach(self, journal: NodeJournal) -> None:
        link: JournalLink
        link, ops = journal.attach(self._dir, self)
        try:
            if ops:  # an abandoned attachment of this directory journaled them
                journal.replay_into(self, ops, self._dir)
                journal.forget_abandoned(self._dir)
        except BaseException:
            link.detach(checkpointed=False)
            raise
        self._link = link  # from here on appends, votes and truncations are journaled

    def checkpoint(self) -> None:
        """Journal mode: make everything this store journaled durable in its own files
        (segments fdatasynced, `meta` saved), then tell the journal, which may then delete
        the journal files that held it (decision 0011). Called by the journal's checkpointer."""
        try:
            self._checkpoint_now()
        except StoreClosed:
            return  # closed meanwhile: close() checkpointed

    def _checkpoint_now(self) -> None:
        link = self._link
        assert link is not None, "checkpoint() is for a store opened with a journal"
        with self._io_lock:
            if self._closed:
                raise StoreClosed()
            with self._meta_lock:
                # Read under _meta_lock, whose holders submit votes, and before the buffer
                # is taken: every operation counted here is in what is written below.
                op_seq = link.current_op_seq()
                meta = self._meta
                self._write_out_locked(sync=True)
                if meta != self._meta_saved:
                    try:
                        save_meta(self._fs, self._dir, meta)
                    except StoreError as exc:
                        raise self._fail(exc) from exc
                    self._meta_saved = meta
            self._delete_obsolete_locked()
        link.checkpointed(op_seq)

    def _wait_journal(self, index: int, waited_ms_max: int) -> None:
        link = self._link
        assert link is not None
        with self._mu:
            if self._durable_index >= index or self._failed is not None or self._closed:
                return  # the caller's loop reports it
            if index > self._last_index:
                return
            position = next((p for p, last in self._journal_marks if last >= index), None)
        assert position is not None, f"entry {index} is neither durable nor journaled"
        try:
            link.sync_upto(position, waited_ms_max)
        except JournalSyncTimeout:
            raise SyncTimeout(index, waited_ms_max) from None
        except StoreFailed:
            pass  # _journal_failed failed this store too; the caller's loop raises it
        except StoreError as exc:
            raise self._fail(exc) from exc

    def _journal_durable(self, position: int) -> None:
        """The journal's fdatasync covering `position` returned (any thread)."""
        with self._mu:
            marks = self._journal_marks
            durable = self._durable_index
            while marks and marks[0][0] <= position:
                durable = max(durable, marks.popleft()[1])
            if durable == self._durable_index:
                return
            self._durable_index = durable
            self._waiters.release_upto(durable)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(durable, None)

    def _journal_failed(self, error: StoreError) -> None:
        self._fail(error)

    # ----------------------------------------------------------------- internals: state

    def _adopt(self, scans: list[tuple[str, records.SegmentScan]], report: RecoveryReport) -> None:
        self._recovery = report
        for path, scan in scans:
            size = scan.end_bytes
            segment = Segment(
                first_index=scan.first_index,
                path=path,
                offsets=scan.offsets,
                term_runs=scan.term_runs,
                size_bytes=size,
                written_bytes=size,
                synced_bytes=size,
                pending=bytearray(),
                on_disk=True,
            )
            self._segments.append(segment)
        if self._segments:
            last = self._segments[-1].last_index
            self._last_index = self._written_index = self._durable_index = last
            self._segment_durable_index = last
            self._cache_lo = last + 1

    def _check_writable(self) -> None:
        if self._closed or self._closing:
            raise StoreClosed()
        if self._failed is not None:
            raise self._failed

    def _append_locked(self, entry: Entry, now_ms: float) -> None:
        assert entry.index == self._last_index + 1, (
            f"append must continue the log: got {entry.index}, expected {self._last_index + 1}"
        )
        # Every listed segment holds at least one record (an empty one is never kept).
        last_term = self._segments[-1].term_runs[-1][1] if self._segments else 0
        assert entry.term >= last_term, "terms never decrease along a log"
        segment = self._segment_for_append(entry)
        offset = segment.size_bytes
        # The hint counts what the segment files hold durably, not the journal (decision
        # 0011): a lazily written segment tail must still read as torn, not corrupt.
        size = records.encode_record_into(
            segment.pending, entry.index, entry.term, self._segment_durable_index, entry.payload
        )
        segment.offsets.append(offset)
        segment.size_bytes += size
        if not segment.term_runs or segment.term_runs[-1][1] != entry.term:
            segment.term_runs.append((entry.index, entry.term))
        self._last_index = entry.index
        self._buffered_bytes += size
        self._policy.on_append(size, now_ms)
        self._cache[entry.index] = entry
        self._cache_bytes += len(entry.payload)
        self._evict_cache_locked()

    def _segment_for_append(self, entry: Entry) -> Segment:
        record_bytes = records.RECORD_HEADER_BYTES + len(entry.payload)
        if self._segments and not self._roll_requested:
            active = self._segments[-1]
            if active.size_bytes + record_bytes <= self._limits.segment_bytes_max:
                return active
        self._roll_requested = False
        header = records.encode_segment_header(entry.index)
        segment = Segment(
            first_index=entry.index,
            path=os.path.join(self._dir, segment_file_name(entry.index)),
            offsets=array.array("I"),
            term_runs=[],
            size_bytes=len(header),
            written_bytes=0,
            synced_bytes=0,
            pending=bytearray(header),
            on_disk=False,
        )
        self._buffered_bytes += len(header)
        self._segments.append(segment)
        return segment

    def _segment_of(self, index: int) -> Segment:
        position = bisect.bisect_right(self._segments, index, key=lambda s: s.first_index) - 1
        assert position >= 0
        segment = self._segments[position]
        assert segment.first_index <= index <= segment.last_index
        return segment

    def _evict_cache_locked(self) -> None:
        # Entries not yet written to the OS are never evicted: the cache is their only copy
        # a reader can use.
        while self._cache_bytes > self._limits.cache_bytes_max and (
            self._cache_lo <= self._written_index
        ):
            entry = self._cache.pop(self._cache_lo, None)
            if entry is not None:
                self._cache_bytes -= len(entry.payload)
            self._cache_lo += 1

    def _apply_prefix_locked(self, index: int) -> None:
        for dropped in range(self._cache_lo, min(index, self._last_index + 1)):
            entry = self._cache.pop(dropped)
            self._cache_bytes -= len(entry.payload)
        self._cache_lo = max(self._cache_lo, index)
        self._first_index = index
        if index > self._last_index + 1:
            self._last_index = self._written_index = self._durable_index = index - 1
            self._segment_durable_index = index - 1
            self._journal_marks.clear()
        keep: list[Segment] = []
        for segment in self._segments:
            if segment.last_index < index:
                self._close_file(segment)
                self._obsolete.append(segment)
            else:
                keep.append(segment)
        self._segments = keep

    def _fail(self, error: StoreError) -> StoreError:
        with self._mu:
            first = self._failed is None
            if first:
                log.error("store %s failed: %s", self._dir, error)
                self._failed = StoreFailed(error)
            self._waiters.release_all()
            self._syncer_cv.notify_all()
            durable, failed, listeners = self._durable_index, self._failed, list(self._listeners)
        if first:
            for listener in listeners:
                listener(durable, failed)
        return error

    # ----------------------------------------------------------------- internals: I/O

    def _writable(self, segment: Segment) -> WritableFile:
        if segment.file is None:
            segment.file = self._fs.open_write(segment.path, create=False)
        return segment.file

    def _close_file(self, segment: Segment) -> None:
        if segment.file is not None:
            handle, segment.file = segment.file, None
            with contextlib.suppress(OSError):
                handle.close()

    def _write_out_locked(self, *, sync: bool) -> None:
        """Write the buffer to the OS and, with `sync`, make it durable. Holds `_io_lock`."""
        with self._mu:
            if self._failed is not None:
                raise self._failed
            work = [(s, bytes(s.pending)) for s in self._segments if s.pending]
            unsynced = [s for s in self._segments if s.synced_bytes < s.size_bytes]
            if not work and not (sync and unsynced):
                return
            for segment, _ in work:
                segment.pending = bytearray()
            self._buffered_bytes = 0
            target = self._last_index
            if sync:
                self._policy.on_sync_started()
            journal_position = self._journal_position_last
            # Zero-ahead goes only in the newest segment, and not with a node journal (the
            # segments are then its lazily synced checkpoint).
            zero_ahead = self._link is None and self._limits.zero_ahead_bytes_max > 0
            newest = self._segments[-1] if zero_ahead and self._segments else None
        started = time.monotonic()
        try:
            if sync and self._link is not None and journal_position:
                # Never durable in the segments before the journal (decision 0011): a torn
                # journal tail then loses only what no sync ever covered, and replay may cut
                # the segments back to the journal.
                self._link.sync_upto(journal_position)
            fdatasyncs = self._write_chunks(work, unsynced if sync else [], sync, newest)
        except StoreError as exc:
            failure = self._fail(exc)
            with self._mu:
                self._policy.on_sync_finished(self._clock_ms())
            raise failure from exc
        except OSError as exc:
            failure = self._fail(io_error(exc, "write" if not sync else "sync", self._dir))
            with self._mu:
                if sync:
                    self._policy.on_sync_finished(self._clock_ms())
            raise failure from exc
        if sync:
            failpoint("store_after_sync_before_ack")
        elapsed = time.monotonic() - started
        with self._mu:
            for segment, data in work:
                segment.written_bytes += len(data)
                segment.on_disk = True
            self._written_index = max(self._written_index, target)
            if sync:
                for segment in unsynced:
                    segment.synced_bytes = segment.written_bytes
                self._durable_index = max(self._durable_index, target)
                self._segment_durable_index = max(self._segment_durable_index, target)
                marks = self._journal_marks
                while marks and marks[0][1] <= target:
                    marks.popleft()
                self._policy.on_sync_finished(self._clock_ms())
                self._syncs += 1
                self._fdatasyncs += fdatasyncs
                self._synced_bytes += sum(len(data) for _, data in work)
                self._sync_seconds_total += elapsed
                self._waiters.release_upto(self._durable_index)
                self._syncer_cv.notify()
            for segment in self._segments[:-1]:
                # One with zero-ahead space stays open: the roll's write-out cuts it first.
                if segment.synced_bytes == segment.size_bytes and not _has_zero_tail(segment):
                    self._close_file(segment)
            self._evict_cache_locked()
            durable, listeners = self._durable_index, list(self._listeners)
        if sync:
            for listener in listeners:
                listener(durable, None)

    def _write_chunks(
        self,
        work: list[tuple[Segment, bytes]],
        unsynced: list[Segment],
        sync: bool,
        newest: Segment | None,
    ) -> int:
        """The I/O of a write-out, outside `_mu`; returns how many fdatasyncs it did.
        `newest`: the segment to keep zero-ahead space in (None: none)."""
        fdatasyncs = 0
        synced_here: set[int] = set()  # ids of segments whose every written byte is synced
        for segment, data in work:
            if segment.file is None and not segment.on_disk:
                # A later segment may exist on disk only once every earlier one is durable,
                # data and name: then only the newest segment can ever hold a torn tail, and
                # no order in which the file system persists names can open a gap. (Earlier
                # segments' data in `work` was written by the previous iterations.) A sealed
                # segment ends at its last record: its zero-ahead space is cut first.
                for earlier in self._segments_before(segment):
                    if id(earlier) not in synced_here:
                        handle = self._writable(earlier)
                        if handle.allocated_bytes() > handle.size():
                            handle.truncate(handle.size())
                        handle.fdatasync()
                        fdatasyncs += 1
                        synced_here.add(id(earlier))
                if self._dir_dirty:
                    self._fs.fsync_dir(self._dir)
                    self._dir_dirty = False
                segment.file = self._fs.open_write(segment.path, create=True)
                self._dir_dirty = True
            handle = self._writable(segment)
            handle.write(data)
            if segment is newest and handle.allocated_bytes() <= handle.size():
                self._zero_ahead(handle)
        if sync:
            failpoint("store_after_write_before_sync")
            for segment in unsynced:
                if id(segment) not in synced_here:
                    self._writable(segment).fdatasync()
                    fdatasyncs += 1
            if self._dir_dirty:
                failpoint("store_before_roll_dir_sync")
                self._fs.fsync_dir(self._dir)
                self._dir_dirty = False
        return fdatasyncs

    def _zero_ahead(self, handle: WritableFile) -> None:
        """This write grew the newest segment's file, so its sync pays the file system's
        journal commit for the new size anyway: write zeros past it in the same sync, for
        the records that follow to overwrite (FORMAT.md "Zero-ahead"; the syncs that
        cover only overwritten zeros flush data alone). As many zeros as the segment holds,
        within the limits, so a small or idle store's segment carries few."""
        limits = self._limits
        end_bytes = handle.size()
        ahead_bytes = min(limits.zero_ahead_bytes_max, max(limits.zero_ahead_bytes_min, end_bytes))
        upto_bytes = min(limits.segment_bytes_max, end_bytes + ahead_bytes)
        if upto_bytes > end_bytes:
            handle.write_zeros(upto_bytes)

    def _trim_zero_tail(self) -> None:
        """A clean stop leaves the newest segment ending at its last record (holds `_io_lock`;
        a kill leaves the zeros, which recovery cuts)."""
        with self._mu:
            newest = self._segments[-1] if self._segments else None
        handle = None if newest is None else newest.file
        if handle is not None and handle.allocated_bytes() > handle.size():
            handle.truncate(handle.size())
            handle.fdatasync()

    def _segments_before(self, segment: Segment) -> list[Segment]:
        """The segments before `segment` not yet whole on disk: unsynced bytes, or
        zero-ahead space after their records."""
        with self._mu:
            position = self._segments.index(segment)
            return [
                s
                for s in self._segments[:position]
                if s.synced_bytes < s.size_bytes or _has_zero_tail(s)
            ]

    def _delete_obsolete_locked(self) -> None:
        with self._mu:
            doomed = list(self._obsolete)
        if not doomed:
            return
        try:
            for segment in doomed:
                self._close_file(segment)
                with contextlib.suppress(FileNotFoundError):
                    self._fs.unlink(segment.path)
            self._fs.fsync_dir(self._dir)
        except OSError as exc:
            raise self._fail(io_error(exc, "delete segments", self._dir)) from exc
        with self._mu:
            self._obsolete = [s for s in self._obsolete if s not in doomed]
        log.info("deleted %d segment(s) below the log start of %s", len(doomed), self._dir)

    def _read_cache_locked(self, lo: int, end: int, budget: int, out: list[Entry]) -> None:
        for index in range(lo, end):
            entry = self._cache[index]
            if out and len(entry.payload) > budget:
                return
            out.append(entry)
            budget -= len(entry.payload)

    def _plan_disk_read_locked(self, lo: int, end: int, budget: int, out: list[Entry]) -> _DiskRead:
        segment = self._segment_of(lo)
        end = min(end, segment.last_index + 1)
        count = 0
        index = lo
        while index < end:
            size = segment.record_end(index) - segment.offsets[index - segment.first_index]
            payload = size - records.RECORD_HEADER_BYTES
            if (out or count) and payload > budget:
                break
            budget -= payload
            count += 1
            index += 1
        start = segment.offsets[lo - segment.first_index]
        stop = segment.record_end(lo + count - 1)
        return _DiskRead(segment.path, lo, count, start, stop - start)

    def _read_disk(self, plan: _DiskRead) -> list[Entry] | tuple[int, str]:
        try:
            handle = self._fs.open_read(plan.path)
        except FileNotFoundError:
            return plan.offset_bytes, "segment file is missing"
        except OSError as exc:
            raise io_error(exc, "open", plan.path) from exc
        try:
            data = handle.pread(plan.offset_bytes, plan.size_bytes)
        except OSError as exc:
            raise io_error(exc, "read", plan.path) from exc
        finally:
            handle.close()
        return records.read_records(
            data, plan.offset_bytes, plan.lo, plan.count, self._limits.record_payload_bytes_max
        )

    # ----------------------------------------------------------------- internals: syncer

    def _sync_inline(self) -> int:
        """The syncer's work, on the caller's thread (`background_sync=False`): write out
        and sync everything appended so far, delete segments below the log start; return
        the durable index. Nothing to do is not an error, as with the syncer."""
        with self._io_lock:
            with self._mu:
                if self._durable_index >= self._last_index and not self._obsolete:
                    return self._durable_index
                self._check_writable()
            self._write_out_locked(sync=True)
            self._delete_obsolete_locked()
            with self._mu:
                return self._durable_index

    def _start_syncer(self) -> None:
        self._syncer = threading.Thread(
            target=self._run_syncer, name=f"store-syncer:{self._dir}", daemon=True
        )
        self._syncer.start()

    def _run_syncer(self) -> None:
        while True:
            with self._mu:
                while True:
                    if self._closing or self._failed is not None:
                        return
                    action = self._policy.next_action(self._clock_ms())
                    if isinstance(action, SyncNow) or self._obsolete:
                        break
                    timeout_s = (
                        max(0.0, (action.deadline_ms - self._clock_ms()) / 1000.0)
                        if isinstance(action, WaitUntil)
                        else None
                    )
                    self._syncer_cv.wait(timeout_s)
            try:
                with self._io_lock:
                    if isinstance(action, SyncNow):
                        self._write_out_locked(sync=True)
                    self._delete_obsolete_locked()
            except StoreError:
                return  # the store is failed; waiters were told


@dataclass(frozen=True, slots=True)
class _DiskRead:
    path: str
    lo: int
    count: int
    offset_bytes: int
    size_bytes: int


def _has_zero_tail(segment: Segment) -> bool:
    """Whether the segment's open file may have zero-ahead space after its records (also
    true while a write-out has written more than `written_bytes` says: the callers then
    look at the file itself, or keep it open one write-out longer). A file is never closed
    with zeros after its records but by `abandon`, so a reopened file ends at its records."""
    handle = segment.file
    return handle is not None and handle.allocated_bytes() > segment.written_bytes


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0
