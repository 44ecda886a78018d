"""The rules for membership and leadership changes, checked on the leader before asking Raft.

Pure functions of a shard's status: the daemon's view and `FakeNodeView` call the same
ones, so the API answers the same way on both. Each returns normally or raises the typed
error of `errors.py` that names what is wrong.

Membership (Raft §6, one server at a time, which pysyncobj implements): a shard has 3 or
5 replicas in the config (`REPLICA_COUNTS`: an even count tolerates no more failures than
the odd count below it). Growing 3 -> 5 or replacing a replica goes through 4 on the way
(add, then remove), so the member count stays within [3, 5 + 1]: never fewer than the
minimum (removing below it would cut fault tolerance below what was configured; except a
member the leader cannot reach, which adds no fault tolerance: removing it and adding it
back is how a replica quarantined for corruption is rebuilt), at most one above the
maximum (room for a replacement). The leader never removes itself: the
shard would lose its leader in the middle of the change; transfer leadership first.

Leadership transfer (Raft thesis §3.10, pysyncobj's `transferLeadership`): only to a
member that has every entry of the leader's log (lag 0), or the transfer election would
fail. With no target named, the most caught-up connected follower is chosen, ties by node
id, as pysyncobj does.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Final

from logsvc.admin.errors import AlreadyAReplica, ChangeRefused, NotAReplica, UnknownNode
from logsvc.node_config import REPLICA_COUNTS

if TYPE_CHECKING:
    from logsvc.admin.status import ShardStatus

# A follower within this many Raft entries of the leader's log counts as caught up (the
# `caught_up` of a shard's status): a healthy follower under load trails by the entries in
# flight (a few group commits), a new replica copying the log by thousands.
CAUGHT_UP_LAG_ENTRIES_MAX: Final = 16

MEMBERS_MIN: Final = min(REPLICA_COUNTS)
MEMBERS_MAX: Final = max(REPLICA_COUNTS) + 1  # one more while a replica is being replaced

assert MEMBERS_MIN >= 3  # a majority survives one failure

# How long the leader's link to a member must stay down, sampled, before that member may be
# removed below MEMBERS_MIN: longer than a live peer takes to (re)connect (a dial's 3.5 s
# timeout plus the 1 s redial interval, logsvc/shard/raft/config.py), so only a replica that
# stays unreachable (dead, partitioned, quarantined for corruption) qualifies.
UNREACHABLE_CONFIRM_S: Final = 6.0
UNREACHABLE_SAMPLE_S: Final = 0.2


def caught_up(
    lag_entries: int | None, match_index: int | None = None, config_index: int = 0
) -> bool | None:
    """Whether a follower counts as caught up (None: unknown): within a few entries of
    the leader's log, and holding the entry of the current configuration (`config_index`,
    the membership change that made it): a replica just added is caught up only once it
    has everything up to its own addition, however short the log."""
    if lag_entries is None:
        return None
    if match_index is not None and match_index < config_index:
        return False
    return lag_entries <= CAUGHT_UP_LAG_ENTRIES_MAX


def learner_caught_up(match_index: int, leader_last_index: int) -> bool:
    """A learner may be promoted (added to the members) once it holds all but a few of the
    leader's entries: its addition then commits with it at once, and the group never
    waits for a replica still copying the log (Raft thesis §4.2.1)."""
    return leader_last_index - match_index <= CAUGHT_UP_LAG_ENTRIES_MAX


def check_add(status: ShardStatus, node_id: str, known_node_ids: Collection[str]) -> None:
    if node_id not in known_node_ids:
        raise UnknownNode(node_id)
    if node_id in status.member_ids:
        raise AlreadyAReplica(status.shard_id, node_id)
    if len(status.replicas) >= MEMBERS_MAX:
        raise ChangeRefused(
            f"shard {status.shard_id} has {len(status.replicas)} replicas, the most allowed "
            f"is {MEMBERS_MAX}; remove one first"
        )


def removal_below_minimum(status: ShardStatus) -> bool:
    """Whether removing a member would leave fewer than MEMBERS_MIN: allowed only for a
    member the leader cannot reach (`check_remove`), and only once that has lasted
    `UNREACHABLE_CONFIRM_S` (the caller samples it): a link that is down for a moment (a
    leader just elected whose follower has not dialled it yet, a reconnect on a loaded
    machine) says nothing about the replica, and removing a live member below the minimum
    would cost the shard its fault tolerance on a guess."""
    return len(status.replicas) <= MEMBERS_MIN


def check_remove(status: ShardStatus, node_id: str, known_node_ids: Collection[str]) -> None:
    if node_id not in known_node_ids:
        raise UnknownNode(node_id)
    if node_id not in status.member_ids:
        raise NotAReplica(status.shard_id, node_id)
    if node_id == status.node_id:
        raise ChangeRefused(
            f"node {node_id!r} leads shard {status.shard_id}: transfer leadership first"
        )
    if removal_below_minimum(status):
        [replica] = [r for r in status.replicas if r.node_id == node_id]
        if replica.connected is not False:
            raise ChangeRefused(
                f"shard {status.shard_id} would have {len(status.replicas) - 1} replicas, "
                f"fewer than {MEMBERS_MIN}; add one first (only an unreachable replica, "
                "e.g. one quarantined for corruption, may be removed below the minimum, "
                "to be added back at once)"
            )
        # A member the leader cannot reach adds no fault tolerance today: removing it
        # (to add it back empty: the repair of a quarantined replica, etcd's member
        # remove/add) leaves the shard exactly as tolerant as it already is.


def choose_transfer_target(
    status: ShardStatus, target_node_id: str | None, known_node_ids: Collection[str]
) -> str:
    """The node to hand leadership to; `status.node_id` itself means "already the leader"
    (a no-op for the caller)."""
    if target_node_id is not None:
        if target_node_id not in known_node_ids:
            raise UnknownNode(target_node_id)
        if target_node_id not in status.member_ids:
            raise NotAReplica(status.shard_id, target_node_id)
        if target_node_id == status.node_id:
            return target_node_id
        [replica] = [r for r in status.replicas if r.node_id == target_node_id]
        if replica.lag_entries != 0:
            behind = "an unknown number of" if replica.lag_entries is None else replica.lag_entries
            raise ChangeRefused(
                f"node {target_node_id!r} is {behind} entries behind the leader; "
                "leadership goes only to a caught-up replica"
            )
        return target_node_id
    candidates = [
        (replica.match_index or 0, replica.node_id)
        for replica in status.replicas
        if replica.node_id != status.node_id and replica.connected and replica.lag_entries == 0
    ]
    if not candidates:
        raise ChangeRefused(
            f"shard {status.shard_id} has no connected, caught-up follower to lead it"
        )
    return max(candidates)[1]
