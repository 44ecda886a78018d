"""`python -m logsvc.bench shards --nodes 3 --shards 1000`: many shards per node, measured.

Starts a local cluster of real node processes (`logsvc dev-cluster`, every shard with a
replica on every node when --nodes 3), then, in this order, prints one JSON object with:

1. `all_led_s`: from spawning the nodes until every shard has a leader that confirmed
   itself (a data-plane Status answered after a barrier through the log); also when the
   last node listened (`listening_s`).
2. After `--settle-seconds` (idle shards go quiet), over `--idle-seconds`: the CPU of the
   node processes (`idle_cpu_cores_total`, and per node), each node's RSS, threads and open
   descriptors, and RSS per hosted replica (the whole process's RSS divided by its
   replicas: an upper bound on what an idle replica costs).
3. For each count of `--active-shards` (a comma list, default 1,100,1000 up to --shards),
   that many shards chosen at random, driven in closed loop by `--concurrency` appenders
   (one record of `--record-bytes` each, waiting for the acknowledgement) for
   `--load-seconds`: `loads`, one object per count with `appends_per_s` and p50/p99
   latency (the first count's figures are also at the top level, as before).
   `--journal node` runs the nodes with the shared node journal
   (docs/decisions/0011-shared-journal.md); `shard` (the default) is today's path.
4. One node (the first) killed with SIGKILL: the shards it led, and for each the time from
   the kill until another node answered as their confirmed leader in a later term
   (`failover_s` max/p50/p99, `failed_over`/`led_by_killed`, and `leaders_per_node` just
   before the kill). Each such shard is probed on its own (both survivors asked, then
   `FAILOVER_PROBE_PAUSE_S`, again), so a shard's time is its own answer's, never held up
   by a slow answer about another shard.
   `--failover-only` skips 2 and 3 (after `--settle-seconds`, when idle shards are quiet).

Every process is stopped by PID at the end (`dev-cluster down`); every wait is bounded.
Timings are what this machine did in this run: compare runs of one sitting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from logsvc import devcluster, gc_tuning
from logsvc.bench.measure import percentile, stat_cpu_s
from logsvc.client import Client, LogsvcError, connect
from logsvc.config import load_client_config

SHARDS_MAX = devcluster.SHARDS_MAX
LEADERS_WAIT_S_MAX = 300.0
FAILOVER_WAIT_S_MAX = 60.0
# Failover probes: per shard, the pause between two rounds of asking the survivors (the
# time resolution), and the status requests in flight at once (what the probing costs the
# survivors while they elect: bounded).
FAILOVER_PROBE_PAUSE_S = 0.05
FAILOVER_PROBES_AT_ONCE_MAX = 64
CONCURRENCY_MAX = 4096
SECONDS_MAX = 3600.0
ACTIVE_SHARDS_DEFAULT = (1, 100, 1000)  # issue 22: one shard, a hundred, a thousand busy


@dataclass(frozen=True, slots=True)
class ShardsBenchConfig:
    nodes: int = 3
    shards: int = 1000
    settle_seconds: float = 5.0
    idle_seconds: float = 30.0
    active_shards: tuple[int, ...] = ACTIVE_SHARDS_DEFAULT
    journal: str = "shard"
    raft_threads: int | None = None  # the nodes' [raft] threads; None: the default
    failover_only: bool = False  # skip the idle and load phases
    concurrency: int = 256
    record_bytes: int = 100
    load_seconds: float = 10.0
    seed: int = 1
    dir: str | None = None


@dataclass(frozen=True, slots=True)
class NodeSample:
    cpu_s: float  # user + system, whole process
    rss_kb: int
    threads: int
    fds: int


def sample_node(pid: int) -> NodeSample:
    """A node process's CPU seconds so far, RSS, threads and open descriptors (/proc)."""
    with open(f"/proc/{pid}/stat") as f:
        cpu_s = stat_cpu_s(f.read())
    rss_kb = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return NodeSample(
        cpu_s=cpu_s,
        rss_kb=rss_kb,
        threads=len(os.listdir(f"/proc/{pid}/task")),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
    )


def run(config: ShardsBenchConfig) -> dict[str, object]:
    assert 3 <= config.nodes <= devcluster.NODES_MAX
    assert 1 <= config.shards <= SHARDS_MAX
    assert all(1 <= count <= config.shards for count in config.active_shards)
    base = config.dir or tempfile.mkdtemp(prefix="logsvc-bench-shards-")
    result: dict[str, object] = {"bench": "shards", **asdict(config)}
    try:
        started_s = time.monotonic()
        pids = devcluster.start(
            base,
            nodes=config.nodes,
            shards=config.shards,
            journal=config.journal,
            raft_threads=config.raft_threads,
        )
        client_config = load_client_config(os.path.join(base, "client.toml"))
        deadline_s = started_s + LEADERS_WAIT_S_MAX
        for address in client_config.addresses:
            devcluster._wait_listening(address, deadline_s)
        result["listening_s"] = round(time.monotonic() - started_s, 2)
        led, missing = asyncio.run(
            devcluster.leaders_confirmed(
                client_config.addresses,
                client_config.token,
                range(1, config.shards + 1),
                deadline_s - time.monotonic(),
            )
        )
        result["all_led_s"] = None if missing else round(time.monotonic() - started_s, 2)
        result["shards_without_leader"] = len(missing)
        if missing:
            return result
        if config.failover_only:
            time.sleep(config.settle_seconds)  # idle shards go quiet, as they would be
        else:
            result.update(_idle(pids, config))
            gc_tuning.tune_for_latency()  # the client's own pauses would count as latency
            loads = [asyncio.run(_load(base, config, count)) for count in config.active_shards]
            result.update(loads[0])
            result["loads"] = loads
        result.update(_failover(base, pids, led, config))
        return result
    finally:
        devcluster.down(base)
        if config.dir is None:
            shutil.rmtree(base, ignore_errors=True)


