"""The object store port, its local-directory implementation and its in-memory one.

Why a port (shared/STYLE.md "Ports are Protocols with an in-memory implementation next to
them"): the engine's column blocks, delta masks and checkpoints live in an object store, which
is a directory by default and S3 in the cloud (s3.py). The engine sees only `ObjectStore`;
tests and the simulator use `MemoryObjectStore`, which can fail on demand.

The contract, for every implementation:

* **Names** are relative: segments of `[A-Za-z0-9._-]` joined by "/", no segment empty or
  starting with "." (so no "." or "..", and ".tmp" stays the local store's own), at most
  `OBJECT_NAME_BYTES_MAX` bytes and `OBJECT_NAME_SEGMENTS_MAX` segments. Anything else is
  `BadObjectName`, before any I/O. No name may be a directory of another ("a" and "a/b"):
  a file system cannot hold both; the memory and local stores refuse the second
  (`BadObjectName`), S3 does not check (it would cost a list per put), the engine never
  does it.
* **`put` is durable and atomic once it returns**: a reader sees the whole object or nothing,
  and after a crash or power loss the object is either wholly there or absent. Objects are
  immutable: a put of an existing name with different bytes raises `ObjectExists`, with the
  same bytes it succeeds without writing (a retried put, e.g. after an
  `ObjectStoreUnavailable` whose request had landed).
* `get_range(name, offset, length)` returns exactly `length` bytes or raises
  `BadObjectRange`; `open_input` gives a random-access `pyarrow.NativeFile` for Parquet.
* `list(prefix)` returns every object whose name starts with `prefix` (a plain string
  prefix, as S3's), sorted by name.
* `delete` is idempotent: deleting a missing object succeeds.
* Errors are the tree of errors.py: `ObjectNotFound`, `ObjectStoreUnavailable` (transient,
  after bounded retries), `ObjectStoreFailed` (permanent) and its `ObjectStoreFull`.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import posixpath
import re
import threading
import uuid
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Literal, Protocol

import pyarrow as pa

from engine.objects import limits
from engine.objects.errors import (
    BadObjectName,
    BadObjectRange,
    ObjectExists,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreFailed,
    ObjectStoreFull,
    ObjectStoreUnavailable,
)
from logsvc.store.fs import LOCK_FILE_NAME, FileSystem, OsFileSystem, ReadableFile


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    name: str
    size_bytes: int


class ObjectStore(Protocol):
    """Where immutable objects live. Every method may raise the errors of errors.py
    (module docstring: the contract)."""

    description: str
    """"dir:/path" or "s3://bucket/prefix": names the store in errors and logs."""

    def put(self, name: str, data: bytes) -> None: ...

    def get(self, name: str) -> bytes: ...

    def get_range(self, name: str, offset: int, length: int) -> bytes: ...

    def open_input(self, name: str) -> pa.NativeFile: ...

    def size(self, name: str) -> int: ...

    def list(self, prefix: str = "") -> list[ObjectInfo]: ...

    def delete(self, name: str) -> None: ...


# --- Names ------------------------------------------------------------------------------------

_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\Z")


def check_name(description: str, name: object) -> str:
    """`name` if it is a valid object name (module docstring), else `BadObjectName`."""
    if not isinstance(name, str) or not name:
        raise BadObjectName(description, str(name), "an object name is a non-empty string")
    if len(name) > limits.OBJECT_NAME_BYTES_MAX:  # ASCII only past the next check
        raise BadObjectName(
            description, name[:64], f"longer than {limits.OBJECT_NAME_BYTES_MAX} bytes"
        )
    segments = name.split("/")
    if len(segments) > limits.OBJECT_NAME_SEGMENTS_MAX:
        raise BadObjectName(
            description, name, f"more than {limits.OBJECT_NAME_SEGMENTS_MAX} segments"
        )
    for segment in segments:
        if not _SEGMENT.match(segment):
            raise BadObjectName(
                description,
                name,
                f"segment {segment!r} is not [A-Za-z0-9._-]+ without a leading '.'",
            )
        if len(segment) > limits.OBJECT_NAME_SEGMENT_BYTES_MAX:
            raise BadObjectName(
                description,
                name,
                f"a segment is longer than {limits.OBJECT_NAME_SEGMENT_BYTES_MAX} bytes",
            )
    return name


def check_prefix(description: str, prefix: object) -> str:
    """A list prefix: any string a name could start with (empty lists everything)."""
    if not isinstance(prefix, str) or len(prefix) > limits.OBJECT_NAME_BYTES_MAX:
        raise BadObjectName(description, str(prefix)[:64], "not a valid list prefix")
    if prefix and not re.fullmatch(r"[A-Za-z0-9._/-]*", prefix):
        raise BadObjectName(description, prefix, "a list prefix uses the name alphabet only")
    return prefix


def check_size(description: str, name: str, data: bytes) -> None:
    if len(data) > limits.OBJECT_BYTES_MAX:
        raise ObjectStoreFailed(
            description,
            name,
            f"{len(data)} bytes is more than object_bytes_max {limits.OBJECT_BYTES_MAX}",
        )


def check_range(description: str, name: str, offset: int, length: int, size_bytes: int) -> None:
    assert isinstance(offset, int)
    assert isinstance(length, int)
    if offset < 0 or length < 0 or offset + length > size_bytes:
        raise BadObjectRange(description, name, offset, length, size_bytes)


# --- The local directory ----------------------------------------------------------------------

TEMP_DIR_NAME = ".tmp"
"""Under the root: where puts write before their rename, and the lock file. A name cannot
start with ".", so it never collides with an object."""

_LOCK_STRIPES = 64


class LocalDirStore:
    """Objects as files under `root`: object "a/b.parquet" is the file `root/a/b.parquet`,
    so DuckDB or Spark can read the objects in place.

    Put: write `root/.tmp/<random>`, fdatasync it, make the object's directory (fsyncing
    every directory created on the way: `FileSystem.makedirs`), rename the temporary file onto
    the final name, fsync the final directory. Crash cases:

    * before the rename: only a temporary file exists; it is removed at the next open.
    * after the rename, before the directory fsync: after a process crash the object is
      there (the page cache survives); after a power loss it is there or absent, never
      partial, because its bytes were synced before the name pointed at them.
    * after the fsync: durable.

    A put that finds its name already there compares the bytes (a retried put) and fsyncs the
    directory again, since the earlier put may have died before its fsync.

    Each store writes its temporary files in a directory of its own (`root/.tmp/<random>/`),
    locked while it is open; opening removes the temporary files of the directories whose
    lock it can take (their store is gone), never those of a live store. So several stores
    may write one root: two engines on one directory while the WAL's lease decides which of
    them may commit (decision 0007). Objects are immutable and named by random ids, so they
    never collide. `read_only=True` takes no lock and removes nothing (for tools reading a
    live engine's directory, and for a standby), and refuses puts and deletes.

    Delete: unlink, then fsync the directory. Emptied directories stay (the port cannot
    remove directories; they cost a listdir in `list` and nothing else).

    Every file operation goes through the `FileSystem` port of logsvc/store/fs.py, so that
    tests run this class over `tests/support/faultfs.py` and cut the power at every step.
    """

    def __init__(self, root: str, fs: FileSystem | None = None, *, read_only: bool = False) -> None:
        self.root = os.path.abspath(root) if fs is None else posixpath.normpath(root)
        self.description = f"dir:{self.root}"
        self._fs: FileSystem = fs if fs is not None else OsFileSystem()
        self._read_only = read_only
        self._stripes = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        temp_root = posixpath.join(self.root, TEMP_DIR_NAME)
        self._temp_dir = posixpath.join(temp_root, uuid.uuid4().hex)
        self._lock = None
        if read_only:
            return
        try:
            self._fs.makedirs(self._temp_dir)
            self._lock = self._fs.lock_dir(self._temp_dir)
            for other in self._fs.listdir(temp_root):
                if other != posixpath.basename(self._temp_dir):
                    self._clean_temp(posixpath.join(temp_root, other))
        except OSError as exc:
            raise _os_error(self.description, "", exc) from None

    def _clean_temp(self, path: str) -> None:
        """Remove the temporary files of another store on this root if it is gone (its
        directory's lock can be taken); one still open keeps its files. Each store writes
        its temporary files in a directory of its own, so several writers may share a root
        (a new engine fencing an old one through the WAL's lease, decision 0007)."""
        try:
            lock = self._fs.lock_dir(path)
        except BlockingIOError:
            return  # alive
        except (NotADirectoryError, FileNotFoundError):
            with contextlib.suppress(FileNotFoundError):
                self._fs.unlink(path)  # a temporary file of an earlier layout, or a stale lock
            return
        try:
            for leftover in self._fs.listdir(path):
                if leftover != LOCK_FILE_NAME:
                    self._fs.unlink(posixpath.join(path, leftover))
            self._fs.fsync_dir(path)
            self._remove_temp_dir(path)
        finally:
            lock.release()

    def _remove_temp_dir(self, path: str) -> None:
        """Remove an emptied temporary directory whose lock this store holds: its LOCK file
        first (still locked through the open descriptor), then the directory. A store that
        opens meanwhile and creates a new LOCK in it makes the `rmdir` fail: the directory
        then stays, empty, and the next open removes it. (Every open used to leave its
        directory behind, issue 20: `.tmp/` grew by one per engine open.)"""
        rmdir = getattr(self._fs, "rmdir", None)
        if rmdir is None:
            return  # a FileSystem port without directory removal (test doubles)
        with contextlib.suppress(FileNotFoundError):
            self._fs.unlink(posixpath.join(path, LOCK_FILE_NAME))
        with contextlib.suppress(OSError):
            rmdir(path)

    @property
    def read_only(self) -> bool:
        return self._read_only

    def close(self) -> None:
        """Remove this store's temporary directory and release its lock. Puts after this
        are a programmer error."""
        if self._lock is not None:
            lock, self._lock = self._lock, None
            try:
                with contextlib.suppress(OSError):
                    for leftover in self._fs.listdir(self._temp_dir):
                        if leftover != LOCK_FILE_NAME:
                            self._fs.unlink(posixpath.join(self._temp_dir, leftover))
                    self._remove_temp_dir(self._temp_dir)
            finally:
                lock.release()

    def __enter__(self) -> LocalDirStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path_of(self, name: str) -> str:
        """The file holding object `name` (for tools that read the objects in place)."""
        return posixpath.join(self.root, check_name(self.description, name))

    # --- ObjectStore --------------------------------------------------------------------------

    def put(self, name: str, data: bytes) -> None:
        path = self.path_of(name)
        check_size(self.description, name, data)
        if self._read_only:
            raise ObjectStoreFailed(self.description, name, "the store is open read-only")
        directory = posixpath.dirname(path)
        with self._stripe(name):
            try:
                if self._same_object(name, path, data):
                    self._fs.fsync_dir(directory)
                    return
                self._make_parent(name, directory)
                temp = posixpath.join(self._temp_dir, uuid.uuid4().hex)
                try:
                    self._write_synced(temp, data)
                    self._fs.rename(temp, path)
                except BaseException:
                    self._remove_quietly(temp)
                    raise
                self._fs.fsync_dir(directory)
            except OSError as exc:
                raise _os_error(self.description, name, exc) from None

    def get(self, name: str) -> bytes:
        path = self.path_of(name)
        try:
            return self._fs.read_file(path)
        except OSError as exc:
            raise _os_error(self.description, name, exc, reading=True) from None

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        path = self.path_of(name)
        try:
            size_bytes = self._object_size(name, path)
            check_range(self.description, name, offset, length, size_bytes)
            handle = self._fs.open_read(path)
            try:
                data = handle.pread(offset, length)
            finally:
                handle.close()
        except OSError as exc:
            raise _os_error(self.description, name, exc, reading=True) from None
        if len(data) != length:  # the file is shorter than its size said: not our object
            raise ObjectStoreFailed(self.description, name, "short read inside the object")
        return data

    def open_input(self, name: str) -> pa.NativeFile:
        path = self.path_of(name)
        try:
            size_bytes = self._object_size(name, path)
            if type(self._fs) is OsFileSystem:
                # The real file system: pyarrow reads the file itself, with no Python call
                # per read (this is the engine's hot path for Parquet blocks).
                return pa.OSFile(path, mode="r")
            return pa.PythonFile(_PortReader(self._fs.open_read(path), size_bytes), mode="r")
        except OSError as exc:
            raise _os_error(self.description, name, exc, reading=True) from None

    def size(self, name: str) -> int:
        path = self.path_of(name)
        try:
            return self._object_size(name, path)
        except OSError as exc:
            raise _os_error(self.description, name, exc, reading=True) from None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(self.description, prefix)
        # Start at the deepest directory the prefix names wholly: "tables/7/ab" walks
        # "tables/7" and keeps the names starting with the prefix.
        start = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        found: builtins.list[ObjectInfo] = []
        try:
            self._walk(start, prefix, found)
        except OSError as exc:
            raise _os_error(self.description, "", exc) from None
        found.sort(key=lambda info: info.name)
        return found

    def delete(self, name: str) -> None:
        path = self.path_of(name)
        if self._read_only:
            raise ObjectStoreFailed(self.description, name, "the store is open read-only")
        with self._stripe(name):
            try:
                try:
                    self._fs.unlink(path)
                except (FileNotFoundError, NotADirectoryError):
                    return
                self._fs.fsync_dir(posixpath.dirname(path))
            except IsADirectoryError:
                return  # a directory of other objects, not an object: nothing to delete
            except OSError as exc:
                raise _os_error(self.description, name, exc) from None

    # --- Private --------------------------------------------------------------------------------

    def _object_size(self, name: str, path: str) -> int:
        """The size of the file at `path`; ObjectNotFound if it is missing or a directory."""
        try:
            self._fs.listdir(path)
        except NotADirectoryError:
            return self._fs.file_size(path)
        # A directory (of other objects), or nothing: listdir raised FileNotFoundError.
        raise ObjectNotFound(self.description, name)

    def _stripe(self, name: str) -> threading.Lock:
        return self._stripes[zlib.crc32(name.encode()) % _LOCK_STRIPES]

    def _same_object(self, name: str, path: str, data: bytes) -> bool:
        """True if `path` holds exactly `data`; ObjectExists if it holds other bytes."""
        try:
            existing = self._fs.read_file(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except IsADirectoryError:
            raise BadObjectName(
                self.description, name, "is the directory of other objects"
            ) from None
        if existing != data:
            raise ObjectExists(self.description, name)
        return True

    def _make_parent(self, name: str, directory: str) -> None:
        try:
            self._fs.makedirs(directory)
        except (FileExistsError, NotADirectoryError):
            raise BadObjectName(
                self.description, name, "a directory of this name is an object"
            ) from None

    def _write_synced(self, temp: str, data: bytes) -> None:
        handle = self._fs.open_write(temp, create=True)
        try:
            handle.write(data)
            handle.fdatasync()
        finally:
            handle.close()

    def _remove_quietly(self, temp: str) -> None:
        # A leftover temporary file is removed at the next open.
        with contextlib.suppress(OSError):
            self._fs.unlink(temp)

    def _walk(self, relative_dir: str, prefix: str, found: builtins.list[ObjectInfo]) -> None:
        directory = posixpath.join(self.root, relative_dir) if relative_dir else self.root
        try:
            entries = self._fs.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.startswith("."):
                continue  # .tmp, and anything that is not an object
            name = f"{relative_dir}/{entry}" if relative_dir else entry
            # Descend only where names with the prefix can be.
            if not (name.startswith(prefix) or prefix.startswith(name + "/")):
                continue
            path = posixpath.join(directory, entry)
            try:
                self._fs.listdir(path)
            except NotADirectoryError:
                if name.startswith(prefix) and _SEGMENT.match(entry):
                    with contextlib.suppress(FileNotFoundError):  # deleted while we walked
                        found.append(ObjectInfo(name, self._fs.file_size(path)))
                continue
            except FileNotFoundError:
                continue  # deleted while we walked
            self._walk(name, prefix, found)


class _PortReader(io.RawIOBase):
    """A `ReadableFile` of the port as a Python file for `pyarrow.PythonFile` (used when the
    port is not the real file system: tests over FaultFS)."""

    def __init__(self, handle: ReadableFile, size_bytes: int) -> None:
        super().__init__()
        self._handle = handle
        self._size_bytes = size_bytes
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size_bytes}
        self._position = base[whence] + offset
        assert self._position >= 0
        return self._position

    def tell(self) -> int:
        return self._position

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self._size_bytes - self._position)
        data = self._handle.pread(self._position, size)
        self._position += len(data)
        return data

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()


def _os_error(
    description: str, name: str, exc: OSError, *, reading: bool = False
) -> ObjectStoreError:
    """The typed error for an OSError of the local file system."""
    detail = f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, '?')})"
    if reading and isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return ObjectNotFound(description, name)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ObjectStoreFull(description, name, detail)
    return ObjectStoreFailed(description, name, detail)


