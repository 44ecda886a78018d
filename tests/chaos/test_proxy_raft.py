"""Real replicas whose Raft traffic all goes through the proxy mesh: the dial-override seam
(RaftConfig.dial_overrides) works, and a blackholed leader is replaced, then catches up.

How: three `ShardReplica`s in this process (real pysyncobj on loopback, real stores), each
configured with `dial_overrides` = its `ProxyMesh.dial_map`. The first test shows a leader
is elected and appends replicate while every link's counters prove the bytes went through
the proxies. The second isolates the leader (blackhole both ways), waits for a new leader
among the other two, appends there, heals, and polls (bounded) until every replica holds
the same journal. Timeouts are short (election 400-900 ms, connection 1 s) so a run takes
seconds; every replica and the mesh are stopped in `finally`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from logsvc.shard.commands import Appended
from logsvc.shard.raft.config import RaftConfig
from logsvc.shard.replica import NotLeader, OutcomeUnknown, ReplicaConfig, ShardReplica
from logsvc.store import Entry, StoreLimits
from tests.chaos.harness.proxy import ProxyMesh
from tests.support.stalls import StallWatch
from tests.unit.shard import raft_harness
from tests.unit.shard.raft_harness import SECRET, free_ports

pytestmark = pytest.mark.timeout(120)

WAIT_S_MAX = 30.0
SHARD = 0
T = TypeVar("T")


def wait_until(condition: Callable[[], bool], what: str, seconds: float = WAIT_S_MAX) -> None:
    raft_harness.wait_until(condition, what, seconds)  # this file's own default bound


class MeshedShard:
    """A 3-replica shard in this process; nodes n0..n2 talk only through `mesh`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.addresses = {f"n{i}": f"127.0.0.1:{port}" for i, port in enumerate(free_ports(3))}
        self.mesh = ProxyMesh({node: {SHARD: a} for node, a in self.addresses.items()}, seed=7)
        self.replicas: dict[str, ShardReplica] = {}

    def config(self, node: str) -> ReplicaConfig:
        address = self.addresses[node]
        data_dir = str(self.base / node)
        raft = RaftConfig(
            self_address=address,
            peers=tuple(a for n, a in sorted(self.addresses.items()) if n != node),
            secret=SECRET,
            snapshot_path=os.path.join(data_dir, "snapshot"),
            election_timeout_ms_min=400,
            election_timeout_ms_max=900,
            heartbeat_ms=50,
            leader_fallback_ms=2000,
            connection_timeout_ms=1000,
            dial_overrides=tuple(sorted(self.mesh.dial_map(node).items())),
        )
        return ReplicaConfig(data_dir=data_dir, raft=raft, store_limits=StoreLimits())

    def start_all(self) -> None:
        self.mesh.start()
        for node in sorted(self.addresses):
            replica = ShardReplica(self.config(node))
            replica.start()
            self.replicas[node] = replica

    def close(self) -> None:
        try:
            for node in list(self.replicas):
                self.replicas.pop(node).close()
        finally:
            self.mesh.close()

    def leader(self, among: set[str] | None = None) -> str:
        found: list[str] = []
        nodes = among if among is not None else set(self.replicas)

        def one() -> bool:
            found[:] = [n for n in sorted(nodes) if self.replicas[n].is_leader]
            return len(found) == 1

        wait_until(one, f"one leader among {sorted(nodes)}")
        return found[0]

    def call(self, operation: Callable[[ShardReplica], T], among: set[str] | None = None) -> T:
        deadline = time.monotonic() + WAIT_S_MAX
        while True:
            try:
                return operation(self.replicas[self.leader(among)])
            except (NotLeader, OutcomeUnknown):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def append(self, seq: int, records: tuple[bytes, ...], among: set[str] | None = None) -> int:
        result = self.call(lambda r: r.append("w", seq, records, timeout_s=5.0), among)
        assert isinstance(result, Appended), result
        return result.first_lsn

    def journal(self, node: str) -> list[Entry]:
        store = self.replicas[node].store
        return store.read(store.first_index, store.last_index + 1, 1 << 30)

    def converged(self) -> bool:
        """Every replica applied the same entries, and holds the same journal."""
        journals = [self.journal(n) for n in sorted(self.replicas)]
        applied = {r.status()["last_applied_raft_index"] for r in self.replicas.values()}
        return len(applied) == 1 and all(j == journals[0] for j in journals)


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[MeshedShard]:
    cluster = MeshedShard(tmp_path)
    try:
        yield cluster
    finally:
        cluster.close()


def batch(prefix: str, count: int) -> tuple[bytes, ...]:
    return tuple(f"{prefix}-{i}".encode() for i in range(count))


def test_a_shard_dialling_through_the_mesh_elects_and_replicates(shard: MeshedShard) -> None:
    shard.start_all()
    assert shard.append(1, batch("a", 20)) == 1
    shard.call(lambda r: r.barrier())
    wait_until(shard.converged, "every replica to apply the batch")
    for replica in shard.replicas.values():
        assert replica.read(1, 1 << 20).records == batch("a", 20)
    # Every pair talks, through its proxy (the override reached pysyncobj). A pair whose
    # first dial came before its peer listened retries after pysyncobj's
    # connectionRetryTime (5 s): a majority was enough for the appends meanwhile.

    def every_pair_talks() -> bool:
        return all(
            stats.a_to_b.bytes_forwarded > 0 and stats.b_to_a.bytes_forwarded > 0
            for stats in shard.mesh.all_stats().values()
        )

    wait_until(every_pair_talks, "every pair to talk through its proxy", seconds=15)


