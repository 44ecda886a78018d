"""`python -m engine.bench commit`: the engine's commit throughput and latency, with SQLite
measured side by side in the same run. (`scan`: engine/bench/scan.py; `distributed`, compute
nodes over a TN pair on logsvc: engine/bench/distributed.py.)

    python -m engine.bench commit --wal file,memory --writers 1,16,64 --rows 1 --seconds 5
    python -m engine.bench commit --wal logsvc --writers 64 --rows 1,10 --seconds 5

Every transaction inserts `--rows` rows of ~100 B (an int64 primary key and a 92-character
string) into a fresh table. For each (writers, rows) case the same transactions run:

* on the engine over each `--wal` ("engine-file", "engine-logsvc", "engine-memory"): W writer
  coroutines on one event loop, each looping `async with eng.transaction()` + insert; a fresh
  engine in a fresh temporary directory per measurement. Each transaction's rows are one
  `pa.RecordBatch` built just before the transaction starts, outside its latency, from a
  prebuilt payload column and W-disjoint keys (`--input dicts` passes a list of dicts
  instead, as a script would);
* on SQLite (Python's sqlite3) in WAL mode, `synchronous=FULL` ("sqlite-full": durable per
  commit, like the engine over file or logsvc) and `synchronous=NORMAL` ("sqlite-normal":
  not durable, a power loss may drop the last commits): W threads, each with its own
  connection and `busy_timeout`, each looping `BEGIN IMMEDIATE` / insert / `COMMIT`.

Closed loop: a writer starts its next transaction when its previous commit returned, until
`--seconds` have passed (after `--warmup` seconds that are not counted). Prints one JSON line
per measurement: commits and commits/s, latency percentiles (transaction start to commit
return; linear interpolation, logsvc/bench/measure.py), process CPU per commit (all its
threads: for "engine-logsvc" the engine's process only; the cluster's node processes are
reported apart as `cluster_cpu_s`), and for the engine the WAL's group-commit factor (driver
entries per driver record) and Python's cyclic collections per generation
(`gc_collections`). Then one summary line. Timings are reported, never asserted.

`--wal logsvc` starts a local cluster (3 node processes, like `logsvc bench cluster`) in a
temporary directory with one shard per logsvc measurement (so each engine starts on an empty
log: no replay of the previous measurement), and stops it by PID and removes it afterwards,
whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from logsvc.bench.measure import own_cpu_s, percentile, processes_cpu_s

WALS = ("file", "logsvc", "memory")
SQLITE_MODES = ("full", "normal")
INPUTS = ("arrow", "dicts")
GC_CHOICES = ("default", "tuned")
WRITERS_MAX = 1024
"""Writers per measurement: coroutines for the engine, threads (and connections) for SQLite."""
ROWS_MAX = 1000
"""Rows per transaction: 1000 rows of ~100 B stay well below the engine's workspace limit."""
SECONDS_MAX = 3600.0
"""Issue 21's flatness run is 30 minutes (`--seconds 1800`); latencies are kept as 8-byte
doubles, about 70 MB for an hour at 2,500 commits/s."""
RATE_WINDOW_S = 300.0
"""The first and last windows whose rates a measurement compares (`rate_first_window`,
`rate_last_window`): 5 minutes, or a third of a shorter run."""
WARMUP_S_MAX = 60.0
WARMUP_S_DEFAULT = 0.5
ROW_BYTES = 100
PAYLOAD_CHARS = ROW_BYTES - 8
"""The string column's length: with the 8-byte int64 key, ~100 B of row data."""
KEY_STRIDE = 10**9
"""Writer i's keys are i * KEY_STRIDE + 0, 1, 2, ...: unique across writers."""
SQLITE_BUSY_TIMEOUT_MS = 30_000
THREAD_JOIN_SLACK_S = 120.0
"""How long past its run a SQLite writer thread may take to stop before the bench gives up."""
LOGSVC_NODES = 3
DB_NAME = "bench"
TABLE_NAME = "t"

_DURABLE = {
    "engine-file": True,
    "engine-logsvc": True,
    "engine-memory": False,
    "sqlite-full": True,
    "sqlite-normal": False,
}


