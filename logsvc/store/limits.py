"""Limits and tunables of the shard store, with units and reasons.

`StoreLimits` is a frozen dataclass; `validate()` checks each value and the relations
between them and raises `ValueError` naming the field (the daemon's config loader turns
that into "config error: store.<field>: ...", exit 2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from logsvc.store import records

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class StoreLimits:
    # A segment is rolled once it holds this many bytes. Bigger segments mean fewer files
    # and directory fsyncs; smaller ones mean finer-grained prefix truncation (only whole
    # segments are deleted) and faster recovery scans of the newest one.
    segment_bytes_max: int = 64 * MIB

    # The largest payload of one entry. One Raft entry carries a batch of client records,
    # so this bounds a batch; it is also the bound recovery uses to reject absurd lengths.
    record_payload_bytes_max: int = 16 * MIB

    # Group commit: a sync starts when this many bytes are waiting to be made durable...
    group_commit_bytes_max: int = 1 * MIB
    # ...or when the oldest entry anyone waits for has waited this long. 0 = sync as soon
    # as the previous sync returns (the disk is never idle while somebody waits).
    group_commit_delay_ms_max: int = 0

    # Appended bytes kept in memory before they are written to the OS (still unsynced).
    # Bounds the write buffer; a write is one syscall for many entries.
    write_buffer_bytes_max: int = 4 * MIB

    # Recent entries kept in memory for reads (Raft re-sends recent entries to followers;
    # clients tail the log). Must hold the whole write buffer, so unwritten entries are
    # always readable from memory.
    cache_bytes_max: int = 32 * MIB

    # How long wait_durable() may block before it gives up with TimeoutError; a bound on
    # every wait. A healthy disk syncs in milliseconds.
    sync_wait_ms_max: int = 30_000

    # Zero-ahead (FORMAT.md "Zero-ahead"): a sync whose write grows the newest segment file
    # (and so pays ext4's journal commit for the new size anyway) also writes zeros past
    # the records, as many bytes as the segment already holds, at least `_min` and at most
    # `_max`; the syncs of the records that then overwrite those zeros flush data only.
    # `python -m logsvc.bench.fsync_probe` on a journaled ext4 (README, "Shard store"):
    # fdatasync of a 140-byte write p50 0.18-1.0 ms over written zeros against 2.2-5.1 ms
    # growing the file, in the same runs. The bound keeps the zeros a live segment
    # carries (disk space, and the recovery scan past them) at most `_max`, and at most
    # what it holds for a small one; never past `segment_bytes_max`. 0 disables it.
    # `_min` is small because a node with a thousand active shards writes it into every
    # shard's newest segment (16 MiB of zeros per node, where 64 KiB would be 64 MiB); a
    # busy segment doubles its zeros at each growth, so a lone writer's file grows
    # ~log2(1 MiB / 16 KiB) = 6 times, then once per MiB.
    zero_ahead_bytes_min: int = 16 * KIB
    zero_ahead_bytes_max: int = 1 * MIB

    def validate(self) -> StoreLimits:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{field.name}: must be an integer, got {value!r}")
            if value < 0 or (value == 0 and field.name not in _ZERO_ALLOWED):
                raise ValueError(f"{field.name}: must be positive, got {value}")
        if self.zero_ahead_bytes_min > self.zero_ahead_bytes_max:
            raise ValueError("zero_ahead_bytes_min: must be at most zero_ahead_bytes_max")
        if self.segment_bytes_max > records.SEGMENT_BYTES_LIMIT:
            raise ValueError(
                f"segment_bytes_max: must be at most {records.SEGMENT_BYTES_LIMIT} "
                "(offsets are stored as 32-bit numbers)"
            )
        if self.record_payload_bytes_max > records.PAYLOAD_BYTES_LIMIT:
            raise ValueError(
                f"record_payload_bytes_max: must be at most {records.PAYLOAD_BYTES_LIMIT}"
            )
        if self.cache_bytes_max < self.write_buffer_bytes_max:
            raise ValueError(
                "cache_bytes_max: must be at least write_buffer_bytes_max, so entries not "
                "yet written to the OS are always readable from memory"
            )
        return self


# Fields for which 0 means "off": no group-commit delay, no zero-ahead.
_ZERO_ALLOWED = ("group_commit_delay_ms_max", "zero_ahead_bytes_min", "zero_ahead_bytes_max")

DEFAULT_LIMITS = StoreLimits().validate()


@dataclass(frozen=True, slots=True)
class JournalLimits:
    """Limits of the node journal (journal.py; docs/decisions/0011-shared-journal.md)."""

    # A journal file is sealed and a new one started past this size. Sealed files are
    # deleted once every store caught up with them, so this is also the granularity at
    # which the journal gives space back.
    file_bytes_max: int = 64 * MIB

    # Live journal bytes (every file not yet deleted) above which the appending thread
    # checkpoints the stores holding up the oldest file itself before returning: the
    # journal, hence recovery time and disk use, stays bounded however far the background
    # checkpoints fall behind.
    bytes_max: int = 256 * MIB

    # Encoded records kept in memory before they are written to the OS (still unsynced);
    # past it the appending thread writes them out itself (no fsync).
    write_buffer_bytes_max: int = 4 * MIB

    # The largest entry payload (as StoreLimits.record_payload_bytes_max) and so the
    # largest record recovery accepts.
    record_payload_bytes_max: int = 16 * MIB

    # How long a sync may wait for the journal (the disk busy with other shards' syncs)
    # before giving up with SyncTimeout.
    sync_wait_ms_max: int = 30_000

    def validate(self) -> JournalLimits:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field.name}: must be a positive integer, got {value!r}")
        if self.record_payload_bytes_max > records.PAYLOAD_BYTES_LIMIT:
            raise ValueError(
                f"record_payload_bytes_max: must be at most {records.PAYLOAD_BYTES_LIMIT}"
            )
        if self.file_bytes_max > self.bytes_max:
            raise ValueError("file_bytes_max: must be at most bytes_max")
        return self


DEFAULT_JOURNAL_LIMITS = JournalLimits().validate()
