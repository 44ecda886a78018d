"""Zero-ahead (logsvc/store/FORMAT.md "Zero-ahead"): the syncs of a lone writer overwrite
zeros written ahead instead of growing the segment file, and nothing else changes.

Over FaultFS (file lengths and durable bytes visible) and real files: the file grows only
at the syncs that also write the zeros (the old store grew it at every sync: that growth
is what makes ext4's fdatasync commit its journal); the zeros are never part of the log
(reads, a reopen, a sealed segment, a clean close); a kill leaves them and the next open
cuts them without calling them a torn tail; a power loss in every mode loses no synced
entry; the limits disable it and are validated.
"""

from __future__ import annotations

import itertools
import os
import random

import pytest

from logsvc.store import Entry, ShardStore, StoreLimits, records
from logsvc.store.fs import OsFileSystem
from tests.support.faultfs import POWER_LOSS_MODES, FaultFS, PowerLossMode

DIR = "/store"
KIB = 1024
DEFAULTS = StoreLimits()


def entry(index: int, size: int = 100) -> Entry:
    return Entry(index, 1, bytes([index % 251]) * size)


def newest_segment(fs: FaultFS, dir_path: str = DIR) -> str:
    names = [n for n in fs.listdir(dir_path) if n.endswith(".seg")]
    return f"{dir_path}/{names[-1]}"


def records_end(data: bytes, first_index: int, newest: bool = True) -> int:
    scan = records.scan_segment(
        data, first_index, newest=newest, payload_bytes_max=DEFAULTS.record_payload_bytes_max
    )
    return scan.end_bytes


def test_a_lone_writer_grows_the_segment_file_once_for_many_synced_appends() -> None:
    fs = FaultFS()
    limits = StoreLimits(zero_ahead_bytes_min=64 * KIB)
    store = ShardStore.open(DIR, fs=fs, limits=limits, background_sync=False)
    lengths: list[int] = []
    for index in range(1, 201):
        store.append([entry(index)])
        store.sync()
        lengths.append(fs.file_size(newest_segment(fs)))
    growths = sum(1 for before, after in itertools.pairwise(lengths) if after > before)
    # 200 records of 140 bytes fit in the 64 KiB of zeros the first sync wrote: the file
    # grew at that sync only (the old store grew it at all 200).
    assert growths == 0
    data = fs.durable_content(newest_segment(fs))
    end = records_end(data, 1)
    first_end = records.SEGMENT_HEADER_BYTES + records.RECORD_HEADER_BYTES + 100
    assert len(data) == first_end + 64 * KIB > end
    assert data[end:] == bytes(len(data) - end)
    assert [e.index for e in store.read(1, 201, 1 << 30)] == list(range(1, 201))
    store.close()


def test_the_zeros_grow_with_the_segment_and_stop_at_its_limits() -> None:
    fs = FaultFS()
    limits = StoreLimits(
        segment_bytes_max=1024 * KIB, zero_ahead_bytes_min=64 * KIB, zero_ahead_bytes_max=256 * KIB
    )
    store = ShardStore.open(DIR, fs=fs, limits=limits, background_sync=False)
    sizes: list[tuple[int, int]] = []  # (records end, file length) after each growth
    last_length = 0
    for index in range(1, 1501):
        store.append([entry(index, 400)])
        store.sync()
        length = fs.file_size(newest_segment(fs))
        if length != last_length:
            data = fs.content(newest_segment(fs))
            sizes.append((records_end(data, 1), length))
            last_length = length
    ahead = [length - end for end, length in sizes]
    # As many zeros as the segment holds, at least 64 KiB, at most 256 KiB...
    assert len(ahead) == 5
    assert ahead[0] == 64 * KIB
    assert ahead[-2:] == [256 * KIB, 256 * KIB]
    expected = [min(max(64 * KIB, end), 256 * KIB) for end, _ in sizes]
    assert ahead == expected
    store.close()
    # ...and never past the segment's size limit: every sealed segment ends at its records.
    for name in [n for n in fs.listdir(DIR) if n.endswith(".seg")]:
        data = fs.content(f"{DIR}/{name}")
        assert len(data) <= limits.segment_bytes_max
        assert records_end(data, int(name[:20]), newest=False) == len(data)


