"""Benchmark: `python -m spark_jobs.bench --entries N [--shards S] [--dir DIR]`, one JSON
object on stdout.

1. Writes N engine WAL entries (one committed transaction each: an Append of one row,
   after a create of the database and table) through the real writer: engine entries
   (engine.wal.codec) handed to the real tae_driver `Driver` on the real file backend, in
   commit order, S logs ("shards") of N/S entries each.
   With --dir, WALs generated there before (same N and S: `generated.json`) are reused.
2. Builds the driver JVM's class-data archive when there is none (spark_jobs/jvm_archive.py;
   its cost reported apart), measures a Spark session's start-up alone (built and stopped,
   no job: the JVM's defaults, the lean JVM, the lean JVM with the archive), then runs
   `replay_as_of` (as of the newest commit) and `lsn_audit` on the plain-Python engine
   and on Spark `local[2]`, each as its own `python -m spark_jobs` process.
3. Reports for each run: wall seconds, CPU seconds of the whole process tree (driver, JVM,
   Python workers: sampled from /proc every 100 ms, so a process that lives less than that
   may be missed), entries per CPU-second ("per core"), and the peak RSS of the tree; then
   the ratios the issue targets and a projection for 1 TB of WAL on 100 executors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from logsvc.bench.measure import stat_cpu_s

ENTRIES_MAX = 100_000_000
SUBMIT_AHEAD_MAX = 4096  # entries submitted before waiting (the driver's intake is 8192)
SAMPLE_S = 0.1
RUN_S_MAX = 3600
TB = 10**12
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
GENERATED = "generated.json"  # in --dir: the entries and shards of the WALs there
SESSION_ONLY = (
    "from spark_jobs import jvm_archive; "
    "from spark_jobs.session import LEAN_JVM_CONF, LEAN_JVM_OPTIONS, get_spark, lean_jvm_conf; "
    "get_spark('bench start-up', 'local[2]', {conf}).stop()"
)
SESSION_CONFS = (
    ("jvm_defaults", "None"),
    ("lean_jvm", "LEAN_JVM_CONF"),
    ("lean_jvm_archive", "lean_jvm_conf(jvm_archive.use_option(LEAN_JVM_OPTIONS))"),
)


class BenchRefused(Exception):
    """--dir holds WALs generated with other parameters."""


# --- generating -----------------------------------------------------------------------------------


def entries_of(count: int, ts0: int) -> Any:
    """Engine entries: create database 1 and table 2 (k int64 key, v string), then one
    transaction per entry appending one row; commit_ts rises by 2 each time."""
    from engine import Column, Schema
    from engine.wal.codec import encode_entry
    from engine.wal.entry import (
        Append,
        AppendInfo,
        CatalogKind,
        CatalogOp,
        MemoItem,
        TxnEntry,
        UpdateCatalog,
    )

    schema = Schema([Column("k", "int64"), Column("v", "string")], ["k"])
    create = (
        UpdateCatalog(CatalogKind.DATABASE, CatalogOp.CREATE, 1, 0, "bench", None),
        UpdateCatalog(CatalogKind.TABLE, CatalogOp.CREATE, 1, 2, "kv", schema),
    )
    yield encode_entry(TxnEntry(ts0 - 1, ts0, (MemoItem(1, 0, 0), MemoItem(1, 2, 0)), create))
    arrow = schema.to_arrow()
    block_rows = 8192
    for i in range(count - 1):
        ts = ts0 + 2 * (i + 1)
        batch = pa.RecordBatch.from_arrays([pa.array([i]), pa.array([f"value-{i}"])], schema=arrow)
        info = AppendInfo(1 + i // block_rows, i % block_rows, 1)
        append = Append(1, 2, (info,), batch)
        yield encode_entry(TxnEntry(ts - 1, ts, (MemoItem(1, 2, info.block_id),), (append,)))


async def write_log(wal_dir: str, count: int, ts0: int) -> None:
    from tae_driver import ReplayDecision, open_driver
    from tae_driver.backends.file import FileBackend

    backend = await FileBackend.open(wal_dir)
    try:
        driver = open_driver(backend, window=64)
        await driver.replay(lambda dsn, entry: ReplayDecision.APPLY)
        pending: list[asyncio.Future[int]] = []
        for entry in entries_of(count, ts0):
            pending.append(driver.submit(entry))
            if len(pending) >= SUBMIT_AHEAD_MAX:
                await pending[-1]  # completes in DSN order: every earlier one is durable
                pending.clear()
        if pending:
            await pending[-1]
        await driver.close()
    finally:
        await backend.close()


# --- measuring a process tree ---------------------------------------------------------------------


@dataclass
class Usage:
    wall_s: float
    cpu_s: float
    peak_rss_bytes: int
    peak_python_rss_bytes: int
    """The largest peak RSS of one Python process of the tree (the driver, or a Spark
    Python worker): the issue bounds each worker's at 1 GB."""


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def _sample(root: int) -> dict[int, tuple[float, int, bool]]:
    """(cpu seconds, rss bytes, is a Python process) of `root` and every descendant now."""
    tree = _children()
    out = {}
    stack = [root]
    while stack:
        pid = stack.pop()
        stack.extend(tree.get(pid, []))
        try:
            with open(f"/proc/{pid}/stat") as file:
                text = file.read()
        except OSError:
            continue
        command, stat = text.split("(", 1)[1].rsplit(")", 1)
        fields = stat.split()
        out[pid] = (stat_cpu_s(text), int(fields[21]) * PAGE_BYTES, command.startswith("python"))
    return out


