"""`Quiet`, a part of `adapter.ShardRaft`: quiescence (quiescence.py: an idle shard's
leader and followers agree to stop heartbeats and election timers) and node liveness
(liveness.py: an `alive` per peer node stands in for them), the connection events that end
quiet, and when a replica must tick again (`_logsvc_next_wakeup_s`, for the scheduler)."""

from __future__ import annotations

import logging
import math
from typing import Any

import pysyncobj.syncobj as pysyncobj_syncobj
import pysyncobj.tcp_connection as pysyncobj_tcp_connection
from pysyncobj.node import TCPNode

from logsvc.shard import quiescence
from logsvc.shard.raft.adapter_base import (
    _ALIVE,
    _LEARNER,
    _QUIESCE,
    _QUIESCE_ACK,
    AdapterBase,
)

log = logging.getLogger("logsvc.raft")

# How often a quiescing leader asks again the followers that did not answer.
QUIESCE_RESEND_S = 0.5


class Quiet(AdapterBase):
    """The quiescence and liveness part of `ShardRaft` (mixed in; its state is declared on
    `AdapterBase`)."""

    def _logsvc_note_sent(self, node: Any) -> None:
        if self._logsvc_quiesce_after_s:
            self._logsvc_liveness.sent(
                self._logsvc_node_of(str(node.id)), pysyncobj_syncobj.monotonicTime()
            )

    def _logsvc_on_connection(self, node: Any, up: bool) -> None:
        """A connection to a peer came up or went down (inside a tick)."""
        self._logsvc_messages += 1  # the tick after it acts on it (reconnects, catch-up)
        if self._logsvc_learner:
            # Rare (a learner's few connections): said, so that a learner that does not
            # catch up shows whether it ever reached its members.
            log.info("learner: connection to %s %s", node.id, "up" if up else "down")
        if up and self._logsvc_learner:
            # pysyncobj's read-only node is anonymous: say which replica this is, so the
            # leader can tell when the learner an admin change started has caught up.
            sent = self._SyncObj__transport.send(
                node, {"type": _LEARNER, "address": self._logsvc_self_address}
            )
            if not sent:
                log.warning("learner: could not announce itself to %s", node.id)
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
        is live in the liveness table, its connection is as good as heard from. Once the
        node lapses, pysyncobj's timeout counts from when the node was last heard from on
        any connection (or from the last refresh, if later): a node silent for the whole
        connection_timeout loses its connections, as with pysyncobj alone. Counting from
        the last refresh instead closed the connections of every quiet replica not ticked
        lately as soon as a node had lapsed for a moment (this process stalled for longer
        than the lapse, a collection of a large heap, say): the lapse wakes one replica per
        peer to redial, and its first `alive` closed its connection unsent."""
        connections = getattr(self._SyncObj__transport, "_connections", None)
        if not connections:
            return  # the simulator's transport keeps no such clock
        liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
        for node, connection in connections.items():
            if only is not None and node != only:
                continue
            if connection.state != pysyncobj_tcp_connection.CONNECTION_STATE.CONNECTED:
                continue
            peer = node_of(str(node.id))
            read_s = now_s if not liveness.lapsed(peer, now_s) else liveness.last_heard(peer)
            if read_s > connection._TcpConnection__lastReadTime:
                connection._TcpConnection__lastReadTime = read_s

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
            self._logsvc_leader_contact.on_quiesce_request(now_s, agreed)
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
