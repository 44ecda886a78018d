"""`SegmentReader`: a shard store's reads: `[lo, hi)` from the recent-entry cache or from
the segment files through their offset index, each record checked again, and a read that
races a suffix truncation retried."""

from __future__ import annotations

from dataclasses import dataclass

from logsvc.store import records
from logsvc.store.errors import Compacted, Corruption, io_error
from logsvc.store.records import Entry
from logsvc.store.segment_set import SegmentSet

# A read that races with a suffix truncation is retried this many times before giving up.
READ_RETRIES_MAX = 3


class SegmentReader(SegmentSet):
    """Reads entries from the cache or the segment files (see the module docstring)."""

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


@dataclass(frozen=True, slots=True)
class _DiskRead:
    path: str
    lo: int
    count: int
    offset_bytes: int
    size_bytes: int
