"""The engine entries of one unit, many at a time: the driver records gathered into chunks and
their entries decoded by `engine.wal.batch.decode_entries_at` (one-append transactions into
columns, every other entry by `decode_entry`), with the command level's damage rules: a
damaged entry raises `InputCorrupt` (naming its backend record) unless verify is `report`,
which skips it.

No bytes object is made per entry (issue 23): the records come unsplit
(`tae_driver.record.EntriesBody`, every check of `decode` done but the walk of the entries'
size prefixes), a chunk's record payloads are joined into one buffer, and `_walk` finds
every entry's place in it for all the chunk's records at once, one step per entry of the
largest record (at most RECORD_ENTRIES_MAX). A record whose body does not parse is named by
`EntriesBody.split`, so its error is `decode`'s own; its place among the errors is the one
reading record by record gives (a damaged entry of an earlier record is named first).

A clean file segment is read whole (spark_jobs/walread_segments.py: every frame and driver
record header checked at once, no object per record): its chunks are slices of the segment's
bytes, cut where the record-by-record path cuts them, and `_walk` finds the entries in place
(frame and record headers lie between the records). Any other unit (a logsvc journal, verify
`report`) or a segment that path refuses (damage, a torn tail, a skip record, version 1) is
read record by record as before: the same chunks, entries and errors
(tests/unit/spark_jobs/test_segment_records.py).

What replay_as_of (local engine) and the rows and command levels read; the per-entry reader
`walread.txn_entries` remains for the levels that want every entry as an object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

import numpy as np
import numpy.typing as npt

from engine.wal.batch import KIND_DAMAGED, DecodedEntries, decode_entries_at
from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Range
from spark_jobs.inputs import BACKEND_FILE, Unit
from spark_jobs.records import (
    DECODES,
    BackendRecord,
    DriverRecord,
    driver_records,
    record_corrupt,
)
from spark_jobs.segment_buffers import SEGMENT_BUFFERS
from spark_jobs.verify import VERIFY_REPORT
from spark_jobs.walread_segments import SegmentRecords, segment_records
from tae_driver import limits as driver_limits
from tae_driver.errors import CorruptRecord
from tae_driver.record import EntriesBody, EntriesRecord

CHUNK_ENTRIES_MAX = 16384
"""Entries (of the records gathered) decoded per call: enough that numpy's and Arrow's
per-call costs vanish (~1 us per call and column against ~0.1 us per entry), and that the
walk's steps (one per entry of the largest record) cover hundreds of records each."""
CHUNK_BYTES_MAX = 32 * 2**20
"""Record bytes per chunk: with a chunk's decoded columns (about the same again), what one
reader holds at once; a single record is at most 2 MiB (the driver's limit)."""

_HEADER_BYTES = driver_limits.RECORD_HEADER_BYTES
_PREFIX_BYTES = driver_limits.ENTRY_SIZE_PREFIX_BYTES


