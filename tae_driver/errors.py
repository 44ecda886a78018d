"""Typed operating errors of the WAL driver and its backends.

Why typed: callers act on the kind of failure (shared/STYLE.md "Two kinds of failure"). A hole
in the DSN sequence is fatal for the engine (reference/matrixone-wal.md §5: "a hole in the DSN
sequence cannot be patched while running"), an "already truncated" answer is success (§2.4,
#16987), a full queue is back-pressure. Programmer errors are `assert`s, not listed here.

The tree::

    DriverError
    ├── Overloaded                 a bounded queue is full; retry later or await `append`
    ├── EntryTooLarge              an entry cannot fit in one record
    ├── NeedReplayForWrite         writes before `replay(FOR_WRITE)` finished (§4 scenario 13)
    ├── DriverClosed               the driver was closed or aborted
    ├── DriverFailed               an append failed; the DSN sequence may have a hole; reopen
    ├── ReplayError                replay cannot produce a gap-free sequence
    │   ├── ReplayStateError       concurrent replay, or replay after replay finished
    │   ├── ReplayHoleError        a DSN at or below the safe DSN is missing after an applied one
    │   ├── TailTruncated          a tailing reader's next record was truncated away unread
    │   ├── ReplayOverlapError     two different records claim the same DSN (partial overlap)
    │   ├── ReplayCorruptionError  a user record does not decode, or the backend misbehaved
    │   └── ReplayTooManyPending   more out-of-order records than a legal log can hold
    ├── CorruptRecord              a payload failed to decode (reason, offset)
    └── BackendError               raised by a `LogBackend`
        ├── AlreadyTruncated       truncate(lsn) with lsn <= truncated(); carries truncated_lsn
        ├── OutOfRange             read below the truncation point, or truncate past latest()
        ├── BackendClosed          the backend was closed
        ├── BackendFailed          an earlier I/O error left the backend unusable; reopen it
        │   └── BackendLocked      another process has the file log open (names its pid)
        ├── StorageCorruption      bad bytes on disk (path, offset_bytes, reason)
        ├── BackendFenced          a newer writer took the log's lease: this instance is stale
        └── BackendUnavailable     the log service gave no usable answer within the bounds
"""

from __future__ import annotations


class DriverError(Exception):
    """Base of every error raised by tae_driver."""


class Overloaded(DriverError):
    """A bounded queue is full. `queue` names it, `size_max` is its bound."""

    def __init__(self, queue: str, size_max: int) -> None:
        super().__init__(f"{queue} is full ({size_max} max)")
        self.queue = queue
        self.size_max = size_max


class EntryTooLarge(DriverError):
    def __init__(self, size_bytes: int, size_bytes_max: int) -> None:
        super().__init__(f"entry of {size_bytes} bytes exceeds {size_bytes_max}")
        self.size_bytes = size_bytes
        self.size_bytes_max = size_bytes_max


class NeedReplayForWrite(DriverError):
    """Appends are refused until `replay(mode=FOR_WRITE)` has finished (MO's
    ErrNeedReplayForWrite)."""


class DriverClosed(DriverError):
    pass


class DriverFailed(DriverError):
    """An append to the backend failed. Records after it may be durable while it is not, so the
    running driver cannot continue without a hole; the engine must reopen and replay."""


class ReplayError(DriverError):
    """Replay cannot hand the engine a gap-free, duplicate-free DSN sequence."""


class ReplayStateError(ReplayError):
    """`replay` called while another replay runs, or after one finished."""


class TailTruncated(ReplayError):
    """A FOREVER replay (a standby's tail) found that the log was truncated past the next
    record it had to read: records `next_lsn`..`truncated_lsn` are gone unread. Skipping them
    would apply later entries over a hole (issue 25), so the tail stops here; the reader
    catches up from a checkpoint that covers the gap and tails on from there."""

    def __init__(self, next_lsn: int, truncated_lsn: int, last_dsn: int) -> None:
        super().__init__(
            f"the tail's next record, LSN {next_lsn}, was truncated away (the log now starts "
            f"after LSN {truncated_lsn}; last DSN read {last_dsn}): catch up from a checkpoint"
        )
        self.next_lsn = next_lsn
        self.truncated_lsn = truncated_lsn
        self.last_dsn = last_dsn


class ReplayHoleError(ReplayError):
    """DSN `dsn` is missing although a record proved it durable (`dsn <= safe_dsn`) and an
    earlier entry was already applied: acknowledged data is gone."""

    def __init__(self, dsn: int, safe_dsn: int) -> None:
        super().__init__(f"DSN {dsn} is missing below safe DSN {safe_dsn} after an applied entry")
        self.dsn = dsn
        self.safe_dsn = safe_dsn


