"""Segment files read into a reused buffer (spark_jobs/segment_buffers.py, issue 23) give
what `read_file` gives, and nothing a reader keeps depends on the buffer after its lease:
chunks held while later segments are read into the same buffer still name their records'
payloads; a file that grows while it is read is read to its end; two leases at once get two
buffers; a file that cannot be read is `InputCorrupt` naming it, as before; one idle buffer
is kept, up to its bound.
"""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from spark_jobs import entries, segment_buffers
from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Range
from spark_jobs.inputs import file_input, list_units
from spark_jobs.records import read_file
from spark_jobs.segment_buffers import SegmentBuffers
from tests.unit.spark_jobs.logs import segmented_kv_wal


def test_a_lease_gives_the_file_bytes_and_reuses_its_buffer(tmp_path: Path) -> None:
    pool = SegmentBuffers()
    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(os.urandom(5000))
    small.write_bytes(os.urandom(300))
    with pool.lease(str(big)) as data:
        assert bytes(data) == big.read_bytes()
        assert data.readonly
        first = data.obj
    with pool.lease(str(small)) as data:
        assert bytes(data) == small.read_bytes()
        assert data.obj is first  # the same buffer, read into again
    bigger = tmp_path / "bigger"  # a later segment a little past the first one's size
    bigger.write_bytes(os.urandom(5000 + 2**20))
    with pool.lease(str(bigger)) as data:
        assert bytes(data) == bigger.read_bytes()
        assert data.obj is first
    with pool.lease(str(big)) as outer, pool.lease(str(small)) as inner:
        assert outer.obj is not inner.obj  # interleaved readers: a buffer each
        assert bytes(outer) == big.read_bytes() and bytes(inner) == small.read_bytes()
    assert len(pool._idle) == 1


def test_a_buffer_over_the_bound_is_not_kept(tmp_path: Path) -> None:
    pool = SegmentBuffers()
    path = tmp_path / "seg"
    path.write_bytes(b"x" * 100)
    with (
        mock.patch.object(segment_buffers, "SEGMENT_BUFFER_BYTES_MAX", 50),
        pool.lease(str(path)) as data,
    ):
        assert bytes(data) == b"x" * 100
    assert pool._idle == []


def test_a_file_that_grows_while_read_is_read_to_its_end(tmp_path: Path) -> None:
    path = tmp_path / "seg"
    path.write_bytes(b"a" * 1000)
    real_fstat = os.fstat

    def stale_fstat(fd: int) -> os.stat_result:  # the size at open, before an append
        found = real_fstat(fd)
        return os.stat_result((*found[:6], 10, *found[7:]))

    with (
        mock.patch("spark_jobs.segment_buffers.os.fstat", stale_fstat),
        SegmentBuffers().lease(str(path)) as data,
    ):
        assert bytes(data) == b"a" * 1000


def test_a_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with (
        pytest.raises(InputCorrupt, match="cannot read") as raised,
        SegmentBuffers().lease(str(tmp_path)),  # a directory
    ):
        pass
    assert raised.value.path == str(tmp_path) and raised.value.offset_bytes == 0


def test_chunks_kept_past_their_segment_still_name_their_records(tmp_path: Path) -> None:
    """Every chunk of every segment held at once (each later segment read into the same
    buffer): each entry's payload and its record's payload are the file's bytes."""
    wal = str(tmp_path / "wal")
    segmented_kv_wal(wal)
    units = list_units(file_input(wal))
    assert len(units) > 2
    held = [
        (unit, chunk)
        for unit in units
        for chunk in entries.entry_chunks(unit, "true", Range(), Range())
    ]
    assert len({unit.segment for unit, _ in held}) > 2
    for unit, chunk in held:
        data = read_file(unit.path)
        for index in range(len(chunk.decoded)):
            record = chunk.record(index)
            assert record.payload is not None
            start = record.offset_bytes + 32  # the frame header, then the record
            assert data[start : start + len(record.payload)] == record.payload
            assert chunk.payload(index) in record.payload