def measure(argv: list[str], env: dict[str, str]) -> tuple[Usage, str]:
    started = time.monotonic()
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    cpu_by_pid: dict[int, float] = {}
    peak = peak_python = 0
    done = threading.Event()

    def sampler() -> None:
        nonlocal peak, peak_python
        while not done.is_set():
            found = _sample(process.pid)
            for pid, (cpu, rss, python) in found.items():
                cpu_by_pid[pid] = max(cpu, cpu_by_pid.get(pid, 0.0))
                if python:
                    peak_python = max(peak_python, rss)
            peak = max(peak, sum(rss for _, rss, _ in found.values()))
            done.wait(SAMPLE_S)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        stdout, stderr = process.communicate(timeout=RUN_S_MAX)
    finally:
        done.set()
        thread.join()
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({process.returncode}): {stderr[-2000:]}")
    return Usage(time.monotonic() - started, sum(cpu_by_pid.values()), peak, peak_python), stdout


# --- the benchmark --------------------------------------------------------------------------------


def run(entries: int, shards: int, base: str, executor_cores: int) -> dict[str, Any]:
    per_shard = entries // shards
    started = time.monotonic()
    wal_dirs = [os.path.join(base, f"shard-{shard}", "wal") for shard in range(shards)]
    marker = os.path.join(base, GENERATED)
    total = per_shard * shards
    reused = os.path.exists(marker)
    if reused:
        with open(marker) as file:
            found = json.load(file)
        if found != {"entries": total, "shards": shards}:
            raise BenchRefused(f"{base} holds WALs of {found}, not {total} entries in {shards}")
    else:
        for wal_dir in wal_dirs:
            asyncio.run(write_log(wal_dir, per_shard, ts0=1_000_000))
        with open(marker, "w") as file:
            json.dump({"entries": total, "shards": shards}, file)
    generate_s = time.monotonic() - started
    wal_bytes = sum(
        os.path.getsize(os.path.join(d, name)) for d in wal_dirs for name in os.listdir(d)
    )
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    runs: list[dict[str, Any]] = []
    archive = _class_archive(env)
    startup = {  # replay_as_of and lsn_audit start the lean one, archived when there is one
        name: measure([sys.executable, "-c", SESSION_ONLY.format(conf=conf)], env)[0]
        for name, conf in SESSION_CONFS
    }
    for job in ("replay_as_of", "lsn_audit"):
        for engine in ("local", "spark"):
            argv = [sys.executable, "-m", "spark_jobs", job, "--engine", engine]
            argv += [f"--file-wal={d}" for d in wal_dirs]
            out = os.path.join(base, "out", f"{engine}-{job}-{os.getpid()}")
            argv += ["--out", out]
            if engine == "spark":
                argv += ["--master", "local[2]"]
            if job == "replay_as_of":
                argv += ["--as-of", str(2**62)]
            try:
                usage, stdout = measure(argv, env)
            finally:
                shutil.rmtree(out, ignore_errors=True)  # its outputs: a reused --dir stays small
            runs.append(
                {
                    "job": job,
                    "engine": engine,
                    "wall_s": round(usage.wall_s, 2),
                    "cpu_s": round(usage.cpu_s, 2),
                    "entries_per_cpu_s": round(total / usage.cpu_s),
                    "entries_per_wall_s": round(total / usage.wall_s),
                    "peak_rss_mib": round(usage.peak_rss_bytes / 2**20),
                    "peak_python_process_rss_mib": round(usage.peak_python_rss_bytes / 2**20),
                    "summary": stdout.strip().splitlines()[0] if stdout.strip() else "",
                }
            )
    rate = {(r["job"], r["engine"]): float(r["entries_per_cpu_s"]) for r in runs}
    spark_cpu = {r["job"]: r["cpu_s"] for r in runs if r["engine"] == "spark"}
    bytes_per_entry = wal_bytes / total
    entries_per_tb = TB / bytes_per_entry
    cores = 100 * executor_cores
    projection = {}
    session_cpu_s = startup["lean_jvm_archive" if archive["used"] else "lean_jvm"].cpu_s
    for job in ("replay_as_of", "lsn_audit"):
        # The session's start-up is paid once per run, not per entry: at 1 TB it vanishes,
        # so the projection's rate leaves it out (every Python worker's start stays in).
        per_core = total / max(spark_cpu[job] - session_cpu_s, SAMPLE_S)
        cpu_s = entries_per_tb / per_core
        projection[job] = {
            "spark_entries_per_cpu_s_after_session_startup": round(per_core),
            "cpu_hours": round(cpu_s / 3600, 1),
            "wall_hours_on_100_executors": round(cpu_s / cores / 3600, 2),
        }
    return {
        "entries": total,
        "shards": shards,
        "wal_bytes": wal_bytes,
        "bytes_per_entry": round(bytes_per_entry, 1),
        "generate_s": round(generate_s, 1),
        "wal_reused": reused,
        "machine_cores": os.cpu_count(),
        "jvm_class_archive": archive,
        "runs": runs,
        "spark_session_startup": {
            "what": "a SparkSession on local[2] built and stopped, no job (JVM start-up); "
            "the jobs measured start the lean one, with the class-data archive when "
            "jvm_class_archive.used",
            **{
                name: {"wall_s": round(usage.wall_s, 2), "cpu_s": round(usage.cpu_s, 2)}
                for name, usage in startup.items()
            },
            "lean_share_of_spark_cpu": {
                job: round(session_cpu_s / cpu, 3) for job, cpu in spark_cpu.items()
            },
        },
        "targets": {
            job: {
                "spark_per_core_over_local_per_core": round(
                    rate[(job, "spark")] / rate[(job, "local")],
                    3,
                ),
                "target_spark_over_local": 0.5,
                "local_entries_per_cpu_s": rate[(job, "local")],
                "target_local_entries_per_cpu_s": 1_000_000,
            }
            for job in ("replay_as_of", "lsn_audit")
        },
        "projection_1tb": {
            "assumes": (
                f"1 TB of WAL at the measured {bytes_per_entry:.0f} bytes per entry "
                f"({entries_per_tb:.3g} entries), 100 executors x {executor_cores} cores "
                "each running at the measured Spark per-core rate less the session's start-up "
                "(spark_session_startup.lean_jvm_archive, or lean_jvm without an archive: paid "
                "once per run), perfect scaling (at least "
                f"{cores} logs, i.e. shard replicas: replay and the audit run one Spark task "
                "per log), storage never the bottleneck"
            ),
            **projection,
        },
    }


