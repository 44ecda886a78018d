"""replay_as_of's plan of one log (spark_jobs/replay.py, rules 1-3) in one pass over its
records in LSN order, in memory that does not grow with the log (issue 23: the plan held
~270 bytes a record, so one worker passed 1 GB at ~3.7M records).

A pure core: `PlanStream` is shown the records as a reader meets them (a segment's at once
as arrays, or one at a time) and keeps a few numbers: how many records and entry records,
the DSN the next entry record must start at, the highest safe DSN so far, whether the safe
DSNs never fell, the highest TRUNCATE frame, the (start DSN, LSN) pairs skip records name
(at most `REPLAY_PLAN_SKIPS_HELD_MAX`), a window of the most recent entry records that began
a DSN range (`REPLAY_PLAN_WINDOW_RECORDS`) and the copies met (at most
`REPLAY_PLAN_COPIES_HELD_MAX`). `plan` then gives the plan of a log of the shapes below,
its kept LSNs a span (`replay.LsnSet`: the entry records in (truncated LSN, last entry LSN]
less the copies not replayed), or None for any other log, which the caller plans record by
record (`replay.plan_replay`, every error and message its own).

The shapes planned: the records come in rising LSN order; each entry record either begins
a DSN range where the one before ended (no gap, no overlap: an "original"), or is a copy:
its DSNs lie wholly below the next DSN and are exactly those of an original among the
window's (what a driver writes after a crash, re-appending a record that was in flight:
tae_driver/replay.py). A copy with the original's bytes (record checksum) is a duplicate,
not replayed (rule 2: the lowest LSN is); one with other bytes must be named by a skip
record, or its original must be. A skip record may name a copy, or an original that has a
copy left (the lowest-LSN copy left is replayed, and the others must have its bytes),
nothing else in the live part; no record's safe DSN vouches for a DSN above the
checkpoint's that a later original starts, or that a copy replayed in place of a skipped
original starts (rule 3); the first DSN is allowed (rules 1 and 3). Each condition is at
least as strict as `plan_replay`'s rules, so a plan given is that function's plan
(tests/unit/spark_jobs/test_plan_stream.py, against `plan_replay`).
And when every copy has its original's bytes (`differing_copies` is 0), each DSN range is
replayed from a record with the bytes of the first record holding it: a reader replaying
the first copy of each DSN it meets replays the plan (spark_jobs/local_replay.py's one
read).

Truncation (rule 1) is only known at the end (a TRUNCATE frame follows the records it cuts,
tae_driver/backends/file.py), so the records at or below it are shown again, alone, to a
second `PlanStream` (`prefix`: the reader reads them again; the file backend deletes every
segment wholly below the truncated LSN, so they are the head of a segment or two): the
live part is the whole less that prefix. The highest safe DSN of the live part is the last
original's or marker's when their safe DSNs never fell (a driver's only rise), or a live
copy's; a copy whose original was cut is not planned here (the copy would be the first live
one, replayed); otherwise a truncated log is planned record by record.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from spark_jobs import limits
from spark_jobs.limits import REPLAY_PLAN_SKIPS_HELD_MAX
from spark_jobs.replay import BaseState, LsnSet, ReplayPlan, start_refused

ONE_AT_A_TIME_BATCH = 4096
"""Records given one at a time (`add_one`) held before they are added as arrays: the steps
are written once, and a window update copies the window once per batch, not per record."""


class _Copy(NamedTuple):
    """An entry record whose DSNs are exactly an earlier original's (module doc)."""

    lsn: int
    start_dsn: int
    original_lsn: int
    same_bytes: bool  # the original's record checksum
    checksum: int
    safe_dsn: int
    safe_before: int  # the highest safe DSN of the records before it


def _i64(values: Iterable[int]) -> npt.NDArray[np.int64]:
    return np.fromiter(values, dtype=np.int64)


_EMPTY = np.zeros(0, dtype=np.int64)


