"""The local file-system `LogBackend`: rotating segment files with group fsync.

Why (reference/matrixone-wal.md §2.6 `batchstoredriver`, ARCHITECTURE.md §3, §7): the seeds'
local backend, for an engine that runs without a log service and for benchmarks.

* **Layout**: a directory of segments `wal-<base_lsn:020d>.seg` (format in FORMAT.md here,
  codec in segment.py) and a `LOCK` file held with `flock` while open (holding the holder's
  pid). LSNs are dense from 1.
  A segment is created as `*.tmp`, given its header, fsynced, renamed, and the directory
  fsynced, so a segment with its final name always has a whole header.
* **Group commit**: appends queue (bounded: `FILE_PENDING_APPENDS_MAX`, then `Overloaded`)
  for one long-lived syncer thread (`syncer.GroupSyncer`, issue 21) that takes everything
  queued as soon as its previous fsync returns (bounded by `FILE_SYNC_BATCH_*`), encodes it
  with the durable LSN as of this group write in every frame (format v2's hint), writes it
  with one `pwrite` and makes it durable with **one fdatasync**, then hands the group back
  with one `call_soon_threadsafe`, whose callback completes every append of the group in that
  loop turn (`append_direct`'s callbacks run right there: no task, no extra turn). No append
  completes before its fsync; nothing syncs per append.
* **Preallocation** (segment format v3, FORMAT.md): the active segment is allocated with
  zeros (`posix_fallocate`, fsynced) `preallocate_bytes` ahead of the write position, so a
  group's fdatasync only writes data (no new size, no new blocks). Every byte past the last
  written frame is zero: on open the zeros ahead of the writer are the end of the log (not a
  torn tail), a torn tail is cut (ftruncate) and the space is allocated again as the writer
  reaches it. Segments of versions 1 and 2 are read as before and never appended to.
* **Off the loop**: every blocking disk call runs off the loop: group writes and syncs in the
  syncer thread (which alone touches the active segment's descriptor, `_Writer`, in
  file_writer.py), the open scan, reads, unlinks and renames in `asyncio.to_thread`. Only
  the loop mutates the in-memory index, from each group's result.
* **Truncate** writes a TRUNCATE frame into the active segment (durable before the call
  returns), then deletes every older segment whose records are all <= the LSN, except the one
  that holds the newest TRUNCATE frame, and fsyncs the directory. Whole files only.
* **Open** scans every segment: the truncated LSN is the highest TRUNCATE frame; segments
  wholly below it are deleted (finishing an interrupted truncation); the newest segment's torn
  tail (only bytes that could never have been acknowledged: `segment.classify_bad_frame`,
  FORMAT.md) is cut back; any other damage raises `StorageCorruption` before anything is
  changed (issue 20). The newest segment is then fdatasynced (a process crash may have left
  its frames in the page cache only: nothing unsynced is served or counted in a hint), and
  if it is a version 1 segment a new version 2 one is rolled (frames of one version never
  go into a file of another): file_recovery.py. `repair.py` moves a damaged suffix aside on
  request.
* **Failure**: a failed write or fsync leaves the file in an unknown state (fsyncgate), so
  the backend fails every pending and later call with `BackendFailed` until reopened; the
  reopen's scan decides what survived.
* **Read-only** (`open(dir, read_only=True)`, issue 20): a tool's look at a log, maybe beside
  a running writer: no lock, and nothing created, cut, deleted or synced; `_open_read_only`.
  Damage it finds is read again before it is reported (a write being copied in can look
  torn to a read copying the file out: `_scan_live`, file_read_only.py).

Crash cases (power loss may drop unsynced bytes and tear the last write):

| crash during              | found on open                        | action                       |
|---------------------------|--------------------------------------|------------------------------|
| a group write / fsync     | ends inside a frame; zero-filled end | cut back; none was acked     |
| a group write / fsync     | zeros, then frames whose hints say   | cut back (v2); none was acked|
|                           | the zeroed LSN was not yet durable   |                              |
| (none: disk damage)       | bad frame + valid ones that were     | refuse; change nothing       |
|                           | durable or no zeros; whole bad end   |                              |
| segment creation          | a `*.tmp` file, or nothing           | delete the tmp               |
| rename / dir fsync        | new segment with no frames, or none  | keep it / use the old one    |
| truncate frame write      | old truncated LSN                    | truncate was not acked       |
| v3: any group write       | frames, then zeros to the end        | clean: the zeros are the     |
|                           |                                      | preallocated rest; keep them |
| v3: a group write / fsync | frames, a torn tail, zeros to the end| cut back to the last frame   |
|                           |                                      | (the torn tail's rules above |
|                           |                                      | apply up to the last written |
|                           |                                      | byte: `segment.written_view`)|
| v3: allocation ahead      | a shorter file, or zeros further on  | either is clean              |
| whole-file deletion       | some doomed segments remain          | delete them again            |
"""

