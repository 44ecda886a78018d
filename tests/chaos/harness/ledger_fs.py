"""LedgerFileSystem: real files, plus a durability LEDGER of what each sync made durable.

Why (shared/reference/chaos-plan.md §4.5): SIGKILL never loses data by itself, since the page
cache survives the process. To test power loss on real node processes, the harness needs to
know, after the node is dead, which bytes and which directory entries had been made durable.
The node runs with this `FileSystem` (tests/chaos/harness/node_main.py `--ledger`): every
call goes to `logsvc.store.fs.OsFileSystem`, and every sync also appends one JSON line to a
sidecar ledger file outside the data directory, with a plain `write(2)` (no fsync: the page
cache survives the SIGKILL, and the harness itself never loses power). The offline step
`tests/chaos/harness/disk.py power_loss` reads the ledger and puts the data directory back
to a state the disk could hold after a power cut (FaultFS's model, tests/support/faultfs.py,
applied to real files).

Ledger lines (`"k"` names the kind; files are named by inode number, since a file may be
renamed after it was synced, e.g. meta.tmp -> meta):

    {"k":"create","ino":I,"path":P}             a file was created through the port: its
                                                 durable content starts empty (this also
                                                 forgets an older file with a reused inode)
    {"k":"sync","ino":I,"path":P,"size":N,"tail":H}
                                                 an fdatasync RETURNED: bytes [0, N) are
                                                 durable; H = xxh3-64 hex of bytes
                                                 [max(0, N - 4096), N), checked at power loss
    {"k":"trunc","ino":I,"path":P,"size":N}      ftruncate(N) returned (not durable yet: the
                                                 unsynced region starts at N if N is lower)
    {"k":"dir","dir":D,"names":{name: ino}}      fsync of directory D RETURNED: its regular
                                                 files then (the durable names)
    {"k":"keep","ino":I,"dir":D,"name":N,"link":L}
                                                 before an unlink of D/N or a rename over
                                                 it: a hard link L keeps the old inode, so
                                                 an unsynced unlink or rename can be undone
    {"k":"rename"|"unlink", ...}                 informational (what happened, in order)

Ordering makes the ledger conservative: a sync or dir line is written only after the real
call returned (a process killed in between under-reports: power loss then cuts bytes the
store was never told were durable, which is allowed), and `keep` lines before the unlink
or rename they protect. Directory changes made through this port (create, rename, unlink)
and directory fsyncs are serialized by one lock, so the listing recorded for an fsync is
exactly what that fsync covered.

Modelled conservatively, or not at all (documented for scenario authors):
* Directories are durable once they exist (`makedirs` here fsyncs the parents, like
  OsFileSystem) and are never removed; only regular files' names are modelled.
* A file truncated and rewritten since its last sync: the truncate is assumed to have
  reached the disk (the unsynced region starts at the truncated length). The older, longer
  content is not restorable (it was never copied). The store syncs right after every
  truncate, so the window is one syscall.
* Files changed outside the port (none in logsvc today: the journal, the meta file, the
  Raft snapshot, sent or received, and the membership file all go through it; a future
  plain `open()` would not): their names are still modelled by the dir listings, but an
  inode replaced outside the port was never kept, so its old name cannot be restored
  (reported as unrestorable), and an inode number reused outside the port inherits the
  previous file's sync record until its own first sync.
* Keep links live in `<ledger>.keep/` (a hard link needs the same file system; if it is
  not, the file is copied). They are dropped at the next fsync of their directory by the
  same process, and all of them at every power loss / `reset_ledger`.

Test-only: `unrecorded_sync_suffix=".seg"` makes syncs of matching paths go unrecorded (the
mutation check in tests/chaos/test_harness_disk.py proves that power loss then loses
acknowledged records, i.e. that the ledger is what protects them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading

import xxhash

from logsvc.store.fs import DirLock, OsFileSystem, ReadableFile, WritableFile

TAIL_HASH_BYTES = 4096
KEEP_SUFFIX = ".keep"


def tail_hash(data: bytes) -> str:
    """The ledger's check value of a durable prefix: xxh3-64 hex of its last 4 KiB."""
    return xxhash.xxh3_64_hexdigest(data[-TAIL_HASH_BYTES:])


def _real(path: str) -> str:
    """The path with its directory resolved (symlinks, cwd): how the ledger names files."""
    dir_path, name = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(dir_path), name)


def list_names(dir_path: str) -> dict[str, int]:
    """The regular files of a directory: name -> inode number."""
    names: dict[str, int] = {}
    with os.scandir(dir_path) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                names[entry.name] = entry.inode()
    return names


