"""A thousand shards per node: 3 real node processes on loopback, each hosting a replica of
every one of 1,000 shards (3,000 replicas).

Proves: the cluster starts and every shard gets a leader that confirms itself (Status
answered after a barrier through the log); each node runs a fixed number of threads
(not one per shard) and, once idle, its shards are quiet (admin API); appends to a random
sample of shards are acknowledged and read back through their leaders; one node is killed
with SIGKILL, and every shard it led gets a leader on another node in a later term, with
every acknowledged append of the sample still there. Before the kill, leadership evens out
over the nodes (each leads a third, give or take BALANCE_SPREAD_MAX). How: `devcluster.start`,
`devcluster.leaders_confirmed` (many Status probes in flight), the async client from
client.toml, /proc for the threads. Bounded: about a minute on the 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import urllib.request
from pathlib import Path

import pytest

from logsvc import devcluster
from logsvc.client import connect
from logsvc.config import load_client_config

SHARDS = 1000
NODES = 3
SAMPLE = 40
LEADERS_WAIT_S_MAX = 120.0
FAILOVER_WAIT_S_MAX = 90.0
QUIET_WAIT_S_MAX = 30.0
# A node's threads: the event loop, the Raft workers ([raft] threads, 4) and their syncers
# (one each, once a replica on it leads), the default executor and the readers (bounded by
# their pools), whatever the shard count.
THREADS_MAX = 24
# Leaders per node once balanced: at most this many apart (a third of 1,000 each, within
# what moves still under way and the balancer's rule, two apart per shard group, allow).
BALANCE_SPREAD_MAX = 50
BALANCE_WAIT_S_MAX = 90.0


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def quiet_somewhere(admin_address: str, token: str, shards: list[int]) -> int:
    count = 0
    for shard in shards:
        request = urllib.request.Request(f"http://{admin_address}/v1/shards/{shard}")
        request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            count += bool(json.loads(response.read())["quiet"])
    return count


async def append_sample(client_toml: str, sample: list[int]) -> dict[int, dict[int, bytes]]:
    client = await connect(client_toml)
    try:

        async def one(shard: int) -> tuple[int, dict[int, bytes]]:
            acked = {}
            for i in range(3):
                payload = f"shard {shard} record {i}".encode()
                [lsn] = await client.append(shard, [payload])
                acked[lsn] = payload
            return shard, acked

        return dict(await asyncio.gather(*(one(shard) for shard in sample)))
    finally:
        await client.close()


async def read_back(client_toml: str, acked: dict[int, dict[int, bytes]]) -> list[int]:
    """The shards of the sample missing an acknowledged record (read through the leader)."""
    client = await connect(client_toml)
    try:
        missing = []
        for shard, records in acked.items():
            page = await client.tail(shard, min(records), 1 << 20, 0)
            served = {page.first_lsn + i: r for i, r in enumerate(page.records)}
            if any(served.get(lsn) != payload for lsn, payload in records.items()):
                missing.append(shard)
        return missing
    finally:
        await client.close()


@pytest.mark.timeout(400)
def test_a_thousand_shards_start_lead_serve_and_fail_over(tmp_path: Path) -> None:
    base = str(tmp_path)
    try:
        started = time.monotonic()
        pids = devcluster.start(base, nodes=NODES, shards=SHARDS)
        config = load_client_config(os.path.join(base, "client.toml"))
        deadline = started + LEADERS_WAIT_S_MAX
        for address in config.addresses:
            devcluster._wait_listening(address, deadline)
        led, missing = asyncio.run(
            devcluster.leaders_confirmed(
                config.addresses, config.token, range(1, SHARDS + 1), deadline - time.monotonic()
            )
        )
        assert not missing, f"{len(missing)} shards without a leader, e.g. {sorted(missing)[:5]}"
        print(f"{SHARDS} shards on {NODES} nodes all led {time.monotonic() - started:.1f} s in")
        for pid in pids.values():
            assert threads_of(pid) <= THREADS_MAX

        rng = random.Random(17)
        sample = rng.sample(range(1, SHARDS + 1), SAMPLE)
        client_toml = os.path.join(base, "client.toml")
        acked = asyncio.run(append_sample(client_toml, sample))
        assert sum(len(r) for r in acked.values()) == 3 * SAMPLE

        # Idle shards go quiet: a sample of those nobody wrote to, on one node.
        idle = [s for s in range(1, 101) if s not in sample]
        quiet_by = time.monotonic() + QUIET_WAIT_S_MAX
        while quiet_somewhere(config.admin_addresses[1], config.token, idle) < len(idle):
            assert time.monotonic() < quiet_by, "idle shards did not go quiet"
            time.sleep(0.5)

        # Leadership evens out (logsvc/shard/leader_balance.py): elections alone left one
        # node leading 89 to 591 of the 1,000 shards after start-up.
        balanced_by = time.monotonic() + BALANCE_WAIT_S_MAX
        while True:
            now_led, _ = asyncio.run(
                devcluster.leaders_confirmed(
                    config.addresses, config.token, range(1, SHARDS + 1), 60.0
                )
            )
            counts = [
                sum(1 for e in now_led.values() if e.data_address == a) for a in config.addresses
            ]
            if max(counts) - min(counts) <= BALANCE_SPREAD_MAX:
                break
            assert time.monotonic() < balanced_by, f"leaders per node stayed at {counts}"
            time.sleep(2.0)
        print(f"leaders per node {counts}")

        victim_address = config.addresses[0]
        # Who leads what now (the appends' shards may have moved): asked again.
        led.update(now_led)
        theirs = {s: e.term for s, e in led.items() if e.data_address == victim_address}
        assert theirs, "n1 led no shard: the kill would prove nothing"
        killed_at = time.monotonic()
        devcluster.kill_node(base, "n1")
        found, stuck = asyncio.run(
            devcluster.leaders_confirmed(
                config.addresses,
                config.token,
                theirs,
                FAILOVER_WAIT_S_MAX,
                not_at=victim_address,
                term_above=theirs,
            )
        )
        assert not stuck, f"{len(stuck)} of n1's {len(theirs)} shards kept no leader"
        slowest = max(entry.at_s for entry in found.values()) - killed_at
        print(f"all {len(theirs)} shards n1 led failed over; the last after {slowest:.1f} s")
        assert not asyncio.run(read_back(client_toml, acked))
    finally:
        devcluster.down(base)