@dataclass(frozen=True, slots=True)
class Case:
    writers: int
    rows: int
    seconds: float
    warmup: float = WARMUP_S_DEFAULT
    input: str = "arrow"
    preload_rows: int = 0
    """Rows with random keys (disjoint from the writers') committed before the measurement,
    `PRELOAD_TXN_ROWS` a transaction: a table that already holds data in blocks whose key
    ranges overlap (issue 21's cliff and its "flat" target)."""
    history_retention_s: float | None = None
    """The engine's history retention window (decision 0010); None: its default."""
    unmerged: bool = False
    """No merges (flushes and checkpoints still run): every flushed block stays an L1 object
    of its own, so a preload of N rows leaves N / 8,192 blocks whose key ranges all overlap
    (merges would sort them into L2 segments of 16 disjoint blocks: only the segments
    overlap). The worst case for a uniqueness check that probes each overlapping block."""


PRELOAD_TXN_ROWS = 100_000
PRELOAD_KEY_LOW = 2**41
"""Positive preload keys start here, above every writer's (WRITERS_MAX * KEY_STRIDE < it)."""
MERGE_NEVER = 2**31
assert WRITERS_MAX * KEY_STRIDE < PRELOAD_KEY_LOW
"""`merge_l1_blocks` of an `unmerged` case: more L1 blocks than a run makes."""
PRELOAD_ROWS_MAX = 50_000_000
"""A preload is held in memory one transaction at a time; this bounds the run's length."""


