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

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs import audit, schemas
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
    read again from its start (twice)."""
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
