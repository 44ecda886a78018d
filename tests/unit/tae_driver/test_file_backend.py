"""The file backend's format, crash recovery, group fsync and truncation (backends/FORMAT.md).

How: real files in a temporary directory. Golden bytes pin the segment format. Damage is
made by editing the files between a close and an open: what a power loss leaves at the tail
of the newest segment (a cut inside a frame, a partial frame of garbage, a zero-filled tail)
must be cut back as a torn write (nothing there was acknowledged); a flipped byte in a
length, a checksum or a payload of a frame that is whole (even the last one: it may have
been acknowledged), any bad frame followed by valid ones (written one frame per group write,
so their durable-LSN hints say the bad one was durable; the v2 cases where they do not are in
test_file_backend_v2.py), damage in a sealed segment, a bad
header, a well-checksummed frame with a wrong LSN or a missing segment must raise
`StorageCorruption(path, offset)` and leave every byte as it was (ARCHITECTURE.md §11).
Group commit is observed through an `fsync` wrapper that logs each sync next to each
acknowledgement. Scenario 30 (local backend restart and truncate) runs the driver over 3 KiB
segments.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tae_driver import limits, open_driver
from tae_driver.backends import segment
from tae_driver.backends.file import FileBackend
from tae_driver.backends.segment import FrameType
from tae_driver.checksum import xxh3_64
from tae_driver.errors import BackendFailed, StorageCorruption
from tests.unit.tae_driver.harness import Recorder, apply_all

GOLDEN = Path(__file__).parent / "golden"
HEADER = limits.FILE_SEGMENT_HEADER_BYTES
FRAME = limits.FILE_FRAME_HEADER_BYTES


def golden(name: str) -> bytes:
    return bytes.fromhex((GOLDEN / name).read_text().strip())


def test_segment_v1_vector_encodes_exactly_and_scans_back() -> None:
    encoded = (
        segment.encode_segment_header(7, version=1)
        + segment.encode_frame_v1(FrameType.RECORD, 7, b"hello")
        + segment.encode_frame_v1(FrameType.TRUNCATE, 7)
        + segment.encode_frame_v1(FrameType.RECORD, 8, b"")
    )
    assert encoded == golden("segment_v1.hex")
    scan = segment.scan_segment(encoded, "golden", newest=False)
    assert (scan.base_lsn, scan.last_lsn, scan.truncate_lsn_max) == (7, 8, 7)
    assert scan.version == 1
    assert list(scan.record_offsets) == [32, 32 + 29 + 24]
    assert scan.valid_bytes == len(encoded) == 109


def test_segment_v2_vector_encodes_exactly_and_scans_back() -> None:
    encoded = (
        segment.encode_segment_header(7, version=2)
        + segment.encode_frame(FrameType.RECORD, 7, b"hello", durable_lsn=6)
        + segment.encode_frame(FrameType.TRUNCATE, 7, b"", durable_lsn=7)
        + segment.encode_frame(FrameType.RECORD, 8, b"", durable_lsn=7)
    )
    assert encoded == golden("segment_v2.hex")
    scan = segment.scan_segment(encoded, "golden", newest=False)
    assert (scan.base_lsn, scan.last_lsn, scan.truncate_lsn_max) == (7, 8, 7)
    assert scan.version == 2
    assert list(scan.record_offsets) == [32, 32 + 37 + 32]
    assert scan.valid_bytes == len(encoded) == 133
    frames = segment.read_segment_frames(encoded, "golden", newest=True).frames
    assert [f.frame.durable_lsn for f in frames] == [6, 7, 7]


def test_segment_v3_vector_is_v2_frames_in_preallocated_zeros() -> None:
    """Version 3 (FORMAT.md "Preallocation"): the v2 frames, then the allocated zeros ahead
    of the writer, which are the end of the segment, not damage: in a sealed segment too."""
    frames_bytes = (
        segment.encode_frame(FrameType.RECORD, 7, b"hello", durable_lsn=6)
        + segment.encode_frame(FrameType.TRUNCATE, 7, b"", durable_lsn=7)
        + segment.encode_frame(FrameType.RECORD, 8, b"", durable_lsn=7)
    )
    encoded = segment.encode_segment_header(7) + frames_bytes + bytes(64)
    assert encoded == golden("segment_v3.hex")
    assert encoded[8:10] == b"\x03\x00"
    assert encoded[32:133] == golden("segment_v2.hex")[32:]
    for newest in (True, False):
        scan = segment.scan_segment(encoded, "golden", newest=newest)
        assert (scan.base_lsn, scan.last_lsn, scan.truncate_lsn_max) == (7, 8, 7)
        assert scan.version == segment.SEGMENT_VERSION == 3
        assert list(scan.record_offsets) == [32, 32 + 37 + 32]
        assert (scan.valid_bytes, scan.written_bytes, scan.torn_offset) == (133, 133, None)
        listed = segment.read_segment_frames(encoded, "golden", newest=newest)
        assert (listed.end, listed.end_offset, len(listed.frames)) == (segment.END_CLEAN, 133, 3)
    # The same zeros after a version 2 segment are a torn tail (newest) or corruption.
    as_v2 = golden("segment_v2.hex") + bytes(64)
    assert segment.scan_segment(as_v2, "v2", newest=True).torn_offset == 133
    with pytest.raises(StorageCorruption):
        segment.scan_segment(as_v2, "v2", newest=False)


def test_segment_v2_fields_are_where_format_md_says() -> None:
    data = golden("segment_v2.hex")
    assert data[0:8] == b"TDWALSEG"
    assert int.from_bytes(data[8:10], "little") == 2
    assert int.from_bytes(data[16:24], "little") == 7
    assert int.from_bytes(data[24:32], "little") == xxh3_64(data[0:24])
    frame = data[32:69]
    assert int.from_bytes(frame[0:8], "little") == xxh3_64(frame[8:])
    assert int.from_bytes(frame[8:12], "little") == 5
    assert frame[12] == FrameType.RECORD
    assert frame[13:16] == b"\0\0\0"
    assert int.from_bytes(frame[16:24], "little") == 7
    assert int.from_bytes(frame[24:32], "little") == 6  # durable_lsn
    assert frame[32:] == b"hello"


def test_segment_v1_fields_are_where_format_md_says() -> None:
    data = golden("segment_v1.hex")
    assert data[0:8] == b"TDWALSEG"
    assert int.from_bytes(data[8:10], "little") == 1
    assert int.from_bytes(data[16:24], "little") == 7
    assert int.from_bytes(data[24:32], "little") == xxh3_64(data[0:24])
    frame = data[32:61]
    assert int.from_bytes(frame[0:8], "little") == xxh3_64(frame[8:])
    assert int.from_bytes(frame[8:12], "little") == 5
    assert frame[12] == FrameType.RECORD
    assert frame[13:16] == b"\0\0\0"
    assert int.from_bytes(frame[16:24], "little") == 7
    assert frame[24:] == b"hello"


async def filled(
    dir_path: Path,
    count: int,
    size: int = 100,
    segment_bytes_max: int = limits.FILE_SEGMENT_BYTES_DEFAULT,
) -> FileBackend:
    backend = await FileBackend.open(str(dir_path), segment_bytes_max=segment_bytes_max)
    for i in range(count):
        assert await backend.append(bytes([i % 256]) * size) == i + 1
    return backend


def segment_files(dir_path: Path) -> list[Path]:
    return sorted(dir_path.glob("wal-*.seg"))


def test_rotation_and_whole_file_deletion(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = await filled(tmp_path, 60, segment_bytes_max=1024)
        files = segment_files(tmp_path)
        assert len(files) > 5
        bases = [segment.parse_segment_file_name(f.name) or 0 for f in files]
        assert bases[0] == 1
        assert bases == sorted(bases)
        await backend.truncate(30)
        remaining = segment_files(tmp_path)
        assert [str(p) for p in remaining] == backend.segment_paths()
        first_base = segment.parse_segment_file_name(remaining[0].name)
        assert first_base is not None
        assert first_base <= 31  # the file holding LSN 31 is kept whole
        assert backend.stats().segments_deleted == len(files) - len(remaining) > 0
        records, _ = await backend.read(31, 1 << 20)
        assert [r.lsn for r in records] == list(range(31, 61))
        await backend.close()
        reopened = await FileBackend.open(str(tmp_path), segment_bytes_max=1024)
        assert (await reopened.truncated(), await reopened.latest()) == (30, 60)
        assert segment_files(tmp_path) == remaining
        await reopened.close()

    asyncio.run(scenario())


def last_frame_offset(path: Path) -> int:
    scan = segment.scan_segment(path.read_bytes(), str(path), newest=True)
    return scan.record_offsets[-1]


def written_end(path: Path) -> int:
    """Where the frames of a segment end (version 3: the zeros ahead of the writer follow)."""
    return segment.scan_segment(path.read_bytes(), str(path), newest=True).valid_bytes


def write_at_written_end(path: Path, data: bytes) -> None:
    """What appending to the file was before preallocation: the bytes go where the writer
    would write next, into the preallocated zeros."""
    end = written_end(path)
    with path.open("r+b") as handle:
        handle.seek(end)
        handle.write(data)


def damage_cut(path: Path) -> None:
    """The last sector of the last group write never reached the disk: in a preallocated
    file it reads as the zeros that were there (the file does not get shorter)."""
    data = bytearray(path.read_bytes())
    end = written_end(path)
    lost_from = (end - 1) // 512 * 512
    data[lost_from:end] = bytes(end - lost_from)
    path.write_bytes(bytes(data))


def damage_garbage(path: Path) -> None:
    write_at_written_end(path, b"\x01garbage that is not a frame")


def damage_zeros(path: Path) -> None:
    data = bytearray(path.read_bytes())
    start = last_frame_offset(path)
    data[start:] = bytes(len(data) - start)
    path.write_bytes(bytes(data))


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def damage_checksum(path: Path) -> None:
    flip(path, last_frame_offset(path) + 2)


def damage_length(path: Path) -> None:
    flip(path, last_frame_offset(path) + 9)


def damage_payload(path: Path) -> None:
    flip(path, last_frame_offset(path) + FRAME + 3)


def damage_zero_tail_sector(path: Path) -> None:
    """A group write's last frame reached the disk but for its last sector (zeros)."""
    data = bytearray(path.read_bytes())
    end = written_end(path)
    frame = segment.encode_frame(FrameType.RECORD, 11, b"y" * 600, durable_lsn=10)
    lost_from = (end + len(frame)) // 512 * 512
    data[end:lost_from] = frame[: lost_from - end]
    path.write_bytes(bytes(data))