@dataclass(frozen=True, slots=True)
class EntryChunk:
    """Entries of consecutive driver records, in read order. Damaged entries were raised or
    (verify `report`) are marked KIND_DAMAGED in `decoded.kinds`."""

    decoded: DecodedEntries
    lsns: npt.NDArray[np.int64]
    """Per entry: the LSN of its backend record."""
    records: Sequence[BackendRecord]
    """The chunk's backend records (built one by one when asked, on the segment path)."""
    record_of: npt.NDArray[np.int64]
    """Per entry: its backend record (an index into `records`)."""
    data: bytes
    """The records' payloads joined: entry `i` is `data[starts[i]:ends[i]]`."""
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]

    def record(self, index: int) -> BackendRecord:
        """Entry `index`'s backend record (its segment, offset, LSN and Raft index)."""
        return self.records[int(self.record_of[index])]

    def payload(self, index: int) -> bytes:
        return self.data[int(self.starts[index]) : int(self.ends[index])]

    def offsets_bytes(self, indexes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The backend record offsets of entries `indexes`."""
        per_record = np.fromiter(
            (r.offset_bytes for r in self.records), dtype=np.int64, count=len(self.records)
        )
        found: npt.NDArray[np.int64] = per_record[self.record_of[indexes]]
        return found


class _Pending:
    """The records of the chunk being gathered."""

    __slots__ = ("bodies", "count", "records", "size")

    def __init__(self) -> None:
        self.records: list[BackendRecord] = []
        self.bodies: list[EntriesBody | EntriesRecord] = []
        self.count = 0
        self.size = 0

    def add(self, rec: BackendRecord, body: EntriesBody | EntriesRecord) -> None:
        self.records.append(rec)
        self.bodies.append(body)
        self.count += body.count
        self.size += len(_payload_of(rec))


def _payload_of(rec: BackendRecord) -> bytes:
    assert rec.payload is not None
    return rec.payload


class RecordSink(Protocol):
    """What `entry_chunks` shows the driver records it reads (the replay plan's input)."""

    def add_record(self, found: DriverRecord) -> None:
        """One record, as the per-record path reads it."""

    def add_records(self, found: SegmentRecords) -> None:
        """A segment's records, as the segment path reads them (all ENTRIES records or
        markers, and TRUNCATE frames)."""


def entry_chunks(
    unit: Unit,
    verify: str,
    lsns: Range,
    dsns: Range,
    seen: RecordSink | None = None,
) -> Iterator[EntryChunk]:
    """The entries of `unit` whose record's LSN `lsns` holds and whose DSN `dsns` holds.
    `seen`, when given, is shown every driver record as it is read (before its entries are
    chunked), so a caller can gather what it needs of the records in the same pass: an
    ENTRIES record reaches it unsplit (`EntriesBody`), its body checked when its chunk is.

    A clean file segment is read whole (spark_jobs/walread_segments.py: its frames and
    records checked at once, shown to `seen` at once, its chunks cut from its bytes, no
    object per record); any other unit, or a segment that path does not take, record by
    record, with the same chunks, entries and errors."""
    if unit.backend == BACKEND_FILE and verify != VERIFY_REPORT:
        # The segment's bytes stay in the leased buffer only while its chunks are cut: each
        # chunk copies its own (segment_buffers.py).
        with SEGMENT_BUFFERS.lease(unit.path) as data:
            found = _segment_records(unit, data, verify, lsns)
            if found is not None:
                DECODES.total += len(found)
                if seen is not None:
                    seen.add_records(found)
                yield from _segment_chunks(unit, verify, found, dsns)
                return
    yield from _record_chunks(unit, verify, lsns, dsns, seen)


def _segment_records(
    unit: Unit, data: bytes | memoryview, verify: str, lsns: Range
) -> SegmentRecords | None:
    """The segment path's answer (a seam: the tests make it None to read the same segment
    the per-record way and compare)."""
    return segment_records(unit, data, verify, lsns)


def _segment_chunks(
    unit: Unit, verify: str, found: SegmentRecords, dsns: Range
) -> Iterator[EntryChunk]:
    """The chunks of a segment read whole: the records cut where the per-record path cuts
    them (after the record that brings the chunk to CHUNK_ENTRIES_MAX entries or
    CHUNK_BYTES_MAX bytes), each chunk's bytes one slice of the segment's."""
    sizes = found.payload_ends - found.payload_starts
    count_sums = np.cumsum(found.counts)
    size_sums = np.cumsum(sizes)
    first = 0
    while first < len(found):
        counted = int(count_sums[first - 1]) if first else 0
        sized = int(size_sums[first - 1]) if first else 0
        last = min(
            int(np.searchsorted(count_sums, counted + CHUNK_ENTRIES_MAX, side="left")),
            int(np.searchsorted(size_sums, sized + CHUNK_BYTES_MAX, side="left")),
            len(found) - 1,
        )
        stop = last + 1
        lo, hi = int(found.payload_starts[first]), int(found.payload_ends[last])
        data = bytes(found.data[lo:hi])
        records = _SegmentRecordsView(unit, found, first, stop, data, lo)
        chunk = _decode_chunk(
            unit,
            verify,
            dsns,
            data,
            found.payload_starts[first:stop] - lo,
            found.payload_ends[first:stop] - lo,
            found.counts[first:stop],
            found.start_dsns[first:stop],
            found.lsns[first:stop],
            records,
            records.body,
        )
        if chunk is not None:
            yield chunk
        first = stop


class _SegmentRecordsView(Sequence[BackendRecord]):
    """Records [first, stop) of a segment read whole, as `BackendRecord`s made when asked
    (an error names one; the commands level reads a few), their payloads cut from the
    chunk's own bytes `data` (the segment's from `lo`): a chunk may outlive the buffer its
    segment was read into."""

    __slots__ = ("data", "first", "found", "lo", "stop", "unit")

    def __init__(
        self, unit: Unit, found: SegmentRecords, first: int, stop: int, data: bytes, lo: int
    ) -> None:
        self.unit, self.found, self.first, self.stop = unit, found, first, stop
        self.data, self.lo = data, lo

    def __len__(self) -> int:
        return self.stop - self.first

    @overload
    def __getitem__(self, index: int) -> BackendRecord: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[BackendRecord]: ...
    def __getitem__(self, index: int | slice) -> BackendRecord | Sequence[BackendRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        at = self.first + index % len(self)
        found = self.found
        payload = self.data[
            int(found.payload_starts[at]) - self.lo : int(found.payload_ends[at]) - self.lo
        ]
        return BackendRecord(
            self.unit.segment,
            int(found.offsets_bytes[at]),
            int(found.lsns[at]),
            None,
            payload,
            "record",
        )

    def body(self, index: int) -> EntriesBody:
        """Record `index` unsplit, as the per-record path holds it."""
        at = self.first + index
        found = self.found
        payload = self[index].payload
        assert payload is not None
        return EntriesBody(
            int(found.start_dsns[at]), int(found.safe_dsns[at]), int(found.counts[at]), payload
        )


def _record_chunks(
    unit: Unit,
    verify: str,
    lsns: Range,
    dsns: Range,
    seen: RecordSink | None,
) -> Iterator[EntryChunk]:
    """`entry_chunks` record by record."""
    pending = _Pending()
    records = driver_records(unit, verify, lsns, split=False)
    while True:
        try:
            found = next(records)
        except StopIteration:
            break
        except InputCorrupt:
            # Damage in a later record: an earlier damaged record or entry is named first, as
            # reading entry by entry would.
            if pending.records:
                _chunk(unit, verify, pending, dsns)
            raise
        if seen is not None:
            seen.add_record(found)
        decoded = found.decoded
        if not isinstance(decoded, EntriesBody | EntriesRecord):
            continue
        pending.add(found.rec, decoded)
        if pending.count >= CHUNK_ENTRIES_MAX or pending.size >= CHUNK_BYTES_MAX:
            chunk = _chunk(unit, verify, pending, dsns)
            pending = _Pending()
            if chunk is not None:
                yield chunk
    if pending.records:
        chunk = _chunk(unit, verify, pending, dsns)
        if chunk is not None:
            yield chunk


def _chunk(unit: Unit, verify: str, pending: _Pending, dsns: Range) -> EntryChunk | None:
    """The kept entries of the pending records decoded (None: none kept); raises the first
    damage (verify `true`/`false`): a damaged entry, or a record whose body does not parse."""
    payloads = [_payload_of(rec) for rec in pending.records]
    sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    record_ends = np.cumsum(sizes)
    count = len(payloads)
    return _decode_chunk(
        unit,
        verify,
        dsns,
        b"".join(payloads),
        record_ends - sizes,
        record_ends,
        np.fromiter((b.count for b in pending.bodies), dtype=np.int64, count=count),
        np.fromiter((b.start_dsn for b in pending.bodies), np.int64, count),
        np.fromiter((r.lsn for r in pending.records), np.int64, count),
        pending.records,
        pending.bodies.__getitem__,
    )


def _decode_chunk(
    unit: Unit,
    verify: str,
    dsns: Range,
    data: bytes,
    record_starts: npt.NDArray[np.int64],
    record_ends: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    first_dsns: npt.NDArray[np.int64],
    lsn_of: npt.NDArray[np.int64],
    records: Sequence[BackendRecord],
    body_of: Callable[[int], EntriesBody | EntriesRecord],
) -> EntryChunk | None:
    """`_chunk` of records held in `data` (record `r` is `data[record_starts[r]:
    record_ends[r]]`, rising, anything between them), with `counts[r]` entries from DSN
    `first_dsns[r]`, backend record `records[r]` at LSN `lsn_of[r]`, unsplit body
    `body_of(r)` (asked only for a body that does not parse, to name its damage)."""
    record_of = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    within = np.arange(len(record_of), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    starts, ends, parsed = _walk(data, record_starts, record_ends, counts, record_of, within)
    bad = np.flatnonzero(~parsed)
    first_bad = int(bad[0]) if len(bad) else len(counts)
    # Only the entries of records before the first whose body does not parse (all of them,
    # when every one does) are decoded.
    keep = None if first_bad == len(counts) else record_of < first_bad
    entry_dsns = first_dsns[record_of] + within
    if dsns.lo is not None:
        above = entry_dsns >= dsns.lo
        keep = above if keep is None else keep & above
    if dsns.hi is not None:
        below = entry_dsns <= dsns.hi
        keep = below if keep is None else keep & below
    if keep is not None:
        record_of, entry_dsns, starts, ends = (
            a[keep] for a in (record_of, entry_dsns, starts, ends)
        )
    chunk = None
    if len(record_of):
        decoded = decode_entries_at(data, starts, ends, entry_dsns)
        if decoded.errors and verify != VERIFY_REPORT:
            first = int(np.flatnonzero(decoded.kinds == KIND_DAMAGED)[0])
            rec = records[int(record_of[first])]
            raise InputCorrupt(unit.path, rec.offset_bytes, str(decoded.errors[first]))
        chunk = EntryChunk(decoded, lsn_of[record_of], records, record_of, data, starts, ends)
    if first_bad < len(counts):
        body = body_of(first_bad)
        assert isinstance(body, EntriesBody)  # a split record's body parsed when it was split
        try:
            body.split()
        except CorruptRecord as exc:
            raise record_corrupt(unit, records[first_bad], exc) from None
        raise AssertionError(f"the walk refused a body that splits: {records[first_bad]}")
    return chunk


def _walk(
    data: bytes,
    record_starts: npt.NDArray[np.int64],
    record_ends: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    record_of: npt.NDArray[np.int64],
    within: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Every entry's [start, end) in `data` (the records' payloads, joined or in place with
    other bytes between them; record `r` is `data[record_starts[r]:record_ends[r]]`, with
    `counts[r]` entries; entry `i` is entry `within[i]` of record `record_of[i]`), and
    whether each record's body parses: its entries, each a u32 size then that many bytes,
    end exactly at its end (the check of `EntriesBody.split`). The places given for a record
    that does not parse mean nothing.

    Step k reads the size prefix of entry k of every record that has one: with the records
    sorted by count (most first) those are a prefix of the arrays. Each step adds at least 4
    bytes, and a place past the data is clipped to one byte past it, so an entry running past
    its record leaves every later end past it (whatever bytes lie after the record): one test
    of the last end per record is the whole check."""
    cap = len(data) + 1
    if len(data) >= _PREFIX_BYTES:
        raw = np.frombuffer(data, dtype=np.uint8)
    else:  # too short for one size prefix: padded, so that there is one u32 to read
        raw = np.frombuffer(data + bytes(_PREFIX_BYTES), dtype=np.uint8)
    # The u32 at every byte where one fits: unaligned reads through a one-byte stride. A
    # place past the last (`last`) is read there instead: such a prefix does not fit in the
    # data, so its entry runs past its record's end whatever size is read (every later place
    # stays past it), and the record fails the check; a record that parses reads no such place.
    last = len(raw) - _PREFIX_BYTES
    size_at = np.ndarray((last + 1,), dtype="<u4", buffer=raw, strides=(1,))
    order = np.argsort(-counts, kind="stable")
    sorted_counts = counts[order]
    steps = int(sorted_counts[0]) if len(counts) else 0
    live = np.searchsorted(-sorted_counts, -np.arange(steps), side="left")  # count > k
    positions = record_starts[order] + _HEADER_BYTES
    at = np.empty((steps, int(live[0]) if steps else 0), dtype=np.int64)
    for k in range(steps):
        n = int(live[k])
        p = positions[:n]
        at[k, :n] = p
        np.minimum(p + _PREFIX_BYTES + size_at[np.minimum(p, last)], cap, out=p)
    parsed = np.empty(len(counts), dtype=np.bool_)
    parsed[order] = positions == record_ends[order]
    rank = np.empty(len(counts), dtype=np.int64)
    rank[order] = np.arange(len(counts))
    prefixes = at[within, rank[record_of]]
    starts = prefixes + _PREFIX_BYTES
    ends = starts + size_at[np.minimum(prefixes, last)]
    return starts, ends, parsed
