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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import xxhash

from engine import limits
from engine.errors import WalCorruption
from engine.wal import codec
from engine.wal.columns import _FIXED_BYTES, APPEND_COLUMNS_ROWS_MAX, _parse_definitions
from engine.wal.entry import Append, AppendInfo, CheckpointEntry, MemoItem, TxnEntry
from engine.wal.from_numpy import arrow_array

Entry = TxnEntry | CheckpointEntry

DEFINITION_GROUPS_MAX = 16
"""Distinct column definitions the fast path learns per call; entries of further schemas are
decoded one by one (bounds the work of matching: one comparison per group and entry)."""

# Where the fields of the fast shape lie in an entry (engine/FORMAT.md): header, start_ts,
# commit_ts, memo count, one memo item, command count, command head, db_id, table_id, info
# count, one info, then the AppendColumns body (rows, column count, definitions, columns).
_AT_MAGIC = 0
_AT_VERSION = 2
_AT_TYPE = 3
_AT_RESERVED = 4
_AT_BODY_LEN = 8
_AT_CHECKSUM = 12
_AT_START_TS = 20
_AT_COMMIT_TS = 28
_AT_MEMO_COUNT = 36
_AT_MEMO = 40  # db_id, table_id, block_id
_AT_CMD_COUNT = 64
_AT_CMD_TYPE = 68
_AT_CMD_LEN = 69
_AT_DB_ID = 73
_AT_TABLE_ID = 81
_AT_INFO_COUNT = 89
_AT_INFO = 93  # block_id u64, offset u32, rows u32
_AT_ROWS = 109
_AT_COLUMN_COUNT = 113
_AT_DEFINITIONS = 115
_CMD_BODY_AT = _AT_DB_ID  # the command's length counts the bytes from here to the end

KIND_FAST = 0
"""The entry is a one-append transaction decoded into `DecodedEntries.tables`."""
KIND_ONE = 1
"""The entry was decoded by `decode_entry`: in `DecodedEntries.entries`."""
KIND_DAMAGED = 2
"""`decode_entry` refused it: the error is in `DecodedEntries.errors`."""


@dataclass(frozen=True, slots=True)
class TableRows:
    """Rows appended to table `table_id` by fast-path entries, in entry order; every array has
    one value per row."""

    table_id: int
    entries: npt.NDArray[np.int64]
    """The index (in the call's input) of each row's entry."""
    block_ids: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.uint64]
    """Each row's place in its block (its info's offset plus its index among the info's rows)."""
    columns: pa.RecordBatch


@dataclass(slots=True)
class DecodedEntries:
    """What `decode_entries` found, entry by entry (index = position in its input)."""

    dsns: npt.NDArray[np.int64]
    kinds: npt.NDArray[np.int8]
    """KIND_FAST, KIND_ONE or KIND_DAMAGED per entry."""
    start_ts: npt.NDArray[np.uint64]
    commit_ts: npt.NDArray[np.uint64]
    """A transaction's timestamps (fast or not); 0 for checkpoints and damage."""
    is_txn: npt.NDArray[np.bool_]
    """A transaction entry (fast or decoded one by one), not a checkpoint nor damage."""
    tables: list[TableRows]
    entries: dict[int, Entry]
    errors: dict[int, WalCorruption]
    # Per entry, for fast-path entries (zero elsewhere): the memo item and the command's
    # db_id, to give the entry back whole (`entry`).
    memo: npt.NDArray[np.uint64]
    db_ids: npt.NDArray[np.uint64]

    def __len__(self) -> int:
        return len(self.kinds)

    def entry(self, index: int) -> Entry:
        """Entry `index` as `decode_entry` gives it (raises its WalCorruption). Slow for fast-path
        entries (it rebuilds the objects): for tests and rare readers."""
        kind = self.kinds[index]
        if kind == KIND_DAMAGED:
            raise self.errors[index]
        if kind == KIND_ONE:
            return self.entries[index]
        for rows in self.tables:
            found = np.flatnonzero(rows.entries == index)
            if len(found):
                first, count = int(found[0]), len(found)
                batch = rows.columns.slice(first, count)
                info = AppendInfo(int(rows.block_ids[first]), int(rows.offsets[first]), count)
                db_id, table_id, block_id = (int(v) for v in self.memo[index])
                append = Append(int(self.db_ids[index]), rows.table_id, (info,), batch)
                return TxnEntry(
                    int(self.start_ts[index]),
                    int(self.commit_ts[index]),
                    (MemoItem(db_id, table_id, block_id),),
                    (append,),
                )
        raise AssertionError(f"entry {index} is fast but has no rows")


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


