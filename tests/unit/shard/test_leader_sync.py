"""A leader's own sync runs beside its tick (the worker's syncer thread), so its entry commits
as soon as a durable majority holds it, and never before.

Three real replicas on loopback (raft_harness), each store on a file system whose fdatasync
can be held at a gate. Proves: with the leader's fdatasync held, a proposal is acknowledged
once both followers hold it durably, while the leader's own copy is still not durable (on
the old code the leader's worker sat in that fdatasync and acknowledged nothing until it
returned); with the leader's and one follower's fdatasync held, the other follower's
durable acknowledgement, received and counted by the leader, does not commit the entry (one
durable copy of three); releasing the second follower commits it with the leader's copy
still held. The syncer wakes the leader only when a follower's ack is already ahead of the
commit index: with both followers' syncs held, the leader's own finished sync is no reason
to tick; with one follower's ack in, it is, and releasing the leader's sync commits the
entry on the leader's and that follower's copies. Every wait is on a condition (the gate's
waiter, the leader's match index and tick count, the callback's event), bounded.
"""

from __future__ import annotations

import threading
from pathlib import Path

from logsvc.shard.raft.config import FailReason
from logsvc.store.fs import OsFileSystem, WritableFile

from .raft_harness import WAIT_S_MAX, Cluster, Replica, wait_until


class _GatedFile:
    def __init__(self, real: WritableFile, fs: GatedFileSystem) -> None:
        self._real = real
        self._fs = fs

    def write(self, data: bytes) -> None:
        self._real.write(data)

    def truncate(self, size_bytes: int) -> None:
        self._real.truncate(size_bytes)

    def write_zeros(self, upto_bytes: int) -> None:
        self._real.write_zeros(upto_bytes)

    def allocated_bytes(self) -> int:
        return self._real.allocated_bytes()

    def fdatasync(self) -> None:
        self._fs.pass_gate()
        self._real.fdatasync()

    def size(self) -> int:
        return self._real.size()

    def close(self) -> None:
        self._real.close()


class GatedFileSystem(OsFileSystem):
    """The real file system, whose fdatasync calls wait while the gate is shut."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.held = threading.Event()  # an fdatasync is waiting at the shut gate

    def shut(self) -> None:
        self.held.clear()
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def pass_gate(self) -> None:
        if not self._open.is_set():
            self.held.set()
            assert self._open.wait(WAIT_S_MAX), "the gate stayed shut"

    def open_write(self, path: str, *, create: bool) -> WritableFile:
        return _GatedFile(super().open_write(path, create=create), self)


class Proposal:
    def __init__(self, replica: Replica, command: bytes) -> None:
        self.done = threading.Event()
        self.reason: int | None = None
        assert replica.node is not None
        replica.node.propose(command, self._callback)

    def _callback(self, _result: object, reason: int) -> None:
        self.reason = reason
        self.done.set()


def gated_cluster(tmp_path: Path) -> Cluster:
    cluster = Cluster(str(tmp_path))
    for replica in cluster.replicas:
        replica.fs = GatedFileSystem()
    cluster.start_all()
    assert cluster.propose([b"first"]), "the first command was not acknowledged"
    return cluster


def gate(replica: Replica) -> GatedFileSystem:
    assert isinstance(replica.fs, GatedFileSystem)
    return replica.fs


def propose_held(leader: Replica, held: list[Replica], command: bytes) -> tuple[Proposal, int]:
    """Shut the gates of `held`, propose `command` on `leader`, and return once each of them
    waits in its fdatasync: the proposal and the index its entry takes."""
    assert leader.store is not None
    for replica in held:
        gate(replica).shut()
    index = leader.store.last_index + 1
    proposal = Proposal(leader, command)
    assert all(gate(replica).held.wait(WAIT_S_MAX) for replica in held)
    return proposal, index


def wait_for_ack(leader: Replica, follower: Replica, index: int) -> None:
    assert leader.node is not None
    raft = leader.node._raft
    wait_until(
        lambda: raft.logsvc_match_index().get(follower.address, 0) >= index,
        "the leader to receive the unheld follower's durable ack",
    )


def test_a_leader_commits_on_its_followers_acks_while_its_own_sync_runs(tmp_path: Path) -> None:
    cluster = gated_cluster(tmp_path)
    leader = cluster.leader()
    assert leader.store is not None
    try:
        gate(leader).shut()
        proposal = Proposal(leader, b"second")
        assert gate(leader).held.wait(WAIT_S_MAX), "the leader never synced its entry"
        assert proposal.done.wait(WAIT_S_MAX), "not acknowledged while the leader's sync ran"
        assert proposal.reason == FailReason.SUCCESS
        # Acknowledged with the leader's own copy not durable: a majority of durable copies
        # (the two followers') is what committed it.
        assert leader.store.durable_index < leader.store.last_index
        assert gate(leader).held.is_set()
    finally:
        for replica in cluster.replicas:
            gate(replica).open()
        cluster.close()


def test_one_durable_copy_of_three_commits_nothing(tmp_path: Path) -> None:
    cluster = gated_cluster(tmp_path)
    leader = cluster.leader()
    held, fast = [r for r in cluster.replicas if r is not leader]
    assert leader.node is not None and leader.store is not None
    try:
        proposal, index = propose_held(leader, [leader, held], b"second")
        wait_for_ack(leader, fast, index)
        ticks = leader.node.ticks
        wait_until(lambda: leader.node is not None and leader.node.ticks >= ticks + 2, "ticks")
        assert not proposal.done.is_set(), "committed on one durable copy of three"
        assert leader.node.commit_index < index
        gate(held).open()  # now both followers hold it durably; the leader's sync still waits
        assert proposal.done.wait(WAIT_S_MAX), "not acknowledged on two durable followers"
        assert proposal.reason == FailReason.SUCCESS
        assert leader.store.durable_index < index
    finally:
        for replica in cluster.replicas:
            gate(replica).open()
        cluster.close()


def test_the_leaders_own_sync_wakes_it_only_when_an_ack_is_ahead(tmp_path: Path) -> None:
    cluster = gated_cluster(tmp_path)
    leader = cluster.leader()
    held, fast = [r for r in cluster.replicas if r is not leader]
    assert leader.node is not None and leader.store is not None
    raft = leader.node._raft
    try:
        # Both followers' syncs held: the leader's own sync finishes first, as a lone
        # append's usually does. No follower has acknowledged the entry: nothing for a tick.
        first, index = propose_held(leader, [held, fast], b"second")
        wait_until(
            lambda: leader.store is not None and leader.store.durable_index >= index,
            "the leader's own sync",
        )
        assert not first.done.is_set() and leader.node.commit_index < index
        assert not raft.logsvc_commit_may_wait_on_own_sync()
        gate(held).open()
        gate(fast).open()
        assert first.done.wait(WAIT_S_MAX) and first.reason == FailReason.SUCCESS
        # Now the leader's sync held and one follower's: the other's ack is ahead of the
        # commit index, so the leader's sync finishing is what can commit the entry.
        second, index = propose_held(leader, [leader, held], b"third")
        wait_for_ack(leader, fast, index)
        assert raft.logsvc_commit_may_wait_on_own_sync()
        assert not second.done.is_set()
        gate(leader).open()  # the held follower's sync still waits
        assert second.done.wait(WAIT_S_MAX), "not acknowledged on the leader's and one copy"
        assert second.reason == FailReason.SUCCESS
        assert gate(held).held.is_set()
    finally:
        for replica in cluster.replicas:
            gate(replica).open()
        cluster.close()
