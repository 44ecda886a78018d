"""`SegmentSet`: where the entries of a shard store are, in memory: its segments (offsets and
term runs of each, and their open files), the recent-entry cache, and the placement of an
appended entry (a new segment by size or on `roll`). Guarded by the store's `_mu`; the files
are opened and closed here, written by `segment_writer`."""

from __future__ import annotations

import array
import bisect
import contextlib
import os

from logsvc.store import records
from logsvc.store.fs import WritableFile
from logsvc.store.records import Entry
from logsvc.store.recovery import RecoveryReport, segment_file_name
from logsvc.store.segment import Segment
from logsvc.store.store_state import StoreState


class SegmentSet(StoreState):
    """The segments and the recent-entry cache, in memory (see the module docstring)."""

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

    def _writable(self, segment: Segment) -> WritableFile:
        if segment.file is None:
            segment.file = self._fs.open_write(segment.path, create=False)
        return segment.file

    def _close_file(self, segment: Segment) -> None:
        if segment.file is not None:
            handle, segment.file = segment.file, None
            with contextlib.suppress(OSError):
                handle.close()
