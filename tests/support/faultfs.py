"""FaultFS: an in-memory, fault-injecting `FileSystem` (logsvc/store/fs.py) for tests.

What it is for (shared/reference/chaos-plan.md §4.5, §4.11): the shard store performs every
file operation through the `FileSystem` port. Run over `FaultFS`, a test can crash the
"process", cut the power, make a call fail with a chosen errno, or damage bytes "on disk",
and then check that recovery keeps every acknowledged (synced) entry, never returns
garbage, and reports corruption. Nothing touches real files; there are no sleeps.

Durability model
----------------
* A file object ("inode") has its *content* (what readers see: the page cache) and its
  *durable content* (the bytes as of its last successful `fdatasync`). A new file's durable
  content is b"".
* A directory has its *current* entries (name -> inode) and its *durable* entries (as of its
  last `fsync_dir`). Create, rename and unlink change only the current entries; an inode
  lives on while an open handle or a durable entry refers to it (POSIX: unlink of an open
  file removes the name, not the file). `fdatasync` does not make a name durable (etcd
  #6368): a file written and synced but whose directory was never synced vanishes on power
  loss. Directories are independent: a rename across two directories needs both synced.
* Directories themselves are durable as soon as `makedirs` returns (the real implementation
  fsyncs every parent), and are never removed.
* `lock_dir` creates a `LOCK` file in the directory, as `OsFileSystem` does, so `listdir`
  shows it on both; the lock itself dies with the process.

Faults
------
* `crash()`: SIGKILL. The page cache survives (content and current entries stay), every
  handle opened before it is dead (any call but `close` raises EIO: code of the dead
  process that is still running in the test fails loudly), locks are released.
* `power_loss(mode, rng)`: a crash plus loss of what was not synced. Names revert to the
  durable entries; each surviving file gets a content chosen by `mode`:
  - `trunc`: exactly the durable content. The well-behaved disk: writeback of unsynced
    pages never happened.
  - `torn`: the durable content plus a random prefix of the unsynced bytes, and with
    probability 1/2 the last 1..64 kept bytes replaced by garbage. Writeback stopped half
    way and the last sector was torn (sector writes are not atomic; LevelDB log_format.md
    and ALICE treat this as a torn tail).
  - `zeros`: the file keeps a random length (its full current length with probability
    1/2) but random 4 KiB pages of the unsynced region read as zeros. The journal
    committed the new size (metadata) but the data blocks were never written, so they read
    as zeros: ext4 delayed allocation as chaos-plan §4.5 cites it, ext4 data=writeback, XFS
    files full of NULs after a crash. A page that straddles the durable length is zeroed
    only from that length on: synced bytes are never damaged by a power loss.
  If a file was truncated and rewritten since its last sync (current content does not
  extend the durable content), the result is either the durable content or the common
  prefix of both plus a random prefix of the rest of the current content (the truncate
  reached the disk), damaged as the mode says.
* `inject_error(op, err, ...)`: the next matching calls raise `OSError(err)`. A failing
  `write` with `partial=True` first appends a random-length strict prefix of the data, as
  a disk filling up does (the real `write` loop stops at the first failing `pwrite`). A
  failing `fdatasync` models fsyncgate (PostgreSQL, 2018): Linux marks the dirty pages
  clean although they never reached the disk, so readers still see the bytes that were
  unsynced at that moment but the disk holds zeros there, and a later successful
  `fdatasync` does not bring them back. A store that retries fsync and then acks is caught
  by the next power loss.
* Offline damage (`flip_bit`, `set_bytes`, `truncate_file`): applied to the content and to
  the durable content alike, i.e. "on disk"; used while the node is down (§4.5). Not traced.

Trace mode (§4.5 "Crash-state enumeration"): with `trace=True` (or after `start_trace()`)
every mutating operation is recorded. `crash_states(rng, torn_variants)` replays each prefix
of the trace that ends at a sync (and the empty prefix) into a fresh `FaultFS`, cuts the
power in `trunc` mode, and also yields torn variants of the next write. Each state says where
it came from in `crash_point`. A power loss ends trace mode.

Writes go at the handle's append position: the end of the file when it was opened, or
of the handle's last write. `write_zeros` extends the file past it (the store's zero-ahead,
logsvc/store/FORMAT.md), so later writes overwrite those zeros in place. A power loss after
such an overwrite keeps the durable content or, as after a truncate and rewrite, the
common prefix plus a prefix of the rest (the file may end early: a conservative model of
pages of the overwrite that never reached the disk).

Limits: writes overwrite or append, never leave a hole; directories cannot be renamed, removed,
opened or sized (EISDIR); paths are POSIX strings normalised with `posixpath.normpath` ("/"
and "." always exist); `fdatasync` copies the whole file (fine for test-sized segments).
"""

