"""Quiescence with real node processes (docs/decisions/0005-scheduler-quiescence.md).

Proves, on a 3-node dev cluster (election timeout 1-2.5 s, heartbeat 100 ms): after a burst
of acknowledged appends the shard goes quiet on every replica (each node's admin API says
so); its leader, SIGKILLed while quiet, is replaced by another node's replica in a later
term within the election timeout (plus a margin for a loaded 2-core machine); the same when
the leader's process is only paused (SIGSTOP: no connection closes, so only the per-node
liveness can tell); and no acknowledged append is missing afterwards, read through the new
leader. How: the client library, each node's admin API, `devcluster.leaders_confirmed`
(a leader counts only once it answered Status after a barrier), signals by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable

from logsvc import devcluster

from .conftest import LocalCluster

ELECTION_TIMEOUT_S_MAX = devcluster.DEV_RAFT_MS["election_timeout_ms_max"] / 1000.0
# What a loaded 2-core CI machine may add to an election: scheduling delays, the vote's and
# the new leader's fsyncs, and the probes' own rounds.
MARGIN_S = 2.0
QUIET_WAIT_S_MAX = 15.0
APPENDS = 40


def admin_shard(address: str, token: str, shard: int) -> dict[str, object]:
    request = urllib.request.Request(f"http://{address}/v1/shards/{shard}")
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


def wait_quiet(cluster: LocalCluster, shard: int) -> None:
    config = cluster.client_config
    deadline = time.monotonic() + QUIET_WAIT_S_MAX
    while True:
        views = [admin_shard(a, config.token, shard) for a in config.admin_addresses]
        if all(view["quiet"] for view in views):
            return
        assert time.monotonic() < deadline, f"shard {shard} not quiet everywhere: {views}"
        time.sleep(0.2)


def fail_over(cluster: LocalCluster, act: Callable[[str], None]) -> None:
    """Append, wait for quiet, `act` on the leader's node, and check the failover."""
    config = cluster.client_config
    client = cluster.client()
    try:
        acked = {}
        for i in range(APPENDS):
            payload = f"before {i}".encode()
            [lsn] = client.append(1, [payload])
            acked[lsn] = payload
        old = client.leader_status(1)  # a barrier: asked before the shard goes quiet
        assert old.leader is not None
        victim = cluster.node_of(old.leader)
        wait_quiet(cluster, 1)
        acted_at = time.monotonic()
        act(victim)
        found, missing = asyncio.run(
            devcluster.leaders_confirmed(
                config.addresses,
                config.token,
                [1],
                30.0,
                not_at=old.leader,
                term_above={1: old.term},
            )
        )
        assert not missing, "no other node took over the quiet shard"
        failover_s = found[1].at_s - acted_at
        print(f"quiet shard failed over in {failover_s:.2f} s ({victim} was its leader)")
        assert failover_s < ELECTION_TIMEOUT_S_MAX + MARGIN_S
        page = client.tail(1, min(acked), 1 << 20, 0)  # through the new leader
        served = {page.first_lsn + i: record for i, record in enumerate(page.records)}
        assert all(served.get(lsn) == payload for lsn, payload in acked.items())
        [after] = client.append(1, [b"after the failover"])
        assert after > max(acked)
    finally:
        client.close()


def test_a_quiet_shards_leader_sigkilled_fails_over_and_loses_nothing(
    own_cluster: LocalCluster,
) -> None:
    def kill(node: str) -> None:
        devcluster.kill_node(own_cluster.dir, node)

    fail_over(own_cluster, kill)


def test_a_quiet_shards_paused_leader_is_replaced_through_node_liveness(
    own_cluster: LocalCluster,
) -> None:
    paused: list[int] = []

    def pause(node: str) -> None:
        pid = devcluster.read_pids(own_cluster.dir)[node]
        os.killpg(pid, signal.SIGSTOP)  # its sockets stay open: only silence tells
        paused.append(pid)

    try:
        fail_over(own_cluster, pause)
    finally:
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)
