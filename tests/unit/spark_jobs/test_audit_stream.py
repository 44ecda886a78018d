"""lsn_audit streams a clean log in constant memory and agrees with the whole-log audit.

`audit.CleanAudit` sums up a log's audit level batch by batch while nothing in it is to be
reported; anything else hands the log to `audit.audit_log` (the whole log at once, the only
one that reports anomalies). Checked here: on random audit levels (clean, or with gaps,
copies, skips, LSN gaps, damage, truncations), cut into random batches, the streamed
result is the whole-log one; every clean log is streamed; and a clean log's audit peak does
not grow with its record count (issue 23: 1.4 GB at 2M one-entry records before).
"""

from __future__ import annotations

import gc
import itertools
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs import audit, audit_stream, schemas
from spark_jobs.errors import AuditRefused
from spark_jobs.inputs import file_input
from spark_jobs.jobs import JobParams
from spark_jobs.records import DECODES
from tests.unit.spark_jobs.logs import (
    kv_entries,
    one_entry_records_wal,
    records_of,
    write_file_wal,
)

RECORDS = 20_000
PEAK_GROWTH_BYTES_MAX = 2 << 20
"""What the audit of 4N records may hold above N's: 3N more records at even 30 bytes each
would pass it (the whole-log audit: hundreds of bytes a record)."""


def _row(lsn: int, kind: str, start: int = 0, count: int = 0, **more: Any) -> dict[str, Any]:
    return {
        "replica": "file",
        "shard": 0,
        "segment": f"seg-{lsn // 7}",
        "offset_bytes": lsn * 40,
        "lsn": lsn,
        "kind": kind,
        "record_start_dsn": start if kind == "entry" else None,
        "record_count": count,
        "safe_dsn": max(0, start - 1),
        "record_checksum": lsn,
        "entry_checksums": [start + i for i in range(count)] if kind == "entry" else [],
        "skip_dsns": more.get("skip_dsns", []),
        "skip_lsns": more.get("skip_lsns", []),
        "error": more.get("error"),
    }


@st.composite
def audit_levels(draw: st.DrawFn) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    lsn, dsn = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    for _ in range(draw(st.integers(0, 40))):
        step = draw(
            st.sampled_from(
                ["entry"] * 6
                + ["marker"] * 2
                + ["truncate", "gap", "copy", "lsn_gap", "skip", "corrupt", "back"]
            )
        )
        if step == "entry":
            count = draw(st.integers(1, 4))
            rows.append(_row(lsn, "entry", dsn, count))
            dsn += count
        elif step == "marker":
            rows.append(_row(lsn, "marker"))
        elif step == "truncate":
            rows.append(_row(draw(st.integers(0, lsn)), "truncate"))
            continue  # a frame with no place in the LSN sequence
        elif step == "gap":
            dsn += draw(st.integers(1, 3))
            continue
        elif step == "copy" and dsn > 1:
            start = draw(st.integers(max(1, dsn - 4), dsn - 1))
            rows.append(_row(lsn, "entry", start, dsn - start))
        elif step == "lsn_gap":
            lsn += draw(st.integers(1, 3))
            continue
        elif step == "skip":
            rows.append(_row(lsn, "skip", skip_dsns=[max(1, dsn - 1)], skip_lsns=[max(1, lsn - 1)]))
        elif step == "corrupt":
            rows.append(_row(lsn, "corrupt", error="checksum mismatch"))
        elif step == "back":
            lsn = max(1, lsn - draw(st.integers(1, 3)))
            continue
        lsn += 1
    return rows


def _streamed(rows: list[dict[str, Any]], cuts: list[int]) -> tuple[Any, bool]:
    streamed = audit.CleanAudit()
    bounds = sorted({0, len(rows), *(c % (len(rows) + 1) for c in cuts)})
    for lo, hi in itertools.pairwise(bounds):
        batch = pa.RecordBatch.from_pylist(rows[lo:hi], schema=schemas.AUDIT)
        if not streamed.add(batch):
            break
    if streamed.clean:
        return ([], streamed.summary("file", 0)), True
    return audit.audit_log("file", 0, pa.Table.from_pylist(rows, schema=schemas.AUDIT)), False


