"""A clean file WAL segment's frames and driver records checked many at a time (issue 23):
what `records.driver_records(split=False)` gives for one segment, as arrays, with no Python
step or object per record but one turn of a length walk.

`segment_records` walks the frame lengths (one `unpack_from` per frame: a frame's place
depends on the one before), then reads every frame header and every driver record header
with one numpy gather each and applies, to all of them at once, exactly the checks of
`tae_driver.backends.segment.read_segment_frames` (checksum, type, reserved bytes, durable
hint, LSN sequence, truncate LSN) and of `tae_driver.record.decode_unsplit` (length, size,
checksum, magic, version, flags, type, count, DSN fields); each checksum is still one XXH3
per frame and one per record, over its own range (`tae_driver.checksum.xxh3_64_ranges`).

It answers only for what it can answer exactly: a segment whose every frame and every record
in the LSN range passes, and which ends cleanly (at its last byte, or in the zeros ahead of
the writer of a preallocated version 3 file). Anything else - a damaged or torn frame, a
record that does not decode, a SKIP record, a version 1 segment, verify `report` - gives
None, and the caller reads the segment record by record as before, so what it yields and
every error and message are the per-record path's own. The walk of each record's entries
(the last check of `decode`) stays with the reader (spark_jobs/entries.py), which names a
body that does not parse as the per-record path does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spark_jobs.filters import Range
from spark_jobs.inputs import BACKEND_FILE, Unit
from spark_jobs.verify import VERIFY_FALSE, VERIFY_REPORT
from tae_driver import limits as driver_limits
from tae_driver.backends import segment as file_segment
from tae_driver.checksum import xxh3_64_ranges
from tae_driver.errors import StorageCorruption
from tae_driver.record import MAGIC, VERSION, RecordType

_FRAME_HEADER_BYTES = driver_limits.FILE_FRAME_HEADER_BYTES
_RECORD_HEADER_BYTES = driver_limits.RECORD_HEADER_BYTES
_BODY_BYTES = struct.Struct("<I")
_FRAME_BODY_BYTES_AT = 8
_FRAME_TYPE_AT = 12

_FRAME = np.dtype(
    {
        "names": ["checksum", "body_bytes", "type", "r0", "r1", "r2", "lsn", "durable_lsn"],
        "formats": ["<u8", "<u4", "u1", "u1", "u1", "u1", "<u8", "<u8"],
        "offsets": [0, 8, 12, 13, 14, 15, 16, 24],
        "itemsize": _FRAME_HEADER_BYTES,
    }
)
"""A version 2/3 frame header (tae_driver/backends/FORMAT.md): checksum, body bytes, type,
three reserved bytes, LSN, durable LSN."""
_RECORD = np.dtype(
    {
        "names": [
            "checksum",
            "magic",
            "version",
            "type",
            "flags",
            "length",
            "count",
            "start_dsn",
            "safe_dsn",
        ],
        "formats": ["<u8", "<u4", "u1", "u1", "<u2", "<u4", "<u4", "<u8", "<u8"],
        "offsets": [0, 8, 12, 13, 14, 16, 20, 24, 32],
        "itemsize": _RECORD_HEADER_BYTES,
    }
)
"""A driver record header (tae_driver/FORMAT.md): the fields `decode_unsplit` reads."""
assert _FRAME.itemsize == _FRAME_HEADER_BYTES and _RECORD.itemsize == _RECORD_HEADER_BYTES

_DSN_MAX = (1 << 63) - 1
"""The readers keep DSNs as int64: a record past it goes the per-record way."""


@dataclass(frozen=True, slots=True)
class SegmentRecords:
    """The ENTRIES records (safe markers included) of one clean segment whose LSN the range
    holds, in LSN order, one array value each; and its TRUNCATE frames' LSNs in the range.
    Record `r`'s driver record (the backend record's payload) is
    `data[payload_starts[r]:payload_ends[r]]`; its entries are not walked yet."""

    data: bytes | memoryview
    """The segment file's bytes (a view of a leased buffer: spark_jobs/segment_buffers.py,
    valid while the reader holds it)."""
    offsets_bytes: npt.NDArray[np.int64]
    """Each record's frame offset in the file (the backend record's `offset_bytes`)."""
    lsns: npt.NDArray[np.int64]
    payload_starts: npt.NDArray[np.int64]
    payload_ends: npt.NDArray[np.int64]
    start_dsns: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    safe_dsns: npt.NDArray[np.int64]
    checksums: npt.NDArray[np.int64]
    """The record's checksum field as a signed BIGINT (`records.record_fields`' checksum)."""
    truncate_lsns: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.lsns)


def segment_records(
    unit: Unit, data: bytes | memoryview, verify: str, lsns: Range
) -> SegmentRecords | None:
    """The records of `unit` (a file segment whose bytes are `data`) checked at once, or None
    when the per-record path must read it (see the module doc)."""
    if unit.backend != BACKEND_FILE or verify == VERIFY_REPORT:
        return None
    try:
        # The header's bytes alone (it reads no more), as bytes.
        head = bytes(data[: driver_limits.FILE_SEGMENT_HEADER_BYTES])
        header = file_segment.decode_segment_header(head, unit.path)
    except StorageCorruption:
        return None
    if header.version == file_segment.SEGMENT_VERSION_1:
        return None
    frame_offsets, end = _walk_frames(data)
    if end < len(data) and (
        header.version < file_segment.SEGMENT_VERSION_3
        or bool(np.frombuffer(data, dtype=np.uint8, offset=end).any())
    ):
        # Damage or a torn tail, not the zeros ahead of the writer: `written_view`'s one
        # None case (a version 3 file whose every byte from `end` on is zero), without a
        # copy of a view into bytes.
        return None
    frames = _gather(data, frame_offsets, _FRAME)
    if not _frames_ok(data, frame_offsets, frames, header.base_lsn, verify != VERIFY_FALSE):
        return None
    is_record = frames["type"] == file_segment.FrameType.RECORD
    frame_lsns = frames["lsn"].astype(np.int64)
    if frames["lsn"].max(initial=0) > _DSN_MAX:
        return None
    in_range = _holds(lsns, frame_lsns)
    truncate_lsns = frame_lsns[~is_record & in_range]
    chosen = np.flatnonzero(is_record & in_range)
    offsets = frame_offsets[chosen]
    sizes = frames["body_bytes"][chosen].astype(np.int64)
    starts = offsets + _FRAME_HEADER_BYTES
    if (sizes < _RECORD_HEADER_BYTES).any():
        return None
    records = _gather(data, starts, _RECORD)
    if not _records_ok(data, starts, sizes, records):
        return None
    return SegmentRecords(
        data,
        offsets,
        frame_lsns[chosen],
        starts,
        starts + sizes,
        records["start_dsn"].astype(np.int64),
        records["count"].astype(np.int64),
        records["safe_dsn"].astype(np.int64),
        records["checksum"].view(np.int64),
        truncate_lsns,
    )


def _walk_frames(data: bytes | memoryview) -> tuple[npt.NDArray[np.int64], int]:
    """The offsets of the frames that are whole by their length and have a valid type, from
    the first on, and where the walk stopped (the file's end, or the first place that is not
    such a frame: the zeros ahead of the writer, or damage)."""
    offsets: list[int] = []
    append = offsets.append
    unpack = _BODY_BYTES.unpack_from
    size = len(data)
    offset = driver_limits.FILE_SEGMENT_HEADER_BYTES
    body_max = file_segment.FRAME_BODY_BYTES_MAX
    while size - offset >= _FRAME_HEADER_BYTES:
        (body_bytes,) = unpack(data, offset + _FRAME_BODY_BYTES_AT)
        end = offset + _FRAME_HEADER_BYTES + body_bytes
        if body_bytes > body_max or end > size or data[offset + _FRAME_TYPE_AT] not in (1, 2):
            break
        append(offset)
        offset = end
    return np.array(offsets, dtype=np.int64), offset


def _gather(
    data: bytes | memoryview, offsets: npt.NDArray[np.int64], dtype: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    """The `dtype`-sized header at each offset (each whole in `data`), one record each: rows
    of a sliding window over the bytes (a view), so what is made is the headers' bytes alone
    (no index per byte)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if len(raw) < dtype.itemsize:
        return np.zeros(0, dtype=dtype)
    windows = np.lib.stride_tricks.sliding_window_view(raw, dtype.itemsize)
    found: np.ndarray[Any, Any] = windows[offsets].view(dtype).reshape(len(offsets))
    return found


