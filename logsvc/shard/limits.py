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

# The most msgpack adds around an AppendGroup: array header (1), type tag (1), batches
# array header (5)...
GROUP_MSGPACK_FIXED_BYTES_MAX = 1 + 1 + 5
# ...and per batch (besides its client_id bytes and records): the batch's array header (1),
# client_id str header (at most 5), seq (9), epoch (9), records array header (5).
GROUP_MSGPACK_PER_BATCH_BYTES_MAX = 1 + 5 + 9 + 9 + 5

# What pysyncobj wraps around our command bytes before they become a journal entry's
# payload: a command-type byte and the pickle of `(func_id, (command_bytes,), {})`, a few
# dozen bytes. The budget is generous so the relation below never depends on pickle details.
RAFT_ENTRY_WRAP_BYTES_BUDGET = 4 * KIB

U64_MAX = 2**64 - 1  # msgpack and the snapshot carry every integer as an unsigned 64-bit one


@dataclass(frozen=True, slots=True)
class ShardLimits:
    # Records in one Raft entry: one AppendBatch, or all the batches of one AppendGroup
    # together. Bounds the per-record msgpack overhead and the size of the decoded tuple; a
    # client with more splits its batch.
    records_per_batch_max: int = 65_536

    # One record's payload. An engine WAL entry larger than this is the engine's bug.
    record_bytes_max: int = 8 * MIB

    # Sum of the record payloads of one batch. With the msgpack and frame overhead it must
    # fit in one store record (`record_payload_bytes_max`, 16 MiB), so 1 MiB is left for
    # the overhead of up to 65,536 records (5 bytes each) and pysyncobj's wrapping.
    batch_bytes_max: int = 15 * MIB

    # An AppendGroup (one Raft entry packing many clients' AppendBatches, issue 4's
    # server-side group commit): at most this many batches...
    group_batches_max: int = 4096
    # ...whose record payloads sum to at most this many bytes. Less than batch_bytes_max:
    # each batch adds up to 29 + client_id_bytes_max bytes of msgpack (4,096 x 285 bytes,
    # about 1.1 MiB at the defaults), and the whole frame must still fit in one store record
    # (see `command_bytes_max`). A batch bigger than this is proposed alone, as a plain
    # AppendBatch. The records of all the batches of a group count against
    # records_per_batch_max together (a group's records are one entry's records).
    group_bytes_max: int = 14 * MIB

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
    def batch_command_bytes_max(self) -> int:
        """The largest encoded AppendBatch frame (every limit reached)."""
        return (
            COMMAND_HEADER_BYTES
            + COMMAND_MSGPACK_FIXED_BYTES_MAX
            + self.client_id_bytes_max
            + self.records_per_batch_max * COMMAND_MSGPACK_PER_RECORD_BYTES_MAX
            + self.batch_bytes_max
        )

    @property
    def group_command_bytes_max(self) -> int:
        """The largest encoded AppendGroup frame: group_batches_max batches with the longest
        client_id, records_per_batch_max records in all, group_bytes_max bytes of them."""
        return (
            COMMAND_HEADER_BYTES
            + GROUP_MSGPACK_FIXED_BYTES_MAX
            + self.group_batches_max
            * (GROUP_MSGPACK_PER_BATCH_BYTES_MAX + self.client_id_bytes_max)
            + self.records_per_batch_max * COMMAND_MSGPACK_PER_RECORD_BYTES_MAX
            + self.group_bytes_max
        )

    @property
    def command_bytes_max(self) -> int:
        """The largest encoded command frame (a full AppendBatch or a full AppendGroup);
        the decoder refuses a longer frame before reading it."""
        return max(self.batch_command_bytes_max, self.group_command_bytes_max)

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
        if self.group_batches_max >= 2**32 or self.group_bytes_max >= 2**32:
            raise ValueError("group_batches_max, group_bytes_max: msgpack lengths are u32")
        store_max = (
            STORE_DEFAULT_LIMITS.record_payload_bytes_max
            if store_record_payload_bytes_max is None
            else store_record_payload_bytes_max
        )
        if self.batch_command_bytes_max + RAFT_ENTRY_WRAP_BYTES_BUDGET > store_max:
            raise ValueError(
                f"batch_bytes_max: a full batch encodes to {self.batch_command_bytes_max} "
                f"bytes, which with {RAFT_ENTRY_WRAP_BYTES_BUDGET} bytes of Raft wrapping "
                f"exceeds the store's record_payload_bytes_max ({store_max})"
            )
        if self.group_command_bytes_max + RAFT_ENTRY_WRAP_BYTES_BUDGET > store_max:
            raise ValueError(
                f"group_bytes_max, group_batches_max: a full group encodes to "
                f"{self.group_command_bytes_max} bytes, which with "
                f"{RAFT_ENTRY_WRAP_BYTES_BUDGET} bytes of Raft wrapping exceeds the store's "
                f"record_payload_bytes_max ({store_max})"
            )
        return self


DEFAULT_SHARD_LIMITS = ShardLimits().validate()

# The relations the brief asks to hold at import, spelled out: a full batch and a full
# group, framed and wrapped by pysyncobj, each fit in one record of the default shard store.
assert (
    DEFAULT_SHARD_LIMITS.batch_command_bytes_max + RAFT_ENTRY_WRAP_BYTES_BUDGET
    <= STORE_DEFAULT_LIMITS.record_payload_bytes_max
)
assert (
    DEFAULT_SHARD_LIMITS.group_command_bytes_max + RAFT_ENTRY_WRAP_BYTES_BUDGET
    <= STORE_DEFAULT_LIMITS.record_payload_bytes_max
)
