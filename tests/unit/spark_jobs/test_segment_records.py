"""A file segment read whole (spark_jobs/walread_segments.py: its frames and driver records
checked many at a time, issue 23) must give what reading it record by record gives
(`records.driver_records`, today's path): on random logs - records of 0 to 50 entries, safe
markers, skip records, truncations, several segments, resealed records holding a damaged
entry or a body that does not parse - with damage anywhere (a flipped byte, a cut tail,
bytes added after the end), under LSN and DSN bounds, with verify `true` and `false`: the
same chunks, the same entries with the same DSNs and LSNs, the same records shown to the
replay plan, the same count of records decoded, or the same first error (path, offset,
message). With verify `true` a flipped byte anywhere in the written frames is an error.
"""

from __future__ import annotations

import os
import random
import struct
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.wal.batch import KIND_DAMAGED
from spark_jobs import entries, local
from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Range
from spark_jobs.inputs import Unit, file_input, list_units
from spark_jobs.jobs import JobParams
from spark_jobs.records import DECODES, DriverRecord, read_file, record_fields
from spark_jobs.walread_segments import SegmentRecords, segment_records
from tae_driver.backends.segment import read_segment_frames
from tae_driver.record import encode_record, encode_skip
from tests.unit.spark_jobs.logs import kv_entries, segmented_kv_wal, write_file_wal


class _Seen:
    """What the replay plan is shown, by either path, as comparable tuples."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []

    def add_record(self, found: DriverRecord) -> None:
        fields = record_fields(found)
        self.records.append((found.rec.lsn, *fields))

    def add_records(self, found: SegmentRecords) -> None:
        for i in range(len(found)):
            count = int(found.counts[i])
            self.records.append(
                (
                    int(found.lsns[i]),
                    "entry" if count else "marker",
                    int(found.start_dsns[i]),
                    count,
                    int(found.safe_dsns[i]),
                    int(found.checksums[i]),
                    (),
                    None,
                )
            )
        for lsn in found.truncate_lsns.tolist():
            self.records.append((lsn, "truncate", None, None, None, None, (), None))


def _read(unit: Unit, verify: str, lsns: Range, dsns: Range) -> object:
    seen = _Seen()
    decodes = DECODES.total
    chunks: list[tuple[int, int]] = []
    rows: list[tuple[int, int, object]] = []
    try:
        for chunk in entries.entry_chunks(unit, verify, lsns, dsns, seen):
            decoded = chunk.decoded
            chunks.append((int(chunk.lsns[0]), len(decoded)))
            for index in range(len(decoded)):
                if decoded.kinds[index] == KIND_DAMAGED:
                    entry: object = str(decoded.errors[index])
                else:
                    entry = decoded.entry(index)
                record = chunk.record(index)
                assert record.payload is not None and record.lsn == int(chunk.lsns[index])
                payload = chunk.payload(index)
                assert payload in record.payload
                rows.append((int(chunk.lsns[index]), int(decoded.dsns[index]), entry))
    except InputCorrupt as exc:
        return ("raised", exc.path, exc.offset_bytes, exc.reason)
    order = sorted(seen.records, key=repr)
    return (chunks, rows, order, DECODES.total - decodes)


def _per_record(unit: Unit, verify: str, lsns: Range, dsns: Range) -> object:
    with mock.patch.object(entries, "_segment_records", return_value=None):
        return _read(unit, verify, lsns, dsns)


def _reseal(payload: bytearray) -> bytes:
    payload[16:20] = struct.pack("<I", len(payload))
    payload[0:8] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(payload[8:])))
    return bytes(payload)


def _log(rng: random.Random, wal: str) -> None:
    valid = kv_entries(300)
    records = []
    dsn = 1
    skips = rng.random() < 0.2  # a skip record sends its segment the per-record way
    for _ in range(rng.randrange(1, 40)):
        if skips and rng.random() < 0.1:
            records.append(encode_skip([(rng.randrange(1, dsn + 1), rng.randrange(1, 50))]))
            continue
        count = rng.choice([0, 1, 3, 50, rng.randrange(51)])
        batch = [rng.choice(valid) for _ in range(count)]
        if count and rng.random() < 0.1:  # an entry damaged before the record was sealed
            at = rng.randrange(count)
            damaged = bytearray(batch[at])
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
            batch[at] = bytes(damaged)
        record = encode_record(dsn, dsn - 1, batch)
        if rng.random() < 0.04:  # a body that does not parse behind a valid checksum
            record = _reseal(bytearray(record) + bytes(rng.randrange(1, 6)))
        records.append(record)
        dsn += max(count, 1)
    truncate = rng.choice([None, None, rng.randrange(1, len(records) + 1)])
    segment_bytes = rng.choice([None, 4096, 20000])
    write_file_wal(wal, records, truncate_lsn=truncate, segment_bytes_max=segment_bytes)


def _damage(rng: random.Random, units: list[Unit]) -> tuple[str, int | None]:
    """Damage one segment file; the flipped byte's offset when it lies in written frames."""
    unit = rng.choice(units)
    data = bytearray(read_file(unit.path))
    written = read_segment_frames(bytes(data), unit.path, newest=unit.newest).end_offset
    how = rng.randrange(4)
    inside = None
    if how == 0:
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
        inside = at if at < written else None
    elif how == 1:
        at = rng.randrange(min(64, written))
        data[at] ^= 1 << rng.randrange(8)
        inside = at
    elif how == 2:
        del data[rng.randrange(len(data)) :]
    else:
        data[written:written] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
    with open(unit.path, "wb") as file:
        file.write(data)
    return unit.path, inside


