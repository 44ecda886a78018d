"""Truncation's pure core: map a DSN intent to the backend LSN to truncate at.

Why (reference/matrixone-wal.md §2.4, §4 scenarios 14-15, §2.7 Q3):

* The engine truncates in DSNs ("every entry up to this DSN is checkpointed"); the backend
  truncates in LSNs, and LSN order is not DSN order. The walk picks the largest LSN such that
  every record at or below it holds only DSNs <= intent: walk known records in LSN order, stop
  at the first that holds a DSN above the intent, answer the last one passed. Records that
  hold no live DSN (safe markers, skip records, stale copies that a skip record discarded)
  never stop the walk; LSNs the driver does not know (internal entries of the log) are
  passed over. With `{11:[1,5], 12:[8,10], 13:[6,7], 14:[11,12], 17:[13,13]}` and truncated
  LSN 10: intent 4 -> none, 5 -> 11, 7 -> 11, 10 -> 13, 12 -> 14, 13 -> 17 (the §2.4 table).
  So DSNs <= intent may survive (6-7 at LSN 13 above); replay hands them to the engine, which
  answers TRUNCATED.
* **Horizon** (§2.7 Q3, our fix): an LSN the driver has not learned yet may belong to one of
  its own in-flight records. The walk never passes `horizon_lsn` (pipeline.py computes it).
* **Coverage** (our addition, not MO's): replay tells a truncated prefix from a lost tail
  only through safe DSNs (§2.5). So the driver keeps this invariant: every DSN it has ever
  truncated is <= the safe DSN of some surviving record. Truncating at L is allowed only if a
  known record above L carries `safe_dsn >= max(truncated_dsn_max, last DSN of the live
  records in (truncated, L])`. The plan takes the highest walk position that is covered;
  when none is and the range holds live DSNs, it says `NeedCoverage` and the shell asks the
  pipeline for a record dispatched now (an empty safe marker if nothing else waits), whose
  safe DSN is the committed watermark, which is >= the intent. A range of records with no
  live DSN (markers, skip records, stale copies) never asks for coverage: freeing it is not
  worth a write, and it goes with the next live record. MO instead skips *any* leading gap
  before the first applied entry (`still leading` in §2.5), which also skips entries lost in
  flight and relies on the engine's group-LSN check.

Pure: records in, a plan out. The shell calls `backend.truncate(plan.lsn)`; an
`AlreadyTruncated` answer at or above it counts as success (scenario 15); then
`on_truncated(lsn)` forgets the records below. A read-only driver never calls it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KnownRecord:
    """A durable record the driver knows: its LSN, DSNs [start_dsn, end_dsn] (empty when
    end_dsn < start_dsn: it holds no live DSN) and the safe DSN it carries."""

    lsn: int
    start_dsn: int
    end_dsn: int
    safe_dsn: int

    @property
    def holds_dsns(self) -> bool:
        return self.end_dsn >= self.start_dsn


def dead_record(lsn: int, safe_dsn: int = 0) -> KnownRecord:
    """A record holding no live DSN (skip record, discarded stale copy, safe marker)."""
    return KnownRecord(lsn, 1, 0, safe_dsn)


@dataclass(frozen=True, slots=True)
class TruncateAt:
    lsn: int


@dataclass(frozen=True, slots=True)
class NeedCoverage:
    """Truncating up to `lsn` needs a durable record above it with safe DSN >= `safe_dsn_min`."""

    lsn: int
    safe_dsn_min: int


TruncationPlan = TruncateAt | NeedCoverage


class TruncationPlanner:
    def __init__(
        self,
        truncated_lsn: int,
        records: Iterable[KnownRecord] = (),
        *,
        truncated_dsn_max: int = 0,
    ) -> None:
        """`truncated_dsn_max`: the highest DSN already gone from the log (replay knows it as
        the end of the leading gap it skipped)."""
        assert truncated_lsn >= 0
        assert truncated_dsn_max >= 0
        self._truncated_lsn = truncated_lsn
        self._truncated_dsn_max = truncated_dsn_max
        self._by_lsn: dict[int, KnownRecord] = {}
        self._lsns: list[int] = []  # sorted
        for known in records:
            self.note(known)

    @property
    def truncated_lsn(self) -> int:
        return self._truncated_lsn

    @property
    def truncated_dsn_max(self) -> int:
        return self._truncated_dsn_max

    def records(self) -> list[KnownRecord]:
        """Known records above the truncation point, in LSN order (for tests and status)."""
        return [self._by_lsn[lsn] for lsn in self._lsns]

    def note(self, known: KnownRecord) -> None:
        """Record `known` as durable. A record at or below the truncation point is ignored."""
        if known.lsn <= self._truncated_lsn:
            return
        if known.lsn not in self._by_lsn:
            bisect.insort(self._lsns, known.lsn)
        self._by_lsn[known.lsn] = known

    def on_truncated(self, lsn: int) -> None:
        """The backend's truncated LSN is now `lsn` (never moves back)."""
        if lsn <= self._truncated_lsn:
            return
        self._truncated_lsn = lsn
        cut = bisect.bisect_right(self._lsns, lsn)
        for dropped in self._lsns[:cut]:
            known = self._by_lsn.pop(dropped)
            if known.holds_dsns:
                self._truncated_dsn_max = max(self._truncated_dsn_max, known.end_dsn)
        del self._lsns[:cut]

    def walk(self, intent_dsn: int, horizon_lsn: int | None = None) -> int | None:
        """§2.4: the largest known LSN such that every known record at or below it holds
        only DSNs <= intent_dsn, not beyond `horizon_lsn`; None if that is no progress."""
        passable = self._passable(intent_dsn, horizon_lsn)
        return self._lsns[passable - 1] if passable else None

    def plan(self, intent_dsn: int, horizon_lsn: int | None = None) -> TruncationPlan | None:
        """What to do for `intent_dsn` (already capped at the committed watermark)."""
        passable = self._passable(intent_dsn, horizon_lsn)
        if not passable:
            return None
        records = [self._by_lsn[lsn] for lsn in self._lsns[:passable]]
        beyond = (self._by_lsn[lsn].safe_dsn for lsn in self._lsns[passable:])
        # safe_above[i]: the highest safe DSN carried by a known record after position i.
        safe_above = [0] * passable
        running = max(beyond, default=0)
        for i in range(passable - 1, -1, -1):
            safe_above[i] = running
            running = max(running, records[i].safe_dsn)
        needed = self._truncated_dsn_max
        best: int | None = None
        live_in_range = False
        for i in range(passable):
            if records[i].holds_dsns:
                needed = max(needed, records[i].end_dsn)
                live_in_range = True
            if safe_above[i] >= needed:
                best = i
        if best is not None:
            return TruncateAt(records[best].lsn)
        if not live_in_range:
            return None
        return NeedCoverage(records[passable - 1].lsn, needed)

    def _passable(self, intent_dsn: int, horizon_lsn: int | None) -> int:
        """How many leading known records the walk may pass."""
        count = 0
        for lsn in self._lsns:
            if horizon_lsn is not None and lsn > horizon_lsn:
                break
            known = self._by_lsn[lsn]
            if known.holds_dsns and known.end_dsn > intent_dsn:
                break
            count += 1
        return count
