"""`Elections`, a part of `adapter.ShardRaft`: who stands when a shard's leader is lost
(the survivors' order, standing.py), pre-vote (prevote.py), and a voter that refuses a
stale candidate standing at once. Only timers and our own messages: terms and votes stay
pysyncobj's (Raft's safety is untouched)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import pysyncobj.syncobj as pysyncobj_syncobj

from logsvc.shard import prevote, standing
from logsvc.shard.raft.adapter_base import _PREVOTE, _PREVOTE_ACK, AdapterBase

log = logging.getLogger("logsvc.raft")


class Elections(AdapterBase):
    """The election-timing part of `ShardRaft` (mixed in; it has no state of its own)."""

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
        if not self._logsvc_connected_to_anyone():
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

    def _SyncObj__connectedToAnyone(self) -> bool:
        """pysyncobj's one call of it is its check whether to stand now (`_onTick`:
        election timer due and connected to anyone): connected, and standing allowed, which
        is only for the term a pre-vote won (or a leader's transfer, or without pre-vote
        where the gate above says so, recorded as won). The gate read the clock before
        pysyncobj's tick and pysyncobj reads it again: a timer due between the two reads let
        pysyncobj stand unasked (a loaded worker thread makes that gap milliseconds), and a
        follower behind its live leader then deposed it (issue 22's leaderless start-ups).
        A timer found due here but not by the gate waits for the next tick's gate."""
        if not self._logsvc_connected_to_anyone():
            return False
        if self._logsvc_learner or self._SyncObj__transferInProgress:
            return True
        won_term, won_s = self._logsvc_prevote_won
        return won_term == int(self.raftCurrentTerm) + 1 and (
            pysyncobj_syncobj.monotonicTime() - won_s < float(self._SyncObj__conf.raftMinTimeout)
        )

    def _logsvc_connected_to_anyone(self) -> bool:
        """pysyncobj's own `__connectedToAnyone` (overridden above)."""
        return bool(pysyncobj_syncobj.SyncObj._SyncObj__connectedToAnyone(self))

    def _logsvc_on_prevote_message(
        self, node: Any, sender: str, kind: str, message: dict[str, Any]
    ) -> None:
        try:
            term = int(message["term"])
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed %s from %s", kind, sender)
            return
        if kind == _PREVOTE_ACK:
            if self._isLeader():
                return
            self._logsvc_adopt_voter_term(sender, message)
            round_ = self._logsvc_prevote
            if round_ is None:
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
        live_leader = None
        if leader is not None and leader in self._SyncObj__connectedNodes:
            address = str(leader.id)
            now_s = pysyncobj_syncobj.monotonicTime()
            lapsed = bool(self._logsvc_quiesce_after_s) and self._logsvc_liveness.lapsed(
                self._logsvc_node_of(address), now_s
            )
            lost = self._logsvc_stood_for == (int(self.raftCurrentTerm), address)
            # Raft's recency (leader_contact.py): a leader that heartbeats is live only if
            # it reached us on this shard within the shortest election timeout; its node
            # being heard through other shards says nothing about this one (C10).
            silent = not self._logsvc_leader_contact.live(
                now_s, float(self._SyncObj__conf.raftMinTimeout)
            )
            live_leader = None if lapsed or lost or silent else address
        granted = prevote.grants(
            proposed_term=term,
            candidate=sender,
            candidate_last=candidate_last,
            own_term=int(self.raftCurrentTerm),
            own_last=(int(journal.entry(last_index)[2]), last_index),
            leading=bool(self._isLeader()),
            live_leader=live_leader,
        )
        self._SyncObj__transport.send(
            node,
            {
                "type": _PREVOTE_ACK,
                "term": term,
                "granted": granted,
                "voter_term": int(self.raftCurrentTerm),
            },
        )

    def _logsvc_adopt_voter_term(self, sender: str, message: dict[str, Any]) -> None:
        """A pre-vote answer from a voter at a higher term: take that term, as a follower
        without a leader, as pysyncobj does for a vote request of a higher term
        (prevote.py `term_to_adopt`). Durable before anything leaves: the tick's flush
        writes the vote record before it sends."""
        try:
            voter_term = message.get("voter_term")
            voter_term = None if voter_term is None else int(voter_term)
        except (TypeError, ValueError):
            log.warning("ignoring a malformed voter_term from %s", sender)
            return
        own_term = int(self.raftCurrentTerm)
        adopted = prevote.term_to_adopt(own_term, voter_term)
        if adopted is None:
            return
        log.info(
            "a pre-vote answer from %s is at term %d, above ours: taking it",
            sender,
            adopted,
            extra={"term": own_term},
        )
        self._SyncObj__setCurrentTerm(adopted, None)
        self._SyncObj__setState(pysyncobj_syncobj._RAFT_STATE.FOLLOWER)
        self._SyncObj__raftLeader = None
        self._logsvc_prevote = None  # its round asked for a term now behind us
        self._logsvc_messages += 1

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
