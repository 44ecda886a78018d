"""Byte format of the node journal: file header, records, and the recovery scan of one file.

Pure functions over bytes, no I/O. The specification is the "Node journal" part of
`FORMAT.md` beside this file; golden vectors are in `tests/unit/store/golden/journal_*`.
The shell is `journal.py`; why the journal exists is docs/decisions/0011-shared-journal.md.

All integers are little-endian; checksums are XXH3-64 (seed 0), as in the segment format.

    journal_file := file_header record*
    file_header (32 bytes):
        magic "LOGSVJNL" | version u16 | header_bytes u16 | flags u32 | file_seq u64
        | checksum u64 = xxh3_64(bytes 0..24)
    record (48 + length bytes):
        checksum u64 = xxh3_64(bytes 8..48+length) | length u32 | type u8 | reserved 3 zero
        | store_id u32 | reserved u32 zero | synced_bytes u64 | a u64 | b u64 | body[length]

    type 1 ATTACH    store_id names a store for the rest of this file; body = its directory,
                     UTF-8, relative to the node data directory; a = b = 0
    type 2 ENTRY     a = raft index, b = term, body = the entry's payload
    type 3 VOTE      a = term, b = 1 if body holds voted_for (UTF-8) else 0
    type 4 TRUNCATE  a = raft index: the store's log was cut to end before it; b = 0

`synced_bytes` is a hint, as the segment records' `durable_index`: how many bytes of this
file were covered by a returned fdatasync when the record was encoded (always <= the
record's own offset). Recovery uses it to tell a torn tail from damaged synced bytes.

The file header, the record frame (checksum, length, type, reserved) and the torn-versus-
corrupt verdict are the segment format's too: `record_frame.py` holds them once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from logsvc.store import record_frame as frame

# Re-exported: the journal's readers (journal_recovery.py, doctor_journal.py) catch them here.
from logsvc.store.record_frame import ScanCorruption as ScanCorruption
from logsvc.store.record_frame import TornHeader as TornHeader

JOURNAL_MAGIC = b"LOGSVJNL"
JOURNAL_VERSION = 1
FILE_HEADER_BYTES = frame.FILE_HEADER_BYTES  # number = file_seq

RECORD_CHECKSUM = frame.CHECKSUM
RECORD_FIELDS = struct.Struct("<IB3xI4xQQQ")  # length, type, store_id, synced_bytes, a, b
RECORD_HEADER_BYTES = RECORD_CHECKSUM.size + RECORD_FIELDS.size
assert RECORD_HEADER_BYTES == 48

TYPE_INVALID = frame.TYPE_INVALID
TYPE_ATTACH = 1
TYPE_ENTRY = 2
TYPE_VOTE = 3
TYPE_TRUNCATE = 4
_TYPES = (TYPE_ATTACH, TYPE_ENTRY, TYPE_VOTE, TYPE_TRUNCATE)

STORE_PATH_BYTES_MAX = 4096  # an ATTACH body is a directory path (PATH_MAX)
VOTED_FOR_BYTES_MAX = 1024  # as meta.py
STORE_ID_MAX = 2**32 - 1

# How many candidate offsets after a bad record recovery tries before deciding that valid
# records may follow (and refusing to guess): bounds the scan of a damaged file.
RESYNC_CANDIDATES_MAX = 1 << 20


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One decoded record; `offset_bytes` is where it starts in its file."""

    offset_bytes: int
    rtype: int
    store_id: int
    synced_bytes: int
    a: int
    b: int
    body: bytes

    @property
    def end_bytes(self) -> int:
        return self.offset_bytes + RECORD_HEADER_BYTES + len(self.body)


def encode_file_header(file_seq: int) -> bytes:
    return frame.encode_file_header(JOURNAL_MAGIC, JOURNAL_VERSION, file_seq)


def decode_file_header(data: bytes | memoryview) -> int | str:
    """The file sequence number of a whole header, or why the header is not whole."""
    return frame.decode_file_header(data, JOURNAL_MAGIC, JOURNAL_VERSION, "journal")


def encode_record_into(
    out: bytearray,
    rtype: int,
    store_id: int,
    synced_bytes: int,
    a: int,
    b: int,
    body: bytes,
) -> int:
    """Append one encoded record to `out`; return its size in bytes."""
    assert rtype in _TYPES
    assert 0 <= store_id <= STORE_ID_MAX
    assert synced_bytes >= 0
    assert a >= 0
    assert b >= 0
    fields_ = RECORD_FIELDS.pack(len(body), rtype, store_id, synced_bytes, a, b)
    return frame.encode_frame_into(out, fields_, body)


