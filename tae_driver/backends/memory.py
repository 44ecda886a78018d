"""An in-memory `LogBackend` whose every decision a test can make.

Why: replay and truncation behaviour must be checked against logs that a live writer only
produces by bad luck: records out of DSN order, holes, duplicates, internal entries between
user records, a truncated prefix (reference/matrixone-wal.md §4, §6 item 6). So a test can:

* place an encoded record at a chosen LSN (`put(lsn, payload)`), or a non-user record
  (`put_internal`), and set the truncated LSN (`set_truncated(lsn)`): every replay vector is
  a table;
* hold appends (`hold_appends=True`) and decide, append by append, when each commits
  (`release`: it takes the next LSN *then*, so the release order is the LSN order, like a log
  service assigning LSNs at apply time; or `commit` now and `tell` the appender later, so
  replies can overtake each other), whether it fails (`fail`), or whether a copy lands
  without the appender hearing about it (`commit_copy`: a timed-out try that committed,
  §2.7 Q7). `release` returns only after the appender has resumed, so a test observes the
  driver's reaction without sleeping;
* see every read and truncate call (`reads`, `truncate_calls`).

Appends go after the highest LSN placed or appended (and after the truncated LSN). Reads at or
below the truncated LSN raise `OutOfRange`, as if compaction were immediate, so a driver that
reads below its start point fails loudly. Implements `TailWaiter`.
"""

from __future__ import annotations

import asyncio
import bisect

from tae_driver import limits
from tae_driver.backend import Record, RecordKind
from tae_driver.errors import AlreadyTruncated, BackendClosed, BackendError, OutOfRange
from tae_driver.record import DecodedRecord, decode


class HeldAppend:
    """An append waiting for the test's decision."""

    __slots__ = ("_future", "_resumed", "lsn", "payload")

    def __init__(self, payload: bytes, future: asyncio.Future[int]) -> None:
        self.payload = payload
        self.lsn: int | None = None
        self._future = future
        self._resumed = asyncio.Event()

    def decoded(self) -> DecodedRecord:
        return decode(self.payload)

    @property
    def abandoned(self) -> bool:
        """The appender gave up waiting (its driver was aborted)."""
        return self._future.cancelled()