def _idle(pids: dict[str, int], config: ShardsBenchConfig) -> dict[str, object]:
    time.sleep(config.settle_seconds)
    before = {node: sample_node(pid) for node, pid in pids.items()}
    began_s = time.monotonic()
    time.sleep(config.idle_seconds)
    after = {node: sample_node(pid) for node, pid in pids.items()}
    elapsed_s = time.monotonic() - began_s
    replicas = config.shards * min(3 if config.nodes < 5 else 5, config.nodes) / config.nodes
    per_node = {
        node: {
            "idle_cpu_cores": round((after[node].cpu_s - before[node].cpu_s) / elapsed_s, 4),
            "rss_mb": round(after[node].rss_kb / 1024, 1),
            "rss_kb_per_replica": round(after[node].rss_kb / replicas, 1),
            "threads": after[node].threads,
            "fds": after[node].fds,
        }
        for node in pids
    }
    total = sum(after[n].cpu_s - before[n].cpu_s for n in pids) / elapsed_s
    return {
        "idle_measured_s": round(elapsed_s, 1),
        "idle_cpu_cores_total": round(total, 4),
        "replicas_per_node": replicas,
        "nodes_detail": per_node,
    }


async def _load(base: str, config: ShardsBenchConfig, count: int) -> dict[str, object]:
    client = await connect(os.path.join(base, "client.toml"))
    rng = random.Random(config.seed)
    active = rng.sample(range(1, config.shards + 1), count)
    payload = os.urandom(config.record_bytes)
    latencies_ms: list[float] = []
    errors = 0
    stop_at = 0.0

    async def worker(number: int) -> None:
        nonlocal errors
        pick = random.Random(config.seed * 1000 + number)
        while time.monotonic() < stop_at:
            shard = pick.choice(active)
            began = time.perf_counter()
            try:
                await client.append(shard, [payload])
            except LogsvcError:
                errors += 1
                continue
            latencies_ms.append((time.perf_counter() - began) * 1000.0)

    try:
        for shard in active:  # leaders known to the client, shards awake
            await client.append(shard, [payload])
        stop_at = time.monotonic() + config.load_seconds
        began_s = time.monotonic()
        await asyncio.gather(*(worker(n) for n in range(config.concurrency)))
        elapsed_s = time.monotonic() - began_s
    finally:
        await client.close()
    latencies_ms.sort()
    return {
        "load_active_shards": len(active),
        "appends_per_s": round(len(latencies_ms) / elapsed_s, 1),
        "append_p50_ms": percentile(latencies_ms, 0.50),
        "append_p99_ms": percentile(latencies_ms, 0.99),
        "append_errors": errors,
    }


def _failover(
    base: str, pids: dict[str, int], led: dict[int, devcluster.Led], config: ShardsBenchConfig
) -> dict[str, object]:
    client_config = load_client_config(os.path.join(base, "client.toml"))
    victim = sorted(pids)[0]
    victim_address = client_config.addresses[int(victim[1:]) - 1]
    # Who leads what now (the load may have moved a leader): asked again, quickly.
    now_led, _ = asyncio.run(
        devcluster.leaders_confirmed(
            client_config.addresses, client_config.token, range(1, config.shards + 1), 60.0
        )
    )
    led = {**led, **now_led}
    theirs = {
        shard: entry.term for shard, entry in led.items() if entry.data_address == victim_address
    }
    # How evenly leadership is spread when the node dies (leader_balance.py).
    per_node = {
        f"n{number}": sum(1 for entry in led.values() if entry.data_address == address)
        for number, address in enumerate(client_config.addresses, start=1)
    }
    killed_s = time.monotonic()
    devcluster.kill_node(base, victim)
    found, missing = asyncio.run(
        _new_leaders(
            [a for a in client_config.addresses if a != victim_address],
            client_config.token,
            theirs,
            killed_s + FAILOVER_WAIT_S_MAX,
        )
    )
    times = sorted(at_s - killed_s for at_s in found.values())
    slowest = sorted(found.items(), key=lambda item: item[1], reverse=True)[:5]
    return {
        "killed": victim,
        "leaders_per_node": per_node,
        "led_by_killed": len(theirs),
        "failed_over": len(found),
        "not_failed_over": sorted(missing)[:20],
        "failover_s_max": _round(times[-1] if times else None),
        "failover_s_p50": percentile(times, 0.50),
        "failover_s_p99": percentile(times, 0.99),
        "failover_slowest": [[shard, _round(at_s - killed_s)] for shard, at_s in slowest],
    }


