"""`AdapterBase`: what every part of the adapter (`adapter.ShardRaft` and its mixins:
`elections`, `message_fixes`, `quiet`, `snapshot_points`) shares: pysyncobj's `SyncObj` as
the base, the state `ShardRaft.__init__` sets (declared here so that each mixin is typed
against it), and the kinds of logsvc's own messages on a shard's Raft connection.

The adapter's modules are the only ones in logsvc that touch pysyncobj's private state;
`adapter.ShardRaft`'s docstring lists every reach-in, why, and the module that makes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj

from logsvc.shard import prevote, quiescence
from logsvc.shard.leader_contact import LeaderContact
from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.raft.chunks import ChunkAssembler
from logsvc.shard.raft.config import RaftHandler
from logsvc.shard.raft.journal import StoreJournal
from logsvc.shard.raft_seal import MessageSealer
from logsvc.store.fs import FileSystem

# logsvc's own messages on a shard's Raft connection, handled before pysyncobj sees any.
_ALIVE = "logsvc_alive"  # node liveness: the sender's node is up (liveness.py)
_QUIESCE = "logsvc_quiesce"  # leader -> follower: agree to go quiet (quiescence.py)
_QUIESCE_ACK = "logsvc_quiesce_ack"  # follower -> leader: agreed, or not (`ok`)
_LEARNER = "logsvc_learner"  # learner -> member: "this read-only connection is <address>"
_PREVOTE = "logsvc_prevote"  # would-be candidate -> peers: would you vote for me (prevote.py)
_PREVOTE_ACK = "logsvc_prevote_ack"  # the answer (`granted`)
_OWN_MESSAGES = frozenset({_ALIVE, _QUIESCE, _QUIESCE_ACK, _LEARNER})
_PREVOTE_MESSAGES = frozenset({_PREVOTE, _PREVOTE_ACK})


class AdapterBase(SyncObj):  # type: ignore[misc]
    """pysyncobj's SyncObj with the state of logsvc's fixes declared (set by `ShardRaft`)."""

    # pysyncobj's private state that the fixes below read and write (0.3.17 names).
    _SyncObj__raftCommitIndex: int
    _SyncObj__leaderCommitIndex: int
    _SyncObj__newAppendEntriesTime: float
    _SyncObj__raftElectionDeadline: float
    _SyncObj__raftLastApplied: int
    # raft index -> [(term, callback)] of commands waiting for their entry to be applied
    _SyncObj__commandsWaitingCommit: dict[int, list[tuple[int, Callable[[object, int], None]]]]

    # logsvc's own state (ShardRaft.__init__ sets each, with what it means).
    _logsvc_messages: int
    _logsvc_quiesce_after_s: float
    _logsvc_commit_notice_s: float
    _logsvc_commit_floor: int
    _logsvc_election_max_s: float
    _logsvc_node_of: Callable[[str], str]
    _logsvc_liveness: NodeLiveness
    _logsvc_leader_q: quiescence.LeaderQuiescence | None
    _logsvc_follower_q: quiescence.FollowerQuiescence
    _logsvc_self_address: str
    _logsvc_learner: bool
    _logsvc_learners: dict[Any, str]
    _logsvc_learners_gone: list[Any]
    _logsvc_fs: FileSystem
    _logsvc_journal: StoreJournal
    _logsvc_handler: RaftHandler
    _logsvc_snapshot_path: str
    _logsvc_compacted_at: int
    _logsvc_chunks: ChunkAssembler
    _logsvc_dial: dict[str, str]
    _logsvc_proposing: bool
    _logsvc_stood_for: tuple[int, str] | None
    _logsvc_leader_contact: LeaderContact
    _logsvc_prevote: prevote.PreVoteRound | None
    _logsvc_prevote_won: tuple[int, float]
    _logsvc_prevote_silent: int
    _logsvc_behind_leader_seen: bool
    _logsvc_sealer: MessageSealer
    _logsvc_snapshot_at_start: bool