# --- In memory --------------------------------------------------------------------------------

_InjectableError = ObjectStoreUnavailable | ObjectStoreFailed | ObjectNotFound
"""The errors `fail_next` can inject (their constructors take description, name, detail)."""

FaultOp = Literal["put", "get", "list", "delete", "size"]
"""What `MemoryObjectStore.fail_next` can fail: "get" covers get, get_range and open_input."""


@dataclass(slots=True)
class _Fault:
    op: FaultOp
    count: int
    error: type[_InjectableError]
    after_effect: bool


class MemoryObjectStore:
    """The port in memory: for tests and the simulator. Thread-safe (one lock).

    Faults (`fail_next`): the next `count` calls of an operation raise `error`
    (`ObjectStoreUnavailable` by default). For a put, `after_effect=False` models a put
    interrupted before the store committed it (a crash, a cut connection): nothing is stored,
    as the port promises; `after_effect=True` models the ambiguous outcome of a put whose
    request landed but whose answer was lost (a timeout): the object is stored and the
    caller gets the error all the same. `crash()` drops every pending fault (a restarted
    process sees the durable state, which here is all of it).
    """

    def __init__(self, description: str = "memory:") -> None:
        self.description = description
        self._objects: dict[str, bytes] = {}
        self._directories: Counter[str] = Counter()  # proper prefixes "a", "a/b" of names
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self.put_count = 0
        self.get_count = 0

    def fail_next(
        self,
        op: FaultOp,
        count: int = 1,
        *,
        error: type[_InjectableError] = ObjectStoreUnavailable,
        after_effect: bool = False,
    ) -> None:
        assert count >= 1
        assert not after_effect or op in ("put", "delete")
        with self._lock:
            self._faults.append(_Fault(op, count, error, after_effect))

    def crash(self) -> None:
        with self._lock:
            self._faults.clear()

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._objects)

    # --- ObjectStore --------------------------------------------------------------------------

    def put(self, name: str, data: bytes) -> None:
        check_name(self.description, name)
        check_size(self.description, name, data)
        data = bytes(data)
        with self._lock:
            fault = self._due("put")
            if fault is not None and not fault.after_effect:
                raise self._raise(fault, name)
            existing = self._objects.get(name)
            if existing is not None and existing != data:
                raise ObjectExists(self.description, name)
            self._check_no_directory_clash(name)
            if existing is None:
                self._directories.update(_directories_of(name))
            self._objects[name] = data
            self.put_count += 1
            if fault is not None:
                raise self._raise(fault, name)

    def get(self, name: str) -> bytes:
        return self._read(name)

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        data = self._read(name)
        check_range(self.description, name, offset, length, len(data))
        return data[offset : offset + length]

    def open_input(self, name: str) -> pa.NativeFile:
        return pa.BufferReader(pa.py_buffer(self._read(name)))

    def size(self, name: str) -> int:
        check_name(self.description, name)
        with self._lock:
            fault = self._due("size")
            if fault is not None:
                raise self._raise(fault, name)
            data = self._objects.get(name)
        if data is None:
            raise ObjectNotFound(self.description, name)
        return len(data)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(self.description, prefix)
        with self._lock:
            fault = self._due("list")
            if fault is not None:
                raise self._raise(fault, "")
            return [
                ObjectInfo(name, len(data))
                for name, data in sorted(self._objects.items())
                if name.startswith(prefix)
            ]

    def delete(self, name: str) -> None:
        check_name(self.description, name)
        with self._lock:
            fault = self._due("delete")
            if fault is not None and not fault.after_effect:
                raise self._raise(fault, name)
            if self._objects.pop(name, None) is not None:
                self._directories.subtract(_directories_of(name))
                self._directories = +self._directories  # drop the zero counts
            if fault is not None:
                raise self._raise(fault, name)

    # --- Private --------------------------------------------------------------------------------

    def _read(self, name: str) -> bytes:
        check_name(self.description, name)
        with self._lock:
            fault = self._due("get")
            if fault is not None:
                raise self._raise(fault, name)
            data = self._objects.get(name)
            self.get_count += 1
        if data is None:
            raise ObjectNotFound(self.description, name)
        return data

    def _due(self, op: FaultOp) -> _Fault | None:
        for fault in self._faults:
            if fault.op == op:
                fault.count -= 1
                if fault.count == 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _raise(self, fault: _Fault, name: str) -> ObjectStoreError:
        return fault.error(self.description, name, f"injected {fault.error.__name__}")

    def _check_no_directory_clash(self, name: str) -> None:
        """A file system cannot hold "a" and "a/b"; refuse here too, so that tests over this
        store catch what LocalDirStore would refuse."""
        if any(directory in self._objects for directory in _directories_of(name)):
            raise BadObjectName(self.description, name, "a directory of this name is an object")
        if self._directories[name]:
            raise BadObjectName(self.description, name, "is the directory of other objects")


def _directories_of(name: str) -> list[str]:
    """ "a/b/c" -> ["a", "a/b"]."""
    parts = name.split("/")
    return ["/".join(parts[:depth]) for depth in range(1, len(parts))]
