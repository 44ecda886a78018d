"""`SegmentWriter`: the I/O of a shard store's segment files: a write-out (buffer to the OS
and, with a sync, an fdatasync that the durable index waits for), the durability order of a
segment roll, zero-ahead space, and the deletion of segments below the log start."""

from __future__ import annotations

import contextlib
import logging
import time

from logsvc.failpoints import failpoint
from logsvc.store.errors import StoreError, io_error
from logsvc.store.fs import WritableFile
from logsvc.store.segment import Segment
from logsvc.store.segment_set import SegmentSet

log = logging.getLogger("logsvc.store")


class SegmentWriter(SegmentSet):
    """Writes, syncs and deletes segment files (see the module docstring)."""

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


def _has_zero_tail(segment: Segment) -> bool:
    """Whether the segment's open file may have zero-ahead space after its records (also
    true while a write-out has written more than `written_bytes` says: the callers then
    look at the file itself, or keep it open one write-out longer). A file is never closed
    with zeros after its records but by `abandon`, so a reopened file ends at its records."""
    handle = segment.file
    return handle is not None and handle.allocated_bytes() > segment.written_bytes
