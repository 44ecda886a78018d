"""The file backend's operations on segment files and the directory (blocking; run off the
loop: in the syncer thread or `asyncio.to_thread`).

Why a module of its own: `file.py` and its open (`file_recovery.py`) hold the backend's
decisions (what to cut, what to delete, when to acknowledge); these are the system calls
it makes, each with the order that makes it crash-safe: a segment is created as `*.tmp`,
given its header and its allocated zeros, fsynced, renamed and the directory fsynced (so a
segment with its final name always has a whole header and its allocation); deletions go
oldest first, then one directory fsync.
"""

from __future__ import annotations

import contextlib
import os

from tae_driver import limits
from tae_driver.backends import segment
from tae_driver.errors import StorageCorruption

TMP_SUFFIX = ".tmp"

ReadStep = tuple[str, int, int, int, int, int]
"""(path, file offset, byte count, first LSN, record count, segment version)."""


def create_segment(
    dir_path: str, base_lsn: int, first_frames: bytes, preallocate_bytes: int
) -> tuple[str, int]:
    """Create a segment durably (tmp, header and `first_frames`, `preallocate_bytes` of
    allocated zeros after them, fsync, rename, dir fsync); return path and a descriptor to
    write at offsets (no O_APPEND). The rename replaces a file of the same name atomically
    (a version 1 or 2 segment with no records, rolled to version 3 on open)."""
    assert preallocate_bytes > 0
    path = os.path.join(dir_path, segment.segment_file_name(base_lsn))
    tmp_path = path + TMP_SUFFIX
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        header = segment.encode_segment_header(base_lsn) + first_frames
        pwrite_all(fd, header, 0)
        os.posix_fallocate(fd, len(header), preallocate_bytes)
        os.fsync(fd)
        os.rename(tmp_path, path)
        fsync_dir(dir_path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_path)
        raise
    return path, fd


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError("write made no progress")
        view = view[written:]
        offset += written


def fsync_dir(dir_path: str) -> None:
    fd = os.open(dir_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def delete_segments(dir_path: str, paths: list[str]) -> None:
    for path in paths:  # oldest first: an interrupted deletion leaves a suffix
        os.unlink(path)
    fsync_dir(dir_path)


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def read_sync(plan: list[ReadStep], open_fds: dict[str, int]) -> list[tuple[int, bytes]]:
    """`open_fds`: a read-only backend's descriptors by path (else each file is opened)."""
    out: list[tuple[int, bytes]] = []
    for path, offset, size_bytes, first_lsn, count, version in plan:
        held = open_fds.get(path)
        fd = os.open(path, os.O_RDONLY) if held is None else held
        try:
            data = os.pread(fd, size_bytes, offset)
        finally:
            if held is None:
                os.close(fd)
        if len(data) != size_bytes:
            raise StorageCorruption(path, offset + len(data), "segment shorter than its index")
        out.extend(segment.decode_records_in(data, path, offset, first_lsn, count, version=version))
    return out


def read_all(fd: int) -> bytes:
    """A whole file from its start (the file may be growing: what is there now)."""
    chunks = []
    offset = 0
    while chunk := os.pread(fd, limits.FILE_SYNC_BATCH_BYTES_MAX, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def note_lock_holder(lock_fd: int) -> None:
    """Write this process's pid into the lock file it holds, so that a second process can
    say who holds it (issue 20). Not synced: it only matters while this process lives."""
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)


def lock_holder(lock_fd: int) -> int | None:
    """The pid the lock's holder wrote, or None (none written yet, or an older version)."""
    text = os.pread(lock_fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None
