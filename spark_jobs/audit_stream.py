"""lsn_audit of a log with something to report, in memory that grows with its anomalies, not
with the log (issue 23: the whole-log `audit.audit_log` holds ~100 bytes per DSN copy, past
1 GB beyond ~10M entries).

The log's audit level is read as a stream of batches, for each pass (`audit.audit_batches`
takes pass 1 on from the clean prefix it streamed, so the log is read once, plus pass 2's
units):

* pass 1 (`CoverageScan`): the skip pairs (record start DSN, LSN) named by skip records;
  the DSNs the entry records cover, as merged intervals, and the DSNs covered more than
  once (the overlaps); the LSNs of the entry, marker and skip rows as merged intervals,
  each end labelled with the segment of that LSN's first row (an `lsn_gap` names the
  segment after the gap and says whether it lies across segments); the damage rows as they
  are; the largest TRUNCATE LSN; counts.
* pass 2 (`CopyDetail`), reading only the units (a file WAL's segments) whose entry
  records' DSN and LSN spans (`CoverageScan.unit_spans`) meet an overlap or a skipped LSN:
  each copy (dsn, lsn, checksum, skipped) of a record that a skip names, or whose DSN lies
  in an overlap: every copy of a DSN held more than once, and every skipped copy. From
  them come the duplicates, conflicts and skipped copies, and the DSNs none of whose copies
  is live (only skipped ones): cut out of the covered DSNs, what is left is the live
  coverage, whose holes are the gaps.

`stream_audit` answers exactly what `audit.audit_log` answers for the same rows (the same
anomalies as a multiset and the same summary: tests/unit/spark_jobs/test_audit_stream.py
checks them on random logs cut at random batch boundaries). What either pass holds is
bounded by AUDIT_SPANS_HELD_MAX and AUDIT_DETAIL_COPIES_MAX (spark_jobs/limits.py); past
them the audit is refused (`AuditRefused`) rather than grow.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs import jobs
from spark_jobs.errors import AuditRefused
from spark_jobs.limits import AUDIT_DETAIL_COPIES_MAX, AUDIT_SPANS_HELD_MAX

Ints = npt.NDArray[np.int64]

_POSITIONED_KINDS = ("entry", "marker", "skip")  # rows with a place among the LSNs
_DAMAGE_KINDS = ("corrupt", "torn_tail")


def _is_kind(kind: pa.Array, kinds: tuple[str, ...]) -> pa.Array:
    """Whether each row is of one of `kinds`. (Not `pc.is_in` with `pa.array(kinds)`: pyarrow
    imports pandas to convert a list, which an audit task does not otherwise import.)"""
    mask = pc.equal(kind, kinds[0])
    for other in kinds[1:]:
        mask = pc.or_(mask, pc.equal(kind, other))
    return mask


def live_copies(
    dsn: npt.NDArray[np.int64],
    lsn: npt.NDArray[np.int64],
    checksum: npt.NDArray[np.int64],
    live: npt.NDArray[np.bool_],
) -> tuple[npt.NDArray[np.int64], list[tuple[str, int, int, int, int]]]:
    """The distinct DSNs of the `live` copies (one per DSN copy: its DSN, LSN and entry
    checksum), and each DSN held more than once as (kind, DSN, lowest LSN, highest LSN,
    copies): "duplicate" when its copies' checksums agree, else "conflict". The rule of
    both audits (audit.py `audit_log`, and `CopyDetail` here)."""
    dsn, lsn, checksum = dsn[live], lsn[live], checksum[live]
    order = np.lexsort((lsn, dsn))
    dsn, lsn, checksum = dsn[order], lsn[order], checksum[order]
    dsns, first, counts = np.unique(dsn, return_index=True, return_counts=True)
    held: list[tuple[str, int, int, int, int]] = []
    for i in np.flatnonzero(counts > 1).tolist():
        lo, n = int(first[i]), int(counts[i])
        kind = "duplicate" if len(np.unique(checksum[lo : lo + n])) == 1 else "conflict"
        copies_lsn = lsn[lo : lo + n]
        held.append((kind, int(dsns[i]), int(copies_lsn.min()), int(copies_lsn.max()), n))
    return dsns, held


class Intervals:
    """Disjoint integer intervals [lo, hi] (both ends included, as an anomaly's dsn_lo and
    dsn_hi are), sorted, never adjacent (touching ones are merged). Each end may carry a
    label, kept from the `add` that first covered it. A log in DSN or LSN order only ever
    extends the last interval or appends one after it: O(1); anything else is a bisect and
    a list splice, paid per anomaly."""

    __slots__ = ("hi_labels", "his", "lo_labels", "los")

    def __init__(self) -> None:
        self.los: list[int] = []
        self.his: list[int] = []
        self.lo_labels: list[Any] = []
        self.hi_labels: list[Any] = []

    def __len__(self) -> int:
        return len(self.los)

    def add(
        self, lo: int, hi: int, lo_label: Any = None, hi_label: Any = None
    ) -> list[tuple[int, int]]:
        """Cover [lo, hi]; returns the parts of it that were covered already, in order."""
        assert lo <= hi
        los, his = self.los, self.his
        if not los or lo > his[-1] + 1:
            los.append(lo)
            his.append(hi)
            self.lo_labels.append(lo_label)
            self.hi_labels.append(hi_label)
            return []
        if lo == his[-1] + 1:
            his[-1] = hi
            self.hi_labels[-1] = hi_label
            return []
        first = bisect_left(his, lo - 1)  # the first interval touching [lo, hi]
        end = bisect_right(los, hi + 1)  # past the last one
        covered = [
            (max(lo, los[i]), min(hi, his[i]))
            for i in range(first, end)
            if max(lo, los[i]) <= min(hi, his[i])
        ]
        if first == end:
            los.insert(first, lo)
            his.insert(first, hi)
            self.lo_labels.insert(first, lo_label)
            self.hi_labels.insert(first, hi_label)
            return covered
        # An end of the union that lay outside the intervals is first covered now: its label
        # is the caller's; one that lay inside keeps the label it was first covered with.
        if los[first] <= lo:
            lo, lo_label = los[first], self.lo_labels[first]
        if his[end - 1] >= hi:
            hi, hi_label = his[end - 1], self.hi_labels[end - 1]
        los[first:end] = [lo]
        his[first:end] = [hi]
        self.lo_labels[first:end] = [lo_label]
        self.hi_labels[first:end] = [hi_label]
        return covered

    def count(self) -> int:
        """The integers covered."""
        return sum(hi - lo + 1 for lo, hi in zip(self.los, self.his, strict=True))

    def without(self, points: Ints) -> Intervals:
        """These intervals less `points` (sorted, distinct, each covered); labels dropped."""
        out = Intervals()
        at = 0
        for lo, hi in zip(self.los, self.his, strict=True):
            start = lo
            while at < len(points) and int(points[at]) <= hi:
                point = int(points[at])
                assert point >= start
                if point > start:
                    out.los.append(start)
                    out.his.append(point - 1)
                start = point + 1
                at += 1
            if start <= hi:
                out.los.append(start)
                out.his.append(hi)
        assert at == len(points)
        out.lo_labels = [None] * len(out.los)
        out.hi_labels = [None] * len(out.los)
        return out

    def arrays(self) -> tuple[Ints, Ints]:
        return np.asarray(self.los, dtype=np.int64), np.asarray(self.his, dtype=np.int64)


def _ints(batch: pa.RecordBatch, name: str) -> Ints:
    """A column as int64; nulls (other kinds' start DSN, a damaged row's count) read 0."""
    column = pc.fill_null(batch.column(name), 0)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def _mask(array: pa.Array) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)


def _entry_records(batch: pa.RecordBatch) -> tuple[Ints, Ints, Ints, Ints]:
    """The entry records holding copies: their rows in the batch, start DSNs, counts, LSNs."""
    rows = np.flatnonzero(_mask(pc.equal(batch.column("kind"), "entry")))
    counts = _ints(batch, "record_count")[rows]
    has_copies = counts > 0
    rows, counts = rows[has_copies], counts[has_copies]
    return rows, _ints(batch, "record_start_dsn")[rows], counts, _ints(batch, "lsn")[rows]


def _refuse(what: str, count: int, limit_name: str, limit: int) -> AuditRefused:
    return AuditRefused(
        f"lsn_audit: the log holds more {what} ({count}) than {limit_name} ({limit}) "
        "lets one worker hold (spark_jobs/limits.py: issue 23, a worker's memory). The log "
        "is damaged throughout: repair it (`python -m engine repair`, or the logsvc "
        "replica's journal from a healthy peer), or audit a smaller input (--shard, "
        "--replica)"
    )


def widen_span(
    spans: dict[int, list[int]], unit: int, dsn_lo: int, dsn_hi: int, lsn_lo: int, lsn_hi: int
) -> None:
    """`spans[unit]` ([DSN lo, DSN hi, LSN lo, LSN hi]) widened to hold these too."""
    span = spans.get(unit)
    if span is None:
        spans[unit] = [dsn_lo, dsn_hi, lsn_lo, lsn_hi]
        return
    span[0] = min(span[0], dsn_lo)
    span[1] = max(span[1], dsn_hi)
    span[2] = min(span[2], lsn_lo)
    span[3] = max(span[3], lsn_hi)


class CoverageScan:
    """Pass 1: fed the audit level's batches in read order (`add`), holds what is
    proportional to the log's anomalies (the module doc lists it)."""

    __slots__ = (
        "copies",
        "damage",
        "dsns",
        "lsns",
        "overlaps",
        "rows",
        "skips",
        "truncated",
        "unit_spans",
    )

    def __init__(self) -> None:
        self.rows = 0
        self.copies = 0  # every entry copy, skipped ones too
        self.dsns = Intervals()  # DSNs held by at least one copy
        self.overlaps = Intervals()  # DSNs held by more than one copy
        self.lsns = Intervals()  # LSNs of entry, marker and skip rows; ends labelled by segment
        self.skips: set[tuple[int, int]] = set()  # (record start DSN, LSN) pairs
        self.damage: list[dict[str, Any]] = []  # corrupt and torn_tail rows
        self.truncated = 0
        # Per unit of the read (a file WAL's segment; a logsvc replica's journal is one):
        # [DSN lo, DSN hi, LSN lo, LSN hi] its entry records lie within, so that pass 2
        # reads only the units that hold a copy it keeps (`units_to_detail`). One list per
        # unit, not per anomaly: a file WAL's segments are 64 MiB (~100 bytes each here).
        self.unit_spans: dict[int, list[int]] = {}

    def held(self) -> int:
        return (
            len(self.dsns)
            + len(self.overlaps)
            + len(self.lsns)
            + len(self.skips)
            + len(self.damage)
        )

    def units_to_detail(self) -> frozenset[int]:
        """The units pass 2 must read: those whose entry records may hold a DSN held more
        than once or a record a skip names (a superset: spans, not records)."""
        overlap_los, overlap_his = self.overlaps.arrays()
        skip_lsns = sorted({lsn for _, lsn in self.skips})
        needed = set()
        for unit, (dsn_lo, dsn_hi, lsn_lo, lsn_hi) in self.unit_spans.items():
            at = int(np.searchsorted(overlap_his, dsn_lo, side="left"))
            if at < len(overlap_los) and int(overlap_los[at]) <= dsn_hi:
                needed.add(unit)
            at = bisect_left(skip_lsns, lsn_lo)
            if at < len(skip_lsns) and skip_lsns[at] <= lsn_hi:
                needed.add(unit)
        return frozenset(needed)

    def add(self, batch: pa.RecordBatch, unit: int = 0) -> None:
        """Take the next batch of the log, read from unit `unit` (a batch holds one's rows)."""
        if not batch.num_rows:
            return
        self.rows += batch.num_rows
        kind = batch.column("kind")
        self._add_lsns(batch, _mask(_is_kind(kind, _POSITIONED_KINDS)))
        _, starts, counts, lsns = _entry_records(batch)
        if len(counts):
            widen_span(
                self.unit_spans,
                unit,
                int(starts.min()),
                int((starts + counts - 1).max()),
                int(lsns.min()),
                int(lsns.max()),
            )
        self._add_dsns(starts, counts)
        skip_rows = batch.filter(pc.equal(kind, "skip"))
        if skip_rows.num_rows:
            self.skips.update(
                zip(
                    pc.list_flatten(skip_rows.column("skip_dsns")).to_pylist(),
                    pc.list_flatten(skip_rows.column("skip_lsns")).to_pylist(),
                    strict=True,
                )
            )
        truncates = batch.filter(pc.equal(kind, "truncate"))
        if truncates.num_rows:
            self.truncated = max(self.truncated, int(pc.max(truncates.column("lsn")).as_py()))
        damage = batch.filter(_is_kind(kind, _DAMAGE_KINDS))
        if damage.num_rows:
            self.damage.extend(
                damage.select(["kind", "segment", "offset_bytes", "error"]).to_pylist()
            )
        if self.held() > AUDIT_SPANS_HELD_MAX:
            raise _refuse(
                "intervals, skip pairs and damaged records",
                self.held(),
                "AUDIT_SPANS_HELD_MAX",
                AUDIT_SPANS_HELD_MAX,
            )

    def _add_lsns(self, batch: pa.RecordBatch, positioned: npt.NDArray[np.bool_]) -> None:
        rows = np.flatnonzero(positioned)
        if not len(rows):
            return
        lsns = _ints(batch, "lsn")[rows]
        segment = batch.column("segment")
        if bool((lsns[1:] == lsns[:-1] + 1).all()):  # the common case: one run, in order
            self.lsns.add(
                int(lsns[0]),
                int(lsns[-1]),
                segment[int(rows[0])].as_py(),
                segment[int(rows[-1])].as_py(),
            )
            return
        # The batch's distinct LSNs, each with its first row, cut into runs of consecutive ones.
        distinct, first = np.unique(lsns, return_index=True)
        ends = np.flatnonzero(np.diff(distinct) > 1)
        run_los = np.concatenate(([0], ends + 1))
        run_his = np.concatenate((ends, [len(distinct) - 1]))
        for lo, hi in zip(run_los.tolist(), run_his.tolist(), strict=True):
            self.lsns.add(
                int(distinct[lo]),
                int(distinct[hi]),
                segment[int(rows[first[lo]])].as_py(),
                segment[int(rows[first[hi]])].as_py(),
            )

    def _add_dsns(self, starts: Ints, counts: Ints) -> None:
        if not len(counts):
            return
        self.copies += int(counts.sum())
        ends = starts + counts - 1
        if bool((starts[1:] == ends[:-1] + 1).all()):  # the common case: one run, in order
            self._cover(int(starts[0]), int(ends[-1]))
            return
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        reach = np.maximum.accumulate(ends)  # the highest DSN of the records so far
        # Record i+1 overlaps the ones before it on [start, min(end, reach before it)]; it
        # opens a new run when it starts past that reach + 1.
        before = reach[:-1]
        for i in np.flatnonzero(starts[1:] <= before).tolist():
            self.overlaps.add(int(starts[i + 1]), int(min(ends[i + 1], before[i])))
        breaks = np.flatnonzero(starts[1:] > before + 1)
        run_los = np.concatenate(([0], breaks + 1))
        run_his = np.concatenate((breaks, [len(starts) - 1]))
        for lo, hi in zip(run_los.tolist(), run_his.tolist(), strict=True):
            self._cover(int(starts[lo]), int(reach[hi]))

    def _cover(self, lo: int, hi: int) -> None:
        for covered_lo, covered_hi in self.dsns.add(lo, hi):
            self.overlaps.add(covered_lo, covered_hi)


