"""The file backend's group writer: what the syncer thread writes and syncs.

`_Pending` is an append or truncate waiting for a group write; `_take_group` takes the next
group from the syncer's queue; `write_group` writes a group's frames at the active segment's
write position with one pwrite, makes them durable with one fdatasync, and rolls to a new
segment past the rotation size; `_Writer` is the active segment as the syncer thread alone
changes it; `_GroupResult` is what the loop applies to the index (tae_driver/backends/file.py).
Blocking: runs in the syncer thread (syncer.py), never on the loop.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tae_driver import limits
from tae_driver.backend import AppendDone
from tae_driver.backends import segment
from tae_driver.backends.segment import FrameType
from tae_driver.backends.segment_files import create_segment, pwrite_all

Fsync = Callable[[int], None]


@dataclass(slots=True)
class _Pending:
    """An append or truncate waiting for a group write. Its frame is encoded only when the
    group is written, because the frame carries the durable LSN as of that write. `done` is
    called on the loop with (lsn, None) once durable, or (lsn, error)."""

    frame_type: FrameType
    lsn: int
    body: bytes
    done: AppendDone

    @property
    def frame_bytes(self) -> int:
        return limits.FILE_FRAME_HEADER_BYTES + len(self.body)


@dataclass(frozen=True, slots=True)
class _GroupResult:
    """What the syncer thread wrote and synced; applied to the index on the loop."""

    offset_bytes: int
    """Where the group's first frame starts in the active segment."""
    frame_bytes: tuple[int, ...]
    durable_lsn: int
    rotated_to: tuple[str, int] | None
    """(path, base_lsn) of the segment created after this group, which is now active."""


@dataclass(slots=True)
class _Writer:
    """The active segment as the syncer thread writes it. After open only that thread reads
    or changes it (the loop reads `written_lsn` for tests, and `fd` after the thread ended)."""

    fd: int
    offset_bytes: int
    """Where the next frame goes: the end of the last written frame."""
    allocated_bytes: int
    """The file's size: zeros from `offset_bytes` to here (v3 preallocation)."""
    durable_lsn: int
    written_lsn: int


def write_group(
    writer: _Writer,
    group: list[_Pending],
    dir_path: str,
    segment_bytes_max: int,
    preallocate_bytes: int,
    fsync: Fsync,
) -> _GroupResult:
    """In the syncer thread: write the group's frames at the writer's offset with one
    pwrite, one fdatasync, and roll to a new segment past the rotation size."""
    # Every frame of the group carries the durable LSN as of this group write: the
    # previous group's fsync returned before this one starts (FORMAT.md: what the hint
    # proves on recovery).
    assert writer.written_lsn == writer.durable_lsn
    durable_lsn = writer.durable_lsn
    encode = segment.encode_frame
    frames = [
        encode(item.frame_type, item.lsn, item.body, durable_lsn=durable_lsn) for item in group
    ]
    data = b"".join(frames)
    last_lsn = max(
        (item.lsn for item in group if item.frame_type is FrameType.RECORD),
        default=durable_lsn,
    )
    offset = writer.offset_bytes
    end = offset + len(data)
    if end > writer.allocated_bytes:
        # Allocate the next step of zeros: this group's fdatasync commits the new size
        # once, the next groups' write into allocated space.
        want = min(max(segment_bytes_max, end), end + preallocate_bytes)
        os.posix_fallocate(writer.fd, writer.allocated_bytes, want - writer.allocated_bytes)
        writer.allocated_bytes = want
    pwrite_all(writer.fd, data, offset)
    writer.written_lsn = last_lsn
    fsync(writer.fd)
    writer.durable_lsn = last_lsn
    writer.offset_bytes = end
    rotated_to = None
    if end >= segment_bytes_max:
        first = min(preallocate_bytes, segment_bytes_max - _header_bytes())
        path, new_fd = create_segment(dir_path, last_lsn + 1, b"", first)
        os.close(writer.fd)
        writer.fd = new_fd
        writer.offset_bytes = _header_bytes()
        writer.allocated_bytes = _header_bytes() + first
        rotated_to = (path, last_lsn + 1)
    return _GroupResult(offset, tuple(len(f) for f in frames), last_lsn, rotated_to)


def _take_group(queue: deque[_Pending]) -> list[_Pending]:
    """The next group: everything queued, up to `FILE_SYNC_BATCH_*` (at least one item)."""
    group: list[_Pending] = []
    size_bytes = 0
    while queue and len(group) < limits.FILE_SYNC_BATCH_FRAMES_MAX:
        frame_bytes = queue[0].frame_bytes
        if group and size_bytes + frame_bytes > limits.FILE_SYNC_BATCH_BYTES_MAX:
            break
        group.append(queue.popleft())
        size_bytes += frame_bytes
    return group


def _header_bytes() -> int:
    return limits.FILE_SEGMENT_HEADER_BYTES
