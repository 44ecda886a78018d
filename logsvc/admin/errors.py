"""Operating errors of the admin plane: what a `NodeView` raises, and the app answers.

Each error carries a stable `code` (the "code" of the JSON error body) and what a caller
needs to act on it (the leader to go to, the current lease epoch). The app maps each
branch of the tree to one HTTP status; anything else a view raises is a bug, answered 500
with a generic message (and logged with its traceback, never sent).

    AdminError(message)                                  code
    ├── NotFound                                                          -> 404
    │   ├── UnknownShard(shard_id)                       unknown_shard
    │   ├── ShardNotHosted(shard_id, replicas)           shard_not_hosted   (ask one of
    │   │                                                                   `replicas`)
    │   ├── UnknownNode(node_id)                         unknown_node
    │   └── NotAReplica(shard_id, node_id)               not_a_replica
    ├── Conflict                                                          -> 409
    │   ├── NotLeader(leader)                            not_leader         (`leader`: the
    │   │                                                                   NodeRef to retry
    │   │                                                                   on, None if
    │   │                                                                   unknown)
    │   ├── AlreadyAReplica(shard_id, node_id)           already_a_replica
    │   ├── MembershipChangeInProgress(shard_id)         membership_change_in_progress
    │   ├── ChangeRefused(reason)                        change_refused
    │   ├── StaleEpoch(current_holder, current_epoch)    stale_epoch
    │   └── NotLeaseHolder(current_holder, current_epoch) not_lease_holder
    ├── Unavailable(reason)                              unavailable      -> 503
    │   └── Overloaded(reason)                           overloaded
    └── OutcomeUnknown(reason)                           outcome_unknown  -> 504

These are the admin plane's own types, not the shard's (`logsvc.shard.replica.NotLeader`
and friends): the shard names a leader by its Raft address, an operator needs its node
id and admin address, so the daemon's view translates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from logsvc.admin.status import NodeRef


class AdminError(Exception):
    """Base of every operating error of the admin plane."""

    code: ClassVar[str] = "admin_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ------------------------------------------------------------------------------ 404


class NotFound(AdminError):
    """The shard or node named by the request does not exist here."""

    code = "not_found"


class UnknownShard(NotFound):
    """No shard with this id in the cluster."""

    code = "unknown_shard"

    def __init__(self, shard_id: int) -> None:
        super().__init__(f"no shard {shard_id} in this cluster")
        self.shard_id = shard_id


class ShardNotHosted(NotFound):
    """The shard exists but has no replica on this node: ask one of `replicas`."""

    code = "shard_not_hosted"

    def __init__(self, shard_id: int, replicas: Sequence[str]) -> None:
        names = ", ".join(replicas) or "none"
        super().__init__(f"shard {shard_id} has no replica on this node; its replicas: {names}")
        self.shard_id = shard_id
        self.replicas = tuple(replicas)


class UnknownNode(NotFound):
    """No node with this id in the cluster."""

    code = "unknown_node"

    def __init__(self, node_id: str) -> None:
        super().__init__(f"no node {node_id!r} in this cluster")
        self.node_id = node_id


class NotAReplica(NotFound):
    """The node exists but holds no replica of the shard."""

    code = "not_a_replica"

    def __init__(self, shard_id: int, node_id: str) -> None:
        super().__init__(f"node {node_id!r} holds no replica of shard {shard_id}")
        self.shard_id = shard_id
        self.node_id = node_id


# ------------------------------------------------------------------------------ 409


class Conflict(AdminError):
    """The request is valid but the shard's current state refuses it."""

    code = "conflict"


class NotLeader(Conflict):
    """Only the shard's leader truncates, transfers and changes membership. `leader` is the
    leader this replica knows (retry there), None while it knows none."""

    code = "not_leader"

    def __init__(self, leader: NodeRef | None) -> None:
        where = f"node {leader.node_id!r} at {leader.admin_address}" if leader else "unknown"
        super().__init__(f"this node is not the shard's leader; the leader is {where}")
        self.leader = leader


class AlreadyAReplica(Conflict):
    code = "already_a_replica"

    def __init__(self, shard_id: int, node_id: str) -> None:
        super().__init__(f"node {node_id!r} already holds a replica of shard {shard_id}")
        self.shard_id = shard_id
        self.node_id = node_id


class MembershipChangeInProgress(Conflict):
    """One membership change at a time per shard: retry once the current one is done."""

    code = "membership_change_in_progress"

    def __init__(self, shard_id: int) -> None:
        super().__init__(f"shard {shard_id}: another membership change is in progress")
        self.shard_id = shard_id


class ChangeRefused(Conflict):
    """A membership or leadership change the node refuses (it would leave too few
    replicas, remove the leader itself, move leadership to a replica not caught up...)."""

    code = "change_refused"

    def __init__(self, reason: str) -> None:
        super().__init__(f"change refused: {reason}")
        self.reason = reason


class StaleEpoch(Conflict):
    """A truncate below the current lease epoch: the caller has been fenced."""

    code = "stale_epoch"

    def __init__(self, current_holder: str | None, current_epoch: int) -> None:
        super().__init__(
            f"stale epoch: the lease is held by {current_holder or 'nobody'} "
            f"at epoch {current_epoch}"
        )
        self.current_holder = current_holder
        self.current_epoch = current_epoch


class NotLeaseHolder(Conflict):
    """A truncate above the current lease epoch: acquire the lease at that epoch first."""

    code = "not_lease_holder"

    def __init__(self, current_holder: str | None, current_epoch: int) -> None:
        super().__init__(
            f"not the lease holder: the lease is held by {current_holder or 'nobody'} "
            f"at epoch {current_epoch}; acquire it at this epoch first"
        )
        self.current_holder = current_holder
        self.current_epoch = current_epoch


# ------------------------------------------------------------------------------ 503 / 504


class Unavailable(AdminError):
    """The node cannot serve this now (its replica failed, it is stopping): retry later
    or elsewhere."""

    code = "unavailable"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Overloaded(Unavailable):
    """A bounded queue is full; nothing was queued. Retry later."""

    code = "overloaded"


class OutcomeUnknown(AdminError):
    """The change may or may not have happened (no answer in time, leader change):
    look at the shard's status before retrying."""

    code = "outcome_unknown"

    def __init__(self, reason: str) -> None:
        super().__init__(f"outcome unknown: {reason}")
        self.reason = reason
