"""The file-system port of the shard store, and its real implementation.

Every durable operation the store performs goes through `FileSystem`, so that a test double
(`tests/support/faultfs.py`) can remember which bytes and directory entries were made
durable and then "lose power" (shared/reference/chaos-plan.md §4.5). Nothing in the store
uses mmap or buffered Python file objects: a write is a write, a sync is a sync, and the
double sees each one.

Contract (both implementations):

* `WritableFile.write(data)` appends at the file's current end and either writes every byte
  or raises `OSError`. Bytes written are visible to readers at once (page cache) but durable
  only after `fdatasync()` returns.
* `fdatasync()` makes the file's data and size durable. It does not make the file's
  directory entry durable: a new, renamed or deleted name is durable only after
  `fsync_dir()` of its directory returns (etcd #6368, the reason for rule 4 of
  ARCHITECTURE.md §3).
* `truncate(size)` shortens the file; like a write, it is durable after `fdatasync()`.
* `write_zeros(upto)` extends the file with zero bytes up to `upto` without moving the
  append position: later writes overwrite them in place. The zeros and the new size are
  durable after `fdatasync()`. Why (the shard store's zero-ahead, FORMAT.md "Zero-ahead"):
  on ext4 an fdatasync after a write that grows the file (or fills an fallocated, unwritten
  extent) must commit the file system's journal for the new size or extent state; one that
  only overwrites written blocks flushes the data alone.
  `size()` is the append position, not the file's length on disk.
* Errors are `OSError` with an errno; the store turns them into typed store errors.

Only this module touches `os` for file I/O in the store.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from typing import Protocol

LOCK_FILE_NAME = "LOCK"


class WritableFile(Protocol):
    """A file opened for appending. One writer at a time (the store serializes writes)."""

    def write(self, data: bytes) -> None: ...

    def truncate(self, size_bytes: int) -> None: ...

    def write_zeros(self, upto_bytes: int) -> None: ...

    def fdatasync(self) -> None: ...

    def size(self) -> int: ...

    def allocated_bytes(self) -> int:
        """The file's length: `size()` plus the zeros `write_zeros` put after it."""

    def close(self) -> None: ...


class ReadableFile(Protocol):
    """A file opened for positional reads; safe to use from any thread."""

    def pread(self, offset_bytes: int, size_bytes: int) -> bytes: ...

    def close(self) -> None: ...


class DirLock(Protocol):
    def release(self) -> None: ...


