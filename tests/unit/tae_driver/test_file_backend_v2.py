"""Segment format v2: the durable-LSN hint decides torn tail or corruption, and v1 still opens.

How: segments are built byte by byte with the codec (`encode_frame` with the hint a group
write would give each frame: the last LSN synced before it), damaged as a power loss or as
disk damage would, then opened with a real `FileBackend` in a temporary directory; the
offline reader (`read_segment_frames`, the Spark jobs' path) must agree. What it proves
(backends/FORMAT.md, ARCHITECTURE.md §11):

* unwritten space (a zeroed sector, or a zeroed frame start) followed by frames whose hints
  all say the damaged LSN was not yet durable is the last group write, never synced: cut;
* the same hole followed by a frame whose hint says the damaged LSN was durable, or garbage
  (not zeros; a flipped byte in a frame whose own data holds a zero sector) followed by
  frames of the same group, or a whole last frame with non-zero damage, or a flipped byte
  anywhere in a WAL the backend wrote in multi-frame group writes: `StorageCorruption`,
  the directory unchanged;
* a whole last frame zeroed from a page boundary to the end (shorter than a sector): cut;
* hints that go backwards: corruption;
* a version 1 directory opens with the v1 rule, its records read back, and the next
  appends go to a new segment of the current version (3, preallocated); the open syncs the
  newest segment before serving it.

The segments built here are version 2 (what a WAL written before preallocation holds), so
these are also the rules an old directory is still opened with; the version 3 shapes are in
test_file_backend.py and test_file_backend_power_loss.py.

Several of these fail on the previous (v1-only) rule: every "is cut" case below was refused.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tae_driver import limits
from tae_driver.backends import segment
from tae_driver.backends.file import FileBackend
from tae_driver.backends.segment import FrameType
from tae_driver.errors import StorageCorruption

HEADER = limits.FILE_SEGMENT_HEADER_BYTES
FRAME = limits.FILE_FRAME_HEADER_BYTES


def payload(lsn: int, size: int = 300) -> bytes:
    return bytes((lsn * 31 + i) % 251 + 1 for i in range(size))  # no zero bytes


def build(
    groups: list[list[int]], size: int = 300, version: int = 2
) -> tuple[bytes, dict[int, int]]:
    """A v2 segment from LSN 1 written as `groups` (each a group write of those LSNs, every
    frame hinting the last LSN of the groups before it); and each LSN's frame offset."""
    data = bytearray(segment.encode_segment_header(1, version=version))
    offsets: dict[int, int] = {}
    durable_lsn = 0
    for group in groups:
        for lsn in group:
            offsets[lsn] = len(data)
            data += segment.encode_frame(
                FrameType.RECORD, lsn, payload(lsn, size), durable_lsn=durable_lsn
            )
        durable_lsn = group[-1]
    return bytes(data), offsets


def write_wal(dir_path: Path, data: bytes, base_lsn: int = 1) -> Path:
    dir_path.mkdir(exist_ok=True)
    path = dir_path / segment.segment_file_name(base_lsn)
    path.write_bytes(data)
    return path


async def records_of(backend: FileBackend) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    lsn = await backend.truncated() + 1
    while lsn <= await backend.latest():
        records, lsn = await backend.read(lsn, 1 << 20)
        out.update((r.lsn, r.payload) for r in records)
    return out


def open_kept(dir_path: Path) -> dict[int, bytes]:
    async def run() -> dict[int, bytes]:
        backend = await FileBackend.open(str(dir_path))
        try:
            return await records_of(backend)
        finally:
            await backend.close()

    return asyncio.run(run())


def assert_refused(dir_path: Path, needle: str) -> StorageCorruption:
    before = {p.name: p.read_bytes() for p in dir_path.iterdir() if p.name != "LOCK"}
    with pytest.raises(StorageCorruption) as info:
        asyncio.run(FileBackend.open(str(dir_path)))
    assert needle in info.value.reason, info.value.reason
    after = {p.name: p.read_bytes() for p in dir_path.iterdir() if p.name != "LOCK"}
    assert after == before
    return info.value


def offline_end(data: bytes) -> str:
    return segment.read_segment_frames(data, "offline", newest=True).end


