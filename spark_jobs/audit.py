"""lsn_audit, one log at a time (`audit_of`): the local engine (spark_jobs/local.py) runs
it for each log, the Spark engine in one task per log (spark_engine.per_log). Its own module
so that a Spark worker running the audit imports only what the audit reads (the audit level:
spark_jobs/walread.py, numpy, pyarrow), not the replay's, the checkpoints' or the other
jobs' code (spark_jobs.local imports pandas through pyarrow.dataset: ~0.5 CPU-s per worker,
measured with -X importtime).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs import jobs
from spark_jobs.audit_stream import (
    CoverageScan,
    UnitBatches,
    live_copies,
    stream_audit,
    widen_span,
)
from spark_jobs.jobs import JobParams, JobResult
from spark_jobs.limits import AUDIT_HELD_BYTES_MAX
from spark_jobs.schemas import AUDIT
from spark_jobs.verify import VERIFY_REPORT
from spark_jobs.walread import LEVEL_AUDIT, ReadOptions, read_unit


def lsn_audit(params: JobParams) -> JobResult:
    anomalies: list[dict[str, Any]] = []
    logs = []
    for replica, shard in audit_logs(params):
        audited = audit_of(params, replica, shard)
        if audited is not None:
            anomalies.extend(audited[0])
            logs.append(audited[1])
    result = JobResult(tables={"anomalies": anomaly_table(anomalies)})
    result.summary = {"logs": logs, "anomalies": len(anomalies)}
    result.lines = audit_lines(result.summary)
    return result


def audit_logs(params: JobParams) -> list[tuple[str, int]]:
    """The (replica, shard) logs of the input, in order: the unit of the audit (each log is
    audited alone, so one log's records are held at a time; on Spark, one task per log)."""
    return sorted({(unit.replica, unit.shard) for unit in params.units()})


def audit_of(
    params: JobParams, replica: str, shard: int
) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """One log's anomalies and summary (`audit_log`); None when the log holds no record."""
    scope = JobParams(params.job, params.inputs, frozenset({shard}), frozenset({replica}))
    options = ReadOptions(LEVEL_AUDIT, params.verify or VERIFY_REPORT, scope.bounds())

    def read(positions: frozenset[int] | None) -> Iterator[tuple[int, pa.RecordBatch]]:
        return (
            (position, batch)
            for position, unit in enumerate(scope.units())
            if positions is None or position in positions
            for batch in read_unit(unit, options)
        )

    return audit_batches(replica, shard, read(None), read, AUDIT_HELD_BYTES_MAX)


def audit_batches(
    replica: str,
    shard: int,
    batches: Iterator[tuple[int, pa.RecordBatch]],
    read_again: Callable[[frozenset[int] | None], UnitBatches],
    held_bytes_max: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """`audit_log` of the log whose audit level `batches` are ((unit, batch) pairs: the
    unit is the position of the read's unit, a file WAL segment, each batch comes from),
    read once while it is clean (`CleanAudit`); a log with something to report is audited
    whole from its batches held if they all fit `held_bytes_max`, else in passes
    (audit_stream.py) that take pass 1 on from the clean prefix and read again
    (`read_again`) for pass 2 only the units that hold a copy it keeps."""
    streamed = CleanAudit()
    # The batches read so far, while they are small: a log found to have something to
    # report is then audited whole without decoding its records a second time.
    held: list[tuple[int, pa.RecordBatch]] | None = []
    held_bytes = 0
    first_unclean = 0  # in `held`: the batch CleanAudit refused
    # The clean prefix's DSNs and LSNs per unit (audit_stream.CoverageScan.unit_spans).
    prefix_spans: dict[int, list[int]] = {}
    scan: CoverageScan | None = None  # pass 1, once the log is neither clean nor held
    for unit, batch in batches:
        if scan is not None:
            scan.add(batch, unit)
            continue
        if held is not None:
            held.append((unit, batch))
            held_bytes += batch.nbytes
        if streamed.clean:
            dsn_next, lsn_last = streamed.dsn_next, streamed.lsn_last
            if streamed.add(batch):
                if streamed.dsn_next != dsn_next:  # entry records: this batch's spans
                    assert streamed.dsn_next is not None and streamed.dsn_min is not None
                    assert streamed.lsn_last is not None and streamed.lsn_min is not None
                    widen_span(
                        prefix_spans,
                        unit,
                        streamed.dsn_min if dsn_next is None else dsn_next,
                        streamed.dsn_next - 1,
                        streamed.lsn_min if lsn_last is None else lsn_last + 1,
                        streamed.lsn_last,
                    )
            else:
                if held is None:
                    scan = streamed.coverage(prefix_spans)
                    scan.add(batch, unit)
                    continue
                first_unclean = len(held) - 1
        if held is not None and held_bytes > held_bytes_max:
            if not streamed.clean:
                scan = streamed.coverage(prefix_spans)
                for unclean_unit, unclean in held[first_unclean:]:
                    scan.add(unclean, unclean_unit)
            held = None
    if streamed.clean:
        return None if not streamed.rows else ([], streamed.summary(replica, shard))
    if held is not None:
        # Something to report in a log whose batches all fit the bound: its whole audit,
        # column-wise, from the batches held.
        table = pa.Table.from_batches([batch for _, batch in held], schema=AUDIT)
        return audit_log(replica, shard, table)
    # Past the bound: pass 1 has seen the whole log, pass 2 reads it again.
    assert scan is not None
    return stream_audit(replica, shard, read_again, scan)


_CLEAN_KINDS = frozenset({"entry", "marker", "truncate"})


def _filled(batch: pa.RecordBatch, name: str) -> npt.NDArray[np.int64]:
    column = pc.fill_null(batch.column(name), 0)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


class CleanAudit:
    """`audit_log` of a log with nothing to report, summed up batch by batch in memory that
    does not grow with the log (issue 23: the whole-log audit holds a few arrays per entry
    copy, 1.4 GB at 2M records of one entry each). Clean, here: only entry records, markers
    and TRUNCATE frames; the entry and marker records' LSNs rise by one from batch to batch;
    the entry records' DSN ranges run on without gap or overlap. Such a log has no anomaly
    (no gap, copy, skip, LSN gap or damage), so its summary is a few counts and bounds. Any
    other batch ends the stream (`add` returns False): the caller audits the log with
    `audit_log` (from the batches held, a small log) or `audit_stream.stream_audit` (in
    passes over the log read again), which report anomalies (tests/unit/spark_jobs/
    test_audit_stream.py: the three agree on every log).
    """

    __slots__ = (
        "clean",
        "copies",
        "dsn_min",
        "dsn_next",
        "lsn_last",
        "lsn_last_segment",
        "lsn_min",
        "lsn_min_segment",
        "rows",
        "truncated",
    )

    def __init__(self) -> None:
        self.clean = True
        self.rows = 0
        self.copies = 0
        self.dsn_min: int | None = None
        self.dsn_next: int | None = None  # the DSN the next entry record must start at
        self.lsn_min: int | None = None
        self.lsn_last: int | None = None
        # The segments of the rows of lsn_min and lsn_last: what an audit in passes
        # (`coverage`) needs to name the segment after an LSN gap.
        self.lsn_min_segment: str | None = None
        self.lsn_last_segment: str | None = None
        self.truncated = 0

    def add(self, batch: pa.RecordBatch) -> bool:
        """Take one batch of the audit level (in read order); False once the log is not
        clean, and then the batch's positions and copies are not taken (`coverage`)."""
        self.rows += batch.num_rows
        kinds = batch.column("kind").to_pylist()
        if not _CLEAN_KINDS.issuperset(kinds):
            self.clean = False
            return False
        kind = np.asarray(kinds, dtype=object)
        lsns = np.asarray(batch.column("lsn").to_numpy(zero_copy_only=False), dtype=np.int64)
        truncates = lsns[kind == "truncate"]
        if len(truncates):
            self.truncated = max(self.truncated, int(truncates.max()))
        positioned_at = np.flatnonzero(kind != "truncate")
        positioned = lsns[positioned_at]
        if len(positioned) and (
            (self.lsn_last is not None and int(positioned[0]) != self.lsn_last + 1)
            or bool((positioned[1:] != positioned[:-1] + 1).any())
        ):
            self.clean = False
            return False
        is_entry = kind == "entry"
        # Other kinds' start DSN (and a damaged record's count) are null: taken as 0.
        counts = _filled(batch, "record_count")[is_entry]
        if len(counts):
            starts = _filled(batch, "record_start_dsn")[is_entry]
            ends = starts + counts - 1
            if (
                bool((counts < 1).any())
                or (self.dsn_next is not None and int(starts[0]) != self.dsn_next)
                or bool((starts[1:] != ends[:-1] + 1).any())
            ):
                self.clean = False
                return False
            if self.dsn_min is None:
                self.dsn_min = int(starts[0])
            self.dsn_next = int(ends[-1]) + 1
            self.copies += int(counts.sum())
        if len(positioned):
            segment = batch.column("segment")
            if self.lsn_min is None:
                self.lsn_min = int(positioned[0])
                self.lsn_min_segment = segment[int(positioned_at[0])].as_py()
            self.lsn_last = int(positioned[-1])
            self.lsn_last_segment = segment[int(positioned_at[-1])].as_py()
        return True

    def coverage(self, unit_spans: dict[int, list[int]]) -> CoverageScan:
        """Pass 1 of an audit in passes (audit_stream.py) over the clean batches taken so
        far: one DSN range and one LSN range, no skip, no damage; `unit_spans`: the DSNs
        and LSNs of each unit's entry records among them. Fed the rest of the log from the
        batch `add` refused, it is what pass 1 over the whole log would be, so the log is
        read once more (for pass 2), not twice."""
        scan = CoverageScan()
        scan.unit_spans = {unit: list(span) for unit, span in unit_spans.items()}
        scan.copies = self.copies
        scan.truncated = self.truncated
        if self.dsn_min is not None:
            assert self.dsn_next is not None
            scan.dsns.add(self.dsn_min, self.dsn_next - 1)
        if self.lsn_min is not None:
            assert self.lsn_last is not None
            scan.lsns.add(self.lsn_min, self.lsn_last, self.lsn_min_segment, self.lsn_last_segment)
        return scan

    def summary(self, replica: str, shard: int) -> dict[str, Any]:
        """`audit_log`'s summary of the clean log taken so far."""
        assert self.clean
        return {
            "replica": replica,
            "shard": shard,
            "entry_copies": self.copies,
            "distinct_dsns": self.copies,
            "dsn_min": self.dsn_min,
            "dsn_max": None if self.dsn_next is None else self.dsn_next - 1,
            "lsn_min": self.lsn_min,
            "lsn_max": self.lsn_last,
            "gaps": 0,
            "duplicates": 0,
            "conflicts": 0,
            "skipped_copies": 0,
            "lsn_gaps": 0,
            "damaged": 0,
            "truncated_lsn": self.truncated,
        }


def anomaly_table(anomalies: list[dict[str, Any]]) -> pa.Table:
    table = (
        pa.Table.from_pylist(anomalies, schema=jobs.ANOMALY)
        if anomalies
        else jobs.ANOMALY.empty_table()
    )
    return jobs.sort_table(table, jobs.ANOMALY_ORDER)


def _ints(table: pa.Table, name: str) -> npt.NDArray[np.int64]:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.int64)


def audit_log(
    replica: str, shard: int, rows: pa.Table
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One log's audit, column-wise (numpy over the record level): what is proportional to
    the entries is vectorized; only anomalies (rare) are built row by row."""

    def anomaly(kind: str, **values: Any) -> dict[str, Any]:
        base = dict.fromkeys(jobs.ANOMALY.names)
        base.update(replica=replica, shard=shard, kind=kind, **values)
        return base

    found: list[dict[str, Any]] = []
    kind = rows.column("kind")
    records = rows.filter(pc.equal(kind, "entry"))
    skips_table = rows.filter(pc.equal(kind, "skip"))
    skips = set(
        zip(
            pc.list_flatten(skips_table.column("skip_dsns")).to_pylist(),
            pc.list_flatten(skips_table.column("skip_lsns")).to_pylist(),
            strict=True,
        )
    )
    # One row per DSN copy, made from the records: entry i of a record has DSN start + i.
    counts = _ints(records, "record_count")
    owner = np.repeat(np.arange(len(counts)), counts)  # the record of each copy
    firsts = np.cumsum(counts) - counts
    start = _ints(records, "record_start_dsn")
    lsn = _ints(records, "lsn")[owner]
    dsn_all = start[owner] + (np.arange(len(owner)) - firsts[owner])
    checksum_all = np.asarray(
        pc.list_flatten(records.column("entry_checksums")).to_numpy(zero_copy_only=False),
        dtype=np.int64,
    )
    assert len(checksum_all) == len(owner)
    skipped_record = np.zeros(len(counts), dtype=bool)
    if skips:
        record_lsns = _ints(records, "lsn")
        for i in range(len(counts)):
            skipped_record[i] = (int(start[i]), int(record_lsns[i])) in skips
    skipped = skipped_record[owner]
    if skipped.any():
        segments = records.column("segment").to_pylist()
        offsets = records.column("offset_bytes").to_pylist()
        for copy in np.flatnonzero(skipped).tolist():
            at = int(owner[copy])
            found.append(
                anomaly(
                    "skipped",
                    dsn_lo=int(dsn_all[copy]),
                    dsn_hi=int(dsn_all[copy]),
                    lsn_lo=int(lsn[copy]),
                    lsn_hi=int(lsn[copy]),
                    copies=1,
                    segment=segments[at],
                    offset_bytes=offsets[at],
                )
            )
    live = ~skipped
    dsns, held = live_copies(dsn_all, lsn, checksum_all, live)
    duplicates = conflicts = 0
    for kind_found, dsn, lsn_lo, lsn_hi, n in held:
        duplicates += kind_found == "duplicate"
        conflicts += kind_found == "conflict"
        found.append(
            anomaly(kind_found, dsn_lo=dsn, dsn_hi=dsn, lsn_lo=lsn_lo, lsn_hi=lsn_hi, copies=n)
        )
    gaps = 0
    for i in np.flatnonzero(np.diff(dsns) > 1).tolist():
        gaps += 1
        found.append(anomaly("gap", dsn_lo=int(dsns[i]) + 1, dsn_hi=int(dsns[i + 1]) - 1))
    positioned = rows.filter(pc.is_in(kind, pa.array(["entry", "marker", "skip"])))
    all_lsn = _ints(positioned, "lsn")
    lsns, lsn_first = np.unique(all_lsn, return_index=True)
    lsn_gaps = 0
    gap_at = np.flatnonzero(np.diff(lsns) > 1)
    if len(gap_at):
        segments = positioned.column("segment").take(pa.array(lsn_first)).to_pylist()
        for i in gap_at.tolist():
            lsn_gaps += 1
            across = segments[i] != segments[i + 1]
            found.append(
                anomaly(
                    "lsn_gap",
                    lsn_lo=int(lsns[i]) + 1,
                    lsn_hi=int(lsns[i + 1]) - 1,
                    segment=segments[i + 1],
                    detail="across segments" if across else "within a segment",
                )
            )
    truncates = rows.filter(pc.equal(kind, "truncate"))
    truncated = int(_ints(truncates, "lsn").max()) if truncates.num_rows else 0
    damage = rows.filter(pc.is_in(kind, pa.array(["corrupt", "torn_tail"])))
    for row in damage.to_pylist():
        found.append(
            anomaly(
                row["kind"],
                segment=row["segment"],
                offset_bytes=row["offset_bytes"],
                detail=row["error"],
            )
        )
    summary = {
        "replica": replica,
        "shard": shard,
        "entry_copies": int(live.sum()),
        "distinct_dsns": len(dsns),
        "dsn_min": int(dsns[0]) if len(dsns) else None,
        "dsn_max": int(dsns[-1]) if len(dsns) else None,
        "lsn_min": int(lsns[0]) if len(lsns) else None,
        "lsn_max": int(lsns[-1]) if len(lsns) else None,
        "gaps": gaps,
        "duplicates": duplicates,
        "conflicts": conflicts,
        "skipped_copies": int(skipped.sum()),
        "lsn_gaps": lsn_gaps,
        "damaged": damage.num_rows,
        "truncated_lsn": truncated,
    }
    return found, summary


def audit_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    for log in summary["logs"]:
        verdict = (
            "clean"
            if not (log["gaps"] or log["conflicts"] or log["lsn_gaps"] or log["damaged"])
            else "PROBLEMS"
        )
        lines.append(
            f"lsn_audit: replica {log['replica']} shard {log['shard']}: {verdict}: DSNs "
            f"{log['dsn_min']}-{log['dsn_max']} ({log['distinct_dsns']} distinct, "
            f"{log['entry_copies']} copies), gaps {log['gaps']}, duplicates {log['duplicates']}, "
            f"conflicts {log['conflicts']}, skipped copies {log['skipped_copies']}, LSN gaps "
            f"{log['lsn_gaps']}, damaged {log['damaged']}, truncated at LSN {log['truncated_lsn']}"
        )
    return lines or ["lsn_audit: no log in the input"]
