"""Byte formats of the shard store: segment header, entry record, and the recovery scan.

Pure functions over bytes, no I/O. `FORMAT.md` beside this file is the specification, with a
worked example and every crash case; `tests/unit/store/golden/` holds the golden vectors.

All integers are little-endian. Checksums are XXH3-64 (seed 0).

    segment   := segment_header record*
    segment_header (32 bytes):
        magic "LOGSVSEG" | version u16 | header_bytes u16 | flags u32 | first_index u64
        | checksum u64 = xxh3_64(bytes 0..24)
    record (40 + length bytes):
        checksum u64 = xxh3_64(bytes 8..40+length) | length u32 | type u8 | reserved 3 zero
        | index u64 | term u64 | durable_index u64 | payload[length]

`durable_index` is a hint: the highest index known durable when the record was encoded.
Recovery uses it to tell a torn tail (only unsynced bytes damaged) from corruption of
synced bytes (see `scan_segment`).

The file header, the record frame (checksum, length, type, reserved) and the torn-versus-
corrupt verdict are the node journal's too: `record_frame.py` holds them once.
"""

from __future__ import annotations

import array
import struct
from dataclasses import dataclass, field

from logsvc.store import record_frame as frame

# Re-exported: the segment format's names for what `record_frame` holds (meta.py, the shard
# snapshot file and the readers of this module use them from here).
from logsvc.store.record_frame import ScanCorruption as ScanCorruption
from logsvc.store.record_frame import TornHeader as TornHeader
from logsvc.store.record_frame import xxh3 as xxh3

SEGMENT_MAGIC = b"LOGSVSEG"
SEGMENT_VERSION = 1
SEGMENT_HEADER_BYTES = frame.FILE_HEADER_BYTES  # number = first_index

RECORD_CHECKSUM = frame.CHECKSUM
RECORD_FIELDS = struct.Struct("<IB3xQQQ")  # length, type, reserved, index, term, durable_index
RECORD_HEADER_BYTES = RECORD_CHECKSUM.size + RECORD_FIELDS.size
assert RECORD_HEADER_BYTES == 40

RECORD_TYPE_INVALID = frame.TYPE_INVALID
RECORD_TYPE_ENTRY = 1
_RECORD_TYPES = (RECORD_TYPE_ENTRY,)

# Hard format limits (configurable limits in limits.py must stay below them).
PAYLOAD_BYTES_LIMIT = 256 * 1024 * 1024  # length is u32; keep it well below 4 GiB
SEGMENT_BYTES_LIMIT = 2**32 - 1  # offsets are kept in 32-bit arrays

# Recovery: how far past a bad record to look for a later valid one, and how many candidate
# positions to try before deciding conservatively (see scan_segment).
RESYNC_INDEXES_AHEAD = 8
RESYNC_CANDIDATES_MAX = 4096


@dataclass(frozen=True, slots=True)
class Entry:
    """One Raft log entry as the store holds it."""

    index: int
    term: int
    payload: bytes


def encode_segment_header(first_index: int) -> bytes:
    return frame.encode_file_header(SEGMENT_MAGIC, SEGMENT_VERSION, first_index)


def decode_segment_header(data: bytes | memoryview) -> int | str:
    """The first index of a whole header, or the reason the header is not whole."""
    return frame.decode_file_header(data, SEGMENT_MAGIC, SEGMENT_VERSION, "segment")


def encode_record_into(
    out: bytearray, index: int, term: int, durable_index: int, payload: bytes
) -> int:
    """Append one encoded record to `out`; return its size in bytes."""
    assert index >= 1
    assert term >= 0
    assert 0 <= durable_index < index
    assert len(payload) <= PAYLOAD_BYTES_LIMIT
    fields_ = RECORD_FIELDS.pack(len(payload), RECORD_TYPE_ENTRY, index, term, durable_index)
    return frame.encode_frame_into(out, fields_, payload)


def encode_record(index: int, term: int, durable_index: int, payload: bytes) -> bytes:
    out = bytearray()
    encode_record_into(out, index, term, durable_index, payload)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class RecordView:
    """A whole record found at `offset_bytes` of a buffer."""

    offset_bytes: int
    index: int
    term: int
    durable_index: int
    payload_offset_bytes: int
    length: int

    @property
    def end_bytes(self) -> int:
        return self.payload_offset_bytes + self.length


