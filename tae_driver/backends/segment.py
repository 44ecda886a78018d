"""The file backend's on-disk format: segment headers and frames (pure; layout in FORMAT.md).

Why (shared/STYLE.md, LevelDB `log_format.md`, LogCabin `SegmentedLog`, ARCHITECTURE.md §3):
every file starts with a magic number and a version; every frame has a length, a type (0 is
invalid, so zero-filled space never parses) and an XXH3 checksum over everything after the
checksum. A frame is either a RECORD (one appended payload at a dense LSN) or a TRUNCATE
marker (the truncated LSN, so the truncation point survives a restart without a second file).

`scan_segment` decides what a damaged file means:

* a bad frame in the newest segment within `FILE_TORN_TAIL_BYTES_MAX` of its end is a torn
  tail (the last group write never finished its fsync, so nothing in it was acknowledged):
  the scan stops there and the caller cuts the file back;
* any other bad frame, any bad header, and any frame whose checksum is right but whose
  content is wrong (an LSN out of sequence) is `StorageCorruption(path, offset, reason)`:
  reported, never skipped.
"""

from __future__ import annotations

import enum
import struct
from array import array
from dataclasses import dataclass, field

from tae_driver import limits
from tae_driver.checksum import xxh3_64
from tae_driver.errors import StorageCorruption

SEGMENT_MAGIC = b"TDWALSEG"
SEGMENT_VERSION = 1

_SEGMENT_HEADER = struct.Struct("<8sHHIQQ")
assert _SEGMENT_HEADER.size == limits.FILE_SEGMENT_HEADER_BYTES
_FRAME_HEADER = struct.Struct("<QIB3sQ")
assert _FRAME_HEADER.size == limits.FILE_FRAME_HEADER_BYTES

FRAME_BODY_BYTES_MAX = limits.BACKEND_PAYLOAD_BYTES_MAX


class FrameType(enum.IntEnum):
    INVALID = 0
    RECORD = 1
    TRUNCATE = 2


def segment_file_name(base_lsn: int) -> str:
    return f"wal-{base_lsn:020d}.seg"


def parse_segment_file_name(name: str) -> int | None:
    """The base LSN encoded in a segment file name, or None if `name` is not one."""
    if not (name.startswith("wal-") and name.endswith(".seg")):
        return None
    digits = name[4:-4]
    if len(digits) != 20 or not digits.isdigit():
        return None
    return int(digits)


def encode_segment_header(base_lsn: int) -> bytes:
    assert base_lsn >= 1
    unsealed = _SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_VERSION, 0, 0, base_lsn, 0)[:24]
    return unsealed + struct.pack("<Q", xxh3_64(unsealed))


def encode_frame(frame_type: FrameType, lsn: int, body: bytes = b"") -> bytes:
    assert frame_type in (FrameType.RECORD, FrameType.TRUNCATE)
    assert lsn >= 1
    assert len(body) <= FRAME_BODY_BYTES_MAX
    assert frame_type is FrameType.RECORD or not body
    unsealed = _FRAME_HEADER.pack(0, len(body), frame_type, b"\0\0\0", lsn)[8:] + body
    return struct.pack("<Q", xxh3_64(unsealed)) + unsealed


@dataclass(frozen=True, slots=True)
class Frame:
    frame_type: FrameType
    lsn: int
    body: bytes
    size_bytes: int