from __future__ import annotations

import copy
import errno
import os
import posixpath
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, get_args

from logsvc.store.fs import LOCK_FILE_NAME, DirLock, FileSystem, ReadableFile, WritableFile

PowerLossMode = Literal["trunc", "torn", "zeros"]
NamesMode = Literal["revert", "keep", "random"]
FaultOp = Literal[
    "write",
    "fdatasync",
    "truncate",
    "open_write",
    "open_read",
    "read_file",
    "rename",
    "unlink",
    "fsync_dir",
    "pread",
]
POWER_LOSS_MODES: tuple[PowerLossMode, ...] = get_args(PowerLossMode)
FAULT_OPS: tuple[FaultOp, ...] = get_args(FaultOp)

# The unit of ext4 delayed allocation, hence of `zeros` damage.
PAGE_SIZE_BYTES = 4096
# A torn sector: at most this many trailing bytes of garbage (chaos-plan §4.5 torn_tail).
GARBAGE_BYTES_MAX = 64

_ROOTS = ("/", ".")
_SYNC_KINDS = ("fdatasync", "fsync_dir")


def _norm(path: str) -> str:
    return posixpath.normpath(path)


def _split(path: str) -> tuple[str, str]:
    """(directory, name) of a normalised path."""
    dir_path, name = posixpath.split(path)
    return dir_path or ".", name


def _error(code: int, path: str, detail: str = "") -> OSError:
    # OSError(errno, ...) returns the matching subclass (FileNotFoundError, ...).
    return OSError(code, detail or os.strerror(code), path)


def _common_prefix_len(a: bytes, b: bytes) -> int:
    """Binary search over slice comparisons: memcmp speed on megabyte files."""
    lo, hi = 0, min(len(a), len(b))  # invariant: a[:lo] == b[:lo]; the answer is <= hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Inode:
    """One file object. `lost_ranges` are [lo, hi) byte ranges whose writeback failed
    (fsyncgate): readers see `content`, the disk holds zeros there."""

    __slots__ = ("content", "durable", "ino", "lost_ranges")

    def __init__(self, ino: int) -> None:
        self.ino = ino
        self.content = bytearray()
        self.durable = b""
        self.lost_ranges: list[tuple[int, int]] = []

    def disk_view(self) -> bytes:
        """The content as writeback would put it on disk."""
        if not self.lost_ranges:
            return bytes(self.content)
        view = bytearray(self.content)
        for lo, hi in self.lost_ranges:
            view[lo:hi] = bytes(hi - lo)
        return bytes(view)

    def write_at(self, offset_bytes: int, data: bytes) -> None:
        """Overwrite from `offset_bytes` (at most the length: no holes), extending if needed."""
        assert 0 <= offset_bytes <= len(self.content)
        self.content[offset_bytes : offset_bytes + len(data)] = data

    def truncate(self, size_bytes: int) -> None:
        assert 0 <= size_bytes <= len(self.content)
        del self.content[size_bytes:]
        self.lost_ranges = [
            (lo, min(hi, size_bytes)) for lo, hi in self.lost_ranges if lo < size_bytes
        ]

    def sync(self) -> None:
        self.durable = self.disk_view()

    def fail_sync(self) -> None:
        lo = _common_prefix_len(self.durable, self.disk_view())
        if lo < len(self.content):
            self.lost_ranges.append((lo, len(self.content)))

    def settle(self, content: bytes) -> None:
        """After a power loss: `content` is what the disk holds, and all of it is durable."""
        self.content = bytearray(content)
        self.durable = content
        self.lost_ranges = []


class _Dir:
    __slots__ = ("current", "durable")

    def __init__(self) -> None:
        self.current: dict[str, _Inode] = {}
        self.durable: dict[str, _Inode] = {}


