"""`Truncation`: the two cuts of a shard store's log, each durable before it returns: a
suffix (Raft conflict resolution: journaled first, then segments deleted newest first and
the tail cut) and a prefix (the log start saved in `meta`; whole segments below it are
deleted later by the syncer)."""

from __future__ import annotations

import dataclasses
import logging

from logsvc.failpoints import failpoint
from logsvc.store.errors import StoreError, io_error
from logsvc.store.meta import save_meta
from logsvc.store.segment_writer import SegmentWriter

log = logging.getLogger("logsvc.store")


class Truncation(SegmentWriter):
    """Suffix and prefix truncation (see the module docstring)."""

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
