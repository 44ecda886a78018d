"""Membership changes on real pysyncobj replicas (loopback): a replica joins, one is
removed, and every replica restarted with the peers it was *configured* with comes back
with the changed membership (the log's, from its members file).

How: four `RaftNode`s of raft_harness's kind; three start as the group, the fourth starts
`joining` with the three as peers (as the admin API starts it) and is added with
`addNodeToCluster` on the leader; it holds its elections until its own `add` arrives,
then receives every command. A follower is removed. Then every replica stops and
restarts with its first configuration (the removed one stays down): the members are the
changed ones, a leader is elected among them and every command is still there.
"""

from __future__ import annotations

import os
import threading
from functools import partial
from pathlib import Path

from logsvc.shard.raft.config import FailReason, RaftConfig
from logsvc.shard.raft.node import RaftNode
from logsvc.store import ShardStore

from .raft_harness import LIMITS, SECRET, WAIT_S_MAX, Cluster, RecordingHandler, Replica, wait_until


def start(
    replica: Replica,
    peers: tuple[str, ...],
    joining: bool = False,
    *,
    learner: bool = False,
    fresh_handler: bool = True,
) -> None:
    if fresh_handler:
        replica.handler = RecordingHandler()
    replica.store = ShardStore.open(
        os.path.join(replica.dir_path, "journal"), fs=replica.fs, limits=LIMITS
    )
    config = RaftConfig(
        self_address=replica.address,
        peers=peers,
        secret=SECRET,
        snapshot_path=os.path.join(replica.dir_path, "snapshot"),
        election_timeout_ms_min=400,
        election_timeout_ms_max=900,
        heartbeat_ms=50,
        leader_fallback_ms=2000,
        joining=joining,
        learner=learner,
    )
    replica.node = RaftNode(config, replica.store, replica.handler)
    replica.node.start()


def change(node: RaftNode, kind: str, address: str) -> None:
    """A membership change on the leader, waited for (retried while the new leader's
    no-op is not applied yet: pysyncobj refuses changes until then)."""
    for _ in range(50):
        done = threading.Event()
        outcome: list[int] = []

        def callback(
            _result: object,
            reason: int,
            outcome: list[int] = outcome,
            done: threading.Event = done,
        ) -> None:
            outcome.append(reason)
            done.set()

        (node.add_member if kind == "add" else node.remove_member)(address, callback)
        assert done.wait(WAIT_S_MAX)
        if outcome == [FailReason.SUCCESS]:
            return
        assert outcome == [FailReason.REQUEST_DENIED], outcome
        wait_until(lambda: node.last_applied >= node.commit_index, "the no-op applied")
    raise AssertionError(f"{kind} {address} was refused every time")


def has_all(replica: Replica, wanted: list[bytes]) -> bool:
    applied = replica.handler.commands()
    return all(command in applied for command in wanted)


def test_join_remove_and_restart_with_the_configured_peers(tmp_path: Path) -> None:
    cluster = Cluster(str(tmp_path), size=4)
    r0, r1, r2, r3 = cluster.replicas
    first = (r0, r1, r2)
    configured = {r.address: tuple(o.address for o in first if o is not r) for r in first}
    try:
        for replica in first:
            start(replica, configured[replica.address])
        wanted = [f"a-{i}".encode() for i in range(40)]
        assert len(cluster.propose(wanted)) == len(wanted)

        start(r3, tuple(r.address for r in first), joining=True)
        assert r3.node is not None and r3.node.joining
        leader = cluster.leader()
        assert leader is not r3
        assert leader.node is not None
        change(leader.node, "add", r3.address)
        assert sorted(leader.node.members) == sorted(r.address for r in cluster.replicas)
        more = [f"b-{i}".encode() for i in range(40)]
        assert len(cluster.propose(more)) == len(more)
        wanted += more
        wait_until(partial(has_all, r3, wanted), "the new replica to have every command")
        assert not r3.node.joining

        leader = cluster.leader()
        assert leader.node is not None
        removed = next(r for r in first if r is not leader)
        change(leader.node, "rem", removed.address)
        kept = [r for r in cluster.replicas if r is not removed]
        assert sorted(leader.node.members) == sorted(r.address for r in kept)
        cluster.stop(removed)
        more = [f"c-{i}".encode() for i in range(20)]
        assert len(cluster.propose(more)) == len(more)
        wanted += more
        for replica in kept:  # each has the removal in its log (it precedes these)
            wait_until(partial(has_all, replica, wanted), "every replica to apply everything")

        for replica in kept:
            cluster.stop(replica)
        for replica in kept:  # the peers each was first started with
            peers = configured.get(replica.address, tuple(r.address for r in first))
            start(replica, peers, joining=replica is r3)
        for replica in kept:
            assert replica.node is not None
            assert sorted(replica.node.members) == sorted(r.address for r in kept)
            assert not replica.node.joining
        last = [b"after-restart"]
        assert cluster.propose(last) == {b"after-restart": FailReason.SUCCESS}
        for replica in kept:
            wait_until(partial(has_all, replica, wanted + last), "every command after restart")
    finally:
        cluster.close()