class _State:
    """The whole file system: what `copy.deepcopy` snapshots for trace replay."""

    __slots__ = ("dirs", "next_ino")

    def __init__(self) -> None:
        self.dirs: dict[str, _Dir] = {root: _Dir() for root in _ROOTS}
        self.next_ino = 1

    def directory(self, dir_path: str) -> _Dir:
        found = self.dirs.get(dir_path)
        if found is not None:
            return found
        raise _error(errno.ENOTDIR if self.is_file(dir_path) else errno.ENOENT, dir_path)

    def is_file(self, path: str) -> bool:
        dir_path, name = _split(path)
        parent = self.dirs.get(dir_path)
        return parent is not None and name in parent.current

    def file(self, path: str) -> _Inode:
        if path in self.dirs:
            raise _error(errno.EISDIR, path)
        dir_path, name = _split(path)
        parent = self.dirs.get(dir_path)
        inode = parent.current.get(name) if parent is not None else None
        if inode is None:
            raise _error(errno.ENOENT, path)
        return inode

    def makedirs(self, dir_path: str) -> list[str]:
        """Create `dir_path` and missing parents; return the created paths, parents first."""
        missing: list[str] = []
        path = dir_path
        while path not in self.dirs:
            if self.is_file(path):
                raise _error(errno.EEXIST if path == dir_path else errno.ENOTDIR, path)
            missing.append(path)
            path = _split(path)[0]
        missing.reverse()
        for created in missing:
            self.dirs[created] = _Dir()
        return missing

    def create(self, path: str) -> _Inode:
        dir_path, name = _split(path)
        parent = self.directory(dir_path)
        if name in parent.current or path in self.dirs:
            raise _error(errno.EEXIST, path)
        inode = _Inode(self.next_ino)
        self.next_ino += 1
        parent.current[name] = inode
        return inode

    def rename(self, src_path: str, dst_path: str) -> None:
        inode = self.file(src_path)
        dst_dir_path, dst_name = _split(dst_path)
        dst_dir = self.directory(dst_dir_path)
        if dst_path in self.dirs:
            raise _error(errno.EISDIR, dst_path)
        if dst_dir.current.get(dst_name) is inode:
            return  # POSIX: renaming a name onto a link of the same file does nothing
        src_dir_path, src_name = _split(src_path)
        del self.dirs[src_dir_path].current[src_name]
        dst_dir.current[dst_name] = inode

    def unlink(self, path: str) -> None:
        self.file(path)
        dir_path, name = _split(path)
        del self.dirs[dir_path].current[name]

    def fsync_dir(self, dir_path: str) -> None:
        directory = self.directory(dir_path)
        directory.durable = dict(directory.current)

    def listdir(self, dir_path: str) -> list[str]:
        names = set(self.directory(dir_path).current)
        for path in self.dirs:
            parent, name = _split(path)
            if parent == dir_path and name and path not in _ROOTS:
                names.add(name)
        return sorted(names)

    def inodes(self) -> dict[int, _Inode]:
        """Every inode some entry (current or durable) refers to, by number."""
        found: dict[int, _Inode] = {}
        for directory in self.dirs.values():
            for inode in [*directory.current.values(), *directory.durable.values()]:
                found[inode.ino] = inode
        return found

    def power_loss(
        self,
        choose: Callable[[_Inode], bytes],
        names: NamesMode = "revert",
        rng: random.Random | None = None,
    ) -> None:
        """Names not fsynced revert (`revert`), persist (`keep`: a journal commit made them
        durable early), or each does either (`random`); then every surviving inode settles
        on the content `choose` picks."""
        for directory in self.dirs.values():
            directory.current = _surviving_names(directory, names, rng)
            directory.durable = dict(directory.current)
        found: dict[int, _Inode] = {}
        for directory in self.dirs.values():
            for inode in directory.current.values():
                found[inode.ino] = inode
        for ino in sorted(found):
            found[ino].settle(choose(found[ino]))


def _surviving_names(
    directory: _Dir, names: NamesMode, rng: random.Random | None
) -> dict[str, _Inode]:
    if names == "revert":
        return dict(directory.durable)
    if names == "keep":
        return dict(directory.current)
    assert rng is not None
    survivors: dict[str, _Inode] = {}
    for name in sorted(set(directory.current) | set(directory.durable)):
        now, then = directory.current.get(name), directory.durable.get(name)
        pick = now if now is then else rng.choice([now, then])
        if pick is not None:
            survivors[name] = pick
    return survivors


# --- Power-loss content choices -------------------------------------------------------------


def _unsynced_start(durable: bytes, disk: bytes, rng: random.Random) -> int | None:
    """Where the bytes that may or may not have reached the disk begin; None: keep `durable`.

    If the content extends the durable content, it is the durable length. Otherwise the file
    was truncated and rewritten since its last sync: either none of that reached the disk
    (None) or the truncate did, and the rewrite starts after the common prefix.
    """
    if disk.startswith(durable):
        return len(durable)
    if rng.random() < 0.5:
        return None
    return _common_prefix_len(durable, disk)


