"""The checkpoint's typed error (a checkpoint that cannot be read as FORMAT.md says)."""

from __future__ import annotations

from engine.errors import EngineError


class CheckpointCorrupt(EngineError):
    """Object `name` of a checkpoint does not decode, or does not agree with the rest."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"checkpoint object {name}: {reason}")
        self.name = name
        self.reason = reason
