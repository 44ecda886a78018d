"""Replay's pure core: turn records in LSN order into entries in strict DSN order.

Why (reference/matrixone-wal.md §2.5, §2.7, §4 scenarios 18-29): backend LSN order is not DSN
order, a crash leaves records after the first lost one, truncation by LSN leaves a ragged
prefix, and a retried append can exist twice. The engine must still see a gap-free,
duplicate-free DSN sequence that contains every acknowledged entry.

The proof replay relies on: a record carries `safe_dsn`, and every DSN <= safe_dsn was durable
at a smaller LSN before that record was dispatched. So once replay has read up to some LSN
and seen `safe` (the highest safe DSN so far), a DSN <= safe that has not turned up never
will, except as a duplicate copy.

Rules, applied by `step()` to the next DSN `d = sched + 1` (`sched`: every DSN <= it is
resolved):

1. `d` is held by a pending record: hand the record out (`Apply`); the shell calls the
   engine's handle per entry and reports the decisions (`decided`).
2. `d` missing and `d <= safe`: before the first APPLY decision it is a truncated prefix:
   skip the whole missing run at once (up to `safe` or the next pending record). After an
   APPLY it is a hole in acknowledged data: `ReplayHoleError`.
3. `d` missing and `d > safe`: more records may still bring it (`Wait`) unless the log is
   fully read (`at_end`): then every pending record is trailing and non-continuous (a crash
   mid-window lost `d`): `Finished` lists the (DSN, LSN) of each copy of each, for the
   for-write skip record. Unlike MO (§2.5 "still leading"), a gap above every safe DSN is
   never skipped, even before the first APPLY: the driver's truncation keeps every truncated
   DSN under some surviving safe DSN (truncation.py "Coverage"), so such a gap can only be a
   loss, and the records after it were never acknowledged.

`offer()` takes each record as read (any batch size; the result never depends on it):

* non-user records (`RecordKind.INTERNAL`) are ignored (§4 scenario 6, Q5);
* LSNs must strictly increase (records carry their own LSN, Q1);
* a skip record removes each pending record it names by (DSN, LSN); names it does not find
  are ignored, so a duplicate skip record is harmless (Q7 review);
* a record wholly at or below `sched` is a duplicate copy: ignored, after checking it against
  the recently applied record with the same DSNs (identical checksum) when that is known;
  any partial overlap, or the same DSNs with other bytes, is `ReplayOverlapError` (Q7,
  PR #27552); an identical copy of a pending record is remembered as a copy (its LSN goes in
  the skip record too, so that truncating one copy cannot resurrect the other).

Everything is bounded: pending records (a legal log is less than two windows out of order),
copies per record, and the applied-record checksums kept.

The replayer also records every user record as a `KnownRecord` so that a driver that becomes
writable after replay truncates by the same mapping as before the restart (scenario 29).
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tae_driver import limits
from tae_driver.backend import Record, RecordKind
from tae_driver.errors import (
    CorruptRecord,
    ReplayCorruptionError,
    ReplayHoleError,
    ReplayOverlapError,
    ReplayTooManyPending,
)
from tae_driver.record import EntriesRecord, SkipRecord, decode, payload_checksum
from tae_driver.truncation import KnownRecord, dead_record


class ReplayMode(enum.Enum):
    FOR_WRITE = "for-write"
    """Replay to the end, discard the trailing records durably, then accept appends."""
    FOR_READ = "for-read"
    """Replay to the end and stay read-only."""
    FOREVER = "forever"
    """Tail the log until told to stop (`Driver.stop_tailing`): a standby (§2.5)."""


class ReplayDecision(enum.Enum):
    APPLY = "apply"
    """The engine applied the entry (MO RE_Nomal)."""
    TRUNCATED = "truncated"
    """The entry is covered by the engine's checkpoint (MO RE_Truncate)."""
    INTERNAL = "internal"
    """The entry is not user data for the engine (MO RE_Internal)."""


