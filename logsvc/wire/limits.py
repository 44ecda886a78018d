"""Limits of the data-plane protocol, with units and reasons.

Both ends of a connection must run with the same `WireLimits` (in production,
`DEFAULT_WIRE_LIMITS`): a client with larger limits gets `BAD_REQUEST` / `TOO_LARGE`
replies, one with smaller limits refuses to encode what the server would accept. Tests pass
smaller limits to reach the edges quickly.

The Append limits are the shard's (`logsvc.shard.limits.DEFAULT_SHARD_LIMITS`), so a request
the wire accepts is never refused by the command codec for its size. `validate()` checks
that, and that the largest valid message of every kind fits in one frame; the defaults are
validated at import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from logsvc.shard import limits as shard_limits_module
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS, ShardLimits

KIB = 1024
MIB = 1024 * KIB

# The frame header (see FORMAT.md): magic 3 + version 1 + kind 1 + reserved 3
# + request_id 8 + body_bytes 4 + body checksum 8 + header checksum 4.
FRAME_HEADER_BYTES = 32

# body_bytes is a u32 in the header.
FRAME_BODY_BYTES_LIMIT = 2**32 - 1

U32_MAX = 2**32 - 1  # shard ids
U64_MAX = 2**64 - 1  # LSNs, terms, seqs, epochs, request ids: msgpack's widest uint
assert U64_MAX == shard_limits_module.U64_MAX

# The most msgpack adds around an Append body's variable parts: array header (1), op (1),
# shard (5, u32), records array header (5), client_id str header (5), seq (9), epoch (9)...
APPEND_MSGPACK_FIXED_BYTES_MAX = 1 + 1 + 5 + 5 + 5 + 9 + 9
# ...and around a Records body's: array header (1), tag (1), records array header (5),
# first_lsn (9), next_lsn (9)...
RECORDS_MSGPACK_FIXED_BYTES_MAX = 1 + 1 + 5 + 9 + 9
# ...and per record, in both: a bin header (at most 5 bytes: 0xc6 + u32 length).
MSGPACK_PER_RECORD_BYTES_MAX = 5
# Every other message is at most 8 fields of at most 9 bytes (plus a 1-byte array header)
# beside its strings, each string with a header of at most 5 bytes.
OTHER_MSGPACK_FIXED_BYTES_MAX = 1 + 8 * 9
MSGPACK_PER_STR_BYTES_MAX = 5


@dataclass(frozen=True, slots=True)
class WireLimits:
    # The largest frame body. Checked against the header before the body is buffered, so a
    # peer cannot make the server hold more than this for one frame. It must hold the
    # largest valid Append (15 MiB of records) and the largest Records reply (16 MiB).
    frame_body_bytes_max: int = 32 * MIB

    # What one `FrameDecoder.feed()` may bring beyond a pending, incomplete frame. The
    # receive buffer is bounded by header + body max + this (`receive_buffer_bytes_max`);
    # a shell that drains `next_frame()` after every feed and reads at most this much per
    # call (asyncio reads 256 KiB) never reaches the bound.
    feed_bytes_max: int = 1 * MIB

    # UTF-8 bytes of an Authenticate token: a secret, not data.
    token_bytes_max: int = 1 * KIB

    # UTF-8 bytes of a node name or address (ShardStatus.leader, ErrorResponse.leader_hint):
    # "host:port" or a node id.
    node_id_bytes_max: int = 256

    # UTF-8 bytes of an ErrorResponse message: one human-readable line, not a traceback.
    error_message_bytes_max: int = 4 * KIB

    # Append: the shard's command limits (see the module docstring).
    client_id_bytes_max: int = DEFAULT_SHARD_LIMITS.client_id_bytes_max
    holder_bytes_max: int = DEFAULT_SHARD_LIMITS.holder_bytes_max
    append_records_max: int = DEFAULT_SHARD_LIMITS.records_per_batch_max
    record_bytes_max: int = DEFAULT_SHARD_LIMITS.record_bytes_max
    append_bytes_max: int = DEFAULT_SHARD_LIMITS.batch_bytes_max

    # Read / Tail: the largest `max_bytes` a request may ask for, which is also the bound on
    # the record bytes of a Records reply. The server returns at least one record when there
    # is one, even one larger than `max_bytes` (else a reader could never pass it), so this
    # must be at least `record_bytes_max`.
    read_bytes_max: int = 16 * MIB

    # Records in one Records reply. Empty records cost no bytes, so `max_bytes` alone does
    # not bound the count (or the decoded tuple): the server stops here too.
    read_records_max: int = 65_536

    # The longest a Tail may ask the server to hold it (long-poll). Longer waits are better
    # done as a new Tail; it also bounds how long a request can stay in flight.
    tail_wait_ms_max: int = 60_000

    @property
    def receive_buffer_bytes_max(self) -> int:
        """The bound on a `FrameDecoder`'s buffer: one whole frame plus one feed."""
        return FRAME_HEADER_BYTES + self.frame_body_bytes_max + self.feed_bytes_max

    @property
    def append_body_bytes_max(self) -> int:
        """The largest encoded Append body (every limit reached)."""
        return (
            APPEND_MSGPACK_FIXED_BYTES_MAX
            + self.client_id_bytes_max
            + self.append_records_max * MSGPACK_PER_RECORD_BYTES_MAX
            + self.append_bytes_max
        )

    @property
    def records_body_bytes_max(self) -> int:
        """The largest encoded Records body."""
        return (
            RECORDS_MSGPACK_FIXED_BYTES_MAX
            + self.read_records_max * MSGPACK_PER_RECORD_BYTES_MAX
            + self.read_bytes_max
        )

    @property
    def other_body_bytes_max(self) -> int:
        """A bound on every other body: its fixed fields and all its strings at their
        limits (looser than any one message needs)."""
        strings = (
            self.token_bytes_max,
            self.node_id_bytes_max,
            self.error_message_bytes_max,
            self.holder_bytes_max,
        )
        return OTHER_MSGPACK_FIXED_BYTES_MAX + sum(
            MSGPACK_PER_STR_BYTES_MAX + size for size in strings
        )

    @property
    def str_bytes_max(self) -> int:
        """The longest string any message may hold (the msgpack decoder's `max_str_len`)."""
        return max(
            self.token_bytes_max,
            self.node_id_bytes_max,
            self.error_message_bytes_max,
            self.client_id_bytes_max,
            self.holder_bytes_max,
        )

    @property
    def array_len_max(self) -> int:
        """The longest array any message holds (the decoder's `max_array_len`): a records
        array, or a body of at most 8 elements."""
        return max(self.append_records_max, self.read_records_max, 8)

    def validate(self, shard_limits: ShardLimits = DEFAULT_SHARD_LIMITS) -> WireLimits:
        """Check each value and the relations; raise ValueError naming the field."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{field.name}: must be an integer, got {value!r}")
            if value < 1:
                raise ValueError(f"{field.name}: must be positive, got {value}")
        if self.frame_body_bytes_max > FRAME_BODY_BYTES_LIMIT:
            raise ValueError("frame_body_bytes_max: the header carries the body length as u32")
        for name, shard_name in (
            ("client_id_bytes_max", "client_id_bytes_max"),
            ("holder_bytes_max", "holder_bytes_max"),
            ("append_records_max", "records_per_batch_max"),
            ("record_bytes_max", "record_bytes_max"),
            ("append_bytes_max", "batch_bytes_max"),
        ):
            if getattr(self, name) > getattr(shard_limits, shard_name):
                raise ValueError(
                    f"{name}: must be at most the shard's {shard_name} "
                    f"({getattr(shard_limits, shard_name)}), or the server would accept an "
                    "Append its command codec refuses"
                )
        if self.record_bytes_max > self.append_bytes_max:
            raise ValueError("record_bytes_max: must be at most append_bytes_max")
        if self.read_bytes_max < self.record_bytes_max:
            raise ValueError(
                "read_bytes_max: must be at least record_bytes_max, so a reply can always "
                "carry the one record a read must return"
            )
        for what, size in (
            ("an Append", self.append_body_bytes_max),
            ("a Records reply", self.records_body_bytes_max),
            ("a message with strings at their limits", self.other_body_bytes_max),
        ):
            if size > self.frame_body_bytes_max:
                raise ValueError(
                    f"frame_body_bytes_max: {what} can encode to {size} bytes, over the "
                    f"limit of {self.frame_body_bytes_max}"
                )
        return self


DEFAULT_WIRE_LIMITS = WireLimits().validate()

# The relations the brief asks to hold at import, spelled out for the defaults: every valid
# Append is a valid shard command, and the largest valid message fits in one frame.
assert DEFAULT_WIRE_LIMITS.append_records_max <= DEFAULT_SHARD_LIMITS.records_per_batch_max
assert DEFAULT_WIRE_LIMITS.record_bytes_max <= DEFAULT_SHARD_LIMITS.record_bytes_max
assert DEFAULT_WIRE_LIMITS.append_bytes_max <= DEFAULT_SHARD_LIMITS.batch_bytes_max
assert DEFAULT_WIRE_LIMITS.client_id_bytes_max <= DEFAULT_SHARD_LIMITS.client_id_bytes_max
assert DEFAULT_WIRE_LIMITS.holder_bytes_max <= DEFAULT_SHARD_LIMITS.holder_bytes_max
assert DEFAULT_WIRE_LIMITS.read_bytes_max >= DEFAULT_WIRE_LIMITS.record_bytes_max
assert DEFAULT_WIRE_LIMITS.append_body_bytes_max <= DEFAULT_WIRE_LIMITS.frame_body_bytes_max
assert DEFAULT_WIRE_LIMITS.records_body_bytes_max <= DEFAULT_WIRE_LIMITS.frame_body_bytes_max
