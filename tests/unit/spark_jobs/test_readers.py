"""The readers (spark_jobs.walread) on real file WALs with each edge case, row by row:

* a clean log: one record-level row per DSN, entry and command levels decoded by the
  engine's codec, the rows level with its row ids, the segment level without decoding;
* a torn tail: gone under verify=true (recovery would cut it), one `torn_tail` row under
  report; a bad checksum in a sealed segment: `InputCorrupt` naming file and offset under
  true, a `corrupt` row under report;
* an empty segment (a fresh log): no row at any level, one inventory row of 0 records;
* duplicated and conflicting copies, a skip record and a safe marker: each as its own row;
* a truncated prefix: the `truncate` row with the truncated LSN;
* pushed bounds prune: a lower LSN bound skips whole segments, DSN and commit_ts bounds
  drop rows, shard and replica bounds drop units.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Bounds
from spark_jobs.inputs import file_input, list_units
from spark_jobs.limits import LIVE_SEGMENT_READS_MAX
from spark_jobs.schemas import schema_from_json, signed64
from spark_jobs.walread import ReadOptions, read_unit
from tae_driver import limits as driver_limits
from tae_driver.backends import segment as wal_segment
from tests.unit.spark_jobs.logs import (
    encode_record,
    encode_skip,
    kv_entries,
    records_of,
    write_file_wal,
)


def read(
    wal: str, level: str, verify: str = "true", bounds: Bounds | None = None
) -> list[dict[str, Any]]:
    options = ReadOptions(level, verify, bounds or Bounds())
    units = list_units(file_input(wal))
    table = pa.Table.from_batches(
        [b for u in units if options.bounds.keeps_unit(u) for b in read_unit(u, options)],
        schema=options.schema(),
    )
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


@pytest.fixture
def clean(tmp_path: Path) -> str:
    wal = str(tmp_path / "wal")
    write_file_wal(wal, records_of(kv_entries(6), per_record=2))
    return wal


def test_clean_log_at_every_level(clean: str) -> None:
    records = read(clean, "record")
    assert [(r["lsn"], r["dsn"], r["entry_index"], r["kind"]) for r in records] == [
        (1, 1, 0, "entry"), (1, 2, 1, "entry"), (2, 3, 0, "entry"), (2, 4, 1, "entry"),
        (3, 5, 0, "entry"), (3, 6, 1, "entry"),
    ]  # fmt: skip
    assert {r["record_start_dsn"] for r in records if r["lsn"] == 2} == {3}
    assert all(r["checksum_ok"] and r["replica"] == "file" and r["shard"] == 0 for r in records)
    entries = read(clean, "entry")
    assert [(e["dsn"], e["commit_ts"], e["n_catalog"], e["n_append"]) for e in entries] == [
        (1, 1000, 1, 0), (2, 1010, 1, 0), (3, 1020, 0, 1), (4, 1030, 0, 1), (5, 1040, 0, 1),
        (6, 1050, 0, 1),
    ]  # fmt: skip
    assert entries[2]["memo"] == [{"db_id": 1, "table_id": 2, "block_id": 1}]
    commands = read(clean, "command")
    assert [(c["dsn"], c["cmd_kind"], c["catalog_op"], c["name"]) for c in commands[:2]] == [
        (1, "catalog", "create", "db"), (2, "catalog", "create", "kv"),
    ]  # fmt: skip
    append = commands[2]
    assert append["infos"] == [{"block_id": 1, "offset": 0, "rows": 1}]
    assert pa.ipc.open_stream(append["batch_ipc"]).read_all().to_pylist() == [{"k": 0, "v": "v0"}]
    schema = schema_from_json(commands[1]["schema_json"])
    options = ReadOptions("rows", table_id=2, table_schema=schema)
    [unit] = list_units(file_input(clean))
    rows = pa.Table.from_batches(list(read_unit(unit, options))).to_pylist()
    assert [(r["dsn"], r["block_id"], r["offset"], r["k"], r["v"]) for r in rows] == [
        (3, 1, 0, 0, "v0"), (4, 1, 1, 1, "v1"), (5, 1, 2, 2, "v2"), (6, 1, 3, 3, "v3"),
    ]  # fmt: skip
    [segment] = read(clean, "segment")
    assert (segment["records"], segment["first_position"], segment["last_position"]) == (3, 1, 3)
    assert segment["end"] == "clean" and segment["size_bytes"] == os.path.getsize(unit.path)


def test_torn_tail_is_dropped_or_reported(clean: str) -> None:
    [unit] = list_units(file_input(clean))
    with open(unit.path, "r+b") as file:
        data = file.read()
        # Where the frames end: the segment is preallocated (format v3), zeros follow.
        written_end = wal_segment.read_segment_frames(data, unit.path, newest=True).end_offset
        assert written_end < unit.size_bytes
        file.seek(written_end)
        file.write(b"\x01\x02\x03 half a frame")
    assert [r["lsn"] for r in read(clean, "record")] == [1, 1, 2, 2, 3, 3]
    reported = read(clean, "record", "report")
    assert [(r["kind"], r["checksum_ok"]) for r in reported[-1:]] == [("torn_tail", False)]
    assert reported[-1]["offset_bytes"] == written_end  # where the garbage starts
    assert read(clean, "segment")[0]["end"] == "torn"


def test_bad_checksum_is_an_error_or_a_row(tmp_path: Path) -> None:
    wal = str(tmp_path / "wal")
    write_file_wal(wal, records_of(kv_entries(6), per_record=2))
    [unit] = list_units(file_input(wal))
    data = bytearray(Path(unit.path).read_bytes())
    frame_header = driver_limits.FILE_FRAME_HEADER_BYTES  # segment format v2
    second_frame = 32 + frame_header + int.from_bytes(data[32 + 8 : 32 + 12], "little")
    data[second_frame + 40] ^= 0x10  # inside the second frame's body
    data += b"\0" * 8 * 1024 * 1024  # far from the end: not a torn tail
    Path(unit.path).write_bytes(bytes(data))
    with pytest.raises(InputCorrupt) as raised:
        read(wal, "entry")
    assert raised.value.offset_bytes == second_frame and raised.value.path == unit.path
    reported = read(wal, "record", "report")
    assert [(r["kind"], r["lsn"]) for r in reported] == [
        ("entry", 1),
        ("entry", 1),
        ("corrupt", None),
    ]
    assert reported[-1]["error"].startswith("frame checksum mismatch; valid frames follow it")


def _torn_at_first_reads(
    monkeypatch: pytest.MonkeyPatch, path: str, reads_torn: int, header_too: bool = False
) -> list[int]:
    """`records.read_file` of the segment at `path`, its first `reads_torn` reads with the
    second frame's body zeroed from its 10th byte on (`header_too`: the whole frame) and the
    third frame whole: what a read copying the newest segment while a writer copies a group
    write in can see. Returns the list the reads are counted in."""
    from spark_jobs import records as records_module

    real = records_module.read_file
    data = Path(path).read_bytes()
    frames = wal_segment.read_segment_frames(data, path, newest=True).frames
    assert len(frames) >= 3
    lo = frames[1].offset + (0 if header_too else driver_limits.FILE_FRAME_HEADER_BYTES + 10)
    hi = frames[2].offset
    torn = data[:lo] + bytes(hi - lo) + data[hi:]
    reads: list[int] = []

    def read_file(at: str) -> bytes:
        if at != path:
            return real(at)
        reads.append(1)
        return torn if len(reads) <= reads_torn else real(at)

    monkeypatch.setattr(records_module, "read_file", read_file)
    return reads


def test_the_newest_segment_is_read_again_when_a_live_writer_was_copying_in(
    clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job beside a running engine: its read of the newest segment saw a frame half-
    written with a whole frame after it, which the segment rules call corruption. Read
    again, it is whole: not damage, and the job reads every record (as tae_driver's
    read-only look does, tests/unit/tae_driver/test_file_backend_v2.py)."""
    [unit] = list_units(file_input(clean))
    assert unit.newest
    reads = _torn_at_first_reads(monkeypatch, unit.path, reads_torn=1)
    rows = read(clean, "record", "report")  # "report": the per-record path, never the fast one
    assert [(r["kind"], r["lsn"]) for r in rows] == [("entry", lsn) for lsn in (1, 1, 2, 2, 3, 3)]
    assert len(reads) == 2