_SHAPE = np.dtype(
    {
        "names": [
            "magic",
            "version",
            "type",
            "reserved",
            "body_len",
            "checksum",
            "start_ts",
            "commit_ts",
            "memo_count",
            "cmd_count",
            "cmd_type",
            "cmd_len",
            "info_count",
            "info_rows",
            "rows",
            "column_count",
        ],
        "formats": [
            "<u2",
            "u1",
            "u1",
            "<u4",
            "<u4",
            "<u8",
            "<u8",
            "<u8",
            "<u4",
            "<u4",
            "u1",
            "<u4",
            "<u4",
            "<u4",
            "<u4",
            "<u2",
        ],
        "offsets": [
            _AT_MAGIC,
            _AT_VERSION,
            _AT_TYPE,
            _AT_RESERVED,
            _AT_BODY_LEN,
            _AT_CHECKSUM,
            _AT_START_TS,
            _AT_COMMIT_TS,
            _AT_MEMO_COUNT,
            _AT_CMD_COUNT,
            _AT_CMD_TYPE,
            _AT_CMD_LEN,
            _AT_INFO_COUNT,
            _AT_INFO + 12,
            _AT_ROWS,
            _AT_COLUMN_COUNT,
        ],
        "itemsize": _AT_DEFINITIONS,
    }
)
"""The fixed fields of the fast shape, as one numpy record per entry."""


_IDS = np.dtype(
    {
        "names": ["start_ts", "commit_ts", "memo", "db_id", "table_id", "block_id", "offset"],
        "formats": ["<u8", "<u8", ("<u8", (3,)), "<u8", "<u8", "<u8", "<u4"],
        "offsets": [
            _AT_START_TS,
            _AT_COMMIT_TS,
            _AT_MEMO,
            _AT_DB_ID,
            _AT_TABLE_ID,
            _AT_INFO,
            _AT_INFO + 8,
        ],
        "itemsize": _AT_DEFINITIONS,
    }
)
"""The ids and timestamps of the fast shape that a decoded entry keeps, one record per entry."""


