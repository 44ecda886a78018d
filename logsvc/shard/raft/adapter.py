"""`ShardRaft`: pysyncobj's SyncObj with logsvc's fixes (the hole table is in __init__.py).

The one class of logsvc that reaches into pysyncobj's private state: its docstring lists
every reach-in, why, and which of its parts makes it. Everything else of the package talks
to it through its `logsvc_*` methods or pysyncobj's public API (`doTick`,
`raftCurrentTerm`, `getStatus`, ...).

It is assembled from parts by concern, each a mixin over `adapter_base.AdapterBase` (which
declares the state they share and derives from pysyncobj's SyncObj); only these modules
touch pysyncobj's privates:

- here: construction, what RaftNode asks, sealing, membership, the leader's durable count;
- `message_fixes.MessageFixes`: every received message passes there first (hole 3);
- `elections.Elections`: pre-vote and who stands when a leader is lost (standing.py);
- `quiet.Quiet`: quiescence, node liveness, connection events, the next wake-up;
- `snapshot_points.SnapshotPoints`: compaction at snapshot points, the snapshot load."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj import SyncObj, SyncObjConf, replicated

from logsvc.shard import quiescence, scheduler
from logsvc.shard.leader_contact import LeaderContact
from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.raft.chunks import ChunkAssembler
from logsvc.shard.raft.config import RaftConfig, RaftHandler
from logsvc.shard.raft.elections import Elections
from logsvc.shard.raft.journal import StoreJournal
from logsvc.shard.raft.message_fixes import MessageFixes
from logsvc.shard.raft.patches import _JOURNALS, _POLLERS
from logsvc.shard.raft.quiet import Quiet
from logsvc.shard.raft.snapshot_points import SnapshotPoints
from logsvc.shard.raft.snapshot_transfer import _never_called, _SnapshotTransfer
from logsvc.shard.raft.transport import _DialNode, _DurableTransport, durable_transport_class
from logsvc.shard.raft_seal import MessageSealer
from logsvc.store.fs import FileSystem, OsFileSystem

log = logging.getLogger("logsvc.raft")


# pysyncobj's own compaction must never trigger (we compact at snapshot points only).
_NEVER = 2**62


class ShardRaft(Quiet, Elections, MessageFixes, SnapshotPoints):
    """A pysyncobj SyncObj with logsvc's fixes. Created and ticked by `RaftNode`.

    pysyncobj 0.3.17 internals used by it and its parts (pinned: patches.py asserts the
    version), and why. Overrides are made here unless a part is named; state is read or
    written by the parts its reason names (quiescence and liveness: quiet.py; pre-vote,
    the survivors' order, a stale candidate: elections.py; hole 3: message_fixes.py;
    holes 4 and 6: snapshot_points.py).

    Overridden private methods
      `_onTick`                     load a snapshot present at start through the
                                    file-system port before the first tick (hole 4)
      `_getEncryptor`, `encryptor`  AES-GCM sealing instead of Fernet (hole 10)
      `__changeCluster`             mark the leader's own membership proposal
      `__doChangeCluster`           follow the log's latest configuration (membership.py)
      `__tryLogCompaction`          compaction at snapshot points only (hole 6;
                                    snapshot_points.py)
      `__loadDumpFile`              a bad snapshot is fatal; journal reset to it (hole 4;
                                    snapshot_points.py)
      `__onReadonlyNodeDisconnected`  a lost learner's next index kept until the tick
                                    ends (its AppendEntries loop may read it once more)
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
      `__raftMatchIndex`            followers' progress (progress view, learners, quiet,
                                    whether the leader's own sync may commit: syncer)
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
                                    FastQueue has no non-consuming emptiness test; the
                                    waiters of entries a snapshot install skipped are
                                    answered UNKNOWN_OUTCOME (snapshot_points.py)
      `__serializer`                replaced by `_SnapshotTransfer` (file-system port);
      `__needLoadDumpFile`          off: `_onTick` loads it through the port instead
      `__transport`                 our own messages, the held replies, the tick's flush
      `__conf`                      bindRetryTime, connectionRetryTime, raftMinTimeout,
                                    raftMaxTimeout (the survivors' order, standing.py)
      `__generateRaftTimeout`       a random election timeout drawn as pysyncobj does
      `__updateClusterConfiguration`  set pysyncobj's peers to the log's configuration
      `__connectedToAnyone`, `__transferInProgress`  pre-vote asks only when pysyncobj
                                    would stand now, and never for a leader's transfer
                                    (TimeoutNow: the leader asked for it);
                                    `__connectedToAnyone` overridden: pysyncobj stands
                                    only for the term a pre-vote won (elections.py)
      `__setCurrentTerm`, `__setState`  a pre-vote answer from a voter at a higher term:
                                    take it as a leaderless follower, as pysyncobj
                                    does for a vote request of a higher term
                                    (elections.py, prevote.py `term_to_adopt`)
      `__onSetCodeVersion`          what pysyncobj's own snapshot load does last
      `_isLeader`, `_getLeader`     role and leader (no public equivalent)
      `_TcpConnection__lastReadTime`  a quiet shard's connection is not timed out while
                                    its peer's node is live (`_logsvc_refresh_connections`)
    In listener.py, `SteadyServer` (the Raft listener a failed accept does not close):
      `_TcpServer__onNewConnection` replaced; `_TcpServer__socket`, `_TcpServer__poller`,
      `_TcpServer__host`, `_TcpServer__port`, `_TcpServer__sendBufferSize`,
      `_TcpServer__recvBufferSize`, `_TcpServer__connectionTimeout`,
      `_TcpServer__keepalive`, `_TcpServer__onNewConnectionCallback` read to set up an
      accepted connection as pysyncobj does.
    On its behalf elsewhere in this package: transport.py overrides the transport's
    `send` (and reads `_connections[node].sendRandKey`: nothing is sent on a connection
    before its key exchange ends), `addNode`, `setOnMessageReceivedCallback` and
    `_on(Readonly)Node(Dis)connected` hooks, `_connectIfNecessarySingle` (dials to a
    node that refused are coalesced per node, liveness.py) and `_createServer` (the
    listener, listener.py); journal.py subclasses pysyncobj's `Journal`; patches.py
    replaces the module globals `createJournal`, `createPoller`, `PIPE_NOTIFIER_ENABLED`,
    the pickle protocol, `tcp_connection.zlib` and (simulator only) `monotonicTime`.
    """

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
        self._logsvc_node_of = node_of if node_of is not None else str
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
        self._logsvc_leader_q = None
        self._logsvc_follower_q = quiescence.FollowerQuiescence()
        self._logsvc_self_address = config.self_address
        self._logsvc_learner = config.learner
        # On a member: the learners connected to it (pysyncobj's read-only node -> the
        # address the learner announced).
        self._logsvc_learners = {}
        # Read-only nodes lost during a tick whose next index is kept until the next one
        # (`_SyncObj__onReadonlyNodeDisconnected`).
        self._logsvc_learners_gone = []
        self._logsvc_fs = file_system if file_system is not None else OsFileSystem()
        self._logsvc_journal = journal
        self._logsvc_handler = handler
        self._logsvc_snapshot_path = config.snapshot_path
        self._logsvc_compacted_at = 0
        self._logsvc_chunks = ChunkAssembler()
        self._logsvc_dial = dict(config.dial_overrides)
        self._logsvc_proposing = False  # inside the leader's own membership change
        # (term, leader) whose loss last set our election timer in the survivors' order.
        self._logsvc_stood_for = None
        # When the leader last reached us on this shard, and whether it is quiet as far as
        # we know: whether it is live for the pre-vote grant (leader_contact.py).
        self._logsvc_leader_contact = LeaderContact()
        # Pre-vote (prevote.py): the round asking, the term it won, silent rounds in a row.
        self._logsvc_prevote = None
        self._logsvc_prevote_won = (0, 0.0)  # (term, when)
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

    def logsvc_commit_may_wait_on_own_sync(self) -> bool:
        """On the leader, any thread (the syncer's): whether its own durable index can be
        what holds the commit index back, so that its sync finishing may commit something.
        False when it has other voters and none acknowledged an entry above the commit
        index: a majority needs a follower's ack first, and the tick that receives it counts
        the leader's durable index as it is then. A map changed during the look: True."""
        others = self._SyncObj__otherNodes
        if not others:
            return True
        commit = self._SyncObj__raftCommitIndex
        match = self._SyncObj__raftMatchIndex
        try:
            return any(match.get(node, 0) > commit for node in tuple(others))
        except RuntimeError:  # the tick changed the peers meanwhile
            return True

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
        if self._logsvc_learners_gone:
            next_index, readonly = self._SyncObj__raftNextIndex, self._SyncObj__readonlyNodes
            for node in self._logsvc_learners_gone:
                if node not in readonly:
                    next_index.pop(node, None)
            self._logsvc_learners_gone.clear()
        super()._onTick(timeToWait)

    def _SyncObj__onReadonlyNodeDisconnected(self, node: Any) -> None:
        """pysyncobj's, but the lost learner's next index stays until the next tick starts.

        pysyncobj drops it at once, and the connection can drop under `__sendAppendEntries`
        itself: between two parts of an entry of appendEntriesBatchSizeBytes or more, whose
        loop then reads the learner's next index once more. The KeyError stopped the
        leader's replica for good (tests/e2e/test_learner.py, 2026-11-28: a learner's
        connection lost while it caught up on large entries left the shard leaderless)."""
        next_index = self._SyncObj__raftNextIndex.get(node)
        super()._SyncObj__onReadonlyNodeDisconnected(node)
        if next_index is not None:
            self._SyncObj__raftNextIndex[node] = next_index
            self._logsvc_learners_gone.append(node)

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
        term = int(self.raftCurrentTerm)
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