@pytest.mark.parametrize("segment_bytes_max", [2048, 64 * KIB])
def test_sealed_segments_and_a_clean_close_end_at_the_last_record(segment_bytes_max: int) -> None:
    fs = FaultFS()
    limits = StoreLimits(segment_bytes_max=segment_bytes_max, write_buffer_bytes_max=1024)
    store = ShardStore.open(DIR, fs=fs, limits=limits, background_sync=False)
    for index in range(1, 1001):
        store.append([entry(index)])
        if index % 3 == 0:
            store.sync()
    store.close()
    names = [n for n in fs.listdir(DIR) if n.endswith(".seg")]
    assert len(names) > 1
    for position, name in enumerate(names):
        data = fs.durable_content(f"{DIR}/{name}")
        newest = position == len(names) - 1
        assert records_end(data, int(name[:20]), newest=newest) == len(data), name
    with ShardStore.open(DIR, fs=fs, limits=limits) as reopened:
        report = reopened.stats().recovery
        assert (report.torn_reason, report.zero_tail_bytes_cut) == (None, 0)
        assert [e.index for e in reopened.read(1, 1001, 1 << 30)] == list(range(1, 1001))


def test_a_kill_leaves_the_zeros_and_the_next_open_cuts_them_quietly() -> None:
    fs = FaultFS()
    store = ShardStore.open(DIR, fs=fs, limits=DEFAULTS, background_sync=False)
    store.append([entry(i) for i in range(1, 11)])
    store.sync()
    zeros = fs.file_size(newest_segment(fs)) - records_end(fs.content(newest_segment(fs)), 1)
    assert zeros == DEFAULTS.zero_ahead_bytes_min
    store.abandon()
    fs.crash()
    reopened = ShardStore.open(DIR, fs=fs, limits=DEFAULTS, background_sync=False)
    report = reopened.stats().recovery
    assert (report.torn_reason, report.torn_tail_bytes_cut) == (None, 0)
    assert report.zero_tail_bytes_cut == zeros
    assert fs.file_size(newest_segment(fs)) == records_end(fs.content(newest_segment(fs)), 1)
    # Appends go on at the records' end, and zero-ahead starts again.
    reopened.append([entry(11)])
    reopened.sync()
    assert [e.index for e in reopened.read(1, 12, 1 << 30)] == list(range(1, 12))
    assert fs.file_size(newest_segment(fs)) > records_end(fs.content(newest_segment(fs)), 1)
    reopened.close()


@pytest.mark.parametrize("mode", POWER_LOSS_MODES)
@pytest.mark.parametrize("seed", range(12))
def test_a_power_loss_over_zero_ahead_space_keeps_every_synced_entry(
    mode: PowerLossMode, seed: int
) -> None:
    rng = random.Random(seed)
    fs = FaultFS(rng=random.Random(seed))
    limits = StoreLimits(segment_bytes_max=8 * KIB, zero_ahead_bytes_min=1 * KIB)
    store = ShardStore.open(DIR, fs=fs, limits=limits, background_sync=False)
    synced = 0
    index = 0
    for _ in range(rng.randint(5, 120)):
        count = rng.randint(1, 4)
        store.append([entry(index + k + 1, rng.randint(0, 300)) for k in range(count)])
        index += count
        if rng.random() < 0.7:
            synced = store.sync()
    fs.power_loss(mode, rng)
    with ShardStore.open(DIR, fs=fs, limits=limits) as reopened:
        assert synced <= reopened.last_index <= index
        kept = reopened.read(1, reopened.last_index + 1, 1 << 30)
        assert kept == [entry(e.index, len(e.payload)) for e in kept]
        assert [e.index for e in kept] == list(range(1, reopened.last_index + 1))


def test_zero_ahead_off_grows_the_file_at_every_sync_as_before() -> None:
    fs = FaultFS()
    limits = StoreLimits(zero_ahead_bytes_min=0, zero_ahead_bytes_max=0)
    store = ShardStore.open(DIR, fs=fs, limits=limits, background_sync=False)
    for index in range(1, 21):
        store.append([entry(index)])
        store.sync()
        data = fs.content(newest_segment(fs))
        assert records_end(data, 1) == len(data)
    store.close()


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="zero_ahead_bytes_min"):
        StoreLimits(zero_ahead_bytes_min=2 * KIB, zero_ahead_bytes_max=1 * KIB).validate()
    with pytest.raises(ValueError, match="zero_ahead_bytes_max"):
        StoreLimits(zero_ahead_bytes_max=-1).validate()


def test_real_files_overwrite_the_zeros_in_place(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "f")
    handle = OsFileSystem().open_write(path, create=True)
    try:
        handle.write(b"abc")
        handle.write_zeros(4096)
        assert (handle.size(), handle.allocated_bytes(), os.path.getsize(path)) == (3, 4096, 4096)
        handle.write(b"defg")
        handle.fdatasync()
        assert (handle.size(), os.path.getsize(path)) == (7, 4096)
        with open(path, "rb") as f:
            assert f.read() == b"abcdefg" + bytes(4096 - 7)
        handle.truncate(5)
        assert (handle.size(), handle.allocated_bytes(), os.path.getsize(path)) == (5, 5, 5)
    finally:
        handle.close()
