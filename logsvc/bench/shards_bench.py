"""`python -m logsvc.bench shards --nodes 3 --shards 1000`: many shards per node, measured.

Starts a local cluster of real node processes (`logsvc dev-cluster`, every shard with a
replica on every node when --nodes 3), then, in this order, prints one JSON object with:

1. `all_led_s`: from spawning the nodes until every shard has a leader that confirmed
   itself (a data-plane Status answered after a barrier through the log); also when the
   last node listened (`listening_s`).
2. After `--settle-seconds` and then until every replica says it is quiet (its admin
   status; at most `SETTLE_WAIT_S_MAX` more: `idle_settle_s`, and `idle_quiet_replicas`
   before and after the window say what was measured), over `--idle-seconds`: the CPU of
   the node processes (`idle_cpu_cores_total`, and per node), each node's RSS, threads and
   open descriptors, and RSS per hosted replica (the whole process's RSS divided by its
   replicas: an upper bound on what an idle replica costs). Measured 5 s after the last
   leader, before every shard had gone quiet, the idle CPU read 2.5x its settled value
   (0.10 against 0.04 cores, 2026-11-27).
3. For each count of `--active-shards` (a comma list, default 1,100,1000 up to --shards),
   that many shards chosen at random, driven in closed loop by `--concurrency` appenders
   (one record of `--record-bytes` each, waiting for the acknowledgement) for
   `--load-seconds`: `loads`, one object per count with `appends_per_s` and p50/p99
   latency (the first count's figures are also at the top level, as before).
   `--journal node` runs the nodes with the shared node journal
   (docs/decisions/0011-shared-journal.md); `shard` (the default) is today's path.
4. One node (the first) killed with SIGKILL: the shards it led, and for each the time from
   the kill until a survivor became its leader in a later term (`failover_s` max/p50/p99),
   read from the nodes' event log (logsvc/events.py, `leader` events; the bench points
   `LOGSVC_EVENT_LOG` at `events.jsonl` in its directory unless it is set). A shard counts
   as failed over only once its new leader also answered as confirmed (a data-plane Status
   after a barrier through its log; `failed_over`/`led_by_killed`, and
   `failover_all_confirmed_s` when the last one did), and `leaders_per_node` just before
   the kill. The confirmations are asked after the elections (each shard probed on its
   own, both survivors asked, then `FAILOVER_PROBE_PAUSE_S`, again): asked while the
   elections ran, 2 x ~333 barrier probes every 50 ms slowed the survivors and queued
   behind each other, ~0.9 s of the p50 on a quiet box (issue 22's note, 2026-11-27).
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from logsvc import admin_client, devcluster, events, gc_tuning
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
# After the settle time, how long the idle phase waits for every replica to go quiet (the
# leader balancer's last moves and quiescence take ~10-20 s after the last leader on this
# box) and how often it asks the nodes' admin APIs meanwhile (one GET /v1/shards each).
SETTLE_WAIT_S_MAX = 60.0
SETTLE_POLL_S = 1.0
EVENT_LOG_NAME = "events.jsonl"  # in the bench's directory, unless LOGSVC_EVENT_LOG says
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
    # The nodes log their term, vote and role changes there (logsvc/events.py): the
    # failover is timed from it. One set by the caller is used as it is.
    events_before = os.environ.get(events.ENV_VAR)
    events_path = events_before or os.path.join(os.path.abspath(base), EVENT_LOG_NAME)
    os.environ[events.ENV_VAR] = events_path
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
            quiet_of = _QuietCount(client_config.admin_addresses, client_config.token)
            result.update(_idle(pids, config, quiet_of))
            gc_tuning.tune_for_latency()  # the client's own pauses would count as latency
            loads = [asyncio.run(_load(base, config, count)) for count in config.active_shards]
            result.update(loads[0])
            result["loads"] = loads
        result.update(_failover(base, pids, led, config, events_path))
        return result
    finally:
        if events_before is None:
            del os.environ[events.ENV_VAR]
        devcluster.down(base)
        if config.dir is None:
            shutil.rmtree(base, ignore_errors=True)


class _QuietCount:
    """How many of the cluster's replicas say they are quiet, of how many answered
    (`GET /v1/shards` of every node's admin API; a node that does not answer counts none)."""

    def __init__(self, admin_addresses: Sequence[str], token: str) -> None:
        self._addresses = tuple(admin_addresses)
        self._token = token

    def __call__(self) -> tuple[int, int]:
        quiet = total = 0
        for address in self._addresses:
            try:
                answer = admin_client.get_json(address, "/v1/shards", self._token)
            except admin_client.AdminClientError:
                continue
            shards = answer.get("shards", []) if isinstance(answer, dict) else []
            total += len(shards)
            quiet += sum(1 for s in shards if isinstance(s, dict) and s.get("quiet") is True)
        return quiet, total


def _idle(
    pids: dict[str, int], config: ShardsBenchConfig, quiet_of: Callable[[], tuple[int, int]]
) -> dict[str, object]:
    time.sleep(config.settle_seconds)
    settle_began_s = time.monotonic()
    quiet, answered = quiet_of()
    settle_until_s = settle_began_s + SETTLE_WAIT_S_MAX
    while (answered == 0 or quiet < answered) and time.monotonic() < settle_until_s:
        time.sleep(SETTLE_POLL_S)
        quiet, answered = quiet_of()
    settle_s = config.settle_seconds + time.monotonic() - settle_began_s
    before = {node: sample_node(pid) for node, pid in pids.items()}
    began_s = time.monotonic()
    time.sleep(config.idle_seconds)
    after = {node: sample_node(pid) for node, pid in pids.items()}
    elapsed_s = time.monotonic() - began_s
    quiet_after, answered_after = quiet_of()
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
        "idle_settle_s": round(settle_s, 1),
        "idle_quiet_replicas": {
            "before": quiet,
            "after": quiet_after,
            "of": max(answered, answered_after),
        },
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
    base: str,
    pids: dict[str, int],
    led: dict[int, devcluster.Led],
    config: ShardsBenchConfig,
    events_path: str,
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
    event_log = _EventLog(events_path)
    event_log.read_new()  # skip what happened before the kill
    killed_ns = time.monotonic_ns()
    killed_s = killed_ns / 1e9
    devcluster.kill_node(base, victim)
    elected = _elected(event_log, theirs, killed_ns)
    # Then each one confirmed as a leader that serves (a barrier through its log), once
    # the elections are over: probed that way while they ran, they were slowed by it.
    confirmed, missing = asyncio.run(
        _new_leaders(
            [a for a in client_config.addresses if a != victim_address],
            client_config.token,
            theirs,
            killed_s + FAILOVER_WAIT_S_MAX,
        )
    )
    found = {shard: at_ns / 1e9 for shard, at_ns in elected.items() if shard in confirmed}
    times = sorted(at_s - killed_s for at_s in found.values())
    slowest = sorted(found.items(), key=lambda item: item[1], reverse=True)[:5]
    return {
        "killed": victim,
        "leaders_per_node": per_node,
        "led_by_killed": len(theirs),
        "failed_over": len(found),
        "not_failed_over": sorted(set(theirs) - set(found))[:20],
        "failover_s_max": _round(times[-1] if times else None),
        "failover_s_p50": percentile(times, 0.50),
        "failover_s_p99": percentile(times, 0.99),
        "failover_slowest": [[shard, _round(at_s - killed_s)] for shard, at_s in slowest],
        "failover_all_confirmed_s": _round(
            max(confirmed.values()) - killed_s if confirmed and not missing else None
        ),
    }


class _EventLog:
    """The nodes' event log (logsvc/events.py: one JSON object a line), read as it grows."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def _elected(event_log: _EventLog, terms: dict[int, int], killed_ns: int) -> dict[int, int]:
    """For each shard of `terms` (shard -> the killed leader's term), when (monotonic ns,
    the nodes' clock and ours) a survivor became its leader in a later term, from the
    nodes' event log; until all are found or `FAILOVER_WAIT_S_MAX` after the kill."""
    found: dict[int, int] = {}
    deadline_ns = killed_ns + int(FAILOVER_WAIT_S_MAX * 1e9)
    while len(found) < len(terms) and time.monotonic_ns() < deadline_ns:
        for event in event_log.read_new():
            shard, at_ns = event.get("shard"), event.get("time_ns", 0)
            if (
                event.get("kind") == "leader"
                and at_ns >= killed_ns
                and shard in terms
                and shard not in found
                and event.get("term", 0) > terms[shard]
            ):
                found[shard] = at_ns
        time.sleep(FAILOVER_PROBE_PAUSE_S)
    return found


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