@settings(max_examples=60, deadline=None)
@given(
    st.randoms(use_true_random=False),
    st.sampled_from([1, 3, 50, 51, 120, entries.CHUNK_ENTRIES_MAX]),
    st.sampled_from([1, 500, 5000, entries.CHUNK_BYTES_MAX]),
    st.booleans(),
)
def test_a_segment_read_whole_gives_what_reading_record_by_record_gives(
    rng: random.Random, chunk_entries: int, chunk_bytes: int, damaged: bool
) -> None:
    with tempfile.TemporaryDirectory() as base:
        wal = os.path.join(base, "wal")
        _log(rng, wal)
        units = list_units(file_input(wal))
        flipped = _damage(rng, units) if damaged else (None, None)
        lsns = rng.choice([Range(), Range(rng.randrange(1, 20), rng.choice([None, 30]))])
        dsns = rng.choice([Range(), Range(rng.randrange(1, 200), rng.randrange(1, 400))])
        with (
            mock.patch.object(entries, "CHUNK_ENTRIES_MAX", chunk_entries),
            mock.patch.object(entries, "CHUNK_BYTES_MAX", chunk_bytes),
        ):
            for unit in units:
                for verify in ("true", "false"):
                    expected = _per_record(unit, verify, lsns, dsns)
                    assert _read(unit, verify, lsns, dsns) == expected, (unit.segment, verify)
                    if verify == "true" and flipped == (unit.path, flipped[1]) and flipped[1]:
                        assert isinstance(expected, tuple) and expected[0] == "raised"


def test_a_clean_log_is_read_segment_by_segment_and_damage_falls_back(tmp_path: Path) -> None:
    """The segment path is what reads a clean log (every segment, none record by record);
    a flipped byte in a record makes that segment go the per-record way, which names it."""
    wal = str(tmp_path / "wal")
    segmented_kv_wal(wal)
    units = list_units(file_input(wal))
    assert len(units) > 2
    for unit in units:
        assert segment_records(unit, read_file(unit.path), "true", Range()) is not None
    with mock.patch.object(
        entries, "_record_chunks", side_effect=AssertionError("read record by record")
    ):
        tables = local.run(JobParams("replay_as_of", file_input(wal), as_of=2**62)).tables
    assert sum(t.num_rows for t in tables.values()) == 398

    unit = units[1]
    data = bytearray(read_file(unit.path))
    frames = read_segment_frames(bytes(data), unit.path, newest=unit.newest)
    target = frames.frames[2]
    data[target.offset + 100] ^= 0x10
    Path(unit.path).write_bytes(bytes(data))
    assert segment_records(unit, bytes(data), "true", Range()) is None
    with pytest.raises(InputCorrupt, match="frame checksum mismatch") as raised:
        local.run(JobParams("replay_as_of", file_input(wal), as_of=2**62))
    assert raised.value.path == unit.path
    assert raised.value.offset_bytes == target.offset


@pytest.mark.parametrize(
    ("chunk_entries", "chunk_bytes"), [(1, 2**30), (2, 2**30), (4, 2**30), (2**30, 1), (2**30, 400)]
)
def test_chunks_are_cut_where_the_per_record_path_cuts_them(
    tmp_path: Path, chunk_entries: int, chunk_bytes: int
) -> None:
    """Records of 0 to 3 entries against bounds they reach exactly: the same chunks."""
    valid = kv_entries(80)
    records, dsn = [], 1
    for count in [1, 0, 1, 2, 0, 0, 3, 1, 1, 0, 2, 2, 3, 0, 1] * 2:
        records.append(encode_record(dsn, dsn - 1, valid[dsn - 1 : dsn - 1 + count]))
        dsn += max(count, 1)
    wal = str(tmp_path / "wal")
    write_file_wal(wal, records)
    (unit,) = list_units(file_input(wal))
    with (
        mock.patch.object(entries, "CHUNK_ENTRIES_MAX", chunk_entries),
        mock.patch.object(entries, "CHUNK_BYTES_MAX", chunk_bytes),
    ):
        found = _read(unit, "true", Range(), Range())
        assert found == _per_record(unit, "true", Range(), Range())
    assert isinstance(found, tuple) and len(found[0]) > 1
