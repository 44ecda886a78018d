"""Typed operating errors of the engine.

Why typed (shared/STYLE.md "Two kinds of failure"): a caller retries a `WriteConflict`, fixes
its input after a `SchemaError`, and reopens after a `WalFailed`; each carries what it needs
to act on. Programmer errors (a broken invariant) are `assert`s and are not listed here.

The tree::

    EngineError
    ├── TxnError                    the transaction cannot commit as asked; it is rolled back
    │   ├── WriteConflict           a concurrent commit won (first committer wins); retryable
    │   ├── DuplicateKey            a primary key is already live (committed, or in this txn)
    │   └── TxnTooLarge            the txn's WAL entry or workspace passes a named limit
    ├── BadInput                    the request itself is wrong; nothing was logged
    │   ├── SchemaError             unknown column, wrong type, null in a key or non-null column
    │   ├── NotFound                unknown database or table (at the txn's snapshot), no engine
    │   ├── AlreadyExists           a database or table of that name is already visible
    │   ├── NotAnEngine             Engine.open's path is a file, or a directory of other things
    │   ├── SqlError                `sql()`: a syntax or binder error (DuckDB's message), an
    │   │                           unknown table, a write, a result past its limit
    │   └── BadArgument             a command line's argument is wrong for the table it names
    │       └── BadFilter           a `--where` filter's text (engine/where.py): names the spot
    ├── TxnClosed                   the transaction already committed or rolled back
    ├── EngineClosed                use after `close()`
    ├── OpenFailed                  Engine.open could not open or read the WAL (the cause kept)
    │   └── EngineLocked            another process has the engine's file WAL open (its pid)
    ├── Overloaded                  a bounded queue is full; retry later
    ├── SnapshotUnavailable         a snapshot timestamp the engine cannot serve (oldest_ts)
    │   └── TimestampInFuture       a timestamp or wall time past what has happened yet
    ├── SqlUnavailable              `sql()` without DuckDB installed: says how to install it
    ├── LogtailUnavailable          (engine/logtail.py) neither memory nor a checkpoint answers
    ├── OutcomeUnknown              a compute node's commit: no TN could say whether it landed
    ├── WalFailed                   the WAL refused or lost an append: the engine is read-only
    │   └── Fenced                  a newer engine took the log's lease: this one is stale
    ├── WalCorruption               a WAL entry failed to decode or apply (names the DSN)
    └── StandbyFailed               a standby's tail of the WAL gave up: it cannot take over
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error raised by the engine."""


class TxnError(EngineError):
    """The transaction cannot commit as asked. It has been rolled back."""


class WriteConflict(TxnError):
    """A transaction committed after this one started wrote the same key (or dropped the
    table, or created the same name). First committer wins; retry with a new transaction."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class DuplicateKey(TxnError):
    """An insert names a primary key that is already live: in committed data at the txn's
    snapshot, earlier in the same txn, twice in one insert, or committed concurrently."""

    def __init__(self, table: str, key: object) -> None:
        super().__init__(f"duplicate primary key {key!r} in {table}")
        self.table = table
        self.key = key


class TxnTooLarge(TxnError):
    """The transaction passes `limit` (a name from engine/limits.py) of `size_max` units.
    The message says how to split it, and which `TxnLimits` field raises the limit."""

    def __init__(self, limit: str, size: int, size_max: int) -> None:
        super().__init__(f"transaction too large: {limit} {size} > {size_max}; {_split(limit)}")
        self.limit = limit
        self.size = size
        self.size_max = size_max


_SPLIT = {
    "txn_deletes_max": ("rows deleted or updated", "deletes_max"),
    "txn_spill_rows_max": ("rows inserted or updated", "rows_max"),
    "txn_workspace_bytes_max": ("bytes of rows inserted or updated", "workspace_bytes_max"),
}


def _split(limit: str) -> str:
    """What to do about a `TxnTooLarge` (issue 20: the error did not say)."""
    known = _SPLIT.get(limit)
    if known is None:
        return "split it into smaller transactions"
    what, field = known
    return (
        f"split it into transactions of fewer {what} (commit every N keys or rows), or "
        f"raise the limit: Engine.open(..., txn_limits=TxnLimits({field}=...))"
    )


class BadInput(EngineError):
    """The request is wrong in itself; nothing was logged and the txn may go on."""


class SchemaError(BadInput):
    pass


class NotFound(BadInput):
    pass


class AlreadyExists(BadInput):
    pass


class BadArgument(BadInput):
    """A command line's argument is wrong for what it names (an unknown column, a bad
    --at); the command line exits 2 with this message."""


class BadFilter(BadArgument):
    """A filter's text (engine/where.py) is not one: the message names the column, literal
    or character and its position."""


class NotAnEngine(BadInput):
    """`Engine.open(path)` refused `path`: it is a file, or a directory holding things that
    are not an engine's (issue 20: `Engine.open("/etc")` made `/etc/wal`). `found` names
    what was there."""

    def __init__(self, path: str, found: str) -> None:
        super().__init__(f"{path} is not an engine's directory: {found}")
        self.path = path
        self.found = found


class SqlError(BadInput):
    """A SQL query the engine refused or DuckDB could not run: a syntax or binder error
    (DuckDB's own message, with its position), an unknown table, a statement other than one
    read-only SELECT, or a result larger than `limits.SQL_RESULT_BYTES_MAX`. Nothing was
    changed."""


class SqlUnavailable(EngineError):
    """`sql()` needs DuckDB, an optional extra that is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "SQL needs DuckDB: pip install 'logsvc[sql]' (or pip install duckdb==2.0.1)"
        )


