"""The write path's pure core: intake, group commit, the window, in-order completion.

Why (reference/matrixone-wal.md §2.2, §2.3, §4 scenarios 10-12):

* **DSNs are dense and assigned in enqueue order** when entries are packed into a record, so
  one record holds contiguous DSNs [start_dsn, start_dsn + count - 1].
* **Group commit**: whatever is waiting in the intake when the window has room is packed into
  one record, bounded by `record_entries_max` and `record_bytes_max` (MO closes a record at 50
  entries or about 2 MiB). Batching happens at the program's own pace: the fuller the window,
  the more entries wait and the bigger the next record.
* **`safe_dsn` = the committed watermark at dispatch**: every DSN <= it was delivered before the
  record left, hence sits at a smaller backend LSN. Replay depends on this (§2.5).
* **In-order completion**: the backend may finish records in any order; deliveries leave in
  dispatch (= DSN) order, and a window token is put back only on delivery, as MO's
  `onWaitCommitted` does. A delivery that is not contiguous with the watermark is a bug and
  asserts ("logic err" in MO).
* **Truncation horizon** (our fix for §2.7 Q3): each in-flight record remembers the highest
  LSN acknowledged before it was dispatched (`lsn_floor`); its own LSN will be above it. The
  truncation walk may only pass LSNs up to the smallest such floor, so it never steps over a
  record whose LSN the driver has not learned yet.
* **Coverage**: the truncation planner may ask for a record dispatched *now* (its safe DSN
  covers the truncation intent, see truncation.py); with no entries waiting this is an empty
  record, a safe marker.

Events in (`enqueue`, `request_coverage`, `next_dispatch`, `on_returned`, `fail`), actions out
(`Dispatch`, `Delivery`). Tickets are opaque to the core; the asyncio shell uses futures.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from tae_driver import limits, record
from tae_driver.window import Window

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A record to append: hand `payload` to the backend, then call `on_returned(token, lsn)`."""

    token: int
    start_dsn: int
    count: int
    safe_dsn: int
    payload: bytes

    @property
    def end_dsn(self) -> int:
        return self.start_dsn + self.count - 1


@dataclass(frozen=True, slots=True)
class Delivery(Generic[T]):
    """A record whose entries are now complete: ticket i has DSN start_dsn + i."""

    start_dsn: int
    lsn: int
    tickets: tuple[T, ...]


@dataclass(slots=True)
class _InFlight(Generic[T]):
    dispatch: Dispatch
    tickets: tuple[T, ...]
    lsn_floor: int
    lsn: int | None = None


