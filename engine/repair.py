"""`python -m engine repair DIR [--yes]`: an engine whose file WAL refuses to open because of
corruption, made to open again by moving the damaged suffix aside, on request only.

Why (ARCHITECTURE.md §11, issue 20): the open refuses corruption and changes nothing; giving
up the transactions after the damage is an operator's decision, taken knowing what is lost.
So the command first says it: the damaged file and byte, the driver LSNs, and for every
frame still whole in the moved bytes the DSNs and commit timestamps of the engine
transactions it held (decoded with the WAL's own codecs: tae_driver/record.py, then
engine/wal/codec.py `decode_entry`). Only with `--yes` does it act: tae_driver's
`repair.quarantine` moves the bytes into `DIR/wal/quarantine-*/` (nothing is deleted; the
backend ignores that directory), after which the engine opens with the transactions before
the damage.

Exit codes: 0 nothing to repair, or repaired; 1 damage found and nothing changed (pass
--yes to repair); 2 bad arguments, or no engine WAL in DIR; 3 the damage cannot be repaired
by moving a suffix aside, or the WAL is locked by a running engine.

`wal_corruption` turns the file backend's `StorageCorruption` into the engine's
`WalCorruption` with the DSN range it makes unreadable, for `Engine.open`.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from engine.errors import WalCorruption
from engine.layout import WAL_DIR_NAME
from engine.wal.codec import decode_entry
from engine.wal.entry import TxnEntry
from logsvc.quarantine import QUARANTINE_PREFIX
from tae_driver import record as driver_record
from tae_driver.backends import repair as wal_repair
from tae_driver.backends import segment
from tae_driver.errors import BackendFailed, CorruptRecord, StorageCorruption

EXIT_OK = 0
EXIT_DAMAGE_NOT_REPAIRED = 1
EXIT_USAGE = 2
EXIT_CANNOT_REPAIR = 3

_LOOK_BACK_FRAMES_MAX = 4096
"""How many whole frames before the damage to decode, newest first, to find the last DSN the
log keeps (skip records and safe markers hold none)."""


@dataclass(frozen=True, slots=True)
class LostEntry:
    """One engine WAL entry in the moved bytes. `commit_ts` None: a checkpoint entry, or an
    entry that does not decode (`problem` says why)."""

    lsn: int
    dsn: int
    commit_ts: int | None
    kind: str
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Assessment:
    plan: wal_repair.RepairPlan
    dsn_kept_max: int | None
    """The highest DSN the log keeps before the damage (None: not found)."""
    lost: tuple[LostEntry, ...]
    undecodable_frames: int
    """Frames in the moved bytes whose payload is damaged or not a driver record."""

    @property
    def dsn_lo(self) -> int | None:
        """The first DSN the log cannot serve: after the last one kept, or else the first
        found in the moved bytes; None if neither is known."""
        if self.dsn_kept_max is not None:
            return self.dsn_kept_max + 1
        return min(e.dsn for e in self.lost) if self.lost else None

    @property
    def dsn_hi(self) -> int | None:
        """Past the highest DSN found in the moved bytes, [dsn_lo, dsn_hi); None if none."""
        return max(e.dsn for e in self.lost) + 1 if self.lost else None


def assess(wal_dir: str) -> Assessment | None:
    """The damage the file WAL in `wal_dir` refuses to open with, and what a repair loses;
    None when it would open. Reads only."""
    plan = wal_repair.inspect(wal_dir)
    if plan is None:
        return None
    lost: list[LostEntry] = []
    undecodable = 0
    for frame in plan.lost_frames:
        if frame.frame_type is not segment.FrameType.RECORD or frame.lsn is None:
            undecodable += frame.frame_type is None
            continue
        entries = _entries(frame.lsn, frame.body)
        if entries is None:
            undecodable += 1
        lost.extend(entries or ())
    return Assessment(plan, _dsn_kept_max(plan), tuple(lost), undecodable)


def _entries(lsn: int, body: bytes) -> list[LostEntry] | None:
    try:
        decoded = driver_record.decode(body)
    except CorruptRecord:
        return None
    if not isinstance(decoded, driver_record.EntriesRecord):
        return []
    out = []
    for position, payload in enumerate(decoded.entries):
        dsn = decoded.start_dsn + position
        try:
            entry = decode_entry(payload, dsn)
        except WalCorruption as exc:
            out.append(LostEntry(lsn, dsn, None, "undecodable", exc.reason))
            continue
        if isinstance(entry, TxnEntry):
            out.append(LostEntry(lsn, dsn, entry.commit_ts, "txn"))
        else:
            out.append(LostEntry(lsn, dsn, None, "checkpoint"))
    return out


def _dsn_kept_max(plan: wal_repair.RepairPlan) -> int | None:
    """The last DSN of the whole frames before the damage, newest first, bounded."""
    paths = sorted(
        os.path.join(plan.dir_path, name)
        for name in os.listdir(plan.dir_path)
        if segment.parse_segment_file_name(name) is not None
    )
    keep_upto = paths.index(plan.damaged_path) if plan.damaged_path in paths else len(paths)
    tried = 0
    for index in range(keep_upto, -1, -1):
        if index >= len(paths):
            continue
        path = paths[index]
        with open(path, "rb") as handle:
            data = handle.read()
        try:
            frames = segment.read_segment_frames(data, path, newest=False).frames
        except StorageCorruption:
            return None
        if path == plan.damaged_path:
            frames = tuple(f for f in frames if f.offset < plan.offset_bytes)
        for found in reversed(frames):
            tried += 1
            if tried > _LOOK_BACK_FRAMES_MAX:
                return None
            if found.frame.frame_type is not segment.FrameType.RECORD:
                continue
            try:
                decoded = driver_record.decode(found.frame.body)
            except CorruptRecord:
                continue
            if isinstance(decoded, driver_record.EntriesRecord) and decoded.entries:
                return decoded.end_dsn
    return None


def wal_corruption(wal_dir: str, exc: StorageCorruption) -> WalCorruption:
    """The engine's error for a file WAL that refuses to open: the DSNs it cannot serve, how
    to repair. Falls back to the backend's words when the DSNs cannot be read."""
    try:
        found = assess(wal_dir)
    except (OSError, StorageCorruption):
        found = None
    dsn_lo = found.dsn_lo if found is not None else None
    dsn_hi = found.dsn_hi if found is not None else None
    dsns = f"DSNs [{dsn_lo}, {dsn_hi if dsn_hi is not None else '?'})"
    reason = (
        f"the WAL is corrupt ({exc}); the open changed nothing; {dsns} are unreadable past it; "
        f"`python -m engine repair {os.path.dirname(wal_dir)}` says what a repair would lose"
    )
    return WalCorruption(
        dsn_lo if dsn_lo is not None else 0,
        reason,
        exc.offset_bytes,
        dsn_hi=dsn_hi,
        path=exc.path,
    )


