"""The file backend's on-disk format: segment headers and frames (pure; layout in FORMAT.md).

Why (shared/STYLE.md, LevelDB `log_format.md`, LogCabin `SegmentedLog`, ARCHITECTURE.md §3):
every file starts with a magic number and a version; every frame has a length, a type (0 is
invalid, so zero-filled space never parses) and an XXH3 checksum over everything after the
checksum. A frame is either a RECORD (one appended payload at a dense LSN) or a TRUNCATE
marker (the truncated LSN, so the truncation point survives a restart without a second file).
Version 2 frames also carry `durable_lsn`: the highest LSN the writer knew to be fsynced
before the group write the frame belongs to (the shard store's durable-index hint,
`logsvc/store/records.py`). Version 1 segments are still read; new ones are version 2.

`classify_bad_frame` decides what a damaged file means (ARCHITECTURE.md §11; the shared
power-loss model is `logsvc/torn.py`; the table is in FORMAT.md). Only bytes that could never
have been acknowledged are a torn tail, cut on open: the first bad frame lies in the newest
segment, within one group write (`FILE_TORN_TAIL_BYTES_MAX`) of its end, and the damage has
the shape a power loss leaves (the file ends inside a frame, or in zero-filled space).
Valid frames after the bad one make it corruption in version 1 (nothing proves they were not
acknowledged); in version 2 they are cut with it only if every one of them says the bad
frame's LSN was not yet durable when it was written (so they and the damage are one group
write, the last, never synced) and each damaged span is unwritten space (zeros). A frame
that is whole to the end of the file with non-zero damage is corruption in both versions: a
flipped byte in an acknowledged last frame looks exactly the same. Everything else is
`StorageCorruption(path, offset, reason, lsn_lo, lsn_hi)`: reported, never skipped, nothing
changed.
"""

from __future__ import annotations

import enum
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from logsvc.torn import (
    SECTOR_BYTES,
    has_zero_page,
    is_lost_page_tail,
    is_zero_filled_tail,
    starts_with_zero_run,
    zero_tail_start,
)
from tae_driver import limits
from tae_driver.checksum import xxh3_64
from tae_driver.errors import StorageCorruption

SEGMENT_MAGIC = b"TDWALSEG"
SEGMENT_VERSION_1 = 1
SEGMENT_VERSION_2 = 2
SEGMENT_VERSION_3 = 3
"""Version 2 frames in a preallocated file: every byte past the last written frame is zero
(allocated ahead of the writer, FORMAT.md "Preallocation"), so the file's size says nothing
about where the writing ended; `written_view` finds that end instead."""
SEGMENT_VERSION = SEGMENT_VERSION_3
"""The version new segments are written in. Version 1 and 2 segments are still read (with
their own torn-tail rules); the backend never appends to one (it rolls)."""
SEGMENT_VERSIONS_READ = (SEGMENT_VERSION_1, SEGMENT_VERSION_2, SEGMENT_VERSION_3)

_SEGMENT_HEADER = struct.Struct("<8sHHIQQ")
assert _SEGMENT_HEADER.size == limits.FILE_SEGMENT_HEADER_BYTES
# checksum, body_bytes, type, reserved, lsn (v1) + durable_lsn (v2). The LSN stays at frame
# offset 16 in both, so the resync search (`find_later_record`) reads either version.
_FRAME_HEADER_V1 = struct.Struct("<QIB3sQ")
assert _FRAME_HEADER_V1.size == limits.FILE_FRAME_HEADER_BYTES_V1
_FRAME_HEADER_V2 = struct.Struct("<QIB3sQQ")
assert _FRAME_HEADER_V2.size == limits.FILE_FRAME_HEADER_BYTES
_FRAME_LSN_OFFSET = 16


def frame_header_bytes(version: int) -> int:
    """The frame header size of a segment of `version`."""
    assert version in SEGMENT_VERSIONS_READ
    if version == SEGMENT_VERSION_1:
        return limits.FILE_FRAME_HEADER_BYTES_V1
    return limits.FILE_FRAME_HEADER_BYTES


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


def encode_segment_header(base_lsn: int, version: int = SEGMENT_VERSION) -> bytes:
    """A segment header. `version` other than the current one is for tests and golden
    vectors (a version 1 directory, to prove it is still read)."""
    assert base_lsn >= 1
    assert version in SEGMENT_VERSIONS_READ
    unsealed = _SEGMENT_HEADER.pack(SEGMENT_MAGIC, version, 0, 0, base_lsn, 0)[:24]
    return unsealed + struct.pack("<Q", xxh3_64(unsealed))


