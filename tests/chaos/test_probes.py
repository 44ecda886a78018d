"""The harness's status probes (`Cluster.statuses`, behind `leader` and `wait_leader`) ask
every replica at once, so a replica that does not answer does not hide the others; and a
partition of the leader waits (bounded) for one instead of giving up after one round.

Chaos C4's one-way partition cuts the leader's outgoing traffic: it still says it leads,
and its status waits on a barrier that cannot commit until the probe gives up (1-3 s).
Probed one after another, that replica, listed first, took most of each polling round:
in the 4.5 s `confirm_leader_change` allows, the new leader was asked once or twice,
and the rounds overran the deadline (a fresh-clone rehearsal and a loaded run here
reported "no new leader"; the loaded run's partition lasted 9.5 s instead of 4.5 s).

How: a `Cluster` whose nodes are never started, its status probes answered by fake clients
(no sockets, no processes). The stale leader answers only once the other two replicas
were asked: probed one after another it times out first, and the order of the recorded
events shows it (a condition on order, not on time).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from logsvc.wire.messages import ShardStatus
from tests.chaos.harness import cluster as cluster_module
from tests.chaos.harness.cluster import Cluster, ClusterSpec, NodeProc
from tests.chaos.harness.nemesis import Nemesis, NemesisLog
from tests.chaos.harness.proxy import Partition, partition_of


def _status(term: int, is_leader: bool) -> ShardStatus:
    return ShardStatus(
        shard=1,
        leader=None,
        term=term,
        first_lsn=1,
        next_lsn=1,
        commit_index=0,
        is_leader=is_leader,
    )


class _Replicas:
    """Fake clients by data address: the stale leader answers once both others were asked."""

    def __init__(self, stale: str, others: dict[str, ShardStatus]) -> None:
        self.stale = stale
        self.others = others
        self.events: list[str] = []
        self._asked: asyncio.Event | None = None

    def asked(self) -> asyncio.Event:
        if self._asked is None:  # created on the prober's loop, where it is awaited
            self._asked = asyncio.Event()
        return self._asked

    async def connect(self, addresses: list[str], token: str, options: object) -> _FakeClient:
        [address] = addresses
        return _FakeClient(self, address)


class _FakeClient:
    def __init__(self, replicas: _Replicas, address: str) -> None:
        self._replicas = replicas
        self._address = address

    async def status(self, shard: int) -> ShardStatus:
        replicas = self._replicas
        if self._address == replicas.stale:
            try:
                await replicas.asked().wait()
            finally:
                replicas.events.append("stale leader answered or gave up")
            return _status(3, True)  # still claims its old term, as a cut-off leader does
        replicas.events.append(f"{self._address} asked")
        if sum(e.endswith(" asked") for e in replicas.events) == len(replicas.others):
            replicas.asked().set()
        return replicas.others[self._address]

    async def close(self) -> None:
        return None


def test_a_stale_leader_that_does_not_answer_does_not_delay_the_other_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = Cluster(str(tmp_path), ClusterSpec())
    try:
        monkeypatch.setattr(NodeProc, "running", lambda self: True)
        n1, n2, n3 = (cluster.nodes[n].data_address for n in ("n1", "n2", "n3"))
        replicas = _Replicas(n1, {n2: _status(4, True), n3: _status(4, False)})
        monkeypatch.setattr(cluster_module, "connect", replicas.connect)
        assert cluster.replicas_of[1][0] == "n1"  # the stale leader is asked first

        found = cluster.wait_leader(1, 4.5, term_above=3)

        assert found == ("n2", 4)
        assert replicas.events.index(f"{n2} asked") < replicas.events.index(
            "stale leader answered or gave up"
        ), replicas.events
    finally:
        cluster.close()


class _Mesh:
    """The proxy mesh's surface that `Nemesis.partition` uses, recording the partitions."""

    def __init__(self) -> None:
        self.partitions: list[tuple[str, str | None]] = []

    def all_stats(self) -> dict[object, object]:
        return {}

    def heal(self) -> None:
        return None

    def partition(
        self, spec: str, nodes: list[str], leader: str | None, *, shard: int, mode: str
    ) -> Partition:
        self.partitions.append((spec, leader))
        return partition_of(spec, nodes, leader)  # type: ignore[arg-type]


def test_a_leader_partition_waits_for_a_leader_when_one_round_of_probes_finds_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round of probes can find no confirmed leader (an election, or a barrier slower
    than the probe on a loaded box); the leader partition was then not applied at all
    (C4 "leader: no leader of 1", a planned fault not applied). It now polls, bounded,
    as killing the leader does."""
    cluster = Cluster(str(tmp_path), ClusterSpec())
    try:
        rounds: list[int] = []

        def leader(shard: int) -> tuple[str, int] | None:
            rounds.append(shard)
            return None if len(rounds) == 1 else ("n1", 3)

        monkeypatch.setattr(cluster, "leader", leader)
        mesh = _Mesh()
        nemesis = Nemesis(
            cluster, NemesisLog(str(tmp_path / "nemesis.jsonl")), random.Random(1), mesh=mesh
        )

        chosen = nemesis.partition("leader", 1)

        assert chosen is not None
        assert mesh.partitions == [("leader", "n1")]
        assert len(rounds) == 2
    finally:
        cluster.close()