class CopyDetail:
    """Pass 2: fed the same batches again (`add`), keeps each copy whose record is skipped
    or whose DSN lies in one of pass 1's overlaps; `anomalies_and_summary` is then
    `audit_log`'s answer."""

    __slots__ = (
        "_checksums",
        "_dsns",
        "_lsns",
        "_overlap_his",
        "_overlap_los",
        "_skip_lsns",
        "_skipped",
        "found",
        "held",
        "replica",
        "scan",
        "shard",
    )

    def __init__(self, replica: str, shard: int, scan: CoverageScan) -> None:
        self.replica = replica
        self.shard = shard
        self.scan = scan
        self._overlap_los, self._overlap_his = scan.overlaps.arrays()
        self._skip_lsns = np.asarray(sorted({lsn for _, lsn in scan.skips}), dtype=np.int64)
        self.found: list[dict[str, Any]] = []
        self.held = 0
        self._dsns: list[Ints] = []
        self._lsns: list[Ints] = []
        self._checksums: list[Ints] = []
        self._skipped: list[npt.NDArray[np.bool_]] = []

    def needed(self) -> bool:
        """Whether pass 2 can tell anything: without overlaps or skips it keeps no copy."""
        return bool(len(self._overlap_los) or len(self._skip_lsns))

    def _in_overlap(self, lo: Ints, hi: Ints) -> npt.NDArray[np.bool_]:
        """Whether each [lo, hi] meets an overlap interval."""
        n = len(self._overlap_los)
        if not n:
            return np.zeros(len(lo), dtype=bool)
        at = np.searchsorted(self._overlap_his, lo, side="left")  # first interval ending >= lo
        return (at < n) & (self._overlap_los[np.minimum(at, n - 1)] <= hi)

    def anomaly(self, kind: str, **values: Any) -> dict[str, Any]:
        base = dict.fromkeys(jobs.ANOMALY.names)
        base.update(replica=self.replica, shard=self.shard, kind=kind, **values)
        return base

    def add(self, batch: pa.RecordBatch) -> None:
        rows, starts, counts, lsns = _entry_records(batch)
        if not len(rows):
            return
        skipped = np.zeros(len(rows), dtype=bool)
        if len(self._skip_lsns):
            for i in np.flatnonzero(np.isin(lsns, self._skip_lsns)).tolist():
                skipped[i] = (int(starts[i]), int(lsns[i])) in self.scan.skips
        wanted = np.flatnonzero(skipped | self._in_overlap(starts, starts + counts - 1))
        if not len(wanted):
            return
        checksums = batch.column("entry_checksums")
        segment, offset = batch.column("segment"), batch.column("offset_bytes")
        for i in wanted.tolist():
            row, lsn = int(rows[i]), int(lsns[i])
            dsns = int(starts[i]) + np.arange(int(counts[i]), dtype=np.int64)
            keep = np.ones(len(dsns), dtype=bool) if skipped[i] else self._in_overlap(dsns, dsns)
            kept = dsns[keep]
            sums = np.asarray(checksums[row].values.to_numpy(zero_copy_only=False), np.int64)
            assert len(sums) == len(dsns)
            self.held += len(kept)
            if self.held > AUDIT_DETAIL_COPIES_MAX:
                raise _refuse(
                    "copies of DSNs held twice or skipped",
                    self.held,
                    "AUDIT_DETAIL_COPIES_MAX",
                    AUDIT_DETAIL_COPIES_MAX,
                )
            self._dsns.append(kept)
            self._lsns.append(np.full(len(kept), lsn, dtype=np.int64))
            self._checksums.append(sums[keep])
            self._skipped.append(np.full(len(kept), bool(skipped[i])))
            if skipped[i]:
                at_segment, at_offset = segment[row].as_py(), offset[row].as_py()
                for dsn in kept.tolist():
                    self.found.append(
                        self.anomaly(
                            "skipped",
                            dsn_lo=dsn,
                            dsn_hi=dsn,
                            lsn_lo=lsn,
                            lsn_hi=lsn,
                            copies=1,
                            segment=at_segment,
                            offset_bytes=at_offset,
                        )
                    )

    def anomalies_and_summary(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        scan = self.scan
        found = list(self.found)
        dsn_all = np.concatenate([np.zeros(0, np.int64), *self._dsns])
        lsn_all = np.concatenate([np.zeros(0, np.int64), *self._lsns])
        checksum_all = np.concatenate([np.zeros(0, np.int64), *self._checksums])
        skipped = np.concatenate([np.zeros(0, bool), *self._skipped])
        live = ~skipped
        # Copies of one DSN, live ones: all of them are here (a DSN held more than once lies
        # in an overlap).
        live_dsns, held = live_copies(dsn_all, lsn_all, checksum_all, live)
        duplicates = conflicts = 0
        for kind, dsn, lsn_lo, lsn_hi, n in held:
            duplicates += kind == "duplicate"
            conflicts += kind == "conflict"
            found.append(
                self.anomaly(kind, dsn_lo=dsn, dsn_hi=dsn, lsn_lo=lsn_lo, lsn_hi=lsn_hi, copies=n)
            )
        # A DSN here with no live copy has only skipped ones (every copy of a DSN held once
        # and skipped is here too): not live, so not covered.
        dead = np.setdiff1d(np.unique(dsn_all), live_dsns, assume_unique=True)
        covered = scan.dsns.without(dead)
        for hi, lo in zip(covered.his[:-1], covered.los[1:], strict=True):
            found.append(self.anomaly("gap", dsn_lo=hi + 1, dsn_hi=lo - 1))
        lsns = scan.lsns
        for i in range(len(lsns) - 1):
            before, after = lsns.hi_labels[i], lsns.lo_labels[i + 1]
            found.append(
                self.anomaly(
                    "lsn_gap",
                    lsn_lo=lsns.his[i] + 1,
                    lsn_hi=lsns.los[i + 1] - 1,
                    segment=after,
                    detail="across segments" if before != after else "within a segment",
                )
            )
        for row in scan.damage:
            found.append(
                self.anomaly(
                    row["kind"],
                    segment=row["segment"],
                    offset_bytes=row["offset_bytes"],
                    detail=row["error"],
                )
            )
        skipped_copies = int(skipped.sum())
        summary = {
            "replica": self.replica,
            "shard": self.shard,
            "entry_copies": scan.copies - skipped_copies,
            "distinct_dsns": covered.count(),
            "dsn_min": covered.los[0] if len(covered) else None,
            "dsn_max": covered.his[-1] if len(covered) else None,
            "lsn_min": lsns.los[0] if len(lsns) else None,
            "lsn_max": lsns.his[-1] if len(lsns) else None,
            "gaps": max(0, len(covered) - 1),
            "duplicates": duplicates,
            "conflicts": conflicts,
            "skipped_copies": skipped_copies,
            "lsn_gaps": max(0, len(lsns) - 1),
            "damaged": len(scan.damage),
            "truncated_lsn": scan.truncated,
        }
        return found, summary


UnitBatches = Iterable[tuple[int, pa.RecordBatch]]
"""A log's audit level as (unit, batch) pairs in read order: the unit is the position of the
read's unit (a file WAL's segment) each batch comes from."""


def stream_audit(
    replica: str,
    shard: int,
    read: Callable[[frozenset[int] | None], UnitBatches],
    scan: CoverageScan | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`audit_log` of the log whose audit level `read` streams: `read(None)` every unit,
    `read(units)` those only. Called once per pass not done yet: pass 1 (every unit) unless
    its `scan` of the whole log is given, and pass 2 (the units holding a copy it keeps)
    unless pass 1 found no DSN held twice and no skip."""
    if scan is None:
        scan = CoverageScan()
        for unit, batch in read(None):
            scan.add(batch, unit)
    detail = CopyDetail(replica, shard, scan)
    if detail.needed():
        for _, batch in read(scan.units_to_detail()):
            detail.add(batch)
    return detail.anomalies_and_summary()
