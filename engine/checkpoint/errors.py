"""The checkpoint's typed error (a checkpoint that cannot be read as FORMAT.md says)."""

from __future__ import annotations

from engine.errors import EngineError


class CheckpointCorrupt(EngineError):
    """Object `name` of a checkpoint does not decode, or does not agree with the rest."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"checkpoint object {name}: {reason}")
        self.name = name
        self.reason = reason


class CheckpointDamaged(EngineError):
    """The engine cannot open: checkpoint `checkpoint` (its manifest's name) is damaged
    (`object` is the object that does not read: the manifest itself, or one it names), and
    the WAL no longer holds what an older checkpoint would need (it was truncated below the
    damaged one). `__cause__` is the `CheckpointCorrupt` the read raised. Repair or restore
    the named object; the engine does not fall back to an older state it cannot complete."""

    def __init__(self, checkpoint: str, object_name: str, reason: str, detail: str) -> None:
        super().__init__(
            f"checkpoint {checkpoint} is damaged: object {object_name}: {reason}; {detail}"
        )
        self.checkpoint = checkpoint
        self.object = object_name
        self.reason = reason