@dataclass(frozen=True, slots=True)
class Apply:
    lsn: int
    start_dsn: int
    entries: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing more can be resolved until more records are read."""


@dataclass(frozen=True, slots=True)
class Finished:
    skip_pairs: tuple[tuple[int, int], ...]
    """(start DSN, LSN) of every copy of every trailing record, sorted."""
    trailing_records: int


Step = Apply | Wait | Finished
WAIT = Wait()


@dataclass(slots=True)
class _Pending:
    lsn: int
    start_dsn: int
    end_dsn: int
    safe_dsn: int
    entries: tuple[bytes, ...]
    payload: bytes
    copies: list[int]


class Replayer:
    def __init__(
        self,
        *,
        truncated_lsn: int,
        resolved_dsn: int = 0,
        resolved_applied: bool = False,
        pending_records_max: int = limits.REPLAY_PENDING_RECORDS_MAX,
        copies_max: int = limits.RECORD_COPIES_MAX,
        digests_kept: int = limits.REPLAY_DIGESTS_KEPT,
    ) -> None:
        assert truncated_lsn >= 0
        assert resolved_dsn >= 0
        assert resolved_dsn > 0 or not resolved_applied
        assert pending_records_max >= 1
        assert copies_max >= 1
        assert digests_kept >= 1
        self._pending_records_max = pending_records_max
        self._copies_max = copies_max
        self._digests_kept = digests_kept
        self._last_lsn = truncated_lsn
        # A reader resuming where an earlier replay stood with nothing pending (a change
        # stream's micro-batch boundary, spark_jobs/stream_changes.py): every DSN <=
        # `resolved_dsn` was resolved by the records <= `truncated_lsn`; `resolved_applied`
        # says one was applied, so a missing DSN under a safe one is a hole, not a prefix.
        self._safe_dsn = resolved_dsn
        self._sched_dsn = resolved_dsn
        self._applied_any = resolved_applied
        self._clean = not resolved_applied
        self._clean_prefix_dsn = 0
        self._skipped_dsn_max = 0
        self._pending: dict[int, _Pending] = {}
        self._starts: list[int] = []  # sorted starts of pending records
        self._recent: list[tuple[int, int, int]] = []  # (start, end, checksum) applied, sorted
        self._current: _Pending | None = None
        self._finished = False
        self._known: dict[int, KnownRecord] = {}
        self.records_read = 0
        self.duplicates_ignored = 0
        self.entries_handled = 0
        self.entries_applied = 0
        self.dsns_skipped = 0

    # --- results --------------------------------------------------------------------------

    @property
    def last_dsn(self) -> int:
        """Every DSN <= this is resolved; a writer continues at last_dsn + 1."""
        return self._sched_dsn

    @property
    def safe_dsn(self) -> int:
        return self._safe_dsn

    @property
    def last_lsn(self) -> int:
        """The highest LSN offered (or the truncated LSN if none)."""
        return self._last_lsn

    @property
    def applied_any(self) -> bool:
        return self._applied_any

    @property
    def clean_prefix_dsn(self) -> int:
        """Every DSN <= this was a skipped gap or answered TRUNCATED: the engine's checkpoint
        covers it, so a writer may truncate up to it (MO's truncateDSNIntent after replay)."""
        return self._clean_prefix_dsn

    @property
    def skipped_dsn_max(self) -> int:
        """The highest DSN skipped as a truncated prefix (0 if none): gone from the log."""
        return self._skipped_dsn_max

    @property
    def pending_records(self) -> int:
        return len(self._pending)

    def known_records(self) -> list[KnownRecord]:
        return list(self._known.values())  # inserted in LSN order

    # --- events ---------------------------------------------------------------------------

    def offer(self, rec: Record) -> None:
        """Take the next record read from the backend (strictly increasing LSNs)."""
        assert not self._finished
        if rec.lsn <= self._last_lsn:
            # The shell never asks twice for an LSN (it resumes at max(next, last + 1), which
            # also absorbs a backend that re-sends its last batch, §2.7 Q2), so a repeat here
            # is a backend handing out LSNs out of order.
            raise ReplayCorruptionError(rec.lsn, f"LSN not above the previous {self._last_lsn}")
        self._last_lsn = rec.lsn
        if rec.kind != RecordKind.USER:
            return
        self.records_read += 1
        try:
            decoded = decode(rec.payload)
        except CorruptRecord as exc:
            raise ReplayCorruptionError(rec.lsn, f"undecodable record: {exc}") from exc
        if isinstance(decoded, SkipRecord):
            self._offer_skip(rec.lsn, decoded)
        else:
            self._offer_entries(rec.lsn, rec.payload, decoded)

    def note_skip_written(self, lsn: int) -> None:
        """The driver appended its own skip record at `lsn` (after everything read)."""
        assert lsn > self._last_lsn
        self._last_lsn = lsn
        self._known[lsn] = dead_record(lsn)

    def note_truncated(self, lsn: int) -> None:
        """The backend's truncated LSN advanced (a tailing reader learns it as it polls)."""
        # `_known` is keyed in insertion order, which is LSN order (offers strictly increase,
        # and the driver's skip record comes after everything read): prune from the front.
        for known_lsn in list(itertools.takewhile(lambda k: k <= lsn, self._known)):
            del self._known[known_lsn]

    def step(self, *, at_end: bool) -> Step:
        """Resolve DSN sched+1. `at_end`: the whole log has been read and no more will come."""
        assert self._current is None, "decided() must follow every Apply"
        assert not self._finished
        while True:
            dsn = self._sched_dsn + 1
            found = self._pending.get(dsn)
            if found is not None:
                self._remove_pending(found)
                self._current = found
                return Apply(found.lsn, found.start_dsn, found.entries)
            if dsn <= self._safe_dsn:
                if self._applied_any:
                    raise ReplayHoleError(dsn, self._safe_dsn)
                upto = self._safe_dsn
                if self._starts:
                    upto = min(upto, self._starts[0] - 1)
                assert upto >= dsn
                self.dsns_skipped += upto - dsn + 1
                self._skipped_dsn_max = upto
                self._sched_dsn = upto
                if self._clean:
                    self._clean_prefix_dsn = upto
                continue
            if not at_end:
                return WAIT
            return self._finish()

    def decided(self, decisions: Sequence[ReplayDecision]) -> None:
        """The engine's answers for the entries of the last `Apply`, in order."""
        current = self._current
        assert current is not None
        assert len(decisions) == len(current.entries)
        for index, decision in enumerate(decisions):
            if decision is ReplayDecision.APPLY:
                self._applied_any = True
                self._clean = False
                self.entries_applied += 1
            elif decision is ReplayDecision.TRUNCATED:
                if self._clean:
                    self._clean_prefix_dsn = current.start_dsn + index
            else:
                assert decision is ReplayDecision.INTERNAL, decision
                self._clean = False
        self.entries_handled += len(decisions)
        assert current.start_dsn == self._sched_dsn + 1
        self._sched_dsn = current.end_dsn
        self._recent.append((current.start_dsn, current.end_dsn, payload_checksum(current.payload)))
        if len(self._recent) > 2 * self._digests_kept:
            del self._recent[: self._digests_kept]
        self._current = None

    # --- internals ------------------------------------------------------------------------

    def _offer_skip(self, lsn: int, skip: SkipRecord) -> None:
        self._known[lsn] = dead_record(lsn)
        for dsn, stale_lsn in skip.pairs:
            pending = self._pending.get(dsn)
            if pending is None:
                continue  # already discarded, truncated away, or a duplicate skip record
            if stale_lsn != pending.lsn and stale_lsn not in pending.copies:
                continue  # a different record with this DSN (a new writer's): keep it
            self._remove_pending(pending)
            for copy_lsn in (pending.lsn, *pending.copies):
                if copy_lsn in self._known:
                    self._known[copy_lsn] = dead_record(copy_lsn, self._known[copy_lsn].safe_dsn)

    def _offer_entries(self, lsn: int, payload: bytes, rec: EntriesRecord) -> None:
        self._safe_dsn = max(self._safe_dsn, rec.safe_dsn)
        if rec.count == 0:
            self._known[lsn] = dead_record(lsn, rec.safe_dsn)
            return
        start, end = rec.start_dsn, rec.end_dsn
        self._known[lsn] = KnownRecord(lsn, start, end, rec.safe_dsn)
        if end <= self._sched_dsn:
            self._check_resolved_copy(lsn, start, end, payload)
            self.duplicates_ignored += 1
            return
        if start <= self._sched_dsn:
            raise ReplayOverlapError(
                lsn, start, end, f"overlaps resolved DSNs <= {self._sched_dsn}"
            )
        twin = self._pending_overlapping(start, end)
        if twin is not None:
            if (twin.start_dsn, twin.end_dsn) != (start, end) or twin.payload != payload:
                raise ReplayOverlapError(
                    lsn, start, end, f"overlaps the record at LSN {twin.lsn} differently"
                )
            if 2 + len(twin.copies) > self._copies_max:
                raise ReplayCorruptionError(lsn, f"more than {self._copies_max} copies")
            twin.copies.append(lsn)
            self.duplicates_ignored += 1
            return
        if len(self._pending) >= self._pending_records_max:
            raise ReplayTooManyPending(lsn, self._pending_records_max)
        pending = _Pending(lsn, start, end, rec.safe_dsn, rec.entries, payload, [])
        self._pending[start] = pending
        bisect.insort(self._starts, start)

    def _check_resolved_copy(self, lsn: int, start: int, end: int, payload: bytes) -> None:
        """A record wholly at or below sched: it must be an identical copy of what was applied
        there, when that is still known; otherwise it is a copy of something truncated."""
        checksum = payload_checksum(payload)
        for known_start, known_end, known_checksum in self._recent_overlapping(start, end):
            if (known_start, known_end, known_checksum) != (start, end, checksum):
                raise ReplayOverlapError(
                    lsn, start, end, f"differs from applied DSNs [{known_start}, {known_end}]"
                )

    def _recent_overlapping(self, start: int, end: int) -> list[tuple[int, int, int]]:
        recent = self._recent
        first = bisect.bisect_right(recent, start, key=lambda r: r[0]) - 1
        first = max(first, 0)
        out: list[tuple[int, int, int]] = []
        for item in recent[first:]:
            if item[0] > end:
                break
            if item[1] >= start:
                out.append(item)
        return out

    def _pending_overlapping(self, start: int, end: int) -> _Pending | None:
        index = bisect.bisect_right(self._starts, end) - 1
        if index < 0:
            return None
        candidate = self._pending[self._starts[index]]
        return candidate if candidate.end_dsn >= start else None

    def _remove_pending(self, pending: _Pending) -> None:
        del self._pending[pending.start_dsn]
        index = bisect.bisect_left(self._starts, pending.start_dsn)
        assert self._starts[index] == pending.start_dsn
        del self._starts[index]

    def _finish(self) -> Finished:
        pairs: list[tuple[int, int]] = []
        trailing = list(self._pending.values())
        for pending in trailing:
            for copy_lsn in (pending.lsn, *pending.copies):
                pairs.append((pending.start_dsn, copy_lsn))
                self._known[copy_lsn] = dead_record(copy_lsn, self._known[copy_lsn].safe_dsn)
        self._pending.clear()
        self._starts.clear()
        self._finished = True
        if self._clean:
            # Nothing but skipped gaps and TRUNCATED answers: all of it is checkpointed.
            self._clean_prefix_dsn = self._sched_dsn
        return Finished(tuple(sorted(pairs)), len(trailing))
