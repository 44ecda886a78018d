"""`python -m engine.bench commit`: the engine's commit throughput and latency, with SQLite
measured side by side in the same run. (`scan`: engine/bench_scan.py; `distributed`, compute
nodes over a TN pair on logsvc: engine/bench_distributed.py.)

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
return), process CPU per commit (`time.process_time()`: for "engine-logsvc" the engine's
process only; the cluster's node processes are reported apart as `cluster_cpu_s`), and for
the engine the WAL's group-commit factor (driver entries per driver record). Then one summary
line. Timings are reported, never asserted.

`--wal logsvc` starts a local cluster (3 node processes, like `logsvc bench cluster`) in a
temporary directory with one shard per logsvc measurement (so each engine starts on an empty
log: no replay of the previous measurement), and stops it by PID and removes it afterwards,
whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

WALS = ("file", "logsvc", "memory")
SQLITE_MODES = ("full", "normal")
INPUTS = ("arrow", "dicts")
GC_CHOICES = ("default", "tuned")
WRITERS_MAX = 1024
"""Writers per measurement: coroutines for the engine, threads (and connections) for SQLite."""
ROWS_MAX = 1000
"""Rows per transaction: 1000 rows of ~100 B stay well below the engine's workspace limit."""
SECONDS_MAX = 600.0
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


PRELOAD_TXN_ROWS = 100_000
PRELOAD_ROWS_MAX = 50_000_000
"""A preload is held in memory one transaction at a time; this bounds the run's length."""


class _Recorder:
    """Latencies and errors of one measurement phase."""

    __slots__ = ("conflicts", "errors", "first_error", "in_window", "latencies_ms")

    def __init__(self) -> None:
        self.latencies_ms = array("d")
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


def percentile_of_sorted(sorted_ms: Sequence[float], fraction: float) -> float | None:
    """The `fraction` quantile of ascending `sorted_ms` (nearest rank), rounded to 3 places."""
    if not sorted_ms:
        return None
    return round(sorted_ms[min(len(sorted_ms) - 1, int(fraction * len(sorted_ms)))], 3)


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
        "p50_ms": percentile_of_sorted(samples, 0.50),
        "p99_ms": percentile_of_sorted(samples, 0.99),
        "p999_ms": percentile_of_sorted(samples, 0.999),
        "max_ms": round(samples[-1], 3) if samples else None,
        # CPU over the whole measurement (drain included) per commit that returned in it.
        "cpu_us_per_commit": round(cpu_s * 1e6 / len(samples), 1) if samples else None,
        "cpu_scope": cpu_scope,
        "durable": _DURABLE[system],
        "errors": recorder.errors,
        "write_conflicts": recorder.conflicts,
        "first_error": recorder.first_error,
        "preload_rows": case.preload_rows,
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
            eng = await Engine.open(base, wal=wal, history_retention=window)
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
            await _preload(eng, case.preload_rows)
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
                        recorder.in_window += 1

            async def phase(seconds: float) -> _Recorder:
                recorder = _Recorder()
                deadline = clock() + seconds
                await asyncio.gather(*(writer(i, deadline, recorder) for i in range(case.writers)))
                return recorder

            if case.warmup > 0:
                await phase(case.warmup)
            wal_high: dict[str, Any] = {"entries": 0, "bytes": None}
            checkpointer = eng.checkpointer
            checkpoints_before = checkpointer.taken if checkpointer is not None else 0
            driver_stats: Callable[[], Any] | None = getattr(eng, "driver_stats", None)
            before = driver_stats() if driver_stats is not None else None
            cluster_before = cpu_of(cluster_pids)
            cpu_before = time.process_time()
            started = clock()
            sampler = asyncio.get_running_loop().create_task(_sample_wal(eng, wal_high))
            try:
                recorder = await phase(case.seconds)
            finally:
                sampler.cancel()
            elapsed = clock() - started
            cpu = time.process_time() - cpu_before
            cluster_after = cpu_of(cluster_pids)
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


async def _preload(eng: Any, rows: int) -> None:
    """`rows` rows with random negative keys (the writers' are non-negative), in
    transactions of `PRELOAD_TXN_ROWS`, then the maintenance settled (flushed, merged)."""
    generator = np.random.default_rng(21)
    payload = "x" * PAYLOAD_CHARS
    for first in range(0, rows, PRELOAD_TXN_ROWS):
        count = min(PRELOAD_TXN_ROWS, rows - first)
        keys = -generator.choice(2**62, size=count, replace=False) - 1
        batch = pa.RecordBatch.from_arrays(
            [pa.array(keys, type=pa.int64()), pa.array([payload] * count, type=pa.string())],
            names=["id", "payload"],
        )
        async with eng.transaction() as txn:
            await txn.table(DB_NAME, TABLE_NAME).insert(batch)
    if rows and eng.maintenance is not None:
        await eng.maintenance.settle()


