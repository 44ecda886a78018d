"""The file backend's read-only look: a log's segments as they are now, maybe beside a
running writer, with nothing created, cut, deleted or synced (issue 20;
FileBackend._open_read_only). `scan_read_only` makes `recover`'s decisions in memory;
`_scan_live` reads a segment again when it looks damaged, as a writer's group write being
copied in can look torn to a read copying the file out. Blocking: runs in `asyncio.to_thread`.
"""

from __future__ import annotations

import itertools
import os
import time
from array import array

from tae_driver import limits
from tae_driver.backends import segment
from tae_driver.backends.file_recovery import _Segment
from tae_driver.backends.file_writer import _header_bytes
from tae_driver.backends.segment import SegmentScan
from tae_driver.backends.segment_files import read_all
from tae_driver.errors import StorageCorruption


def scan_read_only(dir_path: str, fds: dict[str, int]) -> tuple[list[_Segment], int]:
    """The segments of a read-only look at `dir_path` and its truncated LSN: `recover`'s
    decisions made in memory only (FileBackend._open_read_only says which). Every segment
    read is opened into `fds` (path -> descriptor), which the caller closes."""
    bases = sorted(
        base
        for name in os.listdir(dir_path)
        if (base := segment.parse_segment_file_name(name)) is not None
    )
    scans: list[tuple[str, SegmentScan]] = []
    for index, base in enumerate(bases):
        path = os.path.join(dir_path, segment.segment_file_name(base))
        fds[path] = fd = os.open(path, os.O_RDONLY)
        scan = _scan_live(fd, path, newest=index == len(bases) - 1)
        if scan.base_lsn != base:
            raise StorageCorruption(path, 16, f"header base LSN {scan.base_lsn} != name")
        scans.append((path, scan))
    truncated_lsn = max((scan.truncate_lsn_max for _, scan in scans), default=0)
    keep_from = 0  # as `recover`, without the deletion
    while keep_from < len(scans) - 1:
        scan = scans[keep_from][1]
        if scan.last_lsn > truncated_lsn or scan.truncate_lsn_max == truncated_lsn > 0:
            break
        keep_from += 1
    for path, _ in scans[:keep_from]:
        os.close(fds.pop(path))
    segments = [
        _Segment(
            path,
            s.base_lsn,
            s.record_offsets,
            s.record_frame_bytes,
            s.valid_bytes,
            s.truncate_lsn_max,
            s.version,
        )
        for path, s in scans[keep_from:]
    ]
    for previous, current in itertools.pairwise(segments):
        if current.base_lsn != previous.last_lsn + 1:
            raise StorageCorruption(
                current.path, 16, f"base LSN {current.base_lsn} after {previous.last_lsn}"
            )
    if segments and segments[0].base_lsn > truncated_lsn + 1:
        raise StorageCorruption(
            segments[0].path, 16, f"LSNs {truncated_lsn + 1}.. are missing below this segment"
        )
    if not segments:  # a stand-in that is never read: `_durable_lsn` is `truncated_lsn`
        path = os.path.join(dir_path, segment.segment_file_name(truncated_lsn + 1))
        segments = [_Segment(path, truncated_lsn + 1, array("Q"), array("Q"), _header_bytes())]
    return segments, truncated_lsn


def _scan_live(fd: int, path: str, *, newest: bool) -> SegmentScan:
    """A segment's scan as a read-only look sees it beside a writer that may be appending
    to it: damage found is read again, up to `FILE_READ_ONLY_SCAN_ATTEMPTS_MAX` times, and
    reported only if every read shows it. A read that copies the file while a group write
    is being copied into it can see that write's first frame half-written and, having been
    descheduled in between, the frames written after it whole: "corruption" that is not on
    disk (a CI run: `engine tables` beside a running engine, frame checksum mismatch at
    the last durable frame, a valid frame after it)."""
    for _ in range(limits.FILE_READ_ONLY_SCAN_ATTEMPTS_MAX - 1):
        try:
            return segment.scan_segment(read_all(fd), path, newest=newest)
        except StorageCorruption:
            time.sleep(limits.FILE_READ_ONLY_RESCAN_PAUSE_S)
    return segment.scan_segment(read_all(fd), path, newest=newest)  # the last read decides