class _BadFrame(Exception):
    """Internal: structurally bad bytes at an offset (may be a torn write)."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


def decode_segment_header(data: bytes, path: str) -> int:
    """The base LSN of a segment whose first bytes are `data`."""
    if len(data) < limits.FILE_SEGMENT_HEADER_BYTES:
        raise StorageCorruption(path, 0, "segment header is short")
    magic, version, flags, reserved, base_lsn, checksum = _SEGMENT_HEADER.unpack_from(data, 0)
    if checksum != xxh3_64(data[:24]):
        raise StorageCorruption(path, 24, "segment header checksum mismatch")
    if magic != SEGMENT_MAGIC:
        raise StorageCorruption(path, 0, "not a segment file (bad magic)")
    if version != SEGMENT_VERSION:
        raise StorageCorruption(path, 8, f"unknown segment version {version}")
    if flags != 0 or reserved != 0 or base_lsn < 1:
        raise StorageCorruption(path, 10, "bad segment header fields")
    return int(base_lsn)


def decode_frame(data: bytes | memoryview, offset: int, *, verify_checksum: bool = True) -> Frame:
    """The frame at `offset`; raises `_BadFrame` when the bytes there are not a whole frame.
    `verify_checksum=False` (offline listings only) trusts the checksum without computing it."""
    remaining = len(data) - offset
    if remaining < limits.FILE_FRAME_HEADER_BYTES:
        raise _BadFrame(offset, "short frame header")
    checksum, body_bytes, raw_type, reserved, lsn = _FRAME_HEADER.unpack_from(data, offset)
    if body_bytes > FRAME_BODY_BYTES_MAX:
        raise _BadFrame(offset, f"frame length {body_bytes} too large")
    end = offset + limits.FILE_FRAME_HEADER_BYTES + body_bytes
    if end > len(data):
        raise _BadFrame(offset, "frame runs past the end of the file")
    if verify_checksum and checksum != xxh3_64(memoryview(data)[offset + 8 : end]):
        raise _BadFrame(offset, "frame checksum mismatch")
    if raw_type not in (FrameType.RECORD, FrameType.TRUNCATE):
        raise _BadFrame(offset, f"invalid frame type {raw_type}")
    if reserved != b"\0\0\0":
        raise _BadFrame(offset, "reserved frame bytes are not zero")
    body = bytes(data[offset + limits.FILE_FRAME_HEADER_BYTES : end])
    return Frame(FrameType(raw_type), int(lsn), body, end - offset)


@dataclass(slots=True)
class SegmentScan:
    base_lsn: int
    record_offsets: array[int] = field(default_factory=lambda: array("Q"))
    record_frame_bytes: array[int] = field(default_factory=lambda: array("Q"))
    truncate_lsn_max: int = 0
    valid_bytes: int = 0
    torn_offset: int | None = None
    torn_reason: str = ""

    @property
    def record_count(self) -> int:
        return len(self.record_offsets)

    @property
    def last_lsn(self) -> int:
        """LSN of the last record; base_lsn - 1 when the segment holds none."""
        return self.base_lsn + len(self.record_offsets) - 1


def scan_segment(data: bytes, path: str, *, newest: bool) -> SegmentScan:
    """Index a whole segment file. See the module doc for what damage means."""
    base_lsn = decode_segment_header(data, path)
    scan = SegmentScan(base_lsn)
    offset = limits.FILE_SEGMENT_HEADER_BYTES
    next_lsn = base_lsn
    while offset < len(data):
        try:
            frame = decode_frame(data, offset)
        except _BadFrame as bad:
            if newest and len(data) - bad.offset <= limits.FILE_TORN_TAIL_BYTES_MAX:
                scan.torn_offset = bad.offset
                scan.torn_reason = bad.reason
                break
            raise StorageCorruption(path, bad.offset, bad.reason) from None
        if frame.frame_type is FrameType.RECORD:
            if frame.lsn != next_lsn:
                raise StorageCorruption(
                    path, offset, f"record LSN {frame.lsn}, expected {next_lsn}"
                )
            scan.record_offsets.append(offset)
            scan.record_frame_bytes.append(frame.size_bytes)
            next_lsn += 1
        else:
            if frame.lsn >= next_lsn:
                raise StorageCorruption(path, offset, f"truncate at {frame.lsn} past the log")
            scan.truncate_lsn_max = max(scan.truncate_lsn_max, frame.lsn)
        offset += frame.size_bytes
    scan.valid_bytes = offset if scan.torn_offset is None else scan.torn_offset
    return scan


def decode_records_in(
    data: bytes, path: str, file_offset: int, first_lsn: int, count: int
) -> list[tuple[int, bytes]]:
    """Decode `count` RECORD frames starting at LSN `first_lsn` from `data`, which holds the
    file's bytes from `file_offset` on; TRUNCATE frames between them are skipped. Any damage
    here is corruption: these bytes were durable and checked when the file was opened."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    expected = first_lsn
    while len(out) < count:
        try:
            frame = decode_frame(data, offset)
        except _BadFrame as bad:
            raise StorageCorruption(path, file_offset + bad.offset, bad.reason) from None
        if frame.frame_type is FrameType.RECORD:
            if frame.lsn != expected:
                raise StorageCorruption(
                    path, file_offset + offset, f"record LSN {frame.lsn}, expected {expected}"
                )
            out.append((frame.lsn, frame.body))
            expected += 1
        offset += frame.size_bytes
    return out


# ------------------------------------------------------------------ offline reading

END_CLEAN = "clean"
END_TORN = "torn"
END_CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class FrameAt:
    """One whole frame of a segment file, where it starts, and its stored checksum."""

    offset: int
    frame: Frame
    checksum: int


@dataclass(frozen=True, slots=True)
class SegmentFrames:
    """Every whole frame of one segment file read offline (`read_segment_frames`), and how
    the file ends: END_CLEAN, END_TORN (a tail the backend's open would cut) or END_CORRUPT
    (damage the open would refuse with `StorageCorruption`)."""

    base_lsn: int
    frames: tuple[FrameAt, ...]
    end: str
    end_offset: int
    end_reason: str | None


def read_segment_frames(
    data: bytes, path: str, *, newest: bool, verify: bool = True
) -> SegmentFrames:
    """The frames of a segment file's bytes, read-only and without raising on damage after
    the header (a bad header still raises `StorageCorruption`): readers outside the backend
    (the Spark jobs, issue 16) use it instead of opening a `FileBackend`, which locks the
    directory and cuts torn tails. The rules are `scan_segment`'s; `verify=False` skips the
    frame checksums (a listing), so damage then shows only as a frame that cannot parse."""
    base_lsn = decode_segment_header(data, path)
    frames: list[FrameAt] = []
    offset = limits.FILE_SEGMENT_HEADER_BYTES
    next_lsn = base_lsn
    while offset < len(data):
        try:
            frame = decode_frame(data, offset, verify_checksum=verify)
        except _BadFrame as bad:
            torn = newest and len(data) - bad.offset <= limits.FILE_TORN_TAIL_BYTES_MAX
            end = END_TORN if torn else END_CORRUPT
            return SegmentFrames(base_lsn, tuple(frames), end, bad.offset, bad.reason)
        if frame.frame_type is FrameType.RECORD:
            if frame.lsn != next_lsn:
                reason = f"record LSN {frame.lsn}, expected {next_lsn}"
                return SegmentFrames(base_lsn, tuple(frames), END_CORRUPT, offset, reason)
            next_lsn += 1
        elif frame.lsn >= next_lsn:
            reason = f"truncate at {frame.lsn} past the log"
            return SegmentFrames(base_lsn, tuple(frames), END_CORRUPT, offset, reason)
        (checksum,) = struct.unpack_from("<Q", data, offset)
        frames.append(FrameAt(offset, frame, checksum))
        offset += frame.size_bytes
    return SegmentFrames(base_lsn, tuple(frames), END_CLEAN, offset, None)