def test_an_isolated_leader_is_replaced_and_catches_up_after_heal(shard: MeshedShard) -> None:
    shard.start_all()
    shard.append(1, batch("a", 10))
    old = shard.leader()
    old_term = shard.replicas[old].status()["term"]
    others = set(shard.replicas) - {old}
    before = {peer: shard.mesh.stats(old, peer) for peer in others}

    partition = shard.mesh.partition("leader", leader=old)
    assert partition.groups[0] == (old,)
    new = shard.leader(among=others)
    assert shard.replicas[new].status()["term"] > old_term
    assert shard.append(2, batch("b", 10), among=others) == 11  # the majority goes on
    # Confirm the fault took effect: the old leader's bytes are held. (Per peer it may
    # have sent nothing: a connection still in its handshake is not "connected" yet.)
    held = [shard.mesh.stats(old, peer).since(before[peer]).a_to_b for peer in sorted(others)]
    assert sum(d.bytes_queued + d.bytes_dropped for d in held) > 0, held
    assert shard.replicas[old].read(1, 1 << 20).records == batch("a", 10)

    shard.mesh.heal()
    shard.append(3, batch("c", 5))
    wait_until(shard.converged, "the old leader to catch up")
    for replica in shard.replicas.values():
        records = replica.read(1, 1 << 20).records
        assert records == (*batch("a", 10), *batch("b", 10), *batch("c", 5))


class _SlowerShard(MeshedShard):
    """A node's own timing (election 1-2.5 s, heartbeats 100 ms, connection 2.5 s): a
    loaded machine must not make a live leader look dead to the follower that still
    hears it (that would be a lapse, and then standing is right)."""

    def config(self, node: str) -> ReplicaConfig:
        config = super().config(node)
        raft = dataclasses.replace(
            config.raft,
            election_timeout_ms_min=1000,
            election_timeout_ms_max=2500,
            heartbeat_ms=100,
            leader_fallback_ms=5000,
            connection_timeout_ms=2500,
        )
        return dataclasses.replace(config, raft=raft)


# The three replicas share this process: a stall of it silences the leader to both
# followers at once, for the stall plus up to a heartbeat interval (0.1 s) and a tick's
# lateness; once that reaches the shortest election timeout (1 s), standing is right.
# (With 0.96-1.02 s collections a run's terms moved though the watch saw under 1 s.)
STALL_S_MAX = 0.8
CUT_RUNS_MAX = 3


@pytest.mark.timeout(300)
def test_a_follower_cut_off_from_its_leader_alone_does_not_disrupt_the_shard(
    tmp_path: Path,
) -> None:
    """Pre-vote (logsvc/shard/prevote.py): only the link between the leader and one
    follower fails. That follower's election timer runs out again and again, but the
    other follower still hears the leader and refuses it a pre-vote, so it never stands:
    no term changes, the leader stays, and after the heal it catches up in that term. Stock
    Raft (and this build before pre-vote) let it stand with a higher term that deposed
    the leader.

    The replicas share this process, so a stall of the whole process (a collection of the
    CI's large heap: 1-7 s with tests/support/gcpause.py, where this test once failed with
    every term at 3) is a lapse of the leader for both followers; a run in which the process
    stalled for `STALL_S_MAX` and whose terms moved is run again, on fresh replicas, up to
    `CUT_RUNS_MAX` runs. A run without such a stall must keep its term exactly."""
    for run in range(1, CUT_RUNS_MAX + 1):
        with StallWatch() as watch:
            try:
                _cut_one_follower(tmp_path / f"run{run}")
                return
            except AssertionError as failed:
                if watch.longest_s < STALL_S_MAX:
                    failed.add_note(f"run {run}: the longest stall {watch.longest_s:.2f} s")
                    raise
        print(f"run {run}: the process stalled {watch.longest_s:.1f} s; run again")
    pytest.fail(f"each of {CUT_RUNS_MAX} runs stalled the process for {STALL_S_MAX} s or more")


def _cut_one_follower(base: Path) -> None:
    shard = _SlowerShard(base)
    try:
        shard.start_all()
        shard.append(1, batch("a", 5))
        wait_until(shard.converged, "every replica holding the first append")
        old = shard.leader()
        term = shard.replicas[old].status()["term"]
        wait_until(
            lambda: all(r.status()["term"] == term for r in shard.replicas.values()),
            "every replica in the leader's term",
        )
        cut = sorted(set(shard.replicas) - {old})[0]
        shard.mesh.set_link(old, cut, "blackhole")
        # Past the connection timeout (2.5 s) and a few election timeouts (1-2.5 s).
        until = time.monotonic() + 8.0
        wait_until(lambda: time.monotonic() > until, "eight seconds of the cut link")
        terms = {n: r.status()["term"] for n, r in shard.replicas.items()}
        assert terms == dict.fromkeys(shard.replicas, term)
        assert shard.leader() == old

        shard.mesh.heal()
        shard.append(2, batch("b", 5))
        wait_until(shard.converged, "the cut follower to catch up")
        terms = {n: r.status()["term"] for n, r in shard.replicas.items()}
        assert terms == dict.fromkeys(shard.replicas, term)
    finally:
        shard.close()