class WritePipeline(Generic[T]):
    def __init__(
        self,
        *,
        last_dsn: int,
        lsn_acked_max: int,
        window_records_max: int,
        record_entries_max: int = limits.RECORD_ENTRIES_MAX,
        record_bytes_max: int = limits.RECORD_BYTES_MAX,
        intake_entries_max: int = limits.INTAKE_ENTRIES_MAX,
    ) -> None:
        assert last_dsn >= 0
        assert lsn_acked_max >= 0
        assert 1 <= record_entries_max <= limits.RECORD_ENTRIES_MAX
        assert limits.RECORD_HEADER_BYTES + 4 < record_bytes_max <= limits.RECORD_BYTES_MAX
        assert 1 <= intake_entries_max <= limits.INTAKE_ENTRIES_MAX
        self._window = Window(window_records_max)
        self._record_entries_max = record_entries_max
        self._record_bytes_max = record_bytes_max
        self._intake_entries_max = intake_entries_max
        self._intake: deque[tuple[bytes, T]] = deque()
        self._in_flight: deque[_InFlight[T]] = deque()
        self._by_token: dict[int, _InFlight[T]] = {}
        self._allocated_dsn = last_dsn
        self._committed_dsn = last_dsn
        self._lsn_acked_max = lsn_acked_max
        self._coverage_requested = False
        self._coverage_token: int | None = None
        self._failed = False

    # --- observations ---------------------------------------------------------------------

    @property
    def entry_bytes_max(self) -> int:
        return self._record_bytes_max - limits.RECORD_HEADER_BYTES - limits.ENTRY_SIZE_PREFIX_BYTES

    @property
    def allocated_dsn(self) -> int:
        """The last DSN given to an entry (0 before any)."""
        return self._allocated_dsn

    @property
    def committed_dsn(self) -> int:
        """Every DSN <= this is delivered (durable and acknowledged in order)."""
        return self._committed_dsn

    @property
    def lsn_acked_max(self) -> int:
        return self._lsn_acked_max

    @property
    def intake_size(self) -> int:
        return len(self._intake)

    def intake_full(self) -> bool:
        return len(self._intake) >= self._intake_entries_max

    @property
    def records_in_flight(self) -> int:
        return len(self._in_flight)

    def window_open(self) -> bool:
        return self._window.is_open()

    def idle(self) -> bool:
        """Nothing waiting and nothing in flight."""
        return not self._intake and not self._in_flight and not self._coverage_requested

    @property
    def coverage_pending(self) -> bool:
        """A coverage record was requested and has not returned yet."""
        return self._coverage_requested or self._coverage_token is not None

    def horizon_lsn(self) -> int | None:
        """The truncation walk must not pass this LSN (None: no limit). See the module doc."""
        floors = [f.lsn_floor for f in self._in_flight if f.lsn is None]
        return min(floors) if floors else None

    # --- events ---------------------------------------------------------------------------

    def enqueue(self, entry: bytes, ticket: T) -> None:
        assert not self._failed
        assert not self.intake_full()
        assert len(entry) <= self.entry_bytes_max
        self._intake.append((entry, ticket))

    def request_coverage(self) -> None:
        """Ask for a record dispatched from now on (possibly empty) to publish the current
        watermark. Idempotent while one is pending."""
        assert not self._failed
        if not self.coverage_pending:
            self._coverage_requested = True

    def next_dispatch(self) -> Dispatch | None:
        """Pack the next record if the window is open and there is something to send."""
        if self._failed or not (self._intake or self._coverage_requested):
            return None
        if not self._window.is_open():
            return None
        entries: list[bytes] = []
        tickets: list[T] = []
        size_bytes = limits.RECORD_HEADER_BYTES
        while self._intake and len(entries) < self._record_entries_max:
            entry, ticket = self._intake[0]
            entry_size = limits.ENTRY_SIZE_PREFIX_BYTES + len(entry)
            if entries and size_bytes + entry_size > self._record_bytes_max:
                break
            self._intake.popleft()
            entries.append(entry)
            tickets.append(ticket)
            size_bytes += entry_size
        token = self._window.take()
        start_dsn = self._allocated_dsn + 1
        self._allocated_dsn += len(entries)
        payload = record.encode_record(start_dsn, self._committed_dsn, entries)
        assert len(payload) == size_bytes
        dispatch = Dispatch(token, start_dsn, len(entries), self._committed_dsn, payload)
        flight = _InFlight(dispatch, tuple(tickets), self._lsn_acked_max)
        self._in_flight.append(flight)
        self._by_token[token] = flight
        if self._coverage_requested:
            self._coverage_requested = False
            self._coverage_token = token
        return dispatch

    def on_returned(self, token: int, lsn: int) -> list[Delivery[T]]:
        """The backend made record `token` durable at `lsn`. Returns what can now be
        delivered, in DSN order (possibly nothing: an earlier record is still out)."""
        flight = self._by_token[token]
        assert flight.lsn is None
        assert lsn > flight.lsn_floor  # the backend assigns LSNs in commit order
        flight.lsn = lsn
        self._lsn_acked_max = max(self._lsn_acked_max, lsn)
        if token == self._coverage_token:
            self._coverage_token = None
        deliveries: list[Delivery[T]] = []
        while self._in_flight and self._in_flight[0].lsn is not None:
            done = self._in_flight.popleft()
            del self._by_token[done.dispatch.token]
            self._window.put_back(done.dispatch.token)
            assert done.dispatch.start_dsn == self._committed_dsn + 1
            self._committed_dsn = done.dispatch.end_dsn
            assert done.lsn is not None
            deliveries.append(Delivery(done.dispatch.start_dsn, done.lsn, done.tickets))
        return deliveries

    def fail(self) -> list[T]:
        """An append failed: stop, and hand back every ticket that will never complete."""
        self._failed = True
        orphans = [t for f in self._in_flight for t in f.tickets]
        orphans.extend(t for _, t in self._intake)
        self._intake.clear()
        self._coverage_requested = False
        return orphans
