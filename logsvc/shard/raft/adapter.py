"""`ShardRaft`: pysyncobj's SyncObj with logsvc's fixes (the hole table is in __init__.py).

The one class of logsvc that reaches into pysyncobj's private state: its docstring lists
every reach-in and why. Everything else of the package talks to it through its `logsvc_*`
methods or pysyncobj's public API (`doTick`, `raftCurrentTerm`, `getStatus`, ...)."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

import pysyncobj.syncobj as pysyncobj_syncobj
import pysyncobj.tcp_connection as pysyncobj_tcp_connection
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.node import TCPNode

from logsvc.shard import prevote, quiescence, scheduler, snapshot_file, standing
from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.raft.chunks import ChunkAssembler
from logsvc.shard.raft.config import RaftConfig, RaftFatal, RaftHandler
from logsvc.shard.raft.journal import StoreJournal
from logsvc.shard.raft.patches import _JOURNALS, _POLLERS
from logsvc.shard.raft.snapshot_transfer import (
    _make_durable,
    _never_called,
    _SnapshotTransfer,
    _write_durably,
)
from logsvc.shard.raft.transport import _DialNode, _DurableTransport, durable_transport_class
from logsvc.shard.raft_seal import MessageSealer
from logsvc.store.fs import FileSystem, OsFileSystem

log = logging.getLogger("logsvc.raft")

# pysyncobj's own compaction must never trigger (we compact at snapshot points only).
_NEVER = 2**62

# logsvc's own messages on a shard's Raft connection, handled before pysyncobj sees any.
_ALIVE = "logsvc_alive"  # node liveness: the sender's node is up (liveness.py)
_QUIESCE = "logsvc_quiesce"  # leader -> follower: agree to go quiet (quiescence.py)
_QUIESCE_ACK = "logsvc_quiesce_ack"  # follower -> leader: agreed, or not (`ok`)
_LEARNER = "logsvc_learner"  # learner -> member: "this read-only connection is <address>"
_PREVOTE = "logsvc_prevote"  # would-be candidate -> peers: would you vote for me (prevote.py)
_PREVOTE_ACK = "logsvc_prevote_ack"  # the answer (`granted`)
_OWN_MESSAGES = frozenset({_ALIVE, _QUIESCE, _QUIESCE_ACK, _LEARNER})
_PREVOTE_MESSAGES = frozenset({_PREVOTE, _PREVOTE_ACK})
# How often a quiescing leader asks again the followers that did not answer.
QUIESCE_RESEND_S = 0.5


class ShardRaft(SyncObj):  # type: ignore[misc]
    """A pysyncobj SyncObj with logsvc's fixes. Created and ticked by `RaftNode`.

    pysyncobj 0.3.17 internals used here (pinned: patches.py asserts the version), and why:

    Overridden private methods
      `_onTick`                     load a snapshot present at start through the
                                    file-system port before the first tick (hole 4)
      `_getEncryptor`, `encryptor`  AES-GCM sealing instead of Fernet (hole 10)
      `__changeCluster`             mark the leader's own membership proposal
      `__doChangeCluster`           follow the log's latest configuration (membership.py)
      `__tryLogCompaction`          compaction at snapshot points only (hole 6)
      `__loadDumpFile`              a bad snapshot is fatal; journal reset to it (hole 4)
      `__applyLogEntries`           the commit index goes out with the next AppendEntries,
                                    due within commit_notice_ms, not in one of its own;
                                    first, on a leader, its count is redone counting the
                                    leader only up to its durable index (its sync runs
                                    beside the tick: `_logsvc_count_durable_leader`)
    State read or written
      `__raftCommitIndex`           clamped to what the leader vouched for (hole 3);
                                    raised by an agreed quiesce request; wake-up checks;
                                    lowered with `__leaderCommitIndex` and the journal's
                                    hint to what a durable majority holds (leader)
      `__raftLastApplied`           the index `apply` is at; set by a snapshot install
      `__raftNextIndex`             a late ack never lowers it, a refusal never raises it
      `__raftMatchIndex`            followers' progress (progress view, learners, quiet)
      `__raftElectionDeadline`      held while quiet or joining; restarted from liveness;
                                    held during a pre-vote round, 0 once it is won;
                                    set in the survivors' order when the leader is lost
                                    (standing.py), and at once for a voter that refused
                                    a stale candidate's new term
      `__newAppendEntriesTime`      inf while quiet (no heartbeats); 0 to heartbeat now;
                                    within commit_notice_ms after a commit;
                                    the leader's next deadline for the scheduler
      `__lastResponseTime`          a quiet leader's followers count as heard (no fallback)
      `__otherNodes`, `__connectedNodes`, `__readonlyNodes`, `__selfNode`, `__raftState`,
      `__raftLeader`, `_RAFT_STATE`  peers, connections, learners and role: quiescence,
                                    liveness, the snapshot's cluster, wake-up deadlines
      `__commandsQueue._FastQueue__queue`, `__commandsWaitingCommit`
                                    work pending (tick again now; never quiet while busy):
                                    FastQueue has no non-consuming emptiness test
      `__serializer`                replaced by `_SnapshotTransfer` (file-system port);
      `__needLoadDumpFile`          off: `_onTick` loads it through the port instead
      `__transport`                 our own messages, the held replies, the tick's flush
      `__conf`                      bindRetryTime, connectionRetryTime, raftMinTimeout,
                                    raftMaxTimeout (the survivors' order, standing.py)
      `__generateRaftTimeout`       a random election timeout drawn as pysyncobj does
      `__updateClusterConfiguration`  set pysyncobj's peers to the log's configuration
      `__connectedToAnyone`, `__transferInProgress`  pre-vote asks only when pysyncobj
                                    would stand now, and never for a leader's transfer
                                    (TimeoutNow: the leader asked for it)
      `__onSetCodeVersion`          what pysyncobj's own snapshot load does last
      `_isLeader`, `_getLeader`     role and leader (no public equivalent)
      `_TcpConnection__lastReadTime`  a quiet shard's connection is not timed out while
                                    its peer's node is live (`_logsvc_refresh_connections`)
    On its behalf elsewhere in this package: transport.py overrides the transport's
    `send`, `addNode`, `setOnMessageReceivedCallback` and `_on(Readonly)Node(Dis)connected`
    hooks, and `_connectIfNecessarySingle` (dials to a node that refused are coalesced per
    node, liveness.py); journal.py subclasses pysyncobj's `Journal`; patches.py replaces the module
    globals `createJournal`, `createPoller`, `PIPE_NOTIFIER_ENABLED`, the pickle protocol,
    `tcp_connection.zlib` and (simulator only) `monotonicTime`.
    """

    # pysyncobj's private state that the fixes below read and write (0.3.17 names).
    _SyncObj__raftCommitIndex: int
    _SyncObj__leaderCommitIndex: int
    _SyncObj__newAppendEntriesTime: float
    _SyncObj__raftElectionDeadline: float
    _SyncObj__raftLastApplied: int

    def __init__(
        self,
        config: RaftConfig,
        journal: StoreJournal,
        handler: RaftHandler,
        file_system: FileSystem | None = None,
        transport_base: type | None = None,
        *,
        poller: scheduler.ShardPoller | None = None,
        liveness: NodeLiveness | None = None,
        node_of: Callable[[str], str] | None = None,
    ) -> None:
        """`transport_base`: simulator only (see `TransportBase`); None = TCP. `poller`: the
        replica's poller from its scheduler (None: pysyncobj's own, the simulator's case).
        `liveness`, `node_of`: the node liveness table and the address -> node map, for
        quiescence (None: this replica keeps its own, every address a node)."""
        # Everything we use is set before SyncObj.__init__ (pysyncobj.md §1.5 D).
        self._logsvc_messages = 0  # Raft messages and connection changes seen (all ticks)
        self._logsvc_quiesce_after_s = config.quiesce_after_ms / 1000.0
        self._logsvc_commit_notice_s = config.commit_notice_ms / 1000.0
        self._logsvc_commit_floor = 0  # the commit index before pysyncobj last counted
        self._logsvc_election_max_s = config.election_timeout_ms_max / 1000.0
        self._logsvc_node_of: Callable[[str], str] = node_of if node_of is not None else str
        self._logsvc_liveness = (
            liveness
            if liveness is not None
            else NodeLiveness(
                self._logsvc_node_of(config.self_address),
                interval_s=config.heartbeat_ms / 1000.0,
                lapse_s=config.election_timeout_ms_min / 1000.0,
                now_s=pysyncobj_syncobj.monotonicTime(),
            )
        )
        self._logsvc_leader_q: quiescence.LeaderQuiescence | None = None
        self._logsvc_follower_q = quiescence.FollowerQuiescence()
        self._logsvc_self_address = config.self_address
        self._logsvc_learner = config.learner
        # On a member: the learners connected to it (pysyncobj's read-only node -> the
        # address the learner announced).
        self._logsvc_learners: dict[Any, str] = {}
        self._logsvc_fs = file_system if file_system is not None else OsFileSystem()
        self._logsvc_journal = journal
        self._logsvc_handler = handler
        self._logsvc_snapshot_path = config.snapshot_path
        self._logsvc_compacted_at = 0
        self._logsvc_chunks = ChunkAssembler()
        self._logsvc_dial = dict(config.dial_overrides)
        self._logsvc_proposing = False  # inside the leader's own membership change
        # (term, leader) whose loss last set our election timer in the survivors' order.
        self._logsvc_stood_for: tuple[int, str] | None = None
        # Pre-vote (prevote.py): the round asking, the term it won, silent rounds in a row.
        self._logsvc_prevote: prevote.PreVoteRound | None = None
        self._logsvc_prevote_won: tuple[int, float] = (0, 0.0)  # (term, when)
        self._logsvc_prevote_silent = 0
        # A leader's AppendEntries of a term below ours arrived: pysyncobj ignores it
        # without an answer, so that leader never learns our term and never replicates to
        # us again. Our next election skips pre-vote (its request_vote is how the leader
        # learns the term; Raft's answer to a stale AppendEntries, which etcd sends).
        self._logsvc_behind_leader_seen = False
        # Our sealing instead of pysyncobj's Fernet (see `encryptor` below): every
        # connection pysyncobj creates, from SyncObj.__init__ on, reads it.
        self._logsvc_sealer = MessageSealer(config.secret)
        conf = SyncObjConf(
            password=None,  # pysyncobj would derive a Fernet key: `encryptor` replaces it
            autoTick=False,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=config.heartbeat_ms / 1000.0,
            raftMinTimeout=config.election_timeout_ms_min / 1000.0,
            raftMaxTimeout=config.election_timeout_ms_max / 1000.0,
            leaderFallbackTimeout=config.leader_fallback_ms / 1000.0,
            connectionTimeout=config.connection_timeout_ms / 1000.0,
            connectionRetryTime=config.connection_retry_ms / 1000.0,
            commandsQueueSize=config.commands_queue_max,
            dynamicMembershipChange=True,
            logCompactionMinEntries=_NEVER,
            logCompactionMinTime=_NEVER,
            fullDumpFile=config.snapshot_path,
            serializer=_never_called,
            deserializer=_never_called,
            useFork=False,
        )
        key = _JOURNALS.register(journal)
        conf.journalFile = key
        poller_key = None if poller is None else _POLLERS.register(poller)
        if poller_key is not None:
            conf.pollerType = poller_key
        try:
            super().__init__(
                None if config.learner else config.self_address,  # None: read-only
                [self._logsvc_dial_node(peer) for peer in config.peers],
                conf,
                transportClass=(
                    _DurableTransport
                    if transport_base is None
                    else durable_transport_class(transport_base)
                ),
            )
        finally:
            _JOURNALS.unregister(key)
            if poller_key is not None:
                _POLLERS.unregister(poller_key)
        # pysyncobj ships, receives and looks for the snapshot file with plain open() and
        # os.path.isfile: route all three through our file-system port instead (the same
        # files in production; the simulator's in-memory file system in tests/chaos/dst/).
        self._SyncObj__serializer = _SnapshotTransfer(
            self._logsvc_fs, config.snapshot_path, conf.logCompactionBatchSize
        )
        self._logsvc_snapshot_at_start = self._logsvc_fs.exists(config.snapshot_path)
        self._SyncObj__needLoadDumpFile = False

    # -- what RaftNode asks (it touches no pysyncobj private itself) -------------------------

    def logsvc_propose(self, encoded: bytes, callback: Callable[[object, int], None]) -> None:
        """Queue one command (any thread); `callback(result, fail_reason)` on the tick."""
        self._logsvc_apply(encoded, callback=callback)

    def logsvc_is_leader(self) -> bool:
        return bool(self._isLeader())

    def logsvc_leader(self) -> str | None:
        """The leader's Raft address as this replica knows it, or None."""
        leader = self._getLeader()
        return None if leader is None else str(leader.id)

    def logsvc_peers(self) -> tuple[str, ...]:
        """The Raft addresses of the voting peers pysyncobj replicates to."""
        return tuple(str(node.id) for node in self._SyncObj__otherNodes)

    def logsvc_connected_peers(self) -> tuple[str, ...]:
        """Those of `logsvc_peers` whose connection is up."""
        connected = self._SyncObj__connectedNodes
        return tuple(str(node.id) for node in self._SyncObj__otherNodes if node in connected)

    def logsvc_is_connected(self, node: Any) -> bool:
        """Whether pysyncobj counts the connection to `node` (its node object) as up."""
        return node in self._SyncObj__connectedNodes

    def logsvc_match_index(self, names: Mapping[Any, str] | None = None) -> dict[str, int]:
        """On the leader: the last entry each follower acknowledged, by address. `names`:
        the nodes to report (pysyncobj's node object -> the address to report it under);
        None: every node, under its id. Any thread: raises RuntimeError if the tick changed
        the map during the copy (the caller retries)."""
        match = dict(self._SyncObj__raftMatchIndex)
        if names is None:
            return {str(node.id): int(index) for node, index in match.items()}
        return {address: int(match.get(node, 0)) for node, address in names.items()}

    def logsvc_flush(self) -> None:
        """The tick's one journal sync, then the replies held for it (the transport's)."""
        self._SyncObj__transport.flush()

    def logsvc_holds_replies(self) -> bool:
        """Whether the transport holds messages until the next sync (acks, votes)."""
        return bool(self._SyncObj__transport.held())

    def logsvc_hold_election(self, deadline_s: float) -> None:
        """No election before `deadline_s` (a joining replica not yet in the log's members)."""
        self._SyncObj__raftElectionDeadline = deadline_s

    @property
    def encryptor(self) -> MessageSealer:
        """What every pysyncobj connection seals and opens messages with (pysyncobj reads
        this property; with `password` None its own would be None): AES-GCM with a key per
        sender (raft_seal.py) instead of Fernet, 40x cheaper per AppendEntries."""
        return self._logsvc_sealer

    def _getEncryptor(self) -> MessageSealer:
        return self._logsvc_sealer

    def _onTick(self, timeToWait: float = 0.0) -> None:
        if self._logsvc_snapshot_at_start:
            # What pysyncobj's first tick does when the snapshot file exists (hole 4 fix).
            self._logsvc_snapshot_at_start = False
            self._SyncObj__loadDumpFile(clearJournal=False)
        # What is committed before pysyncobj counts again (`_logsvc_count_durable_leader`).
        self._logsvc_commit_floor = int(self._SyncObj__raftCommitIndex)
        super()._onTick(timeToWait)

    def _logsvc_dial_node(self, node: Any) -> Any:
        """The peer `node` (an address or a pysyncobj node) as the transport should dial it:
        a `_DialNode` where a test override names its address, else as pysyncobj made it."""
        address = node if isinstance(node, str) else getattr(node, "address", None)
        dial = self._logsvc_dial.get(address) if isinstance(address, str) else None
        if dial is None or isinstance(node, _DialNode):
            return node
        assert isinstance(address, str)
        return _DialNode(address, dial)

    # -- membership: pysyncobj's configuration follows the log's (membership.py) -----------

    def _SyncObj__changeCluster(self, request: Any) -> bool:
        # The leader proposing a change: pysyncobj's own check and in-memory change (the
        # journal then records the entry when pysyncobj appends it).
        self._logsvc_proposing = True
        try:
            return bool(SyncObj._SyncObj__changeCluster(self, request))
        finally:
            self._logsvc_proposing = False

    def _SyncObj__doChangeCluster(self, request: Any, reverse: bool = False) -> bool:
        # Everywhere else (an entry received, a truncation undone, an entry applied, also
        # after a restart) pysyncobj would toggle its configuration by the entry alone;
        # instead it takes the latest configuration of the log, which the journal keeps.
        if self._logsvc_proposing or self._logsvc_journal.membership is None:
            return bool(SyncObj._SyncObj__doChangeCluster(self, request, reverse))
        return self._logsvc_follow_membership()

    def _logsvc_follow_membership(self) -> bool:
        """Make pysyncobj's peers the log's latest configuration; True if they changed."""
        membership = self._logsvc_journal.membership
        assert membership is not None
        target = set(membership.peers)
        if target == {node.id for node in self._SyncObj__otherNodes}:
            return False
        self._SyncObj__updateClusterConfiguration(
            [self._logsvc_dial_node(address) for address in sorted(target)]
        )
        if self._isLeader():  # as pysyncobj's own change does for a node it adds
            now = pysyncobj_syncobj.monotonicTime()
            for node in self._SyncObj__otherNodes:
                self._SyncObj__lastResponseTime.setdefault(node, now)
        log.info("raft peers are now %s (the log's configuration)", sorted(target))
        return True

    def _SyncObj__applyLogEntries(self) -> bool:
        # Stock returns True after applying anything (appendEntriesUseBatch off), and the
        # leader then sends a commit-index-only AppendEntries in the same tick. Instead the
        # next AppendEntries is due within commit_notice_ms (RaftConfig says why): any
        # AppendEntries sent before then carries the commit index and moves it on.
        if self._SyncObj__raftState == pysyncobj_syncobj._RAFT_STATE.LEADER:
            self._logsvc_count_durable_leader()  # pysyncobj counted; applies follow
        need_send = bool(SyncObj._SyncObj__applyLogEntries(self))
        if not need_send or not self._logsvc_commit_notice_s or not self._isLeader():
            return need_send
        notice_s = float(pysyncobj_syncobj.monotonicTime()) + self._logsvc_commit_notice_s
        if notice_s < self._SyncObj__newAppendEntriesTime:
            self._SyncObj__newAppendEntriesTime = notice_s
        return False

    def _logsvc_count_durable_leader(self) -> None:
        """Decision 0001: an entry is committed once a majority holds it durably. pysyncobj
        counts the leader for every entry in its log, but the leader's own sync may still be
        running (RaftNode hands it to the worker's syncer so that the followers' acks are
        received meanwhile): recount the entries above the leader's durable index without
        it, and lower the commit index pysyncobj just raised to what that allows. Called
        right after pysyncobj's count, before anything applies or sends it."""
        commit = int(self._SyncObj__raftCommitIndex)
        journal = self._logsvc_journal
        durable = journal.store.durable_index
        if commit <= durable:
            return  # pysyncobj counted the leader only where it holds the entry durably
        floor = self._logsvc_commit_floor  # committed before this count
        others = self._SyncObj__otherNodes
        match = self._SyncObj__raftMatchIndex
        term = self._SyncObj__raftCurrentTerm
        found = floor
        # Highest first: the count only falls as the index rises (each node holds a prefix),
        # and Raft §5.4.2 commits by counting only an entry of the current term.
        for index in range(commit, floor, -1):
            count = 1 if index <= durable else 0
            count += sum(1 for node in others if match.get(node, 0) >= index)
            if count > (len(others) + 1) / 2 and journal.term_at(index) == term:
                found = index
                break
        if found == commit:
            return
        self._SyncObj__raftCommitIndex = found
        self._SyncObj__leaderCommitIndex = found
        journal.setRaftCommitIndex(found)  # the hint pysyncobj keeps (hole 13)

    @replicated  # type: ignore[untyped-decorator]
    def _logsvc_apply(self, encoded: bytes) -> object:
        raft_index = self._SyncObj__raftLastApplied + 1  # the entry being applied
        return self._logsvc_handler.apply(raft_index, encoded)

    # -- hole 3: message fixes ------------------------------------------------------------

    def _logsvc_on_message(
        self, node: Any, message: dict[str, Any], deliver: Callable[[Any, dict[str, Any]], None]
    ) -> None:
        kind = message.get("type")
        if kind == _LEARNER:
            address = message.get("address")
            if isinstance(address, str) and not isinstance(node, TCPNode):
                self._logsvc_learners[node] = address
            return
        if kind in _PREVOTE_MESSAGES:
            if isinstance(node, TCPNode):  # never from a learner (it does not stand)
                now_s = pysyncobj_syncobj.monotonicTime()
                if self._logsvc_quiesce_after_s:
                    self._logsvc_liveness.heard(self._logsvc_node_of(str(node.id)), now_s)
                self._logsvc_on_prevote_message(node, str(node.id), kind, message)
            return
        if self._logsvc_quiesce_after_s:
            now_s = pysyncobj_syncobj.monotonicTime()
            sender = str(node.id)
            if isinstance(node, TCPNode):  # not a learner's read-only connection (no node)
                self._logsvc_liveness.heard(self._logsvc_node_of(sender), now_s)
            if kind in _OWN_MESSAGES:
                self._logsvc_on_own_message(node, sender, kind, message, now_s)
                return
            if not (kind == "next_node_idx" and message.get("success")):
                # Any Raft message ends quiet, on either side, except a follower's answer
                # to the leader's own AppendEntries (catching up shows in its match index).
                self._logsvc_wake(now_s)
        self._logsvc_messages += 1
        if kind == "append_entries" and not self._isLeader():
            term = message.get("term")
            if isinstance(term, int) and term < int(self.raftCurrentTerm):
                self._logsvc_behind_leader_seen = True
        if kind == "append_entries" and "prevLogIdx" in message:
            self._logsvc_on_append_entries(node, message, deliver)
            return
        if kind == "request_vote":
            self._logsvc_on_request_vote(node, message, deliver)
            return
        if kind == "append_entries":
            # A snapshot chunk. Stock then sets commitIndex = min(leaderCommit, our last
            # index) though nothing in our log was checked against the leader's: a lagging
            # follower with an uncommitted, diverging suffix would apply it and serve reads
            # of it (found by tests/chaos/dst/, seed 4039 with 12000 steps). Only a snapshot
            # installed here, or our own compaction, vouches for entries.
            commit_before = self._SyncObj__raftCommitIndex
            deliver(node, message)
            ceiling = max(commit_before, self._logsvc_compacted_at)
            if self._SyncObj__raftCommitIndex > ceiling:
                self._SyncObj__raftCommitIndex = ceiling
            return
        if kind == "next_node_idx" and message.get("success") and not message.get("reset"):
            # Stock: a late ack sets nextIndex = ack + 1 even after nextIndex had moved on
            # (entries in flight), so those entries are sent again (pysyncobj.md §6.1).
            next_index = self._SyncObj__raftNextIndex
            before = next_index.get(node)
            deliver(node, message)
            after = next_index.get(node)
            if before is not None and after is not None and after < before:
                next_index[node] = before
            return
        if kind == "next_node_idx" and message.get("reset") and not message.get("success"):
            # A refusal names an index at or below the prevLogIdx it answers, so refusals of
            # the latest messages only ever lower nextIndex. Stock also lets a refusal of a
            # later batch of the same round ("my log ends at X", X above the walk-back the
            # first batch's refusal just made) raise it again: a follower with a conflicting
            # suffix, more than one batch behind, then never catches up, and nextIndex
            # bounces between the two answers forever (found by tests/chaos/dst/, seed 2).
            next_index = self._SyncObj__raftNextIndex
            before = next_index.get(node)
            deliver(node, message)
            after = next_index.get(node)
            if before is not None and after is not None and after > before:
                next_index[node] = before
            return
        deliver(node, message)

    # -- pre-vote (prevote.py) ---------------------------------------------------------------

    def logsvc_prevote_gate(self, now_s: float) -> None:
        """Right before pysyncobj's tick: if it would stand now (its election timer ran out
        and it is connected to someone), ask the peers first unless a pre-vote for that
        term was won; hold its timer meanwhile. A leader's transfer (TimeoutNow) stands at
        once, as Raft's pre-vote allows."""
        if self._logsvc_learner or self._SyncObj__selfNode is None:
            return
        if self._SyncObj__raftState == pysyncobj_syncobj._RAFT_STATE.LEADER:
            self._logsvc_prevote = None
            return
        if self._SyncObj__raftElectionDeadline >= now_s or self._SyncObj__transferInProgress:
            return
        if not self._SyncObj__connectedToAnyone():
            return
        proposed = int(self.raftCurrentTerm) + 1
        won_term, won_s = self._logsvc_prevote_won
        if won_term == proposed and now_s - won_s < float(self._SyncObj__conf.raftMinTimeout):
            return  # won just now: pysyncobj stands in this tick
        previous = self._logsvc_prevote
        if previous is not None and previous.term == proposed and not previous.answered:
            self._logsvc_prevote_silent += 1
        else:
            self._logsvc_prevote_silent = 0
        if self._logsvc_behind_leader_seen:
            # A leader of a lower term exists that cannot reach us (see __init__): stand.
            self._logsvc_behind_leader_seen = False
            self._logsvc_prevote_won = (proposed, now_s)
            return
        if self._logsvc_prevote_silent >= prevote.SILENT_ROUNDS_MAX:
            log.warning(
                "no peer answered %d pre-vote rounds: standing without one",
                self._logsvc_prevote_silent,
                extra={"term": self.raftCurrentTerm},
            )
            self._logsvc_prevote_won = (proposed, now_s)
            return
        peers = self._SyncObj__otherNodes
        round_ = prevote.PreVoteRound(proposed, len(peers) + 1)
        self._logsvc_prevote = round_
        if round_.won:  # a group of one
            self._logsvc_prevote_won = (proposed, now_s)
            return
        journal = self._logsvc_journal
        last_index = journal.store.last_index
        message = {
            "type": _PREVOTE,
            "term": proposed,
            "last_log_index": last_index,
            "last_log_term": int(journal.entry(last_index)[2]),
        }
        connected = self._SyncObj__connectedNodes
        for node in peers:
            if node in connected:
                self._SyncObj__transport.send(node, dict(message))
        # Asked: ask again (or stand, once won) within a quarter of the timeout's range.
        conf = self._SyncObj__conf
        span_s = float(conf.raftMaxTimeout) - float(conf.raftMinTimeout)
        self._SyncObj__raftElectionDeadline = now_s + span_s / 4 * (1.0 + random.random())

    def _logsvc_on_prevote_message(
        self, node: Any, sender: str, kind: str, message: dict[str, Any]
    ) -> None:
        try:
            term = int(message["term"])
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed %s from %s", kind, sender)
            return
        if kind == _PREVOTE_ACK:
            round_ = self._logsvc_prevote
            if round_ is None or self._isLeader():
                return
            won = round_.on_answer(sender, term, bool(message.get("granted")))
            if won and term == int(self.raftCurrentTerm) + 1:
                now_s = pysyncobj_syncobj.monotonicTime()
                self._logsvc_prevote_won = (term, now_s)
                self._SyncObj__raftElectionDeadline = 0.0  # stand in this very tick
                self._logsvc_messages += 1
            return
        try:
            candidate_last = (int(message["last_log_term"]), int(message["last_log_index"]))
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed %s from %s", kind, sender)
            return
        journal = self._logsvc_journal
        last_index = journal.store.last_index
        leader = self._getLeader()
        leader_live = False
        if leader is not None and leader in self._SyncObj__connectedNodes:
            address = str(leader.id)
            now_s = pysyncobj_syncobj.monotonicTime()
            lapsed = bool(self._logsvc_quiesce_after_s) and self._logsvc_liveness.lapsed(
                self._logsvc_node_of(address), now_s
            )
            lost = self._logsvc_stood_for == (int(self.raftCurrentTerm), address)
            leader_live = not (lapsed or lost)
        granted = prevote.grants(
            proposed_term=term,
            candidate_last=candidate_last,
            own_term=int(self.raftCurrentTerm),
            own_last=(int(journal.entry(last_index)[2]), last_index),
            leading=bool(self._isLeader()),
            leader_live=leader_live,
        )
        self._SyncObj__transport.send(
            node, {"type": _PREVOTE_ACK, "term": term, "granted": granted}
        )

    def _logsvc_on_request_vote(
        self, node: Any, message: dict[str, Any], deliver: Callable[[Any, dict[str, Any]], None]
    ) -> None:
        """pysyncobj's handling, then: a new term from a candidate whose log is behind ours
        (it cannot win our vote, nor, if ours is the newest, anyone's) leaves the shard
        without a leader until someone else stands; we stand in the survivors' order
        from now (standing.py, the candidate left out) instead of after a full random
        timeout. Only timers change: votes and terms are pysyncobj's."""
        term_before = int(self.raftCurrentTerm)
        journal = self._logsvc_journal
        last_index = journal.store.last_index
        ours = (int(journal.entry(last_index)[2]), last_index)
        deliver(node, message)
        try:
            theirs = (int(message["last_log_term"]), int(message["last_log_index"]))
            new_term = int(message["term"]) > term_before
        except (KeyError, TypeError, ValueError):
            return
        if (
            new_term
            and theirs < ours
            and not self._logsvc_learner
            and self._SyncObj__raftState == pysyncobj_syncobj._RAFT_STATE.FOLLOWER
            and self._getLeader() is None
        ):
            now_s = pysyncobj_syncobj.monotonicTime()
            conf = self._SyncObj__conf
            voters = [str(n.id) for n in self._SyncObj__otherNodes]
            rank = standing.standing_rank(str(node.id), self._logsvc_self_address, voters)
            self._SyncObj__raftElectionDeadline = standing.stand_at_s(
                rank,
                now_s - float(conf.raftMinTimeout),
                now_s,
                float(conf.raftMinTimeout),
                float(conf.raftMaxTimeout),
                random.random(),
            )

    def _logsvc_on_append_entries(
        self, node: Any, message: dict[str, Any], deliver: Callable[[Any, dict[str, Any]], None]
    ) -> None:
        message = self._logsvc_chunks.assemble(message)
        if "transmission" in message:
            deliver(node, message)  # a chunk of a large entry: pysyncobj only buffers it
            return
        journal = self._logsvc_journal
        store = journal.store
        prev_index, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        if not store.first_index <= prev_index <= store.last_index or (
            journal.entry(prev_index)[2] != prev_term
        ):
            deliver(node, message)  # pysyncobj rejects it without deleting anything
            return
        entries = list(message.get("entries", []))
        confirmed = entries[-1][1] if entries else prev_index  # what the leader vouches for
        matched = 0
        for entry in entries:
            index, term = entry[1], entry[2]
            if index > store.last_index or journal.entry(index)[2] != term:
                break  # first entry we lack, or the first conflict (delete from here)
            matched += 1
        trimmed = dict(message)
        if matched < len(entries):
            if matched:
                trimmed["prevLogIdx"] = entries[matched - 1][1]
                trimmed["prevLogTerm"] = entries[matched - 1][2]
            trimmed["entries"] = entries[matched:]
        else:
            # Everything sent is already here. Stock pysyncobj would delete every entry
            # after it (even ones we acked); present our own last entry as `prev` so
            # nothing is deleted, and correct the reply below to what was vouched for.
            trimmed["prevLogIdx"] = store.last_index
            trimmed["prevLogTerm"] = journal.entry(store.last_index)[2]
            trimmed["entries"] = []
        commit_before = self._SyncObj__raftCommitIndex
        held_before = len(self._SyncObj__transport.held())
        deliver(node, trimmed)
        for _, reply in self._SyncObj__transport.held()[held_before:]:
            if reply.get("type") == "next_node_idx" and reply.get("success"):
                reply["next_node_idx"] = confirmed + 1
        # Raft: commitIndex = min(leaderCommit, index of last new entry), never beyond what
        # this message vouched for (stock uses our last index, which may hold stale entries).
        ceiling = max(commit_before, confirmed)
        if self._SyncObj__raftCommitIndex > ceiling:
            self._SyncObj__raftCommitIndex = ceiling

    # -- quiescence (quiescence.py, liveness.py) ---------------------------------------------

    def _logsvc_note_sent(self, node: Any) -> None:
        if self._logsvc_quiesce_after_s:
            self._logsvc_liveness.sent(
                self._logsvc_node_of(str(node.id)), pysyncobj_syncobj.monotonicTime()
            )

    def _logsvc_on_connection(self, node: Any, up: bool) -> None:
        """A connection to a peer came up or went down (inside a tick)."""
        self._logsvc_messages += 1  # the tick after it acts on it (reconnects, catch-up)
        if up and self._logsvc_learner:
            # pysyncobj's read-only node is anonymous: say which replica this is, so the
            # leader can tell when the learner an admin change started has caught up.
            self._SyncObj__transport.send(
                node, {"type": _LEARNER, "address": self._logsvc_self_address}
            )
        now_s = pysyncobj_syncobj.monotonicTime()
        address = str(node.id)
        if not up and self._logsvc_follows(address) and not self._logsvc_follower_q.quiet:
            self._logsvc_stand_in_turn(address, now_s, "the connection to the leader closed")
        if not self._logsvc_quiesce_after_s:
            return
        follower = self._logsvc_follower_q
        if not up and follower.quiet:
            if follower.leader == address:
                self._logsvc_lost_leader(now_s, "the connection to the leader closed")
            # Another follower's connection: nothing for a quiet follower to do (waking
            # would only restart its election timer against a leader that stays quiet).
            return
        if not up and self._logsvc_leader_q is not None and self._logsvc_leader_q.quiet:
            # A quiet leader's follower dropped: nothing to send it, and heartbeats to the
            # others would wake a shard that has nothing to do. When a node dies, that is
            # every shard it follows in: a failover's survivors then heartbeated two
            # thirds of their shards while electing the rest. The follower's side acts on
            # the loss; the connection coming back (or news of it) wakes this leader.
            return
        self._logsvc_wake(now_s)

    def _logsvc_dial_failed(self, node: Any) -> None:
        """A dial to `node` failed (the transport's report): node liveness coalesces the
        next dials of every replica here to that node (liveness.py)."""
        if self._logsvc_quiesce_after_s and isinstance(node, TCPNode):
            now_s = pysyncobj_syncobj.monotonicTime()
            self._logsvc_liveness.dial_failed(self._logsvc_node_of(str(node.id)), now_s)

    def logsvc_may_dial(self, node: Any) -> bool:
        """Whether the transport may dial `node` now (liveness.py `may_dial`)."""
        if not self._logsvc_quiesce_after_s or not isinstance(node, TCPNode):
            return True  # without quiescence the liveness table is not fed
        return self._logsvc_liveness.may_dial(
            self._logsvc_node_of(str(node.id)),
            pysyncobj_syncobj.monotonicTime(),
            float(self._SyncObj__conf.connectionRetryTime),
        )

    def _logsvc_wake(self, now_s: float) -> None:
        """Activity: a quiet follower is an ordinary one again; a quiescing or quiet leader
        heartbeats at once."""
        if self._logsvc_follower_q.wake():
            self._logsvc_refresh_connections(now_s)  # it may send on them next (votes...)
        leader = self._logsvc_leader_q
        if leader is not None and leader.wake(now_s):
            self._logsvc_heartbeat_now(now_s)

    def _logsvc_refresh_connections(self, now_s: float, only: Any = None) -> None:
        """Count the connections to peers on live nodes as just read from.

        pysyncobj drops a connection on which nothing was read for connection_timeout, and
        checks that when it next sends on it; a quiet shard reads nothing for minutes, so
        its first message after waking (or a liveness message on a connection that only
        carries ours) would drop the connection instead of leaving. While the peer's node
        is live in the liveness table, its connection is as good as heard from; once the
        node lapses, pysyncobj's own timeout applies again from the last refresh."""
        connections = getattr(self._SyncObj__transport, "_connections", None)
        if not connections:
            return  # the simulator's transport keeps no such clock
        liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
        for node, connection in connections.items():
            if only is not None and node != only:
                continue
            if connection.state != pysyncobj_tcp_connection.CONNECTION_STATE.CONNECTED:
                continue
            if not liveness.lapsed(node_of(str(node.id)), now_s):
                connection._TcpConnection__lastReadTime = now_s

    def _logsvc_heartbeat_now(self, now_s: float) -> None:
        """A leader leaving quiet: AppendEntries on the next tick (which wakes the quiet
        followers), and its followers' silence counted from now, not from before (the
        leader-fallback timer did not run while it was quiet)."""
        self._SyncObj__newAppendEntriesTime = 0
        self._logsvc_refresh_connections(now_s)
        last_response = self._SyncObj__lastResponseTime
        for node in self._SyncObj__otherNodes:
            if node in last_response:
                last_response[node] = now_s
        self._logsvc_messages += 1

    def _logsvc_lost_leader(self, now_s: float, why: str) -> None:
        """A quiet follower whose leader is gone: an ordinary follower again, whose election
        timer started when the leader's node was last heard from (as if its heartbeats had
        stopped then), so a quiet shard fails over like an active one. At least a random
        part of the timeout is still ahead, so the followers do not all stand at once."""
        follower = self._logsvc_follower_q
        leader = follower.leader
        follower.wake()
        # Its next messages (a vote request...) go on connections quiet for long.
        self._logsvc_refresh_connections(now_s)
        if leader is None:
            return
        self._logsvc_stand_in_turn(leader, now_s, f"quiet follower woke: {why}")

    def _logsvc_follows(self, address: str) -> bool:
        """A voting follower whose leader (as pysyncobj knows it) is `address`."""
        leader = self._getLeader()
        return (
            not self._logsvc_learner
            and self._SyncObj__raftState == pysyncobj_syncobj._RAFT_STATE.FOLLOWER
            and leader is not None
            and str(leader.id) == address
        )

    def _logsvc_stand_in_turn(self, leader: str, now_s: float, why: str) -> None:
        """The leader `leader` is lost: our election timer as the survivors' order says
        (standing.py), counted from when its node was last heard from (as if its heartbeats
        had stopped then; now without node liveness). Once per leader and term."""
        if self._logsvc_learner:
            return
        self._logsvc_stood_for = (int(self.raftCurrentTerm), leader)
        last_heard_s = (
            self._logsvc_liveness.last_heard(self._logsvc_node_of(leader))
            if self._logsvc_quiesce_after_s
            else now_s
        )
        voters = [str(node.id) for node in self._SyncObj__otherNodes]
        rank = standing.standing_rank(leader, self._logsvc_self_address, voters)
        conf = self._SyncObj__conf
        self._SyncObj__raftElectionDeadline = standing.stand_at_s(
            rank,
            last_heard_s,
            now_s,
            float(conf.raftMinTimeout),
            float(conf.raftMaxTimeout),
            random.random(),  # pysyncobj's own timeouts draw from the same generator
        )
        log.info(
            "%s; leader last heard %.2f s ago, standing %s in %.2f s",
            why,
            now_s - last_heard_s,
            "first" if rank == 0 else f"{rank + 1}th",
            self._SyncObj__raftElectionDeadline - now_s,
            extra={"term": self.raftCurrentTerm},
        )

    def _logsvc_on_own_message(
        self, node: Any, sender: str, kind: str, message: dict[str, Any], now_s: float
    ) -> None:
        if kind == _ALIVE:
            return  # liveness noted by the caller
        try:
            term, seq = int(message["term"]), int(message["seq"])
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed %s from %s", kind, sender)
            return
        if kind == _QUIESCE_ACK:
            leader = self._logsvc_leader_q
            if leader is None or not self._isLeader() or term != self.raftCurrentTerm:
                return
            if node in self._SyncObj__lastResponseTime:
                self._SyncObj__lastResponseTime[node] = now_s
            leader.on_ack(sender, term, seq, bool(message.get("ok")), now_s)
            if leader.mode is quiescence.Mode.ACTIVE:  # refused: heartbeat and replicate
                self._logsvc_heartbeat_now(now_s)
            return
        assert kind == _QUIESCE
        try:
            request = quiescence.QuiesceRequest(
                term=term,
                seq=seq,
                last_index=int(message["last_index"]),
                last_term=int(message["last_term"]),
                commit_index=int(message["commit_index"]),
                targets=(),
            )
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed %s from %s", kind, sender)
            return
        store = self._logsvc_journal.store
        leader_node = self._getLeader()
        view = quiescence.FollowerView(
            term=int(self.raftCurrentTerm),
            is_follower=self._SyncObj__raftState == pysyncobj_syncobj._RAFT_STATE.FOLLOWER,
            leader=None if leader_node is None else str(leader_node.id),
            last_index=store.last_index,
            last_term=int(self._logsvc_journal.entry(store.last_index)[2]),
        )
        agreed = self._logsvc_follower_q.on_request(sender, request, view)
        if view.is_follower and request.term == view.term and view.leader == sender:
            # From our leader in our term: it stands for its heartbeat.
            self._SyncObj__raftElectionDeadline = now_s + self._SyncObj__generateRaftTimeout()
        if agreed and request.commit_index > self._SyncObj__raftCommitIndex:
            # The leader vouches for our whole log: it ends where its does (log matching).
            self._SyncObj__raftCommitIndex = min(request.commit_index, request.last_index)
            self._logsvc_messages += 1  # apply it on the next tick
        self._SyncObj__transport.send(
            node, {"type": _QUIESCE_ACK, "term": request.term, "seq": request.seq, "ok": agreed}
        )

    def logsvc_before_events(self, now_s: float) -> None:
        """Before the tick delivers its socket events: a quiet (or quiescing) replica's
        connections to live nodes count as just read from. pysyncobj checks a connection's
        read timeout on every event *before* reading it, so the first message on a
        connection quiet for longer than connection_timeout (a vote request, a woken
        leader's AppendEntries, an `alive`) closed it unread: its follower then lost its
        leader and stood (idle shards churned, and failover votes were lost)."""
        if self._logsvc_quiesce_after_s and (
            self.logsvc_quiet
            or (
                self._logsvc_leader_q is not None
                and self._logsvc_leader_q.mode is quiescence.Mode.QUIESCING
            )
        ):
            self._logsvc_refresh_connections(now_s)

    def _logsvc_quiesce_before(self, now_s: float) -> None:
        """Before a tick: keep a quiet follower's election timer and a quiet leader's
        heartbeat and fallback timers from firing; wake a quiet follower whose leader's
        node lapsed."""
        if not self._logsvc_quiesce_after_s:
            return
        if self.logsvc_quiet or (
            self._logsvc_leader_q is not None
            and self._logsvc_leader_q.mode is quiescence.Mode.QUIESCING
        ):
            self._logsvc_refresh_connections(now_s)
        follower = self._logsvc_follower_q
        if follower.quiet:
            leader = self._getLeader()
            state = self._SyncObj__raftState
            if (
                state != pysyncobj_syncobj._RAFT_STATE.FOLLOWER
                or leader is None
                or str(leader.id) != follower.leader
            ):
                follower.wake()
            elif self._logsvc_liveness.lapsed(self._logsvc_node_of(follower.leader), now_s):
                self._logsvc_lost_leader(now_s, "the leader's node lapsed")
            else:
                self._SyncObj__raftElectionDeadline = now_s + self._logsvc_election_max_s
        else:
            leader_node = self._getLeader()
            if leader_node is not None:
                address = str(leader_node.id)
                if (
                    self._logsvc_stood_for != (int(self.raftCurrentTerm), address)
                    and self._logsvc_follows(address)
                    and self._logsvc_liveness.lapsed(self._logsvc_node_of(address), now_s)
                ):
                    self._logsvc_stand_in_turn(address, now_s, "the leader's node lapsed")
        leader_q = self._logsvc_leader_q
        if leader_q is not None and leader_q.mode is not quiescence.Mode.ACTIVE:
            self._SyncObj__newAppendEntriesTime = math.inf
            if leader_q.quiet:
                liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
                last_response = self._SyncObj__lastResponseTime
                for node in self._SyncObj__otherNodes:
                    if node in last_response and not liveness.lapsed(node_of(node.id), now_s):
                        last_response[node] = now_s

    def _logsvc_quiesce_after(self, now_s: float) -> None:
        """After a tick: the leader's quiescence step (ask, resend, or wake)."""
        if not self._logsvc_quiesce_after_s:
            return
        if not self._isLeader():
            self._logsvc_leader_q = None
            if self._SyncObj__raftState == pysyncobj_syncobj._RAFT_STATE.CANDIDATE:
                self._logsvc_follower_q.wake()
            return
        leader_q = self._logsvc_leader_q
        if leader_q is None:
            leader_q = quiescence.LeaderQuiescence(self._logsvc_quiesce_after_s, QUIESCE_RESEND_S)
            self._logsvc_leader_q = leader_q
        fingerprint = (
            int(self.raftCurrentTerm),
            self._logsvc_journal.store.last_index,
            int(self._SyncObj__raftCommitIndex),
            int(self._SyncObj__raftLastApplied),
        )
        moved = leader_q.changed(fingerprint, now_s)  # under load: every tick, and cheap
        if moved is None:
            woke, request = leader_q.observe(self._logsvc_leader_view(now_s), now_s)
        else:
            woke, request = moved, None
        if woke:
            self._logsvc_heartbeat_now(now_s)
        if request is not None:
            targets = set(request.targets)
            message = {
                "type": _QUIESCE,
                "term": request.term,
                "seq": request.seq,
                "last_index": request.last_index,
                "last_term": request.last_term,
                "commit_index": request.commit_index,
            }
            for node in self._SyncObj__otherNodes:
                if str(node.id) in targets:
                    self._SyncObj__transport.send(node, dict(message))
        if leader_q.mode is not quiescence.Mode.ACTIVE:
            self._SyncObj__newAppendEntriesTime = math.inf

    def _logsvc_leader_view(self, now_s: float) -> quiescence.LeaderView:
        journal = self._logsvc_journal
        last_index = journal.store.last_index
        match_index = self._SyncObj__raftMatchIndex
        connected = self._SyncObj__connectedNodes
        liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
        busy = bool(
            self._SyncObj__commandsQueue._FastQueue__queue
            or self._SyncObj__commandsWaitingCommit
            or self._SyncObj__serializer._outgoing
            or self._SyncObj__readonlyNodes  # a learner catching up: never quiet
        )
        return quiescence.LeaderView(
            term=int(self.raftCurrentTerm),
            last_index=last_index,
            last_term=int(journal.entry(last_index)[2]),
            commit_index=int(self._SyncObj__raftCommitIndex),
            last_applied=int(self._SyncObj__raftLastApplied),
            busy=busy,
            peers=tuple(
                quiescence.Peer(
                    address=str(node.id),
                    match_index=int(match_index.get(node, 0)),
                    connected=node in connected,
                    alive=not liveness.lapsed(node_of(str(node.id)), now_s),
                )
                for node in self._SyncObj__otherNodes
            ),
        )

    def _logsvc_send_alive(self, now_s: float) -> None:
        """After a tick: an `alive` message to each connected peer whose node got nothing
        from this node for a heartbeat interval (node liveness, for quiet shards)."""
        if not self._logsvc_quiesce_after_s or self._logsvc_learner:
            return  # (a learner's connections are anonymous: they carry no liveness)
        liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
        connected = self._SyncObj__connectedNodes
        for node in self._SyncObj__otherNodes:
            if node in connected and liveness.send_due(node_of(str(node.id)), now_s):
                # It may be the only thing this connection carries: not a timed-out one.
                self._logsvc_refresh_connections(now_s, only=node)
                self._SyncObj__transport.send(node, {"type": _ALIVE})

    def _logsvc_next_wakeup_s(self, now_s: float) -> float | None:
        """When this replica must tick again if nothing happens (None: not until an event:
        a quiet replica)."""
        if not self._SyncObj__transport.ready:
            return now_s + float(self._SyncObj__conf.bindRetryTime)
        if self._SyncObj__raftCommitIndex > self._SyncObj__raftLastApplied:
            return now_s
        if self._SyncObj__commandsQueue._FastQueue__queue and self._SyncObj__raftLeader:
            return now_s
        if self._logsvc_snapshot_at_start:
            return now_s
        due_s = math.inf
        if self._isLeader():
            leader_q = self._logsvc_leader_q
            if leader_q is None or leader_q.mode is quiescence.Mode.ACTIVE:
                due_s = min(due_s, float(self._SyncObj__newAppendEntriesTime))
            if leader_q is not None:
                check_s = leader_q.next_check_s(now_s)  # None: quiet
                if check_s is not None:
                    due_s = min(due_s, check_s)
        elif self._logsvc_follower_q.quiet:
            pass  # no election timer while quiet
        elif not self._logsvc_learner:  # a learner never stands: no election timer
            election_s = float(self._SyncObj__raftElectionDeadline)
            if election_s > now_s or self._SyncObj__connectedNodes or not self._SyncObj__otherNodes:
                due_s = min(due_s, election_s)
            # else: due, but pysyncobj stands only once connected to someone: the redial
            # below (or the connection's event) is when it can.
        # A peer's connection down: tick to redial it, quiet or not (a quiet replica no
        # longer wakes when another replica's connection drops, and would otherwise stay
        # cut off from a live peer it needs once its leader is lost). A lapsed node is
        # redialled by the scheduler's rotation instead, one replica per reconnect
        # interval, and its return wakes every replica with a member there.
        connected = self._SyncObj__connectedNodes
        liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
        liveness_fed = bool(self._logsvc_quiesce_after_s)
        if any(
            node not in connected
            and not (liveness_fed and liveness.lapsed(node_of(str(node.id)), now_s))
            for node in self._SyncObj__otherNodes
        ):
            due_s = min(due_s, now_s + float(self._SyncObj__conf.connectionRetryTime))
        return None if due_s == math.inf else max(due_s, now_s)

    @property
    def logsvc_quiet(self) -> bool:
        """Quiet: a leader every follower agreed with, or a follower that agreed."""
        leader = self._logsvc_leader_q
        return self._logsvc_follower_q.quiet or (leader is not None and leader.quiet)

    # -- hole 6: compaction only at snapshot points ----------------------------------------

    def _SyncObj__tryLogCompaction(self) -> None:
        point = self._logsvc_handler.compaction_point()
        if point is None:
            return
        raft_index, state = point
        store = self._logsvc_journal.store
        if raft_index <= self._logsvc_compacted_at or raft_index - 1 <= store.first_index:
            return
        if raft_index > self._SyncObj__raftLastApplied:
            return
        journal = self._logsvc_journal
        last, prev = journal.entry(raft_index), journal.entry(raft_index - 1)
        nodes = set(self._SyncObj__otherNodes)
        if self._SyncObj__selfNode is not None:  # None: a learner
            nodes.add(self._SyncObj__selfNode)
        cluster = tuple(sorted(node.id for node in nodes))
        if journal.membership is not None:  # the configuration as of the snapshot's entry
            cluster = journal.membership.members_at(raft_index)
        data = snapshot_file.encode(
            snapshot_file.SnapshotFile(
                last=snapshot_file.JournalEntry(last[1], last[2], bytes(last[0])),
                prev=snapshot_file.JournalEntry(prev[1], prev[2], bytes(prev[0])),
                cluster=cluster,
                state=state,
            )
        )
        _write_durably(self._logsvc_fs, self._logsvc_snapshot_path, data)
        for node in self._SyncObj__otherNodes:
            self._SyncObj__serializer.cancelTransmisstion(node)
        journal.deleteEntriesTo(raft_index - 1 - store.first_index)
        self._logsvc_compacted_at = raft_index
        log.info(
            "compacted the journal to raft index %d (snapshot point)",
            raft_index,
            extra={"term": self.raftCurrentTerm},
        )

    # -- hole 4: a snapshot that cannot be loaded is fatal ----------------------------------

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        path = self._logsvc_snapshot_path
        try:
            data = self._logsvc_fs.read_file(path)
            snapshot = snapshot_file.decode(data)
            # A received snapshot must be durable before we rely on it.
            _make_durable(self._logsvc_fs, path)
        except (OSError, snapshot_file.SnapshotFileCorrupt) as exc:
            raise RaftFatal(f"cannot load the snapshot {path}: {exc}") from exc
        journal = self._logsvc_journal
        store = journal.store
        last, prev = snapshot.last, snapshot.prev
        have_last = store.first_index <= last.index <= store.last_index and (
            journal.entry(last.index)[2] == last.term
        )
        if have_last:
            # Raft §7: our log already holds the snapshot's last entry: keep what follows.
            if store.first_index < prev.index:
                journal.deleteEntriesTo(prev.index - store.first_index)
        else:
            # Raft §7: a snapshot holds committed state only, so a journal that lacks its
            # last entry (shorter, or conflicting there) is replaced by it. At start
            # (clearJournal False) this is a follower killed after it made a received
            # snapshot durable but before it reset its journal: refusing to start would
            # leave the replica down for good (found by the chaos suite's review).
            if not clearJournal:
                log.warning(
                    "the snapshot at raft index %d is ahead of the journal [%d, %d]: "
                    "finishing its installation (the journal is reset to it)",
                    last.index,
                    store.first_index,
                    store.last_index,
                )
            journal.reset_to(prev.index)
            journal.add(prev.command, prev.index, prev.term)
            journal.add(last.command, last.index, last.term)
            if journal.membership is not None:  # the log now starts with the snapshot
                journal.membership.on_reset(last.index, last.term, snapshot.cluster)
        self._logsvc_handler.install_snapshot(last.index, snapshot.state)
        self._SyncObj__raftLastApplied = last.index
        self._logsvc_compacted_at = max(self._logsvc_compacted_at, last.index)
        if self._SyncObj__raftCommitIndex < last.index:
            self._SyncObj__raftCommitIndex = last.index
        if journal.membership is not None:
            # Our own log's configuration (a snapshot we already had the entries of may
            # carry an older one).
            self._logsvc_follow_membership()
        else:
            self._SyncObj__updateClusterConfiguration(
                [node for node in snapshot.cluster if node != self._SyncObj__selfNode.id]
            )
        self._SyncObj__onSetCodeVersion(0)
        log.info(
            "installed the snapshot at raft index %d",
            last.index,
            extra={"term": self.raftCurrentTerm},
        )
