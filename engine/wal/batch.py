"""Many WAL entries decoded per call into columns (issue 23: "decode many entries per call
into columns; no Arrow IPC round trip for small appends").

Most entries of a real log are one small insert: one memo item, one AppendColumns command
(engine/FORMAT.md, version 2) with one info. `decode_entries` recognises that shape for a whole
list of entries at once with numpy (every header field, count, length and column buffer of all
of them read by one gather each), groups them by their column definitions and row count, and
gives each table's rows as one Arrow batch per group plus the row ids (block_id, offset) and
the entry of every row: one concatenation per column instead of one Arrow array per entry.

It applies exactly `decode_entry`'s checks and no others (tests/unit/engine/test_wal_batch.py
compares both on random and damaged entries): an entry is taken by the fast path only when
every check holds for it - size, magic, version, body length, xxh3 checksum, type, reserved
bits, start_ts < commit_ts, the counts, the command length, the infos covering the rows, the
definitions (byte-equal to those of an exemplar that `decode_entry` itself accepted), padding
and validity bits, string offsets, and Arrow's full validation of the gathered columns. Every
other entry - another shape, version 1's Arrow IPC appends, catalog commands, deletes,
checkpoints, and anything damaged - goes to `decode_entry` one by one, so its result or its
`WalCorruption` is decode_entry's own. A group whose gathered columns fail Arrow's validation
is decoded entry by entry too (then the damaged entry is named).

Pure (numpy, pyarrow, xxhash); no I/O.

Where the parts live: this module decides which entries take the fast path (the fixed fields,
the checksums, the groups by definitions) and sends the others to `decode_entry`; the fields'
byte offsets are engine/wal/batch_layout.py, reading many entries' bytes at once
batch_gather.py, a group's columns batch_columns.py, and what the call returns
(`DecodedEntries`, `TableRows`, `KIND_*`, all still importable from here) decoded_entries.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import xxhash

from engine import limits
from engine.errors import WalCorruption
from engine.wal import codec
from engine.wal.batch_columns import _decode_gathered, _decode_sliced, _fixed_bytes, _Group
from engine.wal.batch_gather import _Gather, _places, _rows_equal
from engine.wal.batch_layout import (
    _AT_CHECKSUM,
    _AT_COLUMN_COUNT,
    _AT_DEFINITIONS,
    _CMD_BODY_AT,
    _SHAPE,
)
from engine.wal.columns import APPEND_COLUMNS_ROWS_MAX, _parse_definitions
from engine.wal.decoded_entries import KIND_DAMAGED as KIND_DAMAGED
from engine.wal.decoded_entries import KIND_FAST as KIND_FAST
from engine.wal.decoded_entries import KIND_ONE as KIND_ONE
from engine.wal.decoded_entries import DecodedEntries as DecodedEntries
from engine.wal.decoded_entries import Entry as Entry
from engine.wal.decoded_entries import TableRows as TableRows
from engine.wal.entry import TxnEntry

DEFINITION_GROUPS_MAX = 16
"""Distinct column definitions the fast path learns per call; entries of further schemas are
decoded one by one (bounds the work of matching: one comparison per group and entry)."""


def decode_entries(payloads: Sequence[bytes], dsns: Sequence[int]) -> DecodedEntries:
    """Decode `payloads` (entries with DSNs `dsns`): the fast shape in columns, every other entry
    by `decode_entry`. Never raises for damage: a damaged entry's error is in `errors`."""
    count = len(payloads)
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=count)
    ends = np.cumsum(lengths)
    return decode_entries_at(b"".join(payloads), ends - lengths, ends, dsns)


