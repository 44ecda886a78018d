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

With a node journal (`open(..., journal=)`, journal.py, docs/decisions/0011; the store sees
it only through the Protocols of journal_port.py, as the journal opens stores): appends, vote
saves and suffix truncations are also handed to the node's shared journal, and durability
(`wait_durable`, `sync`, `save_vote`) means "the journal's fdatasync covering it returned";
the segment files and `meta` become the checkpoint, written lazily and fdatasynced by
`checkpoint()` (the journal's checkpointer, or `close()`). The segment records' durable-index
hints then count only what the segment files themselves hold durably, so the torn-tail rule
of a segment stays true. No syncer thread runs in this mode.

The class is assembled from parts by noun, each a mixin over `store_state.StoreState` (the
state they share, set by its `__init__`; `_check_writable`, `_fail`):

- here: opening, appends, durability waits, votes, the public reads of state, closing;
- `segment_set.SegmentSet`: the segments and the recent-entry cache in memory, placement;
- `segment_writer.SegmentWriter`: write-outs, syncs, roll order, zero-ahead, deletions;
- `segment_reader.SegmentReader`: `read` from the cache or the segment files;
- `truncation.Truncation`: `truncate_suffix`, `truncate_prefix`;
- `syncer.Syncer`: the syncer thread (or its work inline);
- `journal_mode.JournalMode`: the node journal's client side and checkpoints.

Threads: any number of threads may call any method. Locks, always taken in this order:
`_io_lock` (serializes file mutations) -> `_meta_lock` -> `_mu` (in-memory state; never held
during I/O).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from logsvc.failpoints import failpoint
from logsvc.store.errors import (
    Compacted,
    EntryTruncated,
    RecordTooLarge,
    StoreClosed,
    StoreError,
    StoreFailed,
    StoreLocked,
    SyncTimeout,
    io_error,
)
from logsvc.store.fs import FileSystem, OsFileSystem
from logsvc.store.journal_mode import JournalMode
from logsvc.store.journal_port import JournalLinkPort, NodeJournalPort
from logsvc.store.limits import DEFAULT_LIMITS, StoreLimits
from logsvc.store.meta import save_meta
from logsvc.store.records import Entry
from logsvc.store.recovery import RecoveryReport, recover
from logsvc.store.segment_reader import SegmentReader
from logsvc.store.syncer import Syncer
from logsvc.store.truncation import Truncation

log = logging.getLogger("logsvc.store")

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


class ShardStore(Truncation, JournalMode, Syncer, SegmentReader):
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
        journal: NodeJournalPort | None = None,
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

    def _attach(self, journal: NodeJournalPort) -> None:
        link: JournalLinkPort
        link, ops = journal.attach(self._dir, self)
        try:
            if ops:  # an abandoned attachment of this directory journaled them
                journal.replay_into(self, ops, self._dir)
                journal.forget_abandoned(self._dir)
        except BaseException:
            link.detach(checkpointed=False)
            raise
        self._link = link  # from here on appends, votes and truncations are journaled


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0
