"""The levels read many entries at a time (spark_jobs/entries.py over engine.wal.batch) give the
rows the entry-by-entry readers give: the command level with `batches=false` (one-append
transactions built in columns) equals the command level with batches minus its re-encoded
batches, on a real engine's log (catalog commands, large and small appends, updates, deletes,
drops) and on a log of one-row inserts cut into small chunks, whole and under DSN, LSN and
commit_ts bounds; a damaged entry is named as before (verify true) or skipped (report).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from spark_jobs import entries
from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Bounds
from spark_jobs.inputs import file_input, list_units
from spark_jobs.walread import LEVEL_COMMAND, ReadOptions, read_unit
from tests.unit.spark_jobs.logs import engine_history, kv_entries, records_of, write_file_wal


def _read(wal: str, batches: bool, verify: str = "true", bounds: Bounds | None = None) -> pa.Table:
    options = ReadOptions(LEVEL_COMMAND, verify, bounds or Bounds(), batches=batches)
    units = list_units(file_input(wal))
    return pa.Table.from_batches(
        [b for u in units for b in read_unit(u, options)], schema=options.schema()
    )


def _without_batches(table: pa.Table) -> pa.Table:
    """What `batches=false` leaves null: an append's batch and its size."""
    appends = pc.equal(table.column("cmd_kind"), "append")
    for name in ("batch_ipc", "cmd_bytes"):
        index = table.schema.get_field_index(name)
        column = pc.if_else(appends, pa.scalar(None, table.schema.field(name).type), table[name])
        table = table.set_column(index, name, column)
    return table


def _same(wal: str, bounds: Bounds | None = None) -> int:
    columnar = _read(wal, batches=False, bounds=bounds)
    one_by_one = _without_batches(_read(wal, batches=True, bounds=bounds))
    assert columnar.to_pylist() == one_by_one.to_pylist()
    rows: int = columnar.num_rows
    return rows


def test_a_real_engines_log(tmp_path: Path) -> None:
    history = engine_history(str(tmp_path / "engine"), big_rows=300)
    wal = history.path
    assert _same(wal) >= 15
    ts = history.timestamps
    assert _same(wal, Bounds().with_range("commit_ts", lo=ts[3], hi=ts[-3])) >= 5


def test_one_row_inserts_in_small_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entries, "CHUNK_ENTRIES_MAX", 7)
    wal = str(tmp_path / "wal")
    write_file_wal(wal, records_of(kv_entries(60), per_record=5))
    assert _same(wal) == 60
    assert _same(wal, Bounds().with_range("dsn", lo=9, hi=33)) == 25
    assert _same(wal, Bounds().with_range("lsn", lo=3, hi=6)) == 20
    kinds = _read(wal, batches=False).column("cmd_kind").to_pylist()
    assert kinds.count("append") == 58


def test_a_damaged_entry_is_named_or_skipped(tmp_path: Path) -> None:
    wal = str(tmp_path / "wal")
    payloads = kv_entries(30)
    damaged = bytearray(payloads[17])
    damaged[-1] ^= 0x01  # the checksum no longer matches
    payloads[17] = bytes(damaged)
    write_file_wal(wal, records_of(payloads, per_record=4))
    with pytest.raises(InputCorrupt, match="DSN 18: checksum mismatch"):
        _read(wal, batches=False)
    with pytest.raises(InputCorrupt, match="DSN 18: checksum mismatch"):
        _read(wal, batches=True)
    reported = _read(wal, batches=False, verify="report")
    assert 18 not in reported.column("dsn").to_pylist()
    assert reported.num_rows == 29
    assert reported.to_pylist() == _without_batches(_read(wal, True, "report")).to_pylist()