class PlanStream:
    """A log's records in read order, summed up for `plan` (module doc)."""

    __slots__ = (
        "_one_at_a_time",
        "ckp_dsn",
        "contiguous",
        "copies",
        "differing_copies",
        "entry_records",
        "expected_dsn",
        "first_lsn",
        "first_start_dsn",
        "in_lsn_order",
        "last_entry_lsn",
        "last_lsn",
        "plain_safe_last",
        "plain_safe_rising",
        "records",
        "safe_dsn_max",
        "skip_pairs",
        "skips_overflow",
        "truncated_lsn",
        "unmatched",
        "vouched",
        "window",
    )

    def __init__(self, ckp_dsn: int) -> None:
        self.ckp_dsn = ckp_dsn
        self.records = 0
        self.entry_records = 0  # originals: records that began a DSN range
        self.first_lsn = -1
        self.last_lsn = -1
        self.last_entry_lsn = 0  # originals and copies
        self.in_lsn_order = True
        self.first_start_dsn: int | None = None
        self.expected_dsn: int | None = None  # the DSN after the highest held so far
        self.contiguous = True
        self.safe_dsn_max = -1
        self.plain_safe_last = -1  # the last safe DSN of a record that is not a copy
        self.plain_safe_rising = True  # ... and whether those never fell
        self.vouched = False  # an earlier record's safe DSN covers an original's start
        self.truncated_lsn = 0
        self.skip_pairs: list[tuple[int, int]] = []
        self.skips_overflow = False
        # The last originals (at most REPLAY_PLAN_WINDOW_RECORDS): start DSN, count,
        # checksum, LSN, ordinal (how many originals came before it).
        self.window: tuple[npt.NDArray[np.int64], ...] = (_EMPTY,) * 5
        self.copies: list[_Copy] = []
        self.differing_copies = 0
        self.unmatched = False  # an overlap, or a copy the window cannot match, or too many
        self._one_at_a_time: list[tuple[int, int, int, int, int]] = []

    def add_arrays(
        self,
        lsns: npt.NDArray[np.int64],
        start_dsns: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        safe_dsns: npt.NDArray[np.int64],
        checksums: npt.NDArray[np.int64],
    ) -> None:
        """Records (entry records and markers: count 0), in read order: a few whole-array
        steps, nothing kept of them but the window's."""
        self.flush()
        self._add(lsns, start_dsns, counts, safe_dsns, checksums)

    def add_one(self, lsn: int, start_dsn: int, count: int, safe_dsn: int, checksum: int) -> None:
        """`add_arrays` of one record (a reader passing records one at a time), held until
        ONE_AT_A_TIME_BATCH of them are added at once."""
        self._one_at_a_time.append((lsn, start_dsn, count, safe_dsn, checksum))
        if len(self._one_at_a_time) >= ONE_AT_A_TIME_BATCH:
            self.flush()

    def flush(self) -> None:
        """Add the records `add_one` holds (every method that reads the sums does)."""
        held = self._one_at_a_time
        if held:
            self._one_at_a_time = []
            columns = np.array(held, dtype=np.int64).reshape(-1, 5).T
            self._add(columns[0], columns[1], columns[2], columns[3], columns[4])

    def _add(
        self,
        lsns: npt.NDArray[np.int64],
        start_dsns: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        safe_dsns: npt.NDArray[np.int64],
        checksums: npt.NDArray[np.int64],
    ) -> None:
        self.records += len(lsns)  # counted in any order: the size of a fallback's plan
        if not len(lsns) or not self.in_lsn_order:
            return
        if int(lsns[0]) <= self.last_lsn or not bool((lsns[1:] > lsns[:-1]).all()):
            self.in_lsn_order = False
            return
        if self.first_lsn < 0:
            self.first_lsn = int(lsns[0])
        self.last_lsn = int(lsns[-1])
        # Each record's highest safe DSN of the records before it: the vouching of rule 3.
        before = np.maximum.accumulate(np.concatenate(([self.safe_dsn_max], safe_dsns[:-1])))
        plain_safes = safe_dsns  # of the records that are not copies
        held = np.flatnonzero(counts > 0)
        if len(held):
            copy_at = self._add_entry_records(
                held, lsns, start_dsns, counts, safe_dsns, before, checksums
            )
            if len(copy_at):
                plain = np.ones(len(lsns), dtype=np.bool_)
                plain[copy_at] = False
                plain_safes = safe_dsns[plain]
        if len(plain_safes):
            self.plain_safe_rising = (
                self.plain_safe_rising
                and int(plain_safes[0]) >= self.plain_safe_last
                and bool((plain_safes[1:] >= plain_safes[:-1]).all())
            )
            self.plain_safe_last = int(plain_safes[-1])
        self.safe_dsn_max = max(self.safe_dsn_max, int(safe_dsns.max()))

    def _add_entry_records(
        self,
        held: npt.NDArray[np.intp],
        lsns: npt.NDArray[np.int64],
        start_dsns: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        safe_dsns: npt.NDArray[np.int64],
        before: npt.NDArray[np.int64],
        checksums: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.intp]:
        """The entry records `held` (positions) classified as originals and copies (module
        doc); returns the copies' positions."""
        starts = start_dsns[held]
        ends = starts + counts[held] - 1
        reach_first = int(starts[0]) - 1 if self.expected_dsn is None else self.expected_dsn - 1
        # The highest DSN held before each record, and after the last.
        reach = np.maximum.accumulate(np.concatenate(([reach_first], ends)))
        reached = reach[:-1]
        is_new = starts > reached
        is_copy = ends <= reached
        if not bool((is_new | is_copy).all()):
            self.unmatched = True  # part of a range held again: plan_replay's overlap
        new_at = held[is_new]
        new_starts = starts[is_new]
        if not bool((new_starts == reached[is_new] + 1).all()):
            self.contiguous = False
        if bool(((before[new_at] >= new_starts) & (new_starts > self.ckp_dsn)).any()):
            self.vouched = True
        if self.first_start_dsn is None:
            self.first_start_dsn = int(starts[0])
        self.expected_dsn = int(reach[-1]) + 1
        self.last_entry_lsn = int(lsns[held[-1]])
        copy_at = held[is_copy]
        if len(copy_at):  # rare: the window and this batch's originals, together
            ordinals = self.entry_records + np.arange(len(new_at), dtype=np.int64)
            new = (new_starts, counts[new_at], checksums[new_at], lsns[new_at], ordinals)
            candidates = tuple(
                np.concatenate((old, now)) for old, now in zip(self.window, new, strict=True)
            )
            # How many originals came before each copy: its window is the last of those.
            originals_before = self.entry_records + np.cumsum(is_new)[is_copy]
            self._add_copies(
                copy_at,
                (lsns, start_dsns, counts, safe_dsns, before, checksums),
                originals_before,
                candidates,
            )
        self._remember(new_at, new_starts, lsns, counts, checksums)
        return copy_at

    def _remember(
        self,
        new_at: npt.NDArray[np.intp],
        new_starts: npt.NDArray[np.int64],
        lsns: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        checksums: npt.NDArray[np.int64],
    ) -> None:
        """The window: the last REPLAY_PLAN_WINDOW_RECORDS originals, these (at `new_at`)
        the newest; only as many of these as fit are copied."""
        window_max = limits.REPLAY_PLAN_WINDOW_RECORDS
        taken_at = new_at[max(0, len(new_at) - window_max) :]
        first = self.entry_records + len(new_at) - len(taken_at)
        taken = (
            new_starts[len(new_at) - len(taken_at) :],
            counts[taken_at],
            checksums[taken_at],
            lsns[taken_at],
            first + np.arange(len(taken_at), dtype=np.int64),
        )
        old_from = max(0, len(self.window[0]) - (window_max - len(taken_at)))
        self.window = tuple(
            np.concatenate((old[old_from:], now))
            for old, now in zip(self.window, taken, strict=True)
        )
        self.entry_records += len(new_at)

    def _add_copies(
        self,
        copy_at: npt.NDArray[np.intp],
        columns: tuple[npt.NDArray[np.int64], ...],
        originals_before: npt.NDArray[np.int64],
        candidates: tuple[npt.NDArray[np.int64], ...],
    ) -> None:
        """Each copy (at `copy_at` in `columns`: LSN, start DSN, count, safe DSN, the highest
        safe DSN before it, checksum) matched with its original among the window's and this
        batch's (by start DSN: originals begin rising DSN ranges), or `unmatched`."""
        lsns, start_dsns, counts, safe_dsns, before, checksums = columns
        if self.unmatched or not self.contiguous:
            return  # no plan is given: the copies need not be matched
        starts, found_counts, found_checksums, found_lsns, found_ordinals = candidates
        copy_starts = start_dsns[copy_at]
        if not len(starts):
            self.unmatched = True
            return
        at = np.minimum(np.searchsorted(starts, copy_starts), len(starts) - 1)
        matched = (
            (starts[at] == copy_starts)
            & (found_counts[at] == counts[copy_at])
            & (found_ordinals[at] < originals_before)
            & (originals_before - found_ordinals[at] <= limits.REPLAY_PLAN_WINDOW_RECORDS)
        )
        if not bool(matched.all()):
            self.unmatched = True  # older than the window, or other DSNs than a range's
            return
        if len(self.copies) + len(copy_at) > limits.REPLAY_PLAN_COPIES_HELD_MAX:
            self.unmatched = True
            return
        same = found_checksums[at] == checksums[copy_at]
        self.differing_copies += int((~same).sum())
        self.copies.extend(
            _Copy(*fields)
            for fields in zip(
                lsns[copy_at].tolist(),
                copy_starts.tolist(),
                found_lsns[at].tolist(),
                same.tolist(),
                checksums[copy_at].tolist(),
                safe_dsns[copy_at].tolist(),
                before[copy_at].tolist(),
                strict=True,
            )
        )

    def add_truncate(self, lsn: int) -> None:
        self.truncated_lsn = max(self.truncated_lsn, lsn)

    def add_skips(self, pairs: Iterable[tuple[int, int]]) -> None:
        """A skip record's (start DSN, LSN) pairs, up to a bound."""
        for start_dsn, lsn in pairs:
            if len(self.skip_pairs) >= REPLAY_PLAN_SKIPS_HELD_MAX:
                self.skips_overflow = True
                return
            self.skip_pairs.append((start_dsn, lsn))

    def cannot_plan(self) -> bool:
        """Whether `plan` is already known to give None (a reader may stop early)."""
        self.flush()
        return not self.in_lsn_order or not self.contiguous or self.unmatched or self.skips_overflow

    def needs_prefix(self) -> bool:
        """Whether `plan` needs the records at or below the truncated LSN shown again."""
        self.flush()
        return self.truncated_lsn > 0 and 0 <= self.first_lsn <= self.truncated_lsn

    def state(self) -> dict[str, object]:
        """Everything summed up so far, as plain values (to compare two streams)."""
        self.flush()
        found: dict[str, object] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if name == "window":
                value = [column.tolist() for column in value]
            found[name] = value
        return found

    def plan(
        self, where: str, base: BaseState, prefix: PlanStream | None = None
    ) -> ReplayPlan | None:
        """The plan of a log of the module doc's shapes, or None; or, for such a log, the
        refusal of where it starts (`replay.start_refused`: `plan_replay`'s own, so a large
        log that cannot answer the timestamp is told so without being planned record by
        record). `prefix`: the records at or below the truncated LSN alone, in the same order
        (given when `needs_prefix`)."""
        self.flush()
        truncated = self.truncated_lsn
        if not self.in_lsn_order or self.skips_overflow or not self.contiguous:
            return None
        if self.unmatched:
            return None
        if self.needs_prefix():
            assert prefix is not None
            prefix.flush()
            assert prefix.in_lsn_order
            assert prefix.last_lsn <= truncated
            assert prefix.records <= self.records
            cut_records, cut_entries = prefix.records, prefix.entry_records
            cut_expected = prefix.expected_dsn
        else:  # nothing at or below the truncated LSN
            cut_records, cut_entries, cut_expected = 0, 0, None
        live_records = self.records - cut_records
        live_entries = self.entry_records - cut_entries
        live_copies = [c for c in self.copies if c.lsn > truncated]
        if any(c.original_lsn <= truncated for c in live_copies):
            return None  # its first live copy is replayed: not this stream's shape
        resolved = self._resolve_copies(live_copies, base)
        if resolved is None:
            return None
        excluded, duplicate, skipped = resolved
        first_dsn: int | None = None
        if live_entries:
            first_dsn = cut_expected if cut_entries else self.first_start_dsn
            assert first_dsn is not None
        # Copies resolved: `plan_replay` would raise nothing before this.
        refused = start_refused(where, first_dsn, truncated, base)
        if refused is not None:
            raise refused
        if self.vouched:
            return None
        needed = base.ckp_dsn + 1
        if cut_records and live_records and not self.plain_safe_rising:
            return None
        plan = ReplayPlan()
        if cut_records:
            plan.truncated_lsns = LsnSet(span_after=0, span_upto=truncated, span_count=cut_records)
            live_safe = 0
            if live_records:
                live_safe = max([self.plain_safe_last, *(c.safe_dsn for c in live_copies)])
        else:
            live_safe = self.safe_dsn_max
        plan.safe_dsn = max(0, live_safe)
        if live_entries:
            assert self.expected_dsn is not None
            assert len(excluded) == len(live_copies)
            plan.kept_lsns = LsnSet(
                span_after=truncated,
                span_upto=self.last_entry_lsn,
                span_count=live_entries,
                excluded=np.unique(_i64(excluded)),
            )
        plan.duplicate_lsns = LsnSet.of(duplicate)
        plan.skipped_lsns = LsnSet.of(skipped)
        plan.first_dsn = first_dsn or needed
        plan.last_dsn = plan.first_dsn - 1
        if live_entries:
            assert self.expected_dsn is not None
            plan.last_dsn = self.expected_dsn - 1
        return plan

    def _resolve_copies(
        self, live_copies: list[_Copy], base: BaseState
    ) -> tuple[list[int], list[int], list[int]] | None:
        """Rule 2 over the live copies and the skip records: the LSNs left out of the kept
        span, the duplicates and the skipped records (`plan_replay`'s), or None where the
        log is not of the module doc's shapes."""
        truncated = self.truncated_lsn
        copy_by_lsn = {c.lsn: c for c in live_copies}
        groups: dict[int, list[_Copy]] = {}  # an original's LSN -> its copies, LSN order
        for found in live_copies:
            groups.setdefault(found.original_lsn, []).append(found)
        skipped: set[int] = set()
        for start_dsn, lsn in self.skip_pairs:
            if not truncated < lsn <= self.last_entry_lsn:
                continue  # names no live entry record: plan_replay ignores it
            named = copy_by_lsn.get(lsn)
            if named is not None and named.start_dsn == start_dsn:
                skipped.add(lsn)
            elif lsn in groups and groups[lsn][0].start_dsn == start_dsn:
                skipped.add(lsn)  # an original that has copies
            else:
                return None  # an original's only copy, or a record we do not know
        excluded: list[int] = []
        duplicate: list[int] = []
        for original_lsn, copies in groups.items():
            left = [c for c in copies if c.lsn not in skipped]
            if original_lsn not in skipped:
                if not all(c.same_bytes for c in left):
                    return None  # plan_replay: CopiesDisagree
                excluded.extend(c.lsn for c in copies)
                duplicate.extend(c.lsn for c in left)
                continue
            if not left:
                return None  # every copy of the range skipped: a gap
            kept = left[0]
            if not all(c.checksum == kept.checksum for c in left):
                return None  # plan_replay: CopiesDisagree
            if kept.safe_before >= kept.start_dsn > base.ckp_dsn:
                return None  # vouched for at a lower LSN (rule 3): plan_replay refuses
            excluded.append(original_lsn)
            excluded.extend(c.lsn for c in copies if c is not kept)
            duplicate.extend(c.lsn for c in left[1:])
        return excluded, duplicate, sorted(skipped)