def _frames_ok(
    data: bytes | memoryview,
    offsets: npt.NDArray[np.int64],
    frames: np.ndarray[Any, Any],
    base_lsn: int,
    verify: bool,
) -> bool:
    """`read_segment_frames`' checks of every frame, at once: all hold."""
    if not len(offsets):
        return True
    is_record = frames["type"] == file_segment.FrameType.RECORD
    lsn, durable = frames["lsn"], frames["durable_lsn"]
    # The next record's LSN before each frame: the base plus the records before it.
    next_lsn = np.uint64(base_lsn) + (np.cumsum(is_record) - is_record).astype(np.uint64)
    ok = bool(
        (frames["r0"] == 0).all()
        and (frames["r1"] == 0).all()
        and (frames["r2"] == 0).all()
        and np.where(is_record, durable < lsn, durable >= lsn).all()
        and (durable[1:] >= durable[:-1]).all()
        and np.where(is_record, lsn == next_lsn, lsn < next_lsn).all()
    )
    if ok and verify:
        ends = offsets + _FRAME_HEADER_BYTES + frames["body_bytes"].astype(np.int64)
        found = xxh3_64_ranges(data, (offsets + 8).tolist(), ends.tolist())
        ok = bool((np.array(found, dtype=np.uint64) == frames["checksum"]).all())
    return ok


def _records_ok(
    data: bytes | memoryview,
    starts: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    records: np.ndarray[Any, Any],
) -> bool:
    """`decode_unsplit`'s checks of every record, at once, for ENTRIES records: all hold."""
    if not len(starts):
        return True
    count = records["count"].astype(np.uint64)
    start_dsn = records["start_dsn"]
    ok = bool(
        (records["length"] == sizes).all()
        and (sizes <= driver_limits.RECORD_BYTES_MAX).all()
        and (records["magic"] == MAGIC).all()
        and (records["version"] == VERSION).all()
        and (records["flags"] == 0).all()
        and (records["type"] == RecordType.ENTRIES).all()
        and (count <= driver_limits.RECORD_ENTRIES_MAX).all()
        and (start_dsn >= 1).all()
        and (start_dsn <= _DSN_MAX).all()
        # A tighter bound than decode's (start + count - 1 <= 2**64 - 1): the readers keep
        # DSNs as int64; a record past it goes the per-record way.
        and (start_dsn + count <= _DSN_MAX).all()
        and (records["safe_dsn"] < start_dsn).all()
    )
    if ok:
        found = xxh3_64_ranges(data, (starts + 8).tolist(), (starts + sizes).tolist())
        ok = bool((np.array(found, dtype=np.uint64) == records["checksum"]).all())
    return ok


def _holds(lsns: Range, values: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """`lsns.holds` of every value."""
    held = np.ones(len(values), dtype=np.bool_)
    if lsns.lo is not None:
        held &= values >= lsns.lo
    if lsns.hi is not None:
        held &= values <= lsns.hi
    return held
