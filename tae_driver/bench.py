"""Throughput and completion latency of the driver over a backend.

    python -m tae_driver.bench --backend file --window 64 --entry-bytes 128 --seconds 3
    python -m tae_driver.bench --backend logsvc --window 64 --entry-bytes 128 --seconds 3

Why: the window is the driver's main knob (reference/matrixone-wal.md §2.3); this shows how
throughput grows with it (W = 1, 8, 64) over the group-fsync file backend and over a real
logsvc cluster. A closed loop of `--clients` concurrent appenders (default enough to fill any
window) each appends `--entry-bytes` entries back to back for `--seconds`; latency is from
the call to `append` to its completion (in DSN order; percentiles by linear interpolation,
logsvc/bench/measure.py). Prints one JSON object.

`--backend logsvc` starts its own local cluster (3 node processes, one shard, in a temporary
directory, like `logsvc bench cluster`), stops it and removes the directory afterwards; with
`--client-config PATH` it uses that running cluster's `--shard` instead (the shard's lease is
taken, fencing any other writer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from array import array
from typing import Any

from logsvc import devcluster
from logsvc.bench.measure import percentile
from logsvc.config import load_client_config
from tae_driver import limits, open_driver
from tae_driver.backend import LogBackend
from tae_driver.backends.file import FileBackend
from tae_driver.backends.logsvc import LogsvcBackend
from tae_driver.backends.memory import MemoryBackend
from tae_driver.replay import ReplayDecision

CLIENTS_DEFAULT = 1024
SECONDS_MAX = 600
LOGSVC_NODES = 3


def _apply(dsn: int, entry: bytes) -> ReplayDecision:
    return ReplayDecision.APPLY


async def run(
    backend_name: str,
    window: int,
    entry_bytes: int,
    seconds: float,
    clients: int,
    dir_path: str | None,
    *,
    client_config: str | None = None,
    shard: int = 1,
) -> dict[str, Any]:
    """Over a logsvc cluster, `client_config` is its DIR/client.toml (the caller runs it)."""
    temp_dir: str | None = None
    backend: LogBackend
    if backend_name == "file":
        if dir_path is None:
            temp_dir = tempfile.mkdtemp(prefix="tae-driver-bench-")
            dir_path = temp_dir
        backend = await FileBackend.open(dir_path)
    elif backend_name == "logsvc":
        assert client_config is not None
        config = load_client_config(client_config)
        backend = await LogsvcBackend.open(config.addresses, config.token, shard)
    else:
        backend = MemoryBackend()
    try:
        driver = open_driver(backend, window=window)
        await driver.replay(_apply)
        entry = bytes(range(256)) * (entry_bytes // 256) + bytes(entry_bytes % 256)
        latencies_ms = array("d")
        clock = time.perf_counter
        started = clock()
        deadline = started + seconds

        async def client() -> None:
            while clock() < deadline:
                begun = clock()
                await driver.append(entry)
                latencies_ms.append((clock() - begun) * 1000.0)

        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = clock() - started
        stats = driver.stats()
        await driver.close()
        ordered = sorted(latencies_ms)
        result: dict[str, Any] = {
            "backend": backend_name,
            "window": window,
            "entry_bytes": entry_bytes,
            "seconds": round(elapsed, 3),
            "clients": clients,
            "entries": len(ordered),
            "entries_per_s": round(len(ordered) / elapsed, 1),
            "mib_per_s": round(len(ordered) * entry_bytes / elapsed / limits.MiB, 2),
            "records": stats.records_appended,
            "entries_per_record": round(len(ordered) / max(1, stats.records_appended), 1),
            "latency_ms_p50": percentile(ordered, 0.50),
            "latency_ms_p99": percentile(ordered, 0.99),
            "latency_ms_max": round(ordered[-1], 3) if ordered else None,
        }
        if isinstance(backend, FileBackend):
            file_stats = backend.stats()
            result["fsyncs"] = file_stats.data_syncs
            result["records_per_fsync"] = round(
                stats.records_appended / max(1, file_stats.data_syncs), 1
            )
        if isinstance(backend, LogsvcBackend):
            result["shard"] = backend.shard
            result["lease_epoch"] = backend.epoch
        return result
    finally:
        await backend.close()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    if not __debug__:
        print("tae_driver.bench refuses to run under python -O (asserts stay on)", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="python -m tae_driver.bench", description=__doc__)
    parser.add_argument("--backend", choices=["file", "memory", "logsvc"], default="file")
    parser.add_argument("--window", type=int, default=limits.WINDOW_RECORDS_DEFAULT)
    parser.add_argument("--entry-bytes", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=CLIENTS_DEFAULT)
    parser.add_argument("--dir", default=None, help="file backend directory (default: a temp dir)")
    parser.add_argument(
        "--client-config",
        default=None,
        help="logsvc: a running cluster's client.toml (default: start a local cluster)",
    )
    parser.add_argument("--shard", type=int, default=1, help="logsvc: the shard to write")
    args = parser.parse_args(argv)
    if args.shard < 1:
        parser.error("--shard must be at least 1")
    if not 1 <= args.window <= limits.WINDOW_RECORDS_MAX:
        parser.error(f"--window must be in [1, {limits.WINDOW_RECORDS_MAX}]")
    if not 0 <= args.entry_bytes <= limits.ENTRY_BYTES_MAX:
        parser.error(f"--entry-bytes must be in [0, {limits.ENTRY_BYTES_MAX}]")
    if not 0 < args.seconds <= SECONDS_MAX:
        parser.error(f"--seconds must be in (0, {SECONDS_MAX}]")
    if not 1 <= args.clients <= limits.INTAKE_ENTRIES_MAX:
        parser.error(f"--clients must be in [1, {limits.INTAKE_ENTRIES_MAX}]")
    if args.backend == "logsvc" and args.client_config is None:
        result = _run_on_local_cluster(args)
    else:
        result = asyncio.run(
            run(
                args.backend,
                args.window,
                args.entry_bytes,
                args.seconds,
                args.clients,
                args.dir,
                client_config=args.client_config,
                shard=args.shard,
            )
        )
    print(json.dumps(result, sort_keys=True))
    return 0


def _run_on_local_cluster(args: argparse.Namespace) -> dict[str, Any]:
    """Start a local cluster (dev-cluster: 3 node processes, one shard) in a temporary
    directory, run against its shard 1, and stop and remove it whatever happens."""
    base = tempfile.mkdtemp(prefix="tae-driver-bench-logsvc-")
    try:
        devcluster.up(base, nodes=LOGSVC_NODES, shards=1)
        result = asyncio.run(
            run(
                "logsvc",
                args.window,
                args.entry_bytes,
                args.seconds,
                args.clients,
                None,
                client_config=os.path.join(base, "client.toml"),
                shard=1,
            )
        )
        result["nodes"] = LOGSVC_NODES
        return result
    finally:
        devcluster.down(base)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
