"""Limits of a node's data plane (the `[limits.server]` section), with units and reasons.

One class for the layer: the server (connections, pipelining, answers waiting for a slow
reader) and each hosted shard's front (`ShardHost`: its append queue, server-side group
commit, proposals and reads in flight, tail waits) read the same `ServerLimits` under the
same names as the config keys. Relations are checked by `validate()` and asserted at import
for the defaults.

What is NOT here: the largest frame. That is a property of the protocol, which both ends
of a connection must share (`logsvc.wire.limits.WireLimits`, 32 MiB): a server-side knob
for it could only make a node refuse what every client encodes, so there is none (an
earlier config key, `frame_body_bytes_max`, was validated and then ignored; it was removed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from logsvc.shard.limits import DEFAULT_SHARD_LIMITS, ShardLimits
from logsvc.wire.limits import DEFAULT_WIRE_LIMITS

KIB = 1024
MIB = 1024 * KIB

# Keys that may be 0: "no added wait".
_ZERO_ALLOWED = frozenset({"batch_delay_ms_max"})


@dataclass(frozen=True, slots=True)
class ServerLimits:
    # Client connections served at once; one more is refused (closed at once).
    connections_max: int = 1024

    # Requests read from one connection and not yet answered (pipelining). Past it a
    # request is answered OVERLOADED; appends and other requests count alike.
    inflight_requests_per_connection_max: int = 256

    # Answers of one connection waiting for a peer that does not read them; past it the
    # connection reads no further requests (TCP then pushes back on the client).
    write_buffer_bytes_max: int = 8 * MIB

    # The most one Read or Tail answer carries (a request asking for more gets this much);
    # one record larger than it is still returned alone, or a reader could never pass it.
    read_bytes_max: int = 8 * MIB

    # Server-side group commit: concurrent appends to one shard are packed into one Raft
    # entry of at most this many payload bytes (at most the shard's group_bytes_max)...
    batch_bytes_max: int = 1 * MIB
    # ...and at most this many appends (at most the shard's group_batches_max)...
    batch_appends_max: int = 1024
    # ...waiting at most this long for more appends once the first one is queued. 0 = no
    # added wait: appends that arrive while a batch is being proposed form the next one.
    batch_delay_ms_max: int = 0

    # Raft entries of one shard proposed and not yet applied: fewer, larger entries (each
    # costs a pickle and a seal per follower in pysyncobj) instead of one per request.
    proposals_inflight_per_shard_max: int = 4

    # How long a proposal may wait for its outcome before the client is told
    # OUTCOME_UNKNOWN (and retries with the same (client_id, seq), deduplicated).
    proposal_timeout_ms: int = 10_000

    # Appends waiting for their shard's next batch; past it an append gets OVERLOADED
    # instead of being buffered.
    appends_queued_per_shard_max: int = 10_000

    # Reads of one shard running on the node's reader threads; past it OVERLOADED.
    reads_inflight_per_shard_max: int = 64

    # Tail reads of one shard waiting for new records; past it OVERLOADED.
    tail_waiters_per_shard_max: int = 4096

    # The longest a tail read (long poll) may wait for new records (at most the wire's).
    tail_wait_ms_max: int = 30_000

    def validate(self, shard_limits: ShardLimits = DEFAULT_SHARD_LIMITS) -> ServerLimits:
        """Check each value and the relations; raise ValueError naming the field."""
        for limit in dataclasses.fields(self):
            value = getattr(self, limit.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{limit.name}: must be an integer, got {value!r}")
            if value < 0 or (value == 0 and limit.name not in _ZERO_ALLOWED):
                raise ValueError(f"{limit.name}: must be positive, got {value}")
        if self.batch_bytes_max > shard_limits.group_bytes_max:
            raise ValueError(
                f"batch_bytes_max: must be at most the shard's group_bytes_max "
                f"({shard_limits.group_bytes_max}), got {self.batch_bytes_max}"
            )
        if self.batch_appends_max > shard_limits.group_batches_max:
            raise ValueError(
                f"batch_appends_max: must be at most the shard's group_batches_max "
                f"({shard_limits.group_batches_max}), got {self.batch_appends_max}"
            )
        if self.read_bytes_max > DEFAULT_WIRE_LIMITS.read_bytes_max:
            raise ValueError(
                f"read_bytes_max: must be at most the protocol's read_bytes_max "
                f"({DEFAULT_WIRE_LIMITS.read_bytes_max}), got {self.read_bytes_max}"
            )
        if self.tail_wait_ms_max > DEFAULT_WIRE_LIMITS.tail_wait_ms_max:
            raise ValueError(
                f"tail_wait_ms_max: must be at most the protocol's tail_wait_ms_max "
                f"({DEFAULT_WIRE_LIMITS.tail_wait_ms_max}), got {self.tail_wait_ms_max}"
            )
        return self


DEFAULT_SERVER_LIMITS = ServerLimits().validate()
assert DEFAULT_SERVER_LIMITS.batch_bytes_max <= DEFAULT_SHARD_LIMITS.group_bytes_max
assert DEFAULT_SERVER_LIMITS.read_bytes_max <= DEFAULT_WIRE_LIMITS.read_bytes_max