class TxnClosed(EngineError):
    """The transaction is over (committed, rolled back, or failed)."""


class EngineClosed(EngineError):
    pass


class OpenFailed(EngineError):
    """`Engine.open` could not open or read the WAL: the backend's or the file system's
    error is the `__cause__` (a corrupt segment, an unreachable log service, a permission)."""


class EngineLocked(OpenFailed):
    """Another process has the engine's file WAL open (one writer per directory): stop it,
    or look with `read_only=True` (which takes no lock). `holder_pid` is the pid it recorded
    in the lock file (None: not recorded, an older version)."""

    def __init__(self, path: str, holder_pid: int | None) -> None:
        holder = f"process {holder_pid}" if holder_pid is not None else "another process"
        super().__init__(f"engine {path} is open in {holder} (its WAL is locked)")
        self.path = path
        self.holder_pid = holder_pid


class Overloaded(EngineError):
    """A bounded queue is full. `queue` names it, `size_max` is its bound."""

    def __init__(self, queue: str, size_max: int) -> None:
        super().__init__(f"{queue} is full ({size_max} max)")
        self.queue = queue
        self.size_max = size_max


class SnapshotUnavailable(EngineError):
    """A snapshot the engine cannot serve: older than its history (outside the retention
    window, decision 0010), or not held by a TN any more. `oldest_ts` is the oldest
    timestamp still readable when the engine knows it (None: it came over the wire, or the
    cause is not age); the message names it."""

    def __init__(self, message: str, oldest_ts: int | None = None) -> None:
        super().__init__(message)
        self.oldest_ts = oldest_ts


class TimestampInFuture(SnapshotUnavailable):
    """A snapshot asked at a commit timestamp above the newest visible one, or at a wall time
    later than the engine's clock: nothing that has happened can answer it yet (and later
    the answer could still change). `newest_ts` is the newest timestamp readable now."""

    def __init__(self, message: str, newest_ts: int) -> None:
        super().__init__(message)
        self.newest_ts = newest_ts


class WalFailed(EngineError):
    """The WAL failed an append, so nothing more can be acknowledged: the engine turned
    read-only. A commit that raised this may or may not be durable; reopen to find out
    (replay decides, and a commit is wholly there or wholly absent)."""


class Fenced(WalFailed):
    """Another engine opened the same log with a newer lease epoch: this engine is stale and
    never acknowledges another commit."""


class WalCorruption(EngineError):
    """WAL entry `dsn` cannot be decoded or applied. `reason` names the check that failed and
    `offset_bytes` where in the entry, when known. A WAL whose storage is corrupt (the file
    backend's `StorageCorruption`, raised by `Engine.open`) also names the file (`path`,
    `offset_bytes` then in that file) and the DSNs it makes unreadable, `[dsn, dsn_hi)`
    (`dsn` 0 and `dsn_hi` None when they could not be read)."""

    def __init__(
        self,
        dsn: int,
        reason: str,
        offset_bytes: int | None = None,
        *,
        dsn_hi: int | None = None,
        path: str | None = None,
    ) -> None:
        where = f" at byte {offset_bytes}" if offset_bytes is not None else ""
        super().__init__(f"WAL entry at DSN {dsn}: {reason}{where}")
        self.dsn = dsn
        self.reason = reason
        self.offset_bytes = offset_bytes
        self.dsn_hi = dsn_hi
        self.path = path


class StandbyFailed(EngineError):
    """A standby's tail of the WAL failed again and again without progress (engine/standby.py):
    it no longer follows the writer and cannot be promoted. Restart it (it opens from the
    newest checkpoint)."""


class OutcomeUnknown(EngineError):
    """A compute node's commit may or may not have landed: the TN it was sent to went away,
    and no TN reachable within the bounds could say (issue 15). Ask again later with the same
    (client_id, seq): the TN remembers recent origins."""