def decode_entries_at(
    data: bytes,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    dsns: Sequence[int] | npt.NDArray[np.int64],
) -> DecodedEntries:
    """`decode_entries` of the entries `data[starts[i]:ends[i]]`: places in one buffer, rising
    and not overlapping, with anything between them (a reader passes the driver records'
    payloads joined, and the places of their entries: no bytes object per entry)."""
    count = len(starts)
    assert len(ends) == count
    assert len(dsns) == count
    dsn_array = np.asarray(dsns, dtype=np.int64).reshape(count)
    out = DecodedEntries(
        dsns=dsn_array,
        kinds=np.full(count, KIND_ONE, dtype=np.int8),
        start_ts=np.zeros(count, dtype=np.uint64),
        commit_ts=np.zeros(count, dtype=np.uint64),
        is_txn=np.zeros(count, dtype=np.bool_),
        tables=[],
        entries={},
        errors={},
        memo=np.zeros((count, 3), dtype=np.uint64),
        db_ids=np.zeros(count, dtype=np.uint64),
    )
    fast = np.zeros(count, dtype=np.bool_)
    reader = _Gather(data, starts, ends)
    if count and len(data) < 1 << 31:  # string offsets are int32 (callers chunk far below)
        assert (starts[1:] >= ends[:-1]).all()
        assert starts[0] >= 0 and ends[-1] <= len(data)
        candidates, fields = _fast_candidates(reader, ends - starts)
        candidates &= _checksums_ok(reader, candidates, fields.checksums, fields.heads)
        _decode_groups(reader, candidates, fields, dsn_array, out, fast)
    for index in np.flatnonzero(~fast).tolist():
        _decode_one(reader, dsn_array, index, out)
    return out


@dataclass(frozen=True, slots=True)
class _Fields:
    """Fixed fields of the fast shape read once for every entry (0 where it is too short)."""

    checksums: npt.NDArray[np.uint64]
    column_counts: npt.NDArray[np.int64]
    row_counts: npt.NDArray[np.int64]
    heads: npt.NDArray[np.uint8] | None
    """Every entry's first _AT_DEFINITIONS bytes, (entries, width), when every entry was long
    enough to read them (the usual call), else None."""


def _fast_candidates(
    reader: _Gather, lengths: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.bool_], _Fields]:
    """Entries whose fixed fields are those of a valid one-append transaction (the columns and
    the checksum are checked later), and the fixed fields the later steps read."""
    ok = (lengths >= _AT_DEFINITIONS) & (lengths <= limits.TXN_ENTRY_BYTES_MAX)
    long_enough = np.flatnonzero(ok)
    matrix = reader.prefix(long_enough, _AT_DEFINITIONS)
    head = matrix.view(_SHAPE).reshape(len(long_enough))
    fields = _Fields(
        np.zeros(len(lengths), dtype=np.uint64),
        np.zeros(len(lengths), dtype=np.int64),
        np.zeros(len(lengths), dtype=np.int64),
        matrix if len(long_enough) == len(lengths) else None,
    )
    at = _places(long_enough)
    fields.checksums[at] = head["checksum"]
    fields.column_counts[at] = head["column_count"]
    fields.row_counts[at] = head["rows"]
    sizes = lengths[at]
    rows = head["rows"]
    columns = head["column_count"]
    ok[at] = (
        (head["magic"] == int.from_bytes(codec.MAGIC, "little"))
        & (head["version"] == 2)
        & (head["type"] == 0x10)  # EntryType.AC
        & (head["reserved"] == 0)
        & (head["body_len"] == sizes - codec.HEADER_BYTES)
        & (head["start_ts"] < head["commit_ts"])
        & (head["memo_count"] == 1)
        & (head["cmd_count"] == 1)
        & (head["cmd_type"] == codec.CMD_APPEND_COLUMNS)
        & (head["cmd_len"] == sizes - _CMD_BODY_AT)
        & (head["info_count"] == 1)
        & (rows >= 1)
        & (rows <= APPEND_COLUMNS_ROWS_MAX)
        & (head["info_rows"] == rows)
        & (columns >= 1)
        & (columns <= limits.COLUMNS_MAX)
    )
    return ok, fields


def _checksums_ok(
    reader: _Gather,
    candidates: npt.NDArray[np.bool_],
    stored: npt.NDArray[np.uint64],
    prefixes: npt.NDArray[np.uint8] | None = None,
) -> npt.NDArray[np.bool_]:
    """The xxh3-64 of each candidate (its first 12 bytes, then its body) against its header's
    (`stored`). In a copy of the buffer each candidate's first 12 bytes are moved up over its
    checksum field, so that what it covers is one range, hashed with one C-level loop (map and
    fromiter) over slices of the copy: a bytearray, whose slices cost less than a memoryview's
    (~130 against ~145 ns an entry with the hash, issue 23). `prefixes`: every entry's first
    bytes (row i for entry i), when the caller read them already."""
    indexes = np.flatnonzero(candidates)
    ok = np.zeros(len(candidates), dtype=np.bool_)
    if not len(indexes):
        return ok
    at = _places(indexes)
    starts = reader.starts[at]
    covered = bytearray(reader.raw)
    moved = np.frombuffer(covered, dtype=np.uint8)  # a writable view of the copy
    # The heads: the first bytes of every entry's prefix when the caller read them
    # (`prefixes`, one row per entry), else rows of a sliding window (one gather of whole
    # rows, no index per byte); then one scatter. The rows written do not overlap (entries
    # are longer).
    if prefixes is not None:
        heads = prefixes[at, :_AT_CHECKSUM]
    else:
        heads = np.lib.stride_tricks.sliding_window_view(reader.data, _AT_CHECKSUM)[starts]
    targets = np.lib.stride_tricks.sliding_window_view(moved, _AT_CHECKSUM, writeable=True)
    targets[starts + (codec.HEADER_BYTES - _AT_CHECKSUM)] = heads
    first = starts + (codec.HEADER_BYTES - _AT_CHECKSUM)
    found = np.fromiter(
        map(
            xxhash.xxh3_64_intdigest,
            map(covered.__getitem__, map(slice, first.tolist(), reader.ends[at].tolist())),
        ),
        dtype=np.uint64,
        count=len(indexes),
    )
    ok[at] = stored[at] == found
    return ok


