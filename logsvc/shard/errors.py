"""Operating errors of a shard's pure core (commands codec, state machine).

The outcomes of applying a command (a stale epoch, a duplicate, ...) are not exceptions:
they are replicated results (`logsvc.shard.commands.Result`), identical on every replica.
These exceptions are for the edges: building or decoding bytes, restoring a snapshot,
mapping an LSN to its entry. Programmer errors (applying raft indexes out of order) are
assertions and crash. The tree:

    ShardError
    ├── CommandError
    │   ├── CommandInvalid(reason)                 a caller-built command breaks a rule
    │   │                                          (negative seq, empty client_id, ...):
    │   │                                          refused before it is encoded
    │   ├── CommandTooLarge(what, size, limit)     a record, batch or group over its limit:
    │   │                                          split it
    │   └── CommandCorrupt(reason)                 bytes that are not a valid command frame
    ├── SnapshotCorrupt(reason)                    bytes that are not a valid snapshot
    │   └── SnapshotIncompatible(reason)           a valid snapshot taken with other dedupe
    │                                              limits: restoring it would diverge
    └── LsnUnavailable(lsn)
        ├── LsnTruncated(lsn, first_lsn)           below the first retained LSN
        └── LsnNotAssigned(lsn, next_lsn)          not assigned yet (at or past the tail)
"""

from __future__ import annotations


class ShardError(Exception):
    """Base of every operating error raised by the shard's core."""


class CommandError(ShardError):
    """A command could not be encoded or decoded."""


class CommandInvalid(CommandError):
    """A command breaks a rule of its fields; nothing was encoded."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid command: {reason}")
        self.reason = reason


class CommandTooLarge(CommandError):
    """A record, a batch or a group (in records, bytes or batches) exceeds its limit; nothing
    was encoded. `what` names the limit (`record_bytes_max`, `batch_bytes_max`,
    `records_per_batch_max`, `group_batches_max`, `group_bytes_max`)."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"command too large: {size} exceeds {what} ({limit})")
        self.what = what
        self.size = size
        self.limit = limit


class CommandCorrupt(CommandError):
    """Bytes that do not decode to a valid command: truncated, damaged, an unknown version,
    or fields out of range. Never a raw msgpack or struct exception."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"corrupt command: {reason}")
        self.reason = reason


class SnapshotCorrupt(ShardError):
    """Bytes that do not decode to a valid state machine snapshot."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"corrupt snapshot: {reason}")
        self.reason = reason


class SnapshotIncompatible(SnapshotCorrupt):
    """A whole snapshot, taken under dedupe limits other than this replica's. Restoring it
    would make this replica forget clients and seqs differently from the others."""


class LsnUnavailable(ShardError):
    """The LSN has no retained entry on this replica."""

    def __init__(self, message: str, lsn: int) -> None:
        super().__init__(message)
        self.lsn = lsn


class LsnTruncated(LsnUnavailable):
    """The LSN is below the first retained LSN (the shard was truncated past it)."""

    def __init__(self, lsn: int, first_lsn: int) -> None:
        super().__init__(f"lsn {lsn} is truncated (first retained lsn is {first_lsn})", lsn)
        self.first_lsn = first_lsn


class LsnNotAssigned(LsnUnavailable):
    """The LSN is at or past the tail: no record has it yet."""

    def __init__(self, lsn: int, next_lsn: int) -> None:
        super().__init__(f"lsn {lsn} is not assigned yet (next lsn is {next_lsn})", lsn)
        self.next_lsn = next_lsn
