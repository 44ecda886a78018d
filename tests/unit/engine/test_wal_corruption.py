"""A corrupt file WAL is refused, named and left as it was; repair happens only on request
(issue 20; ARCHITECTURE.md §11).

How: a real engine on its file WAL (objects "none", so every committed row lives in the WAL
and nothing truncates it) commits transactions of 100 rows; the test closes it, edits the
WAL's bytes and opens it again:

* the issue's reproduction: one byte flipped at offset 20,000 of the one ~140 KB segment.
  In the issue `Engine.open` returned 200 rows and cut the file to 13,879 bytes, silently
  (here the old code also raised nothing); now it raises `WalCorruption` naming the file,
  the byte and the DSNs, and every byte of the directory is as it was;
* a sweep over a multi-segment WAL: a byte flipped in every region of frames throughout it
  (segment header, frame checksum, length, type, reserved, LSN, payload start, middle and
  end), one at a time. Each open either has every committed transaction or raises
  `WalCorruption`, never fewer rows in silence, and a refused open changed nothing;
* `python -m engine repair DIR` (through `main`) says what is lost and changes nothing
  without `--yes`; with it, moves the damaged suffix into `DIR/wal/quarantine-*` (the bytes
  are all still there) and the engine opens with the transactions before the damage.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from engine import Column, Engine, Schema, WalCorruption
from engine import cli as engine_cli
from engine import repair as engine_repair
from tae_driver import limits as driver_limits
from tae_driver.backends import segment
from tae_driver.backends.file import FileBackend

ROWS = Schema([Column("id", "int64"), Column("v", "string")], primary_key=["id"])
TXNS = 20
ROWS_PER_TXN = 100
SEGMENT_BYTES_MAX = 40 * 1024
"""Small segments: the 20 transactions span four, the newest one holding two of them."""


async def _commit(eng: Engine, txns: int) -> None:
    """Create the table and commit `txns` transactions of 100 rows."""
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
    for t in range(txns):
        async with eng.transaction() as txn:
            rows = [
                {"id": t * ROWS_PER_TXN + i, "v": f"row {t} {i} " + "x" * (40 + i % 7)}
                for i in range(ROWS_PER_TXN)
            ]
            await txn.table("d", "t").insert(rows)


def build(path: Path, *, segment_bytes_max: int | None = None) -> None:
    async def main() -> None:
        wal: str | FileBackend = "file"
        if segment_bytes_max is not None:
            wal = await FileBackend.open(str(path / "wal"), segment_bytes_max=segment_bytes_max)
        eng = await Engine.open(str(path), wal=wal, objects="none")
        await _commit(eng, TXNS)
        await eng.close()
        if isinstance(wal, FileBackend):
            await wal.close()

    asyncio.run(main())


def row_count(path: Path) -> int:
    async def main() -> int:
        eng = await Engine.open(str(path), objects="none")
        try:
            async with eng.snapshot(eng.visible_ts) as ro:
                rows: int = (await ro.table("d", "t").scan(columns=["id"])).num_rows
                return rows
        finally:
            await eng.close()

    return asyncio.run(main())


def tree(path: Path) -> dict[str, bytes | None]:
    """Every name under `path` and its bytes (None for a directory)."""
    out: dict[str, bytes | None] = {}
    for p in sorted(path.rglob("*")):
        out[str(p.relative_to(path))] = p.read_bytes() if p.is_file() else None
    return out


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def segments(path: Path) -> list[Path]:
    return sorted((path / "wal").glob("wal-*.seg"))


def test_issue_20_a_flipped_byte_mid_file_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    build(tmp_path)
    (seg,) = segments(tmp_path)
    written = segment.read_segment_frames(seg.read_bytes(), str(seg), newest=True).end_offset
    assert 100_000 < written < 200_000  # the issue's 136 KB segment (then preallocated zeros)
    assert row_count(tmp_path) == TXNS * ROWS_PER_TXN
    flip(seg, 20_000)
    before = tree(tmp_path)
    with pytest.raises(WalCorruption) as info:
        row_count(tmp_path)
    assert tree(tmp_path) == before  # no cut, no rewrite
    error = info.value
    assert error.path == str(seg)
    assert error.offset_bytes is not None
    assert error.offset_bytes <= 20_000 < error.offset_bytes + 16_000
    assert error.dsn > 1
    assert error.dsn_hi is not None
    assert error.dsn < error.dsn_hi
    assert "repair" in str(error)
    with pytest.raises(WalCorruption):  # and again: the refusal is stable
        row_count(tmp_path)
    assert tree(tmp_path) == before


def _frame_offsets(seg: Path) -> list[tuple[int, int]]:
    """(offset, size) of every frame of a healthy segment."""
    data = seg.read_bytes()
    frames = segment.read_segment_frames(data, str(seg), newest=False).frames
    return [(f.offset, f.frame.size_bytes) for f in frames]


def test_flips_anywhere_in_a_multi_segment_wal_never_lose_rows_in_silence(
    tmp_path: Path,
) -> None:
    build(tmp_path, segment_bytes_max=SEGMENT_BYTES_MAX)
    segs = segments(tmp_path)
    assert len(segs) >= 3
    assert len(_frame_offsets(segs[-1])) >= 2  # the newest segment, where tails are torn
    total = TXNS * ROWS_PER_TXN
    assert row_count(tmp_path) == total
    frame_header = driver_limits.FILE_FRAME_HEADER_BYTES
    targets: list[tuple[Path, int]] = []
    for seg in segs:
        targets.extend((seg, offset) for offset in (0, 9, 17, 25))  # the segment header
        frames = _frame_offsets(seg)
        picked = {0, 1, len(frames) // 2, len(frames) - 1}
        for index in sorted(i for i in picked if 0 <= i < len(frames)):
            start, size = frames[index]
            body = size - frame_header
            regions = [0, 7, 8, 10, 11, 12, 13, 16, 23]  # checksum, length, type, res, LSN
            regions += [24, 31]  # the v2 durable-LSN hint
            regions += [frame_header, frame_header + body // 2, size - 1]  # payload
            targets.extend((seg, start + r) for r in regions if r < size)
    assert all(offset >= 0 for _, offset in targets)
    refused = opened = 0
    for seg, offset in targets:
        original = seg.read_bytes()
        flip(seg, offset)
        before = tree(tmp_path)
        try:
            count = row_count(tmp_path)
        except WalCorruption:
            refused += 1
            assert tree(tmp_path) == before, (seg.name, offset)
        else:
            opened += 1
            assert count == total, (seg.name, offset, count)
        seg.write_bytes(original)
    assert refused == len(targets)  # every flip in a checksummed frame or header is damage
    assert opened == 0


def test_repair_says_what_is_lost_and_acts_only_with_yes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path, segment_bytes_max=SEGMENT_BYTES_MAX)
    segs = segments(tmp_path)
    damaged = segs[1]
    frames = _frame_offsets(damaged)
    bad_offset, _ = frames[1]
    flip(damaged, bad_offset + driver_limits.FILE_FRAME_HEADER_BYTES + 40)
    before = tree(tmp_path)
    with pytest.raises(WalCorruption) as info:
        row_count(tmp_path)
    dsn_lo, dsn_hi = info.value.dsn, info.value.dsn_hi

    assert engine_cli.main(["repair", str(tmp_path)]) == engine_repair.EXIT_DAMAGE_NOT_REPAIRED
    out, err = capsys.readouterr()
    assert tree(tmp_path) == before
    assert "--yes" in err
    assert f"at byte {bad_offset}" in out
    assert "commit_ts" in out  # the lost transactions, decoded
    assert f"DSNs [{dsn_lo}, {dsn_hi})" in out

    assert engine_cli.main(["repair", str(tmp_path), "--yes"]) == engine_repair.EXIT_OK
    out, _ = capsys.readouterr()
    (quarantine,) = (tmp_path / "wal").glob("quarantine-*")
    # Nothing deleted: the kept prefix plus the quarantined bytes are the damaged WAL's bytes.
    kept = damaged.read_bytes()
    assert len(kept) == bad_offset
    moved = (quarantine / f"{damaged.name}.from-{bad_offset}").read_bytes()
    assert kept + moved == before[f"wal/{damaged.name}"]
    for later in segs[2:]:
        assert not later.exists()
        assert (quarantine / later.name).read_bytes() == before[f"wal/{later.name}"]
    assert (quarantine / "REPAIR.txt").read_text().startswith("damage: ")

    survivors = row_count(tmp_path)
    assert survivors % ROWS_PER_TXN == 0
    assert 0 < survivors < TXNS * ROWS_PER_TXN
    assert engine_cli.main(["repair", str(tmp_path)]) == engine_repair.EXIT_OK  # healthy now
    assert "nothing to repair" in capsys.readouterr().out


def test_repair_of_a_missing_engine_is_a_usage_error(tmp_path: Path) -> None:
    assert engine_cli.main(["repair", str(tmp_path / "nothing")]) == engine_repair.EXIT_USAGE
    assert not os.path.exists(tmp_path / "nothing")
