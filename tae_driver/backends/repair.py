"""Explicit repair of a file WAL that refuses to open because of corruption.

Why (ARCHITECTURE.md §11: "refuse, name it, change nothing, repair only on request"): the
file backend's open refuses damage that is not a torn tail (`segment.classify_bad_frame`).
Someone must then decide to give up what follows the damage. This module is that decision's
tool, in two steps:

* `inspect(dir_path)` reads the directory (no lock, no write) with the open's own rules and
  returns a `RepairPlan`: where the first damage is, which LSNs the open cannot serve, every
  frame after the damage that is still whole (their payloads, so a caller can say which
  engine transactions they held), and what a repair would move. `None` when the open would
  succeed (a healthy log, or a torn tail the open cuts by itself).
* `quarantine(plan)` carries it out under the directory's lock: the damaged suffix (from the
  bad frame to the end of its segment, and every later segment whole) is moved into a new
  directory `quarantine-<UTC time>-lsn-<lo>/` inside the WAL directory, never deleted; the
  backend's open ignores that directory (it only reads `wal-*.seg` names at the top level).

The move itself is `logsvc/quarantine.py` (shared with `logsvc doctor --repair`), each
step durable before the next: a crash before the final cut leaves the damage in place, so
the open still refuses and `inspect` plans again; nothing already copied is lost. After it
the log ends at the last LSN before the damage.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from logsvc.quarantine import move_aside
from tae_driver import limits
from tae_driver.backends import segment
from tae_driver.backends.segment import FrameType
from tae_driver.errors import BackendFailed, StorageCorruption

LOCK_FILE_NAME = "LOCK"  # the file backend's lock (file.LOCK_FILE_NAME; no import cycle)


@dataclass(frozen=True, slots=True)
class LostFrame:
    """A frame in the bytes a repair moves aside. `whole`: its checksum holds (the payload is
    what was written); otherwise the fields are read from a damaged header, best effort."""

    path: str
    offset_bytes: int
    frame_type: FrameType | None
    lsn: int | None
    body: bytes
    whole: bool


@dataclass(frozen=True, slots=True)
class RepairPlan:
    dir_path: str
    damaged_path: str
    offset_bytes: int
    reason: str
    lsn_lo: int
    """The first LSN the open cannot serve; the log keeps `[.., lsn_lo)`."""
    lsn_hi: int
    """Past the highest LSN found in the moved bytes (`lsn_lo` when none was found)."""
    cut_path: str | None
    """The segment cut at `offset_bytes`, or None when it moves whole (a bad header)."""
    moved_paths: tuple[str, ...]
    """Whole segment files moved aside, oldest first."""
    lost_frames: tuple[LostFrame, ...]
    repairable: bool
    """False when moving a suffix aside cannot make the log open (segments are missing
    below the damage): the plan only reports."""


def _segment_paths(dir_path: str) -> list[tuple[int, str]]:
    found = []
    for name in os.listdir(dir_path):
        base = segment.parse_segment_file_name(name)
        if base is not None:
            found.append((base, os.path.join(dir_path, name)))
    return sorted(found)


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def inspect(dir_path: str) -> RepairPlan | None:
    """The first damage the file backend's open would refuse in `dir_path`, and what a repair
    would do about it; None if the open would succeed. Reads only."""
    segments = _segment_paths(dir_path)
    previous_last: int | None = None
    truncated_lsn = 0
    for index, (base, path) in enumerate(segments):
        newest = index == len(segments) - 1
        later = [p for _, p in segments[index + 1 :]]
        data = _read(path)
        try:
            scan = segment.scan_segment(data, path, newest=newest)
        except StorageCorruption as exc:
            if exc.offset_bytes < limits.FILE_SEGMENT_HEADER_BYTES or exc.lsn_lo is None:
                lo = previous_last + 1 if previous_last is not None else base
                return _plan(dir_path, path, 0, exc.reason, lo, None, [path, *later], data)
            return _plan(
                dir_path, path, exc.offset_bytes, exc.reason, exc.lsn_lo, path, later, data
            )
        if scan.base_lsn != base:
            reason = f"header base LSN {scan.base_lsn} != name"
            lo = previous_last + 1 if previous_last is not None else base
            return _plan(dir_path, path, 0, reason, lo, None, [path, *later], data)
        if previous_last is not None and base != previous_last + 1:
            reason = f"base LSN {base} after {previous_last}"
            return _plan(dir_path, path, 0, reason, previous_last + 1, None, [path, *later], data)
        truncated_lsn = max(truncated_lsn, scan.truncate_lsn_max)
        previous_last = scan.last_lsn
    if segments and segments[0][0] > truncated_lsn + 1:
        base, path = segments[0]
        reason = f"LSNs {truncated_lsn + 1}.. are missing below this segment"
        plan = _plan(dir_path, path, 0, reason, truncated_lsn + 1, None, [], b"")
        return _unrepairable(plan)
    return None


def _unrepairable(plan: RepairPlan) -> RepairPlan:
    return RepairPlan(
        plan.dir_path,
        plan.damaged_path,
        plan.offset_bytes,
        plan.reason,
        plan.lsn_lo,
        plan.lsn_hi,
        None,
        (),
        plan.lost_frames,
        False,
    )


def _plan(
    dir_path: str,
    damaged_path: str,
    offset_bytes: int,
    reason: str,
    lsn_lo: int,
    cut_path: str | None,
    moved_paths: list[str],
    damaged_data: bytes,
) -> RepairPlan:
    lost: list[LostFrame] = []
    if cut_path is not None:
        lost.extend(_frames_from(damaged_path, damaged_data, offset_bytes, lsn_lo))
    for path in moved_paths:
        data = damaged_data if path == damaged_path else _read(path)
        start = limits.FILE_SEGMENT_HEADER_BYTES
        first_lsn = struct.unpack_from("<Q", data, 16)[0] if len(data) >= 24 else lsn_lo
        lost.extend(_frames_from(path, data, start, first_lsn))
    lsns = [f.lsn for f in lost if f.whole and f.lsn is not None]
    lsn_hi = max([lsn_lo - 1, *lsns]) + 1
    return RepairPlan(
        dir_path,
        damaged_path,
        offset_bytes,
        reason,
        lsn_lo,
        lsn_hi,
        cut_path,
        tuple(moved_paths),
        tuple(lost),
        True,
    )


def _frames_from(path: str, data: bytes, offset: int, expected_lsn: int) -> Iterator[LostFrame]:
    """Every frame in `data[offset:]` (`data` is the whole file): whole ones in order, and at
    each damaged spot one best-effort frame read from its header, then a search for the next
    whole RECORD."""
    try:
        version = segment.decode_segment_header(data, path).version
    except StorageCorruption:
        version = segment.SEGMENT_VERSION  # a bad header: read the frames as the current ones
    frames_max = len(data) // limits.FILE_FRAME_HEADER_BYTES_V1 + 1  # a bound on the loop
    for _ in range(frames_max):
        if offset >= len(data):
            return
        try:
            frame = segment.decode_frame(data, offset, version=version)
        except segment.BadFrame:
            yield _damaged_frame(path, data, offset, version)
            later = segment.find_later_record(data, offset, expected_lsn, version=version)
            if later is None or isinstance(later, segment.Undecided):
                return
            offset, frame = later
        yield LostFrame(path, offset, frame.frame_type, frame.lsn, frame.body, True)
        if frame.frame_type is FrameType.RECORD:
            expected_lsn = frame.lsn + 1
        offset += frame.size_bytes


def _damaged_frame(path: str, data: bytes, offset: int, version: int) -> LostFrame:
    header_bytes = segment.frame_header_bytes(version)
    if len(data) - offset < header_bytes:
        return LostFrame(path, offset, None, None, bytes(data[offset:]), False)
    body_bytes, raw_type, lsn = struct.unpack_from("<IB3xQ", data, offset + 8)
    end = min(len(data), offset + header_bytes + body_bytes)
    frame_type = FrameType(raw_type) if raw_type in (1, 2) else None
    body = bytes(data[offset + header_bytes : end])
    return LostFrame(path, offset, frame_type, int(lsn), body, False)


@contextlib.contextmanager
def _locked(dir_path: str) -> Iterator[None]:
    fd = os.open(os.path.join(dir_path, LOCK_FILE_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackendFailed(f"{dir_path} is locked by another process") from None
        yield
    finally:
        os.close(fd)


def quarantine(plan: RepairPlan, *, now_s: float | None = None) -> str:
    """Move the damaged suffix of `plan` aside (module doc), under the directory's lock;
    return the quarantine directory. Refuses (`BackendFailed`) if the directory no longer
    matches the plan or the plan is not repairable; never deletes a byte."""
    if not plan.repairable:
        raise BackendFailed(f"{plan.damaged_path}: {plan.reason}: not repairable by quarantine")
    with _locked(plan.dir_path):
        again = inspect(plan.dir_path)
        if again is None or (again.damaged_path, again.offset_bytes, again.moved_paths) != (
            plan.damaged_path,
            plan.offset_bytes,
            plan.moved_paths,
        ):
            raise BackendFailed(f"{plan.dir_path} changed since it was inspected; inspect again")
        return move_aside(
            plan.dir_path,
            label=f"lsn-{plan.lsn_lo}",
            report=describe(plan),
            cut_path=plan.cut_path,
            cut_offset_bytes=plan.offset_bytes,
            moved_paths=plan.moved_paths,
            now_s=now_s,
        )


def describe(plan: RepairPlan) -> str:
    """A plain-text account of the plan (also written into the quarantine directory)."""
    lines = [
        f"damage: {plan.damaged_path} at byte {plan.offset_bytes}: {plan.reason}",
        f"the log keeps LSNs below {plan.lsn_lo}; LSNs [{plan.lsn_lo}, {plan.lsn_hi}) are lost",
    ]
    if plan.cut_path is not None:
        lines.append(f"cut: {plan.cut_path} at byte {plan.offset_bytes} (the rest moved aside)")
    lines.extend(f"move: {path}" for path in plan.moved_paths)
    whole = sum(1 for f in plan.lost_frames if f.whole)
    lines.append(
        f"frames in the moved bytes: {whole} whole, {len(plan.lost_frames) - whole} damaged"
    )
    return "\n".join(lines) + "\n"