class ReplayOverlapError(ReplayError):
    """The record at `lsn` claims DSNs [start_dsn, end_dsn] that another, different record
    already claims (a partial overlap, or a same-range record with other content)."""

    def __init__(self, lsn: int, start_dsn: int, end_dsn: int, detail: str) -> None:
        super().__init__(f"record at LSN {lsn} with DSNs [{start_dsn}, {end_dsn}]: {detail}")
        self.lsn = lsn
        self.start_dsn = start_dsn
        self.end_dsn = end_dsn


class ReplayCorruptionError(ReplayError):
    def __init__(self, lsn: int, detail: str) -> None:
        super().__init__(f"LSN {lsn}: {detail}")
        self.lsn = lsn


class ReplayTooManyPending(ReplayError):
    def __init__(self, lsn: int, pending_max: int) -> None:
        super().__init__(f"LSN {lsn}: more than {pending_max} records pending out of DSN order")
        self.lsn = lsn
        self.pending_max = pending_max


class CorruptRecord(DriverError):
    """A driver record failed to decode. `reason` is one of the strings in record.py
    (REASON_*); `offset` is the byte offset of the offending field in the payload."""

    def __init__(self, reason: str, offset: int, detail: str = "") -> None:
        super().__init__(f"{reason} at byte {offset}" + (f": {detail}" if detail else ""))
        self.reason = reason
        self.offset = offset


class BackendError(DriverError):
    """Base of errors raised by `LogBackend` implementations."""


class AlreadyTruncated(BackendError):
    """truncate(lsn) with lsn <= the backend's truncated LSN. The driver counts it as success
    when `truncated_lsn` >= what it asked for (§2.4, MO #16987/#16989)."""

    def __init__(self, requested_lsn: int, truncated_lsn: int) -> None:
        super().__init__(f"truncate({requested_lsn}): already truncated at {truncated_lsn}")
        self.requested_lsn = requested_lsn
        self.truncated_lsn = truncated_lsn


class OutOfRange(BackendError):
    def __init__(self, lsn: int, truncated_lsn: int, latest_lsn: int) -> None:
        super().__init__(
            f"LSN {lsn} is outside the log (truncated {truncated_lsn}, latest {latest_lsn})"
        )
        self.lsn = lsn
        self.truncated_lsn = truncated_lsn
        self.latest_lsn = latest_lsn


class BackendClosed(BackendError):
    pass


class BackendFailed(BackendError):
    """An earlier write or fsync failed; after a failed fsync the file's state is unknown
    (fsyncgate), so the backend refuses everything until it is reopened."""


class BackendLocked(BackendFailed):
    """Another process holds the file log's lock. `holder_pid` is the pid it wrote in the
    lock file, or None when it wrote none (a version before the pid, or it is still writing
    it)."""

    def __init__(self, dir_path: str, holder_pid: int | None) -> None:
        holder = f"process {holder_pid}" if holder_pid is not None else "another process"
        super().__init__(f"{dir_path} is locked by {holder}")
        self.dir_path = dir_path
        self.holder_pid = holder_pid


class StorageCorruption(BackendError):
    """Bad bytes at `offset_bytes` of `path` that are not a torn tail (ARCHITECTURE.md §11).
    `lsn_lo`/`lsn_hi`, when known, are the LSNs the damage makes unreadable, `[lsn_lo,
    lsn_hi)`: from the first LSN at or after the damage to past the last one found whole
    after it (so a repair that moves the damaged suffix aside loses exactly these)."""

    def __init__(
        self,
        path: str,
        offset_bytes: int,
        reason: str,
        *,
        lsn_lo: int | None = None,
        lsn_hi: int | None = None,
    ) -> None:
        lsns = ""
        if lsn_lo is not None:
            lsns = f" (LSNs [{lsn_lo}, {lsn_hi if lsn_hi is not None else '?'}) affected)"
        super().__init__(f"{path} at byte {offset_bytes}: {reason}{lsns}")
        self.path = path
        self.offset_bytes = offset_bytes
        self.reason = reason
        self.lsn_lo = lsn_lo
        self.lsn_hi = lsn_hi


class BackendFenced(BackendError):
    """The log refused a write because a newer writer holds its lease (a higher epoch): this
    engine instance is stale and must stop writing. Never retried; the driver fails with it
    as the cause of `DriverFailed`. `holder`/`epoch` are this backend's lease (None and 0
    without one), `current_holder`/`current_epoch` the log's (holder None when unknown)."""

    def __init__(
        self,
        detail: str,
        *,
        holder: str | None,
        epoch: int,
        current_holder: str | None,
        current_epoch: int | None,
    ) -> None:
        super().__init__(
            f"{detail}: fenced at epoch {epoch} (holder {holder}); the lease is held by "
            f"{current_holder} at epoch {current_epoch}"
        )
        self.holder = holder
        self.epoch = epoch
        self.current_holder = current_holder
        self.current_epoch = current_epoch


class BackendUnavailable(BackendError):
    """No usable answer from the log service within the backend's bounds (the client's
    retries ran out, or the whole call timed out). An append's outcome is unknown: it may
    be durable; replay after a reopen decides."""
