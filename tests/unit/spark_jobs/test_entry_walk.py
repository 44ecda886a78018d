"""spark_jobs/entries.py reads entries straight from the driver records' bodies (issue 23: no
bytes object per entry; the size prefixes of a chunk's records walked at once): it must give
what reading record by record and entry by entry gives - `tae_driver.record.decode` splitting
each record, `decode_entry` on each entry - on logs of random records (0 to 50 entries, one
to many per chunk) holding valid entries, damaged entries (a flipped byte) and records whose
body does not parse behind a valid record checksum (a size prefix changed, bytes added or
cut, resealed): the same entries with the same DSNs and LSNs, the same damage skipped
(verify `report`), and the same first error, by path, offset and message (verify `true`),
under DSN bounds too.
"""

from __future__ import annotations

import os
import random
import struct
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import WalCorruption
from engine.wal.batch import KIND_DAMAGED
from engine.wal.codec import decode_entry
from spark_jobs import entries, local
from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Range
from spark_jobs.inputs import file_input, list_units
from spark_jobs.jobs import JobParams
from spark_jobs.records import driver_records
from tae_driver.errors import CorruptRecord
from tae_driver.record import EntriesRecord, decode, encode_record
from tests.unit.spark_jobs.logs import kv_entries, write_file_wal

Row = tuple[int, int, object]


def _reseal(payload: bytearray) -> bytes:
    """A driver record's length and checksum made valid again over damaged bytes."""
    payload[16:20] = struct.pack("<I", len(payload))
    payload[0:8] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(payload[8:])))
    return bytes(payload)


def _bad_body(rng: random.Random, record: bytes, count: int, how: int | None = None) -> bytes:
    """`record` with a body that no longer parses to `count` entries, resealed (`how`: which
    damage; random when None)."""
    data = bytearray(record)
    if how is None:
        how = rng.randrange(4) if count else 3
    if how == 0:  # an entry's size prefix made larger than what follows
        at = 40
        for _ in range(rng.randrange(count)):
            at += 4 + struct.unpack_from("<I", data, at)[0]
        data[at : at + 4] = struct.pack("<I", len(data) - at + rng.randrange(1, 2**20))
    elif how == 1:  # a size prefix made smaller: trailing bytes or a later entry runs past
        at = 40
        for _ in range(rng.randrange(count)):
            at += 4 + struct.unpack_from("<I", data, at)[0]
        (size,) = struct.unpack_from("<I", data, at)
        data[at : at + 4] = struct.pack("<I", max(0, size - rng.randrange(1, 9)))
    elif how == 2:  # cut inside the body (maybe inside a size prefix)
        del data[rng.randrange(41, len(data)) :]
    else:  # bytes added at the end
        data += bytes(rng.randrange(1, 6))
    return _reseal(data)


def _log(rng: random.Random, wal: str) -> None:
    valid = kv_entries(400)
    records = []
    dsn = 1
    for _ in range(rng.randrange(1, 30)):
        count = rng.choice([0, 1, 2, 7, 50, rng.randrange(51)])
        batch = []
        for _ in range(count):
            roll = rng.random()
            if roll < 0.04:  # a flipped byte: decode_entry refuses it (checksum, or a field)
                damaged = bytearray(rng.choice(valid))
                damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
                batch.append(bytes(damaged))
            elif roll < 0.06:
                batch.append(bytes(rng.randrange(256) for _ in range(rng.randrange(30))))
            else:
                batch.append(rng.choice(valid))
        record = encode_record(dsn, dsn - 1, batch)
        if rng.random() < 0.05:
            record = _bad_body(rng, record, count)
        records.append(record)
        dsn += max(count, 1) if rng.random() < 0.9 else 0
    write_file_wal(wal, records)


def _by_record(unit: object, verify: str, dsns: Range) -> list[Row]:
    """What reading record by record, entry by entry gives (the first damage raised unless
    verify is `report`)."""
    rows: list[Row] = []
    for found in driver_records(unit, verify, Range()):  # type: ignore[arg-type]
        decoded = found.decoded
        if not isinstance(decoded, EntriesRecord):
            continue
        assert found.rec.lsn is not None
        for index, payload in enumerate(decoded.entries):
            dsn = decoded.start_dsn + index
            if not dsns.holds(dsn):
                continue
            try:
                entry: object = decode_entry(payload, dsn)
            except WalCorruption as exc:
                if verify != "report":
                    path = unit.path  # type: ignore[attr-defined]
                    raise InputCorrupt(path, found.rec.offset_bytes, str(exc)) from None
                entry = str(exc)
            rows.append((found.rec.lsn, dsn, entry))
    return rows


def _by_chunk(unit: object, verify: str, dsns: Range) -> list[Row]:
    rows: list[Row] = []
    for chunk in entries.entry_chunks(unit, verify, Range(), dsns):  # type: ignore[arg-type]
        decoded = chunk.decoded
        for index in range(len(decoded)):
            if decoded.kinds[index] == KIND_DAMAGED:
                entry: object = str(decoded.errors[index])
            else:
                entry = decoded.entry(index)
            rows.append((int(chunk.lsns[index]), int(decoded.dsns[index]), entry))
    return rows