def test_damage_every_read_of_the_newest_segment_shows_is_reported(
    clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    [unit] = list_units(file_input(clean))
    reads = _torn_at_first_reads(monkeypatch, unit.path, reads_torn=99)
    rows = read(clean, "record", "report")
    assert [r["kind"] for r in rows] == ["entry", "entry", "corrupt"]
    assert rows[-1]["error"].startswith("frame checksum mismatch; valid frames follow it")
    assert len(reads) == LIVE_SEGMENT_READS_MAX


def test_the_inventory_reads_the_newest_segment_again_too(
    clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segment level (the inventory) beside a running engine: a first read that saw a
    write being copied in is read again, and the segment's end is what the second read
    says; damage every read shows is still its end. (The inventory walks frame headers
    without checksums: a torn header, seen as an early torn end, is what it can see.)"""
    [unit] = list_units(file_input(clean))
    reads = _torn_at_first_reads(monkeypatch, unit.path, reads_torn=1, header_too=True)
    [segment] = read(clean, "segment")
    assert (segment["end"], segment["records"], segment["last_position"]) == ("clean", 3, 3)
    assert len(reads) == 2
    reads.clear()
    reads = _torn_at_first_reads(monkeypatch, unit.path, reads_torn=99, header_too=True)
    [segment] = read(clean, "segment")
    assert segment["end"] == "torn" and segment["records"] == 1
    assert len(reads) == LIVE_SEGMENT_READS_MAX


def test_empty_segment(tmp_path: Path) -> None:
    wal = str(tmp_path / "wal")
    write_file_wal(wal, [])
    assert read(wal, "entry") == [] and read(wal, "command") == []
    [segment] = read(wal, "segment")
    assert (segment["records"], segment["end"], segment["last_position"]) == (0, "clean", 0)


def test_copies_skips_markers_and_truncation(tmp_path: Path) -> None:
    wal = str(tmp_path / "wal")
    entries = kv_entries(4)
    other = kv_entries(5, ts0=5000)[3]  # another transaction: a conflicting copy of DSN 4
    write_file_wal(
        wal,
        [
            encode_record(1, 0, entries[0:2]),  # LSN 1: DSNs 1-2
            encode_record(1, 0, entries[0:2]),  # LSN 2: a duplicate copy
            encode_record(3, 2, entries[2:3]),  # LSN 3: DSN 3
            encode_record(4, 3, entries[3:4]),  # LSN 4: DSN 4
            encode_record(4, 3, [other]),  # LSN 5: DSN 4 again, other bytes
            encode_skip([(4, 5)]),  # LSN 6: discards LSN 5's copy
            encode_record(5, 4, []),  # LSN 7: a safe marker
        ],
        truncate_lsn=1,
    )
    rows = read(wal, "record")
    summary = [(r["lsn"], r["kind"], r["dsn"], r["skip_dsn"], r["skip_lsn"]) for r in rows]
    assert summary == [
        (1, "entry", 1, None, None), (1, "entry", 2, None, None), (2, "entry", 1, None, None),
        (2, "entry", 2, None, None), (3, "entry", 3, None, None), (4, "entry", 4, None, None),
        (5, "entry", 4, None, None), (6, "skip", None, 4, 5), (7, "marker", None, None, None),
        (1, "truncate", None, None, None),
    ]  # fmt: skip
    by_lsn = {r["lsn"]: r for r in rows if r["kind"] == "entry" and r["dsn"] == 4}
    assert by_lsn[4]["entry_checksum"] != by_lsn[5]["entry_checksum"]
    assert rows[0]["entry_checksum"] == rows[2]["entry_checksum"]
    assert rows[0]["record_checksum"] == rows[2]["record_checksum"]
    assert rows[-2]["safe_dsn"] == 4 and rows[-2]["record_start_dsn"] == 5
    assert isinstance(signed64(2**64 - 1), int) and signed64(2**64 - 1) == -1


def test_bounds_prune_units_and_rows(tmp_path: Path) -> None:
    wal = str(tmp_path / "wal")
    write_file_wal(wal, records_of(kv_entries(40)), segment_bytes_max=4096)
    units = list_units(file_input(wal))
    assert len(units) >= 3
    last_base = units[-1].lsn_lo
    bounds = Bounds().with_range("lsn", lo=last_base)
    assert [u for u in units if bounds.keeps_unit(u)] == [units[-1]]
    rows = read(wal, "record", bounds=bounds)
    assert rows and min(r["lsn"] for r in rows) == last_base
    dsn_rows = read(wal, "entry", bounds=Bounds().with_range("dsn", lo=10, hi=12))
    assert [r["dsn"] for r in dsn_rows] == [10, 11, 12]
    ts_rows = read(wal, "command", bounds=Bounds().with_range("commit_ts", hi=1030))
    assert sorted({r["commit_ts"] for r in ts_rows}) == [1000, 1010, 1020, 1030]
    assert read(wal, "record", bounds=Bounds().with_shards(frozenset({5}))) == []
    assert not Bounds(replicas=frozenset({"n1"})).keeps_unit(units[0])
