"""Group commit: when to start the next sync. A pure policy, no I/O, no clock of its own.

One fdatasync covers every entry appended since the last one (ARCHITECTURE.md §3, rule 6;
BookKeeper's journal). A sync starts when any of these holds and no sync is in flight:

* somebody asked for durability *now* (`request_urgent`: Raft must sync before it sends a
  vote or an AppendEntries reply, so waiting would only add latency);
* `bytes_max` bytes are waiting to become durable;
* the oldest unsynced entry has waited `delay_ms_max` (0: as soon as the disk is free).

While a sync is in flight, new entries accumulate; the next sync takes them all. That is
where the batching comes from: the slower the disk, the bigger the batch.

The shell (`store.py` and its parts) feeds events in with `now_ms` and asks
`next_action(now_ms)`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SyncNow:
    """Start a sync covering every entry appended so far."""


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Nothing to do before `deadline_ms` unless a new event arrives."""

    deadline_ms: float


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to do until a new event arrives."""


Action = SyncNow | WaitUntil | Idle
SYNC_NOW = SyncNow()
IDLE = Idle()


class GroupCommitPolicy:
    __slots__ = (
        "_bytes_max",
        "_delay_ms_max",
        "_in_flight",
        "_oldest_unsynced_ms",
        "_unsynced_bytes",
        "_urgent",
    )

    def __init__(self, *, bytes_max: int, delay_ms_max: int) -> None:
        assert bytes_max > 0
        assert delay_ms_max >= 0
        self._bytes_max = bytes_max
        self._delay_ms_max = delay_ms_max
        self._unsynced_bytes = 0
        self._oldest_unsynced_ms: float | None = None
        self._urgent = False
        self._in_flight = False

    @property
    def unsynced_bytes(self) -> int:
        return self._unsynced_bytes

    @property
    def in_flight(self) -> bool:
        return self._in_flight

    def on_append(self, size_bytes: int, now_ms: float) -> None:
        assert size_bytes > 0
        if self._oldest_unsynced_ms is None:
            self._oldest_unsynced_ms = now_ms
        self._unsynced_bytes += size_bytes

    def request_urgent(self) -> None:
        # Entries already covered by an in-flight sync need nothing more.
        if self._unsynced_bytes > 0:
            self._urgent = True

    def on_sync_started(self) -> int:
        """Mark the sync in flight; return the bytes it covers."""
        assert not self._in_flight
        covered = self._unsynced_bytes
        self._in_flight = True
        self._urgent = False
        self._unsynced_bytes = 0
        self._oldest_unsynced_ms = None
        return covered

    def on_sync_finished(self, now_ms: float) -> None:
        assert self._in_flight
        self._in_flight = False
        if self._unsynced_bytes > 0 and self._oldest_unsynced_ms is None:
            self._oldest_unsynced_ms = now_ms

    def on_discarded(self, size_bytes: int) -> None:
        """Unsynced entries were removed (suffix truncation) without a sync."""
        self._unsynced_bytes = max(0, self._unsynced_bytes - size_bytes)
        if self._unsynced_bytes == 0:
            self._oldest_unsynced_ms = None
            self._urgent = False

    def next_action(self, now_ms: float) -> Action:
        if self._in_flight or self._unsynced_bytes == 0:
            return IDLE
        if self._urgent or self._unsynced_bytes >= self._bytes_max:
            return SYNC_NOW
        assert self._oldest_unsynced_ms is not None
        deadline_ms = self._oldest_unsynced_ms + self._delay_ms_max
        if now_ms >= deadline_ms:
            return SYNC_NOW
        return WaitUntil(deadline_ms)
