"""A finding of `logsvc doctor` (logsvc/doctor.py, logsvc/doctor_journal.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: Final[tuple[Severity, ...]] = ("error", "warning", "info")


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
