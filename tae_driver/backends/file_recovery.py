"""The file backend's open: every segment scanned, damage refused before anything changes,
then what crashes leave repaired (`recover`); and `_Segment`, the in-memory index of one
segment that the open builds and the backend keeps (where each record's frame lies).

The rules (what is a torn tail, what is corruption, which segments a truncation left) are
tae_driver/backends/file.py's docstring and FORMAT.md; the read-only look makes the same
decisions in memory (file_read_only.py). Blocking: runs in `asyncio.to_thread`.
"""

from __future__ import annotations

import itertools
import os
from array import array
from dataclasses import dataclass

from tae_driver.backends import segment
from tae_driver.backends.file_writer import Fsync, _header_bytes, _Writer
from tae_driver.backends.segment import FrameType, SegmentScan
from tae_driver.backends.segment_files import TMP_SUFFIX, create_segment, fsync_dir
from tae_driver.errors import StorageCorruption


@dataclass(slots=True)
class _Segment:
    path: str
    base_lsn: int
    record_offsets: array[int]
    record_frame_bytes: array[int]
    size_bytes: int
    truncate_lsn_max: int = 0
    version: int = segment.SEGMENT_VERSION

    @property
    def last_lsn(self) -> int:
        return self.base_lsn + len(self.record_offsets) - 1


@dataclass(frozen=True, slots=True)
class Recovered:
    """What the writer's open found and left: the segments (oldest first, the last one
    active), the active segment's writer, the truncated LSN, and the counts for the stats."""

    segments: list[_Segment]
    writer: _Writer
    truncated_lsn: int
    torn_bytes_cut: int
    dir_syncs: int
    segments_deleted: int


def recover(
    dir_path: str, segment_bytes_max: int, preallocate_bytes: int, fsync: Fsync
) -> Recovered:
    """The writer's open of the log in `dir_path` (its lock held): scan every segment,
    refuse damage before changing anything, then repair what crashes leave (tmp files,
    the newest segment's torn tail, an interrupted truncation, a segment of an older
    version to roll from) and sync the newest segment. FileBackend's docstring says why."""
    # Everything is checked before anything is changed: a refused open (corruption)
    # leaves every byte and every name of the directory as it was (issue 20).
    names = sorted(os.listdir(dir_path))
    tmp_names = [name for name in names if name.endswith(TMP_SUFFIX)]
    bases = sorted(
        base for name in names if (base := segment.parse_segment_file_name(name)) is not None
    )
    scans: list[tuple[str, SegmentScan]] = []
    for index, base in enumerate(bases):
        path = os.path.join(dir_path, segment.segment_file_name(base))
        with open(path, "rb") as handle:
            data = handle.read()
        scan = segment.scan_segment(data, path, newest=index == len(bases) - 1)
        if scan.base_lsn != base:
            raise StorageCorruption(path, 16, f"header base LSN {scan.base_lsn} != name")
        scans.append((path, scan))
    truncated_lsn = max((scan.truncate_lsn_max for _, scan in scans), default=0)
    # Finish an interrupted truncation: drop leading segments wholly at or below the
    # truncated LSN, never the newest one nor the one holding the newest TRUNCATE frame.
    keep_from = 0
    while keep_from < len(scans) - 1:
        scan = scans[keep_from][1]
        if scan.last_lsn > truncated_lsn or scan.truncate_lsn_max == truncated_lsn > 0:
            break
        keep_from += 1
    doomed = [path for path, _ in scans[:keep_from]]
    scans = scans[keep_from:]
    segments = [
        _Segment(
            path,
            scan.base_lsn,
            scan.record_offsets,
            scan.record_frame_bytes,
            scan.valid_bytes,
            scan.truncate_lsn_max,
            scan.version,
        )
        for path, scan in scans
    ]
    for previous, current in itertools.pairwise(segments):
        if current.base_lsn != previous.last_lsn + 1:
            raise StorageCorruption(
                current.path,
                16,
                f"base LSN {current.base_lsn} after {previous.last_lsn}",
                lsn_lo=previous.last_lsn + 1,
            )
    if segments and segments[0].base_lsn > truncated_lsn + 1:
        raise StorageCorruption(
            segments[0].path, 16, f"LSNs {truncated_lsn + 1}.. are missing below this segment"
        )
    # Nothing refused: now repair what crashes leave.
    dir_syncs = 0
    deleted = 0
    for name in tmp_names:
        os.unlink(os.path.join(dir_path, name))  # an unfinished segment creation
        deleted += 1
    torn_bytes_cut = 0
    if scans and scans[-1][1].torn_offset is not None:
        path, scan = scans[-1]
        torn_bytes_cut = scan.written_bytes - scan.valid_bytes
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, scan.valid_bytes)
            fsync(fd)
        finally:
            os.close(fd)
    for path in doomed:
        os.unlink(path)
        deleted += 1
    if deleted:
        fsync_dir(dir_path)
        dir_syncs += 1
    # The first allocation of a new segment: one step, within the rotation size.
    first_allocation = min(preallocate_bytes, segment_bytes_max - _header_bytes())
    allocated_bytes = 0
    if segments:
        # What the newest segment holds may be in the page cache only (a process crash):
        # sync it before anything is served or stamped durable in a frame's hint. No
        # O_APPEND: the writer writes at its offset, into the preallocated zeros.
        fd = os.open(segments[-1].path, os.O_WRONLY)
        try:
            fsync(fd)
            allocated_bytes = os.fstat(fd).st_size
        except BaseException:
            os.close(fd)
            raise
    if segments and segments[-1].version != segment.SEGMENT_VERSION:
        # Never append frames of one version to a segment of another: roll to a new one.
        os.close(fd)
        old = segments[-1]
        base_lsn = max(old.last_lsn, truncated_lsn) + 1
        if base_lsn > old.base_lsn:
            path, fd = create_segment(dir_path, base_lsn, b"", first_allocation)
            segments.append(_Segment(path, base_lsn, array("Q"), array("Q"), _header_bytes()))
        else:
            # It holds no record, so the new segment has its name: replace it (one
            # rename), keeping the truncation mark it may hold (without it, the LSNs
            # below would look missing).
            mark = b""
            if old.truncate_lsn_max:
                mark = segment.encode_frame(
                    FrameType.TRUNCATE, old.truncate_lsn_max, b"", durable_lsn=base_lsn - 1
                )
            path, fd = create_segment(dir_path, base_lsn, mark, first_allocation)
            segments[-1] = _Segment(
                path,
                base_lsn,
                array("Q"),
                array("Q"),
                _header_bytes() + len(mark),
                old.truncate_lsn_max,
            )
        dir_syncs += 1
        allocated_bytes = _header_bytes() + first_allocation
    if not segments:
        path, fd = create_segment(dir_path, truncated_lsn + 1, b"", first_allocation)
        dir_syncs += 1
        segments = [_Segment(path, truncated_lsn + 1, array("Q"), array("Q"), _header_bytes())]
        allocated_bytes = _header_bytes() + first_allocation
    durable_lsn = max(segments[-1].last_lsn, truncated_lsn)
    active = segments[-1]
    writer = _Writer(
        fd, active.size_bytes, max(allocated_bytes, active.size_bytes), durable_lsn, durable_lsn
    )
    return Recovered(segments, writer, truncated_lsn, torn_bytes_cut, dir_syncs, deleted)