def _class_archive(env: dict[str, str]) -> dict[str, Any]:
    """The driver JVM's class-data archive the Spark runs use (spark_jobs/jvm_archive.py),
    built first when there is none (its CPU reported apart: paid once per installation)."""
    from spark_jobs import jvm_archive
    from spark_jobs.session import LEAN_JVM_OPTIONS

    if not jvm_archive.enabled():
        return {"used": False, "why": f"{jvm_archive.ARCHIVE_ENV}=0"}
    built: dict[str, Any] = {}
    if jvm_archive.use_option(LEAN_JVM_OPTIONS) is None:
        try:
            usage, _ = measure([sys.executable, "-m", "spark_jobs.jvm_archive", "build"], env)
        except RuntimeError as exc:  # the runs go without: said in the output
            return {"used": False, "why": str(exc)[-500:]}
        built = {"built_now_cpu_s": round(usage.cpu_s, 2), "built_now_wall_s": round(usage.wall_s)}
    used = jvm_archive.use_option(LEAN_JVM_OPTIONS) is not None
    return {"used": used, "path": jvm_archive.archive_path(LEAN_JVM_OPTIONS), **built}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_jobs.bench")
    parser.add_argument("--entries", type=int, required=True)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument(
        "--dir",
        help="where the WALs go (default: a temporary directory); WALs generated there "
        "before with the same --entries and --shards are reused",
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated WALs")
    parser.add_argument("--executor-cores", type=int, default=4)
    args = parser.parse_args(argv)
    if not 2 <= args.entries <= ENTRIES_MAX or not 1 <= args.shards <= args.entries // 2:
        print(f"--entries in [2, {ENTRIES_MAX}], --shards in [1, entries/2]", file=sys.stderr)
        return 2
    base = args.dir or tempfile.mkdtemp(prefix="spark-jobs-bench-")
    try:
        result = run(args.entries, args.shards, base, args.executor_cores)
    except BenchRefused as exc:
        print(f"--dir: {exc}", file=sys.stderr)
        return 2
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
