"""A finding of `logsvc doctor` (logsvc/doctor.py, doctor_segments.py, doctor_journal.py),
and the reads of a data directory that report their failures as findings."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Final, Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: Final[tuple[Severity, ...]] = ("error", "warning", "info")
# Directory entries looked at per directory: a data directory holds a few files per shard;
# anything near this is not one of ours, and the rest is summarized instead of listed.
DIR_ENTRIES_LISTED_MAX: Final = 10_000


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing found. `code` is a stable slug for scripts (`torn_tail`, `segment_corrupt`,
    ...); `message` is for people."""

    severity: Severity
    code: str
    path: str
    message: str
    shard: int | None = None
    offset_bytes: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "severity": self.severity,
            "code": self.code,
            "shard": self.shard,
            "path": self.path,
            "offset_bytes": self.offset_bytes,
            "message": self.message,
        }


def list_dir(path: str, findings: list[Finding]) -> list[str] | None:
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        findings.append(Finding("error", "unreadable", path, f"cannot list: {exc.strerror}"))
        return None
    if len(names) > DIR_ENTRIES_LISTED_MAX:
        findings.append(
            Finding(
                "warning",
                "unexpected_file",
                path,
                f"{len(names)} entries; only the first {DIR_ENTRIES_LISTED_MAX} are checked",
            )
        )
        names = names[:DIR_ENTRIES_LISTED_MAX]
    return names


def read_file(path: str, findings: list[Finding]) -> bytes | None:
    """A regular file's bytes. O_NONBLOCK: a FIFO in its place must not hang the check."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        findings.append(Finding("error", "unreadable", path, f"cannot open: {exc.strerror}"))
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            findings.append(Finding("error", "unreadable", path, "not a regular file"))
            return None
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read()
    except OSError as exc:
        findings.append(Finding("error", "unreadable", path, f"cannot read: {exc.strerror}"))
        return None
    finally:
        os.close(fd)


def unexpected_file(path: str, what: str) -> Finding:
    return Finding(
        "warning", "unexpected_file", path, f"unexpected {what}: the node never writes it"
    )