class _Recorder:
    """Latencies and errors of one measurement phase."""

    __slots__ = (
        "conflicts",
        "errors",
        "first_error",
        "in_window",
        "latencies_ms",
        "per_second",
        "started",
    )

    def __init__(self, started: float = 0.0) -> None:
        self.latencies_ms = array("d")
        self.started = started
        self.per_second = array("q")
        """Commits that returned in each second of the window, for first/last rates."""
        self.in_window = 0
        """Commits that returned before the deadline: the throughput counts only these."""
        self.errors = 0
        self.conflicts = 0
        """WriteConflicts: the writers' keys are disjoint, so each one is a spurious refusal."""
        self.first_error: str | None = None

    def error(self, exc: BaseException) -> None:
        from engine import WriteConflict

        self.errors += 1
        self.conflicts += isinstance(exc, WriteConflict)
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"

    def returned(self, at: float) -> None:
        """A commit returned within the window at clock time `at`."""
        self.in_window += 1
        second = int(at - self.started)
        per_second = self.per_second
        while len(per_second) <= second:
            per_second.append(0)
        per_second[second] += 1

    def window_rates(self, seconds: float) -> dict[str, Any]:
        """Commits/s in the first and the last `RATE_WINDOW_S` (a third of a shorter run),
        and their ratio: a rate that falls as the table grows shows here."""
        whole = int(seconds)
        width = int(min(RATE_WINDOW_S, whole // 3))
        if width < 1:
            return {"rate_window_s": None}
        counts = list(self.per_second[:whole]) + [0] * max(0, whole - len(self.per_second))
        first = sum(counts[:width]) / width
        last = sum(counts[whole - width : whole]) / width
        return {
            "rate_window_s": width,
            "rate_first_window": round(first, 1),
            "rate_last_window": round(last, 1),
            "last_over_first": round(last / first, 3) if first else None,
        }


def _result(
    system: str,
    case: Case,
    elapsed: float,
    recorder: _Recorder,
    cpu_s: float,
    cpu_scope: str,
) -> dict[str, Any]:
    """`elapsed` runs from the start to the last writer's return; throughput counts the
    commits that returned within `case.seconds`, latencies every commit (the drain's too:
    a writer starved past the deadline shows in the tail instead of vanishing)."""
    samples = sorted(recorder.latencies_ms)
    commits = recorder.in_window
    window = case.seconds
    return {
        "bench": "commit",
        "system": system,
        "writers": case.writers,
        "rows_per_txn": case.rows,
        "seconds": round(window, 3),
        "drain_s": round(max(0.0, elapsed - window), 3),
        "commits": commits,
        "commits_per_s": round(commits / window, 1),
        "rows_per_s": round(commits * case.rows / window, 1),
        "p50_ms": percentile(samples, 0.50),
        "p99_ms": percentile(samples, 0.99),
        "p999_ms": percentile(samples, 0.999),
        "max_ms": round(samples[-1], 3) if samples else None,
        # CPU over the whole measurement (drain included) per commit that returned in it.
        "cpu_us_per_commit": round(cpu_s * 1e6 / len(samples), 1) if samples else None,
        "cpu_scope": cpu_scope,
        "durable": _DURABLE[system],
        "errors": recorder.errors,
        "write_conflicts": recorder.conflicts,
        "first_error": recorder.first_error,
        "preload_rows": case.preload_rows,
        "case_preload_rows": case.preload_rows,
        # Per-second counts are the engine's (SQLite's threads count a total only).
        **(recorder.window_rates(window) if recorder.per_second else {"rate_window_s": None}),
    }


# --- rows -----------------------------------------------------------------------------------


class _Rows:
    """Builds one transaction's rows cheaply: the payload column is built once, only the keys
    change."""

    def __init__(self, rows: int, kind: str) -> None:
        assert kind in INPUTS
        self.rows = rows
        self.kind = kind
        self.payload = "x" * PAYLOAD_CHARS
        self._payload_column = pa.array([self.payload] * rows, type=pa.string())
        self._names = ["id", "payload"]

    def build(self, first_key: int) -> object:
        if self.kind == "dicts":
            return [
                {"id": k, "payload": self.payload} for k in range(first_key, first_key + self.rows)
            ]
        keys = pa.array(range(first_key, first_key + self.rows), type=pa.int64())
        return pa.RecordBatch.from_arrays([keys, self._payload_column], names=self._names)

    def params(self, first_key: int) -> list[tuple[int, str]]:
        return [(k, self.payload) for k in range(first_key, first_key + self.rows)]


# --- the engine ------------------------------------------------------------------------------


async def measure_engine(
    wal: str,
    case: Case,
    *,
    dir_path: str | None = None,
    client_config: str | None = None,
    shard: int = 1,
    cluster_pids: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One measurement on a fresh engine over `wal` (over logsvc: `shard` of the running
    cluster in `client_config`, whose node processes `cluster_pids` are)."""
    from engine import Column, Engine, EngineError, Schema
    from engine.compaction import Policy

    assert wal in WALS
    base = tempfile.mkdtemp(prefix=f"engine-bench-{wal}-", dir=dir_path)
    window = (
        None
        if case.history_retention_s is None
        else datetime.timedelta(seconds=case.history_retention_s)
    )
    try:
        if wal == "logsvc":
            assert client_config is not None
            eng = await Engine.open(
                base,
                wal="logsvc",
                client_config=client_config,
                shard=shard,
                history_retention=window,
            )
        else:
            policy = Policy(merge_l1_blocks=MERGE_NEVER) if case.unmerged else None
            eng = await Engine.open(base, wal=wal, history_retention=window, policy=policy)
        try:
            async with eng.transaction() as txn:
                await txn.create_database(DB_NAME)
                await txn.create_table(
                    DB_NAME,
                    TABLE_NAME,
                    Schema(
                        [Column("id", "int64"), Column("payload", "string")], primary_key=["id"]
                    ),
                )
            await _preload(eng, case.preload_rows, unmerged=case.unmerged)
            table_state = _table_state(eng)
            rows = _Rows(case.rows, case.input)
            next_key = [i * KEY_STRIDE for i in range(case.writers)]
            clock = time.perf_counter

            async def writer(index: int, deadline: float, recorder: _Recorder) -> None:
                while clock() < deadline:
                    data = rows.build(next_key[index])
                    next_key[index] += case.rows
                    began = clock()
                    try:
                        async with eng.transaction() as txn:
                            await txn.table(DB_NAME, TABLE_NAME).insert(data)
                    except EngineError as exc:
                        recorder.error(exc)
                        if getattr(eng, "failed", None) is not None:
                            return  # read-only now: every further commit would fail at once
                        continue
                    ended = clock()
                    recorder.latencies_ms.append((ended - began) * 1000.0)
                    if ended <= deadline:
                        recorder.returned(ended)

            async def phase(seconds: float) -> _Recorder:
                recorder = _Recorder(clock())
                deadline = recorder.started + seconds
                await asyncio.gather(*(writer(i, deadline, recorder) for i in range(case.writers)))
                return recorder

            if case.warmup > 0:
                await phase(case.warmup)
            wal_high: dict[str, Any] = {"entries": 0, "bytes": None}
            checkpointer = eng.checkpointer
            checkpoints_before = checkpointer.taken if checkpointer is not None else 0
            driver_stats: Callable[[], Any] | None = getattr(eng, "driver_stats", None)
            before = driver_stats() if driver_stats is not None else None
            cluster_before = processes_cpu_s(cluster_pids or {})
            gc_before = [stats["collections"] for stats in gc.get_stats()]
            cpu_before = own_cpu_s()
            started = clock()
            sampler = asyncio.get_running_loop().create_task(_sample_wal(eng, wal_high))
            try:
                recorder = await phase(case.seconds)
            finally:
                sampler.cancel()
            elapsed = clock() - started
            cpu = own_cpu_s() - cpu_before
            gc_after = [stats["collections"] for stats in gc.get_stats()]
            cluster_after = processes_cpu_s(cluster_pids or {})
            after = driver_stats() if driver_stats is not None else None
            checkpoints = (
                checkpointer.taken if checkpointer is not None else 0
            ) - checkpoints_before
            stored = _stored_bytes(eng)
        finally:
            await eng.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    scope = "engine process only" if wal == "logsvc" else "process"
    result = _result(f"engine-{wal}", case, elapsed, recorder, cpu, scope)
    result["input"] = case.input
    result["unmerged"] = case.unmerged
    result.update(table_state)
    if before is not None and after is not None:
        entries = after.dsn - before.dsn
        records = after.records_appended - before.records_appended
        result["wal_entries"] = entries
        result["wal_records"] = records
        result["wal_entries_per_record"] = round(entries / records, 2) if records else None
    else:
        result["wal_entries_per_record"] = None  # the engine has no driver_stats()
    # The WAL stays a window: its high-water mark while the checkpoints truncate it.
    result["wal_retained_entries_max"] = wal_high["entries"]
    result["wal_retained_bytes_max"] = wal_high["bytes"]
    result["checkpoints"] = checkpoints
    # Python's cyclic collections during the measured phase, by generation: a full one
    # (the last) stops the loop for tens of ms, a p99 (issue 21: a commit left in a
    # reference cycle tripled the first count).
    result["gc_collections"] = [
        after - before for before, after in zip(gc_before, gc_after, strict=True)
    ]
    # What the run left stored: bounded by the history retention window (decision 0010),
    # which a run longer than the window shows.
    result.update(stored)
    if cluster_pids:
        cluster_cpu = sum(cluster_after.values()) - sum(cluster_before.values())
        result["cluster_cpu_s"] = round(cluster_cpu, 3)
        done = len(recorder.latencies_ms)
        result["cluster_cpu_us_per_commit"] = round(cluster_cpu * 1e6 / done, 1) if done else None
        result["shard"] = shard
    return result


async def _preload(eng: Any, rows: int, *, unmerged: bool = False) -> None:
    """`rows` rows with random keys on both sides of the writers' (which are in
    [0, WRITERS_MAX * KEY_STRIDE)), so every preloaded block's key range holds every key a
    writer inserts (issue 21: ranges that overlap), then the maintenance settled.

    In transactions of `PRELOAD_TXN_ROWS` (issue 21's cliff): each is written as one sorted
    object before it commits (a large transaction, engine/spill.py) whose blocks' ranges are
    disjoint, so a writer's key is in the range of one block per transaction. `unmerged`: in
    transactions of one block (`BLOCK_ROWS_MAX`, under the spill threshold), each flushed to
    an object of its own and never merged: every block's range holds a writer's key."""
    from engine import limits

    generator = np.random.default_rng(21)
    payload = "x" * PAYLOAD_CHARS
    txn_rows = limits.BLOCK_ROWS_MAX if unmerged else PRELOAD_TXN_ROWS
    for first in range(0, rows, txn_rows):
        count = min(txn_rows, rows - first)
        # Distinct within a transaction; across them a repeat has odds ~rows**2 / 2**63.
        keys = generator.choice(2**62, size=count, replace=False)
        keys = np.where(keys % 2 == 0, -keys - 1, keys + PRELOAD_KEY_LOW)
        batch = pa.RecordBatch.from_arrays(
            [pa.array(keys, type=pa.int64()), pa.array([payload] * count, type=pa.string())],
            names=["id", "payload"],
        )
        async with eng.transaction() as txn:
            await txn.table(DB_NAME, TABLE_NAME).insert(batch)
    if rows and eng.maintenance is not None:
        await eng.maintenance.settle(freeze_all=True)


def _table_state(eng: Any) -> dict[str, Any]:
    """The table the writers insert into, as they start: its persisted blocks, how many of
    them a writer's key falls in the key range of (what a check by range and bloom probes),
    and the key index's size (engine/storage/keyindex.py)."""
    (table,) = [t for t in eng.state.catalog.tables.values() if t.name == TABLE_NAME]
    data = table.data
    live = [b for b in data.persisted_blocks() if b.visible(eng.visible_ts)]
    index = getattr(data, "key_index", None)
    return {
        "persisted_blocks": len(live),
        "blocks_whose_range_holds_a_writer_key": sum(1 for b in live if b.may_hold(KEY_STRIDE)),
        "key_index_blocks": len(index) if index is not None else None,
        "key_index_bytes": index.size_bytes() if index is not None else None,
    }


WAL_SAMPLE_S = 1.0
"""How often a commit measurement samples what the WAL retains."""


def _stored_bytes(eng: Any) -> dict[str, Any]:
    """The WAL's bytes (where this process can see them), the object store's bytes and
    objects, the history window and how far back a snapshot reads, at the end of a run."""
    from engine import metrics

    checkpointer = eng.checkpointer
    store = eng.block_store.store if eng.block_store is not None else None
    objects = store.list("") if store is not None else []
    return {
        "history_retention_ms": (
            checkpointer.history_retention_ms if checkpointer is not None else None
        ),
        "wal_bytes_end": metrics.wal_bytes(eng.backend),
        "object_bytes_end": sum(info.size_bytes for info in objects),
        "objects_end": len(objects),
        "checkpoints_retained_end": len(checkpointer.retained) if checkpointer else 0,
        # How far back a snapshot reads (None: to the first commit, no checkpoint old enough).
        "history_s_end": (
            round(((eng.visible_ts >> 16) - (eng.oldest_ts >> 16)) / 1000, 1)
            if eng.oldest_ts
            else None
        ),
    }


async def _sample_wal(eng: Any, high: dict[str, Any]) -> None:
    """Keep in `high` the most entries (and bytes, where this process can see them) the
    WAL retained, sampled every WAL_SAMPLE_S until cancelled."""
    from engine import metrics

    while True:
        high["entries"] = max(high["entries"], metrics.wal_entries_retained(eng))
        size = metrics.wal_bytes(eng.backend)
        if size is not None:
            high["bytes"] = max(high["bytes"] or 0, size)
        await asyncio.sleep(WAL_SAMPLE_S)


# --- SQLite -----------------------------------------------------------------------------------


def measure_sqlite(mode: str, case: Case, *, dir_path: str | None = None) -> dict[str, Any]:
    """One measurement on a fresh SQLite database in WAL mode with `synchronous=<mode>`: one
    thread per writer, each on its own connection."""
    assert mode in SQLITE_MODES
    base = tempfile.mkdtemp(prefix=f"engine-bench-sqlite-{mode}-", dir=dir_path)
    try:
        result = _drive_sqlite(mode, case, os.path.join(base, "bench.db"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result["preload_rows"] = 0  # the empty-table peer: only the engine's table is preloaded
    return result


def _connect(path: str, mode: str) -> sqlite3.Connection:
    # isolation_level=None: the module issues no BEGIN of its own; we write BEGIN IMMEDIATE.
    conn = sqlite3.connect(path, isolation_level=None, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    conn.execute(f"PRAGMA synchronous = {mode.upper()}")
    return conn


def _drive_sqlite(mode: str, case: Case, path: str) -> dict[str, Any]:
    setup = _connect(path, mode)
    try:
        (journal,) = setup.execute("PRAGMA journal_mode = WAL").fetchone()
        assert str(journal).lower() == "wal", journal
        setup.execute(f"CREATE TABLE {TABLE_NAME} (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    finally:
        setup.close()
    rows = _Rows(case.rows, "arrow")
    insert = f"INSERT INTO {TABLE_NAME} (id, payload) VALUES (?, ?)"
    clock = time.perf_counter
    timing: dict[str, float] = {}
    warm, measured = _Recorder(), _Recorder()
    failures: list[BaseException] = []
    recorder_lock = threading.Lock()

    def start_warmup() -> None:
        timing["warm_deadline"] = clock() + case.warmup

    def start_measuring() -> None:
        timing["cpu_before"] = own_cpu_s()
        timing["started"] = clock()
        timing["deadline"] = timing["started"] + case.seconds

    connected = threading.Barrier(case.writers, action=start_warmup)
    warmed = threading.Barrier(case.writers, action=start_measuring)

    def loop(conn: sqlite3.Connection, key: list[int], deadline: float, rec: _Recorder) -> None:
        mine = array("d")
        in_window = 0
        try:
            while clock() < deadline:
                params = rows.params(key[0])
                key[0] += case.rows
                began = clock()
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        conn.executemany(insert, params)
                        conn.execute("COMMIT")
                    except BaseException:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        raise
                except sqlite3.OperationalError as exc:  # "database is locked": counted
                    with recorder_lock:
                        rec.error(exc)
                    continue
                ended = clock()
                mine.append((ended - began) * 1000.0)
                if ended <= deadline:
                    in_window += 1
        finally:
            with recorder_lock:
                rec.latencies_ms.extend(mine)
                rec.in_window += in_window

    def writer(index: int) -> None:
        conn: sqlite3.Connection | None = None
        try:
            conn = _connect(path, mode)
            key = [index * KEY_STRIDE]
            connected.wait()
            loop(conn, key, timing["warm_deadline"], warm)
            warmed.wait()
            loop(conn, key, timing["deadline"], measured)
        except threading.BrokenBarrierError:
            pass  # another writer failed
        except BaseException as exc:
            failures.append(exc)
            connected.abort()
            warmed.abort()
        finally:
            if conn is not None:
                conn.close()

    threads = [
        threading.Thread(target=writer, args=(i,), name=f"sqlite-writer-{i}", daemon=True)
        for i in range(case.writers)
    ]
    for thread in threads:
        thread.start()
    join_by = time.monotonic() + case.warmup + case.seconds + THREAD_JOIN_SLACK_S
    for thread in threads:
        thread.join(max(0.0, join_by - time.monotonic()))
    ended = clock()
    cpu_after = own_cpu_s()
    if failures:
        raise failures[0]
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError(f"sqlite-{mode}: writer threads still running after {join_by} s")
    elapsed = ended - timing["started"]
    cpu = cpu_after - timing["cpu_before"]
    return _result(f"sqlite-{mode}", case, elapsed, measured, cpu, "process")


# --- a local logsvc cluster -------------------------------------------------------------------


@contextlib.contextmanager
def local_cluster(shards: int, dir_path: str | None = None) -> Iterator[tuple[str, dict[str, int]]]:
    """A local dev cluster (3 node processes) with `shards` shards; yields its client.toml and
    its node PIDs. Stops the nodes by PID and removes the directory whatever happens."""
    from logsvc import devcluster

    base = tempfile.mkdtemp(prefix="engine-bench-logsvc-", dir=dir_path)
    try:
        devcluster.up(base, nodes=LOGSVC_NODES, shards=shards)
        yield os.path.join(base, "client.toml"), devcluster.read_pids(base)
    finally:
        devcluster.down(base)
        shutil.rmtree(base, ignore_errors=True)


# --- the command ------------------------------------------------------------------------------


def run(
    wals: Sequence[str],
    sqlite_modes: Sequence[str],
    writers: Sequence[int],
    rows: Sequence[int],
    seconds: float,
    *,
    warmup: float = WARMUP_S_DEFAULT,
    input_kind: str = "arrow",
    dir_path: str | None = None,
    emit: Callable[[dict[str, Any]], None] | None = None,
    preload_rows: Sequence[int] = (0,),
    history_retention_s: float | None = None,
    unmerged: bool = False,
) -> list[dict[str, Any]]:
    """Every (preload, rows, writers) case on every system, in that order, so the systems'
    lines of one case are adjacent. Returns the measurement lines (each also passed to
    `emit`). SQLite's tables are not preloaded: its figure is the empty-table peer."""
    cases = [
        Case(w, r, seconds, warmup, input_kind, preload, history_retention_s, unmerged)
        for preload in preload_rows
        for r in rows
        for w in writers
    ]
    results: list[dict[str, Any]] = []

    def record(result: dict[str, Any]) -> None:
        results.append(result)
        if emit is not None:
            emit(result)

    with contextlib.ExitStack() as stack:
        client_config: str | None = None
        pids: dict[str, int] | None = None
        if "logsvc" in wals:
            client_config, pids = stack.enter_context(local_cluster(len(cases), dir_path))
        for number, case in enumerate(cases, start=1):
            for wal in wals:
                record(
                    asyncio.run(
                        measure_engine(
                            wal,
                            case,
                            dir_path=dir_path,
                            client_config=client_config,
                            shard=number,
                            cluster_pids=pids if wal == "logsvc" else None,
                        )
                    )
                )
            for mode in sqlite_modes:
                record(measure_sqlite(mode, case, dir_path=dir_path))
    return results


def summary(results: Sequence[dict[str, Any]], **params: Any) -> dict[str, Any]:
    """One line: per case, commits/s and p99 by system, and each engine's commits/s over
    sqlite-full's (the durable baseline)."""
    by_case: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for r in results:
        key = (r["writers"], r["rows_per_txn"], r["case_preload_rows"])
        by_case.setdefault(key, {})[r["system"]] = r
    empty: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for (writers, rows, preload), systems in by_case.items():
        if preload == 0:
            empty[(writers, rows)] = systems
    cases = []
    for (writers, rows, preload), systems in by_case.items():
        baseline = systems.get("sqlite-full", {}).get("commits_per_s")
        # The engine's rate on the preloaded table over its rate on the empty one, same run
        # (issue 21 target 4: >= 0.9).
        peers = empty.get((writers, rows), {}) if preload else {}
        cases.append(
            {
                "writers": writers,
                "rows_per_txn": rows,
                "preload_rows": preload,
                "vs_empty_table": {
                    s: round(r["commits_per_s"] / peers[s]["commits_per_s"], 3)
                    for s, r in systems.items()
                    if s.startswith("engine-") and s in peers and peers[s]["commits_per_s"]
                },
                "write_conflicts": {s: r["write_conflicts"] for s, r in systems.items()},
                "commits_per_s": {s: r["commits_per_s"] for s, r in systems.items()},
                "p99_ms": {s: r["p99_ms"] for s, r in systems.items()},
                "vs_sqlite_full": {
                    s: round(r["commits_per_s"] / baseline, 2)
                    for s, r in systems.items()
                    if s.startswith("engine-") and baseline and r["commits_per_s"] is not None
                },
            }
        )
    return {
        "bench": "commit",
        "summary": True,
        "measurements": len(results),
        "errors": sum(r["errors"] for r in results),
        "cpus": os.cpu_count(),
        "sqlite_version": sqlite3.sqlite_version,
        **params,
        "cases": cases,
    }