def _check_frame_fields(frame_type: FrameType, lsn: int, body: bytes) -> None:
    assert frame_type in (FrameType.RECORD, FrameType.TRUNCATE)
    assert lsn >= 1
    assert len(body) <= FRAME_BODY_BYTES_MAX
    assert frame_type is FrameType.RECORD or not body


def encode_frame(frame_type: FrameType, lsn: int, body: bytes, *, durable_lsn: int) -> bytes:
    """A version 2 frame. `durable_lsn`: the highest LSN the writer knew to be fsynced when
    it wrote this frame, i.e. before the group write the frame belongs to (FORMAT.md)."""
    _check_frame_fields(frame_type, lsn, body)
    assert durable_lsn >= 0
    # A RECORD is never durable before it is written; a TRUNCATE names a durable LSN.
    assert durable_lsn < lsn if frame_type is FrameType.RECORD else durable_lsn >= lsn
    unsealed = (
        _FRAME_HEADER_V2.pack(0, len(body), frame_type, b"\0\0\0", lsn, durable_lsn)[8:] + body
    )
    return struct.pack("<Q", xxh3_64(unsealed)) + unsealed


def encode_frame_v1(frame_type: FrameType, lsn: int, body: bytes = b"") -> bytes:
    """A version 1 frame (no durable hint): only for tests and golden vectors; the backend
    writes version 2."""
    _check_frame_fields(frame_type, lsn, body)
    unsealed = _FRAME_HEADER_V1.pack(0, len(body), frame_type, b"\0\0\0", lsn)[8:] + body
    return struct.pack("<Q", xxh3_64(unsealed)) + unsealed


@dataclass(frozen=True, slots=True)
class Frame:
    frame_type: FrameType
    lsn: int
    body: bytes
    size_bytes: int
    durable_lsn: int | None = None
    """Version 2 and 3: the writer's durable LSN before this frame's group write; None in v1."""


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    base_lsn: int
    version: int

    @property
    def frame_header_bytes(self) -> int:
        return frame_header_bytes(self.version)


