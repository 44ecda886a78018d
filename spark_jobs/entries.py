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

What replay_as_of (local engine) and the rows and command levels read; the per-entry reader
`walread.txn_entries` remains for the levels that want every entry as an object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.wal.batch import KIND_DAMAGED, DecodedEntries, decode_entries_at
from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Range
from spark_jobs.inputs import Unit
from spark_jobs.journal import VERIFY_REPORT
from spark_jobs.records import BackendRecord, DriverRecord, driver_records, record_corrupt
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
    records: list[BackendRecord]
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


def entry_chunks(
    unit: Unit,
    verify: str,
    lsns: Range,
    dsns: Range,
    seen: Callable[[DriverRecord], None] | None = None,
) -> Iterator[EntryChunk]:
    """The entries of `unit` whose record's LSN `lsns` holds and whose DSN `dsns` holds.
    `seen`, when given, is shown every driver record as it is read (before its entries are
    chunked), so a caller can gather what it needs of the records in the same pass: an
    ENTRIES record reaches it unsplit (`EntriesBody`), its body checked when its chunk is."""
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
            seen(found)
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
    data = b"".join(payloads)
    sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    record_ends = np.cumsum(sizes)
    counts = np.fromiter((b.count for b in pending.bodies), dtype=np.int64, count=len(sizes))
    record_of = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    within = np.arange(len(record_of), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    starts, ends, parsed = _walk(data, record_ends - sizes, record_ends, counts, record_of, within)
    bad = np.flatnonzero(~parsed)
    first_bad = int(bad[0]) if len(bad) else len(payloads)
    # Only the entries of records before the first whose body does not parse (all of them,
    # when every one does) are decoded.
    keep = None if first_bad == len(payloads) else record_of < first_bad
    first_dsns = np.fromiter((b.start_dsn for b in pending.bodies), np.int64, len(counts))
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
            rec = pending.records[int(record_of[first])]
            raise InputCorrupt(unit.path, rec.offset_bytes, str(decoded.errors[first]))
        lsn_of = np.fromiter((r.lsn for r in pending.records), np.int64, len(counts))
        chunk = EntryChunk(
            decoded, lsn_of[record_of], pending.records, record_of, data, starts, ends
        )
    if first_bad < len(payloads):
        body = pending.bodies[first_bad]
        assert isinstance(body, EntriesBody)  # a split record's body parsed when it was split
        try:
            body.split()
        except CorruptRecord as exc:
            raise record_corrupt(unit, pending.records[first_bad], exc) from None
        raise AssertionError(f"the walk refused a body that splits: {pending.records[first_bad]}")
    return chunk


def _walk(
    data: bytes,
    record_starts: npt.NDArray[np.int64],
    record_ends: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    record_of: npt.NDArray[np.int64],
    within: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Every entry's [start, end) in `data` (the records' payloads joined; record `r` is
    `data[record_starts[r]:record_ends[r]]`, with `counts[r]` entries; entry `i` is entry
    `within[i]` of record `record_of[i]`), and whether each record's body parses: its
    entries, each a u32 size then that many bytes, end exactly at its end (the check of
    `EntriesBody.split`). The places given for a record that does not parse mean nothing.

    Step k reads the size prefix of entry k of every record that has one: with the records
    sorted by count (most first) those are a prefix of the arrays. Each step adds at least 4
    bytes, and a place past the data is clipped to one byte past it (whose padding reads as
    size 0), so an entry running past its record leaves every later end past it: one test of
    the last end per record is the whole check."""
    cap = len(data) + 1
    padded = np.frombuffer(data + bytes(_PREFIX_BYTES + 1), dtype=np.uint8)
    # The u32 at every byte up to `cap`: unaligned reads through a one-byte stride.
    size_at = np.ndarray((cap + 1,), dtype="<u4", buffer=padded, strides=(1,))
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
        np.minimum(p + _PREFIX_BYTES + size_at[p], cap, out=p)
    parsed = np.empty(len(counts), dtype=np.bool_)
    parsed[order] = positions == record_ends[order]
    rank = np.empty(len(counts), dtype=np.int64)
    rank[order] = np.arange(len(counts))
    prefixes = at[within, rank[record_of]]
    starts = prefixes + _PREFIX_BYTES
    ends = starts + size_at[prefixes]
    return starts, ends, parsed