def _places(indexes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | slice:
    """`indexes` (rising, distinct) as a slice when they are one run, the usual case (a
    call's entries all of the fast shape, in one group): numpy then copies the run's
    elements in one pass instead of gathering or scattering them one index at a time."""
    if len(indexes) and int(indexes[-1]) - int(indexes[0]) == len(indexes) - 1:
        return slice(int(indexes[0]), int(indexes[-1]) + 1)
    return indexes


class _Gather:
    """The entries of one call: the buffer holding them, and where each starts and ends;
    fields of many entries read at once."""

    __slots__ = ("data", "ends", "raw", "starts")

    def __init__(
        self, raw: bytes, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
    ) -> None:
        self.raw = raw
        self.data = np.frombuffer(raw, dtype=np.uint8)
        self.starts = starts
        self.ends = ends

    def entry(self, index: int) -> bytes:
        return self.raw[int(self.starts[index]) : int(self.ends[index])]

    def prefix(self, members: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint8]:
        """The first `width` bytes of each member (each at least that long), (n, width), C
        order: rows of a sliding window over the buffer (a view), so the one copy made is
        of those bytes (no index per byte)."""
        assert width >= 1
        if not len(members):
            return np.zeros((0, width), dtype=np.uint8)
        windows = np.lib.stride_tricks.sliding_window_view(self.data, width)
        found: npt.NDArray[np.uint8] = windows[self.starts[_places(members)]]
        return found

    def bytes_at(self, positions: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint8]:
        """`width` bytes at each absolute position, (n, width); positions past the data read its
        last bytes (the caller has checked bounds or masks those entries out)."""
        if len(self.data) < width:
            return np.zeros((len(positions), width), dtype=np.uint8)
        clipped = np.minimum(positions, len(self.data) - width)
        return self.data[clipped[:, None] + np.arange(width)]

    def uint(self, positions: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint64]:
        raw = np.ascontiguousarray(self.bytes_at(positions, width))
        return raw.view(f"<u{width}").reshape(len(positions)).astype(np.uint64)


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


def _rows_equal(matrix: npt.NDArray[np.uint8], at: int, expected: bytes) -> npt.NDArray[np.bool_]:
    """Whether the bytes of each row of `matrix` (n, width; C order) from `at` are `expected`,
    byte for byte: each row's run read in place as one fixed-size byte string (numpy's `S`
    equality ignores only trailing NULs, which two strings of one length can differ in only
    if they are equal)."""
    size = len(expected)
    if not size:
        return np.ones(len(matrix), dtype=np.bool_)
    rows = _fields(matrix, at, np.dtype(f"S{size}"))
    found: npt.NDArray[np.bool_] = rows == np.bytes_(expected)
    return found


def _fields(matrix: npt.NDArray[np.uint8], at: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """One `dtype` value per row of `matrix` (n, width; C order), at byte `at` of the row: a
    view (unaligned reads), no copy."""
    assert matrix.flags.c_contiguous and at + dtype.itemsize <= matrix.shape[1]
    if not len(matrix):
        return np.zeros(0, dtype=dtype)
    return np.ndarray(
        (len(matrix),), dtype=dtype, buffer=matrix, offset=at, strides=(matrix.shape[1],)
    )


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


@dataclass(frozen=True, slots=True)
class _Group:
    """Entries of one definitions and row count, with the fixed bytes of each (n, width)."""

    members: npt.NDArray[np.int64]
    matrix: npt.NDArray[np.uint8]
    rows: int
    definitions_bytes: int
    schema: pa.Schema
    kinds: tuple[tuple[str, bool], ...]

    def subset(self, keep: npt.NDArray[np.bool_]) -> _Group:
        return _Group(
            self.members[keep],
            self.matrix[keep],
            self.rows,
            self.definitions_bytes,
            self.schema,
            self.kinds,
        )


def _fixed_bytes(kinds: tuple[tuple[str, bool], ...], rows: int) -> tuple[int, bool]:
    """The bytes of the columns at fixed places (up to and with the offsets of the first string
    or binary column), and whether any column follows that one (the gathered, slower path)."""
    bitmap_bytes = (rows + 7) >> 3
    size = 0
    for index, (type_name, has_validity) in enumerate(kinds):
        size += bitmap_bytes if has_validity else 0
        width = _FIXED_BYTES.get(type_name)
        if width is not None:
            size += rows * width
        elif type_name == "bool":
            size += bitmap_bytes
        else:
            return size + (rows + 1) * 4, index != len(kinds) - 1
    return size, False


def _bits(
    matrix: npt.NDArray[np.uint8], at: int, rows: int, ok: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """A bitmap of `rows` bits at `at` in every row of `matrix`, as (n, rows) booleans; entries
    with padding bits set are marked not ok."""
    raw = matrix[:, at : at + ((rows + 7) >> 3)]
    if rows & 7:
        ok &= (raw[:, -1] >> (rows & 7)) == 0
    bits: npt.NDArray[np.bool_] = np.unpackbits(raw, axis=1, bitorder="little")[:, :rows].astype(
        bool
    )
    return bits


def _decode_sliced(
    reader: _Gather, group: _Group, out: DecodedEntries, fast: npt.NDArray[np.bool_]
) -> None:
    """Every column at a fixed place of each entry but the last, which may be a string or binary
    column whose values run to the entry's end: read from the group's matrix and one slice."""
    members, matrix, rows = group.members, group.matrix, group.rows
    places = _places(members)
    n = len(members)
    ok = np.ones(n, dtype=np.bool_)
    at = _AT_DEFINITIONS + group.definitions_bytes
    layouts: list[tuple[str, tuple[Any, ...]]] = []
    ends_at_fixed = True
    for type_name, has_validity in group.kinds:
        validity = None
        if has_validity:
            validity = _bits(matrix, at, rows, ok)
            ok &= ~validity.all(axis=1)  # a validity bitmap means at least one null
            at += (rows + 7) >> 3
        width = _FIXED_BYTES.get(type_name)
        if width is not None:
            layouts.append(("fixed", (validity, matrix[:, at : at + rows * width])))
            at += rows * width
        elif type_name == "bool":
            layouts.append(("bool", (validity, _bits(matrix, at, rows, ok))))
            at += (rows + 7) >> 3
        else:
            offsets = _fields(matrix, at, np.dtype(("<u4", (rows + 1,))))
            at += (rows + 1) * 4
            ok &= offsets[:, 0] == 0
            value_starts = reader.starts[places] + at
            totals = reader.ends[places] - value_starts
            ok &= totals == offsets[:, rows]
            tail_offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(totals, out=tail_offsets[1:])
            values = pa.py_buffer(_gather_runs(reader.data, value_starts, totals))
            layouts.append(("tail", (validity, offsets, tail_offsets, values)))
            ends_at_fixed = False
    if ends_at_fixed:
        ok &= (reader.ends[places] - reader.starts[places]) == at
    if not ok.all():
        if ok.any():
            _decode_sliced(reader, group.subset(ok), out, fast)
        return  # the others: decode_entry, one by one
    arrays = []
    for (kind, parts), field in zip(layouts, group.schema, strict=True):
        if kind == "tail":
            validity, offsets, tail_offsets, values = parts
            starts = np.empty(n * rows + 1, dtype=np.int32)
            starts[:-1] = (offsets[:, :rows].astype(np.int64) + tail_offsets[:-1, None]).reshape(-1)
            starts[-1] = tail_offsets[-1]
            arrays.append(
                pa.Array.from_buffers(
                    field.type,
                    n * rows,
                    [_bitmap(validity), pa.py_buffer(starts), values],
                )
            )
        else:
            arrays.append(_array(reader, kind, parts, field.type, n * rows))
    _finish(group, arrays, out, fast)


def _finish(
    group: _Group, arrays: list[pa.Array], out: DecodedEntries, fast: npt.NDArray[np.bool_]
) -> None:
    batch = pa.RecordBatch.from_arrays(arrays, schema=group.schema)
    try:
        batch.validate(full=True)
    except (pa.ArrowException, ValueError):
        return  # decoded one by one: decode_entry names the damaged entry
    _record(group, batch, out, fast)


def _decode_gathered(
    reader: _Gather, group: _Group, out: DecodedEntries, fast: npt.NDArray[np.bool_]
) -> None:
    """Columns after a string or binary column: each column's place differs per entry, so every
    buffer is gathered by computed positions."""
    members, rows = group.members, group.rows
    n = len(members)
    ok = np.ones(n, dtype=np.bool_)
    pos = reader.starts[members] + _AT_DEFINITIONS + group.definitions_bytes
    ends = reader.ends[members]
    bitmap_bytes = (rows + 7) >> 3
    padding = rows & 7
    layouts: list[tuple[str, tuple[Any, ...]]] = []
    for type_name, has_validity in group.kinds:
        validity = None
        if has_validity:
            ok &= pos + bitmap_bytes <= ends
            raw_bits = reader.bytes_at(pos, bitmap_bytes)
            if padding:
                ok &= (raw_bits[:, -1] >> padding) == 0
            validity = np.unpackbits(raw_bits, axis=1, bitorder="little")[:, :rows].astype(bool)
            ok &= ~validity.all(axis=1)
            pos = pos + bitmap_bytes
        width = _FIXED_BYTES.get(type_name)
        if width is not None:
            ok &= pos + rows * width <= ends
            layouts.append(("fixed", (validity, reader.bytes_at(pos, rows * width))))
            pos = pos + rows * width
        elif type_name == "bool":
            ok &= pos + bitmap_bytes <= ends
            raw_bits = reader.bytes_at(pos, bitmap_bytes)
            if padding:
                ok &= (raw_bits[:, -1] >> padding) == 0
            values = np.unpackbits(raw_bits, axis=1, bitorder="little")[:, :rows].astype(bool)
            layouts.append(("bool", (validity, values)))
            pos = pos + bitmap_bytes
        else:
            ok &= pos + (rows + 1) * 4 <= ends
            offsets = _u32_matrix(reader, pos, rows + 1)
            ok &= offsets[:, 0] == 0
            total = offsets[:, rows].astype(np.int64)
            pos = pos + (rows + 1) * 4
            ok &= pos + total <= ends
            layouts.append(("variable", (validity, offsets, pos.copy(), total)))
            pos = pos + np.where(ok, total, 0)
    ok &= pos == ends
    if not ok.all():
        if ok.any():
            _decode_gathered(reader, group.subset(ok), out, fast)
        return
    arrays = [
        _array(reader, kind, parts, field.type, n * rows)
        for (kind, parts), field in zip(layouts, group.schema, strict=True)
    ]
    _finish(group, arrays, out, fast)


def _u32_matrix(reader: _Gather, pos: npt.NDArray[np.int64], count: int) -> npt.NDArray[np.uint32]:
    raw = np.ascontiguousarray(reader.bytes_at(pos, count * 4))
    return raw.view("<u4").reshape(len(pos), count)


def _array(
    reader: _Gather, kind: str, parts: tuple[Any, ...], arrow_type: pa.DataType, length: int
) -> pa.Array:
    if kind == "fixed":
        validity, values = parts
        buffers = [_bitmap(validity), pa.py_buffer(np.ascontiguousarray(values).tobytes())]
        return pa.Array.from_buffers(arrow_type, length, buffers)
    if kind == "bool":
        validity, values = parts
        return pa.Array.from_buffers(arrow_type, length, [_bitmap(validity), _bitmap(values)])
    validity, offsets, starts, totals = parts
    rows = offsets.shape[1] - 1
    bases = np.cumsum(totals) - totals
    global_offsets = np.empty(length + 1, dtype=np.int64)
    global_offsets[:-1] = (offsets[:, :rows].astype(np.int64) + bases[:, None]).reshape(length)
    global_offsets[-1] = int(totals.sum())
    assert global_offsets[-1] < 1 << 31  # decode_entries takes less than 2 GiB per call
    values = _gather_runs(reader.data, starts, totals)
    buffers = [
        _bitmap(validity),
        pa.py_buffer(global_offsets.astype(np.int32).tobytes()),
        pa.py_buffer(values.tobytes()),
    ]
    return pa.Array.from_buffers(arrow_type, length, buffers)


GATHER_BYTES_MAX = 4 * 2**20
"""Value bytes gathered per step by `_gather_runs`: its index takes 8 bytes per byte
gathered, so a step's index stays under 32 MiB (one run longer than this, at most an entry's
2 MiB, is one step), whatever a call's values add up to."""


RUN_WINDOW_BYTES_MAX = 64
"""Runs up to this long (each of a call) are gathered as rows of a sliding window, then the
bytes of each run kept (`_gather_runs`): a copy of at most 64 bytes and a mask of as many a
run, instead of an 8-byte index per byte gathered."""


def _gather_runs(
    data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint8]:
    """The runs `data[starts[i]:starts[i] + lengths[i]]` joined: short runs through one
    window (RUN_WINDOW_BYTES_MAX), others in steps of at most GATHER_BYTES_MAX bytes (or
    one run)."""
    if not len(lengths):
        return np.empty(0, dtype=np.uint8)
    longest = int(lengths.max())
    if longest <= RUN_WINDOW_BYTES_MAX:
        width = max(1, min(longest, len(data)))
        # A window starting past len(data) - width is moved back (the run then begins
        # `shift` bytes into its row).
        placed = np.minimum(starts, len(data) - width)
        rows = np.lib.stride_tricks.sliding_window_view(data, width)[placed]
        shift = (starts - placed)[:, None]
        columns = np.arange(width)
        keep = (columns >= shift) & (columns < shift + lengths[:, None])
        found: npt.NDArray[np.uint8] = rows[keep]
        return found
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    first = done = 0
    while first < len(lengths):
        stop = max(first + 1, int(np.searchsorted(ends, done + GATHER_BYTES_MAX, side="right")))
        step = lengths[first:stop]
        size = int(ends[stop - 1]) - done
        placed = ends[first:stop] - step - done  # where each run goes in this step
        index = np.repeat(starts[first:stop] - placed, step) + np.arange(size)
        out[done : done + size] = data[index]
        done += size
        first = stop
    return out


def _bitmap(bits: npt.NDArray[np.bool_] | None) -> pa.Buffer | None:
    if bits is None:
        return None
    return pa.py_buffer(np.packbits(bits.reshape(-1), bitorder="little").tobytes())


def _record(
    group: _Group, batch: pa.RecordBatch, out: DecodedEntries, fast: npt.NDArray[np.bool_]
) -> None:
    members, rows = group.members, group.rows
    head = _fields(group.matrix, 0, _IDS)
    table_ids = head["table_id"]
    block_ids = head["block_id"]
    offsets = head["offset"].astype(np.uint64)
    places = _places(members)
    out.kinds[places] = KIND_FAST
    out.is_txn[places] = True
    out.start_ts[places] = head["start_ts"]
    out.commit_ts[places] = head["commit_ts"]
    out.db_ids[places] = head["db_id"]
    out.memo[places] = head["memo"]
    fast[places] = True
    row_in_info = np.arange(rows, dtype=np.uint64)
    first_table = table_ids[0]
    # Most groups append to one table: one comparison instead of a sort or hash.
    one_table = bool((table_ids == first_table).all())
    for table_id in [int(first_table)] if one_table else np.unique(table_ids).tolist():
        if one_table:
            chosen_members, chosen_blocks, chosen_offsets = members, block_ids, offsets
            columns = batch
        else:
            chosen = np.flatnonzero(table_ids == table_id)
            chosen_members, chosen_blocks = members[chosen], block_ids[chosen]
            chosen_offsets = offsets[chosen]
            row_index = (chosen[:, None] * rows + np.arange(rows)).reshape(-1)
            columns = batch.take(arrow_array(row_index))
        out.tables.append(
            TableRows(
                table_id=int(table_id),
                entries=np.repeat(chosen_members, rows),
                block_ids=np.repeat(chosen_blocks, rows),
                offsets=(chosen_offsets[:, None] + row_in_info).reshape(-1),
                columns=columns,
            )
        )