def zero(data: bytes, lo: int, hi: int) -> bytes:
    assert 0 <= lo <= hi <= len(data)
    return data[:lo] + bytes(hi - lo) + data[hi:]


# Two synced group writes (1-3, 4-6), then the last one (7-40), unsynced when power failed.
LAST = 40
GROUPS = [[1, 2, 3], [4, 5, 6], list(range(7, LAST + 1))]


def test_a_zero_hole_then_frames_of_the_same_unsynced_group_write_is_cut(tmp_path: Path) -> None:
    data, offsets = build(GROUPS)
    page = (offsets[9] // 4096 + 1) * 4096  # a lost 4 KiB page inside the last group write
    damaged = zero(data, page, page + 4096)
    assert segment.find_later_record(damaged, page, 9, version=2) is not None  # frames follow
    assert offline_end(damaged) == segment.END_TORN
    write_wal(tmp_path, damaged)
    kept = open_kept(tmp_path)
    lost_from = min(lsn for lsn, offset in offsets.items() if offset + FRAME + 300 > page)
    assert sorted(kept) == list(range(1, lost_from))
    assert all(kept[lsn] == payload(lsn) for lsn in kept)


def test_a_zeroed_frame_start_shorter_than_a_sector_then_same_group_frames_is_cut(
    tmp_path: Path,
) -> None:
    """The first page of the last write was lost from where the synced bytes end (a frame
    start) to a page boundary fewer than 512 bytes on: no whole zero sector, but a zeroed
    frame start is never a flipped byte (a checksum is not zero)."""
    data, offsets = build(GROUPS)
    damaged = zero(data, offsets[7], offsets[7] + 100)
    assert offline_end(damaged) == segment.END_TORN
    write_wal(tmp_path, damaged)
    assert sorted(open_kept(tmp_path)) == list(range(1, 7))


def test_a_zero_hole_then_a_frame_that_says_it_was_durable_is_corruption(tmp_path: Path) -> None:
    """LSN 5 was synced (the group write of 7.. says so): a zeroed sector there is damage to
    acknowledged data, whatever its shape."""
    data, offsets = build(GROUPS)
    lo = (offsets[5] // 512 + 1) * 512
    damaged = zero(data, lo, lo + 512)
    assert offline_end(damaged) == segment.END_CORRUPT
    write_wal(tmp_path, damaged)
    error = assert_refused(tmp_path, "had been synced")
    assert (error.lsn_lo, error.lsn_hi) == (5, LAST + 1)


def test_a_zero_hole_then_only_a_truncate_frame_that_says_it_was_durable_is_corruption(
    tmp_path: Path,
) -> None:
    """The only frame after the zeros is a TRUNCATE (the RECORD search, by LSN, cannot find
    it): its hint still proves the zeroed LSN had been synced."""
    data, offsets = build([[1, 2, 3], [4, 5, 6]])
    truncate_offset = len(data)
    data += segment.encode_frame(FrameType.TRUNCATE, 2, b"", durable_lsn=6)
    damaged = zero(data, offsets[5], truncate_offset)  # LSNs 5 and 6 read as zeros
    assert offline_end(damaged) == segment.END_CORRUPT
    write_wal(tmp_path, damaged)
    assert_refused(tmp_path, "TRUNCATE frame follows it")


def test_garbage_then_frames_of_the_same_group_is_corruption(tmp_path: Path) -> None:
    """Frames of one group after non-zero damage: the hint allows a cut, the shape does not
    (a power loss leaves zeros, not garbage, in the middle of a write; a flipped byte in a
    group that was synced and acknowledged looks exactly like this)."""
    data, offsets = build(GROUPS)
    damaged = bytearray(data)
    damaged[offsets[9] + FRAME + 7] ^= 0x5A
    assert offline_end(bytes(damaged)) == segment.END_CORRUPT
    write_wal(tmp_path, bytes(damaged))
    assert_refused(tmp_path, "not unwritten space")


def test_a_flipped_byte_in_a_frame_holding_a_zero_sector_is_corruption(tmp_path: Path) -> None:
    """A frame of the last group write whose own payload holds 1,100 zero bytes (a whole
    aligned sector), with a byte flipped elsewhere in it, then frames of the same group: a
    zero sector is not taken for a lost page in the middle of the file, so it is refused."""
    data = bytearray(segment.encode_segment_header(1, version=2))
    offsets: dict[int, int] = {}
    for lsn in range(1, 12):
        body = payload(lsn) + (bytes(1100) if lsn == 4 else b"") + payload(lsn)
        offsets[lsn] = len(data)
        data += segment.encode_frame(FrameType.RECORD, lsn, body, durable_lsn=0 if lsn < 2 else 1)
    data[offsets[4] + FRAME + 10] ^= 0x5A
    assert offline_end(bytes(data)) == segment.END_CORRUPT
    write_wal(tmp_path, bytes(data))
    assert_refused(tmp_path, "not unwritten space")


@pytest.mark.parametrize("where", [2, 12, 20, FRAME + 150, -1])
def test_a_whole_last_frame_with_non_zero_damage_is_corruption(tmp_path: Path, where: int) -> None:
    """The last frame of the last group write, whole, with a flipped byte (checksum, length,
    type, LSN, payload): it may have been synced and acknowledged, and no later frame can
    say otherwise, so it is never cut."""
    data, offsets = build(GROUPS)
    damaged = bytearray(data)
    damaged[(offsets[LAST] + where) if where >= 0 else where] ^= 0x5A
    assert offline_end(bytes(damaged)) == segment.END_CORRUPT
    write_wal(tmp_path, bytes(damaged))
    assert_refused(tmp_path, "")


def test_a_whole_last_frame_zeroed_from_a_page_boundary_is_cut(tmp_path: Path) -> None:
    """The file's size reached the disk, its last partial page did not: fewer than 512
    zeros from a 4 KiB boundary to the end, inside a whole last frame."""
    for size in range(300, 700):
        data, offsets = build(GROUPS, size)
        boundary = (len(data) // 4096) * 4096
        if offsets[LAST] < boundary and 8 <= len(data) - boundary < 512:
            break
    else:
        raise AssertionError("no frame size puts a page boundary in the last frame")
    damaged = zero(data, boundary, len(data))
    assert offline_end(damaged) == segment.END_TORN
    write_wal(tmp_path, damaged)
    assert sorted(open_kept(tmp_path)) == list(range(1, LAST))


def test_hints_that_go_backwards_are_corruption(tmp_path: Path) -> None:
    data = bytearray(segment.encode_segment_header(1, version=2))
    data += segment.encode_frame(FrameType.RECORD, 1, b"a", durable_lsn=0)
    data += segment.encode_frame(FrameType.RECORD, 2, b"b", durable_lsn=1)
    data += segment.encode_frame(FrameType.RECORD, 3, b"c", durable_lsn=0)
    assert offline_end(bytes(data)) == segment.END_CORRUPT
    write_wal(tmp_path, bytes(data))
    assert_refused(tmp_path, "durable LSN 0 below")


def v1_segment(base_lsn: int, lsns: range) -> bytes:
    data = bytearray(segment.encode_segment_header(base_lsn, version=1))
    for lsn in lsns:
        data += segment.encode_frame_v1(FrameType.RECORD, lsn, payload(lsn, 50))
    return bytes(data)


def test_a_v1_directory_opens_and_the_next_appends_go_to_a_new_current_segment(
    tmp_path: Path,
) -> None:
    write_wal(tmp_path, v1_segment(1, range(1, 6)), 1)
    write_wal(tmp_path, v1_segment(6, range(6, 11)) + b"\x01\x02 torn", 6)  # a cut write

    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path))
        assert backend.stats().torn_bytes_cut == 7
        paths = backend.segment_paths()
        assert [Path(p).name for p in paths] == [
            segment.segment_file_name(1),
            segment.segment_file_name(6),
            segment.segment_file_name(11),
        ]
        assert await backend.append(b"first v2") == 11
        assert await backend.append(b"second v2") == 12
        kept = await records_of(backend)
        assert [kept[lsn] for lsn in range(1, 11)] == [payload(lsn, 50) for lsn in range(1, 11)]
        assert (kept[11], kept[12]) == (b"first v2", b"second v2")
        await backend.close()
        newest = Path(paths[-1]).read_bytes()
        assert segment.decode_segment_header(newest, "newest").version == segment.SEGMENT_VERSION
        frames = segment.read_segment_frames(newest, "newest", newest=True).frames
        assert [f.frame.durable_lsn for f in frames] == [10, 11]  # two group writes
        older = (tmp_path / segment.segment_file_name(6)).read_bytes()
        assert segment.decode_segment_header(older, "older").version == 1
        assert older == v1_segment(6, range(6, 11))  # cut, never appended to
        again = await FileBackend.open(str(tmp_path))
        assert await again.latest() == 12
        assert len(again.segment_paths()) == 3  # the v3 segment is appended to from now on
        assert await again.append(b"third") == 13
        await again.truncate(10)
        assert [Path(p).name for p in again.segment_paths()] == [segment.segment_file_name(11)]
        await again.close()

    asyncio.run(scenario())


def test_a_read_only_look_at_a_v1_directory_reads_its_frames_as_v1(tmp_path: Path) -> None:
    """A tool's read-only open (no lock, nothing written) of a WAL still in version 1 reads
    each segment with its own version's header size (the read-only scan once built every
    segment as the current version)."""
    write_wal(tmp_path, v1_segment(1, range(1, 6)), 1)
    write_wal(tmp_path, v1_segment(6, range(6, 11)), 6)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path), read_only=True)
        kept = await records_of(backend)
        await backend.close()
        assert kept == {lsn: payload(lsn, 50) for lsn in range(1, 11)}

    asyncio.run(scenario())
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_v1_newest_segment_with_no_record_is_replaced_keeping_its_truncation_mark(
    tmp_path: Path,
) -> None:
    """A v1 segment made by rotation that holds only a TRUNCATE frame: the v2 segment at the
    next LSN has its name, so it replaces it, and the truncated LSN survives."""
    write_wal(tmp_path, v1_segment(1, range(1, 6)), 1)
    mark = segment.encode_frame_v1(FrameType.TRUNCATE, 5)
    write_wal(tmp_path, segment.encode_segment_header(6, version=1) + mark, 6)

    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path))
        assert (await backend.truncated(), await backend.latest()) == (5, 5)
        assert [Path(p).name for p in backend.segment_paths()] == [segment.segment_file_name(6)]
        assert await backend.append(b"six") == 6
        await backend.close()
        assert sorted(p.name for p in tmp_path.glob("wal-*")) == [segment.segment_file_name(6)]
        again = await FileBackend.open(str(tmp_path))
        assert (await again.truncated(), await again.latest()) == (5, 6)
        records, _ = await again.read(6, 1 << 20)
        assert [r.payload for r in records] == [b"six"]
        await again.close()
        data = (tmp_path / segment.segment_file_name(6)).read_bytes()
        assert segment.decode_segment_header(data, "p").version == segment.SEGMENT_VERSION

    asyncio.run(scenario())


