"""The node journal: one append-only, group-committed file set shared by every replica's store
on a node (docs/decisions/0011-shared-journal.md; issue 22).

Without it each replica's store fdatasyncs its own segment file, so a node with a hundred
busy shards pays a hundred fdatasyncs a round. With it (BookKeeper's bookie journal beside
its entry logs, dragonboat's shared log DB, CockroachDB's one WAL under many ranges):

* A store opened with `journal=` still encodes its entries into its own segment buffer, but
  makes them durable by handing the same entries (and its vote saves and suffix truncations)
  to the journal (`JournalLink.submit_*`). `ShardStore.wait_durable(index)` returns once the
  journal's fdatasync covering that entry returned.
* `sync_upto(position)`: the calling thread takes the journal's I/O lock, writes every
  store's pending records and runs one fdatasync that covers them all; threads that queued on
  the lock meanwhile find their records durable and return (group commit, as LevelDB's
  writer queue: the slower the disk, the bigger the batch; no timer, no extra thread hop).
* The segment files are the checkpoint: written lazily (the store's write buffer) and
  fdatasynced in the background by the checkpointer thread, a sealed journal file at a time;
  a sealed file is deleted once every store's operations in it are durable in its own files
  (`JournalLedger`). A live journal above `bytes_max` makes the appending thread checkpoint
  itself (back-pressure), so the journal stays bounded.
* Opening replays the journal into the stores (`journal_replay.plan_replay`, idempotent),
  closes them (their files synced), then deletes the journal files. A torn tail of the newest
  file is cut; damage anywhere else is `Corruption` (decision 0009's rule, `scan_file`).

Durability order for a journal roll (as for segments): the old file is fdatasynced before the
new one is created, and the directory is fsynced before a record in the new file is reported
durable: only the newest file can be torn.

Locks, always in this order: a store's `_io_lock` -> its `_meta_lock` -> the journal's
`_checkpoint_lock` is never taken under a store lock; the journal's `_io_lock` -> a store's
`_mu` (durability callbacks) -> the journal's `_mu` (held only for bookkeeping, never for I/O
or a callback).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from logsvc.failpoints import failpoint
from logsvc.store import journal_records as jr
from logsvc.store.errors import (
    JournalSyncTimeout,
    StoreClosed,
    StoreError,
    StoreFailed,
    StoreLocked,
    io_error,
)
from logsvc.store.fs import DirLock, FileSystem, OsFileSystem, WritableFile
from logsvc.store.journal_port import JournalClient, ReplayTarget
from logsvc.store.journal_recovery import live_ops, recover_journal_dir, replay_into
from logsvc.store.journal_replay import JournalLedger, StoreOp
from logsvc.store.limits import (
    DEFAULT_JOURNAL_LIMITS,
    DEFAULT_LIMITS,
    JournalLimits,
    StoreLimits,
)
from logsvc.store.records import Entry

log = logging.getLogger("logsvc.store.journal")

JOURNAL_DIR_NAME = "node-journal"  # under the node's data directory
CHECKPOINTER_JOIN_S_MAX = 30.0


def journal_file_name(file_seq: int) -> str:
    return f"{file_seq:020d}.jnl"


@dataclass(frozen=True, slots=True)
class JournalStats:
    files: int
    live_bytes: int
    appended_bytes: int
    durable_bytes: int
    syncs: int
    fdatasyncs: int
    checkpoints: int
    deleted_files: int
    replayed_stores: int
    torn_tail_bytes_cut: int
    failed: bool


@dataclass(slots=True, eq=False)
class _JournalFile:
    file_seq: int
    path: str
    size_bytes: int  # logical end, buffered records included
    written_bytes: int = 0
    synced_bytes: int = 0
    pending: bytearray = field(default_factory=bytearray)
    on_disk: bool = False
    handle: WritableFile | None = None
    declared: set[int] = field(default_factory=set)  # store ids with an ATTACH here


class JournalLink:
    """One store's handle on the node journal. Every method is thread-safe."""

    def __init__(self, journal: NodeJournal, store_id: int, rel_path: str, client: JournalClient):
        self.journal = journal
        self.store_id = store_id
        self.rel_path = rel_path
        self.client = client
        self.op_seq = 0  # operations submitted (guarded by the journal's _mu)
        self.attached = True

    def submit_entries(self, entries: list[Entry]) -> int:
        """Journal an append; return the journal position that makes it durable."""
        return self.journal._submit(
            self, [(jr.TYPE_ENTRY, e.index, e.term, e.payload) for e in entries]
        )

    def submit_vote(self, term: int, voted_for: str | None) -> int:
        body = b"" if voted_for is None else voted_for.encode("utf-8")
        return self.journal._submit(
            self, [(jr.TYPE_VOTE, term, 0 if voted_for is None else 1, body)]
        )

    def submit_truncate(self, index: int) -> int:
        return self.journal._submit(self, [(jr.TYPE_TRUNCATE, index, 0, b"")])

    def sync_upto(self, position: int, timeout_ms: int | None = None) -> None:
        self.journal.sync_upto(position, timeout_ms)

    def after_submit(self) -> None:
        """Back-pressure, called by the store with none of its locks held."""
        self.journal._after_submit()

    def after_wait(self) -> None:
        """Called by the store after a durability wait, with none of its locks held: without
        a checkpointer thread, the waiting thread checkpoints sealed files here."""
        if self.journal._checkpointer is None:
            self.journal._checkpoint_all_sealed()

    def current_op_seq(self) -> int:
        with self.journal._mu:
            return self.op_seq

    def checkpointed(self, op_seq: int) -> None:
        with self.journal._mu:
            self.journal._ledger.checkpointed(self.store_id, op_seq)

    def detach(self, *, checkpointed: bool) -> None:
        """The store closed (`checkpointed`: its files hold every operation it journaled)
        or was abandoned (kill -9: its journaled operations are replayed when it reattaches
        or the node reopens)."""
        self.journal._detach(self, checkpointed=checkpointed)