class _Ledger:
    """The sidecar file: one JSON object per line, appended with one write(2) each."""

    __slots__ = ("_fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def append(self, record: dict[str, object]) -> None:
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        written = os.write(self._fd, data)
        assert written == len(data), f"short write to the ledger {self.path}"

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class _LedgerWritableFile:
    """A real writable file whose returned syncs and truncates go to the ledger."""

    __slots__ = ("_fs", "_ino", "_path", "_read_fd", "_real")

    def __init__(self, fs: LedgerFileSystem, real: WritableFile, path: str) -> None:
        self._fs = fs
        self._real = real
        self._path = path
        # A second descriptor on the same inode, to hash the synced tail (the real handle's
        # descriptor is private to OsFileSystem).
        self._read_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._ino = os.fstat(self._read_fd).st_ino

    @property
    def ino(self) -> int:
        return self._ino

    def write(self, data: bytes) -> None:
        self._real.write(data)

    def truncate(self, size_bytes: int) -> None:
        self._real.truncate(size_bytes)
        self._fs._record({"k": "trunc", "ino": self._ino, "path": self._path, "size": size_bytes})

    def write_zeros(self, upto_bytes: int) -> None:
        self._real.write_zeros(upto_bytes)

    def allocated_bytes(self) -> int:
        return self._real.allocated_bytes()

    def fdatasync(self) -> None:
        # The size before the sync: bytes written during it are not claimed (conservative;
        # the store never writes a file while syncing it anyway).
        size_bytes = self._real.size()
        self._real.fdatasync()
        if self._fs._records_sync_of(self._path):
            start = max(0, size_bytes - TAIL_HASH_BYTES)
            tail = os.pread(self._read_fd, size_bytes - start, start)
            assert len(tail) == size_bytes - start, f"{self._path} shrank during its sync"
            self._fs._record(
                {
                    "k": "sync",
                    "ino": self._ino,
                    "path": self._path,
                    "size": size_bytes,
                    "tail": tail_hash(tail),
                }
            )

    def size(self) -> int:
        return self._real.size()

    def close(self) -> None:
        try:
            self._real.close()
        finally:
            if self._read_fd >= 0:
                fd, self._read_fd = self._read_fd, -1
                os.close(fd)


class LedgerFileSystem:
    """`logsvc.store.fs.FileSystem` over real files, recording durability in a ledger.

    See the module docstring for the ledger's lines and what they mean."""

    def __init__(self, ledger_path: str, *, unrecorded_sync_suffix: str | None = None) -> None:
        self._os = OsFileSystem()
        self._ledger = _Ledger(ledger_path)
        self._keep_dir = ledger_path + KEEP_SUFFIX
        os.makedirs(self._keep_dir, exist_ok=True)
        self._unrecorded_sync_suffix = unrecorded_sync_suffix
        # Serializes directory changes made through the port with directory fsyncs.
        self._dir_mu = threading.Lock()
        self._keeps: dict[str, dict[int, str]] = {}  # dir -> inode -> keep link (this process)
        self._keep_counter = 0

    @property
    def ledger_path(self) -> str:
        return self._ledger.path

    def close(self) -> None:
        self._ledger.close()

    # --- recording ------------------------------------------------------------------------

    def _record(self, record: dict[str, object]) -> None:
        self._ledger.append(record)

    def _records_sync_of(self, path: str) -> bool:
        suffix = self._unrecorded_sync_suffix
        return suffix is None or not path.endswith(suffix)

    def _keep_locked(self, path: str) -> None:
        """Hard-link the inode at `path` into the keep directory (before it loses the name)."""
        try:
            ino = os.stat(path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            return  # the unlink or rename will fail on its own
        dir_path, name = os.path.split(_real(path))
        self._keep_counter += 1
        link = os.path.join(self._keep_dir, f"{os.getpid()}-{self._keep_counter}-{ino}")
        try:
            os.link(path, link)
        except OSError:
            shutil.copyfile(path, link)  # another file system: a copy (content as of now)
        self._keeps.setdefault(dir_path, {})[ino] = link
        self._record({"k": "keep", "ino": ino, "dir": dir_path, "name": name, "link": link})

    def _drop_keeps_locked(self, dir_path: str, durable: dict[str, int]) -> None:
        """After a directory fsync: inodes kept for names that are no longer durable."""
        kept = self._keeps.get(dir_path)
        if not kept:
            return
        live = set(durable.values())
        for ino in [ino for ino in kept if ino not in live]:
            link = kept.pop(ino)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(link)

    # --- FileSystem -----------------------------------------------------------------------

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
        for created in reversed(missing):
            self.fsync_dir(os.path.dirname(created))

    def listdir(self, dir_path: str) -> list[str]:
        return self._os.listdir(dir_path)

    def exists(self, path: str) -> bool:
        return self._os.exists(path)

    def file_size(self, path: str) -> int:
        return self._os.file_size(path)

    def read_file(self, path: str) -> bytes:
        return self._os.read_file(path)

    def open_write(self, path: str, *, create: bool) -> WritableFile:
        if not create:
            return _LedgerWritableFile(self, self._os.open_write(path, create=False), path)
        with self._dir_mu:
            real = self._os.open_write(path, create=True)
            try:
                handle = _LedgerWritableFile(self, real, path)
            except BaseException:
                real.close()
                raise
            self._record({"k": "create", "ino": handle.ino, "path": _real(path)})
            return handle

    def open_read(self, path: str) -> ReadableFile:
        return self._os.open_read(path)

    def rename(self, src_path: str, dst_path: str) -> None:
        with self._dir_mu:
            if os.path.lexists(dst_path):
                self._keep_locked(dst_path)
            self._os.rename(src_path, dst_path)
            self._record({"k": "rename", "src": _real(src_path), "dst": _real(dst_path)})

    def unlink(self, path: str) -> None:
        with self._dir_mu:
            self._keep_locked(path)
            self._os.unlink(path)
            self._record({"k": "unlink", "path": _real(path)})

    def fsync_dir(self, dir_path: str) -> None:
        absolute = os.path.realpath(dir_path)
        with self._dir_mu:
            self._os.fsync_dir(dir_path)
            names = list_names(absolute)
            self._record({"k": "dir", "dir": absolute, "names": names})
            self._drop_keeps_locked(absolute, names)

    def lock_dir(self, dir_path: str) -> DirLock:
        with self._dir_mu:  # creates LOCK: a directory change like any other
            return self._os.lock_dir(dir_path)