def parse_record(
    data: bytes | memoryview, offset_bytes: int, payload_bytes_max: int
) -> RecordView | str:
    """The record at `offset_bytes`, or the reason there is no whole record there."""
    found = frame.parse_frame(data, offset_bytes, RECORD_FIELDS, _RECORD_TYPES, payload_bytes_max)
    if isinstance(found, str):
        return found
    length, _, index, term, durable_index = found
    if durable_index >= index:
        return "record durable_index is not below its index"
    return RecordView(
        offset_bytes, index, term, durable_index, offset_bytes + RECORD_HEADER_BYTES, length
    )


@dataclass(slots=True)
class SegmentScan:
    """What recovery learned from one segment file's bytes."""

    first_index: int
    offsets: array.array[int] = field(default_factory=lambda: array.array("I"))
    term_runs: list[tuple[int, int]] = field(default_factory=list)  # (first_index, term)
    end_bytes: int = SEGMENT_HEADER_BYTES  # end of the last whole record
    torn_reason: str | None = None  # set when a torn tail was found (newest segment only)
    torn_records_dropped: int = 0  # whole records after a power-loss hole, also dropped
    # Zeros from the end of the last record to the end of the file (newest segment only):
    # the store's zero-ahead space (FORMAT.md "Zero-ahead"), cut on open without a warning.
    zero_tail_bytes: int = 0

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.offsets) - 1


def scan_segment(
    data: bytes, name_first_index: int, *, newest: bool, payload_bytes_max: int
) -> SegmentScan:
    """Validate every record of a segment and index it.

    In a sealed (not newest) segment every byte must be whole: the store fsyncs a segment
    before it creates the next one, so any bad byte there is corruption.

    In the newest segment, the first bad record starts either a torn tail (bytes that were
    never synced, cut by a power loss) or corruption of synced bytes. They are told apart by
    what follows the bad record:

    * nothing valid follows: a torn tail, cut;
    * a later valid record's durable_index reaches the bad record's index: the bad record
      had been synced when that later one was written, so this is corruption;
    * valid records follow and the damaged span holds a whole zeroed sector: the shape of
      unsynced pages that never reached the disk (ext4 delayed allocation); those later
      records were unsynced too (their durable hints say so), so the tail is cut there;
    * otherwise (garbage in the middle, no zeroed sector): corruption.
    """
    header = decode_segment_header(data)
    if isinstance(header, str):
        if newest and not _record_follows_header(data, name_first_index, payload_bytes_max):
            raise TornHeader(header)
        raise ScanCorruption(0, header)
    if header != name_first_index:
        raise ScanCorruption(
            0, f"header first index {header} does not match file name ({name_first_index})"
        )
    scan = SegmentScan(first_index=header)
    offset = SEGMENT_HEADER_BYTES
    expected_index = header
    last_term = -1
    while offset < len(data):
        record = parse_record(data, offset, payload_bytes_max)
        if isinstance(record, RecordView) and record.index != expected_index:
            record = f"record index {record.index}, expected {expected_index}"
        if isinstance(record, RecordView) and record.term < last_term:
            record = f"record term {record.term} is below the previous term {last_term}"
        if isinstance(record, str):
            if not newest:
                raise ScanCorruption(offset, record)
            if is_zero_tail(data, offset):
                scan.zero_tail_bytes = len(data) - offset
                break
            _classify_bad_tail(data, offset, expected_index, record, payload_bytes_max, scan)
            break
        scan.offsets.append(offset)
        if record.term != last_term:
            scan.term_runs.append((record.index, record.term))
            last_term = record.term
        offset = record.end_bytes
        expected_index += 1
        scan.end_bytes = offset
    return scan


def is_zero_tail(data: bytes | memoryview, offset_bytes: int) -> bool:
    """Whether every byte from `offset_bytes` (a record boundary) to the end is zero: the
    zero-ahead space of a live newest segment. Unsynced records whose pages never reached
    the disk look the same; either way nothing there was acknowledged, and it is cut."""
    assert 0 <= offset_bytes <= len(data)
    return offset_bytes < len(data) and not bytes(data[offset_bytes:]).lstrip(b"\0")