def test_a_v1_zero_hole_followed_by_frames_is_still_corruption(tmp_path: Path) -> None:
    """v1 frames carry no hint: nothing proves the later frames were not acknowledged."""
    data = v1_segment(1, range(1, 40))
    write_wal(tmp_path, zero(data, 1024, 1536))
    assert_refused(tmp_path, "v1 frames carry no durable hint")


def test_the_open_syncs_the_newest_segment_before_serving_it(tmp_path: Path) -> None:
    """After a process crash the frames may be in the page cache only: the open makes them
    durable before any read sees them or a frame's hint counts them."""
    data, _ = build([[1, 2]], version=segment.SEGMENT_VERSION)  # appended to, not rolled
    path = write_wal(tmp_path, data)
    synced: list[str] = []

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        os.fdatasync(fd)

    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path), fsync=fsync)
        assert synced == [str(path)]
        assert await backend.latest() == 2
        assert await backend.append(b"x") == 3
        await backend.close()
        frames = segment.read_segment_frames(path.read_bytes(), "p", newest=True).frames
        assert frames[-1].frame.durable_lsn == 2

    asyncio.run(scenario())


def test_a_flipped_byte_anywhere_in_multi_frame_group_writes_is_refused(tmp_path: Path) -> None:
    """A WAL written by the backend in group writes of several frames (so later frames of
    the same group say the damaged LSN was not yet durable), closed cleanly: everything in
    it was acknowledged, so a flipped byte at any offset of any frame is refused, never cut."""
    live = tmp_path / "live"

    async def fill() -> None:
        backend = await FileBackend.open(str(live), segment_bytes_max=2048)
        for round_ in range(12):
            width = 1 + round_ % 6
            await asyncio.gather(
                *(backend.append(payload(round_ * 7 + i, 90)) for i in range(width))
            )
        await backend.close()

    asyncio.run(fill())
    files = sorted(live.glob("wal-*.seg"))
    assert len(files) >= 2
    for path in files:  # group writes of several frames: several frames share one hint
        frames = segment.read_segment_frames(path.read_bytes(), "f", newest=False).frames
        assert len({f.frame.durable_lsn for f in frames}) < len(frames) or len(frames) <= 1
    assert any(
        len(segment.read_segment_frames(p.read_bytes(), "f", newest=False).frames) > 2
        for p in files
    )
    zero_tails = 0
    for path in files:
        data = path.read_bytes()
        newest = path == files[-1]
        written_end = segment.read_segment_frames(data, "f", newest=newest).end_offset
        assert len(data) >= written_end
        for offset in range(HEADER, written_end):
            damaged = bytearray(data)
            damaged[offset] ^= 0x5A
            found = segment.read_segment_frames(bytes(damaged), str(path), newest=newest)
            assert found.end == segment.END_CORRUPT, (path.name, offset, found.end_reason)
        # A byte in the zeros past the frames was never written by anyone: in the newest
        # segment it is cut with the space it sits in (nothing acknowledged is there); a
        # sealed segment holds nothing but zeros past its frames, so it is corruption.
        if len(data) < written_end + 64:
            continue  # a group crossed the rotation size: allocated to its end, no zeros
        zero_tails += 1
        damaged = bytearray(data)
        damaged[written_end + 40] ^= 0x5A
        found = segment.read_segment_frames(bytes(damaged), str(path), newest=newest)
        assert found.end == (segment.END_TORN if newest else segment.END_CORRUPT)
        assert found.end_offset == written_end
    assert zero_tails > 0


