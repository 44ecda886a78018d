"""Every job on Spark (local[1], one shared session) writes what the local engine writes, on
logs written by the real writers; replay_as_of on Spark equals the engine's own snapshot
scans; the Data Source applies pushed filters and Spark re-checks them; and one job runs
unchanged under `spark-submit --master local[2]`.

Logs: a real 3-node logsvc cluster (several shards; shard 2 with a duplicate copy and a DSN
gap; replica n3 of shard 1 diverging and lagging) and a real engine's file WAL
(tests/unit/spark_jobs/logs.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from spark_jobs import output
from spark_jobs.errors import InputCorrupt
from spark_jobs.inputs import file_input, logsvc_input
from spark_jobs.jobs import JobParams
from spark_jobs.run import run_job
from spark_jobs.session import LEAN_JVM_OPTIONS
from spark_jobs.walread import LEVEL_AUDIT, ReadOptions, read_level
from tests.unit.spark_jobs.logs import (
    History,
    LogsvcLogs,
    StorageHistory,
    anomalies_log,
    engine_history,
    kv_entries,
    logsvc_history,
    records_of,
    storage_history,
    write_file_wal,
)

SPARK_SUBMIT_S_MAX = 240


@pytest.fixture(scope="module")
def logsvc_logs(tmp_path_factory: pytest.TempPathFactory) -> LogsvcLogs:
    return logsvc_history(str(tmp_path_factory.mktemp("logsvc")))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return engine_history(str(tmp_path_factory.mktemp("engine")), big_rows=300)


def read_outputs(run_dir: str) -> dict[str, list[dict[str, Any]]]:
    manifest = output.read_manifest(run_dir)
    tables = {}
    for name, described in manifest["outputs"].items():
        if "rows" in described:
            table = pq.read_table(os.path.join(run_dir, described["path"]))
            assert table.num_rows == described["rows"]
            tables[name] = table.to_pylist()
    return tables


def both_engines(spark: Any, params: JobParams, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run on Spark and locally; return (spark manifest, local manifest) after checking every
    output table is equal, row for row in the order written."""
    on_spark = run_job(params, engine="spark", out=str(out / "spark"), spark=spark)
    on_local = run_job(params, engine="local", out=str(out / "local"))
    spark_tables, local_tables = read_outputs(on_spark.run_dir), read_outputs(on_local.run_dir)
    assert sorted(spark_tables) == sorted(local_tables)
    for name, rows in local_tables.items():
        assert spark_tables[name] == rows, name
    assert on_spark.manifest["summary"] == on_local.manifest["summary"]
    assert on_spark.lines == on_local.lines
    assert on_spark.manifest["spark_master"] == "local[1]"
    return on_spark.manifest, on_local.manifest


def nodes(logs: LogsvcLogs, *names: str) -> list[str]:
    return [f"{name}={logs.nodes[name]}" for name in names or ("n1", "n2", "n3")]


@pytest.mark.parametrize("job", ["lsn_audit", "replica_diff", "inventory", "txn_latency"])
def test_logsvc_jobs_equal_the_local_engine(
    spark: Any, logsvc_logs: LogsvcLogs, tmp_path: Path, job: str
) -> None:
    manifest, _ = both_engines(spark, JobParams(job, logsvc_input(nodes(logsvc_logs))), tmp_path)
    if job == "lsn_audit":
        assert manifest["summary"]["anomalies"] == 6  # a duplicate and a gap, on 3 replicas
    if job == "replica_diff":
        pairs = manifest["summary"]["pairs"]
        first = {p["replica_b"]: p["first_divergent_lsn"] for p in pairs if p["shard"] == 1}
        assert first["n3"] is not None and first["n2"] is None


@pytest.mark.parametrize("job", ["write_stats", "txn_latency", "lsn_audit"])
def test_file_wal_jobs_equal_the_local_engine(
    spark: Any, history: History, tmp_path: Path, job: str
) -> None:
    manifest, _ = both_engines(spark, JobParams(job, file_input(history.path)), tmp_path)
    if job == "write_stats":
        assert manifest["summary"]["rows_appended"] == 310  # 300 + 1 + 1 + 7 + 1


def test_replay_on_spark_equals_the_engine(spark: Any, history: History, tmp_path: Path) -> None:
    chosen = [0, history.timestamps[2], history.timestamps[5], history.timestamps[8] + 1]
    chosen.append(history.timestamps[-1])
    for ts in chosen:
        params = JobParams("replay_as_of", file_input(history.path), as_of=ts)
        manifest, _ = both_engines(spark, params, tmp_path / str(ts))
        run_dir = os.path.join(tmp_path, str(ts), "spark", "replay_as_of", manifest["run_id"])
        got = {
            name.split("/", 1)[1].replace("/", "."): rows
            for name, rows in read_outputs(run_dir).items()
        }
        assert got == history.scans[ts], ts


