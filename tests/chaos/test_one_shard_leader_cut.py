"""A leader cut off on ONE shard while its node stays live through another shard is
replaced within an election timeout, not after its followers' connection to it drops
(chaos scenario C10, session 10: "shard 1: n3@1 -> no new leader" in a 4.5 s partition).

Why: node liveness (logsvc/shard/liveness.py) is one table per node, fed by every message
of every shard. The followers of the cut-off shard still heard the leader's node through
the other shard, so each counted that leader live and refused the other's pre-vote
(prevote.py `grants`: a live leader is in the way) for as long as their connection to it
stayed up: failover took the connection timeout plus the survivors' standing order. An
active follower expects AppendEntries every heartbeat; node liveness stands in only for
a quiet follower, whose leader sends nothing by design.

How: three nodes as a node process runs them (tests/unit/shard/raft_harness.py
`shard_grid`: one scheduler and one NodeLiveness per node, shared by its replicas), two
shards, every Raft byte through the proxy mesh (tests/chaos/harness/proxy.py). One node
leads both shards (shard 0 keeps it heard by both other nodes, with its heartbeats); the
mesh blackholes that node on shard 1 only, both ways, keeping the sockets open. The
connection timeout is long (30 s): on the old code no follower of shard 1 wins a pre-vote
before it, and the bounded wait for a new leader runs out. On the new code a survivor
stands once its election timer (at most election_timeout_ms_max) runs out. Shard 0 keeps
its leader and term throughout. Then the mesh heals and the old leader follows the new
term. No timed assertion: the wait is a generous bound (a few election timeouts), far
below the connection timeout that the old code needs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from logsvc.shard.raft.config import FailReason
from logsvc.shard.raft.node import RaftNode
from tests.chaos.harness.proxy import ProxyMesh
from tests.unit.shard.raft_harness import grid_addresses, propose_one, shard_grid, wait_until

pytestmark = pytest.mark.timeout(180)

NODES = ["n1", "n2", "n3"]
CUT_SHARD, LIVE_SHARD = 1, 0
# Far longer than any wait below: a failover that waits for the followers' connection to
# the cut-off leader to drop cannot happen inside this test.
CONNECTION_TIMEOUT_S = 30.0
CONFIG: dict[str, Any] = dict(
    election_timeout_ms_min=400,
    election_timeout_ms_max=900,
    heartbeat_ms=50,
    leader_fallback_ms=2000,
    connection_timeout_ms=int(CONNECTION_TIMEOUT_S * 1000),
    # Liveness is fed only with quiescence on; no shard goes quiet during the test (a quiet
    # follower's leader is node liveness by design: this test is about active followers).
    quiesce_after_ms=600_000,
)
# A new leader is due one election timeout (at most 0.9 s) and a pre-vote's round trip
# after the cut; generous for a loaded machine, and still a third of the connection
# timeout that the old code waited for.
FAILOVER_WAIT_S = 10.0
assert FAILOVER_WAIT_S <= CONNECTION_TIMEOUT_S / 3
SETUP_WAIT_S = 30.0


def _leaders(replicas: dict[tuple[str, int], RaftNode], shard: int) -> list[tuple[str, int]]:
    """(node, term) of every replica of `shard` that believes it leads."""
    return [(n, r.term) for (n, s), r in replicas.items() if s == shard and r.is_leader]


def test_a_leader_cut_off_on_one_shard_while_its_node_is_live_is_replaced_promptly(
    tmp_path: Path,
) -> None:
    address = grid_addresses(NODES, 2)
    mesh = ProxyMesh({n: {s: address[(n, s)] for s in (0, 1)} for n in NODES}, seed=10)
    mesh.start()
    try:
        dials = {n: mesh.dial_map(n) for n in NODES}
        with shard_grid(
            tmp_path, NODES, 2, address=address, dial_overrides=dials, **CONFIG
        ) as grid:
            replicas = grid.replicas

            def one_leader_each() -> bool:
                return all(len(_leaders(replicas, s)) == 1 for s in (0, 1))

            wait_until(one_leader_each, "one leader in each shard", SETUP_WAIT_S)
            # Every connection up (a first dial before its peer listened is retried a
            # connection_retry_ms later): a follower not connected to its leader counts
            # it lost, on any code.
            wait_until(
                lambda: all(
                    r.connected_to(m) for (n, _), r in replicas.items() for m in NODES if m != n
                ),
                "every replica connected to its peers",
                SETUP_WAIT_S,
            )
            # One node leads both shards: shard 0 then keeps that node heard by both others
            # (its AppendEntries), as shard 2 did in C10.
            old = _leaders(replicas, CUT_SHARD)[0][0]
            if _leaders(replicas, LIVE_SHARD)[0][0] != old:
                live_leader = replicas[(_leaders(replicas, LIVE_SHARD)[0][0], LIVE_SHARD)]
                live_leader.transfer_leadership(address[(old, LIVE_SHARD)], lambda *_: None)
            wait_until(
                lambda: (
                    [n for n, _ in _leaders(replicas, LIVE_SHARD)] == [old]
                    and [n for n, _ in _leaders(replicas, CUT_SHARD)] == [old]
                ),
                f"{old} leading both shards",
                SETUP_WAIT_S,
            )
            for shard in (0, 1):
                assert (
                    propose_one(replicas[(old, shard)], b"first", SETUP_WAIT_S)
                    == FailReason.SUCCESS
                )
            term = replicas[(old, CUT_SHARD)].term
            live_before = _leaders(replicas, LIVE_SHARD)
            others = [n for n in NODES if n != old]

            mesh.partition("leader", leader=old, shard=CUT_SHARD)
            cut_at = time.monotonic()

            def replaced() -> bool:
                return any(n != old and t > term for n, t in _leaders(replicas, CUT_SHARD))

            wait_until(replaced, "a new leader of the cut-off shard", FAILOVER_WAIT_S)
            took_s = time.monotonic() - cut_at
            # It came from the followers' own timers: their connections to the old leader
            # are still up (blackholed, not dropped), and its node was never lapsed for
            # long enough to matter (shard 0 kept it heard: same leader, same term).
            assert _leaders(replicas, LIVE_SHARD) == live_before
            for n in others:
                assert replicas[(n, CUT_SHARD)].connected_to(old), (n, took_s)
            print(f"a new leader of shard {CUT_SHARD} {took_s:.2f} s after the cut")

            mesh.heal()
            new_term = max(t for _, t in _leaders(replicas, CUT_SHARD))
            wait_until(
                lambda: (
                    replicas[(old, CUT_SHARD)].term >= new_term
                    and not replicas[(old, CUT_SHARD)].is_leader
                ),
                "the old leader to follow the new term",
                SETUP_WAIT_S,
            )
    finally:
        mesh.close()
