"""`logsvc demo`: the shard store at work, in about fifteen seconds.

Until the replicated cluster exists (issues 3 and 4), the main job shows the storage heart
of logsvc doing what it promises: group commit, reads, prefix truncation, recovery from a
torn tail after a simulated crash, and the benchmark.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading

from logsvc.bench import store_bench
from logsvc.store import Entry, ShardStore, StoreLimits

WRITERS = 16
RECORDS_PER_WRITER = 500


def _say(text: str) -> None:
    print(text, flush=True)


def run(dir_path: str | None, bench_seconds: float) -> int:
    owned = dir_path is None
    base = tempfile.mkdtemp(prefix="logsvc-demo-") if dir_path is None else dir_path
    store_dir = os.path.join(base, "shard-1")
    limits = StoreLimits(segment_bytes_max=256 * 1024)
    try:
        _concurrent_appends(store_dir, limits)
        _torn_tail_recovery(store_dir, limits)
        _say("\n== benchmark (one JSON line per mode) ==")
        config = store_bench.BenchConfig(writers=64, record_bytes=100, seconds=bench_seconds)
        for mode in store_bench.MODES:
            _say(json.dumps(store_bench.run_mode(mode, config)))
    finally:
        if owned:
            shutil.rmtree(base, ignore_errors=True)
    _say("\ndemo finished")
    return 0


def _concurrent_appends(store_dir: str, limits: StoreLimits) -> None:
    _say(f"== {WRITERS} writers append {RECORDS_PER_WRITER} records each, waiting for fsync ==")
    _say(f"store: {store_dir}")
    with ShardStore.open(store_dir, limits=limits) as store:
        lock = threading.Lock()
        next_index = [store.last_index + 1]

        def writer(number: int) -> None:
            for i in range(RECORDS_PER_WRITER):
                with lock:
                    index = next_index[0]
                    next_index[0] += 1
                    store.append([Entry(index, 1, f"writer {number} record {i}".encode())])
                store.wait_durable(index)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stats = store.stats()
        _say(
            f"appended {stats.last_index} records, all durable (durable index "
            f"{stats.durable_index}) with {stats.syncs} group syncs: "
            f"{stats.last_index / max(stats.syncs, 1):.1f} records per fsync, "
            f"{stats.segments} segment files"
        )
        sample = store.read(100, 103, 1 << 20)
        _say("read [100, 103): " + ", ".join(f"{e.index}={e.payload.decode()!r}" for e in sample))
        start = store.truncate_prefix(stats.last_index // 2)
        _say(f"truncated the prefix: the log now starts at {start}")
    files = sorted(n for n in os.listdir(store_dir) if n.endswith(".seg"))
    _say(f"segment files after truncation: {len(files)} (first {files[0]})")


def _torn_tail_recovery(store_dir: str, limits: StoreLimits) -> None:
    _say("\n== crash with a torn last write, then recovery ==")
    newest = sorted(n for n in os.listdir(store_dir) if n.endswith(".seg"))[-1]
    torn = b"\x07half-written record that never got its fsync"
    with open(os.path.join(store_dir, newest), "ab") as segment:
        segment.write(torn)
    _say(f"appended {len(torn)} bytes of a torn record to {newest}")
    with ShardStore.open(store_dir, limits=limits) as store:
        report = store.stats().recovery
        _say(
            f"reopened: cut {report.torn_tail_bytes_cut} torn bytes ({report.torn_reason}); "
            f"log is [{store.first_index}, {store.last_index}], every durable record intact"
        )