def test_replay_on_spark_in_bounded_memory(spark: Any, history: History, tmp_path: Path) -> None:
    """A replay task holding at most 4 KiB of a table's rows spills sorted runs in its Python
    worker, merges them and writes the result a batch at a time (spark_jobs/spill.py): the
    same outputs as the local engine under the same bound, and the engine's scan."""
    ts = history.timestamps[-1]
    params = JobParams("replay_as_of", file_input(history.path), as_of=ts, rows_held_bytes=4096)
    manifest, _ = both_engines(spark, params, tmp_path)
    [log] = manifest["summary"]["logs"]
    assert log["rows_spilled_runs"] >= 2
    run_dir = os.path.join(tmp_path, "spark", "replay_as_of", manifest["run_id"])
    got = {
        name.split("/", 1)[1].replace("/", "."): rows
        for name, rows in read_outputs(run_dir).items()
    }
    assert got == history.scans[ts]


def test_replay_on_spark_over_logsvc(spark: Any, logsvc_logs: LogsvcLogs, tmp_path: Path) -> None:
    ts = logsvc_logs.engine.timestamps[-3]
    params = JobParams(
        "replay_as_of", logsvc_input(nodes(logsvc_logs, "n2")), shards=frozenset({1}), as_of=ts
    )
    manifest, _ = both_engines(spark, params, tmp_path)
    run_dir = os.path.join(tmp_path, "spark", "replay_as_of", manifest["run_id"])
    got = {n.split("/", 1)[1].replace("/", "."): r for n, r in read_outputs(run_dir).items()}
    assert got == logsvc_logs.engine.scans[ts]


def test_audit_of_every_anomaly_kind_equals_the_local_engine(spark: Any, tmp_path: Path) -> None:
    wal = str(tmp_path / "wal")
    anomalies_log(wal)
    manifest, _ = both_engines(spark, JobParams("lsn_audit", file_input(wal)), tmp_path / "out")
    [log] = manifest["summary"]["logs"]
    assert manifest["summary"]["anomalies"] == 5
    found = (log["duplicates"], log["conflicts"], log["gaps"], log["skipped_copies"])
    assert found == (2, 1, 1, 1) and log["truncated_lsn"] == 1


def driver_records_in(params: JobParams) -> int:
    """The driver records of the input's logs (the records holding a payload: entries,
    markers, skips), counted from the audit level read here."""
    table = read_level(params, ReadOptions(LEVEL_AUDIT, "true", params.bounds()))
    kinds = table.column("kind").to_pylist()
    return sum(kind in ("entry", "marker", "skip") for kind in kinds)


@pytest.mark.parametrize("job", ["replay_as_of", "lsn_audit"])
def test_spark_reads_each_log_once(
    spark: Any, logsvc_logs: LogsvcLogs, tmp_path: Path, job: str
) -> None:
    """The executors decode every driver record of every log exactly once (the count comes
    from the tasks' own Python workers: spark_jobs/records.py DECODES, reported per task),
    as the local engine does; the Data Source path read each log three times."""
    if job == "replay_as_of":  # shard 1 holds the engine's log
        inputs = logsvc_input(nodes(logsvc_logs, "n2"))
        as_of = logsvc_logs.engine.timestamps[-1]
        params = JobParams(job, inputs, shards=frozenset({1}), as_of=as_of)
    else:  # every log: 3 replicas of 3 shards, one Spark task each
        params = JobParams(job, logsvc_input(nodes(logsvc_logs)))
    manifest, local_manifest = both_engines(spark, params, tmp_path)
    records = driver_records_in(params)
    assert records > 10
    assert manifest["driver_records_decoded"] == records
    assert local_manifest["driver_records_decoded"] == records


def test_an_error_in_a_spark_task_is_the_local_engines_error(spark: Any, tmp_path: Path) -> None:
    """A replay task meets a damaged entry in its executor: the driver raises the same typed
    error, with the same path, offset and reason, as the local engine (not Spark's wrapper
    of a Python traceback)."""
    wal = str(tmp_path / "wal")
    payloads = kv_entries(30)
    damaged = bytearray(payloads[17])
    damaged[-1] ^= 0x01  # the entry's checksum no longer matches
    payloads[17] = bytes(damaged)
    write_file_wal(wal, records_of(payloads, per_record=4))
    params = JobParams("replay_as_of", file_input(wal), as_of=10**9)
    failed = []
    for engine in ("spark", "local"):
        with pytest.raises(InputCorrupt, match="DSN 18: checksum mismatch") as info:
            run_job(params, engine=engine, out=str(tmp_path / engine), spark=spark)
        failed.append((str(info.value), info.value.path, info.value.offset_bytes))
    assert failed[0] == failed[1]


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> StorageHistory:
    return storage_history(str(tmp_path_factory.mktemp("storage")))


