"""The file backend's on-disk format: segment headers and frames (pure; layout in FORMAT.md).

Why (shared/STYLE.md, LevelDB `log_format.md`, LogCabin `SegmentedLog`, ARCHITECTURE.md §3):
every file starts with a magic number and a version; every frame has a length, a type (0 is
invalid, so zero-filled space never parses) and an XXH3 checksum over everything after the
checksum. A frame is either a RECORD (one appended payload at a dense LSN) or a TRUNCATE
marker (the truncated LSN, so the truncation point survives a restart without a second file).

`classify_bad_frame` decides what a damaged file means (ARCHITECTURE.md §11; the shared
power-loss model is `logsvc/torn.py`; the table is in FORMAT.md). Only bytes that could never
have been acknowledged are a torn tail, cut on open: the first bad frame lies in the newest
segment, within one group write (`FILE_TORN_TAIL_BYTES_MAX`) of its end, no valid frame
follows it, and the damage has the shape a power loss leaves (the file ends inside a frame,
or the tail is zero-filled). Everything else is `StorageCorruption(path, offset, reason,
lsn_lo, lsn_hi)`: reported, never skipped, nothing changed. In particular a bad frame
followed by valid frames is corruption (v1 frames carry no durable-LSN hint, so nothing
proves the later frames were not acknowledged), and so is a frame that is whole to the end
of the file with non-zero damage (a flipped byte; it may have been acknowledged).
"""

from __future__ import annotations

import enum
import struct
from array import array
from dataclasses import dataclass, field

from logsvc.torn import is_zero_filled_tail
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


class BadFrame(Exception):
    """Structurally bad bytes at an offset (a torn write or corruption: `classify_bad_frame`
    decides). Raised by `decode_frame`; never leaves this package."""

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
    """The frame at `offset`; raises `BadFrame` when the bytes there are not a whole frame.
    `verify_checksum=False` (offline listings only) trusts the checksum without computing it."""
    remaining = len(data) - offset
    if remaining < limits.FILE_FRAME_HEADER_BYTES:
        raise BadFrame(offset, "short frame header")
    checksum, body_bytes, raw_type, reserved, lsn = _FRAME_HEADER.unpack_from(data, offset)
    if body_bytes > FRAME_BODY_BYTES_MAX:
        raise BadFrame(offset, f"frame length {body_bytes} too large")
    end = offset + limits.FILE_FRAME_HEADER_BYTES + body_bytes
    if end > len(data):
        raise BadFrame(offset, "frame runs past the end of the file")
    if verify_checksum and checksum != xxh3_64(memoryview(data)[offset + 8 : end]):
        raise BadFrame(offset, "frame checksum mismatch")
    if raw_type not in (FrameType.RECORD, FrameType.TRUNCATE):
        raise BadFrame(offset, f"invalid frame type {raw_type}")
    if reserved != b"\0\0\0":
        raise BadFrame(offset, "reserved frame bytes are not zero")
    body = bytes(data[offset + limits.FILE_FRAME_HEADER_BYTES : end])
    return Frame(FrameType(raw_type), int(lsn), body, end - offset)


# How far past a bad frame to look for a later valid RECORD (its LSN within this many of the
# next expected one), and how many candidate positions to try before deciding conservatively
# (corruption). The shard store looks 8 indexes ahead (logsvc/store/records.py); here more,
# because a damaged span with no valid frame found after it may be cut: 128 frames is more
# than a 4 KiB page of the smallest frames (a 24-byte header and a ~40-byte driver record).
# The search runs only when a frame is bad: at most 128 `find`s over the last 6 MiB.
RESYNC_LSNS_AHEAD = 128
RESYNC_CANDIDATES_MAX = 4096


@dataclass(frozen=True, slots=True)
class BadFrameVerdict:
    """What the first bad frame of a segment means. `torn`: cut the file at `offset`.
    Otherwise corruption, and `lsn_found_max` is the highest LSN found whole after the
    damage in this file (`expected_lsn - 1` when none was found)."""

    offset: int
    torn: bool
    reason: str
    expected_lsn: int
    lsn_found_max: int


class Undecided:
    pass


_UNDECIDED = Undecided()


def find_later_record(
    data: bytes, bad_offset: int, expected_lsn: int
) -> tuple[int, Frame] | Undecided | None:
    """A valid RECORD after `bad_offset` with an LSN in [expected, expected + 8), found by
    searching for the packed LSN field (frame offset 16); bounded in candidates tried."""
    tried = 0
    for lsn in range(expected_lsn, expected_lsn + RESYNC_LSNS_AHEAD):
        needle = struct.pack("<Q", lsn)
        position = data.find(needle, bad_offset + 1 + 16)
        while position != -1:
            tried += 1
            if tried > RESYNC_CANDIDATES_MAX:
                return _UNDECIDED
            try:
                frame = decode_frame(data, position - 16)
            except BadFrame:
                pass
            else:
                if frame.frame_type is FrameType.RECORD and frame.lsn == lsn:
                    return position - 16, frame
            position = data.find(needle, position + 1)
    return None