class BadFrame(Exception):
    """Structurally bad bytes at an offset (a torn write or corruption: `classify_bad_frame`
    decides). Raised by `decode_frame`; never leaves this package."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


def decode_segment_header(data: bytes, path: str) -> SegmentHeader:
    """The header (base LSN, version) of a segment whose first bytes are `data`."""
    if len(data) < limits.FILE_SEGMENT_HEADER_BYTES:
        raise StorageCorruption(path, 0, "segment header is short")
    magic, version, flags, reserved, base_lsn, checksum = _SEGMENT_HEADER.unpack_from(data, 0)
    if checksum != xxh3_64(data[:24]):
        raise StorageCorruption(path, 24, "segment header checksum mismatch")
    if magic != SEGMENT_MAGIC:
        raise StorageCorruption(path, 0, "not a segment file (bad magic)")
    if version not in SEGMENT_VERSIONS_READ:
        raise StorageCorruption(path, 8, f"unknown segment version {version}")
    if flags != 0 or reserved != 0 or base_lsn < 1:
        raise StorageCorruption(path, 10, "bad segment header fields")
    return SegmentHeader(int(base_lsn), int(version))


def decode_frame(
    data: bytes | memoryview, offset: int, *, version: int, verify_checksum: bool = True
) -> Frame:
    """The frame at `offset` of a segment of `version`; raises `BadFrame` when the bytes
    there are not a whole frame. `verify_checksum=False` (offline listings only) trusts the
    checksum without computing it."""
    header_bytes = frame_header_bytes(version)
    remaining = len(data) - offset
    if remaining < header_bytes:
        raise BadFrame(offset, "short frame header")
    durable_lsn: int | None = None
    if version == SEGMENT_VERSION_1:
        checksum, body_bytes, raw_type, reserved, lsn = _FRAME_HEADER_V1.unpack_from(data, offset)
    else:
        checksum, body_bytes, raw_type, reserved, lsn, durable_lsn = _FRAME_HEADER_V2.unpack_from(
            data, offset
        )
    if body_bytes > FRAME_BODY_BYTES_MAX:
        raise BadFrame(offset, f"frame length {body_bytes} too large")
    end = offset + header_bytes + body_bytes
    if end > len(data):
        raise BadFrame(offset, "frame runs past the end of the file")
    if verify_checksum and checksum != xxh3_64(memoryview(data)[offset + 8 : end]):
        raise BadFrame(offset, "frame checksum mismatch")
    if raw_type not in (FrameType.RECORD, FrameType.TRUNCATE):
        raise BadFrame(offset, f"invalid frame type {raw_type}")
    if reserved != b"\0\0\0":
        raise BadFrame(offset, "reserved frame bytes are not zero")
    if durable_lsn is not None and (
        durable_lsn >= lsn if raw_type == FrameType.RECORD else durable_lsn < lsn
    ):
        raise BadFrame(offset, f"frame durable LSN {durable_lsn} impossible for LSN {lsn}")
    body = bytes(data[offset + header_bytes : end])
    return Frame(FrameType(raw_type), int(lsn), body, end - offset, durable_lsn)


# How far past a bad frame to look for a later valid RECORD (its LSN within this many of the
# next expected one), and how many candidate positions to try before deciding conservatively
# (corruption). The shard store looks 8 indexes ahead (logsvc/store/records.py); here more,
# because a damaged span with no valid frame found after it may be cut: 128 frames is more
# than a 4 KiB page of the smallest frames (a 24-byte header and a ~40-byte driver record).
# The search runs only when a frame is bad: at most 128 `find`s over the last 6 MiB.
RESYNC_LSNS_AHEAD = 128
RESYNC_CANDIDATES_MAX = 4096
# Version 2 walks the whole damaged tail (hole, frames, hole, frames...): at most this many
# holes before it decides conservatively. A 4 MiB group write has 1,024 pages.
RESYNC_HOLES_MAX = 1024


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
    data: bytes, bad_offset: int, expected_lsn: int, *, version: int
) -> tuple[int, Frame] | Undecided | None:
    """A valid RECORD after `bad_offset` with an LSN in [expected, expected + 128), found by
    searching for the packed LSN field (frame offset 16); bounded in candidates tried."""
    tried = 0
    for lsn in range(expected_lsn, expected_lsn + RESYNC_LSNS_AHEAD):
        needle = struct.pack("<Q", lsn)
        position = data.find(needle, bad_offset + 1 + _FRAME_LSN_OFFSET)
        while position != -1:
            tried += 1
            if tried > RESYNC_CANDIDATES_MAX:
                return _UNDECIDED
            try:
                frame = decode_frame(data, position - _FRAME_LSN_OFFSET, version=version)
            except BadFrame:
                pass
            else:
                if frame.frame_type is FrameType.RECORD and frame.lsn == lsn:
                    return position - _FRAME_LSN_OFFSET, frame
            position = data.find(needle, position + 1)
    return None


# A TRUNCATE frame's header after its checksum: body_bytes 0, type 2, reserved zero. Eight
# fixed bytes, so the search for one (whatever its LSNs) finds few false candidates, and none
# in zeroed space.
_TRUNCATE_NEEDLE = struct.pack("<IB3s", 0, FrameType.TRUNCATE, b"\0\0\0")


def _later_truncate_hint(data: bytes, bad_offset: int) -> int | Undecided:
    """The highest durable hint of a valid v2 TRUNCATE frame after `bad_offset` (-1 when
    there is none). `find_later_record` finds RECORDs by their LSN; a TRUNCATE frame names
    an older LSN, so it is found by its fixed header bytes instead."""
    hint = -1
    tried = 0
    position = data.find(_TRUNCATE_NEEDLE, bad_offset + 1 + 8)
    while position != -1:
        tried += 1
        if tried > RESYNC_CANDIDATES_MAX:
            return _UNDECIDED
        try:
            frame = decode_frame(data, position - 8, version=SEGMENT_VERSION_2)
        except BadFrame:
            pass
        else:
            assert frame.durable_lsn is not None
            hint = max(hint, frame.durable_lsn)
        position = data.find(_TRUNCATE_NEEDLE, position + 1)
    return hint


@dataclass(frozen=True, slots=True)
class _Chain:
    """A run of valid frames: where it ends, its last RECORD's LSN, its highest durable
    hint (-1 in v1), and whether it broke on a frame with a good checksum and a wrong LSN."""

    end_offset: int
    lsn_last: int
    durable_lsn_max: int
    out_of_sequence: bool


def _follow_chain(data: bytes, offset: int, frame: Frame, version: int) -> _Chain:
    """The run of valid frames starting with `frame` at `offset`."""
    lsn = frame.lsn
    durable_lsn_max = -1 if frame.durable_lsn is None else frame.durable_lsn
    offset += frame.size_bytes
    while offset < len(data):
        try:
            following = decode_frame(data, offset, version=version)
        except BadFrame:
            break
        if following.frame_type is FrameType.RECORD:
            if following.lsn != lsn + 1:
                return _Chain(offset, lsn, durable_lsn_max, True)
            lsn = following.lsn
        if following.durable_lsn is not None:
            durable_lsn_max = max(durable_lsn_max, following.durable_lsn)
        offset += following.size_bytes
    return _Chain(offset, lsn, durable_lsn_max, False)


def _whole_with_bad_length(data: bytes, offset: int, version: int) -> bool:
    """Whether the frame at `offset` is whole to the end of the file with only its length
    field damaged: the checksum holds once the length is set to what is left."""
    body_bytes = len(data) - offset - frame_header_bytes(version)
    if not 0 <= body_bytes <= FRAME_BODY_BYTES_MAX:
        return False
    (checksum,) = struct.unpack_from("<Q", data, offset)
    fixed = struct.pack("<I", body_bytes) + data[offset + 12 :]
    return bool(checksum == xxh3_64(fixed))


def _ends_inside_a_frame(data: bytes, offset: int, version: int) -> bool:
    """Walking frame lengths from `offset` (no checksums), whether the file ends inside a
    frame (a group write cut short) rather than exactly at a frame's end."""
    header_bytes = frame_header_bytes(version)
    while offset < len(data):
        if len(data) - offset < header_bytes:
            return True
        (body_bytes,) = struct.unpack_from("<I", data, offset + 8)
        end = offset + header_bytes + body_bytes
        if body_bytes > FRAME_BODY_BYTES_MAX or end > len(data):
            return True
        offset = end
    return False


