"""What a node answers about itself and its shards: the frozen values the admin plane's
`NodeView` (port.py) returns and the HTTP app turns into its response models. Values only:
no Raft, no disk, no clock, and no field holds a secret (neither the cluster secret nor the
token), so no endpoint can return one.

What the fields mean (names: `*_index` are Raft indexes, `*_lsn` are LSNs, `*_entries` a
count of Raft entries, `*_records` a count of records; ranges `[lo, hi)`):

* `ShardStatus.leader_commit_index`: the leader's commit index as this replica last heard
  it (pysyncobj's `leader_commit_idx`; the replica's own commit index on the leader).
* `ReplicaStatus.match_index` / `lag_entries`: only the leader knows them (pysyncobj's
  `match_idx_server_*`); `lag_entries` = leader's last log index - match index. Every
  replica of the shard is listed (the leader too, with lag 0); on a follower these are None.
* `lag_records` / `lag_seconds`: optional (None where the implementation cannot tell).
  `lag_seconds` (leader only): how long since the follower last had every entry of the
  leader's log (logsvc/shard/progress.py).
* `caught_up` (leader only): the follower is within `changes.CAUGHT_UP_LAG_ENTRIES_MAX`
  entries of the leader's log. A replica just added counts as caught up (healthy) only
  once it has received every retained record.
* `ShardStatus.joining`: this replica was started to join the shard and has not yet
  received the entry that adds it (it holds elections and is not ready until then).
* `journal_first_index` / `journal_physical_first_index`: the store's logical start and the
  lowest index still in a file (`StoreStats`); their difference is the physical-deletion
  lag, entries truncated logically and not yet deleted from disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class NodeRef:
    """A node of the cluster and where to reach it."""

    node_id: str
    data_address: str  # "host:port" of its data plane (clients)
    admin_address: str  # "host:port" of its admin API (operators)


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    """Where one shard lives, as this node knows it."""

    shard_id: int
    replicas: tuple[str, ...]  # node ids: the current membership where hosted, else config
    hosted: bool  # this node holds a replica
    leader: NodeRef | None  # known only where hosted (and a leader is known)


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    node_id: str  # the node answering
    nodes: tuple[NodeRef, ...]
    shards: tuple[ShardPlacement, ...]


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """One member of a shard, as the answering replica sees it (see the module doc)."""

    node_id: str
    match_index: int | None = None
    lag_entries: int | None = None
    lag_records: int | None = None
    lag_seconds: float | None = None
    connected: bool | None = None  # the answering replica's link to it (None: itself)
    caught_up: bool | None = None  # known on the leader only

    def __post_init__(self) -> None:
        assert self.match_index is None or self.match_index >= 0
        assert self.lag_entries is None or self.lag_entries >= 0
        assert self.lag_records is None or self.lag_records >= 0
        assert self.lag_seconds is None or self.lag_seconds >= 0


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """One hosted shard, as this node's replica sees it."""

    shard_id: int
    node_id: str  # the answering node
    is_leader: bool
    leader: NodeRef | None  # None while no leader is known
    term: int
    commit_index: int
    applied_index: int  # the last Raft index applied to the state machine here
    leader_commit_index: int | None  # None until heard from a leader
    first_lsn: int  # lowest retained LSN: the truncation point
    next_lsn: int  # the next LSN to be assigned; records are [first_lsn, next_lsn)
    lease_holder: str | None
    lease_epoch: int
    journal_first_index: int
    journal_physical_first_index: int
    last_election_at: datetime | None  # when this replica last saw a leader elected
    failed: bool  # the replica stopped on a fatal error (serves nothing until restarted)
    replicas: tuple[ReplicaStatus, ...]  # every member (this node too, while it is one)
    joining: bool = False  # started to join; the entry adding it not received yet
    quiet: bool = False  # quiescent: no heartbeats, no election timer (quiescence.py)
    learner: bool = False  # a non-voting learner catching up, not a member yet
    # On the leader: the learners connected to it (not members: they count in no majority).
    learners: tuple[ReplicaStatus, ...] = ()

    def __post_init__(self) -> None:
        assert self.shard_id >= 1
        assert self.term >= 0
        assert self.first_lsn >= 1
        assert self.next_lsn >= self.first_lsn
        assert self.lease_epoch >= 0
        assert self.applied_index >= 0
        assert self.last_election_at is None or self.last_election_at.tzinfo is not None
        # Not asserted: that `node_id` is among the members. A replica just removed from
        # the shard runs on until the node stops it, and may still be asked.

    @property
    def member_ids(self) -> tuple[str, ...]:
        return tuple(replica.node_id for replica in self.replicas)

    @property
    def stage(self) -> str:
        """This replica's stage in the shard: "learner" (non-voting, catching up; Raft thesis
        §4.2.1), "joining" (promoted, its own addition not in its log yet), "voter"."""
        if self.learner:
            return "learner"
        return "joining" if self.joining else "voter"

    @property
    def last_lsn(self) -> int | None:
        """The highest retained LSN; None when no record is retained."""
        return self.next_lsn - 1 if self.next_lsn > self.first_lsn else None

    @property
    def truncated_lsn(self) -> int | None:
        """The highest LSN removed by truncation; None when nothing was truncated."""
        return self.first_lsn - 1 if self.first_lsn > 1 else None

    @property
    def physical_truncation_lag_entries(self) -> int:
        """Raft entries below the journal's logical start still in files on disk."""
        return max(0, self.journal_first_index - self.journal_physical_first_index)

    @property
    def apply_lag_entries(self) -> int | None:
        """How far this replica's applied index trails the leader's commit index."""
        if self.leader_commit_index is None:
            return None
        return max(0, self.leader_commit_index - self.applied_index)

    def placement(self) -> ShardPlacement:
        return ShardPlacement(self.shard_id, self.member_ids, True, self.leader)