def _garble_tail(data: bytearray, start: int, rng: random.Random) -> None:
    """With probability 1/2, replace the last 1..64 bytes of data[start:] by garbage."""
    unsynced_bytes = len(data) - start
    if unsynced_bytes == 0 or rng.random() < 0.5:
        return
    garbage_bytes = rng.randint(1, min(GARBAGE_BYTES_MAX, unsynced_bytes))
    data[len(data) - garbage_bytes :] = rng.randbytes(garbage_bytes)


def _zero_pages(data: bytearray, start: int, rng: random.Random) -> None:
    """Zero each 4 KiB page of data[start:] with probability 1/2 (only its part >= start)."""
    first_page_offset = start - start % PAGE_SIZE_BYTES
    for page_offset in range(first_page_offset, len(data), PAGE_SIZE_BYTES):
        if rng.random() < 0.5:
            lo = max(page_offset, start)
            hi = min(page_offset + PAGE_SIZE_BYTES, len(data))
            data[lo:hi] = bytes(hi - lo)


def _trunc_content(inode: _Inode, rng: random.Random) -> bytes:
    return inode.durable


def _torn_content(inode: _Inode, rng: random.Random) -> bytes:
    disk = inode.disk_view()
    start = _unsynced_start(inode.durable, disk, rng)
    if start is None:
        return inode.durable
    kept = bytearray(disk[: rng.randint(start, len(disk))])
    _garble_tail(kept, start, rng)
    return bytes(kept)


def _zeros_content(inode: _Inode, rng: random.Random) -> bytes:
    disk = inode.disk_view()
    start = _unsynced_start(inode.durable, disk, rng)
    if start is None:
        return inode.durable
    # The journal often commits the new size without the data: favour the full length.
    kept_bytes = len(disk) if rng.random() < 0.5 else rng.randint(start, len(disk))
    kept = bytearray(disk[:kept_bytes])
    _zero_pages(kept, start, rng)
    return bytes(kept)


_CONTENT_CHOICES: dict[PowerLossMode, Callable[[_Inode, random.Random], bytes]] = {
    "trunc": _trunc_content,
    "torn": _torn_content,
    "zeros": _zeros_content,
}


# --- Fault injection, statistics, trace ------------------------------------------------------


@dataclass(slots=True)
class _Injection:
    op: FaultOp
    err: int
    path_contains: str
    skip_count: int
    times_left: int
    partial: bool

    def matches(self, op: str, paths: Sequence[str]) -> bool:
        return op == self.op and any(self.path_contains in path for path in paths)


@dataclass(slots=True)
class FaultStats:
    """Counts of successful calls since the FaultFS was made (they survive crashes). A
    partial write that appended bytes counts as a write. `FaultFS.stats` returns a copy."""

    write_count: int = 0
    written_bytes: int = 0
    fdatasync_count: int = 0
    fsync_dir_count: int = 0
    truncate_count: int = 0
    rename_count: int = 0
    unlink_count: int = 0


TraceKind = Literal[
    "mkdir",
    "create",
    "write",
    "truncate",
    "fdatasync",
    "fdatasync_error",
    "rename",
    "unlink",
    "fsync_dir",
]


@dataclass(frozen=True, slots=True)
class _TraceOp:
    """One recorded mutation. File data operations name the inode, not a path: the file may
    have been renamed or unlinked since it was opened."""

    kind: TraceKind
    path: str = ""
    dst_path: str = ""
    ino: int = 0
    data: bytes = b""
    size_bytes: int = 0
    offset_bytes: int = 0  # of a write

    def apply(self, state: _State, inodes: dict[int, _Inode]) -> None:
        kind = self.kind
        if kind == "mkdir":
            state.makedirs(self.path)
        elif kind == "create":
            created = state.create(self.path)
            inodes[created.ino] = created
        elif kind == "rename":
            state.rename(self.path, self.dst_path)
        elif kind == "unlink":
            state.unlink(self.path)
        elif kind == "fsync_dir":
            state.fsync_dir(self.path)
        else:
            assert self.ino in inodes, f"inode {self.ino} was unreachable when tracing began"
            self._apply_to_inode(inodes[self.ino])

    def _apply_to_inode(self, inode: _Inode) -> None:
        if self.kind == "write":
            inode.write_at(self.offset_bytes, self.data)
        elif self.kind == "truncate":
            inode.truncate(self.size_bytes)
        elif self.kind == "fdatasync":
            inode.sync()
        else:
            assert self.kind == "fdatasync_error", self.kind
            inode.fail_sync()


def _replay(base: _State, ops: Sequence[_TraceOp]) -> tuple[_State, dict[int, _Inode]]:
    state = copy.deepcopy(base)
    inodes = state.inodes()
    for op in ops:
        op.apply(state, inodes)
    return state, inodes