class MemoryBackend:
    def __init__(self, *, hold_appends: bool = False) -> None:
        self.hold_appends = hold_appends
        self._records: dict[int, Record] = {}
        self._lsns: list[int] = []  # sorted
        self._highest_lsn = 0
        self._truncated_lsn = 0
        self._held: list[HeldAppend] = []
        self._untold: list[HeldAppend] = []
        self._changed = asyncio.Event()
        self._closed = False
        self.reads: list[tuple[int, int]] = []
        self.truncate_calls: list[int] = []
        self.appends_total = 0

    # --- test controls (synchronous) ------------------------------------------------------

    def put(self, lsn: int, payload: bytes, kind: RecordKind = RecordKind.USER) -> None:
        """Place a record at `lsn` (above the truncated LSN, not taken yet)."""
        assert lsn > self._truncated_lsn
        assert lsn not in self._records
        assert len(payload) <= limits.BACKEND_PAYLOAD_BYTES_MAX
        self._store(Record(lsn, bytes(payload), kind))

    def put_internal(self, lsn: int | None = None) -> int:
        """Place a non-user record (a leader no-op, a lease update) at `lsn` or the next LSN."""
        lsn = self._next_lsn() if lsn is None else lsn
        self.put(lsn, b"", RecordKind.INTERNAL)
        return lsn

    def set_truncated(self, lsn: int) -> None:
        """Truncate at `lsn` as if someone else had (monotonic)."""
        assert lsn >= self._truncated_lsn
        self._truncate_to(lsn)

    def records(self) -> list[Record]:
        """Every record above the truncated LSN, in LSN order."""
        return [self._records[lsn] for lsn in self._lsns]

    def user_records(self) -> list[tuple[int, DecodedRecord]]:
        return [(r.lsn, decode(r.payload)) for r in self.records() if r.kind == RecordKind.USER]

    def held(self) -> list[HeldAppend]:
        """Appends waiting for a decision, in arrival order."""
        return list(self._held)

    def commit_copy(self, held: HeldAppend) -> int:
        """A copy of `held`'s payload commits now while the append itself keeps waiting."""
        assert held in self._held
        return self._commit(held.payload)

    # --- test controls (asynchronous) -----------------------------------------------------

    async def wait_held(self, count: int) -> None:
        """Wait until at least `count` appends are held."""
        while len(self._held) < count:
            await self._wait_change()

    async def release(self, held: HeldAppend) -> int:
        """Commit `held` now (it takes the next LSN) and let its appender resume; returns when
        the appender has run up to its next suspension."""
        lsn = self.commit(held)
        await self.tell(held)
        return lsn

    def commit(self, held: HeldAppend) -> int:
        """Commit `held` now (it takes the next LSN) without telling its appender yet: the
        reply is still on its way. Replies of concurrent appends can overtake each other, so
        a driver may learn a higher LSN before a lower one (§2.7 Q3)."""
        assert held in self._held
        self._held.remove(held)
        held.lsn = self._commit(held.payload)
        self._untold.append(held)
        return held.lsn

    def untold(self) -> list[HeldAppend]:
        """Committed appends whose appender has not been told, in commit order."""
        return list(self._untold)

    async def tell(self, held: HeldAppend) -> None:
        """Deliver the reply of a committed append; returns when the appender has run up to
        its next suspension (at once if the appender gave up)."""
        assert held in self._untold
        assert held.lsn is not None
        self._untold.remove(held)
        if not held._future.done():
            held._future.set_result(held.lsn)
            await held._resumed.wait()

    async def fail(self, held: HeldAppend, error: BaseException | None = None) -> None:
        """`held` never reaches the log; its appender gets `error`."""
        assert held in self._held
        self._held.remove(held)
        self._notify()
        if not held._future.done():
            held._future.set_exception(error or BackendError("append failed (injected)"))
            await held._resumed.wait()

    # --- LogBackend -----------------------------------------------------------------------

    async def append(self, payload: bytes) -> int:
        self._check_open()
        assert len(payload) <= limits.BACKEND_PAYLOAD_BYTES_MAX
        self.appends_total += 1
        if not self.hold_appends:
            return self._commit(bytes(payload))
        held = HeldAppend(bytes(payload), asyncio.get_running_loop().create_future())
        self._held.append(held)
        self._notify()
        try:
            return await held._future
        finally:
            held._resumed.set()

    async def read(self, first_lsn: int, max_bytes: int) -> tuple[list[Record], int]:
        self._check_open()
        assert first_lsn >= 1
        assert max_bytes >= 1
        self.reads.append((first_lsn, max_bytes))
        if first_lsn <= self._truncated_lsn:
            raise OutOfRange(first_lsn, self._truncated_lsn, self._latest())
        index = bisect.bisect_left(self._lsns, first_lsn)
        out: list[Record] = []
        size_bytes = 0
        while index < len(self._lsns):
            rec = self._records[self._lsns[index]]
            if out and size_bytes + len(rec.payload) > max_bytes:
                break
            out.append(rec)
            size_bytes += len(rec.payload)
            index += 1
        return out, (out[-1].lsn + 1 if out else first_lsn)

    async def truncate(self, lsn: int) -> None:
        self._check_open()
        self.truncate_calls.append(lsn)
        if lsn <= self._truncated_lsn:
            raise AlreadyTruncated(lsn, self._truncated_lsn)
        if lsn > self._latest():
            raise OutOfRange(lsn, self._truncated_lsn, self._latest())
        self._truncate_to(lsn)

    async def truncated(self) -> int:
        self._check_open()
        return self._truncated_lsn

    async def latest(self) -> int:
        self._check_open()
        return self._latest()

    async def close(self) -> None:
        self._closed = True
        self._notify()

    async def wait_past(self, lsn: int) -> None:
        while not self._closed and self._latest() <= lsn:
            await self._wait_change()

    # --- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed("memory backend is closed")

    def _latest(self) -> int:
        return max(self._highest_lsn, self._truncated_lsn)

    def _next_lsn(self) -> int:
        return self._latest() + 1

    def _commit(self, payload: bytes) -> int:
        lsn = self._next_lsn()
        self._store(Record(lsn, payload))
        return lsn

    def _store(self, rec: Record) -> None:
        self._records[rec.lsn] = rec
        bisect.insort(self._lsns, rec.lsn)
        self._highest_lsn = max(self._highest_lsn, rec.lsn)
        self._notify()

    def _truncate_to(self, lsn: int) -> None:
        self._truncated_lsn = lsn
        cut = bisect.bisect_right(self._lsns, lsn)
        for dropped in self._lsns[:cut]:
            del self._records[dropped]
        del self._lsns[:cut]
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()
