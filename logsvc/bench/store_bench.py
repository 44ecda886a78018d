"""Store benchmark: what group commit buys, measured on this machine's disk.

Modes, each on a fresh store directory, each with N writers in closed loop (append one
record, wait until it is durable, repeat) for a bounded time. Writers are coroutines on one
event loop (default; how the service's data plane waits) or threads (`--writer-kind thread`;
how the Raft tick thread waits):

* `group`: the real store; one fdatasync covers every record appended meanwhile.
* `sync_each`: the same store, but writers take turns so every record gets its own
  fdatasync: what a log without group commit would do.
* `sync_each_grow`: `sync_each` with zero-ahead off (store FORMAT.md "Zero-ahead"): every
  fdatasync follows a write that grows the file, as before zero-ahead. Its peer, in the
  same run: what overwriting written zeros saves per sync on this disk.
* `nosync`: the same path with every fdatasync and directory fsync skipped
  (`NoSyncFileSystem`): the ceiling set by Python and the write path alone.

Prints one JSON object per mode on stdout.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

from logsvc.bench.measure import percentile
from logsvc.store import Entry, ShardStore, StoreLimits
from logsvc.store.aio import AsyncDurability
from logsvc.store.fs import FileSystem, NoSyncFileSystem, OsFileSystem

MODES = ("group", "sync_each", "sync_each_grow", "nosync")
# Modes whose writers take turns, one record per fdatasync.
_ONE_PER_SYNC = ("sync_each", "sync_each_grow")
WRITER_KINDS = ("asyncio", "thread")
WRITERS_MAX = 1024  # threads; a bound on what one command may start
SECONDS_MAX = 600.0


@dataclass(frozen=True, slots=True)
class BenchConfig:
    writers: int = 64
    record_bytes: int = 100
    seconds: float = 3.0
    dir_path: str | None = None
    writer_kind: str = "asyncio"  # or "thread"


class _Sequencer:
    """Hands out dense indexes and appends in index order (the store's contract)."""

    def __init__(self, store: ShardStore, payload: bytes) -> None:
        self._store = store
        self._payload = payload
        self._lock = threading.Lock()
        self._next = store.last_index + 1

    def append_one(self) -> int:
        with self._lock:
            index = self._next
            self._next += 1
            self._store.append([Entry(index, 1, self._payload)])
            return index


def run_mode(mode: str, config: BenchConfig) -> dict[str, object]:
    assert mode in MODES
    assert 1 <= config.writers <= WRITERS_MAX
    assert 0 < config.seconds <= SECONDS_MAX
    assert config.writer_kind in WRITER_KINDS
    base = tempfile.mkdtemp(prefix=f"logsvc-bench-{mode}-", dir=config.dir_path)
    fs: FileSystem = NoSyncFileSystem() if mode == "nosync" else OsFileSystem()
    limits = StoreLimits()
    if mode == "sync_each_grow":
        limits = StoreLimits(zero_ahead_bytes_min=0, zero_ahead_bytes_max=0)
    store = ShardStore.open(base, fs=fs, limits=limits)
    try:
        return _drive(mode, store, config)
    finally:
        store.close()
        shutil.rmtree(base, ignore_errors=True)


def _drive(mode: str, store: ShardStore, config: BenchConfig) -> dict[str, object]:
    sequencer = _Sequencer(store, b"x" * config.record_bytes)
    before = store.stats()
    start = time.monotonic()
    if config.writer_kind == "asyncio":
        latencies = asyncio.run(_asyncio_writers(mode, store, sequencer, config))
    else:
        latencies = _thread_writers(mode, store, sequencer, config)
    elapsed = time.monotonic() - start
    after = store.stats()
    samples = sorted(latencies)
    records = len(samples)
    syncs = after.syncs - before.syncs
    return {
        "mode": mode,
        "writers": config.writers,
        "writer_kind": config.writer_kind,
        "record_bytes": config.record_bytes,
        "seconds": round(elapsed, 3),
        "records": records,
        "records_per_s": round(records / elapsed, 1),
        "syncs_per_s": round(syncs / elapsed, 1),
        "fdatasyncs_per_s": round((after.fdatasyncs - before.fdatasyncs) / elapsed, 1),
        "records_per_sync": round(records / syncs, 2) if syncs else None,
        "p50_ms": percentile(samples, 0.50),
        "p99_ms": percentile(samples, 0.99),
    }


async def _asyncio_writers(
    mode: str, store: ShardStore, sequencer: _Sequencer, config: BenchConfig
) -> list[float]:
    """Writers as coroutines on one event loop, as the data plane will drive the store."""
    durability = AsyncDurability(store)
    turn = asyncio.Lock()  # sync_each: one record per fdatasync
    deadline = time.monotonic() + config.seconds
    latencies: list[float] = []

    async def writer() -> None:
        while time.monotonic() < deadline:
            began = time.perf_counter()
            if mode in _ONE_PER_SYNC:
                async with turn:
                    sequencer.append_one()
                    await durability.wait_durable(store.request_sync())
            else:
                await durability.wait_durable(sequencer.append_one())
            latencies.append((time.perf_counter() - began) * 1000.0)

    await asyncio.gather(*(writer() for _ in range(config.writers)))
    return latencies


def _thread_writers(
    mode: str, store: ShardStore, sequencer: _Sequencer, config: BenchConfig
) -> list[float]:
    """Writers as threads, each blocking in wait_durable (the Raft tick thread's way)."""
    turn = threading.Lock()
    deadline = time.monotonic() + config.seconds
    per_thread: list[list[float]] = [[] for _ in range(config.writers)]
    failures: list[BaseException] = []

    def writer(mine: list[float]) -> None:
        try:
            while time.monotonic() < deadline:
                began = time.perf_counter()
                if mode in _ONE_PER_SYNC:
                    with turn:
                        sequencer.append_one()
                        store.sync()
                else:
                    store.wait_durable(sequencer.append_one())
                mine.append((time.perf_counter() - began) * 1000.0)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(m,), daemon=True) for m in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(config.seconds + 60.0)
    if failures:
        raise failures[0]
    return [x for mine in per_thread for x in mine]


def main(modes: list[str], config: BenchConfig) -> int:
    for mode in modes:
        print(json.dumps(run_mode(mode, config)), flush=True)
    return 0
