"""lsn_audit's columnar path: the `audit` level (one row per backend record) and the numpy
audit over it find exactly what a log holds, on a file WAL of hand-made driver records
(written through the real FileBackend): a duplicate copy (same bytes), a conflicting copy
(other bytes), a copy discarded by a skip record, a DSN gap, a marker, overlapping records
(DSNs 1-2 and DSN 2 alone: the per-DSN copies are compared, not the records), a truncation,
a damaged record in `report` mode; and the audit level's rows match the record level's
row for row once exploded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from spark_jobs import audit, local
from spark_jobs.errors import InputCorrupt
from spark_jobs.inputs import file_input, list_units
from spark_jobs.jobs import JobParams
from spark_jobs.walread import ReadOptions, read_unit
from tae_driver import limits as driver_limits
from tae_driver.backends import segment as wal_segment
from tests.unit.spark_jobs.logs import anomalies_log, encode_record, kv_entries, write_file_wal


def read(wal: str, level: str) -> pa.Table:
    options = ReadOptions(level, "report")
    batches = [b for unit in list_units(file_input(wal)) for b in read_unit(unit, options)]
    return pa.Table.from_batches(batches, schema=options.schema())


def anomalies(result: Any) -> list[tuple[Any, ...]]:
    return [
        (a["kind"], a["dsn_lo"], a["dsn_hi"], a["lsn_lo"], a["lsn_hi"], a["copies"])
        for a in result.tables["anomalies"].to_pylist()
    ]


def test_the_audit_finds_each_kind_of_anomaly(tmp_path: Path) -> None:
    wal = str(tmp_path / "wal")
    anomalies_log(wal)
    result = local.run(JobParams("lsn_audit", file_input(wal)))
    assert anomalies(result) == [
        ("conflict", 5, 5, 6, 7, 2),
        ("duplicate", 2, 2, 1, 2, 2),
        ("duplicate", 3, 3, 3, 4, 2),
        ("gap", 7, 7, None, None, None),
        ("skipped", 6, 6, 9, 9, 1),
    ]
    [log] = result.summary["logs"]
    assert (log["entry_copies"], log["distinct_dsns"], log["dsn_min"], log["dsn_max"]) == (
        10,
        7,
        1,
        8,
    )
    assert (log["lsn_min"], log["lsn_max"], log["lsn_gaps"], log["truncated_lsn"]) == (1, 12, 0, 1)
    assert (log["skipped_copies"], log["damaged"]) == (1, 0)

    # The audit level is the record level, one row per record: exploded, the same copies.
    records = read(wal, "record").filter(pc.equal(pc.field("kind"), "entry"))
    audit = read(wal, "audit")
    assert audit.num_rows == 13  # 12 records and the TRUNCATE frame
    exploded = [
        (row["lsn"], row["record_start_dsn"] + i, checksum)
        for row in audit.to_pylist()
        if row["kind"] == "entry"
        for i, checksum in enumerate(row["entry_checksums"])
    ]
    assert exploded == [(r["lsn"], r["dsn"], r["entry_checksum"]) for r in records.to_pylist()]


def test_damage_is_an_anomaly_in_report_mode(tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    write_file_wal(str(wal), [encode_record(1, 0, kv_entries(3)[0:3])] * 2)
    [segment] = [p for p in wal.iterdir() if p.name.endswith(".seg")]
    whole = segment.read_bytes()
    # Where the frames end: the segment is preallocated (format 3), zeros follow.
    end = wal_segment.read_segment_frames(whole, str(segment), newest=True).end_offset
    data = bytearray(whole)
    data[end - 5] ^= 0xFF  # inside the last frame, which is whole: it may have been acknowledged
    segment.write_bytes(bytes(data))
    result = local.run(JobParams("lsn_audit", file_input(str(wal))))
    kinds = [a["kind"] for a in result.tables["anomalies"].to_pylist()]
    assert kinds == ["corrupt"]
    [log] = result.summary["logs"]
    assert log["damaged"] == 1 and log["entry_copies"] == 3
    segment.write_bytes(whole[: end - 5])  # a group write cut short: a torn tail
    result = local.run(JobParams("lsn_audit", file_input(str(wal))))
    assert [a["kind"] for a in result.tables["anomalies"].to_pylist()] == ["torn_tail"]


def test_a_flipped_byte_followed_by_valid_frames_is_corruption_not_a_torn_tail(
    tmp_path: Path,
) -> None:
    """Issue 20: a byte flipped in the first of four records of the newest (only) segment
    was reported as a torn tail by lsn_audit, and replay_as_of replayed nothing and exited 0.
    The frames after it are whole, so it is corruption: a problem for the audit, a typed
    error for the replay (the file backend's open refuses the same bytes)."""
    wal = tmp_path / "wal"
    entries = kv_entries(6)
    write_file_wal(
        str(wal),
        [
            encode_record(1, 0, entries[0:2]),
            encode_record(3, 2, entries[2:4]),
            encode_record(5, 4, entries[4:6]),
        ],
    )
    [segment] = [p for p in wal.iterdir() if p.name.endswith(".seg")]
    data = bytearray(segment.read_bytes())
    data[32 + driver_limits.FILE_FRAME_HEADER_BYTES + 10] ^= 0x10  # the first frame's payload
    segment.write_bytes(bytes(data))
    result = local.run(JobParams("lsn_audit", file_input(str(wal))))
    anomalies = result.tables["anomalies"].to_pylist()
    assert [a["kind"] for a in anomalies] == ["corrupt"]
    assert anomalies[0]["offset_bytes"] == 32
    assert "valid frames follow" in anomalies[0]["detail"]
    assert "PROBLEMS" in "\n".join(audit.audit_lines(result.summary))
    with pytest.raises(InputCorrupt) as info:
        local.run(JobParams("replay_as_of", file_input(str(wal)), as_of=10**15))
    assert info.value.offset_bytes == 32


def test_the_record_level_under_a_dsn_bound_keeps_rows_aligned(tmp_path: Path) -> None:
    """A bound that drops every entry of a record (DSNs 1-2 under dsn >= 3) must not shift
    the columns of the rows after it (the columnar builder adds runs, not tuples)."""
    from spark_jobs.filters import Bounds

    wal = str(tmp_path / "wal")
    entries = kv_entries(6)
    write_file_wal(
        wal,
        [
            encode_record(1, 0, entries[0:2]),
            encode_record(3, 2, entries[2:4]),
            encode_record(5, 4, entries[4:6]),
        ],
    )
    whole = read(wal, "record").to_pylist()
    options = ReadOptions("record", "report", Bounds().with_range("dsn", lo=3, hi=5))
    units = list_units(file_input(wal))
    bounded = pa.Table.from_batches(
        [b for unit in units for b in read_unit(unit, options)], schema=options.schema()
    ).to_pylist()
    assert bounded == [r for r in whole if r["dsn"] is not None and 3 <= r["dsn"] <= 5]
    assert [(r["lsn"], r["dsn"]) for r in bounded] == [(2, 3), (2, 4), (3, 5)]
