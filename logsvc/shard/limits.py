"""Limits of a shard's commands and state machine, with units and reasons.

Every value here changes what the replicated state machine does: a command over a codec
limit does not decode, and the dedupe limits decide which clients and seqs are forgotten.
So these are NOT per-node configuration: every replica of a shard must run with the same
`ShardLimits` (in production, `DEFAULT_SHARD_LIMITS`). A replica with smaller codec limits
refuses (loudly, `CommandCorrupt`) an entry the others applied; the dedupe limits are
written into every snapshot and a restore with different ones is refused
(`SnapshotIncompatible`). Tests pass smaller limits to reach the edges quickly.

Relations between the limits, and with the shard store that journals every command, are
checked by `validate()` and asserted at import for the defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from logsvc.store.limits import DEFAULT_LIMITS as STORE_DEFAULT_LIMITS

KIB = 1024
MIB = 1024 * KIB

# The command frame header: magic "LSC" (3) + version u8 (1) + xxh3_64 u64 (8). See FORMAT.md.
COMMAND_HEADER_BYTES = 12

# The most msgpack adds around an AppendBatch's variable parts: array header (1), type tag
# (1), client_id str header (at most 5), seq (9), epoch (9), records array header (5).
COMMAND_MSGPACK_FIXED_BYTES_MAX = 1 + 1 + 5 + 9 + 9 + 5
# ...and per record: a bin header (at most 5 bytes: 0xc6 + u32 length).
COMMAND_MSGPACK_PER_RECORD_BYTES_MAX = 5

# What pysyncobj wraps around our command bytes before they become a journal entry's
# payload: a command-type byte and the pickle of `(func_id, (command_bytes,), {})`, a few
# dozen bytes. The budget is generous so the relation below never depends on pickle details.
RAFT_ENTRY_WRAP_BYTES_BUDGET = 4 * KIB

U64_MAX = 2**64 - 1  # msgpack and the snapshot carry every integer as an unsigned 64-bit one


@dataclass(frozen=True, slots=True)
class ShardLimits:
    # Records in one AppendBatch (one Raft entry). Bounds the per-record msgpack overhead
    # and the size of the decoded tuple; a client with more splits its batch.
    records_per_batch_max: int = 65_536

    # One record's payload. An engine WAL entry larger than this is the engine's bug.
    record_bytes_max: int = 8 * MIB

    # Sum of the record payloads of one batch. With the msgpack and frame overhead it must
    # fit in one store record (`record_payload_bytes_max`, 16 MiB), so 1 MiB is left for
    # the overhead of up to 65,536 records (5 bytes each) and pysyncobj's wrapping.
    batch_bytes_max: int = 15 * MIB

    # UTF-8 bytes of an AppendBatch's client_id / an AcquireLease's holder. Ids, not data.
    client_id_bytes_max: int = 256
    holder_bytes_max: int = 256

    # Dedupe table: clients remembered (least recently active evicted first) and seqs
    # remembered per client (lowest evicted first). 10,000 x 16 entries is a few MiB in
    # the worst case, in memory and in every snapshot.
    dedupe_clients_max: int = 10_000
    dedupe_seqs_per_client: int = 16

    # Snapshot points kept (one recorded per applied Truncate). The engine truncates after
    # each checkpoint and a point becomes compactable one truncate later, so two or three
    # are normally in use; 8 leaves room for bursts of truncates. At least 2: the
    # compaction point and the newest point are both kept.
    snapshot_points_max: int = 8

    @property
    def command_bytes_max(self) -> int:
        """The largest encoded command frame (an AppendBatch at every limit)."""
        return (
            COMMAND_HEADER_BYTES
            + COMMAND_MSGPACK_FIXED_BYTES_MAX
            + self.client_id_bytes_max
            + self.records_per_batch_max * COMMAND_MSGPACK_PER_RECORD_BYTES_MAX
            + self.batch_bytes_max
        )

    def validate(self, store_record_payload_bytes_max: int | None = None) -> ShardLimits:
        """Check each value and the relations; raise ValueError naming the field.

        `store_record_payload_bytes_max` is the journal's limit (default: the store's
        default): a command plus pysyncobj's wrapping must fit in one store record.
        """
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{field.name}: must be an integer, got {value!r}")
            if value < 1:
                raise ValueError(f"{field.name}: must be positive, got {value}")
        if self.snapshot_points_max < 2:
            raise ValueError(
                "snapshot_points_max: must be at least 2 (the compaction point and the newest)"
            )
        if self.record_bytes_max > self.batch_bytes_max:
            raise ValueError("record_bytes_max: must be at most batch_bytes_max")
        if self.records_per_batch_max >= 2**32 or self.batch_bytes_max >= 2**32:
            raise ValueError("records_per_batch_max, batch_bytes_max: msgpack lengths are u32")
        store_max = (
            STORE_DEFAULT_LIMITS.record_payload_bytes_max
            if store_record_payload_bytes_max is None
            else store_record_payload_bytes_max
        )
        if self.command_bytes_max + RAFT_ENTRY_WRAP_BYTES_BUDGET > store_max:
            raise ValueError(
                f"batch_bytes_max: a full batch encodes to {self.command_bytes_max} bytes, "
                f"which with {RAFT_ENTRY_WRAP_BYTES_BUDGET} bytes of Raft wrapping exceeds "
                f"the store's record_payload_bytes_max ({store_max})"
            )
        return self


DEFAULT_SHARD_LIMITS = ShardLimits().validate()

# The relation the brief asks to hold at import, spelled out: a full batch, framed and
# wrapped by pysyncobj, fits in one record of the default shard store.
assert (
    DEFAULT_SHARD_LIMITS.command_bytes_max + RAFT_ENTRY_WRAP_BYTES_BUDGET
    <= STORE_DEFAULT_LIMITS.record_payload_bytes_max
)
