"""The Spark engine: every job in Spark's terms, with the same semantics as
spark_jobs/local.py; the pure parts (the replay plan, the catalog replay, the audit of a log,
summaries) are the very same functions. Tests assert both engines write equal outputs.

replay_as_of and lsn_audit run one Spark task per log (a shard replica: `per_log`). Replay
is sequential within a log (spark_jobs/replay.py) and so is the audit's walk over DSNs and
LSNs, so a task runs the local engine's code on its log: the log is read and decoded once,
in the executor, columnar (spark_jobs/entries.py), the task writes its tables' Parquet files
itself (output.write_table: the layout the local engine writes) and only a summary reaches
the driver. Nothing per entry crosses into the JVM. Parallelism is the number of logs (the
other jobs go through Spark's shuffles, where per-entry rows are the point).

The other jobs are DataFrame operations over the Data Sources (sources.py); what they
collect on the driver is small: bounds, summaries, the latency histogram, the segments.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark_jobs import audit, error_transport, jobs, local, local_replay, output
from spark_jobs import records as record_reader  # by module: a task counts in its own worker
from spark_jobs.errors import SparkJobError
from spark_jobs.jobs import JobParams, JobResult
from spark_jobs.schemas import spark_ddl, spark_type
from spark_jobs.verify import VERIFY_TRUE

RECORD_KINDS = ("entry", "marker", "skip")


def read(
    spark: SparkSession,
    params: JobParams,
    level: str,
    verify: str,
    *,
    source: str = "tae_wal",
    shards: frozenset[int] | None = None,
    replicas: frozenset[str] | None = None,
    extra: dict[str, str] | None = None,
) -> DataFrame:
    reader = (
        spark.read.format(source)
        .option("input", params.inputs.to_option())
        .option("level", level)
        .option("verify", verify)
    )
    shards = params.shards if shards is None else shards
    replicas = params.replicas if replicas is None else replicas
    if shards is not None:
        reader = reader.option("shards", ",".join(str(s) for s in sorted(shards)))
    if replicas is not None:
        reader = reader.option("replicas", ",".join(sorted(replicas)))
    for key, value in (extra or {}).items():
        reader = reader.option(key, value)
    return reader.load()


def run(spark: SparkSession, params: JobParams, directory: str) -> JobResult:
    """The job's result; `directory` is the run's, where per-log tasks write their outputs."""
    if params.job == "replay_as_of":
        return replay_as_of(spark, params, directory)
    if params.job == "lsn_audit":
        return lsn_audit(spark, params, directory)
    runner = {
        "replica_diff": replica_diff,
        "write_stats": write_stats,
        "txn_latency": txn_latency,
        "inventory": inventory,
    }[params.job]
    return runner(spark, params)


def cast_to(frame: DataFrame, schema: Any) -> DataFrame:
    """Columns in the Arrow schema's order and types (so both engines write the same
    Parquet types)."""
    return frame.select([F.col(f.name).cast(spark_type(f.type)).alias(f.name) for f in schema])


# --- one task per log: replay_as_of, lsn_audit ---------------------------------------------------


def per_log(
    spark: SparkSession,
    logs: list[tuple[str, int]],
    task: Callable[[str, int, int], dict[str, Any]],
) -> tuple[list[dict[str, Any]], int]:
    """`task(replica, shard, index)` run once for each of `logs`, each in its own Spark task
    (the unit of parallelism: one log, whose replay and audit are sequential by their rules,
    spark_jobs/replay.py), in the executors' Python workers. Each task reads its log once,
    writes its outputs itself (output.write_table) and answers a small JSON object: only
    those answers reach the driver, in the order of `logs`, with the driver records the
    tasks decoded. An operating error in a task is raised here, as its own class."""
    if not logs:
        return [], 0

    def run_tasks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                replica, shard = logs[index]
                before = record_reader.DECODES.total
                answer: dict[str, Any] = {}
                try:
                    answer["done"] = task(replica, shard, index)
                except SparkJobError as exc:
                    answer["error"] = error_transport.describe(exc)
                answer["decoded"] = record_reader.DECODES.total - before
                yield pa.record_batch(
                    [pa.array([index], pa.int64()), pa.array([json.dumps(answer)])],
                    names=["log", "answer"],
                )

    count = len(logs)
    frame = spark.range(0, count, 1, numPartitions=count).mapInArrow(
        run_tasks, "log BIGINT, answer STRING"
    )
    rows = sorted((row.log, json.loads(row.answer)) for row in frame.collect())
    assert [index for index, _ in rows] == list(range(count)), rows
    for _, answer in rows:
        if "error" in answer:
            raise error_transport.rebuild(answer["error"])
    return [answer["done"] for _, answer in rows], sum(answer["decoded"] for _, answer in rows)


def replay_as_of(spark: SparkSession, params: JobParams, directory: str) -> JobResult:
    """local_replay.replay_log once per log, in the executors; each writes its tables."""
    assert params.as_of is not None

    def replay_task(replica: str, shard: int, index: int) -> dict[str, Any]:
        summary, tables = local_replay.replay_log(params, replica, shard)
        written = {}
        for name in sorted(tables):  # each table let go once written
            written[name] = output.write_table(directory, name, tables.pop(name))
        return {"summary": summary, "written": written}

    done, decoded = per_log(spark, local_replay.logs_of(params), replay_task)
    result = JobResult(driver_records_decoded=decoded)
    for answer in done:
        result.written.update(answer["written"])
    result.summary = local_replay.replay_summary(params.as_of, [a["summary"] for a in done])
    result.lines = local_replay.replay_lines(result.summary)
    return result


def lsn_audit(spark: SparkSession, params: JobParams, directory: str) -> JobResult:
    """audit.audit_of once per log, in the executors: each writes its anomalies as one part
    of the `anomalies` dataset (parts in log order, rows sorted within, so the dataset is in
    jobs.ANOMALY_ORDER, which begins with the log), and answers its summary."""

    def audit_task(replica: str, shard: int, index: int) -> dict[str, Any]:
        audited = audit.audit_of(params, replica, shard)
        found, summary = ([], None) if audited is None else audited
        rows = output.write_table(directory, ANOMALIES, audit.anomaly_table(found), part=index)
        return {"summary": summary, "anomalies": rows}

    logs = audit.audit_logs(params)
    done, decoded = per_log(spark, logs, audit_task)
    if not logs:
        output.write_table(directory, ANOMALIES, audit.anomaly_table([]))
    result = JobResult(driver_records_decoded=decoded)
    result.written[ANOMALIES] = sum(answer["anomalies"] for answer in done)
    summaries = [answer["summary"] for answer in done if answer["summary"] is not None]
    result.summary = {"logs": summaries, "anomalies": result.written[ANOMALIES]}
    result.lines = audit.audit_lines(result.summary)
    return result


ANOMALIES = "anomalies"


# --- replica_diff ---------------------------------------------------------------------------------


def replica_diff(spark: SparkSession, params: JobParams) -> JobResult:
    records = read(spark, params, "record", params.verify or VERIFY_TRUE)
    checksums = (
        records.filter(F.col("kind").isin(*RECORD_KINDS))
        .select("shard", "replica", "lsn", "record_checksum")
        .distinct()
        .persist()
    )
    frames = []
    pairs = []
    for shard, a, b in local.diff_pairs(params):
        side_a = checksums.filter((F.col("shard") == shard) & (F.col("replica") == a))
        side_b = checksums.filter((F.col("shard") == shard) & (F.col("replica") == b))
        bounds = [side.agg(F.min("lsn"), F.max("lsn")).collect()[0] for side in (side_a, side_b)]
        (min_a, max_a), (min_b, max_b) = [(lo or 1, hi or 0) for lo, hi in bounds]
        low = max(min_a, min_b)
        joined = (
            side_a.select("lsn", F.col("record_checksum").alias("ca"))
            .join(side_b.select("lsn", F.col("record_checksum").alias("cb")), "lsn", "full_outer")
            .filter(F.col("lsn") >= low)
        )
        both = F.col("ca").isNotNull() & F.col("cb").isNotNull()
        kind = (
            F.when(both & (F.col("ca") != F.col("cb")), "diverged")
            .when(F.col("ca").isNull() & (F.col("lsn") <= max_a), "hole")
            .when(F.col("cb").isNull() & (F.col("lsn") <= max_b), "hole")
        )
        missing = F.when(F.col("ca").isNull(), a).when(F.col("cb").isNull(), b)
        diff = joined.withColumn("kind", kind).filter(F.col("kind").isNotNull())
        frame = cast_to(
            diff.select(
                F.lit(shard).alias("shard"),
                F.lit(a).alias("replica_a"),
                F.lit(b).alias("replica_b"),
                "lsn",
                "kind",
                F.when(F.col("kind") == "hole", missing).alias("missing_in"),
                F.col("ca").alias("checksum_a"),
                F.col("cb").alias("checksum_b"),
            ),
            jobs.DIFF,
        )
        found = [row.asDict() for row in frame.collect()]
        compared = joined.filter(both).count()
        pairs.append(local.pair_summary(shard, a, b, max_a, max_b, found, compared))
        frames.append(frame)
    differences = spark.createDataFrame([], schema=spark_ddl(jobs.DIFF))
    for frame in frames:
        differences = differences.unionByName(frame)
    differences = differences.orderBy(*jobs.DIFF_ORDER)
    result = JobResult(tables={"differences": differences}, summary={"pairs": pairs})
    result.lines = local.diff_lines(pairs)
    return result


# --- write_stats ----------------------------------------------------------------------------------


def _first_copy(frame: DataFrame, keys: list[str]) -> DataFrame:
    """One row per key: the copy with the lowest (replica, lsn), as the local engine keeps."""
    order = Window.partitionBy(*keys).orderBy("replica", "lsn")
    return frame.withColumn("_copy", F.row_number().over(order)).filter(F.col("_copy") == 1)


def write_stats(spark: SparkSession, params: JobParams) -> JobResult:
    commands = read(spark, params, "command", params.verify or VERIFY_TRUE).drop("batch_ipc")
    first = _first_copy(commands, ["shard", "dsn", "cmd_index"])
    # A Delete on a block its own entry creates restates a user's delete on the rewritten
    # rows (engine/FORMAT.md CreateBlock): not counted again.
    created = first.filter(F.col("cmd_kind") == "create_block").select(
        "shard", "dsn", "table_id", "block_id"
    )
    data = first.filter(F.col("cmd_kind").isin("append", "delete")).join(
        created.withColumn("carried", F.lit(True)),
        ["shard", "dsn", "table_id", "block_id"],
        "left",
    )
    data = data.filter(F.col("carried").isNull()).drop("carried")
    physical = F.shiftright(F.col("commit_ts"), jobs.HLC_LOGICAL_BITS)
    data = data.withColumn(
        "bucket_start_ms", F.floor(physical / params.bucket_ms) * params.bucket_ms
    )
    stats = data.groupBy("shard", "db_id", "table_id", "bucket_start_ms").agg(
        F.countDistinct("dsn").alias("txns"),
        F.count("*").alias("commands"),
        F.sum(F.when(F.col("cmd_kind") == "append", F.col("n_rows")).otherwise(0)).alias(
            "rows_appended"
        ),
        F.sum(F.when(F.col("cmd_kind") == "delete", F.col("n_rows")).otherwise(0)).alias(
            "rows_deleted"
        ),
        F.sum("cmd_bytes").alias("bytes"),
        F.min("commit_ts").alias("first_commit_ts"),
        F.max("commit_ts").alias("last_commit_ts"),
    )
    stats = cast_to(stats, jobs.STATS).orderBy(*jobs.STATS_ORDER).persist()
    totals = stats.agg(
        F.count("*"), F.sum("rows_appended"), F.sum("rows_deleted"), F.sum("bytes")
    ).collect()[0]
    tables = stats.select("shard", "db_id", "table_id").distinct().count()
    summary = {
        "groups": totals[0],
        "tables": tables,
        "rows_appended": int(totals[1] or 0),
        "rows_deleted": int(totals[2] or 0),
        "bytes": int(totals[3] or 0),
    }
    result = JobResult(tables={"write_stats": stats}, summary=summary)
    result.lines = local.stats_lines(summary)
    return result


# --- txn_latency ----------------------------------------------------------------------------------


def txn_latency(spark: SparkSession, params: JobParams) -> JobResult:
    entries = read(spark, params, "entry", params.verify or VERIFY_TRUE)
    txns = _first_copy(entries.filter(F.col("entry_type") == "txn"), ["shard", "dsn"])
    bits = jobs.HLC_LOGICAL_BITS
    latency = F.shiftright(F.col("commit_ts"), bits) - F.shiftright(F.col("start_ts"), bits)
    without_start = txns.filter(F.col("start_ts") == 0).count()
    txns = txns.filter(F.col("start_ts") > 0).select(latency.alias("latency_ms")).persist()
    lo = F.when(F.col("latency_ms") == 0, F.lit(0)).otherwise(
        F.pow(F.lit(2), F.floor(F.log2(F.col("latency_ms")))).cast("long")
    )
    histogram = (
        txns.groupBy(lo.alias("bucket_lo_ms"))
        .agg(F.count("*").alias("txns"))
        .withColumn(
            "bucket_hi_ms",
            F.when(F.col("bucket_lo_ms") == 0, 1).otherwise(F.col("bucket_lo_ms") * 2),
        )
        .orderBy("bucket_lo_ms")
    )
    histogram = cast_to(histogram, jobs.HISTOGRAM)
    stats = txns.agg(
        F.count("*"),
        F.percentile("latency_ms", F.array(*(F.lit(p) for p in jobs.PERCENTILES))),
        F.max("latency_ms"),
        F.min("latency_ms"),
    ).collect()[0]
    if stats[0] == 0:
        summary: dict[str, Any] = {"txns": 0, "txns_without_start_ts": without_start}
    else:
        p50, p90, p99 = stats[1]
        summary = {
            "txns": stats[0],
            "txns_without_start_ts": without_start,
            "p50_ms": round(p50, 3),
            "p90_ms": round(p90, 3),
            "p99_ms": round(p99, 3),
            "max_ms": stats[2],
            "min_ms": stats[3],
        }
    collected = histogram.collect()
    table = pa.Table.from_pylist([row.asDict() for row in collected], schema=jobs.HISTOGRAM)
    result = local.latency_result(table, summary)
    result.tables = {"histogram": histogram}
    return result


# --- inventory ------------------------------------------------------------------------------------


def inventory(spark: SparkSession, params: JobParams) -> JobResult:
    segments = read(spark, params, "segment", VERIFY_TRUE).orderBy(
        "replica", "shard", "first_position", "segment"
    )
    rows = [row.asDict() for row in segments.collect()]
    found = local.checkpoint_inventory(params)
    frame = spark.createDataFrame(
        [tuple(row.values()) for row in found.to_pylist()], schema=spark_ddl(jobs.CHECKPOINTS)
    )
    result = JobResult(tables={"segments": segments, "checkpoints": frame})
    result.summary = local.inventory_summary(rows, found.to_pylist())
    result.lines = local.inventory_lines(result.summary)
    return result