def report(assessment: Assessment) -> str:
    plan = assessment.plan
    lines = [wal_repair.describe(plan).rstrip("\n")]
    if assessment.dsn_lo is not None:
        lines.append(f"the engine keeps DSNs up to {assessment.dsn_kept_max}")
    if assessment.lost:
        lines.append(
            f"entries found in the moved bytes: DSNs [{assessment.dsn_lo}, {assessment.dsn_hi})"
        )
        for entry in assessment.lost:
            what = f"commit_ts {entry.commit_ts}" if entry.commit_ts is not None else entry.kind
            problem = f" ({entry.problem})" if entry.problem else ""
            lines.append(f"  lost: LSN {entry.lsn} DSN {entry.dsn} {what}{problem}")
    else:
        lines.append("no whole engine entry was found in the moved bytes")
    if assessment.undecodable_frames:
        lines.append(
            f"{assessment.undecodable_frames} damaged frame(s) in the moved bytes could not be "
            "decoded: the transactions they held are lost too"
        )
    return "\n".join(lines)


def run(engine_dir: str, yes: bool) -> int:
    wal_dir = os.path.join(engine_dir, WAL_DIR_NAME)
    if not os.path.isdir(wal_dir):
        print(f"error: no engine WAL here: {wal_dir} does not exist", file=sys.stderr)
        return EXIT_USAGE
    try:
        assessment = assess(wal_dir)
    except (OSError, StorageCorruption) as exc:
        print(f"error: cannot read {wal_dir}: {exc}", file=sys.stderr)
        return EXIT_CANNOT_REPAIR
    if assessment is None:
        print(f"{wal_dir}: no corruption; the WAL opens as it is (nothing to repair)")
        return EXIT_OK
    print(report(assessment))
    if not assessment.plan.repairable:
        print("error: moving a suffix aside cannot make this WAL open", file=sys.stderr)
        return EXIT_CANNOT_REPAIR
    if not yes:
        print(
            "nothing changed: pass --yes to move the damaged suffix aside "
            f"(into {wal_dir}/{QUARANTINE_PREFIX}*; nothing is deleted)",
            file=sys.stderr,
        )
        return EXIT_DAMAGE_NOT_REPAIRED
    try:
        target = wal_repair.quarantine(assessment.plan)
    except BackendFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CANNOT_REPAIR
    print(f"repaired: the damaged suffix is in {target}")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = sub.add_parser(
        "repair",
        help="move a corrupt file WAL's damaged suffix aside (with --yes)",
        description=__doc__.split("\n\n")[0],
        epilog=(
            "exit codes: 0 nothing to repair, or repaired; 1 damage found, nothing changed "
            "(pass --yes); 2 bad arguments or no engine WAL in DIR; 3 not repairable, or the "
            "WAL is locked by a running engine"
        ),
    )
    command.add_argument("dir", help="the engine's directory (its WAL is DIR/wal)")
    command.add_argument(
        "--yes", action="store_true", help="act: without it, only say what would be lost"
    )