def _last_chained_lsn(data: bytes, offset: int, frame: Frame) -> int:
    """The LSN of the last RECORD in the run of valid frames starting with `frame`."""
    lsn = frame.lsn
    offset += frame.size_bytes
    while offset < len(data):
        try:
            following = decode_frame(data, offset)
        except BadFrame:
            break
        if following.frame_type is FrameType.RECORD:
            if following.lsn != lsn + 1:
                break
            lsn = following.lsn
        offset += following.size_bytes
    return lsn


def _whole_with_bad_length(data: bytes, offset: int) -> bool:
    """Whether the frame at `offset` is whole to the end of the file with only its length
    field damaged: the checksum holds once the length is set to what is left."""
    body_bytes = len(data) - offset - limits.FILE_FRAME_HEADER_BYTES
    if not 0 <= body_bytes <= FRAME_BODY_BYTES_MAX:
        return False
    (checksum,) = struct.unpack_from("<Q", data, offset)
    fixed = struct.pack("<I", body_bytes) + data[offset + 12 :]
    return bool(checksum == xxh3_64(fixed))


def _ends_inside_a_frame(data: bytes, offset: int) -> bool:
    """Walking frame lengths from `offset` (no checksums), whether the file ends inside a
    frame (a group write cut short) rather than exactly at a frame's end."""
    while offset < len(data):
        if len(data) - offset < limits.FILE_FRAME_HEADER_BYTES:
            return True
        (body_bytes,) = struct.unpack_from("<I", data, offset + 8)
        end = offset + limits.FILE_FRAME_HEADER_BYTES + body_bytes
        if body_bytes > FRAME_BODY_BYTES_MAX or end > len(data):
            return True
        offset = end
    return False


def classify_bad_frame(
    data: bytes, bad_offset: int, reason: str, expected_lsn: int, *, newest: bool
) -> BadFrameVerdict:
    """Torn tail or corruption: the first bad frame of a segment is at `bad_offset`, the
    next RECORD expected there has `expected_lsn`. The rule is in the module doc."""

    def corrupt(why: str, lsn_found_max: int = expected_lsn - 1) -> BadFrameVerdict:
        return BadFrameVerdict(bad_offset, False, f"{reason}; {why}", expected_lsn, lsn_found_max)

    def torn(why: str) -> BadFrameVerdict:
        return BadFrameVerdict(
            bad_offset, True, f"{reason} ({why})", expected_lsn, expected_lsn - 1
        )

    later = find_later_record(data, bad_offset, expected_lsn)
    if isinstance(later, Undecided):
        return corrupt("too many candidates to rule out valid frames after it")
    if later is not None:
        later_offset, frame = later
        return corrupt(
            f"valid frames follow it (LSN {frame.lsn} at byte {later_offset}): they were or "
            "may have been acknowledged",
            _last_chained_lsn(data, later_offset, frame),
        )
    if not newest:
        return corrupt("in a sealed segment (synced before the next one was created)")
    if len(data) - bad_offset > limits.FILE_TORN_TAIL_BYTES_MAX:
        return corrupt("further from the end than one group write")
    if len(data) - bad_offset < limits.FILE_FRAME_HEADER_BYTES:
        return torn("the file ends inside a frame header: a group write cut short")
    if _whole_with_bad_length(data, bad_offset):
        return corrupt("a whole frame to the end of the file with a damaged length")
    if _ends_inside_a_frame(data, bad_offset):
        return torn("the file ends inside a frame: a group write cut short")
    if is_zero_filled_tail(data, bad_offset):
        return torn("a zero-filled tail: space a power loss left unwritten")
    return corrupt(
        "the frames to the end of the file are whole, so they were written in full and may "
        "have been acknowledged"
    )


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
        except BadFrame as bad:
            verdict = classify_bad_frame(data, bad.offset, bad.reason, next_lsn, newest=newest)
            if verdict.torn:
                scan.torn_offset = bad.offset
                scan.torn_reason = verdict.reason
                break
            raise StorageCorruption(
                path,
                bad.offset,
                verdict.reason,
                lsn_lo=next_lsn,
                lsn_hi=max(next_lsn, verdict.lsn_found_max) + 1,
            ) from None
        if frame.frame_type is FrameType.RECORD:
            if frame.lsn != next_lsn:
                raise StorageCorruption(
                    path,
                    offset,
                    f"record LSN {frame.lsn}, expected {next_lsn}",
                    lsn_lo=next_lsn,
                    lsn_hi=max(next_lsn, frame.lsn) + 1,
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
        except BadFrame as bad:
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
        except BadFrame as bad:
            if not verify:  # a listing: no checksums, so no verdict either
                torn = newest and len(data) - bad.offset <= limits.FILE_TORN_TAIL_BYTES_MAX
                end = END_TORN if torn else END_CORRUPT
                return SegmentFrames(base_lsn, tuple(frames), end, bad.offset, bad.reason)
            verdict = classify_bad_frame(data, bad.offset, bad.reason, next_lsn, newest=newest)
            end = END_TORN if verdict.torn else END_CORRUPT
            return SegmentFrames(base_lsn, tuple(frames), end, bad.offset, verdict.reason)
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