WAL_SAMPLE_S = 1.0
"""How often a commit measurement samples what the WAL retains."""


def _stored_bytes(eng: Any) -> dict[str, Any]:
    """The WAL's bytes (where this process can see them), the object store's bytes and
    objects, the history window and how far back a snapshot reads, at the end of a run."""
    from engine import metrics

    checkpointer = eng.checkpointer
    store = eng._block_store.store if eng._block_store is not None else None
    objects = store.list("") if store is not None else []
    return {
        "history_retention_ms": (
            checkpointer.history_retention_ms if checkpointer is not None else None
        ),
        "wal_bytes_end": metrics.wal_bytes(eng._backend),
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
        size = metrics.wal_bytes(eng._backend)
        if size is not None:
            high["bytes"] = max(high["bytes"] or 0, size)
        await asyncio.sleep(WAL_SAMPLE_S)


def cpu_of(pids: dict[str, int] | None) -> dict[str, float]:
    """CPU seconds (user + system) of each process, from /proc (Linux)."""
    out: dict[str, float] = {}
    for name, pid in (pids or {}).items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


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
        timing["cpu_before"] = time.process_time()
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
    cpu_after = time.process_time()
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
) -> list[dict[str, Any]]:
    """Every (preload, rows, writers) case on every system, in that order, so the systems'
    lines of one case are adjacent. Returns the measurement lines (each also passed to
    `emit`). SQLite's tables are not preloaded: its figure is the empty-table peer."""
    cases = [
        Case(w, r, seconds, warmup, input_kind, preload, history_retention_s)
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
    by_case: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for r in results:
        by_case.setdefault((r["writers"], r["rows_per_txn"]), {})[r["system"]] = r
    cases = []
    for (writers, rows), systems in by_case.items():
        baseline = systems.get("sqlite-full", {}).get("commits_per_s")
        cases.append(
            {
                "writers": writers,
                "rows_per_txn": rows,
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


def _csv(kind: Callable[[str], Any], choices: Sequence[str] | None = None) -> Callable[[str], Any]:
    def parse(text: str) -> list[Any]:
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        if choices is not None:
            if items == ["none"]:
                return []
            for item in items:
                if item not in choices:
                    raise argparse.ArgumentTypeError(f"{item!r} is not one of {', '.join(choices)}")
        try:
            values = [kind(item) for item in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return list(dict.fromkeys(values))  # duplicates once, order kept

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commit = commands.add_parser("commit", help="commit throughput and latency vs SQLite")
    commit.add_argument(
        "--wal",
        type=_csv(str, WALS),
        default=["file"],
        help="engine WALs, a comma list of file, logsvc, memory, or none (default: file)",
    )
    commit.add_argument(
        "--sqlite",
        type=_csv(str, SQLITE_MODES),
        default=list(SQLITE_MODES),
        help="SQLite synchronous modes, a comma list of full, normal, or none (default both)",
    )
    commit.add_argument("--writers", type=_csv(int), default=[1, 16, 64])
    commit.add_argument("--rows", type=_csv(int), default=[1], help="rows per transaction")
    commit.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    commit.add_argument(
        "--warmup", type=float, default=WARMUP_S_DEFAULT, help="uncounted seconds before each"
    )
    commit.add_argument(
        "--input",
        choices=INPUTS,
        default="arrow",
        help="how the engine gets each transaction's rows: a pa.RecordBatch or a list of dicts",
    )
    commit.add_argument(
        "--gc",
        choices=GC_CHOICES,
        default="default",
        help="'tuned': logsvc.gc_tuning.tune_for_latency() first (as `logsvc bench cluster`)",
    )
    commit.add_argument(
        "--preload-rows",
        type=_csv(int),
        default=[0],
        help="rows with random keys in the engine's table before each measurement, a comma "
        "list (issue 21: the rate must stay flat as the table grows; default 0)",
    )
    commit.add_argument(
        "--history-retention-s",
        type=float,
        default=None,
        help="the engine's history retention window (default: the engine's, an hour); the "
        "end-of-run wal_bytes_end and object_bytes_end stay bounded by it",
    )
    commit.add_argument("--dir", default=None, help="where temporary directories go")
    scan = commands.add_parser("scan", help="reads over checkpointed blocks vs DuckDB")
    scan.add_argument("--rows", type=int, default=1_000_000)
    scan.add_argument("--batch-rows", type=int, default=20_000, help="rows per load txn")
    scan.add_argument("--lookups", type=int, default=200, help="point lookups per run")
    scan.add_argument("--repeat", type=int, default=5, help="runs of each query")
    scan.add_argument("--tail-mb", type=float, default=0.0, help="WAL tail before restart")
    scan.add_argument("--cache-mb", type=int, default=256, help="the engine's buffer cache")
    scan.add_argument("--no-duckdb", action="store_true", help="the engine's figures only")
    scan.add_argument("--no-sql", action="store_true", help="skip the queries through eng.sql")
    scan.add_argument("--dir", default=None, help="where temporary directories go")
    dist = commands.add_parser(
        "distributed", help="two CNs over a TN pair on logsvc: commits, freshness, failover"
    )
    dist.add_argument("--writers", type=int, default=16, help="writer coroutines per CN")
    dist.add_argument("--seconds", type=float, default=10.0, help="the commit measurement")
    dist.add_argument("--warmup", type=float, default=1.0, help="uncounted seconds before it")
    dist.add_argument("--rows", type=int, default=10_000_000, help="the cold start's table")
    dist.add_argument("--load-batch-rows", type=int, default=200_000, help="rows per load txn")
    dist.add_argument("--probes", type=int, default=200, help="idle freshness commits")
    dist.add_argument("--dir", default=None, help="where temporary directories go")
    return parser


def main(argv: list[str] | None = None) -> int:
    if not __debug__:
        print("engine.bench refuses to run under python -O (asserts stay on)", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)

    def emit(line: dict[str, Any]) -> None:
        print(json.dumps(line), flush=True)

    if args.command == "scan":
        from engine import bench_scan

        if not 1 <= args.rows <= 100_000_000 or not 1 <= args.batch_rows <= 100_000:
            parser.error("--rows must be in [1, 1e8] and --batch-rows in [1, 1e5]")
        emit(bench_scan.run(args, emit))
        return 0
    if args.command == "distributed":
        from engine import bench_distributed as dist

        if not 1 <= args.writers <= dist.WRITERS_MAX:
            parser.error(f"--writers must be in [1, {dist.WRITERS_MAX}]")
        if not 0 < args.seconds <= SECONDS_MAX or not 0 <= args.warmup <= WARMUP_S_MAX:
            parser.error(
                f"--seconds must be in (0, {SECONDS_MAX}], --warmup in [0, {WARMUP_S_MAX}]"
            )
        if not 1 <= args.rows <= dist.ROWS_MAX:
            parser.error(f"--rows must be in [1, {dist.ROWS_MAX}]")
        if not 1 <= args.load_batch_rows <= dist.LOAD_BATCH_ROWS_MAX:
            parser.error(f"--load-batch-rows must be in [1, {dist.LOAD_BATCH_ROWS_MAX}]")
        if not 1 <= args.probes <= dist.PROBES_MAX:
            parser.error(f"--probes must be in [1, {dist.PROBES_MAX}]")
        options = dist.Options(
            writers=args.writers,
            seconds=args.seconds,
            warmup=args.warmup,
            rows=args.rows,
            load_batch_rows=args.load_batch_rows,
            probes=args.probes,
            dir_path=args.dir,
        )
        emit(dist.run(options, emit))
        return 0
    if not args.wal and not args.sqlite:
        parser.error("nothing to measure: --wal none and --sqlite none")
    if not all(1 <= w <= WRITERS_MAX for w in args.writers):
        parser.error(f"--writers must each be in [1, {WRITERS_MAX}]")
    if not all(1 <= r <= ROWS_MAX for r in args.rows):
        parser.error(f"--rows must each be in [1, {ROWS_MAX}]")
    if not 0 < args.seconds <= SECONDS_MAX:
        parser.error(f"--seconds must be in (0, {SECONDS_MAX}]")
    if not 0 <= args.warmup <= WARMUP_S_MAX:
        parser.error(f"--warmup must be in [0, {WARMUP_S_MAX}]")
    from engine import limits

    window_s_max = limits.HISTORY_RETENTION_MS_MAX / 1000
    if args.history_retention_s is not None and not 0 <= args.history_retention_s <= window_s_max:
        parser.error(f"--history-retention-s must be in [0, {window_s_max:g}]")
    if any(not 0 <= n <= PRELOAD_ROWS_MAX for n in args.preload_rows):
        parser.error(f"--preload-rows must be in [0, {PRELOAD_ROWS_MAX}]")
    if "logsvc" in args.wal:
        from logsvc.devcluster import SHARDS_MAX

        if len(args.writers) * len(args.rows) * len(args.preload_rows) > SHARDS_MAX:
            parser.error(f"--wal logsvc takes at most {SHARDS_MAX} (writers, rows) cases")
    if args.gc == "tuned":
        from logsvc import gc_tuning

        gc_tuning.tune_for_latency()

    started = time.monotonic()
    results = run(
        args.wal,
        args.sqlite,
        args.writers,
        args.rows,
        args.seconds,
        warmup=args.warmup,
        input_kind=args.input,
        dir_path=args.dir,
        emit=emit,
        preload_rows=args.preload_rows,
        history_retention_s=args.history_retention_s,
    )
    emit(
        summary(
            results,
            input=args.input,
            gc=args.gc,
            row_bytes=ROW_BYTES,
            total_s=round(time.monotonic() - started, 1),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
