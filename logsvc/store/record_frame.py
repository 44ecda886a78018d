"""What the two byte formats of this directory share, written once: the segment file
(`records.py`) and the node journal (`journal_records.py`). FORMAT.md, "Shared by both
formats", is the specification; the golden vectors of both formats cover it.

Pure functions over bytes, no I/O. All integers little-endian; checksums XXH3-64 (seed 0).

    file_header (32 bytes):
        magic 8 bytes | version u16 | header_bytes u16 | flags u32 | number u64
        | checksum u64 = xxh3_64(bytes 0..24)
    record frame (a format's fields after `type`, then its body):
        checksum u64 = xxh3_64(bytes 8..end) | length u32 | type u8 | reserved 3 zero
        | the format's own fields | body[length]

`number` is what the file name says: a segment's first Raft index, a journal file's
file_seq. Type 0 is invalid in both, so zero-filled space never parses as a record.

A newest file's first bad record is a torn tail or corruption by one rule in both formats
(decision 0009, `logsvc/torn.py`): `bad_tail_verdict` applies it once each format has looked
past the bad record in its own way (a segment by index, the journal by offset) and read the
durability hints that follow.
"""

from __future__ import annotations

import struct
from collections.abc import Container
from typing import Any

import xxhash

from logsvc.torn import has_zero_sector, is_lost_page_rest

FILE_HEADER = struct.Struct("<8sHHIQ")  # magic, version, header_bytes, flags, number
CHECKSUM = struct.Struct("<Q")
FILE_HEADER_BYTES = FILE_HEADER.size + CHECKSUM.size
assert FILE_HEADER_BYTES == 32

TYPE_INVALID = 0  # zero-filled space never parses as a record (LevelDB's rule)
# The frame's fixed part after the checksum: length u32 at 8, type u8 at 12, 3 zero bytes.
_RESERVED_LO = 13
_RESERVED_HI = 16


class ScanCorruption(Exception):
    """Raised by the pure scans; the shell re-raises it as `Corruption` with the path."""

    def __init__(self, offset_bytes: int, reason: str) -> None:
        super().__init__(reason)
        self.offset_bytes = offset_bytes
        self.reason = reason


class TornHeader(Exception):
    """The newest file's header is not whole and nothing durable follows it: power was lost
    while the file was being created. Recovery deletes it."""


def xxh3(data: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def encode_file_header(magic: bytes, version: int, number: int) -> bytes:
    assert len(magic) == 8
    assert number >= 1
    body = FILE_HEADER.pack(magic, version, FILE_HEADER_BYTES, 0, number)
    return body + CHECKSUM.pack(xxh3(body))


def decode_file_header(
    data: bytes | memoryview, magic: bytes, version: int, noun: str
) -> int | str:
    """The `number` of a whole header, or the reason the header is not whole (`noun`, the
    file's kind, names it in the reason)."""
    if len(data) < FILE_HEADER_BYTES:
        return f"{noun} header is {len(data)} bytes, expected {FILE_HEADER_BYTES}"
    body = bytes(data[: FILE_HEADER.size])
    (checksum,) = CHECKSUM.unpack_from(data, FILE_HEADER.size)
    found_magic, found_version, header_bytes, flags, number = FILE_HEADER.unpack(body)
    if found_magic != magic:
        return f"bad {noun} magic {found_magic!r}"
    if checksum != xxh3(body):
        return f"{noun} header checksum mismatch"
    if found_version != version:
        return f"unknown {noun} format version {found_version} (this build reads {version})"
    if header_bytes != FILE_HEADER_BYTES or flags != 0 or number < 1:
        return f"{noun} header fields out of range"
    return int(number)


def encode_frame_into(out: bytearray, fields: bytes, body: bytes) -> int:
    """Append one record to `out`: the checksum of `fields` (packed by the format, starting
    with length and type) and `body`, then both; return the record's size in bytes."""
    digest = xxhash.xxh3_64(fields)
    digest.update(body)
    out += CHECKSUM.pack(digest.intdigest())
    out += fields
    out += body
    return CHECKSUM.size + len(fields) + len(body)


def parse_frame(
    data: bytes | memoryview,
    offset_bytes: int,
    fields: struct.Struct,
    types: Container[int],
    payload_bytes_max: int,
) -> tuple[Any, ...] | str:
    """The unpacked `fields` (length first, type second) of the whole record at
    `offset_bytes`, its checksum and reserved bytes checked; or the reason there is no whole
    record there. The format then checks its own fields."""
    header_bytes = CHECKSUM.size + fields.size
    available = len(data) - offset_bytes
    if available < header_bytes:
        return f"partial record header ({available} bytes)"
    (checksum,) = CHECKSUM.unpack_from(data, offset_bytes)
    values = fields.unpack_from(data, offset_bytes + CHECKSUM.size)
    length, rtype = values[0], values[1]
    if rtype == TYPE_INVALID:
        return "record type 0 (zeroed or unwritten space)"
    if rtype not in types:
        return f"unknown record type {rtype}"
    if length > payload_bytes_max:
        return f"record length {length} exceeds the limit {payload_bytes_max}"
    end = offset_bytes + header_bytes + length
    if end > len(data):
        return f"record of {length} bytes runs past the end of the file"
    if checksum != xxh3(data[offset_bytes + CHECKSUM.size : end]):
        return "record checksum mismatch"
    # The reserved bytes are covered by the checksum; struct's "3x" skips them, so check.
    reserved = bytes(data[offset_bytes + _RESERVED_LO : offset_bytes + _RESERVED_HI])
    if reserved != b"\0\0\0":
        return "reserved record bytes are not zero"
    return values


def bad_tail_verdict(
    data: bytes, bad_offset: int, reason: str, later: int | str | None, synced_past: str | None
) -> str:
    """The torn-versus-corrupt rule for the first bad record of a newest file, at
    `bad_offset` (`reason`: why it is bad). The format has looked past it: `later` is the
    offset of the first valid record after it, None when nothing valid follows, or why the
    search gave up; `synced_past` is what the hints of the valid records from `later` on say
    was synced at or past the bad record (None when they reach below it).

    Returns the reason to cut a torn tail with; raises `ScanCorruption` when the bad bytes
    were synced (or may have been): damage at rest, never cut."""
    if later is None:
        return reason  # nothing valid follows: a torn tail
    if isinstance(later, str):
        raise ScanCorruption(bad_offset, f"{reason}; {later}")
    if synced_past is not None:
        raise ScanCorruption(bad_offset, f"{reason}; {synced_past}")
    # Unsynced records follow: torn only if what lies between has the shape of lost pages.
    if not (has_zero_sector(data, bad_offset, later) or is_lost_page_rest(data, bad_offset, later)):
        raise ScanCorruption(bad_offset, f"{reason}; valid records follow the damaged bytes")
    return f"{reason} (unsynced pages lost; later unsynced records dropped)"
