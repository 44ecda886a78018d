"""`MessageFixes`, a part of `adapter.ShardRaft`: every message a shard's Raft connection
delivers passes here before pysyncobj sees it (hole 3 of the package's table: nextIndex
never rewound by a late ack nor raised by a refusal, AppendEntries trimmed to its first
conflict, a commit index never past what the leader vouched for), and our own messages
(quiescence, liveness, learners, pre-vote) are routed to their parts and never reach
pysyncobj."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj.node import TCPNode

from logsvc.shard.raft.adapter_base import (
    _LEARNER,
    _OWN_MESSAGES,
    _PREVOTE,
    _PREVOTE_MESSAGES,
    AdapterBase,
)

log = logging.getLogger("logsvc.raft")


class MessageFixes(AdapterBase):
    """The message-routing part of `ShardRaft` (mixed in; it has no state of its own)."""

    def _logsvc_on_message(
        self, node: Any, message: dict[str, Any], deliver: Callable[[Any, dict[str, Any]], None]
    ) -> None:
        kind = message.get("type")
        if kind == _LEARNER:
            address = message.get("address")
            if isinstance(address, str) and not isinstance(node, TCPNode):
                if self._logsvc_learners.get(node) != address:
                    log.info("the learner at %s connected (read-only connection)", address)
                self._logsvc_learners[node] = address
            return
        if kind in _PREVOTE_MESSAGES:
            if isinstance(node, TCPNode):  # never from a learner (it does not stand)
                now_s = pysyncobj_syncobj.monotonicTime()
                if self._logsvc_quiesce_after_s:
                    self._logsvc_liveness.heard(self._logsvc_node_of(str(node.id)), now_s)
                    if kind == _PREVOTE and self._isLeader():
                        # A peer of ours would stand: it has not heard from us for an
                        # election timeout. A quiet leader's follower that woke alone (by
                        # an event of its own; which one was not traced) ran its timer
                        # while we stayed quiet: we refused its every round, its other
                        # peer too (it sees us alive), and it asked again and again, for
                        # good (issue 22: up to 60 rounds a second over a 3-node cluster
                        # of 1,000 shards, and never quiet again). Wake: the heartbeat
                        # resets its timer, and the shard goes quiet again, all agreeing.
                        self._logsvc_wake(now_s)
                self._logsvc_on_prevote_message(node, str(node.id), kind, message)
            return
        now_s = pysyncobj_syncobj.monotonicTime()
        if self._logsvc_quiesce_after_s:
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
        if kind == "append_entries":
            term = message.get("term")
            if isinstance(term, int) and term >= int(self.raftCurrentTerm):
                # pysyncobj follows its sender (as Raft does): our leader reached us.
                self._logsvc_leader_contact.on_append_entries(now_s)
            elif isinstance(term, int) and not self._isLeader():
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
