"""A learner (Raft thesis §4.2.1) on real pysyncobj replicas (loopback).

Proves: a replica started as a learner (pysyncobj's read-only node: no Raft port, dials the
members) receives the whole log and the leader sees its progress under the address it
announced, while it counts in no majority: with one of three voters down, commands still
commit on the other two (a fourth *voting* member with an empty log would have needed
three of four). Promoted by restarting it as a joining voter on the same journal, it is
added with `addNodeToCluster` and the group of four commits on; the learner never stood
for election (its term only follows the leader's).

How: raft_harness's replicas; the learner is a `RaftNode` with `learner=True`.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from logsvc.shard.raft import transport as raft_transport

from .raft_harness import Cluster, Replica, wait_until
from .test_membership_raft import change, has_all, start


def start_learner(replica: Replica, members: tuple[str, ...]) -> None:
    start(replica, members, joining=True, learner=True, fresh_handler=False)


def test_a_learner_catches_up_without_voting_then_is_promoted(tmp_path: Path) -> None:
    cluster = Cluster(str(tmp_path), size=4)
    r0, r1, r2, learner = cluster.replicas
    voters = (r0, r1, r2)
    try:
        for replica in voters:
            start(replica, tuple(o.address for o in voters if o is not replica))
        wanted = [f"a-{i}".encode() for i in range(60)]
        assert len(cluster.propose(wanted)) == len(wanted)

        start_learner(learner, tuple(r.address for r in voters))
        assert learner.node is not None and learner.node.learner
        leader = cluster.leader()
        assert leader.node is not None and leader is not learner
        wait_until(partial(has_all, learner, wanted), "the learner to receive every command")
        wait_until(
            lambda: (
                leader.node is not None
                and leader.node.learners().get(learner.address) == leader.node.last_index
            ),
            "the leader to see the learner caught up under its address",
        )
        # One voter down: two of three still commit (the learner counts in no majority).
        down = next(r for r in voters if r is not leader)
        cluster.stop(down)
        more = [f"b-{i}".encode() for i in range(20)]
        assert len(cluster.propose(more)) == len(more)
        wanted += more
        wait_until(partial(has_all, learner, wanted), "the learner to follow on")
        assert not learner.node.is_leader
        assert sorted(leader.node.members) == sorted(r.address for r in voters)

        # Promotion: the same journal, restarted as a joining voter, then added.
        term_before = learner.node.term
        cluster.stop(learner)
        start(learner, tuple(r.address for r in voters), joining=True)
        assert learner.node is not None and not learner.node.learner
        assert learner.store is not None and learner.store.last_index >= len(wanted)
        change(leader.node, "add", learner.address)
        assert sorted(leader.node.members) == sorted(r.address for r in cluster.replicas)
        # Four members, one down: the promoted replica makes the third of four.
        last = [f"c-{i}".encode() for i in range(20)]
        assert len(cluster.propose(last)) == len(last)
        wanted += last
        wait_until(partial(has_all, learner, wanted), "the promoted replica to apply on")
        assert not learner.node.joining
        assert learner.node.term == leader.node.term >= term_before
    finally:
        cluster.close()


def test_a_learner_lost_while_a_large_entry_goes_to_it_in_parts_does_not_stop_the_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj sends an entry of 64 KiB or more in parts; a learner's connection lost
    between two parts dropped its next index (pysyncobj forgets a read-only node at once)
    while the send loop still read it: a KeyError that stopped the leader's replica for good
    (seen in tests/e2e/test_learner.py, 2026-11-28: the shard then had no leader). Here the
    learner's connection is cut right after the first part of such an entry: the leader
    leads on, the entry commits, and the learner, back, receives it."""
    cluster = Cluster(str(tmp_path), size=4)
    r0, r1, r2, learner = cluster.replicas
    voters = (r0, r1, r2)
    cut: list[object] = []
    send = raft_transport._DurableTransport.send

    def cutting_send(transport: Any, node: Any, message: dict[str, Any]) -> bool:
        sent = bool(send(transport, node, message))
        if not cut and message.get("transmission") == "start" and node in transport._readonlyNodes:
            cut.append(node)
            transport._connections[node].disconnect()  # as a reset connection does
        return sent

    try:
        for replica in voters:
            start(replica, tuple(o.address for o in voters if o is not replica))
        wanted = [b"small-0"]
        assert len(cluster.propose(wanted)) == 1
        start_learner(learner, tuple(r.address for r in voters))
        wait_until(partial(has_all, learner, wanted), "the learner to receive the first")
        leader = cluster.leader()
        assert leader.node is not None

        monkeypatch.setattr(raft_transport._DurableTransport, "send", cutting_send)
        large = b"L" * (2**16 + 1_000)  # pysyncobj's appendEntriesBatchSizeBytes and more
        assert len(cluster.propose([large])) == 1
        wanted.append(large)
        # The learner is in no majority: the entry may commit before its part leaves.
        wait_until(lambda: bool(cut), "a large entry's first part to go to the learner")
        assert leader.node.fatal is None
        assert leader.node.is_leader
        more = [b"small-1"]
        assert len(cluster.propose(more)) == 1
        wanted += more
        wait_until(partial(has_all, learner, wanted), "the learner, back, to receive them")
    finally:
        cluster.close()