def test_replay_on_spark_from_checkpoints_and_objects(
    spark: Any, storage: StorageHistory, tmp_path: Path
) -> None:
    """Block commands (flush, merge) with the WAL whole; then the newest checkpoint (an
    incremental one with an L0 dump, deltas, L1 and L2 objects) and the WAL after its
    truncation: both engines write the same tables, equal to the engine's scans."""
    ckp2 = storage.checkpoints[-1].ckp_ts
    flushed = max(ts for ts in storage.scans if ts <= storage.visible["flushed"])
    cases = [
        (storage.copies["flushed"], flushed),
        (storage.path, ckp2),
        (storage.path, storage.visible["final"]),
    ]
    for index, (path, ts) in enumerate(cases):
        params = JobParams("replay_as_of", file_input(path), as_of=ts)
        manifest, _ = both_engines(spark, params, tmp_path / str(index))
        run_dir = os.path.join(tmp_path, str(index), "spark", "replay_as_of", manifest["run_id"])
        got = {
            name.split("/", 1)[1].replace("/", "."): rows
            for name, rows in read_outputs(run_dir).items()
        }
        assert sorted(got) == sorted(storage.scans[ts]), ts
        for name, rows in storage.scans[ts].items():
            key = next(iter(rows[0])) if rows else ""
            assert sorted(got[name], key=lambda r: r[key]) == sorted(rows, key=lambda r: r[key])
    [log] = manifest["summary"]["logs"]
    assert log["base"]["ckp_ts"] == ckp2


def test_inventory_on_spark_lists_checkpoints(
    spark: Any, storage: StorageHistory, tmp_path: Path
) -> None:
    manifest, _ = both_engines(spark, JobParams("inventory", file_input(storage.path)), tmp_path)
    kinds = [c["kind"] for c in manifest["summary"]["checkpoints"] if c["state"] == "complete"]
    assert kinds == ["incremental", "incremental"]


def test_pushed_filters_are_applied_and_rechecked(spark: Any, logsvc_logs: LogsvcLogs) -> None:
    from pyspark.sql import functions as F

    frame = (
        spark.read.format("tae_wal")
        .option("input", logsvc_input(nodes(logsvc_logs)).to_option())
        .option("level", "record")
        .load()
        .filter((F.col("shard") == 2) & (F.col("replica") == "n1") & (F.col("dsn") >= 3))
    )
    rows = sorted((r.lsn, r.dsn) for r in frame.select("lsn", "dsn").collect())
    assert rows == [(2, 3), (3, 3), (4, 4), (5, 6), (5, 7)]
    plan = frame._jdf.queryExecution().optimizedPlan().toString()
    # Spark still filters every row itself: the optimized plan keeps a Filter node with the
    # DSN condition above the scan (a source that swallowed the filter would leave none).
    filters = [line for line in plan.splitlines() if line.lstrip(" +-:").startswith("Filter ")]
    assert any(re.search(r"\(dsn#\d+L? >= 3\)", line) for line in filters), plan


def test_spark_submit_runs_a_job_unchanged(logsvc_logs: LogsvcLogs, tmp_path: Path) -> None:
    bin_dir = os.path.dirname(sys.executable)
    submit = os.path.join(bin_dir, "spark-submit")
    assert os.path.exists(submit), "pyspark's spark-submit is installed with the spark extra"
    import spark_jobs

    script = os.path.join(os.path.dirname(spark_jobs.__file__), "__main__.py")
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PATH=bin_dir + os.pathsep + env.get("PATH", ""),
    )
    out = str(tmp_path / "out")
    argv = ["inventory", *(f"--node={n}" for n in nodes(logsvc_logs)), "--out", out]
    # The lean JVM flags the suite's own session runs with (C1 only, serial GC): the
    # job, its Python and its output are what this test is about, and the defaults' C2
    # and G1 threads cost ~8 CPU-s of a 2-core box here (spark_jobs/session.py).
    completed = subprocess.run(
        [submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--driver-java-options", LEAN_JVM_OPTIONS, script, *argv, "--run-id", "submitted"],
        env=env, capture_output=True, text=True, timeout=SPARK_SUBMIT_S_MAX, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "inventory: replica n1 shard 1 (logsvc)" in completed.stdout
    run_dir = os.path.join(out, "inventory", "submitted")
    manifest = output.read_manifest(run_dir)
    assert manifest["spark_master"] == "local[2]" and manifest["engine"] == "spark"
    local = run_job(
        JobParams("inventory", logsvc_input(nodes(logsvc_logs))),
        engine="local",
        out=str(tmp_path / "l"),
    )
    assert read_outputs(run_dir) == read_outputs(local.run_dir)