def _next_write(ops: Sequence[_TraceOp], start: int) -> int | None:
    """Index of the first non-empty write at or after `start` that comes before any sync."""
    for index in range(start, len(ops)):
        if ops[index].kind in _SYNC_KINDS:
            return None
        if ops[index].kind == "write" and ops[index].data:
            return index
    return None


# --- Handles ----------------------------------------------------------------------------------


class _Handle:
    __slots__ = ("_closed", "_fs", "_generation", "_inode", "_path")

    def __init__(self, fs: FaultFS, inode: _Inode, path: str) -> None:
        self._fs = fs
        self._inode = inode
        self._path = path
        self._generation = fs._generation
        self._closed = False

    def _check_usable_locked(self) -> None:
        if self._generation != self._fs._generation:
            raise _error(errno.EIO, self._path, "process crashed")
        if self._closed:
            raise _error(errno.EBADF, self._path)

    def close(self) -> None:
        self._closed = True


class _FaultWritableFile(_Handle):
    __slots__ = ("position_bytes",)

    def __init__(self, fs: FaultFS, inode: _Inode, path: str) -> None:
        super().__init__(fs, inode, path)
        self.position_bytes = len(inode.content)  # where the next write goes

    def write(self, data: bytes) -> None:
        with self._fs._lock:
            self._check_usable_locked()
            self._fs._write_locked(self, bytes(data))

    def truncate(self, size_bytes: int) -> None:
        with self._fs._lock:
            self._check_usable_locked()
            assert size_bytes <= self.position_bytes, (self._path, size_bytes)
            self._fs._truncate_locked(self._inode, self._path, size_bytes)
            self.position_bytes = size_bytes

    def write_zeros(self, upto_bytes: int) -> None:
        with self._fs._lock:
            self._check_usable_locked()
            missing_bytes = upto_bytes - len(self._inode.content)
            if missing_bytes > 0:
                self._fs._write_at_locked(
                    self._inode, len(self._inode.content), bytes(missing_bytes)
                )

    def allocated_bytes(self) -> int:
        # No usability check: a query of the handle's own view, like OsFileSystem's (no
        # system call), which the store makes while holding its state lock.
        with self._fs._lock:
            return max(len(self._inode.content), self.position_bytes)

    def fdatasync(self) -> None:
        with self._fs._lock:
            self._check_usable_locked()
            self._fs._fdatasync_locked(self._inode, self._path)

    def size(self) -> int:
        with self._fs._lock:
            self._check_usable_locked()
            return self.position_bytes


class _FaultReadableFile(_Handle):
    __slots__ = ()

    def pread(self, offset_bytes: int, size_bytes: int) -> bytes:
        assert offset_bytes >= 0
        assert size_bytes >= 0
        with self._fs._lock:
            self._check_usable_locked()
            self._fs._fail_if_injected_locked("pread", self._path)
            return bytes(self._inode.content[offset_bytes : offset_bytes + size_bytes])


class _FaultDirLock:
    __slots__ = ("_dir_path", "_fs")

    def __init__(self, fs: FaultFS, dir_path: str) -> None:
        self._fs = fs
        self._dir_path = dir_path

    def release(self) -> None:
        self._fs._release_dir_lock(self._dir_path, self)


# --- The file system --------------------------------------------------------------------------