def _torn_at_first_read(
    monkeypatch: pytest.MonkeyPatch, lo: int, hi: int, reads_torn: int
) -> list[int]:
    """The read-only scan's reads of a segment, the first `reads_torn` of them with bytes
    [lo, hi) zeroed: as a read copying the file while a writer's group write is copied in
    can see it. Returns the list the reads are counted in."""
    from tae_driver.backends import file_read_only as file_backend
    from tae_driver.backends.segment_files import read_all as real

    reads: list[int] = []

    def read_all(fd: int) -> bytes:
        data = real(fd)
        reads.append(len(data))
        return zero(data, lo, hi) if len(reads) <= reads_torn else data

    monkeypatch.setattr(file_backend, "read_all", read_all)
    return reads


def test_a_read_only_look_reads_again_a_frame_a_live_writer_was_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI, `engine tables` beside a running engine: the look saw the last durable frame
    half-written and a valid frame after it, and called the WAL corrupt. It reads such a
    segment again before saying so: a tear that a second read does not show is a write
    being copied, not damage."""
    data, offsets = build([[1, 2, 3, 4, 5, 6, 7, 8], [9]])  # frame 9 says LSN 8 was durable
    write_wal(tmp_path, data)
    reads = _torn_at_first_read(monkeypatch, offsets[8] + FRAME + 10, offsets[9], reads_torn=1)

    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path), read_only=True)
        kept = await records_of(backend)
        await backend.close()
        assert kept == {lsn: payload(lsn) for lsn in range(1, 10)}

    asyncio.run(scenario())
    assert len(reads) == 2


def test_a_read_only_look_reports_damage_every_read_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, offsets = build([[1, 2, 3, 4, 5, 6, 7, 8], [9]])
    write_wal(tmp_path, data)
    reads = _torn_at_first_read(monkeypatch, offsets[8] + FRAME + 10, offsets[9], reads_torn=99)
    with pytest.raises(StorageCorruption, match="valid frames follow it"):
        asyncio.run(FileBackend.open(str(tmp_path), read_only=True))
    assert len(reads) == limits.FILE_READ_ONLY_SCAN_ATTEMPTS_MAX