def damage_partial_frame(path: Path) -> None:
    """A group write cut short: the next frame's header and part of its body, to the end of
    a sector (a disk writes whole sectors; the rest reads as the preallocated zeros)."""
    end = written_end(path)
    frame = segment.encode_frame(FrameType.RECORD, 11, b"x" * 300, durable_lsn=10)
    write_at_written_end(path, frame[: -(-end // 512) * 512 - end])


@pytest.mark.parametrize(
    ("damage", "survivors", "cut"),
    [
        (damage_cut, 7, True),  # frames end at 32 + 132 k: the sector from 1024 is lost
        (damage_garbage, 10, True),
        (damage_zeros, 9, False),  # zeros from the last frame on: unwritten, nothing to cut
        (damage_zero_tail_sector, 10, True),
        (damage_partial_frame, 10, True),
    ],
)
def test_a_torn_tail_is_cut_back(tmp_path: Path, damage: object, survivors: int, cut: bool) -> None:
    async def scenario() -> None:
        backend = await filled(tmp_path, 10)
        await backend.close()
        (path,) = segment_files(tmp_path)
        size_bytes = path.stat().st_size
        assert size_bytes == HEADER + limits.FILE_PREALLOCATE_BYTES_DEFAULT  # preallocated
        assert callable(damage)
        damage(path)
        reopened = await FileBackend.open(str(tmp_path))
        assert (reopened.stats().torn_bytes_cut > 0) == cut
        assert path.stat().st_size == (written_end(path) if cut else size_bytes)
        assert await reopened.latest() == survivors
        records, _ = await reopened.read(1, 1 << 20)
        assert [r.payload for r in records] == [bytes([i]) * 100 for i in range(survivors)]
        assert await reopened.append(b"new") == survivors + 1
        await reopened.close()
        again = await FileBackend.open(str(tmp_path))
        assert again.stats().torn_bytes_cut == 0
        assert await again.latest() == survivors + 1
        await again.close()

    asyncio.run(scenario())


def tree_bytes(dir_path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(dir_path)): p.read_bytes()
        for p in sorted(dir_path.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("damage", [damage_checksum, damage_length, damage_payload])
def test_a_flipped_byte_in_the_last_whole_frame_is_corruption_and_changes_nothing(
    tmp_path: Path, damage: object
) -> None:
    """The last frame was written whole and acknowledged: a flipped byte in it is not what a
    power loss does, so the open refuses instead of cutting an acknowledged record."""

    async def scenario() -> None:
        await (await filled(tmp_path, 10)).close()
        (path,) = segment_files(tmp_path)
        offset = last_frame_offset(path)
        assert callable(damage)
        damage(path)
        before = tree_bytes(tmp_path)
        with pytest.raises(StorageCorruption) as info:
            await FileBackend.open(str(tmp_path))
        assert (info.value.path, info.value.offset_bytes) == (str(path), offset)
        assert (info.value.lsn_lo, info.value.lsn_hi) == (10, 11)
        assert tree_bytes(tmp_path) == before

    asyncio.run(scenario())


def test_a_bad_frame_followed_by_valid_frames_is_corruption_even_near_the_end(
    tmp_path: Path,
) -> None:
    """Issue 20's data loss in little: a byte flipped in frame 5 of 10, all within one group
    write of the end. Frames 6..10 follow it whole, so they may have been acknowledged."""

    async def scenario() -> None:
        await (await filled(tmp_path, 10)).close()
        (path,) = segment_files(tmp_path)
        scan = segment.scan_segment(path.read_bytes(), str(path), newest=True)
        for region in (2, 9, 12, 16, FRAME + 50):  # checksum, length, type, LSN, payload
            data = path.read_bytes()
            flip(path, scan.record_offsets[4] + region)
            before = tree_bytes(tmp_path)
            with pytest.raises(StorageCorruption) as info:
                await FileBackend.open(str(tmp_path))
            assert info.value.offset_bytes == scan.record_offsets[4], region
            assert (info.value.lsn_lo, info.value.lsn_hi) == (5, 11), region
            assert tree_bytes(tmp_path) == before
            path.write_bytes(data)
        reopened = await FileBackend.open(str(tmp_path))
        assert await reopened.latest() == 10
        await reopened.close()

    asyncio.run(scenario())


def test_a_zeroed_sector_followed_by_valid_frames_is_corruption(tmp_path: Path) -> None:
    """A hole of zeros with whole frames after it, written one group write per frame: the
    later frames' durable-LSN hints say the damaged LSN had been synced before they were
    written (it may have been acknowledged), so the open refuses."""

    async def scenario() -> None:
        await (await filled(tmp_path, 20, size=300)).close()
        (path,) = segment_files(tmp_path)
        data = bytearray(path.read_bytes())
        data[1024:1536] = bytes(512)
        path.write_bytes(bytes(data))
        with pytest.raises(StorageCorruption) as info:
            await FileBackend.open(str(tmp_path))
        assert "LSN 3 had been synced" in info.value.reason
        assert path.read_bytes() == bytes(data)

    asyncio.run(scenario())


def test_garbage_over_a_page_of_small_frames_followed_by_valid_ones_is_corruption(
    tmp_path: Path,
) -> None:
    """A damaged 4 KiB page holds ~120 frames of 10-byte payloads: the search for a valid
    frame after the damage must look far enough ahead to find the ones that follow it."""

    async def scenario() -> None:
        await (await filled(tmp_path, 400, size=10)).close()
        (path,) = segment_files(tmp_path)
        data = bytearray(path.read_bytes())
        data[4096:8192] = bytes((i * 7 + 1) % 251 for i in range(4096))
        path.write_bytes(bytes(data))
        with pytest.raises(StorageCorruption) as info:
            await FileBackend.open(str(tmp_path))
        assert "had been synced" in info.value.reason  # a later frame's hint says so
        assert path.read_bytes() == bytes(data)

    asyncio.run(scenario())


def test_repair_plan_and_quarantine_of_a_bad_segment_header(tmp_path: Path) -> None:
    """A bad header moves the whole file aside (with every later one); the log then ends
    before it. A log missing its first segment cannot be repaired by moving files."""
    from tae_driver.backends import repair

    async def scenario() -> None:
        await (await filled(tmp_path, 40, segment_bytes_max=1024)).close()
        files = segment_files(tmp_path)
        flip(files[2], 3)  # the magic of the third segment
        plan = repair.inspect(str(tmp_path))
        assert plan is not None and plan.repairable
        assert (plan.cut_path, plan.moved_paths) == (None, tuple(str(f) for f in files[2:]))
        first_lost = segment.parse_segment_file_name(files[2].name)
        assert plan.lsn_lo == first_lost
        target = repair.quarantine(plan)
        assert sorted(os.listdir(target)) == sorted(["REPAIR.txt", *(f.name for f in files[2:])])
        reopened = await FileBackend.open(str(tmp_path))
        assert await reopened.latest() == (first_lost or 0) - 1
        await reopened.close()
        assert repair.inspect(str(tmp_path)) is None
        segment_files(tmp_path)[0].unlink()
        missing = repair.inspect(str(tmp_path))
        assert missing is not None and not missing.repairable

    asyncio.run(scenario())


def test_damage_in_an_older_segment_is_corruption(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = await filled(tmp_path, 40, segment_bytes_max=1024)
        await backend.close()
        oldest = segment_files(tmp_path)[0]
        flip(oldest, HEADER + FRAME + 1)  # the payload of its first record
        with pytest.raises(StorageCorruption) as info:
            await FileBackend.open(str(tmp_path))
        assert (info.value.path, info.value.offset_bytes) == (str(oldest), HEADER)

    asyncio.run(scenario())


def test_damage_far_from_the_end_of_the_newest_segment_is_corruption(tmp_path: Path) -> None:
    async def scenario() -> None:
        big = 1024 * 1024
        backend = await filled(tmp_path, 7, size=big)
        await backend.close()
        (path,) = segment_files(tmp_path)
        assert path.stat().st_size - HEADER > limits.FILE_TORN_TAIL_BYTES_MAX
        flip(path, HEADER + FRAME + 10)
        with pytest.raises(StorageCorruption) as info:
            await FileBackend.open(str(tmp_path))
        assert info.value.offset_bytes == HEADER

    asyncio.run(scenario())


def test_a_bad_segment_header_is_corruption(tmp_path: Path) -> None:
    async def scenario() -> None:
        await (await filled(tmp_path, 3)).close()
        (path,) = segment_files(tmp_path)
        flip(path, 3)
        with pytest.raises(StorageCorruption):
            await FileBackend.open(str(tmp_path))

    asyncio.run(scenario())


def test_a_well_formed_frame_with_the_wrong_lsn_is_corruption_even_at_the_tail(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        await (await filled(tmp_path, 3)).close()
        (path,) = segment_files(tmp_path)
        write_at_written_end(
            path, segment.encode_frame(FrameType.RECORD, 9, b"out of sequence", durable_lsn=3)
        )
        with pytest.raises(StorageCorruption) as info:
            await FileBackend.open(str(tmp_path))
        assert "expected 4" in info.value.reason

    asyncio.run(scenario())


def test_a_missing_middle_segment_is_corruption(tmp_path: Path) -> None:
    async def scenario() -> None:
        await (await filled(tmp_path, 40, segment_bytes_max=1024)).close()
        files = segment_files(tmp_path)
        files[2].unlink()
        with pytest.raises(StorageCorruption):
            await FileBackend.open(str(tmp_path), segment_bytes_max=1024)

    asyncio.run(scenario())


def test_damage_found_by_a_read_after_open_is_corruption(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = await filled(tmp_path, 5)
        (path,) = segment_files(tmp_path)
        flip(path, HEADER + 2 * (FRAME + 100) + FRAME + 1)  # LSN 3's payload
        with pytest.raises(StorageCorruption):
            await backend.read(1, 1 << 20)
        records, _ = await backend.read(1, 150)
        assert [r.lsn for r in records] == [1]
        await backend.close()

    asyncio.run(scenario())


def test_interrupted_creation_and_deletion_are_finished_on_open(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = await filled(tmp_path, 40, segment_bytes_max=1024)
        files = segment_files(tmp_path)
        oldest_bytes = files[0].read_bytes()
        await backend.truncate(35)
        await backend.close()
        assert not files[0].exists()
        files[0].write_bytes(oldest_bytes)  # as if the unlink had not reached the disk
        (tmp_path / "wal-00000000000000000099.seg.tmp").write_bytes(b"partial")
        reopened = await FileBackend.open(str(tmp_path), segment_bytes_max=1024)
        assert not files[0].exists()
        assert not list(tmp_path.glob("*.tmp"))
        assert (await reopened.truncated(), await reopened.latest()) == (35, 40)
        await reopened.close()

    asyncio.run(scenario())


def test_group_commit_one_fsync_per_batch_and_no_ack_before_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        events: list[tuple[str, int]] = []
        holder: list[FileBackend] = []

        def fsync(fd: int) -> None:
            os.fdatasync(fd)
            events.append(("synced", holder[0].written_lsn))

        backend = await FileBackend.open(str(tmp_path), fsync=fsync)
        holder.append(backend)
        futures = [asyncio.ensure_future(backend.append(b"%d" % i)) for i in range(200)]
        for future in futures:
            future.add_done_callback(lambda f: events.append(("acked", f.result())))
        await asyncio.gather(*futures)
        stats = backend.stats()
        assert stats.data_syncs == stats.batches_written <= 2
        synced_upto = 0
        for kind, lsn in events:
            if kind == "synced":
                synced_upto = max(synced_upto, lsn)
            else:
                assert lsn <= synced_upto, "acknowledged before its fsync"
        assert sorted(lsn for kind, lsn in events if kind == "acked") == list(range(1, 201))
        await backend.close()

    asyncio.run(scenario())


def test_one_directory_has_one_owner(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path))
        with pytest.raises(BackendFailed):
            await FileBackend.open(str(tmp_path))
        await backend.close()
        await (await FileBackend.open(str(tmp_path))).close()

    asyncio.run(scenario())


def test_a_failed_fsync_fails_the_backend_until_reopened(tmp_path: Path) -> None:
    async def scenario() -> None:
        failing = [False]

        def fsync(fd: int) -> None:
            if failing[0]:
                raise OSError(5, "injected EIO")
            os.fdatasync(fd)

        backend = await FileBackend.open(str(tmp_path), fsync=fsync)
        assert await backend.append(b"kept") == 1
        failing[0] = True
        with pytest.raises(BackendFailed):
            await backend.append(b"lost?")
        with pytest.raises(BackendFailed):
            await backend.append(b"refused")
        with pytest.raises(BackendFailed):
            await backend.read(1, 100)
        await backend.close()
        reopened = await FileBackend.open(str(tmp_path))
        records, _ = await reopened.read(1, 1 << 20)
        assert records[0].payload == b"kept"  # the unsynced one may or may not be there
        await reopened.close()

    asyncio.run(scenario())


def test_scenario_30_driver_restart_and_truncate_over_3_kib_segments(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path), segment_bytes_max=3 * 1024)
        driver = open_driver(backend, window=8, record_entries_max=5)
        await driver.replay(apply_all)
        dsns: list[int] = []
        for chunk in range(20):  # 100 appends, five at a time: about one record per batch
            dsns += await asyncio.gather(
                *(driver.append(b"e%03d" % i + b"." * 196) for i in range(5 * chunk, 5 * chunk + 5))
            )
        assert dsns == list(range(1, 101))
        files_before = len(segment_files(tmp_path))
        assert files_before > 3
        for dsn in range(1, 101):
            driver.truncate(dsn)
            if dsn % 25 == 0:
                await driver.truncation_settled()
        truncated_lsn = await driver.truncation_settled()
        assert truncated_lsn > 0
        assert len(segment_files(tmp_path)) < files_before  # whole files went
        dsn_before = driver.dsn()
        await driver.close()
        await backend.close()

        backend = await FileBackend.open(str(tmp_path), segment_bytes_max=3 * 1024)
        recorder = Recorder(apply_from=101)
        restarted = open_driver(backend)
        await restarted.replay(recorder)
        assert recorder.handled == sorted(recorder.handled)
        assert all(recorder.entries[d].startswith(b"e%03d" % (d - 1)) for d in recorder.handled)
        assert restarted.dsn() == dsn_before == 100
        assert await restarted.append(b"next") == 101
        await restarted.close()
        await backend.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("where", ["last frame's body", "first frame's length"])
def test_v3_damage_in_frames_that_end_in_zero_bytes_is_corruption(
    tmp_path: Path, where: str
) -> None:
    """In a preallocated segment, frames whose payloads end in zero bytes (Arrow pads with
    zeros) run into the allocated zeros: the written end must still be found at the last
    frame's end (FORMAT.md "Preallocation"), or a flipped byte in the acknowledged last frame,
    or a flipped length with valid frames after it, would read as a torn tail and be cut."""

    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path))
        for index in range(2):  # the last frame alone proves the first was durable
            assert await backend.append(b"entry %d" % index + bytes(40)) == index + 1
        await backend.close()
        (path,) = segment_files(tmp_path)
        frames = segment.read_segment_frames(path.read_bytes(), "p", newest=True).frames
        if where == "last frame's body":
            flip(path, frames[-1].offset + FRAME + 2)
        else:
            flip(path, frames[0].offset + 9)  # the length field: the frame looks longer
        before = path.read_bytes()
        with pytest.raises(StorageCorruption):
            await FileBackend.open(str(tmp_path))
        assert path.read_bytes() == before

    asyncio.run(scenario())
