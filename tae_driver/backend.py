"""The port between the driver and a log: `LogBackend`, and the `Record` it returns.

Why this shape (reference/matrixone-wal.md §3.1, §2.7, ARCHITECTURE.md §6):

* `append(payload) -> lsn` may run concurrently; completions can arrive in any order and the
  LSN is whatever position the log gave the record. LSNs strictly increase in commit order but
  need not be dense for the driver (a log service interleaves internal entries, §0).
* `read(first_lsn, max_bytes) -> (records, next_lsn)`: each `Record` carries its own `lsn`
  (never computed by position: §2.7 Q1). At least one record is returned when any exists at
  or after `first_lsn`, even if it is larger than `max_bytes`. `next_lsn = last.lsn + 1` when
  records are returned, and `next_lsn == first_lsn` only when none are (§2.7 Q2 closed).
  Records are in strictly increasing LSN order and include non-user records typed
  `RecordKind.INTERNAL` (leader no-ops, lease updates, rejected writes: §4 scenario 6), which
  the driver ignores. Records at or below `truncated()` may be gone: callers start at
  `truncated() + 1`; a read below it may raise `OutOfRange` (the local backends always do).
* `truncate(lsn)`: logical, monotonic, inclusive. `lsn <= truncated()` raises
  `AlreadyTruncated(truncated_lsn)`, which callers treat as success when it is high enough
  (§2.4, #16987). `lsn > latest()` raises `OutOfRange`.
* `truncated()` / `latest()`: the truncated LSN and the highest assigned LSN (0 when none).

The sync/async choice: **every method is a coroutine**, `truncated()` and `latest()` included.
The driver runs on one asyncio loop, so nothing may block it; the logsvc backend answers
`truncated()`/`latest()` with a linearizable read through the leader (ARCHITECTURE.md §6, MO's
`GetTruncatedLsn` is one), which is network I/O. A synchronous signature would force that
backend to return a cached, possibly stale value, and a stale truncated LSN makes replay start
below the compaction point. For the local backends the extra `await` costs nothing.

`close()` releases the backend's resources; the driver never closes a backend it was given:
the caller owns it (tests reuse one backend across driver "crashes").

`TailWaiter` is optional: a backend that can wake a tailing reader when the log grows
implements it; the driver otherwise polls with back-off (§2.5, `ReplayForever`).

`DirectAppender` is optional too (issue 21, target 2): `append_direct(payload, done)` queues
the payload at once and calls `done` on the loop in the turn the record is learned durable,
so the driver needs no task per record and no extra loop turns between a backend's fsync and
its caller's future. Its contract is `append`'s.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

AppendDone = Callable[[int, BaseException | None], None]
"""`done(lsn, None)` once the record at `lsn` is durable, or `done(lsn, error)` when it will
never be (the error `append` would have raised)."""


class RecordKind(enum.IntEnum):
    USER = 1
    """A payload appended by a client: a driver record."""
    INTERNAL = 2
    """Anything else the log holds (no-op, lease update, rejected write): never user data."""


@dataclass(frozen=True, slots=True)
class Record:
    lsn: int
    payload: bytes
    kind: RecordKind = RecordKind.USER


class LogBackend(Protocol):
    async def append(self, payload: bytes) -> int:
        """Make `payload` durable; return its LSN. May be called concurrently."""
        ...

    async def read(self, first_lsn: int, max_bytes: int) -> tuple[list[Record], int]:
        """Records with lsn >= first_lsn, in LSN order, about `max_bytes` of payload (at least
        one if any exist), and the LSN to read from next."""
        ...

    async def truncate(self, lsn: int) -> None:
        """Logically drop every record with LSN <= lsn."""
        ...

    async def truncated(self) -> int:
        """The truncated LSN (0 when never truncated)."""
        ...

    async def latest(self) -> int:
        """The highest LSN assigned and durable (0 when empty)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class TailWaiter(Protocol):
    async def wait_past(self, lsn: int) -> None:
        """Return once `latest() > lsn`, or after a backend-chosen bounded while; callers
        re-check, so an early return is harmless."""
        ...


@runtime_checkable
class DirectAppender(Protocol):
    def append_direct(self, payload: bytes, done: AppendDone) -> None:
        """Queue `payload` now (raising at once what `append` would raise before queueing:
        `Overloaded`, `BackendClosed`, `BackendFailed`); `done` is called exactly once, on the
        loop, after the record is durable or has failed."""
        ...