def _record_follows_header(data: bytes, first_index: int, payload_bytes_max: int) -> bool:
    found = parse_record(data, SEGMENT_HEADER_BYTES, payload_bytes_max)
    return isinstance(found, RecordView) and found.index == first_index


def _classify_bad_tail(
    data: bytes,
    bad_offset: int,
    bad_index: int,
    reason: str,
    payload_bytes_max: int,
    scan: SegmentScan,
) -> None:
    later = _find_later_record(data, bad_offset, bad_index, payload_bytes_max)
    synced_past = None
    chain_count = 0
    if isinstance(later, RecordView):
        chain_hint, chain_count = _follow_chain(data, later, payload_bytes_max)
        if chain_hint >= bad_index:
            synced_past = f"a later record says entries up to {chain_hint} were durable"
    later_at = later.offset_bytes if isinstance(later, RecordView) else later
    scan.torn_reason = frame.bad_tail_verdict(data, bad_offset, reason, later_at, synced_past)
    scan.torn_records_dropped = chain_count


def _find_later_record(
    data: bytes, bad_offset: int, bad_index: int, payload_bytes_max: int
) -> RecordView | str | None:
    """A valid record after `bad_offset` with an index in (bad_index, bad_index + 8], found
    by searching for the packed index field; bounded in candidates tried (past the bound:
    why the search gave up)."""
    tried = 0
    for index in range(bad_index + 1, bad_index + 1 + RESYNC_INDEXES_AHEAD):
        needle = struct.pack("<Q", index)
        position = data.find(needle, bad_offset + 1 + 16)
        while position != -1:
            tried += 1
            if tried > RESYNC_CANDIDATES_MAX:
                return "too many candidates to rule out data after it"
            candidate = parse_record(data, position - 16, payload_bytes_max)
            if isinstance(candidate, RecordView) and candidate.index == index:
                return candidate
            position = data.find(needle, position + 1)
    return None


def _follow_chain(data: bytes, first: RecordView, payload_bytes_max: int) -> tuple[int, int]:
    """The highest durable hint and the count of consecutive valid records from `first`."""
    hint = first.durable_index
    count = 1
    record: RecordView | str = first
    while isinstance(record, RecordView) and record.end_bytes < len(data):
        following = parse_record(data, record.end_bytes, payload_bytes_max)
        if not isinstance(following, RecordView) or following.index != record.index + 1:
            break
        hint = max(hint, following.durable_index)
        count += 1
        record = following
    return hint, count


def read_records(
    data: bytes, base_offset_bytes: int, first_index: int, count: int, payload_bytes_max: int
) -> list[Entry] | tuple[int, str]:
    """Decode `count` consecutive records from `data` (read from file offset
    `base_offset_bytes`), verifying each checksum and index again after the read. Returns
    the entries, or (file offset, reason) of the first bad one."""
    entries: list[Entry] = []
    offset = 0
    for index in range(first_index, first_index + count):
        record = parse_record(data, offset, payload_bytes_max)
        if isinstance(record, RecordView) and record.index != index:
            record = f"record index {record.index}, expected {index}"
        if isinstance(record, str):
            return base_offset_bytes + offset, record
        payload = bytes(data[record.payload_offset_bytes : record.end_bytes])
        entries.append(Entry(index, record.term, payload))
        offset = record.end_bytes
    return entries


# ------------------------------------------------------------------ offline reading


@dataclass(frozen=True, slots=True)
class SegmentRecords:
    """Every whole record of one segment file, read offline (`read_segment_records`), and
    how the file ends. Readers outside the store (the Spark jobs, issue 16) use this instead
    of opening a `ShardStore`, which takes the directory lock and repairs files."""

    first_index: int
    records: tuple[RecordView, ...]
    checksums: tuple[int, ...]  # each record's stored checksum field, in the same order
    end: str  # END_CLEAN, END_TORN (what recovery would cut) or END_CORRUPT
    end_offset_bytes: int  # where the whole records stop
    end_reason: str | None  # why they stop, unless END_CLEAN


END_CLEAN = "clean"
END_TORN = "torn"
END_CORRUPT = "corrupt"