class NodeJournal:
    """See the module docstring. Create with `NodeJournal.open(dir_path, base_dir=...)`."""

    @classmethod
    def open(
        cls,
        dir_path: str,
        *,
        base_dir: str,
        fs: FileSystem | None = None,
        limits: JournalLimits = DEFAULT_JOURNAL_LIMITS,
        store_limits: StoreLimits = DEFAULT_LIMITS,
        background: bool = True,
    ) -> NodeJournal:
        """Recover (replay every store's journaled operations into its files, then delete the
        journal files) and start. `background=False` starts no checkpointer thread: sealed
        files are checkpointed by the thread that syncs (the deterministic simulator)."""
        limits.validate()
        fs = fs if fs is not None else OsFileSystem()
        try:
            fs.makedirs(dir_path)
            lock = fs.lock_dir(dir_path)
        except BlockingIOError:
            raise StoreLocked(dir_path) from None
        except OSError as exc:
            raise io_error(exc, "open journal", dir_path) from exc
        try:
            journal = cls(dir_path, base_dir, fs, limits, store_limits)
            journal._recover()
        except BaseException:
            lock.release()
            raise
        journal._lock = lock
        if background:
            journal._checkpointer = threading.Thread(
                target=journal._run_checkpointer, name="journal-checkpointer", daemon=True
            )
            journal._checkpointer.start()
        return journal

    def __init__(
        self,
        dir_path: str,
        base_dir: str,
        fs: FileSystem,
        limits: JournalLimits,
        store_limits: StoreLimits,
    ) -> None:
        self._dir = dir_path
        self._base_dir = base_dir
        self._fs = fs
        self._limits = limits
        self._store_limits = store_limits
        self._mu = threading.Lock()
        self._io_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_cv = threading.Condition(self._mu)
        self._files: list[_JournalFile] = []
        self._next_file_seq = 1
        self._ledger = JournalLedger()
        self._links: dict[int, JournalLink] = {}  # attached, by store id
        self._abandoned: dict[int, str] = {}  # store id -> rel path, ops still needed
        self._next_store_id = 1
        self._touched: set[JournalLink] = set()  # submitted since the last sync started
        self._appended_bytes = 0  # position: every byte ever encoded into the journal
        self._durable_bytes = 0
        self._buffered_bytes = 0
        self._live_bytes = 0  # bytes of files not yet deleted
        self._dir_dirty = False
        self._failed: StoreFailed | None = None
        self._closing = False
        self._closed = False
        self._lock: DirLock | None = None
        self._checkpointer: threading.Thread | None = None
        self._syncs = 0
        self._fdatasyncs = 0
        self._checkpoints = 0
        self._deleted_files = 0
        self._replayed_stores = 0
        self._torn_tail_bytes_cut = 0

    # ----------------------------------------------------------------- attach / detach

    def attach(self, store_dir: str, client: JournalClient) -> tuple[JournalLink, list[StoreOp]]:
        """Register a store; return its link and the operations a previous, abandoned
        attachment of the same directory journaled in this process (to be replayed into
        the store's files before it serves; empty after a node open, which replayed all)."""
        rel_path = os.path.relpath(store_dir, self._base_dir)
        assert not rel_path.startswith(".."), f"store {store_dir} outside {self._base_dir}"
        with self._mu:
            self._check_open()
            if any(link.rel_path == rel_path for link in self._links.values()):
                raise StoreLocked(store_dir)
            old_ids = {sid for sid, path in self._abandoned.items() if path == rel_path}
        ops: list[StoreOp] = []
        if old_ids:
            ops = self._live_ops(old_ids)
        with self._mu:
            store_id = self._next_store_id
            self._next_store_id += 1
            link = JournalLink(self, store_id, rel_path, client)
            self._links[store_id] = link
        return link, ops

    def forget_abandoned(self, store_dir: str) -> None:
        """The replayed operations of an abandoned attachment are durable in the store's files
        (called by the store after it replayed what `attach` returned)."""
        rel_path = os.path.relpath(store_dir, self._base_dir)
        with self._mu:
            for store_id in [s for s, p in self._abandoned.items() if p == rel_path]:
                del self._abandoned[store_id]
                self._ledger.checkpointed(store_id, 2**63)
            self._checkpoint_cv.notify_all()

    def _detach(self, link: JournalLink, *, checkpointed: bool) -> None:
        with self._mu:
            if not link.attached:
                return
            link.attached = False
            self._links.pop(link.store_id, None)
            self._touched.discard(link)
            if checkpointed:
                self._ledger.checkpointed(link.store_id, link.op_seq)
                self._ledger.forget_store(link.store_id)
            elif link.op_seq:
                self._abandoned[link.store_id] = link.rel_path
            self._checkpoint_cv.notify_all()

    # ----------------------------------------------------------------- writes

    def _submit(self, link: JournalLink, items: list[tuple[int, int, int, bytes]]) -> int:
        payload_max = self._limits.record_payload_bytes_max
        with self._mu:
            self._check_open()
            assert link.attached, "a detached store submitted"
            link.op_seq += 1
            for rtype, a, b, body in items:
                assert len(body) <= payload_max
                self._encode_locked(link, rtype, a, b, body)
            self._touched.add(link)
            return self._appended_bytes

    def _encode_locked(self, link: JournalLink, rtype: int, a: int, b: int, body: bytes) -> None:
        size = jr.RECORD_HEADER_BYTES + len(body)
        active = self._files[-1] if self._files else None
        if active is None or (
            active.size_bytes + size > self._limits.file_bytes_max
            and active.size_bytes > jr.FILE_HEADER_BYTES
        ):
            active = self._new_file_locked()
        if link.store_id not in active.declared:
            path = link.rel_path.encode("utf-8")
            self._add_locked(
                active,
                jr.encode_record_into(
                    active.pending, jr.TYPE_ATTACH, link.store_id, active.synced_bytes, 0, 0, path
                ),
            )
            active.declared.add(link.store_id)
        self._add_locked(
            active,
            jr.encode_record_into(
                active.pending, rtype, link.store_id, active.synced_bytes, a, b, body
            ),
        )
        self._ledger.on_written(active.file_seq, link.store_id, link.op_seq)

    def _add_locked(self, active: _JournalFile, size: int) -> None:
        active.size_bytes += size
        self._appended_bytes += size
        self._buffered_bytes += size
        self._live_bytes += size

    def _new_file_locked(self) -> _JournalFile:
        file_seq = self._next_file_seq
        self._next_file_seq += 1
        header = jr.encode_file_header(file_seq)
        created = _JournalFile(
            file_seq=file_seq,
            path=os.path.join(self._dir, journal_file_name(file_seq)),
            size_bytes=len(header),
            pending=bytearray(header),
        )
        self._appended_bytes += len(header)
        self._buffered_bytes += len(header)
        self._live_bytes += len(header)
        self._files.append(created)
        self._ledger.on_file_created(file_seq)
        self._checkpoint_cv.notify_all()  # a file was sealed, if there was one before
        return created

    def _after_submit(self) -> None:
        with self._mu:
            flush = self._buffered_bytes > self._limits.write_buffer_bytes_max
            over = self._live_bytes > self._limits.bytes_max
        if flush:
            with self._io_lock:
                self._write_out_locked(sync=False)
        if over:
            # Back-pressure: the background checkpoints fell behind; this thread does one
            # (unless only abandoned stores hold the oldest file: nothing here can help).
            self._checkpoint_all_sealed()

    def sync_upto(self, position: int, timeout_ms: int | None = None) -> None:
        """Return once every journal byte below `position` is durable (group commit)."""
        wait_ms_max = self._limits.sync_wait_ms_max if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + wait_ms_max / 1000.0
        with self._mu:
            if self._durable_bytes >= position:
                return
        if not self._io_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise JournalSyncTimeout(wait_ms_max)
        try:
            with self._mu:
                if self._durable_bytes >= position:
                    return
            self._write_out_locked(sync=True)
        finally:
            self._io_lock.release()

    def _write_out_locked(self, *, sync: bool) -> None:
        """Hand the buffer to the OS and, with `sync`, make it durable. Holds `_io_lock`."""
        with self._mu:
            if self._failed is not None:
                raise self._failed
            if self._closed:
                raise StoreClosed()
            work = [(f, bytes(f.pending)) for f in self._files if f.pending]
            unsynced = [f for f in self._files if f.synced_bytes < f.size_bytes]
            if not work and not sync:
                return
            for journal_file, _ in work:
                journal_file.pending = bytearray()
            self._buffered_bytes = 0
            target = self._appended_bytes
            touched: set[JournalLink] = set()
            if sync:
                touched, self._touched = self._touched, set()
        try:
            fdatasyncs = self._write_chunks(work, unsynced if sync else [], sync)
        except OSError as exc:
            failure = self._fail(io_error(exc, "sync" if sync else "write", self._dir))
            raise failure from exc
        if sync:
            failpoint("journal_after_sync_before_ack")
        with self._mu:
            for journal_file, data in work:
                journal_file.written_bytes += len(data)
                journal_file.on_disk = True
            if sync:
                for journal_file in unsynced:
                    journal_file.synced_bytes = journal_file.written_bytes
                self._durable_bytes = max(self._durable_bytes, target)
                self._syncs += 1
                self._fdatasyncs += fdatasyncs
            for journal_file in self._files[:-1]:
                if journal_file.synced_bytes == journal_file.size_bytes:
                    _close(journal_file)
            durable = self._durable_bytes
        for link in touched:
            link.client._journal_durable(durable)

    def _write_chunks(
        self, work: list[tuple[_JournalFile, bytes]], unsynced: list[_JournalFile], sync: bool
    ) -> int:
        fdatasyncs = 0
        synced_here: set[int] = set()
        for journal_file, data in work:
            if not journal_file.on_disk and journal_file.handle is None:
                # Roll: every earlier file durable (data, then names) before this one exists,
                # so only the newest file can ever hold a torn tail.
                for earlier in self._files_before(journal_file):
                    self._writable(earlier).fdatasync()
                    fdatasyncs += 1
                    synced_here.add(earlier.file_seq)
                if self._dir_dirty:
                    self._fs.fsync_dir(self._dir)
                    self._dir_dirty = False
                journal_file.handle = self._fs.open_write(journal_file.path, create=True)
                self._dir_dirty = True
            self._writable(journal_file).write(data)
        if sync:
            failpoint("journal_after_write_before_sync")
            for journal_file in unsynced:
                if journal_file.file_seq not in synced_here:
                    self._writable(journal_file).fdatasync()
                    fdatasyncs += 1
            if self._dir_dirty:
                self._fs.fsync_dir(self._dir)
                self._dir_dirty = False
        return fdatasyncs

    def _files_before(self, journal_file: _JournalFile) -> list[_JournalFile]:
        with self._mu:
            position = self._files.index(journal_file)
            # Earlier files of this write-out were created by its previous iterations.
            return [
                f
                for f in self._files[:position]
                if (f.on_disk or f.handle is not None) and f.synced_bytes < f.size_bytes
            ]

    def _writable(self, journal_file: _JournalFile) -> WritableFile:
        if journal_file.handle is None:
            journal_file.handle = self._fs.open_write(journal_file.path, create=False)
        return journal_file.handle

    def _fail(self, error: StoreError) -> StoreError:
        with self._mu:
            first = self._failed is None
            if first:
                log.error("node journal %s failed: %s", self._dir, error)
                self._failed = StoreFailed(error)
            links = list(self._links.values())
            self._checkpoint_cv.notify_all()
        if first:
            for link in links:
                link.client._journal_failed(error)
        return error

    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise StoreClosed()
        if self._failed is not None:
            raise self._failed

    # ----------------------------------------------------------------- checkpoints

    def _run_checkpointer(self) -> None:
        while True:
            with self._mu:
                while not self._closing and self._failed is None:
                    if self._ledger.oldest_sealed() is not None and self._checkpoint_due_locked():
                        break
                    self._checkpoint_cv.wait()
                if self._closing or self._failed is not None:
                    return
            try:
                self._checkpoint_oldest()
            except StoreError as exc:
                log.error("journal checkpoint failed: %s", exc)
                return

    def _checkpoint_due_locked(self) -> bool:
        oldest = self._ledger.oldest_sealed()
        assert oldest is not None
        behind = self._ledger.stores_behind(oldest)
        # Stores that are attached can be asked; an abandoned one only by a reopen.
        return not behind or any(store_id in self._links for store_id in behind)

    def _checkpoint_all_sealed(self) -> None:
        with self._mu:
            due = self._ledger.oldest_sealed() is not None and self._checkpoint_due_locked()
        if due:
            self._checkpoint_oldest()

    def _checkpoint_oldest(self) -> None:
        """Checkpoint the stores holding up the oldest sealed file; delete what is free."""
        with self._checkpoint_lock:
            with self._mu:
                oldest = self._ledger.oldest_sealed()
                behind = {} if oldest is None else self._ledger.stores_behind(oldest)
                clients = [self._links[s].client for s in behind if s in self._links]
            for client in clients:
                client.checkpoint()
                self._checkpoints += 1
            self._delete_free_files()

    def _delete_free_files(self) -> None:
        # Under the I/O lock: no write-out may create, write or sync a file being deleted.
        with self._io_lock:
            self._delete_free_files_locked()

    def _delete_free_files_locked(self) -> None:
        with self._mu:
            doomed = [f for f in self._files if f.file_seq in set(self._ledger.deletable())]
            for journal_file in doomed:
                # Bytes never written need not be: every store checkpointed what they hold.
                self._buffered_bytes -= len(journal_file.pending)
                journal_file.pending = bytearray()
        if not doomed:
            return
        try:
            for journal_file in doomed:
                _close(journal_file)
                if journal_file.on_disk or self._fs.exists(journal_file.path):
                    self._fs.unlink(journal_file.path)
            self._fs.fsync_dir(self._dir)
        except OSError as exc:
            raise self._fail(io_error(exc, "delete journal files", self._dir)) from exc
        with self._mu:
            for journal_file in doomed:
                self._files.remove(journal_file)
                self._ledger.on_deleted(journal_file.file_seq)
                self._live_bytes -= journal_file.size_bytes
                self._deleted_files += 1

    # ----------------------------------------------------------------- recovery

    def _recover(self) -> None:
        found = recover_journal_dir(
            self._fs, self._dir, self._base_dir, self._limits, self._store_limits
        )
        self._next_file_seq = found.next_file_seq
        self._replayed_stores = found.replayed_stores
        self._torn_tail_bytes_cut = found.torn_tail_bytes_cut

    def replay_into(self, store: ReplayTarget, ops: list[StoreOp], store_dir: str) -> None:
        """Replay what `attach` returned into the store (not attached yet), durably."""
        replay_into(store, ops, store_dir)

    def _live_ops(self, store_ids: set[int]) -> list[StoreOp]:
        """The operations of `store_ids` in the live files (their page cache)."""
        with self._io_lock:
            self._write_out_locked(sync=False)
            with self._mu:
                files = [(f.path, f.file_seq) for f in self._files if f.on_disk]
            return live_ops(self._fs, files, store_ids, self._limits.record_payload_bytes_max)

    # ----------------------------------------------------------------- lifecycle, stats

    def stats(self) -> JournalStats:
        with self._mu:
            return JournalStats(
                files=len(self._files),
                live_bytes=self._live_bytes,
                appended_bytes=self._appended_bytes,
                durable_bytes=self._durable_bytes,
                syncs=self._syncs,
                fdatasyncs=self._fdatasyncs,
                checkpoints=self._checkpoints,
                deleted_files=self._deleted_files,
                replayed_stores=self._replayed_stores,
                torn_tail_bytes_cut=self._torn_tail_bytes_cut,
                failed=self._failed is not None,
            )

    def close(self) -> None:
        """Sync what was submitted and stop. Stores still attached keep their journaled
        operations for the next open (close the stores first for a clean shutdown)."""
        with self._mu:
            if self._closed or self._closing:
                return
            self._closing = True
        self._stop_checkpointer()
        with self._io_lock:
            if self._failed is None:
                with contextlib.suppress(StoreError):
                    self._write_out_locked(sync=True)
            self._close_files()

    def abandon(self) -> None:
        """Stop without writing anything more (kill -9; crash tests)."""
        with self._mu:
            self._closing = True
        self._stop_checkpointer()
        self._close_files()

    def _stop_checkpointer(self) -> None:
        """Wake the checkpointer thread (`_closing` is set) and wait for it to end."""
        with self._mu:
            self._checkpoint_cv.notify_all()
        if self._checkpointer is not None:
            self._checkpointer.join(CHECKPOINTER_JOIN_S_MAX)

    def _close_files(self) -> None:
        with self._mu:
            for journal_file in self._files:
                _close(journal_file)
            self._closed = True
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> NodeJournal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _close(journal_file: _JournalFile) -> None:
    if journal_file.handle is not None:
        handle, journal_file.handle = journal_file.handle, None
        with contextlib.suppress(OSError):
            handle.close()