def parse_record(
    data: bytes | memoryview, offset_bytes: int, payload_bytes_max: int
) -> JournalRecord | str:
    """The record at `offset_bytes`, or the reason there is no whole record there."""
    found = frame.parse_frame(data, offset_bytes, RECORD_FIELDS, _TYPES, payload_bytes_max)
    if isinstance(found, str):
        return found
    length, rtype, store_id, synced_bytes, a, b = found
    end = offset_bytes + RECORD_HEADER_BYTES + length
    # The second reserved field (after store_id) is the journal's own; `4x` skips it.
    if bytes(data[offset_bytes + 20 : offset_bytes + 24]) != bytes(4):
        return "reserved record bytes are not zero"
    if synced_bytes > offset_bytes:
        return "record synced_bytes hint is past the record itself"
    body = bytes(data[offset_bytes + RECORD_HEADER_BYTES : end])
    problem = _check_fields(rtype, a, b, body)
    if problem is not None:
        return problem
    return JournalRecord(offset_bytes, rtype, store_id, synced_bytes, a, b, body)


def _check_fields(rtype: int, a: int, b: int, body: bytes) -> str | None:
    if rtype == TYPE_ATTACH:
        if a or b or not body or len(body) > STORE_PATH_BYTES_MAX:
            return "ATTACH record fields out of range"
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return "ATTACH path is not UTF-8"
    elif rtype == TYPE_ENTRY:
        if a < 1:
            return "ENTRY record index is 0"
    elif rtype == TYPE_VOTE:
        if b not in (0, 1) or (b == 0 and body) or len(body) > VOTED_FOR_BYTES_MAX:
            return "VOTE record fields out of range"
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return "VOTE voted_for is not UTF-8"
    elif rtype == TYPE_TRUNCATE and (a < 1 or b or body):
        return "TRUNCATE record fields out of range"
    return None


@dataclass(frozen=True, slots=True)
class FileScan:
    """What recovery learned from one journal file's bytes."""

    file_seq: int
    records: tuple[JournalRecord, ...]
    end_bytes: int  # end of the last whole record: everything after it is cut
    torn_reason: str | None  # set when a torn tail was found (newest file only)


def scan_file(data: bytes, name_file_seq: int, *, newest: bool, payload_bytes_max: int) -> FileScan:
    """Validate every record of a journal file (decision 0009's torn-versus-corrupt rule).

    A sealed (not newest) file was fdatasynced before the next one was created, so any bad
    byte in it is corruption. In the newest file the first bad record starts a torn tail when
    nothing valid follows it; when a valid record follows whose `synced_bytes` hint passes the
    bad offset, the bad bytes had been synced: corruption; when valid records follow with a
    whole zeroed sector in between, the shape of unsynced pages that never reached the disk,
    those records were unsynced too and are cut with it; anything else is corruption.
    """
    header = decode_file_header(data)
    if isinstance(header, str):
        if newest and isinstance(parse_record(data, FILE_HEADER_BYTES, payload_bytes_max), str):
            raise TornHeader(header)
        raise ScanCorruption(0, header)
    if header != name_file_seq:
        raise ScanCorruption(
            0, f"header file_seq {header} does not match the file name ({name_file_seq})"
        )
    found: list[JournalRecord] = []
    offset = FILE_HEADER_BYTES
    while offset < len(data):
        record = parse_record(data, offset, payload_bytes_max)
        if isinstance(record, str):
            if not newest:
                raise ScanCorruption(offset, record)
            reason = _classify_bad_tail(data, offset, record, payload_bytes_max)
            return FileScan(header, tuple(found), offset, reason)
        found.append(record)
        offset = record.end_bytes
    return FileScan(header, tuple(found), offset, None)


def _classify_bad_tail(data: bytes, bad_offset: int, reason: str, payload_bytes_max: int) -> str:
    later = _find_later_record(data, bad_offset, payload_bytes_max)
    if not isinstance(later, JournalRecord):
        return frame.bad_tail_verdict(data, bad_offset, reason, later, None)
    hint = later.synced_bytes
    # Follow the chain: every whole record after the bad one says how much was synced.
    offset = later.end_bytes
    while offset < len(data):
        nxt = parse_record(data, offset, payload_bytes_max)
        if isinstance(nxt, str):
            break
        hint = max(hint, nxt.synced_bytes)
        offset = nxt.end_bytes
    synced_past = (
        f"a later record says {hint} bytes of the file were synced" if hint > bad_offset else None
    )
    return frame.bad_tail_verdict(data, bad_offset, reason, later.offset_bytes, synced_past)


def _find_later_record(
    data: bytes, bad_offset: int, payload_bytes_max: int
) -> JournalRecord | str | None:
    """The first whole record starting after `bad_offset`, None if there is none, or a
    reason string when the search gave up (too many candidates to rule one out)."""
    tried = 0
    for candidate in range(bad_offset + 1, len(data) - RECORD_HEADER_BYTES + 1):
        rtype = data[candidate + 12]
        if rtype not in _TYPES:
            continue
        tried += 1
        if tried > RESYNC_CANDIDATES_MAX:
            return "too many candidates to rule out valid records after it"
        record = parse_record(data, candidate, payload_bytes_max)
        if isinstance(record, JournalRecord):
            return record
    return None