def _decode_one(
    reader: _Gather, dsns: npt.NDArray[np.int64], index: int, out: DecodedEntries
) -> None:
    try:
        entry = codec.decode_entry(reader.entry(index), int(dsns[index]))
    except WalCorruption as exc:
        out.kinds[index] = KIND_DAMAGED
        out.errors[index] = exc
        return
    out.kinds[index] = KIND_ONE
    out.entries[index] = entry
    if isinstance(entry, TxnEntry):
        out.is_txn[index] = True
        out.start_ts[index] = entry.start_ts
        out.commit_ts[index] = entry.commit_ts


def _decode_groups(
    reader: _Gather,
    candidates: npt.NDArray[np.bool_],
    fields: _Fields,
    dsns: npt.NDArray[np.int64],
    out: DecodedEntries,
    fast: npt.NDArray[np.bool_],
) -> None:
    """Candidates grouped by their definitions' bytes (learned from an exemplar that
    `decode_entry` accepts), then by row count; each group's columns gathered at once."""
    waiting = candidates.copy()
    column_counts, row_counts = fields.column_counts, fields.row_counts
    lengths = reader.ends - reader.starts
    for _ in range(DEFINITION_GROUPS_MAX):
        left = np.flatnonzero(waiting)
        if not len(left):
            return
        exemplar = int(left[0])
        waiting[exemplar] = False
        definitions = _definitions_of(reader.entry(exemplar), dsns[exemplar])
        if definitions is None:
            continue
        size = len(definitions)
        columns = int(column_counts[exemplar])
        schema, kinds = _parse_definitions(memoryview(definitions), 0, columns)
        same = left[column_counts[left] == columns]
        same_rows = row_counts[same]
        one_count = bool((same_rows == same_rows[0]).all())  # the usual: no sort needed
        for rows in [int(same_rows[0])] if one_count else np.unique(same_rows).tolist():
            members = same if one_count else same[same_rows == rows]
            fixed, general = _fixed_bytes(kinds, rows)
            width = _AT_DEFINITIONS + size + fixed
            members = members[lengths[members] >= width]
            matrix = reader.prefix(members, width)
            match = _rows_equal(matrix, _AT_DEFINITIONS, definitions)
            if not match.all():  # the usual group matches whole: no copy of its bytes
                members, matrix = members[match], matrix[match]
            waiting[members] = False
            if not len(members):
                continue
            group = _Group(members, matrix, rows, size, schema, kinds)
            if general:
                _decode_gathered(reader, group, out, fast)
            else:
                _decode_sliced(reader, group, out, fast)


def _definitions_of(payload: bytes, dsn: np.int64) -> bytes | None:
    """The definitions' bytes of a fast-shape entry that decode_entry accepts; None when it does
    not (the entry is then decoded one by one, and fails there)."""
    try:
        entry = codec.decode_entry(payload, int(dsn))
    except WalCorruption:
        return None
    assert isinstance(entry, TxnEntry) and len(entry.commands) == 1
    pos = _AT_DEFINITIONS
    view = memoryview(payload)
    for _ in range(int.from_bytes(view[_AT_COLUMN_COUNT:_AT_DEFINITIONS], "little")):
        pos += 2 + int.from_bytes(view[pos : pos + 2], "little")
        pos += 1 + view[pos] + 2
    return bytes(view[_AT_DEFINITIONS:pos])
