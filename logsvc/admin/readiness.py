"""When a node is ready (`GET /readyz`): a pure rule over its hosted shards' statuses.

A node is ready when every shard it hosts is, and a hosted shard is ready when all of:

1. `replica_failed`: its replica has not stopped on a fatal error;
2. `no_leader`: a leader is known (this node or another) - a shard without one takes no
   writes;
3. `leader_commit_unknown`: this replica has heard the leader's commit index (a replica
   that never heard from a leader cannot tell whether it is behind);
4. `applying_behind`: this replica has applied the leader's commit index, give or take
   `ready_apply_lag_entries_max` entries (`AdminLimits`): it serves reads of everything
   committed, give or take that. A replica just added, or restarted after a long stop,
   is not ready until it has caught up with the leader (from the records or a snapshot).
5. `status_unavailable`: the node could not report the shard's status at all;
6. `joining`: the replica was started to join the shard (a membership change) and has
   not yet received the entry that adds it, which the leader sends only after every
   retained entry before it: until then it holds an incomplete copy of the log.

A shard failing a rule lists every rule it fails, by the names above. A node hosting no
shard is ready (there is nothing to wait for): a load balancer sends it admin traffic
only, which it serves. Readiness is not health: a node that is not ready is alive and its
admin API answers (`/healthz` is about the process alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from logsvc.admin.status import ShardStatus

REPLICA_FAILED = "replica_failed"
NO_LEADER = "no_leader"
LEADER_COMMIT_UNKNOWN = "leader_commit_unknown"
APPLYING_BEHIND = "applying_behind"
STATUS_UNAVAILABLE = "status_unavailable"
JOINING = "joining"


@dataclass(frozen=True, slots=True)
class ShardReadiness:
    shard_id: int
    ready: bool
    reasons: tuple[str, ...]  # the rules failed, in the order above; empty when ready
    apply_lag_entries: int | None  # leader's commit index - applied index, if known


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    shards: tuple[ShardReadiness, ...]


def assess_shard(status: ShardStatus, apply_lag_entries_max: int) -> ShardReadiness:
    assert apply_lag_entries_max >= 0
    reasons: list[str] = []
    if status.failed:
        reasons.append(REPLICA_FAILED)
    if status.leader is None:
        reasons.append(NO_LEADER)
    lag = status.apply_lag_entries
    if lag is None:
        reasons.append(LEADER_COMMIT_UNKNOWN)
    elif lag > apply_lag_entries_max:
        reasons.append(APPLYING_BEHIND)
    if status.joining:
        reasons.append(JOINING)
    return ShardReadiness(status.shard_id, not reasons, tuple(reasons), lag)


def unavailable(shard_id: int) -> ShardReadiness:
    """A hosted shard whose status could not be read."""
    return ShardReadiness(shard_id, False, (STATUS_UNAVAILABLE,), None)


def assess(shards: Sequence[ShardReadiness]) -> Readiness:
    return Readiness(all(shard.ready for shard in shards), tuple(shards))