def _outcome(read: object, unit: object, verify: str, dsns: Range) -> object:
    try:
        return read(unit, verify, dsns)  # type: ignore[operator]
    except InputCorrupt as exc:
        return ("raised", exc.path, exc.offset_bytes, exc.reason)


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 120))
def test_entries_read_from_bodies_are_those_read_one_by_one(
    rng: random.Random, chunk_entries: int
) -> None:
    with tempfile.TemporaryDirectory() as base:
        wal = os.path.join(base, "wal")
        _log(rng, wal)
        (unit,) = list_units(file_input(wal))
        lo = rng.choice([None, rng.randrange(1, 200)])
        hi = rng.choice([None, rng.randrange(1, 400)])
        with mock.patch.object(entries, "CHUNK_ENTRIES_MAX", chunk_entries):
            for verify in ("true", "report"):
                for dsns in (Range(), Range(lo, hi)):
                    expected = _outcome(_by_record, unit, verify, dsns)
                    found = _outcome(_by_chunk, unit, verify, dsns)
                    assert found == expected, (verify, dsns)


@pytest.mark.parametrize("how", range(4))
def test_a_body_that_does_not_parse_is_named_as_decode_names_it(tmp_path: Path, how: int) -> None:
    """Each kind of bad body, in the middle of a chunk of good records: the error is the
    record's own (`driver record at LSN 5: body ...`), after the entries before it."""
    valid = kv_entries(50)
    records = [encode_record(1 + 5 * i, 5 * i, valid[5 * i : 5 * i + 5]) for i in range(10)]
    records[4] = _bad_body(random.Random(how), records[4], 5, how)
    with pytest.raises(CorruptRecord, match="body"):
        decode(records[4])
    wal = str(tmp_path / "wal")
    write_file_wal(wal, records)
    (unit,) = list_units(file_input(wal))
    expected = _outcome(_by_record, unit, "true", Range())
    assert isinstance(expected, tuple) and expected[3].startswith("driver record at LSN 5: ")
    assert _outcome(_by_chunk, unit, "true", Range()) == expected


def test_replay_names_an_entry_sealed_damaged_and_a_body_that_does_not_parse(
    tmp_path: Path,
) -> None:
    """replay_as_of (local engine) on a clean log of 120 one-row inserts, then with one entry
    whose own checksum fails inside a valid record (damaged before the driver sealed it:
    only the entry's checksum can see it), then with one record whose body does not parse:
    each is `InputCorrupt` naming its record's offset, with the message of the record by
    record reader, never rows."""
    valid = kv_entries(120)
    clean = str(tmp_path / "clean")
    write_file_wal(
        clean, [encode_record(1 + 10 * i, 10 * i, valid[10 * i : 10 * i + 10]) for i in range(12)]
    )
    rows = local.run(JobParams("replay_as_of", file_input(clean), as_of=2**62)).tables
    assert sum(t.num_rows for t in rows.values()) == 118

    damaged = list(valid)
    flipped = bytearray(damaged[57])
    flipped[-1] ^= 0x40
    damaged[57] = bytes(flipped)
    sealed = str(tmp_path / "sealed")
    write_file_wal(
        sealed,
        [encode_record(1 + 10 * i, 10 * i, damaged[10 * i : 10 * i + 10]) for i in range(12)],
    )
    with pytest.raises(InputCorrupt, match="DSN 58: checksum mismatch") as raised:
        local.run(JobParams("replay_as_of", file_input(sealed), as_of=2**62))
    (unit,) = list_units(file_input(sealed))
    assert _outcome(_by_record, unit, "true", Range()) == (
        "raised",
        raised.value.path,
        raised.value.offset_bytes,
        raised.value.reason,
    )

    records = [encode_record(1 + 10 * i, 10 * i, valid[10 * i : 10 * i + 10]) for i in range(12)]
    records[7] = _bad_body(random.Random(1), records[7], 10, 0)
    body = str(tmp_path / "body")
    write_file_wal(body, records)
    with pytest.raises(InputCorrupt, match="driver record at LSN 8: body") as raised:
        local.run(JobParams("replay_as_of", file_input(body), as_of=2**62))
    (unit,) = list_units(file_input(body))
    assert _outcome(_by_record, unit, "true", Range()) == (
        "raised",
        raised.value.path,
        raised.value.offset_bytes,
        raised.value.reason,
    )


def test_the_walk_reads_a_last_size_prefix_at_the_end_of_the_data() -> None:
    """The walk reads size prefixes in the chunk's own bytes (no padded copy): a record
    whose last entry is empty ends the data with its size prefix, and parses; one whose last
    prefix is cut by the data's end does not."""
    header = bytes(40)
    whole = header + struct.pack("<I", 3) + b"abc" + struct.pack("<I", 0)
    cut = header + struct.pack("<I", 3) + b"abc" + b"\x00\x00"
    for data, parses in ((whole, True), (cut, False)):
        starts, ends, parsed = entries._walk(
            data,
            np.array([0], dtype=np.int64),
            np.array([len(data)], dtype=np.int64),
            np.array([2], dtype=np.int64),
            np.array([0, 0], dtype=np.int64),
            np.array([0, 1], dtype=np.int64),
        )
        assert parsed.tolist() == [parses]
        if parses:
            assert (starts.tolist(), ends.tolist()) == ([44, 51], [47, 51])
