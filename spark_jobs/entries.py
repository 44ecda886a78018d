"""The engine entries of one unit, many at a time: the driver records' entries gathered into
chunks and decoded by `engine.wal.batch.decode_entries` (one-append transactions into columns,
every other entry by `decode_entry`), with the command level's damage rules: a damaged entry
raises `InputCorrupt` (naming its backend record) unless verify is `report`, which skips it.

What replay_as_of (local engine) and the rows level (both engines) read; the per-entry reader
`walread.txn_entries` remains for the levels that want every entry as an object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.wal.batch import KIND_DAMAGED, DecodedEntries, decode_entries
from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Range
from spark_jobs.inputs import Unit
from spark_jobs.journal import VERIFY_REPORT
from spark_jobs.records import DriverRecord, driver_records
from tae_driver.record import EntriesRecord

CHUNK_ENTRIES_MAX = 16384
"""Entries decoded per call: enough that numpy's and Arrow's per-call costs vanish (~1 us per
call and column against ~0.1 us per entry), small enough that a chunk's arrays stay in the
CPU caches' neighbourhood."""
CHUNK_BYTES_MAX = 32 * 2**20
"""Entry bytes per chunk: with a chunk's decoded columns (about the same again), what one
reader holds at once; a single entry is at most 2 MiB (the driver's limit)."""


@dataclass(frozen=True, slots=True)
class EntryChunk:
    """Entries of consecutive driver records, in read order. Damaged entries were raised or
    (verify `report`) are marked KIND_DAMAGED in `decoded.kinds`."""

    decoded: DecodedEntries
    lsns: npt.NDArray[np.int64]
    """Per entry: the LSN of its backend record."""
    payloads: list[bytes]
    segments: list[str]
    """Per entry: its backend record's segment file, byte offset and Raft index (logsvc)."""
    offsets: list[int]
    raft_indexes: list[int | None]


def entry_chunks(
    unit: Unit,
    verify: str,
    lsns: Range,
    dsns: Range,
    seen: Callable[[DriverRecord], None] | None = None,
) -> Iterator[EntryChunk]:
    """The entries of `unit` whose record's LSN `lsns` holds and whose DSN `dsns` holds.
    `seen`, when given, is shown every driver record as it is read (before its entries are
    chunked), so a caller can gather what it needs of the records in the same pass."""
    payloads: list[bytes] = []
    dsn_list: list[int] = []
    lsn_list: list[int] = []
    offsets: list[int] = []  # per entry: its backend record's offset (for errors)
    segments: list[str] = []
    raft_indexes: list[int | None] = []
    size = 0
    records = driver_records(unit, verify, lsns)
    while True:
        try:
            found = next(records)
        except StopIteration:
            break
        except InputCorrupt:
            # Damage in a later record: an earlier damaged entry is named first, as reading
            # entry by entry would.
            if payloads:
                _chunk(unit, verify, payloads, dsn_list, lsn_list, offsets, [], [])
            raise
        if seen is not None:
            seen(found)
        decoded = found.decoded
        if not isinstance(decoded, EntriesRecord) or not decoded.entries:
            continue
        rec = found.rec
        first = decoded.start_dsn
        entries = decoded.entries
        if dsns.unbounded:
            kept = range(len(entries))
            payloads.extend(entries)
        else:
            kept = range(
                max(0, (dsns.lo if dsns.lo is not None else first) - first),
                min(
                    len(entries),
                    (dsns.hi if dsns.hi is not None else first + len(entries)) - first + 1,
                ),
            )
            payloads.extend(entries[i] for i in kept)
        if not kept:
            continue
        dsn_list.extend(range(first + kept.start, first + kept.stop))
        assert rec.lsn is not None
        lsn_list.extend([rec.lsn] * len(kept))
        offsets.extend([rec.offset_bytes] * len(kept))
        segments.extend([rec.segment] * len(kept))
        raft_indexes.extend([rec.raft_index] * len(kept))
        size += sum(map(len, entries[kept.start : kept.stop]))
        if len(payloads) >= CHUNK_ENTRIES_MAX or size >= CHUNK_BYTES_MAX:
            yield _chunk(
                unit, verify, payloads, dsn_list, lsn_list, offsets, segments, raft_indexes
            )
            payloads, dsn_list, lsn_list, offsets, size = [], [], [], [], 0
            segments, raft_indexes = [], []
    if payloads:
        yield _chunk(unit, verify, payloads, dsn_list, lsn_list, offsets, segments, raft_indexes)


def _chunk(
    unit: Unit,
    verify: str,
    payloads: list[bytes],
    dsns: list[int],
    lsns: list[int],
    offsets: list[int],
    segments: list[str],
    raft_indexes: list[int | None],
) -> EntryChunk:
    decoded = decode_entries(payloads, dsns)
    if decoded.errors and verify != VERIFY_REPORT:
        first = int(np.flatnonzero(decoded.kinds == KIND_DAMAGED)[0])
        raise InputCorrupt(unit.path, offsets[first], str(decoded.errors[first]))
    return EntryChunk(
        decoded, np.asarray(lsns, dtype=np.int64), payloads, segments, offsets, raft_indexes
    )