def _torn_end(data: bytes, offset: int, version: int) -> str | None:
    """Why the bytes from `offset` (a bad frame, no valid frame after it) to the end of the
    newest segment are what a power loss leaves of an unsynced write, or None when they are
    not (a whole frame with non-zero damage: it may have been written, synced, acknowledged
    and then damaged, which a power loss does not do)."""
    if len(data) - offset < frame_header_bytes(version):
        return "the file ends inside a frame header: a group write cut short"
    if _whole_with_bad_length(data, offset, version):
        return None
    if _ends_inside_a_frame(data, offset, version):
        return "the file ends inside a frame: a group write cut short"
    if is_zero_filled_tail(data, offset):
        return "a zero-filled tail: space a power loss left unwritten"
    if version >= SEGMENT_VERSION_2 and is_lost_page_tail(data, offset):
        return "a zeroed tail from a page boundary: the last page of a write never reached disk"
    return None


def written_view(data: bytes, bad_offset: int, version: int, expected_lsn: int) -> bytes | None:
    """Where the writing of a segment ended, for the classification of its first bad frame
    at `bad_offset`: `data` itself for versions 1 and 2 (the file's size is where the last
    write ended). Version 3 files are preallocated with zeros (FORMAT.md "Preallocation"):
    None when every byte from `bad_offset` on is zero (nothing was written there: a clean
    end), else `data` cut where the written bytes end, so that the version 2 rules judge the
    shape exactly as in a file that was appended to.

    That end: the last non-zero byte ends at `z`; a disk writes whole sectors, so the
    sector holding it was written and any zeros after `z` in that sector are data. If a
    frame ends within that sector at or after `z`, the view ends with it: a damaged
    acknowledged last frame whose own last bytes are zero still reads as whole (hence
    corruption), and valid frames after the damage keep their last one whole for the hint
    rule. Such a frame is found walking lengths from `bad_offset`, or as the bad frame with
    its length field repaired (`_whole_with_bad_length`), or at the end of a run of valid
    frames found after the damage (`find_later_record`, then hole after hole). Otherwise
    the view ends at `z`."""
    if version < SEGMENT_VERSION_3:
        return data
    if data.count(0, bad_offset) == len(data) - bad_offset:
        return None
    z = zero_tail_start(data, bad_offset)
    sector_end = min(len(data), -(-z // SECTOR_BYTES) * SECTOR_BYTES)
    header_bytes = frame_header_bytes(version)
    offset = bad_offset
    while len(data) - offset >= header_bytes and not starts_with_zero_run(data, offset):
        (body_bytes,) = struct.unpack_from("<I", data, offset + 8)
        end = offset + header_bytes + body_bytes
        if body_bytes > FRAME_BODY_BYTES_MAX or end > sector_end:
            break
        if end >= z:
            return data[:end]
        offset = end
    for end in range(max(z, bad_offset + header_bytes), sector_end + 1):
        if _whole_with_bad_length(data[:end], bad_offset, version):
            return data[:end]
    written = data[:sector_end]
    offset, lsn = bad_offset, expected_lsn
    for _ in range(RESYNC_HOLES_MAX):
        later = find_later_record(written, offset, lsn, version=version)
        if later is None or isinstance(later, Undecided):
            break
        chain = _follow_chain(written, later[0], later[1], version)
        if chain.end_offset >= z:
            return data[: chain.end_offset]
        offset, lsn = chain.end_offset, chain.lsn_last + 1
    return data[:z]


def classify_bad_frame(
    data: bytes, bad_offset: int, reason: str, expected_lsn: int, *, newest: bool, version: int
) -> BadFrameVerdict:
    """Torn tail or corruption: the first bad frame of a segment of `version` is at
    `bad_offset`, the next RECORD expected there has `expected_lsn`. The rules are in the
    module doc and FORMAT.md; version 1 frames carry no durable hint, so any valid frame
    after the damage makes it corruption."""

    def corrupt(why: str, lsn_found_max: int = expected_lsn - 1) -> BadFrameVerdict:
        return BadFrameVerdict(bad_offset, False, f"{reason}; {why}", expected_lsn, lsn_found_max)

    def torn(why: str) -> BadFrameVerdict:
        return BadFrameVerdict(
            bad_offset, True, f"{reason} ({why})", expected_lsn, expected_lsn - 1
        )

    later = find_later_record(data, bad_offset, expected_lsn, version=version)
    if isinstance(later, Undecided):
        return corrupt("too many candidates to rule out valid frames after it")
    if later is not None and (version == SEGMENT_VERSION_1 or not newest):
        later_offset, frame = later
        chain = _follow_chain(data, later_offset, frame, version)
        why = "sealed segment" if newest is False else "v1 frames carry no durable hint"
        return corrupt(
            f"valid frames follow it (LSN {frame.lsn} at byte {later_offset}): they were or "
            f"may have been acknowledged ({why})",
            chain.lsn_last,
        )
    if not newest:
        return corrupt("in a sealed segment (synced before the next one was created)")
    far = len(data) - bad_offset > limits.FILE_TORN_TAIL_BYTES_MAX
    if version >= SEGMENT_VERSION_2 and not far:
        truncate_hint = _later_truncate_hint(data, bad_offset)
        if isinstance(truncate_hint, Undecided):
            return corrupt("too many candidates to rule out valid frames after it")
        if truncate_hint >= expected_lsn:
            return corrupt(
                f"a valid TRUNCATE frame follows it, written when LSNs up to {truncate_hint} "
                f"were durable: LSN {expected_lsn} had been synced and may have been acknowledged"
            )
    if later is not None:
        verdict = _classify_v2_holes(data, bad_offset, expected_lsn, later, corrupt, torn)
        if verdict.torn and far:
            return corrupt("further from the end than one group write", verdict.lsn_found_max)
        return verdict
    if far:
        return corrupt("further from the end than one group write")
    why_torn = _torn_end(data, bad_offset, version)
    if why_torn is None:
        return corrupt(
            "the frames to the end of the file are whole, so they were written in full "
            "and may have been acknowledged"
        )
    return torn(why_torn)


def _classify_v2_holes(
    data: bytes,
    bad_offset: int,
    expected_lsn: int,
    later: tuple[int, Frame],
    corrupt: Callable[[str, int], BadFrameVerdict],
    torn: Callable[[str], BadFrameVerdict],
) -> BadFrameVerdict:
    """Version 2, newest segment, valid frames after the bad one: torn only if every one of
    them says LSN `expected_lsn` was not yet durable when it was written (so all of them and
    the damage belong to one group write, the last, which was never synced), each damaged
    span between them is unwritten space (a whole zeroed page, or a zeroed frame start), and
    the file ends as a power loss leaves it."""
    hole_offset = bad_offset
    lsn_found_max = expected_lsn - 1
    for _ in range(RESYNC_HOLES_MAX):
        later_offset, frame = later
        chain = _follow_chain(data, later_offset, frame, SEGMENT_VERSION_2)
        lsn_found_max = chain.lsn_last
        if chain.durable_lsn_max >= expected_lsn:
            return corrupt(
                f"valid frames follow it (LSNs {frame.lsn}..{chain.lsn_last} from byte "
                f"{later_offset}), written when LSNs up to {chain.durable_lsn_max} were "
                f"durable: LSN {expected_lsn} had been synced and may have been acknowledged",
                lsn_found_max,
            )
        # A lost page, not a zero sector: the span may be one frame whose own data holds a
        # sector of zeros next to a flipped byte (a page of zeros is far rarer); a zeroed
        # frame start is never data (a checksum is not zero).
        if not (
            starts_with_zero_run(data, hole_offset)
            or has_zero_page(data, hole_offset, later_offset)
        ):
            return corrupt(
                f"valid frames follow it (LSN {frame.lsn} at byte {later_offset}) after damage "
                f"at byte {hole_offset} that is not unwritten space (no zeroed 4 KiB page or "
                "frame start): not what a power loss does to an unsynced write",
                lsn_found_max,
            )
        if chain.out_of_sequence:
            return corrupt(f"a frame out of sequence after LSN {chain.lsn_last}", lsn_found_max)
        if chain.end_offset == len(data):
            return torn(
                "unwritten space, then frames all written before it was durable: pages of the "
                "last, unsynced group write lost out of order"
            )
        hole_offset = chain.end_offset
        found = find_later_record(data, hole_offset, chain.lsn_last + 1, version=SEGMENT_VERSION_2)
        if isinstance(found, Undecided):
            return corrupt("too many candidates to rule out valid frames after it", lsn_found_max)
        if found is None:
            why_torn = _torn_end(data, hole_offset, SEGMENT_VERSION_2)
            if why_torn is None:
                return corrupt(
                    f"the frame at byte {hole_offset} is whole to the end of the file with "
                    "non-zero damage: it may have been acknowledged",
                    lsn_found_max,
                )
            return torn(f"frames lost out of order, then {why_torn}")
        later = found
    return corrupt("too many damaged spans after it", lsn_found_max)


@dataclass(slots=True)
class SegmentScan:
    base_lsn: int
    version: int = SEGMENT_VERSION
    record_offsets: array[int] = field(default_factory=lambda: array("Q"))
    record_frame_bytes: array[int] = field(default_factory=lambda: array("Q"))
    truncate_lsn_max: int = 0
    valid_bytes: int = 0
    torn_offset: int | None = None
    torn_reason: str = ""
    written_bytes: int = 0
    """Where the writing ended: the file's size, except in a preallocated (version 3) file,
    where the zeros past the last frame (or past a torn tail's last written byte) are not
    counted. A torn tail is `[torn_offset, written_bytes)`."""

    @property
    def record_count(self) -> int:
        return len(self.record_offsets)

    @property
    def last_lsn(self) -> int:
        """LSN of the last record; base_lsn - 1 when the segment holds none."""
        return self.base_lsn + len(self.record_offsets) - 1


def _hint_error(frame: Frame, durable_lsn_max: int) -> str | None:
    """Why a whole frame's durable hint cannot be right after the frames before it (hints
    never go down, and never pass the last record written before the frame), or None."""
    if frame.durable_lsn is None:
        return None
    if frame.durable_lsn < durable_lsn_max:
        return f"durable LSN {frame.durable_lsn} below an earlier frame's {durable_lsn_max}"
    return None


def scan_segment(data: bytes, path: str, *, newest: bool) -> SegmentScan:
    """Index a whole segment file. See the module doc for what damage means."""
    header = decode_segment_header(data, path)
    scan = SegmentScan(header.base_lsn, header.version)
    offset = limits.FILE_SEGMENT_HEADER_BYTES
    next_lsn = header.base_lsn
    durable_lsn_max = 0
    while offset < len(data):
        try:
            frame = decode_frame(data, offset, version=header.version)
        except BadFrame as bad:
            view = written_view(data, bad.offset, header.version, next_lsn)
            if view is None:
                scan.written_bytes = bad.offset
                break  # the zeroed space ahead of the writer: the end of this segment
            verdict = classify_bad_frame(
                view, bad.offset, bad.reason, next_lsn, newest=newest, version=header.version
            )
            if verdict.torn:
                scan.torn_offset = bad.offset
                scan.torn_reason = verdict.reason
                scan.written_bytes = len(view)
                break
            raise StorageCorruption(
                path,
                bad.offset,
                verdict.reason,
                lsn_lo=next_lsn,
                lsn_hi=max(next_lsn, verdict.lsn_found_max) + 1,
            ) from None
        hint_error = _hint_error(frame, durable_lsn_max)
        if hint_error is not None:
            raise StorageCorruption(
                path, offset, hint_error, lsn_lo=next_lsn, lsn_hi=max(next_lsn, frame.lsn) + 1
            )
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
        if frame.durable_lsn is not None:
            durable_lsn_max = frame.durable_lsn
        offset += frame.size_bytes
    scan.valid_bytes = offset if scan.torn_offset is None else scan.torn_offset
    if scan.written_bytes == 0:
        scan.written_bytes = offset  # read to the end (or to the zeros) without damage
    return scan


def decode_records_in(
    data: bytes, path: str, file_offset: int, first_lsn: int, count: int, *, version: int
) -> list[tuple[int, bytes]]:
    """Decode `count` RECORD frames starting at LSN `first_lsn` from `data`, which holds the
    bytes from `file_offset` on of a segment of `version`; TRUNCATE frames between them are
    skipped. Any damage here is corruption: these bytes were durable and checked when the
    file was opened."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    expected = first_lsn
    while len(out) < count:
        try:
            frame = decode_frame(data, offset, version=version)
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
    version: int = SEGMENT_VERSION


def read_segment_frames(
    data: bytes, path: str, *, newest: bool, verify: bool = True
) -> SegmentFrames:
    """The frames of a segment file's bytes (either version), read-only and without raising
    on damage after the header (a bad header still raises `StorageCorruption`): readers
    outside the backend (the Spark jobs, issue 16) use it instead of opening a `FileBackend`,
    which locks the directory and cuts torn tails. The rules are `scan_segment`'s;
    `verify=False` skips the frame checksums (a listing), so damage then shows only as a
    frame that cannot parse."""
    header = decode_segment_header(data, path)
    version = header.version
    frames: list[FrameAt] = []
    offset = limits.FILE_SEGMENT_HEADER_BYTES
    next_lsn = header.base_lsn
    durable_lsn_max = 0

    def ended(end: str, at: int, reason: str | None) -> SegmentFrames:
        return SegmentFrames(header.base_lsn, tuple(frames), end, at, reason, version)

    while offset < len(data):
        try:
            frame = decode_frame(data, offset, version=version, verify_checksum=verify)
        except BadFrame as bad:
            if not verify:  # a listing: no checksums, so no verdict either
                view = written_view(data, bad.offset, version, next_lsn)
                if view is None:
                    return ended(END_CLEAN, bad.offset, None)
                torn = newest and len(view) - bad.offset <= limits.FILE_TORN_TAIL_BYTES_MAX
                return ended(END_TORN if torn else END_CORRUPT, bad.offset, bad.reason)
            view = written_view(data, bad.offset, version, next_lsn)
            if view is None:
                return ended(END_CLEAN, bad.offset, None)  # preallocated zeros: the end
            verdict = classify_bad_frame(
                view, bad.offset, bad.reason, next_lsn, newest=newest, version=version
            )
            return ended(END_TORN if verdict.torn else END_CORRUPT, bad.offset, verdict.reason)
        hint_error = _hint_error(frame, durable_lsn_max)
        if hint_error is not None:
            return ended(END_CORRUPT, offset, hint_error)
        if frame.frame_type is FrameType.RECORD:
            if frame.lsn != next_lsn:
                return ended(END_CORRUPT, offset, f"record LSN {frame.lsn}, expected {next_lsn}")
            next_lsn += 1
        elif frame.lsn >= next_lsn:
            return ended(END_CORRUPT, offset, f"truncate at {frame.lsn} past the log")
        if frame.durable_lsn is not None:
            durable_lsn_max = frame.durable_lsn
        (checksum,) = struct.unpack_from("<Q", data, offset)
        frames.append(FrameAt(offset, frame, checksum))
        offset += frame.size_bytes
    return ended(END_CLEAN, offset, None)