class FaultFS:
    """In-memory `FileSystem` with a durability model, crashes, power loss and injected errors.

    Thread-safe: one lock guards all state; handles take it too. Methods ending in `_locked`
    expect the caller to hold `_lock`.
    """

    def __init__(self, *, rng: random.Random | None = None, trace: bool = False) -> None:
        self._lock = threading.Lock()
        # Only partial writes draw from it; power loss takes its own rng.
        self._rng = rng if rng is not None else random.Random(0)
        self._state = _State()
        self._generation = 0
        self._dir_locks: dict[str, _FaultDirLock] = {}
        self._injections: list[_Injection] = []
        self._stats = FaultStats()
        self._trace: list[_TraceOp] | None = None
        self._trace_base: _State | None = None
        self.crash_point = ""  # set on states yielded by crash_states(): where they come from
        self.crash_ops = 0  # on those states: how many whole traced ops reached the disk
        if trace:
            self.start_trace()

    # --- FileSystem -------------------------------------------------------------------------

    def makedirs(self, dir_path: str) -> None:
        with self._lock:
            for created in self._state.makedirs(_norm(dir_path)):
                self._record_locked(_TraceOp("mkdir", path=created))

    def listdir(self, dir_path: str) -> list[str]:
        with self._lock:
            return self._state.listdir(_norm(dir_path))

    def exists(self, path: str) -> bool:
        normalised = _norm(path)
        with self._lock:
            return normalised in self._state.dirs or self._state.is_file(normalised)

    def file_size(self, path: str) -> int:
        with self._lock:
            return len(self._state.file(_norm(path)).content)

    def read_file(self, path: str) -> bytes:
        with self._lock:
            self._fail_if_injected_locked("read_file", path)
            return bytes(self._state.file(_norm(path)).content)

    def open_write(self, path: str, *, create: bool) -> WritableFile:
        normalised = _norm(path)
        with self._lock:
            self._fail_if_injected_locked("open_write", path)
            if not create:
                return _FaultWritableFile(self, self._state.file(normalised), path)
            inode = self._state.create(normalised)
            self._record_locked(_TraceOp("create", path=normalised))
            return _FaultWritableFile(self, inode, path)

    def open_read(self, path: str) -> ReadableFile:
        with self._lock:
            self._fail_if_injected_locked("open_read", path)
            return _FaultReadableFile(self, self._state.file(_norm(path)), path)

    def rename(self, src_path: str, dst_path: str) -> None:
        src, dst = _norm(src_path), _norm(dst_path)
        with self._lock:
            self._fail_if_injected_locked("rename", src_path, dst_path)
            self._state.rename(src, dst)
            self._stats.rename_count += 1
            self._record_locked(_TraceOp("rename", path=src, dst_path=dst))

    def unlink(self, path: str) -> None:
        normalised = _norm(path)
        with self._lock:
            self._fail_if_injected_locked("unlink", path)
            self._state.unlink(normalised)
            self._stats.unlink_count += 1
            self._record_locked(_TraceOp("unlink", path=normalised))

    def fsync_dir(self, dir_path: str) -> None:
        normalised = _norm(dir_path)
        with self._lock:
            self._fail_if_injected_locked("fsync_dir", dir_path)
            self._state.fsync_dir(normalised)
            self._stats.fsync_dir_count += 1
            self._record_locked(_TraceOp("fsync_dir", path=normalised))

    def lock_dir(self, dir_path: str) -> DirLock:
        normalised = _norm(dir_path)
        with self._lock:
            self._state.directory(normalised)
            if normalised in self._dir_locks:
                raise BlockingIOError(errno.EWOULDBLOCK, "directory is locked", dir_path)
            lock_path = posixpath.join(normalised, LOCK_FILE_NAME)
            if not self._state.is_file(lock_path):
                # OsFileSystem creates the LOCK file with O_CREAT and never syncs its name.
                self._state.create(lock_path)
                self._record_locked(_TraceOp("create", path=lock_path))
            dir_lock = _FaultDirLock(self, normalised)
            self._dir_locks[normalised] = dir_lock
            return dir_lock

    # --- Crashes ----------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """Bumped by every crash and power loss; handles of older generations are dead."""
        with self._lock:
            return self._generation

    def crash(self) -> None:
        """SIGKILL: the page cache survives; handles die; locks are released."""
        with self._lock:
            self._crash_locked()

    def power_loss(
        self, mode: PowerLossMode, rng: random.Random, *, names: NamesMode = "revert"
    ) -> None:
        """A crash, then everything not synced is lost as `mode` says (module docstring).
        `names`: what becomes of directory changes not yet fsynced: `revert` (all undone),
        `keep` (all persisted early by a journal commit), `random` (each either way).
        Ends trace mode: a replay could not reproduce the rng's choices."""
        assert mode in POWER_LOSS_MODES, mode
        choose = _CONTENT_CHOICES[mode]
        with self._lock:
            self._crash_locked()
            self._state.power_loss(lambda inode: choose(inode, rng), names, rng)
            # Replay can't follow the rng's choices: a power loss ends tracing.
            self._trace = None
            self._trace_base = None

    # --- Injected errors --------------------------------------------------------------------

    def inject_error(
        self,
        op: FaultOp,
        err: int,
        *,
        path_contains: str = "",
        after: int = 0,
        times: int = 1,
        partial: bool = False,
    ) -> None:
        """Make `times` calls of `op` on a path containing `path_contains` raise
        `OSError(err)`, after letting `after` such calls succeed. Every matching call counts
        for every injection; when several are due, the oldest fires. With `partial=True`
        (writes only) a failing write first appends a random strict prefix of its data.
        A failing fdatasync loses the unsynced bytes on disk (fsyncgate, module docstring).
        Injections outlive crashes: they model the disk, not the process."""
        assert op in FAULT_OPS, op
        assert after >= 0
        assert times >= 1
        assert not partial or op == "write"
        injection = _Injection(op, err, path_contains, after, times, partial)
        with self._lock:
            self._injections.append(injection)

    def clear_injected_errors(self) -> None:
        with self._lock:
            self._injections.clear()

    # --- Inspection and offline damage -------------------------------------------------------

    @property
    def stats(self) -> FaultStats:
        with self._lock:
            return replace(self._stats)

    def content(self, path: str) -> bytes:
        """What a reader sees (page cache included)."""
        with self._lock:
            return bytes(self._state.file(_norm(path)).content)

    def durable_content(self, path: str) -> bytes:
        """The file's bytes as of its last fdatasync (whether or not its name is durable)."""
        with self._lock:
            return self._state.file(_norm(path)).durable

    def durable_listdir(self, dir_path: str) -> list[str]:
        """File names of `dir_path` that would survive a power loss now (sorted)."""
        with self._lock:
            return sorted(self._state.directory(_norm(dir_path)).durable)

    def flip_bit(self, path: str, bit_offset: int) -> None:
        """Flip one bit of the file on disk (content and durable content)."""
        with self._lock:
            inode = self._state.file(_norm(path))
            byte_offset, bit = divmod(bit_offset, 8)
            assert 0 <= byte_offset < len(inode.content), (path, bit_offset)
            inode.content[byte_offset] ^= 1 << bit
            if byte_offset < len(inode.durable):
                durable = bytearray(inode.durable)
                durable[byte_offset] ^= 1 << bit
                inode.durable = bytes(durable)

    def set_bytes(self, path: str, offset_bytes: int, data: bytes) -> None:
        """Overwrite (or extend, at the end) the file on disk with `data`. Each of the content
        and the durable content is changed where the edit touches or extends it."""
        with self._lock:
            inode = self._state.file(_norm(path))
            assert 0 <= offset_bytes <= len(inode.content), (path, offset_bytes)
            inode.content[offset_bytes : offset_bytes + len(data)] = data
            if offset_bytes <= len(inode.durable):
                durable = bytearray(inode.durable)
                durable[offset_bytes : offset_bytes + len(data)] = data
                inode.durable = bytes(durable)

    def truncate_file(self, path: str, size_bytes: int) -> None:
        """Cut the file on disk to `size_bytes` (content and durable content)."""
        with self._lock:
            inode = self._state.file(_norm(path))
            assert 0 <= size_bytes <= len(inode.content), (path, size_bytes)
            inode.truncate(size_bytes)
            inode.durable = inode.durable[:size_bytes]

    # --- Trace mode -------------------------------------------------------------------------

    def start_trace(self) -> None:
        """Record mutations from now on; the current state is the base of every replay."""
        with self._lock:
            self._trace_base = copy.deepcopy(self._state)
            self._trace = []

    def trace_length(self) -> int:
        """How many mutating operations have been traced so far (compare with `crash_ops`
        of the states `crash_states` yields, to know what had been synced at each)."""
        with self._lock:
            assert self._trace is not None, "not tracing"
            return len(self._trace)

    def crash_states(
        self,
        rng: random.Random,
        torn_variants: int,
        names: Sequence[NamesMode] = ("revert",),
    ) -> Iterator[FaultFS]:
        """The states a power loss could leave, one fresh FaultFS each (not tracing).

        For the empty prefix of the trace and every prefix ending at an fdatasync or
        fsync_dir: the `trunc` power-loss state once per entry of `names` (`revert`: names
        not yet fsynced are undone; `keep`: a journal commit made them durable before the
        directory fsync), then, if a non-empty write follows before
        the next sync, `torn_variants` states where a random prefix (1..all bytes) of that
        write also reached the disk, its last bytes garbage with probability 1/2.
        """
        assert torn_variants >= 0
        with self._lock:
            assert self._trace is not None and self._trace_base is not None, "not tracing"
            base, ops = self._trace_base, list(self._trace)  # _replay copies the base
        ends = [0, *(index + 1 for index, op in enumerate(ops) if op.kind in _SYNC_KINDS)]
        for end in ends:
            for names_mode in names:
                label = f"power loss after the first {end} ops, unsynced names {names_mode}"
                state = _crash_state(base, ops[:end], rng, label, names_mode)
                state.crash_ops = end
                yield state
            write_index = _next_write(ops, end)
            if write_index is None:
                continue
            for variant in range(torn_variants):
                torn = _torn_crash_state(base, ops, write_index, rng, variant)
                torn.crash_ops = write_index
                yield torn

    # --- For the handles of this module (caller holds `_lock`) -------------------------------

    def _fail_if_injected_locked(self, op: FaultOp, *paths: str) -> None:
        injection = self._due_injection_locked(op, paths)
        if injection is not None:
            raise _error(injection.err, paths[0], f"injected: {os.strerror(injection.err)}")

    def _write_locked(self, handle: _FaultWritableFile, data: bytes) -> None:
        inode, path = handle._inode, handle._path
        injection = self._due_injection_locked("write", (path,))
        if injection is not None:
            partial = injection.partial and len(data) > 1
            prefix = data[: self._rng.randint(0, len(data) - 1)] if partial else b""
            if prefix:
                self._write_at_locked(inode, handle.position_bytes, prefix)
                handle.position_bytes += len(prefix)
            raise _error(injection.err, path, f"injected: {os.strerror(injection.err)}")
        self._write_at_locked(inode, handle.position_bytes, data)
        handle.position_bytes += len(data)

    def _truncate_locked(self, inode: _Inode, path: str, size_bytes: int) -> None:
        assert 0 <= size_bytes <= len(inode.content), (path, size_bytes)
        self._fail_if_injected_locked("truncate", path)
        inode.truncate(size_bytes)
        self._stats.truncate_count += 1
        self._record_locked(_TraceOp("truncate", ino=inode.ino, size_bytes=size_bytes))

    def _fdatasync_locked(self, inode: _Inode, path: str) -> None:
        injection = self._due_injection_locked("fdatasync", (path,))
        if injection is not None:
            inode.fail_sync()
            self._record_locked(_TraceOp("fdatasync_error", ino=inode.ino))
            raise _error(injection.err, path, f"injected: {os.strerror(injection.err)}")
        inode.sync()
        self._stats.fdatasync_count += 1
        self._record_locked(_TraceOp("fdatasync", ino=inode.ino))

    def _release_dir_lock(self, dir_path: str, dir_lock: _FaultDirLock) -> None:
        with self._lock:
            # A lock from before a crash must not free the restarted process's lock.
            if self._dir_locks.get(dir_path) is dir_lock:
                del self._dir_locks[dir_path]

    # --- Private --------------------------------------------------------------------------

    def _crash_locked(self) -> None:
        self._generation += 1
        self._dir_locks.clear()

    def _write_at_locked(self, inode: _Inode, offset_bytes: int, data: bytes) -> None:
        inode.write_at(offset_bytes, data)
        self._stats.write_count += 1
        self._stats.written_bytes += len(data)
        self._record_locked(_TraceOp("write", ino=inode.ino, data=data, offset_bytes=offset_bytes))

    def _due_injection_locked(self, op: FaultOp, paths: Sequence[str]) -> _Injection | None:
        due: _Injection | None = None
        for injection in self._injections:
            if not injection.matches(op, paths):
                continue
            if injection.skip_count > 0:
                injection.skip_count -= 1
            elif due is None:
                due = injection
        if due is not None:
            due.times_left -= 1
            if due.times_left == 0:
                self._injections.remove(due)
        return due

    def _record_locked(self, op: _TraceOp) -> None:
        if self._trace is not None:
            self._trace.append(op)


