"""Real pysyncobj replicas on loopback keep every acknowledged command through failover,
kill -9 of all replicas, and power loss of every replica at once.

Three replicas run `RaftNode` over shard stores whose group-commit delay is an hour, so a
store syncs only when the Raft layer asks: a missing sync shows up as lost data. Power loss
uses `FaultFS` (unsynced bytes and names vanish). Commands are unique byte strings; a replica
"has" a command when it applied it. The last test removes the sync before replies and shows
the same scenario then loses acknowledged commands: the check has teeth.
"""

from __future__ import annotations

import os
import random
from functools import partial
from pathlib import Path

import pytest
from pysyncobj.transport import TCPTransport

from logsvc.shard.raft import node as raft_node
from logsvc.shard.raft import transport as raft_transport
from tests.support.faultfs import FaultFS

from .raft_harness import Cluster, Replica, wait_until


def commands(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


def converge(cluster: Cluster, marker: bytes) -> None:
    """Commit a marker through the current leader and wait until every replica applied it
    (so everything before it is applied everywhere)."""
    assert cluster.propose([marker]), "the marker was not acknowledged"
    for replica in cluster.replicas:
        wait_until(partial(has_applied, replica, marker), f"{replica.address} to catch up")


def has_applied(replica: Replica, command: bytes) -> bool:
    return command in replica.handler.commands()


def test_replicas_apply_the_same_commands_in_the_same_order(tmp_path: Path) -> None:
    cluster = Cluster(str(tmp_path))
    try:
        cluster.start_all()
        acked = cluster.propose(commands("a", 150))
        assert len(acked) == 150
        converge(cluster, b"marker")
        orders = [r.handler.commands() for r in cluster.replicas]
        assert orders[0] == orders[1] == orders[2]
        assert orders[0][:150] == commands("a", 150)
        journals = []
        for replica in cluster.replicas:
            assert replica.store is not None
            store = replica.store
            journals.append(store.read(store.first_index, store.last_index + 1, 1 << 30))
        assert journals[0] == journals[1] == journals[2]  # byte-identical journals
    finally:
        cluster.close()


def test_failover_keeps_every_acknowledged_command(tmp_path: Path) -> None:
    cluster = Cluster(str(tmp_path))
    try:
        cluster.start_all()
        first = cluster.propose(commands("before", 50))
        old_leader = cluster.leader()
        cluster.stop(old_leader)
        second = cluster.propose(commands("after", 50))
        assert cluster.leader() is not old_leader
        cluster.start(old_leader)
        converge(cluster, b"marker")
        for replica in cluster.replicas:
            applied = replica.handler.commands()
            assert len(applied) == len(set(applied))  # no command applied twice
            for command in [*first, *second]:
                assert command in applied, f"{replica.address} lost {command!r}"
    finally:
        cluster.close()


def crash_every_replica(cluster: Cluster, mode: str) -> list[tuple[int, str | None]]:
    """Cut the power (or kill -9) of every replica at once; return their (term, vote)."""
    votes = []
    for replica in cluster.replicas:
        assert replica.store is not None
        votes.append((replica.store.term, replica.store.voted_for))
    for replica in cluster.replicas:  # within milliseconds of each other
        cluster.kill(replica)
    for replica in cluster.replicas:
        assert isinstance(replica.fs, FaultFS)
        if mode == "process":
            replica.fs.crash()
        else:
            replica.fs.power_loss("trunc", random.Random(1))
    return votes


@pytest.mark.parametrize("mode", ["power", "process"])
def test_every_acknowledged_command_survives_a_crash_of_every_replica(
    tmp_path: Path, mode: str
) -> None:
    cluster = Cluster(str(tmp_path), fault_fs=True)
    try:
        cluster.start_all()
        acked = cluster.propose(commands("acked", 120))
        assert len(acked) == 120
        votes = crash_every_replica(cluster, mode)
        cluster.start_all()  # all restarted at once: a whole-cluster restart
        for replica, (term, vote) in zip(cluster.replicas, votes, strict=True):
            assert replica.store is not None
            assert replica.store.term >= term  # terms never go backwards across restarts
            if replica.store.term == term:
                assert replica.store.voted_for == vote
        more = cluster.propose(commands("later", 30))  # appends continue
        converge(cluster, b"marker")
        for replica in cluster.replicas:
            applied = replica.handler.commands()
            for command in [*acked, *more]:
                assert command in applied, f"{replica.address} lost {command!r}"
    finally:
        cluster.close()


def test_without_the_sync_before_replies_acknowledged_commands_are_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock pysyncobj acknowledges before anything is on disk; emulate that by holding
    replies but never syncing (neither in the tick nor on the worker's syncer). The same
    power loss then loses acknowledged commands."""

    def flush_without_sync(self: raft_transport._DurableTransport) -> None:
        outbox, self._outbox = self._outbox, []
        for node, message in outbox:
            TCPTransport.send(self, node, message)

    def background_sync_without_sync(self: raft_node.RaftNode) -> None:
        self._sync_in_flight = False  # a leader's own appends: never synced either

    monkeypatch.setattr(raft_transport._DurableTransport, "flush", flush_without_sync)
    monkeypatch.setattr(raft_node.RaftNode, "_sync_in_background", background_sync_without_sync)
    cluster = Cluster(str(tmp_path), fault_fs=True)
    try:
        cluster.start_all()
        acked = cluster.propose(commands("acked", 40))
        assert len(acked) == 40
        crash_every_replica(cluster, "power")
        cluster.start_all()
        converge(cluster, b"marker")
        survivors = cluster.replicas[0].handler.commands()
        assert any(command not in survivors for command in acked)
    finally:
        cluster.close()


def test_large_random_entries_replicate(tmp_path: Path) -> None:
    """Entries far over pysyncobj's 64 KiB message size go through its chunked path, whose
    sender mislabels chunks (raft/message_fixes.py keeps collecting); random bytes defeat
    any luck."""
    cluster = Cluster(str(tmp_path))
    try:
        cluster.start_all()
        big = [os.urandom(size) for size in (70_000, 200_000, 131_072 - 30, 65_536)]
        assert len(cluster.propose(big)) == len(big)
        converge(cluster, b"marker")
        for replica in cluster.replicas:
            applied = replica.handler.commands()
            assert all(command in applied for command in big), replica.address
    finally:
        cluster.close()