class FileSystem(Protocol):
    def makedirs(self, dir_path: str) -> None:
        """Create `dir_path` (and parents) if missing, and make the new entries durable."""

    def listdir(self, dir_path: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...

    def file_size(self, path: str) -> int: ...

    def read_file(self, path: str) -> bytes:
        """The whole current content of a file (page cache included)."""

    def open_write(self, path: str, *, create: bool) -> WritableFile:
        """Open for appending. `create=True` requires that the file does not exist yet."""

    def open_read(self, path: str) -> ReadableFile: ...

    def rename(self, src_path: str, dst_path: str) -> None:
        """Atomically replace `dst_path`; durable after `fsync_dir` of the directory."""

    def unlink(self, path: str) -> None: ...

    def fsync_dir(self, dir_path: str) -> None: ...

    def lock_dir(self, dir_path: str) -> DirLock:
        """Take an exclusive lock on the directory; `BlockingIOError` if another holder has it."""


# Zeros per pwrite in `write_zeros`: bounds the buffer, not the extension.
_ZERO_CHUNK_BYTES = 256 * 1024


class _OsWritableFile:
    __slots__ = ("_allocated_bytes", "_fd", "_path", "_size_bytes")

    def __init__(self, path: str, fd: int) -> None:
        self._path = path
        self._fd = fd
        self._size_bytes = os.fstat(fd).st_size
        self._allocated_bytes = self._size_bytes

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, self._size_bytes)
            if written == 0:
                # A zero-length write of a non-empty buffer: treat as out of space rather
                # than spin (bounded retry: this loop only advances).
                raise OSError(errno.ENOSPC, "write returned 0 bytes", self._path)
            self._size_bytes += written
            self._allocated_bytes = max(self._allocated_bytes, self._size_bytes)
            view = view[written:]

    def truncate(self, size_bytes: int) -> None:
        assert 0 <= size_bytes <= self._size_bytes
        os.ftruncate(self._fd, size_bytes)
        self._size_bytes = self._allocated_bytes = size_bytes

    def write_zeros(self, upto_bytes: int) -> None:
        zeros = bytes(min(_ZERO_CHUNK_BYTES, max(0, upto_bytes - self._allocated_bytes)))
        while self._allocated_bytes < upto_bytes:
            chunk = memoryview(zeros)[: upto_bytes - self._allocated_bytes]
            written = os.pwrite(self._fd, chunk, self._allocated_bytes)
            if written == 0:
                raise OSError(errno.ENOSPC, "write returned 0 bytes", self._path)
            self._allocated_bytes += written

    def fdatasync(self) -> None:
        os.fdatasync(self._fd)

    def size(self) -> int:
        return self._size_bytes

    def allocated_bytes(self) -> int:
        return self._allocated_bytes

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class _OsReadableFile:
    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def pread(self, offset_bytes: int, size_bytes: int) -> bytes:
        parts: list[bytes] = []
        remaining = size_bytes
        position = offset_bytes
        while remaining > 0:
            chunk = os.pread(self._fd, remaining, position)
            if not chunk:
                break  # end of file: the caller sees a short read and decides
            parts.append(chunk)
            remaining -= len(chunk)
            position += len(chunk)
        return b"".join(parts)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class _OsDirLock:
    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class OsFileSystem:
    """The real file system: `os` calls, with fdatasync and directory fsync for real."""

    def makedirs(self, dir_path: str) -> None:
        missing: list[str] = []
        path = os.path.abspath(dir_path)
        while not os.path.isdir(path):
            missing.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        os.makedirs(dir_path, exist_ok=True)
        # Each created directory is an entry in its parent: make every one durable.
        for created in reversed(missing):
            self.fsync_dir(os.path.dirname(created))

    def listdir(self, dir_path: str) -> list[str]:
        return sorted(os.listdir(dir_path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def read_file(self, path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _OsReadableFile(fd).pread(0, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def open_write(self, path: str, *, create: bool) -> WritableFile:
        flags = os.O_WRONLY | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        fd = os.open(path, flags, 0o600)
        return _OsWritableFile(path, fd)

    def open_read(self, path: str) -> ReadableFile:
        return _OsReadableFile(os.open(path, os.O_RDONLY | os.O_CLOEXEC))

    def rename(self, src_path: str, dst_path: str) -> None:
        os.rename(src_path, dst_path)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rmdir(self, dir_path: str) -> None:
        """Remove an empty directory (not part of the `FileSystem` port: only the engine's
        object store uses it, for its own temporary directory, engine/objects/store.py)."""
        os.rmdir(dir_path)

    def fsync_dir(self, dir_path: str) -> None:
        fd = os.open(dir_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def lock_dir(self, dir_path: str) -> DirLock:
        fd = os.open(os.path.join(dir_path, LOCK_FILE_NAME), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise
        return _OsDirLock(fd)


class NoSyncFileSystem(OsFileSystem):
    """Real files with every sync skipped. Only for the `nosync` benchmark mode: it shows
    what durability costs. Never used by the service."""

    def open_write(self, path: str, *, create: bool) -> WritableFile:
        real = super().open_write(path, create=create)
        return _NoSyncWritableFile(real)

    def fsync_dir(self, dir_path: str) -> None:
        return None


class _NoSyncWritableFile:
    __slots__ = ("_real",)

    def __init__(self, real: WritableFile) -> None:
        self._real = real

    def write(self, data: bytes) -> None:
        self._real.write(data)

    def truncate(self, size_bytes: int) -> None:
        self._real.truncate(size_bytes)

    def write_zeros(self, upto_bytes: int) -> None:
        self._real.write_zeros(upto_bytes)

    def fdatasync(self) -> None:
        return None

    def size(self) -> int:
        return self._real.size()

    def allocated_bytes(self) -> int:
        return self._real.allocated_bytes()

    def close(self) -> None:
        self._real.close()