def _crash_state(
    base: _State, ops: Sequence[_TraceOp], rng: random.Random, label: str, names: NamesMode
) -> FaultFS:
    state, _ = _replay(base, ops)
    state.power_loss(lambda inode: inode.durable, names)
    return _fault_fs_holding(state, rng, label)


def _torn_crash_state(
    base: _State, ops: Sequence[_TraceOp], write_index: int, rng: random.Random, variant: int
) -> FaultFS:
    write = ops[write_index]
    state, inodes = _replay(base, ops[:write_index])
    target = inodes[write.ino]
    kept_bytes = rng.randint(1, len(write.data))
    kept = bytearray(write.data[:kept_bytes])
    _garble_tail(kept, 0, rng)
    target.write_at(write.offset_bytes, bytes(kept))
    state.power_loss(lambda inode: inode.disk_view() if inode is target else inode.durable)
    label = f"torn variant {variant} of op {write_index}: {kept_bytes}/{len(write.data)} bytes"
    return _fault_fs_holding(state, rng, label)


def _fault_fs_holding(state: _State, rng: random.Random, label: str) -> FaultFS:
    fs = FaultFS(rng=random.Random(rng.getrandbits(64)))
    fs._state = state
    fs.crash_point = label
    return fs


if TYPE_CHECKING:
    # mypy proves the double is a FileSystem.
    _PORT_CHECK: FileSystem = FaultFS()