async def _new_leaders(
    survivors: Sequence[str], token: str, terms: dict[int, int], deadline_s: float
) -> tuple[dict[int, float], set[int]]:
    """For each shard of `terms` (shard -> the killed leader's term), when a survivor first
    answered as its confirmed leader in a later term (time.monotonic()); and the shards
    without one by `deadline_s`. One probing loop per shard, bounded in flight."""
    probes = [
        await connect([address], token, options=devcluster.PROBE_OPTIONS) for address in survivors
    ]
    in_flight = asyncio.Semaphore(FAILOVER_PROBES_AT_ONCE_MAX)
    found: dict[int, float] = {}

    async def ask(probe: Client, shard: int) -> bool:
        async with in_flight:
            try:
                status = await probe.status(shard)
            except (LogsvcError, OSError, TimeoutError):
                return False
        if status.is_leader and status.term > terms[shard] and shard not in found:
            found[shard] = time.monotonic()
        return shard in found

    async def follow(shard: int) -> None:
        while time.monotonic() < deadline_s:
            answers = await asyncio.gather(*(ask(probe, shard) for probe in probes))
            if any(answers):
                return
            await asyncio.sleep(FAILOVER_PROBE_PAUSE_S)

    try:
        await asyncio.gather(*(follow(shard) for shard in terms))
    finally:
        for probe in probes:
            await probe.close()
    return found, set(terms) - set(found)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m logsvc.bench shards",
        description="Start a local cluster hosting many shards; measure the time until every "
        "shard has a leader, idle CPU/RSS/threads per node, appends over active shards, and "
        "the failover of a killed node's shards. Prints one JSON object.",
    )
    defaults = ShardsBenchConfig()
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--shards", type=int, default=defaults.shards)
    parser.add_argument("--settle-seconds", type=float, default=defaults.settle_seconds)
    parser.add_argument("--idle-seconds", type=float, default=defaults.idle_seconds)
    parser.add_argument(
        "--active-shards",
        default=None,
        help="comma list of active shard counts, one load each (default 1,100,1000 up to --shards)",
    )
    parser.add_argument("--journal", choices=("shard", "node"), default=defaults.journal)
    parser.add_argument(
        "--raft-threads", type=int, default=None, help="the nodes' [raft] threads (1..64)"
    )
    parser.add_argument(
        "--failover-only",
        action="store_true",
        help="skip the idle and load phases: start, settle, kill a node, time the failover",
    )
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--record-bytes", type=int, default=defaults.record_bytes)
    parser.add_argument("--load-seconds", type=float, default=defaults.load_seconds)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--dir", default=None, help="kept afterwards (default: a temp dir)")
    return parser


def parse_args(argv: Sequence[str]) -> ShardsBenchConfig:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.active_shards is None:
        active = tuple(n for n in ACTIVE_SHARDS_DEFAULT if n <= ns.shards) or (1,)
    else:
        try:
            active = tuple(int(part) for part in ns.active_shards.split(","))
        except ValueError:
            parser.error(f"--active-shards: not a comma list of integers: {ns.active_shards!r}")
    config = ShardsBenchConfig(
        nodes=ns.nodes,
        shards=ns.shards,
        settle_seconds=ns.settle_seconds,
        idle_seconds=ns.idle_seconds,
        active_shards=active,
        journal=ns.journal,
        raft_threads=ns.raft_threads,
        failover_only=ns.failover_only,
        concurrency=ns.concurrency,
        record_bytes=ns.record_bytes,
        load_seconds=ns.load_seconds,
        seed=ns.seed,
        dir=ns.dir,
    )
    checks = (
        ("--nodes", 3 <= config.nodes <= devcluster.NODES_MAX),
        ("--shards", 1 <= config.shards <= SHARDS_MAX),
        ("--active-shards", all(1 <= n <= config.shards for n in config.active_shards)),
        ("--concurrency", 1 <= config.concurrency <= CONCURRENCY_MAX),
        ("--record-bytes", 1 <= config.record_bytes <= 1 << 20),
        ("--settle-seconds", 0 <= config.settle_seconds <= SECONDS_MAX),
        ("--idle-seconds", 0 < config.idle_seconds <= SECONDS_MAX),
        ("--load-seconds", 0 < config.load_seconds <= SECONDS_MAX),
        ("--raft-threads", config.raft_threads is None or 1 <= config.raft_threads <= 64),
    )
    for flag, ok in checks:
        if not ok:
            parser.error(f"{flag}: out of range")
    return config


def main(argv: Sequence[str]) -> int:
    config = parse_args(argv)
    result = run(config)
    print(json.dumps(result), flush=True)
    return 0 if result.get("all_led_s") is not None else 1
