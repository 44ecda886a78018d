"""`logsvc bench cluster`: a local cluster of real node processes, driven in closed loop.

Starts its own cluster (`dev-cluster`, one shard, 3 replicas, in a temporary directory),
then C concurrent appenders on one asyncio client process each append a batch of N records
of B bytes and wait for the acknowledgement (majority fsynced), for S seconds. Prints one
JSON object: acknowledged records and appends per second, latency percentiles (linear
interpolation, logsvc/bench/measure.py, as every benchmark's), fsyncs per
second per replica and records per fsync (from the nodes' own counters, read with SIGUSR1
before and after the run), CPU seconds of the server processes and of the client.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass

from logsvc import devcluster, gc_tuning
from logsvc.bench.measure import own_cpu_s, percentile, processes_cpu_s
from logsvc.client import LogsvcError, connect
from logsvc.config import load_client_config

CONCURRENCY_MAX = 4096
WARMUP_S = 1.0
STATS_WAIT_S_MAX = 10.0
_STATS = re.compile(r"^STATS (\{.*\})$")


@dataclass(frozen=True, slots=True)
class ClusterBenchConfig:
    concurrency: int = 64
    record_bytes: int = 100
    seconds: float = 5.0
    batch: int = 1
    replicas: int = 3


def run(config: ClusterBenchConfig) -> dict[str, object]:
    assert 1 <= config.concurrency <= CONCURRENCY_MAX
    assert config.replicas == 3, "local clusters run 3 replicas per shard"
    base = tempfile.mkdtemp(prefix="logsvc-bench-cluster-")
    try:
        devcluster.up(base, nodes=3, shards=1)
        gc_tuning.tune_for_latency()  # the client's pauses would count in the latencies
        return asyncio.run(_drive(base, config))
    finally:
        devcluster.down(base)
        shutil.rmtree(base, ignore_errors=True)


async def _drive(base: str, config: ClusterBenchConfig) -> dict[str, object]:
    client_config = load_client_config(os.path.join(base, "client.toml"))
    client = await connect(client_config.addresses, client_config.token)
    payloads = [os.urandom(config.record_bytes) for _ in range(config.batch)]
    latencies_ms: list[float] = []
    stop_at = 0.0
    measuring = False

    errors: list[str] = []

    async def appender() -> None:
        while time.monotonic() < stop_at:
            began = time.perf_counter()
            try:
                await client.append(1, payloads)
            except LogsvcError as exc:  # counted, and the run goes on
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if measuring:
                latencies_ms.append((time.perf_counter() - began) * 1000.0)

    stop_at = time.monotonic() + WARMUP_S  # warm up connections, leader cache, JIT-free paths
    await asyncio.gather(*(appender() for _ in range(config.concurrency)))
    pids = devcluster.read_pids(base)
    before = _stats(base, pids)
    cpu_before = processes_cpu_s(pids)
    client_cpu_before = own_cpu_s()
    measuring = True
    started = time.monotonic()
    stop_at = started + config.seconds
    await asyncio.gather(*(appender() for _ in range(config.concurrency)))
    elapsed = time.monotonic() - started
    client_cpu = own_cpu_s() - client_cpu_before
    after = _stats(base, pids)
    cpu_after = processes_cpu_s(pids)  # a node gone by now is left out of server_cpu_s
    server_cpu = {
        node: round(cpu_after[node] - cpu_before[node], 2)
        for node in pids
        if node in cpu_before and node in cpu_after
    }
    await client.close()
    appends = len(latencies_ms)
    records = appends * config.batch
    syncs = {node: after[node]["fdatasyncs"] - before[node]["fdatasyncs"] for node in after}
    samples = sorted(latencies_ms)
    return {
        "bench": "cluster",
        "replicas": config.replicas,
        "concurrency": config.concurrency,
        "batch": config.batch,
        "record_bytes": config.record_bytes,
        "seconds": round(elapsed, 3),
        "records_per_s": round(records / elapsed, 1),
        "appends_per_s": round(appends / elapsed, 1),
        "p50_ms": percentile(samples, 0.50),
        "p99_ms": percentile(samples, 0.99),
        "p999_ms": percentile(samples, 0.999),
        "fdatasyncs_per_s_per_replica": {n: round(c / elapsed, 1) for n, c in syncs.items()},
        "records_per_fdatasync": {
            n: round(records / c, 1) if c else None for n, c in syncs.items()
        },
        "server_cpu_s": server_cpu,
        "client_cpu_s": round(client_cpu, 2),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }


def _stats(base: str, pids: dict[str, int]) -> dict[str, dict[str, int]]:
    """Ask each node for its counters (SIGUSR1) and read the line it logs."""
    marks = {node: os.path.getsize(os.path.join(base, f"{node}.log")) for node in pids}
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR1)
    found: dict[str, dict[str, int]] = {}
    deadline = time.monotonic() + STATS_WAIT_S_MAX
    while len(found) < len(pids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no STATS line from {sorted(set(pids) - set(found))}")
        for node in pids:
            with open(os.path.join(base, f"{node}.log"), "rb") as log:
                log.seek(marks[node])
                for line in log.read().decode("utf-8", "replace").splitlines():
                    match = _STATS.match(line)
                    if match:
                        found[node] = json.loads(match.group(1))
        time.sleep(0.05)
    return found


def main(config: ClusterBenchConfig) -> int:
    print(json.dumps(run(config)), flush=True)
    return 0
