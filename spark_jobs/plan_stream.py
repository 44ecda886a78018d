"""replay_as_of's plan of one log (spark_jobs/replay.py, rules 1-3) in one pass over its
records in LSN order, in memory that does not grow with the log (issue 23: the plan held
~270 bytes a record, so one worker passed 1 GB at ~3.7M records).

A pure core: `PlanStream` is shown the records as a reader meets them (a segment's at once
as arrays, or one at a time) and keeps a few numbers: how many records and entry records,
the DSN the next entry record must start at, the highest safe DSN so far, whether the safe
DSNs never fell, the highest TRUNCATE frame, and the LSNs skip records name (at most
`REPLAY_PLAN_SKIPS_HELD_MAX`). `plan` then gives the plan of a clean log with its kept
LSNs as a span (`replay.LsnSet`: the entry records in (truncated LSN, last entry LSN]), or
None for any other log, which the caller plans record by record (`replay.plan_replay`, every
error and message its own).

Clean, here: the records come in rising LSN order; the entry records' DSN ranges run on
without gap or overlap in that order; no record's safe DSN vouches for a DSN above the
checkpoint's that a later record starts (rule 3); no skip record names a live LSN; the first
DSN is allowed (rules 1 and 3). Those conditions are each at least as strict as
`plan_replay_arrays`' clean test, so a plan given is that function's plan
(tests/unit/spark_jobs/test_plan_stream.py, against `plan_replay`).

Truncation (rule 1) is only known at the end (a TRUNCATE frame follows the records it cuts,
tae_driver/backends/file.py), so the records at or below it are shown again, alone, to a
second `PlanStream` (`prefix`: the reader reads them again; the file backend deletes every
segment wholly below the truncated LSN, so they are the head of a segment or two): the
live part is the whole less that prefix. The highest safe DSN of the live part is the last
record's when safe DSNs never fell (a driver's only rise); otherwise a truncated log is
planned record by record.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from spark_jobs.limits import REPLAY_PLAN_SKIPS_HELD_MAX
from spark_jobs.replay import BaseState, LsnSet, ReplayPlan, start_refused


class PlanStream:
    """A log's records in read order, summed up for `plan` (module doc)."""

    __slots__ = (
        "ckp_dsn",
        "contiguous",
        "entry_records",
        "expected_dsn",
        "first_lsn",
        "first_start_dsn",
        "in_lsn_order",
        "last_entry_lsn",
        "last_lsn",
        "last_safe_dsn",
        "records",
        "safe_dsn_max",
        "safe_rising",
        "skip_lsns",
        "skips_overflow",
        "truncated_lsn",
        "vouched",
    )

    def __init__(self, ckp_dsn: int) -> None:
        self.ckp_dsn = ckp_dsn
        self.records = 0
        self.entry_records = 0
        self.first_lsn = -1
        self.last_lsn = -1
        self.last_entry_lsn = 0
        self.in_lsn_order = True
        self.first_start_dsn: int | None = None
        self.expected_dsn: int | None = None  # the DSN after the last entry record's
        self.contiguous = True
        self.safe_dsn_max = -1
        self.last_safe_dsn = -1
        self.safe_rising = True
        self.vouched = False  # an earlier record's safe DSN covers an entry record's start
        self.truncated_lsn = 0
        self.skip_lsns: list[int] = []
        self.skips_overflow = False

    def add_arrays(
        self,
        lsns: npt.NDArray[np.int64],
        start_dsns: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        safe_dsns: npt.NDArray[np.int64],
    ) -> None:
        """Records (entry records and markers: count 0), in read order: a few whole-array
        steps, nothing kept of them."""
        self.records += len(lsns)  # counted in any order: the size of a fallback's plan
        if not len(lsns) or not self.in_lsn_order:
            return
        if int(lsns[0]) <= self.last_lsn or not bool((lsns[1:] > lsns[:-1]).all()):
            self.in_lsn_order = False
            return
        if self.first_lsn < 0:
            self.first_lsn = int(lsns[0])
        self.last_lsn = int(lsns[-1])
        before = np.maximum.accumulate(np.concatenate(([self.safe_dsn_max], safe_dsns[:-1])))
        self.safe_rising = (
            self.safe_rising
            and int(safe_dsns[0]) >= self.last_safe_dsn
            and bool((safe_dsns[1:] >= safe_dsns[:-1]).all())
        )
        held = np.flatnonzero(counts > 0)
        if len(held):
            starts = start_dsns[held]
            ends = starts + counts[held] - 1
            if self.expected_dsn is not None and int(starts[0]) != self.expected_dsn:
                self.contiguous = False
            if not bool((starts[1:] == ends[:-1] + 1).all()):
                self.contiguous = False
            if bool(((before[held] >= starts) & (starts > self.ckp_dsn)).any()):
                self.vouched = True
            if self.first_start_dsn is None:
                self.first_start_dsn = int(starts[0])
            self.expected_dsn = int(ends[-1]) + 1
            self.entry_records += len(held)
            self.last_entry_lsn = int(lsns[held[-1]])
        self.safe_dsn_max = max(self.safe_dsn_max, int(safe_dsns.max()))
        self.last_safe_dsn = int(safe_dsns[-1])

    def add_one(self, lsn: int, start_dsn: int, count: int, safe_dsn: int) -> None:
        """`add_arrays` of one record (a reader passing records one at a time): plain
        Python, the same steps."""
        self.records += 1
        if not self.in_lsn_order:
            return
        if lsn <= self.last_lsn:
            self.in_lsn_order = False
            return
        if self.first_lsn < 0:
            self.first_lsn = lsn
        self.last_lsn = lsn
        self.safe_rising = self.safe_rising and safe_dsn >= self.last_safe_dsn
        if count > 0:
            if self.expected_dsn is not None and start_dsn != self.expected_dsn:
                self.contiguous = False
            if self.safe_dsn_max >= start_dsn > self.ckp_dsn:
                self.vouched = True
            if self.first_start_dsn is None:
                self.first_start_dsn = start_dsn
            self.expected_dsn = start_dsn + count
            self.entry_records += 1
            self.last_entry_lsn = lsn
        self.safe_dsn_max = max(self.safe_dsn_max, safe_dsn)
        self.last_safe_dsn = safe_dsn

    def add_truncate(self, lsn: int) -> None:
        self.truncated_lsn = max(self.truncated_lsn, lsn)

    def add_skips(self, pairs: Iterable[tuple[int, int]]) -> None:
        """A skip record's (start DSN, LSN) pairs: only the LSNs are kept, up to a bound."""
        for _, lsn in pairs:
            if len(self.skip_lsns) >= REPLAY_PLAN_SKIPS_HELD_MAX:
                self.skips_overflow = True
                return
            self.skip_lsns.append(lsn)

    def needs_prefix(self) -> bool:
        """Whether `plan` needs the records at or below the truncated LSN shown again."""
        return self.truncated_lsn > 0 and 0 <= self.first_lsn <= self.truncated_lsn

    def plan(
        self, where: str, base: BaseState, prefix: PlanStream | None = None
    ) -> ReplayPlan | None:
        """The plan of a clean log (module doc), or None; or, for a log that holds no copy
        and no skipped record, the refusal of where it starts (`replay.start_refused`:
        `plan_replay`'s own, so a large log that cannot answer the timestamp is told so
        without being planned record by record). `prefix`: the records at or below the
        truncated LSN alone, in the same order (given when `needs_prefix`)."""
        truncated = self.truncated_lsn
        if not self.in_lsn_order or self.skips_overflow or not self.contiguous:
            return None
        if self.needs_prefix():
            assert prefix is not None
            assert prefix.in_lsn_order
            assert prefix.last_lsn <= truncated
            assert prefix.records <= self.records
            cut_records, cut_entries = prefix.records, prefix.entry_records
            cut_expected = prefix.expected_dsn
        else:  # nothing at or below the truncated LSN
            cut_records, cut_entries, cut_expected = 0, 0, None
        live_records = self.records - cut_records
        live_entries = self.entry_records - cut_entries
        if any(truncated < lsn <= self.last_entry_lsn for lsn in self.skip_lsns):
            return None
        first_dsn: int | None = None
        if live_entries:
            first_dsn = cut_expected if cut_entries else self.first_start_dsn
            assert first_dsn is not None
        # No copies and no skipped record: `plan_replay` would raise nothing before this.
        refused = start_refused(where, first_dsn, truncated, base)
        if refused is not None:
            raise refused
        if self.vouched:
            return None
        needed = base.ckp_dsn + 1
        if cut_records and live_records and not self.safe_rising:
            return None
        plan = ReplayPlan()
        if cut_records:
            plan.truncated_lsns = LsnSet(span_after=0, span_upto=truncated, span_count=cut_records)
            live_safe = self.last_safe_dsn if live_records else 0
        else:
            live_safe = self.safe_dsn_max
        plan.safe_dsn = max(0, live_safe)
        if live_entries:
            assert self.expected_dsn is not None
            plan.kept_lsns = LsnSet(
                span_after=truncated, span_upto=self.last_entry_lsn, span_count=live_entries
            )
        plan.first_dsn = first_dsn or needed
        plan.last_dsn = plan.first_dsn - 1
        if live_entries:
            assert self.expected_dsn is not None
            plan.last_dsn = self.expected_dsn - 1
        return plan