@settings(max_examples=400, deadline=None)
@given(audit_levels(), st.lists(st.integers(0, 100), max_size=6))
def test_the_streamed_audit_is_the_whole_logs(rows: list[dict[str, Any]], cuts: list[int]) -> None:
    if not rows:
        return  # audit_of answers None for a log without records, before either
    whole = audit.audit_log("file", 0, pa.Table.from_pylist(rows, schema=schemas.AUDIT))
    streamed, _ = _streamed(rows, cuts)
    assert streamed == whole
    one_row_batches, _ = _streamed(rows, list(range(len(rows))))  # every boundary crossed
    assert one_row_batches == whole


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(["entry", "marker"]), min_size=1, max_size=30),
    st.lists(st.integers(0, 40), max_size=5),
)
def test_every_clean_log_is_streamed(kinds: list[str], cuts: list[int]) -> None:
    rows, dsn = [], 1
    for lsn, kind in enumerate(kinds, start=1):
        rows.append(_row(lsn, kind, dsn, 2 if kind == "entry" else 0))
        dsn += 2 if kind == "entry" else 0
    (found, _), streamed = _streamed(rows, cuts)
    assert streamed and found == []


def _audit_peak_bytes(wal: str) -> tuple[int, dict[str, Any]]:
    params = JobParams("lsn_audit", file_input(wal))
    gc.collect()
    tracemalloc.start()
    try:
        audited = audit.audit_of(params, "file", 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert audited is not None
    return peak, audited[1]


def test_a_clean_logs_audit_peak_does_not_grow_with_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batches held in case the log has something to report are let go past a bound
    # (64 MiB by default): one smaller than either log here, so both stream unheld.
    monkeypatch.setattr(audit, "AUDIT_HELD_BYTES_MAX", 256 << 10)
    small, large = str(tmp_path / "small"), str(tmp_path / "large")
    one_entry_records_wal(small, RECORDS)
    one_entry_records_wal(large, 4 * RECORDS)
    _audit_peak_bytes(small)  # imports and caches warmed, not counted
    small_peak, small_summary = _audit_peak_bytes(small)
    large_peak, large_summary = _audit_peak_bytes(large)
    assert small_summary["distinct_dsns"] == RECORDS
    assert large_summary["distinct_dsns"] == 4 * RECORDS and large_summary["gaps"] == 0
    assert large_peak - small_peak < PEAK_GROWTH_BYTES_MAX, (small_peak, large_peak)


@pytest.mark.parametrize("held_bytes_max", [64 << 20, 0])
def test_a_log_with_something_to_report_is_decoded_once_while_its_batches_are_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_bytes_max: int
) -> None:
    """Streamed until its copy of DSNs 5-8, then audited whole: from the batches held (each
    record decoded once, as the Spark engine's tasks are tested for), or, past the bound,
    read again from its start for pass 2 (twice in all: pass 1 took over from the clean
    prefix)."""
    monkeypatch.setattr(audit, "AUDIT_HELD_BYTES_MAX", held_bytes_max)
    wal = str(tmp_path / "wal")
    records = records_of(kv_entries(12), per_record=4)
    write_file_wal(wal, [*records, records[1]])  # DSNs 5-8 written twice: a duplicate
    before = DECODES.total
    audited = audit.audit_of(JobParams("lsn_audit", file_input(wal)), "file", 0)
    assert audited is not None
    found, summary = audited
    assert summary["duplicates"] == 4 and [a["kind"] for a in found] == ["duplicate"] * 4
    assert DECODES.total - before == (4 if held_bytes_max else 4 + 4)


# --- a log with something to report, past the held bound: audited in passes -------------------


@st.composite
def unclean_levels(draw: st.DrawFn) -> list[dict[str, Any]]:
    """`audit_levels`, plus skip records that name real records (a copy of a DSN held twice,
    or the only copy: a gap then), put anywhere in the log (before the record too), torn
    tails, records out of order (the rows shuffled a little), and segments that follow the
    read order rather than the LSN."""
    rows = draw(audit_levels())
    entries = [row for row in rows if row["kind"] == "entry"]
    for _ in range(draw(st.integers(0, 3))):
        if not entries:
            break
        named = draw(st.sampled_from(entries))
        skip = _row(
            draw(st.integers(1, 60)),
            "skip",
            skip_dsns=[named["record_start_dsn"], 999],
            skip_lsns=[named["lsn"], 999],
        )
        rows.insert(draw(st.integers(0, len(rows))), skip)
    if draw(st.booleans()):
        rows.append(_row(draw(st.integers(1, 60)), "torn_tail", error="torn frame"))
    for _ in range(draw(st.integers(0, 3))):
        if len(rows) > 1:
            i, j = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, len(rows) - 1))
            rows[i], rows[j] = rows[j], rows[i]
    if draw(st.booleans()):
        # Segments in read order, as a file WAL has them: an LSN read again (a record out
        # of order) is then in another segment than its first row, whose segment counts.
        per_segment = draw(st.integers(1, 6))
        for i, row in enumerate(rows):
            row["segment"] = f"seg-{i // per_segment:03}"
    return rows