def read_segment_records(
    data: bytes,
    name_first_index: int,
    *,
    newest: bool,
    payload_bytes_max: int = PAYLOAD_BYTES_LIMIT,
    verify: bool = True,
) -> SegmentRecords:
    """The records of a segment file's bytes, without raising on damage.

    `verify=True` decides exactly as recovery does (`scan_segment`: every checksum, dense
    indexes, the torn-tail rules of the newest segment); damage it would refuse is reported
    as END_CORRUPT at its offset, with every whole record before it. `verify=False` walks the
    record headers without computing checksums (a listing), and stops at the first header
    that cannot be a record: END_TORN in the newest segment, END_CORRUPT in a sealed one."""
    if not verify:
        return _walk_headers(data, name_first_index, newest, payload_bytes_max)
    try:
        scan = scan_segment(
            data, name_first_index, newest=newest, payload_bytes_max=payload_bytes_max
        )
    except TornHeader as torn:
        return SegmentRecords(name_first_index, (), (), END_TORN, 0, str(torn))
    except ScanCorruption as bad:
        views: list[RecordView] = []
        checksums: list[int] = []
        if bad.offset_bytes > 0:  # the records before the damage are whole
            offset = SEGMENT_HEADER_BYTES
            while offset < bad.offset_bytes:
                record = parse_record(data, offset, payload_bytes_max)
                assert isinstance(record, RecordView)  # scan_segment accepted it
                views.append(record)
                checksums.append(RECORD_CHECKSUM.unpack_from(data, offset)[0])
                offset = record.end_bytes
        return SegmentRecords(
            name_first_index,
            tuple(views),
            tuple(checksums),
            END_CORRUPT,
            bad.offset_bytes,
            bad.reason,
        )
    views = [_view_at(data, offset) for offset in scan.offsets]
    checksums = [RECORD_CHECKSUM.unpack_from(data, offset)[0] for offset in scan.offsets]
    if scan.torn_reason is not None:
        return SegmentRecords(
            scan.first_index,
            tuple(views),
            tuple(checksums),
            END_TORN,
            scan.end_bytes,
            scan.torn_reason,
        )
    return SegmentRecords(
        scan.first_index, tuple(views), tuple(checksums), END_CLEAN, scan.end_bytes, None
    )


def _view_at(data: bytes | memoryview, offset_bytes: int) -> RecordView:
    """The fields of a record already validated by `scan_segment` (no checksum again)."""
    length, _, index, term, durable_index = RECORD_FIELDS.unpack_from(
        data, offset_bytes + RECORD_CHECKSUM.size
    )
    return RecordView(
        offset_bytes, index, term, durable_index, offset_bytes + RECORD_HEADER_BYTES, length
    )


def _walk_headers(
    data: bytes, name_first_index: int, newest: bool, payload_bytes_max: int
) -> SegmentRecords:
    header = decode_segment_header(data)
    stop = END_TORN if newest else END_CORRUPT
    if isinstance(header, str):
        return SegmentRecords(name_first_index, (), (), stop, 0, header)
    if header != name_first_index:
        mismatch = f"header first index {header} does not match file name ({name_first_index})"
        return SegmentRecords(name_first_index, (), (), END_CORRUPT, 0, mismatch)
    views: list[RecordView] = []
    checksums: list[int] = []
    offset = SEGMENT_HEADER_BYTES
    expected_index = header
    reason: str | None = None
    while offset < len(data):
        if len(data) - offset < RECORD_HEADER_BYTES:
            reason = f"partial record header ({len(data) - offset} bytes)"
            break
        (checksum,) = RECORD_CHECKSUM.unpack_from(data, offset)
        length, rtype, index, _, _ = RECORD_FIELDS.unpack_from(data, offset + 8)
        if rtype != RECORD_TYPE_ENTRY or length > payload_bytes_max:
            reason = f"record type {rtype}, length {length}: not a record header"
            break
        if offset + RECORD_HEADER_BYTES + length > len(data):
            reason = f"record of {length} bytes runs past the end of the file"
            break
        if index != expected_index:
            reason = f"record index {index}, expected {expected_index}"
            break
        view = _view_at(data, offset)
        views.append(view)
        checksums.append(checksum)
        offset = view.end_bytes
        expected_index += 1
    if reason is not None and newest and is_zero_tail(data, offset):
        reason = None  # zero-ahead space (FORMAT.md "Zero-ahead"): the records end here
    end = END_CLEAN if reason is None else stop
    return SegmentRecords(header, tuple(views), tuple(checksums), end, offset, reason)
