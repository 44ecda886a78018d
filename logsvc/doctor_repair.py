"""`logsvc doctor --repair`: the damaged suffix of a shard journal, found by recovery's own
scan, and its move into a quarantine directory (logsvc/doctor.py's module doc, "Repair")."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass

from logsvc.quarantine import move_aside
from logsvc.store import records
from logsvc.store.fs import LOCK_FILE_NAME
from logsvc.store.recovery import SEGMENT_NAME


@dataclass(frozen=True, slots=True)
class JournalRepair:
    """What `--repair --yes` would move out of a journal (module doc). The journal keeps
    indexes below `index_lo`; `[index_lo, index_hi)` are the ones found in the moved bytes
    (`index_hi` == `index_lo` when none is whole there)."""

    journal_dir: str
    damaged_path: str
    offset_bytes: int
    reason: str
    index_lo: int
    index_hi: int
    cut_path: str | None  # None: the damaged file moves whole (its header is bad)
    moved_paths: tuple[str, ...]

    def describe(self) -> str:
        lines = [
            f"damage: {self.damaged_path} at byte {self.offset_bytes}: {self.reason}",
            f"the journal keeps Raft indexes below {self.index_lo}; indexes "
            f"[{self.index_lo}, {self.index_hi}) are found in the moved bytes and lost",
        ]
        if self.cut_path is not None:
            lines.append(f"cut: {self.cut_path} at byte {self.offset_bytes} (the rest moved)")
        lines.extend(f"move: {path}" for path in self.moved_paths)
        return "\n".join(lines) + "\n"


def plan_journal_repair(journal_dir: str, payload_bytes_max: int) -> JournalRepair | None:
    """The first corrupt segment of a journal, decided by recovery's own scan, and the
    suffix a repair would move aside; None when no segment is corrupt. Reads only."""
    segments = sorted(
        (int(match.group(1)), os.path.join(journal_dir, name))
        for name in os.listdir(journal_dir)
        if (match := SEGMENT_NAME.match(name))
    )
    for position, (first_index, path) in enumerate(segments):
        with open(path, "rb") as handle:
            data = handle.read()
        newest = position == len(segments) - 1
        found = records.read_segment_records(
            data, first_index, newest=newest, payload_bytes_max=payload_bytes_max
        )
        if found.end != records.END_CORRUPT:
            continue
        later = tuple(p for _, p in segments[position + 1 :])
        index_lo = found.records[-1].index + 1 if found.records else first_index
        index_hi = index_lo
        for later_first, later_path in segments[position + 1 :]:
            with open(later_path, "rb") as handle:
                walked = records.read_segment_records(
                    handle.read(), later_first, newest=False, verify=False
                )
            if walked.records:
                index_hi = max(index_hi, walked.records[-1].index + 1)
        whole = found.end_offset_bytes < records.SEGMENT_HEADER_BYTES
        return JournalRepair(
            journal_dir,
            path,
            0 if whole else found.end_offset_bytes,
            found.end_reason or "corrupt",
            index_lo,
            index_hi,
            None if whole else path,
            (path, *later) if whole else later,
        )
    return None


def repair_journal(plan: JournalRepair) -> str:
    """Move the plan's suffix aside under the journal's lock; the quarantine directory.
    Raises BlockingIOError if the node holds the lock."""
    fd = os.open(os.path.join(plan.journal_dir, LOCK_FILE_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        again = plan_journal_repair(plan.journal_dir, records.PAYLOAD_BYTES_LIMIT)
        assert again is not None and again.offset_bytes == plan.offset_bytes
        return move_aside(
            plan.journal_dir,
            label=f"index-{plan.index_lo}",
            report=plan.describe(),
            cut_path=plan.cut_path,
            cut_offset_bytes=plan.offset_bytes,
            moved_paths=plan.moved_paths,
        )
    finally:
        os.close(fd)
