"""A power loss at every sync point of the file backend's preallocated (version 3) segments:
a real torn tail is still cut on recovery, the zeros ahead of the writer are never taken for
damage, and no acknowledged (synced) frame is ever lost (issue 20 item 2c, issue 21).

How: the backend runs on real files with real fdatasync, through its `fsync` hook (the only
seam it has). At every data sync the hook takes an image of the WAL directory as it is at
that instant, with each segment's synced end (where its frames ended at its last sync; a new
segment's header and allocated zeros are synced when it is created), before it lets the
real fdatasync run. Concurrent appends of mixed sizes over 16 KiB segments allocated 4 KiB
at a time make group writes of several frames, allocation steps, rotations and a TRUNCATE
frame.

A power loss in a preallocated file cannot change its size (the allocation was synced), so
the model works on the bytes written since the synced end, in whole sectors (a disk writes
a sector whole or not at all; `logsvc/torn.py`): `trunc` (every one of them reads as the
zeros it overwrote), `torn` (the sectors up to a random one survive, the rest are zeros,
with garbage in the last 1..64 written bytes half the time) and `zeros` (random 4 KiB pages
of them are zeros, after a random or the full prefix), with several seeds. Then the disk is
put in a fresh directory and opened:

* every open keeps every frame that was synced at that instant, with its bytes (everything
  acknowledged: the hook also checks that nothing was acknowledged beyond them);
* every open succeeds, except for one shape: the surviving prefix ends at a frame's end (in
  the sector model, often the whole last write) and `torn` garbled its last bytes, so the
  log ends in a whole frame with non-zero damage: byte for byte a flipped byte in an
  acknowledged last frame, which the open refuses as `StorageCorruption` with the directory
  unchanged (FORMAT.md). These seeds meet it.

The run must cut many torn tails, open many images cleanly (zeros ahead of the writer), and
cut at least one zero hole followed by frames (the v2 hint rule), or it proved nothing.
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass
from pathlib import Path

from logsvc.torn import PAGE_BYTES, SECTOR_BYTES
from tae_driver import limits
from tae_driver.backends import segment
from tae_driver.backends.file import FileBackend
from tae_driver.errors import StorageCorruption

SEGMENT_BYTES_MAX = 16 * 1024
PREALLOCATE_BYTES = 4 * 1024
HEADER = limits.FILE_SEGMENT_HEADER_BYTES
SEEDS = 6

Mode = str  # "trunc", "torn" or "zeros"


@dataclass(frozen=True, slots=True)
class Image:
    """The WAL directory just before one fdatasync returned: name -> (bytes, synced end)."""

    files: dict[str, tuple[bytes, int]]
    acked_lsn_max: int


def frames_end(content: bytes) -> int:
    return segment.read_segment_frames(content, "image", newest=True).end_offset


class Recorder:
    def __init__(self, dir_path: Path) -> None:
        self.dir_path = dir_path
        self.synced: dict[str, int] = {}
        self.images: list[Image] = []
        self.acked_lsn_max = 0

    def fsync(self, fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        files = {}
        for path in sorted(self.dir_path.glob("wal-*.seg")):
            content = path.read_bytes()
            files[path.name] = (content, self.synced.get(str(path), HEADER))
        self.images.append(Image(files, self.acked_lsn_max))
        os.fdatasync(fd)
        self.synced[target] = frames_end(Path(target).read_bytes())


def payload(index: int) -> bytes:
    return f"<{index}>".encode() * (20 + (index * 37) % 200)


async def workload(dir_path: Path, recorder: Recorder) -> dict[int, bytes]:
    backend = await FileBackend.open(
        str(dir_path),
        segment_bytes_max=SEGMENT_BYTES_MAX,
        preallocate_bytes=PREALLOCATE_BYTES,
        fsync=recorder.fsync,
    )
    written: dict[int, bytes] = {}

    async def one(index: int) -> None:
        data = payload(index)
        lsn = await backend.append(data)
        written[lsn] = data
        recorder.acked_lsn_max = max(recorder.acked_lsn_max, lsn)

    index = 0
    for round_ in range(40):
        width = 1 + round_ % 5
        await asyncio.gather(*(one(index + i) for i in range(width)))
        index += width
        if round_ == 20:
            await backend.truncate(5)
    await backend.close()
    return written


def frame_ends(content: bytes) -> set[int]:
    frames = segment.read_segment_frames(content, "image", newest=True).frames
    return {f.offset + f.frame.size_bytes for f in frames}


def power_loss(content: bytes, synced: int, mode: Mode, rng: random.Random) -> tuple[bytes, bool]:
    """What the disk holds of one preallocated segment after a power loss, and whether it is
    the one shape that may be refused (see the module doc)."""
    written_end = frames_end(content)
    if written_end <= synced:
        return content, False
    disk = bytearray(content)
    first_sector = synced // SECTOR_BYTES  # its synced bytes survive whatever happens
    sectors = range(first_sector, -(-written_end // SECTOR_BYTES))

    def lose(lo: int, hi: int) -> None:
        lo, hi = max(lo, synced), min(hi, written_end)
        if lo < hi:
            disk[lo:hi] = bytes(hi - lo)

    if mode == "trunc":
        lose(synced, written_end)
        return bytes(disk), False
    kept_end = written_end
    if mode == "torn" or rng.random() < 0.5:
        kept_end = min(written_end, rng.choice(list(sectors)) * SECTOR_BYTES + SECTOR_BYTES)
        lose(kept_end, written_end)
    garbled = False
    if mode == "torn" and rng.random() < 0.5 and kept_end > synced:
        garbage = rng.randint(1, min(64, kept_end - synced))
        for offset in range(kept_end - garbage, kept_end):
            disk[offset] = rng.randint(1, 255)
        garbled = True
    if mode == "zeros":
        first_page = synced // PAGE_BYTES
        for page in range(first_page, -(-kept_end // PAGE_BYTES)):
            if rng.random() < 0.4:
                lose(page * PAGE_BYTES, page * PAGE_BYTES + PAGE_BYTES)
    may_refuse = garbled and kept_end in frame_ends(content)
    return bytes(disk), may_refuse


def test_power_loss_at_every_sync_point_keeps_every_synced_frame(tmp_path: Path) -> None:
    live = tmp_path / "live"
    recorder = Recorder(live)
    written = asyncio.run(workload(live, recorder))
    assert len(recorder.images) > 30
    assert len({name for image in recorder.images for name in image.files}) > 3
    sizes = {len(content) for image in recorder.images for content, _ in image.files.values()}
    assert any(size % PREALLOCATE_BYTES == HEADER for size in sizes)  # allocated ahead
    outcomes = {"cut": 0, "clean": 0, "refused": 0}
    holes_cut = 0
    case = 0
    for image in recorder.images:
        synced_lsns = durable_lsns(image)
        assert image.acked_lsn_max <= max(synced_lsns, default=0)  # no ack before its sync
        for mode, seeds in (("trunc", 1), ("torn", SEEDS), ("zeros", SEEDS)):
            for seed in range(seeds):
                case += 1
                rng = random.Random(seed)
                disks: dict[str, bytes] = {}
                may_refuse = False
                hole = False
                for name, (content, synced) in image.files.items():
                    disk, refusable = power_loss(content, synced, mode, rng)
                    disks[name] = disk
                    may_refuse |= refusable
                    end = frames_end(content)
                    lost = [i for i in range(synced, end) if disk[i] != content[i]]
                    hole |= bool(lost) and disk[lost[-1] + 1 : end] == content[lost[-1] + 1 : end]
                holes_cut += hole
                outcome = asyncio.run(reopen(tmp_path / f"case-{case}", disks, synced_lsns))
                # Refused only when the log ends in a whole frame with non-zero damage (when
                # the garbage hit its length field, it reads as a frame cut short: cut, as
                # in version 2, FORMAT.md).
                assert outcome != "refused" or may_refuse, (mode, seed, case)
                outcomes[outcome] += 1
    assert outcomes["refused"] > 0, outcomes  # the one refused shape was met and refused
    assert outcomes["cut"] > 50, outcomes
    assert outcomes["clean"] > 50, outcomes
    assert holes_cut > 0  # zeros, then frames of the same group write
    assert written


def durable_lsns(image: Image) -> dict[int, bytes]:
    """Every RECORD in the synced bytes of the image, with its payload."""
    out: dict[int, bytes] = {}
    for name, (content, synced) in image.files.items():
        frames = segment.read_segment_frames(content[:synced], name, newest=False)
        assert frames.end == segment.END_CLEAN
        for found in frames.frames:
            if found.frame.frame_type is segment.FrameType.RECORD:
                out[found.frame.lsn] = found.frame.body
    return out


async def reopen(dir_path: Path, disks: dict[str, bytes], synced: dict[int, bytes]) -> str:
    dir_path.mkdir()
    for name, data in disks.items():
        (dir_path / name).write_bytes(data)
    before = {p.name: p.read_bytes() for p in dir_path.iterdir() if p.name != "LOCK"}
    try:
        backend = await FileBackend.open(
            str(dir_path), segment_bytes_max=SEGMENT_BYTES_MAX, preallocate_bytes=PREALLOCATE_BYTES
        )
    except StorageCorruption as exc:
        assert "whole" in exc.reason, exc.reason  # FORMAT.md: the one refused shape
        assert {p.name: p.read_bytes() for p in dir_path.iterdir() if p.name != "LOCK"} == before
        return "refused"
    try:
        first = await backend.truncated() + 1
        assert await backend.latest() >= max(synced, default=0)
        kept: dict[int, bytes] = {}
        lsn = first
        while lsn <= await backend.latest():
            records, lsn = await backend.read(lsn, 1 << 20)
            kept.update((r.lsn, r.payload) for r in records)
        for lsn, body in synced.items():
            if lsn >= first:
                assert kept[lsn] == body, lsn
        return "cut" if backend.stats().torn_bytes_cut > 0 else "clean"
    finally:
        await backend.close()