def _sorted(audited: tuple[list[dict[str, Any]], dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    found, summary = audited
    return audit.anomaly_table(found).to_pylist(), summary


class _Reads:
    """A log's rows read as `audit_of` reads them: units of `per_unit` rows (a file WAL's
    segments), each cut into batches at `cuts`; `read(units)` reads only those units (all
    for None) and counts the reads."""

    def __init__(self, rows: list[dict[str, Any]], cuts: list[int], per_unit: int) -> None:
        self.rows, self.per_unit = rows, per_unit
        self.bounds = sorted(
            {0, len(rows), *(c % (len(rows) + 1) for c in cuts), *range(0, len(rows), per_unit)}
        )
        self.reads: list[frozenset[int] | None] = []

    def read(self, units: frozenset[int] | None) -> list[tuple[int, pa.RecordBatch]]:
        self.reads.append(units)
        return [
            (
                lo // self.per_unit,
                pa.RecordBatch.from_pylist(self.rows[lo:hi], schema=schemas.AUDIT),
            )
            for lo, hi in itertools.pairwise(self.bounds)
            if units is None or lo // self.per_unit in units
        ]


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(unclean_levels(), audit_levels()),
    st.lists(st.integers(0, 100), max_size=6),
    st.lists(st.integers(0, 100), max_size=6),
    st.integers(0, 4000),
    st.integers(1, 20),
)
def test_the_audit_in_passes_is_the_whole_logs(
    rows: list[dict[str, Any]],
    cuts: list[int],
    other_cuts: list[int],
    held_bytes_max: int,
    per_unit: int,
) -> None:
    """Each pass cut into batches its own way, pass 2 reading only the units pass 1 names;
    and as `audit_of` runs them (`audit_batches`): pass 1 taken on from the clean prefix,
    at any bound on the batches held (0: always in passes)."""
    if not rows:
        return
    whole = audit.audit_log("file", 0, pa.Table.from_pylist(rows, schema=schemas.AUDIT))
    first, again = _Reads(rows, cuts, per_unit), _Reads(rows, other_cuts, per_unit)
    reads = iter([first.read, again.read])
    streamed = audit_stream.stream_audit("file", 0, lambda units: next(reads)(units))
    assert _sorted(streamed) == _sorted(whole)
    for bound in (0, held_bytes_max):
        again = _Reads(rows, other_cuts, per_unit)
        audited = audit.audit_batches("file", 0, iter(first.read(None)), again.read, bound)
        assert audited is not None
        assert _sorted(audited) == _sorted(whole)
        assert len(again.reads) <= 1 and None not in again.reads  # pass 2 names its units
    one_row_batches = audit_stream.stream_audit(
        "file", 0, _Reads(rows, list(range(len(rows))), per_unit).read
    )
    assert _sorted(one_row_batches) == _sorted(whole)


def test_intervals_keep_the_label_of_each_ends_first_cover() -> None:
    spans = audit_stream.Intervals()
    assert spans.add(10, 12, "a", "b") == []
    assert spans.add(13, 14, "c", "d") == []  # appended to the last: its end is new
    assert spans.add(5, 6, "e", "f") == []  # before it: inserted
    assert spans.add(7, 14, "g", "h") == [(10, 14)]  # joins both; 14 was covered first by "d"
    assert (spans.los, spans.his, spans.lo_labels, spans.hi_labels) == ([5], [14], ["e"], ["d"])
    assert spans.add(1, 20, "i", "j") == [(5, 14)]
    assert (spans.lo_labels, spans.hi_labels) == (["i"], ["j"])
    assert spans.add(30, 30) == [] and spans.add(25, 26) == [] and len(spans) == 3
    left = spans.without(np.array([1, 5, 20, 30], dtype=np.int64))
    assert (left.los, left.his) == ([2, 6, 25], [4, 19, 26]) and left.count() == 19


def _unclean_log(wal: str, records: int, segment_bytes_max: int = 1 << 20) -> None:
    """`records` one-entry records and, whatever their number, the same three anomalies:
    DSN 3 written twice (a duplicate), DSN 7 never (a gap), DSN 9 written twice with the
    second copy named by a skip record."""
    dsns = [1, 2, 3, 3, 4, 5, 6, *range(8, records + 1)]
    dsns[9:9] = [9]
    one_entry_records_wal(wal, 0, segment_bytes_max, dsns=dsns, skips=[(9, 10)])


def test_past_the_held_bound_an_unclean_log_is_audited_in_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = str(tmp_path / "wal")
    _unclean_log(wal, 500)
    params = JobParams("lsn_audit", file_input(wal))
    used: list[str] = []

    def recorded(name: str, audit_by: Any) -> Any:
        def run(*args: Any) -> Any:
            used.append(name)
            return audit_by(*args)

        return run

    monkeypatch.setattr(audit, "audit_log", recorded("whole", audit.audit_log))
    monkeypatch.setattr(audit, "stream_audit", recorded("passes", audit_stream.stream_audit))
    held = audit.audit_of(params, "file", 0)
    monkeypatch.setattr(audit, "AUDIT_HELD_BYTES_MAX", 0)
    streamed = audit.audit_of(params, "file", 0)
    assert used == ["whole", "passes"] and held is not None and streamed is not None
    assert _sorted(streamed) == _sorted(held)
    found, summary = streamed
    assert sorted(a["kind"] for a in found) == ["duplicate", "gap", "skipped"]
    assert summary["entry_copies"] == 500 and summary["distinct_dsns"] == 499


def test_an_unclean_logs_audit_peak_does_not_grow_with_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same three anomalies in N and 4N records, both past the held bound: the audit in
    passes holds what the anomalies need (the whole-log audit held ~100 bytes a copy)."""
    monkeypatch.setattr(audit, "AUDIT_HELD_BYTES_MAX", 256 << 10)
    small, large = str(tmp_path / "small"), str(tmp_path / "large")
    _unclean_log(small, RECORDS)
    _unclean_log(large, 4 * RECORDS)
    _audit_peak_bytes(small)  # imports and caches warmed, not counted
    small_peak, small_summary = _audit_peak_bytes(small)
    large_peak, large_summary = _audit_peak_bytes(large)
    assert small_summary["distinct_dsns"] == RECORDS - 1
    assert large_summary["distinct_dsns"] == 4 * RECORDS - 1
    assert (large_summary["gaps"], large_summary["duplicates"]) == (1, 1)
    assert large_peak - small_peak < PEAK_GROWTH_BYTES_MAX, (small_peak, large_peak)


def test_an_audit_past_its_detail_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_row(lsn, "entry", 1, 3) for lsn in range(1, 5)]  # DSNs 1-3, four times
    monkeypatch.setattr(audit_stream, "AUDIT_DETAIL_COPIES_MAX", 11)
    with pytest.raises(AuditRefused, match="AUDIT_DETAIL_COPIES_MAX"):
        audit_stream.stream_audit("file", 0, _Reads(rows, [], 2).read)
    monkeypatch.setattr(audit_stream, "AUDIT_DETAIL_COPIES_MAX", 12)
    _, summary = audit_stream.stream_audit("file", 0, _Reads(rows, [], 2).read)
    assert summary["duplicates"] == 3


def test_an_audit_past_its_span_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_row(lsn, "entry", 2 * lsn, 1) for lsn in range(1, 5)]  # DSNs 2, 4, 6, 8
    monkeypatch.setattr(audit_stream, "AUDIT_SPANS_HELD_MAX", 4)  # 4 DSN spans, 1 LSN span
    with pytest.raises(AuditRefused, match="AUDIT_SPANS_HELD_MAX"):
        audit_stream.stream_audit("file", 0, _Reads(rows, [], 2).read)


def test_past_the_held_bound_a_log_with_no_copy_and_no_skip_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DSN gap alone: pass 1 (taken on from the clean prefix) finds nothing pass 2 would
    keep, so the log is not read again."""
    monkeypatch.setattr(audit, "AUDIT_HELD_BYTES_MAX", 0)
    wal = str(tmp_path / "wal")
    records = records_of(kv_entries(16), per_record=4)
    write_file_wal(wal, [records[0], records[1], records[3]])  # DSNs 9-12 never written
    before = DECODES.total
    audited = audit.audit_of(JobParams("lsn_audit", file_input(wal)), "file", 0)
    assert audited is not None
    found, summary = audited
    assert [(a["kind"], a["dsn_lo"], a["dsn_hi"]) for a in found] == [("gap", 9, 12)]
    assert summary["distinct_dsns"] == 12
    assert DECODES.total - before == 3


def test_pass_2_reads_only_the_segments_that_hold_a_copy_it_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The three anomalies lie in the first of many segments (the skip record naming LSN 10
    is in the last): pass 2 decodes that segment's records, not the log's."""
    monkeypatch.setattr(audit, "AUDIT_HELD_BYTES_MAX", 0)
    wal = str(tmp_path / "wal")
    _unclean_log(wal, 2000, segment_bytes_max=16 << 10)  # ~80 records a segment
    records = 2000 + 1 + 1  # a duplicate record, a gap, a second copy of DSN 9, a skip
    params = JobParams("lsn_audit", file_input(wal))
    assert len(params.units()) > 20
    before = DECODES.total
    audited = audit.audit_of(params, "file", 0)
    assert audited is not None
    assert sorted(a["kind"] for a in audited[0]) == ["duplicate", "gap", "skipped"]
    assert records < DECODES.total - before <= records + records // 20