from __future__ import annotations

import asyncio
import bisect
import fcntl
import os
from array import array
from dataclasses import dataclass

from tae_driver import limits
from tae_driver.backend import AppendDone, Record
from tae_driver.backends import segment
from tae_driver.backends.file_read_only import scan_read_only
from tae_driver.backends.file_recovery import _Segment, recover
from tae_driver.backends.file_writer import (
    Fsync,
    _GroupResult,
    _header_bytes,
    _Pending,
    _take_group,
    _Writer,
    write_group,
)
from tae_driver.backends.segment import FrameType
from tae_driver.backends.segment_files import (
    ReadStep,
    close_fds,
    delete_segments,
    lock_holder,
    note_lock_holder,
    read_sync,
)
from tae_driver.backends.syncer import GroupSyncer
from tae_driver.errors import (
    AlreadyTruncated,
    BackendClosed,
    BackendFailed,
    BackendLocked,
    OutOfRange,
)

LOCK_FILE_NAME = "LOCK"


@dataclass(frozen=True, slots=True)
class FileBackendStats:
    data_syncs: int
    dir_syncs: int
    batches_written: int
    frames_written: int
    segments: int
    segments_deleted: int
    torn_bytes_cut: int


class FileBackend:
    """Open with `await FileBackend.open(dir_path)`."""

    def __init__(
        self,
        dir_path: str,
        lock_fd: int,
        segments: list[_Segment],
        writer: _Writer | None,
        truncated_lsn: int,
        *,
        segment_bytes_max: int,
        preallocate_bytes: int,
        fsync: Fsync,
        torn_bytes_cut: int,
        dir_syncs: int,
        segments_deleted: int,
    ) -> None:
        self._dir_path = dir_path
        self._lock_fd = lock_fd
        self._segments = segments
        self._writer = writer
        self._truncated_lsn = truncated_lsn
        self._durable_lsn = max(segments[-1].last_lsn, truncated_lsn)
        self._next_lsn = self._durable_lsn + 1
        self._segment_bytes_max = segment_bytes_max
        self._preallocate_bytes = preallocate_bytes
        self._fsync = fsync
        self._syncer: GroupSyncer[_Pending, _GroupResult] | None = None
        self._outstanding = 0
        """Appends and truncate frames handed to the syncer and not yet handed back."""
        self._grown = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._truncate_lock = asyncio.Lock()
        self._failure: BaseException | None = None
        self._closed = False
        self._data_syncs = 0
        self._dir_syncs = dir_syncs
        self._batches_written = 0
        self._frames_written = 0
        self._segments_deleted = segments_deleted
        self._torn_bytes_cut = torn_bytes_cut
        self._read_only = False
        self._read_fds: dict[str, int] = {}
        """Read-only: a descriptor per segment, opened at open, read through until close."""

    # --- opening --------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        dir_path: str,
        *,
        segment_bytes_max: int = limits.FILE_SEGMENT_BYTES_DEFAULT,
        preallocate_bytes: int = limits.FILE_PREALLOCATE_BYTES_DEFAULT,
        fsync: Fsync = os.fdatasync,
        read_only: bool = False,
    ) -> FileBackend:
        """Open (creating if needed) the log in `dir_path`. `fsync` makes a file's data
        durable (it runs in the syncer thread); tests may wrap it to observe the order of
        syncs and acknowledgements. `preallocate_bytes`: how far ahead of the writer the
        active segment is allocated. `read_only`: the log as it is now, changing nothing
        (`_open_read_only`)."""
        if segment_bytes_max < limits.FILE_SEGMENT_BYTES_MIN:
            raise ValueError(f"segment_bytes_max={segment_bytes_max} is below the minimum")
        if preallocate_bytes < limits.FILE_PREALLOCATE_BYTES_MIN:
            raise ValueError(f"preallocate_bytes={preallocate_bytes} is below the minimum")
        if read_only:
            return await asyncio.to_thread(cls._open_read_only, dir_path, segment_bytes_max)
        return await asyncio.to_thread(
            cls._open_sync, dir_path, segment_bytes_max, preallocate_bytes, fsync
        )

    @classmethod
    def _open_sync(
        cls, dir_path: str, segment_bytes_max: int, preallocate_bytes: int, fsync: Fsync
    ) -> FileBackend:
        os.makedirs(dir_path, exist_ok=True)
        lock_fd = os.open(os.path.join(dir_path, LOCK_FILE_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise BackendLocked(dir_path, lock_holder(lock_fd)) from None
            note_lock_holder(lock_fd)
            return cls._recover(dir_path, lock_fd, segment_bytes_max, preallocate_bytes, fsync)
        except BaseException:
            os.close(lock_fd)
            raise

    @classmethod
    def _recover(
        cls,
        dir_path: str,
        lock_fd: int,
        segment_bytes_max: int,
        preallocate_bytes: int,
        fsync: Fsync,
    ) -> FileBackend:
        found = recover(dir_path, segment_bytes_max, preallocate_bytes, fsync)
        return cls(
            dir_path,
            lock_fd,
            found.segments,
            found.writer,
            found.truncated_lsn,
            segment_bytes_max=segment_bytes_max,
            preallocate_bytes=preallocate_bytes,
            fsync=fsync,
            torn_bytes_cut=found.torn_bytes_cut,
            dir_syncs=found.dir_syncs,
            segments_deleted=found.segments_deleted,
        )

    @classmethod
    def _open_read_only(cls, dir_path: str, segment_bytes_max: int) -> FileBackend:
        """The log as it is now, for tools that must write nothing (issue 20: `python -m
        engine tables` cut a WAL and could not look at a running engine), beside a writer
        that may hold the lock and append. `_recover`'s decisions, made in memory only: the
        newest segment's torn tail (or a writer's half-written batch) is not read, never cut;
        `*.tmp` files and segments wholly below the truncation point are passed over, never
        deleted; an empty log gets no segment. Each segment is opened once and read through
        that descriptor until `close`, so a truncation by the writer meanwhile does not delete
        the log under a replay; later appends are not seen (open again to see them). A
        segment gone between the listing and its opening was truncated away: list again."""
        for _ in range(limits.FILE_READ_ONLY_OPEN_ATTEMPTS_MAX):
            fds: dict[str, int] = {}
            try:
                return cls._scan_read_only(dir_path, segment_bytes_max, fds)
            except FileNotFoundError:
                close_fds(list(fds.values()))
                if not os.path.isdir(dir_path):
                    raise BackendFailed(f"no log in {dir_path}: it does not exist") from None
            except BaseException:
                close_fds(list(fds.values()))
                raise
        raise BackendFailed(
            f"{dir_path}: segments deleted under every one of "
            f"{limits.FILE_READ_ONLY_OPEN_ATTEMPTS_MAX} read-only scans"
        )

    @classmethod
    def _scan_read_only(
        cls, dir_path: str, segment_bytes_max: int, fds: dict[str, int]
    ) -> FileBackend:
        segments, truncated_lsn = scan_read_only(dir_path, fds)
        backend = cls(
            dir_path,
            -1,
            segments,
            None,
            truncated_lsn,
            segment_bytes_max=segment_bytes_max,
            preallocate_bytes=limits.FILE_PREALLOCATE_BYTES_DEFAULT,
            fsync=_refuse_fsync,
            torn_bytes_cut=0,
            dir_syncs=0,
            segments_deleted=0,
        )
        backend._read_only = True
        backend._read_fds = fds
        return backend

    # --- observations ---------------------------------------------------------------------

    @property
    def dir_path(self) -> str:
        return self._dir_path

    @property
    def written_lsn(self) -> int:
        """The highest LSN handed to the OS (maybe not yet durable); for sync-order tests."""
        return self._durable_lsn if self._writer is None else self._writer.written_lsn

    def stats(self) -> FileBackendStats:
        return FileBackendStats(
            data_syncs=self._data_syncs,
            dir_syncs=self._dir_syncs,
            batches_written=self._batches_written,
            frames_written=self._frames_written,
            segments=len(self._segments),
            segments_deleted=self._segments_deleted,
            torn_bytes_cut=self._torn_bytes_cut,
        )

    def segment_paths(self) -> list[str]:
        return [s.path for s in self._segments]

    # --- LogBackend -----------------------------------------------------------------------

    async def append(self, payload: bytes) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.append_direct(payload, _completer(future))
        return await future

    def append_direct(self, payload: bytes, done: AppendDone) -> None:
        """`append` without a coroutine (`backend.DirectAppender`): queue `payload` for the
        next group write now; `done(lsn, None)` runs on the loop in the turn its fsync is
        learned, or `done(lsn, error)`. Raises `Overloaded` (the syncer's queue is full),
        `BackendClosed` or `BackendFailed` at once, queueing nothing."""
        self._check_usable()
        assert not self._read_only, "append on a read-only FileBackend"
        assert len(payload) <= limits.BACKEND_PAYLOAD_BYTES_MAX
        lsn = self._next_lsn
        self._put(_Pending(FrameType.RECORD, lsn, bytes(payload), done))
        self._next_lsn += 1

    async def read(self, first_lsn: int, max_bytes: int) -> tuple[list[Record], int]:
        self._check_usable()
        assert first_lsn >= 1
        assert max_bytes >= 1
        if first_lsn <= self._truncated_lsn:
            raise OutOfRange(first_lsn, self._truncated_lsn, self._durable_lsn)
        if first_lsn > self._durable_lsn:
            return [], first_lsn
        plan = self._plan_read(first_lsn, max_bytes)
        try:
            pairs = await asyncio.to_thread(read_sync, plan, self._read_fds)
        except FileNotFoundError:
            # The segment was deleted by a truncation that overtook this read.
            raise OutOfRange(first_lsn, self._truncated_lsn, self._durable_lsn) from None
        records = [Record(lsn, body) for lsn, body in pairs]
        return records, records[-1].lsn + 1

    async def truncate(self, lsn: int) -> None:
        self._check_usable()
        assert not self._read_only, "truncate on a read-only FileBackend"
        async with self._truncate_lock:
            if lsn <= self._truncated_lsn:
                raise AlreadyTruncated(lsn, self._truncated_lsn)
            if lsn > self._durable_lsn:
                raise OutOfRange(lsn, self._truncated_lsn, self._durable_lsn)
            future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            # Unbounded: one at a time (this lock), never refused for appends' back-pressure.
            self._put(_Pending(FrameType.TRUNCATE, lsn, b"", _completer(future)), bounded=False)
            await future
            self._truncated_lsn = max(self._truncated_lsn, lsn)
            holder = max(
                (i for i, s in enumerate(self._segments) if s.truncate_lsn_max >= lsn),
                default=len(self._segments) - 1,
            )
            doomed: list[_Segment] = []
            while len(doomed) < holder and self._segments[len(doomed)].last_lsn <= lsn:
                doomed.append(self._segments[len(doomed)])
            if doomed:
                del self._segments[: len(doomed)]
                await asyncio.to_thread(delete_segments, self._dir_path, [s.path for s in doomed])
                self._dir_syncs += 1
                self._segments_deleted += len(doomed)

    async def truncated(self) -> int:
        self._check_usable()
        return self._truncated_lsn

    async def latest(self) -> int:
        self._check_usable()
        return self._durable_lsn

    async def wait_past(self, lsn: int) -> None:
        while not self._closed and self._failure is None and self._durable_lsn <= lsn:
            self._grown.clear()
            await self._grown.wait()

    async def close(self) -> None:
        """Flush what is queued, stop the syncer thread, release the directory."""
        if self._closed:
            return
        while self._failure is None and self._outstanding:
            self._idle.clear()
            await self._idle.wait()
        self._closed = True
        self._grown.set()
        writer_fd = -1 if self._writer is None else self._writer.fd
        if self._syncer is not None:
            thread = self._syncer.stop()
            if thread is not None:
                await asyncio.to_thread(thread.join, limits.FILE_SYNCER_JOIN_S_MAX)
                if thread.is_alive():
                    # Stuck in a system call (a hung disk): its descriptor stays open, so
                    # that a later write of the thread can never land in a reused one.
                    writer_fd = -1
        fds = [writer_fd, self._lock_fd, *self._read_fds.values()]
        await asyncio.to_thread(close_fds, [fd for fd in fds if fd >= 0])

    # --- group writes (the syncer thread and its results) ----------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise BackendClosed(f"{self._dir_path} is closed")
        if self._failure is not None:
            raise BackendFailed(f"{self._dir_path} failed: {self._failure!r}") from self._failure

    def _put(self, item: _Pending, *, bounded: bool = True) -> None:
        syncer = self._syncer
        if syncer is None:
            syncer = self._syncer = GroupSyncer(
                asyncio.get_running_loop(),
                name="file backend appends",
                write_group=self._write_group,
                on_done=self._group_done,
                take=_take_group,
                items_max=limits.FILE_PENDING_APPENDS_MAX,
                idle_exit_s=limits.FILE_SYNCER_IDLE_EXIT_S,
            )
        syncer.put(item, bounded=bounded)  # Overloaded: nothing queued, nothing counted
        self._outstanding += 1
        self._idle.clear()

    def _write_group(self, group: list[_Pending]) -> _GroupResult:
        """In the syncer thread: `file_writer.write_group` on the active segment."""
        writer = self._writer
        assert writer is not None
        return write_group(
            writer,
            group,
            self._dir_path,
            self._segment_bytes_max,
            self._preallocate_bytes,
            self._fsync,
        )

    def _group_done(
        self, group: list[_Pending], result: _GroupResult | None, error: BaseException | None
    ) -> None:
        """On the loop, once per group: index what was written, then complete every item of
        the group in this turn (acknowledged only now: its bytes and all before are synced)."""
        self._outstanding -= len(group)
        if error is not None or result is None:
            self._fail(error or AssertionError("group without a result"), group)
        else:
            self._apply_group(group, result)
        if not self._outstanding:
            self._idle.set()

    def _apply_group(self, group: list[_Pending], result: _GroupResult) -> None:
        active = self._segments[-1]
        assert active.version == segment.SEGMENT_VERSION
        assert result.offset_bytes == active.size_bytes
        self._data_syncs += 1
        self._batches_written += 1
        self._frames_written += len(group)
        offset = active.size_bytes
        for item, frame_bytes in zip(group, result.frame_bytes, strict=True):
            if item.frame_type is FrameType.RECORD:
                assert item.lsn == active.last_lsn + 1
                active.record_offsets.append(offset)
                active.record_frame_bytes.append(frame_bytes)
            else:
                active.truncate_lsn_max = max(active.truncate_lsn_max, item.lsn)
            offset += frame_bytes
        active.size_bytes = offset
        self._durable_lsn = max(self._durable_lsn, result.durable_lsn)
        if result.rotated_to is not None:
            path, base_lsn = result.rotated_to
            self._dir_syncs += 1
            assert base_lsn == self._durable_lsn + 1
            self._segments.append(_Segment(path, base_lsn, array("Q"), array("Q"), _header_bytes()))
        self._grown.set()
        for item in group:
            assert item.frame_type is FrameType.TRUNCATE or item.lsn <= self._durable_lsn
            item.done(item.lsn, None)

    def _fail(self, exc: BaseException, group: list[_Pending]) -> None:
        """A write or fsync failed (fsyncgate: the file's state is unknown): fail the group,
        everything still queued, and every later call until reopened."""
        if self._failure is None:
            self._failure = exc
        stranded = self._syncer.drain() if self._syncer is not None else []
        self._outstanding -= len(stranded)
        for item in [*group, *stranded]:
            error = BackendFailed(f"write failed: {exc!r}")
            error.__cause__ = exc
            item.done(item.lsn, error)
        self._grown.set()

    def _plan_read(self, first_lsn: int, max_bytes: int) -> list[ReadStep]:
        """(path, file offset, byte count, first LSN, record count, version) per segment."""
        bases = [s.base_lsn for s in self._segments]
        index = bisect.bisect_right(bases, first_lsn) - 1
        assert index >= 0
        plan: list[ReadStep] = []
        budget_bytes = max_bytes
        lsn = first_lsn
        while index < len(self._segments) and lsn <= self._durable_lsn:
            seg = self._segments[index]
            header_bytes = segment.frame_header_bytes(seg.version)
            position = lsn - seg.base_lsn
            count = 0
            while position + count < len(seg.record_offsets) and lsn + count <= self._durable_lsn:
                frame_bytes = seg.record_frame_bytes[position + count]
                payload_bytes = frame_bytes - header_bytes
                if (plan or count) and payload_bytes > budget_bytes:
                    break
                budget_bytes -= payload_bytes
                count += 1
            if count:
                start = seg.record_offsets[position]
                last = position + count - 1
                end = seg.record_offsets[last] + seg.record_frame_bytes[last]
                plan.append((seg.path, start, end - start, lsn, count, seg.version))
                lsn += count
            if position + count < len(seg.record_offsets) or budget_bytes <= 0:
                break
            index += 1
        assert plan
        return plan


def _completer(future: asyncio.Future[int]) -> AppendDone:
    def done(lsn: int, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(lsn)
        else:
            future.set_exception(error)

    return done


def _refuse_fsync(fd: int) -> None:
    raise AssertionError("a read-only FileBackend never syncs")
