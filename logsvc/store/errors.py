"""Operating errors of the shard store.

Callers handle these; programmer errors (appending a gap, truncating below the log start)
are assertions and crash. The tree:

    StoreError
    ├── Corruption(path, offset_bytes, reason)   bad bytes found where whole data must be
    ├── StoreIOError(errno, op, path)            an OS error while writing or syncing
    │   └── DiskFull                              ENOSPC / EDQUOT
    ├── StoreFailed(cause)                        a write or sync failed earlier: the store
    │                                             accepts no more writes until reopened
    ├── StoreLocked(dir_path)                     another process holds the directory
    ├── Compacted(first_index)                    the index is below the log start
    ├── RecordTooLarge(size_bytes, max_bytes)
    ├── StoreClosed
    ├── SyncTimeout(index, waited_ms)             a durability wait gave up
    ├── EntryTruncated(index, last_index)         a waited-for entry was cut before durable
    └── JournalSyncTimeout(waited_ms)             (journal.py) the node journal's I/O lock was
                                                  busy too long; the store raises SyncTimeout
"""

from __future__ import annotations

import errno as errno_codes


class StoreError(Exception):
    """Base of every operating error raised by the shard store."""


class Corruption(StoreError):
    """Bytes that must be whole are not: named by file and offset, never served as data."""

    def __init__(self, path: str, offset_bytes: int, reason: str) -> None:
        super().__init__(f"corruption in {path} at offset {offset_bytes}: {reason}")
        self.path = path
        self.offset_bytes = offset_bytes
        self.reason = reason


class StoreIOError(StoreError):
    """The OS refused a write, sync, create, rename or delete. Nothing it covered is durable."""

    def __init__(self, errno: int, op: str, path: str, message: str = "") -> None:
        text = message or errno_codes.errorcode.get(errno, str(errno))
        super().__init__(f"{op} failed on {path}: [{errno}] {text}")
        self.errno = errno
        self.op = op
        self.path = path


class DiskFull(StoreIOError):
    """ENOSPC or EDQUOT: the disk has no room for the write."""


class StoreFailed(StoreError):
    """An earlier write or sync failed. Per fsyncgate (PostgreSQL, 2018) a failed fsync is
    never retried as if the data were then durable: the store refuses further writes and
    must be reopened, which recovers from what is really on disk. Reads still work."""

    def __init__(self, cause: StoreError) -> None:
        super().__init__(f"store failed and must be reopened: {cause}")
        self.cause = cause


class StoreLocked(StoreError):
    def __init__(self, dir_path: str) -> None:
        super().__init__(f"store directory {dir_path} is locked by another process")
        self.dir_path = dir_path


class Compacted(StoreError):
    """The requested index was truncated away (prefix truncation)."""

    def __init__(self, index: int, first_index: int) -> None:
        super().__init__(f"index {index} is below the log start {first_index}")
        self.index = index
        self.first_index = first_index


class RecordTooLarge(StoreError):
    def __init__(self, size_bytes: int, max_bytes: int) -> None:
        super().__init__(f"payload of {size_bytes} bytes exceeds the limit of {max_bytes}")
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


class StoreClosed(StoreError):
    def __init__(self) -> None:
        super().__init__("store is closed")


class SyncTimeout(StoreError):
    def __init__(self, index: int, waited_ms: int) -> None:
        super().__init__(f"entry {index} not durable after {waited_ms} ms")
        self.index = index
        self.waited_ms = waited_ms


class EntryTruncated(StoreError):
    """A waited-for entry was removed by a suffix truncation before it became durable."""

    def __init__(self, index: int, last_index: int) -> None:
        super().__init__(f"entry {index} was truncated (log now ends at {last_index})")
        self.index = index
        self.last_index = last_index


class JournalSyncTimeout(StoreError):
    """The node journal's disk did not finish the syncs ahead of this one in time."""

    def __init__(self, waited_ms: int) -> None:
        super().__init__(f"journal sync not done after {waited_ms} ms")
        self.waited_ms = waited_ms


def io_error(exc: OSError, op: str, path: str) -> StoreIOError:
    """Map an OSError to the typed store error (DiskFull for ENOSPC/EDQUOT)."""
    code = exc.errno if exc.errno is not None else errno_codes.EIO
    cls = DiskFull if code in (errno_codes.ENOSPC, errno_codes.EDQUOT) else StoreIOError
    return cls(code, op, path, exc.strerror or "")
