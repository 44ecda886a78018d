"""The Spark engine: every job as DataFrame operations over the Data Sources (sources.py).
Same semantics as spark_jobs/local.py, stated once more in Spark's terms; the pure parts
(the replay plan, the catalog replay, summaries) are the very same functions. Tests assert
both engines write equal outputs.

Where work lands on the driver (collected, then pure Python): the replay plan (one narrow
row per driver record: LSN, DSN range, safe DSN, checksum), the checkpoint's manifest,
catalog and block lists and the footers of the objects replay reads (checked there, then
read by Spark's own Parquet reader, or for S3 by the executors through the engine's store:
objectsource.py), the catalog and block commands, the DSNs of repeated
transactions, and the small summaries. Everything proportional to rows
(appends, deletes, anomalies, differences, statistics) stays distributed.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from engine.checkpoint.layout import LEVEL_L0_DUMP
from engine.objects.store import LocalDirStore, ObjectStore
from spark_jobs import checkpoints, jobs, local, local_replay, objectsource, replay, schemas
from spark_jobs.errors import BadInput, ObjectsUnreadable
from spark_jobs.jobs import JobParams, JobResult
from spark_jobs.journal import VERIFY_REPORT, VERIFY_TRUE
from spark_jobs.objectsource import FILE_KEY, ROW_INDEX
from spark_jobs.objectstores import location_of
from spark_jobs.schemas import ROWS_PREFIX, schema_to_json, spark_ddl, spark_type

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


def run(spark: SparkSession, params: JobParams) -> JobResult:
    runner = {
        "replay_as_of": replay_as_of,
        "lsn_audit": lsn_audit,
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


# --- replay_as_of -------------------------------------------------------------------------------


def replay_as_of(spark: SparkSession, params: JobParams) -> JobResult:
    assert params.as_of is not None
    as_of = params.as_of
    verify = params.verify or VERIFY_TRUE
    result = JobResult()
    logs_summary = []
    for replica, shard in local_replay.logs_of(params):
        where = f"replica {replica} shard {shard}"
        one_shard, one_replica = frozenset({shard}), frozenset({replica})
        store, base = local_replay.base_of(params, shard, as_of)
        records = read(
            spark,
            params,
            "audit",
            verify,
            shards=one_shard,
            replicas=one_replica,
            extra={"entry_checksums": "false"},
        )
        narrow = records.filter(F.col("kind").isin("entry", "marker", "skip", "truncate")).select(
            *local_replay.PLAN_COLUMNS
        )
        plan = local_replay.plan_from_rows((row.asDict() for row in narrow.collect()), where, base)
        excluded = sorted(plan.excluded_lsns)

        def chosen(
            frame: DataFrame,
            plan: replay.ReplayPlan = plan,
            excluded: list[int] = excluded,
            ckp_ts: int = base.ckp_ts,
        ) -> DataFrame:
            frame = frame.filter(
                (F.col("commit_ts") > ckp_ts)
                & (F.col("dsn") >= plan.first_dsn)
                & (F.col("dsn") <= plan.last_dsn)
            )
            return frame.filter(~F.col("lsn").isin(excluded)) if excluded else frame

        commands = chosen(
            read(
                spark,
                params,
                "command",
                verify,
                shards=one_shard,
                replicas=one_replica,
                extra={"batches": "false"},
            )
        ).drop("batch_ipc", "infos")
        commands = commands.persist()
        entries = commands.select("dsn", "commit_ts").distinct()
        before = Window.orderBy("dsn").rowsBetween(Window.unboundedPreceding, -1)
        repeated = [
            row.dsn
            for row in entries.withColumn("highest", F.max("commit_ts").over(before))
            .filter(F.col("commit_ts") <= F.col("highest"))
            .select("dsn")
            .collect()
        ]
        newest = max(base.ckp_ts, commands.agg(F.max("commit_ts")).collect()[0][0] or 0)
        replayed_commands = commands.filter(F.col("commit_ts") <= as_of)
        if repeated:
            replayed_commands = replayed_commands.filter(~F.col("dsn").isin(repeated))
        small = [
            row.asDict()
            for row in replayed_commands.filter(
                F.col("cmd_kind").isin("catalog", "create_block", "drop_block")
            )
            .select(
                "dsn",
                "cmd_index",
                "commit_ts",
                "cmd_kind",
                "catalog_kind",
                "catalog_op",
                "db_id",
                "table_id",
                "name",
                "schema_json",
                "block_id",
                "n_rows",
                "object",
                "row_group",
            )
            .collect()
        ]
        catalog = [
            replay.CatalogCommand(
                r["dsn"],
                r["cmd_index"],
                r["commit_ts"],
                r["catalog_kind"],
                r["catalog_op"],
                r["db_id"],
                r["table_id"] or 0,
                r["name"],
                r["schema_json"],
            )
            for r in small
            if r["cmd_kind"] == "catalog"
        ]
        live = replay.replay_catalog(catalog, as_of, where, base)
        replayed = replayed_commands.select("dsn").distinct().count()
        deletes = replayed_commands.filter(F.col("cmd_kind") == "delete").select(
            "table_id", "block_id", F.explode("del_rows").alias("offset")
        )
        created = [r for r in small if r["cmd_kind"] == "create_block"]
        if store is None and created:
            raise BadInput(
                f"{where}: the WAL names persisted blocks (CreateBlock) but no objects "
                "directory was given or found: --objects"
            )
        tables_summary = {}
        for table in live:
            dropped = sorted(
                r["block_id"]
                for r in small
                if r["cmd_kind"] == "drop_block" and r["table_id"] == table.table_id
            )
            rows = chosen(
                read(
                    spark,
                    params,
                    "rows",
                    verify,
                    shards=one_shard,
                    replicas=one_replica,
                    extra={
                        "table_id": str(table.table_id),
                        "table_schema": schema_to_json(table.schema),
                    },
                )
            ).filter(F.col("commit_ts") <= as_of)
            if repeated:
                rows = rows.filter(~F.col("dsn").isin(repeated))
            value_names = [c.name for c in table.schema.columns]
            rows = rows.select("block_id", "offset", *value_names)
            dead = deletes.filter(F.col("table_id") == table.table_id).select("block_id", "offset")
            if store is not None:
                mine = [r for r in created if r["table_id"] == table.table_id]
                persisted, base_dead = _object_rows(spark, store, base, table, mine, dropped)
                if persisted is not None:
                    rows = rows.unionByName(persisted)
                if base_dead is not None:
                    dead = dead.unionByName(base_dead)
            if dropped:
                rows = rows.filter(~F.col("block_id").isin(dropped))
            rows = rows.join(dead, ["block_id", "offset"], "left_anti")
            ordered = rows.orderBy("block_id", "offset").drop("block_id", "offset")
            name = f"shard-{shard}/{table.db_name}/{table.name}"
            result.tables[name] = ordered
            tables_summary[f"{table.db_name}.{table.name}"] = name  # row count: after writing
        commands.unpersist()
        logs_summary.append(
            {
                "replica": replica,
                "shard": shard,
                "base": base.describe(),
                **plan.describe(),
                "entries_replayed": replayed,
                "repeated_transactions_ignored": len(repeated),
                "newest_commit_ts": newest,
                "tables": tables_summary,
            }
        )
    result.summary = local_replay.replay_summary(as_of, logs_summary)
    return result


def _object_rows(
    spark: SparkSession,
    store: ObjectStore,
    base: replay.BaseState,
    table: replay.LiveTable,
    created: list[dict[str, Any]],
    dropped: list[int],
) -> tuple[DataFrame | None, DataFrame | None]:
    """The rows of the table's blocks held in objects (the base's dumps and persisted
    blocks, the replayed CreateBlocks), not dropped, as (block_id, offset, columns...); and
    the base's deletes as (block_id, offset). Parquet is read by Spark itself; every object's
    footer is checked on the driver first (our metadata, row groups, row counts), and a
    Parquet row index becomes a block offset through the row group's first row."""
    gone = set(dropped)
    blocks: list[tuple[str, int, int, int]] = []  # (object, block_id, first row, rows)
    starts: dict[str, list[int]] = {}

    def persisted(name: str, block_id: int, row_group: int, rows: int) -> None:
        if name not in starts:
            starts[name] = checkpoints.row_group_starts(store, name)
        if not 0 <= row_group < len(starts[name]):
            raise ObjectsUnreadable(name, f"no row group {row_group}")
        blocks.append((name, block_id, starts[name][row_group], rows))

    deltas: set[str] = set()
    checkpoint = base.checkpoint
    if checkpoint is not None:
        for row in checkpoint.blocks_of(table.table_id):
            if row.block_id in gone:
                continue
            if row.level == LEVEL_L0_DUMP:
                checkpoints.check_dump(store, row.object, table.schema, row.rows)
                blocks.append((row.object, row.block_id, 0, row.rows))
            else:
                persisted(row.object, row.block_id, row.row_group, row.rows)
            if row.delta_object is not None:
                deltas.add(row.delta_object)
    for cmd in created:
        if cmd["block_id"] not in gone:
            persisted(cmd["object"], cmd["block_id"], cmd["row_group"], cmd["n_rows"])
    rows_frame: DataFrame | None = None
    if blocks:
        directory = spark.createDataFrame(
            [(_file_key(name), block_id, first, rows) for name, block_id, first, rows in blocks],
            "file_key STRING, block_id BIGINT, first_row BIGINT, block_rows BIGINT",
        )
        names = [c.name for c in table.schema.columns]
        prefix = len(ROWS_PREFIX)
        wanted = schemas.rows_schema(table.schema, for_spark=True)
        objects = sorted({name for name, _, _, _ in blocks})
        if isinstance(store, LocalDirStore):  # Spark's own Parquet reader
            raw = spark.read.parquet(*(store.path_of(name) for name in objects)).select(
                *names,
                _key_of(F.col("_metadata.file_path")).alias("file_key"),
                F.col("_metadata.row_index").alias("row_index"),
            )
        else:  # S3: the executors read through the engine's store (objectsource.py)
            raw = _store_objects(spark, store, objects, pa.schema(list(wanted)[prefix:]))
        joined = raw.join(F.broadcast(directory), "file_key").filter(
            (F.col("row_index") >= F.col("first_row"))
            & (F.col("row_index") < F.col("first_row") + F.col("block_rows"))
        )
        rows_frame = joined.select(
            F.col("block_id"),
            (F.col("row_index") - F.col("first_row")).alias("offset"),
            *(F.col(f.name).cast(spark_type(f.type)).alias(f.name) for f in list(wanted)[prefix:]),
        )
    dead_frame: DataFrame | None = None
    if deltas and checkpoint is not None:
        for name in deltas:
            checkpoints.check_delta(store, name)
        mine = [r.block_id for r in checkpoint.blocks_of(table.table_id) if r.delta_object]
        if isinstance(store, LocalDirStore):
            delta_rows = spark.read.parquet(*sorted(store.path_of(name) for name in deltas))
        else:
            delta_schema = pa.schema(
                [("block_id", pa.int64()), ("offset", pa.int64()), ("commit_ts", U64_EXACT)]
            )
            delta_rows = _store_objects(spark, store, sorted(deltas), delta_schema)
        dead_frame = delta_rows.filter(
            (F.col("commit_ts") <= F.lit(checkpoint.ckp_ts).cast("decimal(20,0)"))
            & F.col("block_id").isin(mine)
        ).select(
            F.col("block_id").cast("bigint").alias("block_id"),
            F.col("offset").cast("bigint").alias("offset"),
        )
    return rows_frame, dead_frame


U64_EXACT = pa.decimal128(20, 0)  # Spark has no unsigned 64-bit type (schemas._SPARK_WIDER)


def _store_objects(
    spark: SparkSession, store: ObjectStore, names: list[str], columns: pa.Schema
) -> DataFrame:
    """Parquet objects of `store` read on the executors through the store itself (the
    `engine_objects` source): `columns` cast to their types, plus file_key and row_index."""
    target = pa.schema([*columns, (FILE_KEY, pa.string()), (ROW_INDEX, pa.int64())])
    return (
        spark.read.format(objectsource.NAME)
        .schema(schemas.spark_ddl(target))
        .option("location", location_of(store))
        .option("names", json.dumps(names))
        .option("arrow_schema", objectsource.encode_arrow_schema(target))
        .load()
    )


def _file_key(name: str) -> str:
    """The last two components of an object's name ("data/<table>/<hex>.parquet",
    "ckp/<ts>-<tag>/l0-..."): unique among a store's objects and made only of characters a
    file URI does not escape, so it matches what Spark's `_metadata.file_path` ends with."""
    return "/".join(name.split("/")[-2:])


def _key_of(path: Any) -> Any:
    parts = F.split(path, "/")
    return F.concat_ws("/", F.element_at(parts, -2), F.element_at(parts, -1))


def finish_replay(result: JobResult, rows_written: dict[str, int]) -> None:
    """Put the written row counts in the replay summary, then its lines."""
    for log in result.summary["logs"]:
        log["tables"] = {table: rows_written[output] for table, output in log["tables"].items()}
    result.lines = local_replay.replay_lines(result.summary)


# --- lsn_audit ------------------------------------------------------------------------------------


def _anomaly(frame: DataFrame, kind: Any, **columns: Any) -> DataFrame:
    values = {name: F.lit(None) for name in jobs.ANOMALY.names}
    values.update(replica=F.col("replica"), shard=F.col("shard"), kind=kind)
    values.update(columns)
    return cast_to(
        frame.select([values[name].alias(name) for name in jobs.ANOMALY.names]), jobs.ANOMALY
    )


def lsn_audit(spark: SparkSession, params: JobParams) -> JobResult:
    records = read(spark, params, "audit", params.verify or VERIFY_REPORT).persist()
    log = ["replica", "shard"]
    # Skip records name record copies by (start DSN, LSN): matched against records (one row
    # per driver record, not per DSN), the skip pairs broadcast (they are few; a Python
    # source's size is unknown to Spark, which would otherwise shuffle both sides).
    pairs = records.filter(F.col("kind") == "skip").select(
        *log, F.explode(F.arrays_zip("skip_dsns", "skip_lsns")).alias("pair")
    )
    skips = F.broadcast(
        pairs.select(
            *log,
            F.col("pair.skip_dsns").alias("record_start_dsn"),
            F.col("pair.skip_lsns").alias("lsn"),
        ).distinct()
    )
    skip_keys = [*log, "record_start_dsn", "lsn"]
    entry_records = records.filter(F.col("kind") == "entry").join(
        skips.withColumn("skipped", F.lit(True)), skip_keys, "left"
    )

    def exploded(frame: DataFrame) -> DataFrame:
        """One row per DSN copy, exploded in the JVM from one row per driver record."""
        rows = frame.select(
            *log,
            "segment",
            "offset_bytes",
            "lsn",
            "record_start_dsn",
            F.posexplode("entry_checksums").alias("entry_index", "entry_checksum"),
        )
        return rows.withColumn("dsn", F.col("record_start_dsn") + F.col("entry_index"))

    skipped = exploded(entry_records.filter(F.col("skipped").isNotNull()))
    live = exploded(entry_records.filter(F.col("skipped").isNull()))
    found = [
        _anomaly(
            skipped,
            F.lit("skipped"),
            dsn_lo=F.col("dsn"),
            dsn_hi=F.col("dsn"),
            lsn_lo=F.col("lsn"),
            lsn_hi=F.col("lsn"),
            copies=F.lit(1),
            segment=F.col("segment"),
            offset_bytes=F.col("offset_bytes"),
        )
    ]
    # Copies of a DSN agree when their least and greatest checksums are equal (cheaper than
    # counting distinct values, which Spark plans as a second aggregation).
    copies = (
        live.groupBy(*log, "dsn")
        .agg(
            F.count("*").alias("n"),
            F.min("entry_checksum").alias("checksum_min"),
            F.max("entry_checksum").alias("checksum_max"),
            F.min("lsn").alias("lsn_min"),
            F.max("lsn").alias("lsn_max"),
        )
        .persist()
    )
    found.append(
        _anomaly(
            copies.filter(F.col("n") > 1),
            F.when(F.col("checksum_min") == F.col("checksum_max"), "duplicate").otherwise(
                "conflict"
            ),
            dsn_lo=F.col("dsn"),
            dsn_hi=F.col("dsn"),
            lsn_lo=F.col("lsn_min"),
            lsn_hi=F.col("lsn_max"),
            copies=F.col("n"),
        )
    )
    by_dsn = Window.partitionBy(*log).orderBy("dsn")
    dsns = copies.select(*log, "dsn").withColumn("previous", F.lag("dsn").over(by_dsn))
    found.append(
        _anomaly(
            dsns.filter(F.col("dsn") > F.col("previous") + 1),
            F.lit("gap"),
            dsn_lo=F.col("previous") + 1,
            dsn_hi=F.col("dsn") - 1,
        )
    )
    lsns = (
        records.filter(F.col("kind").isin(*RECORD_KINDS))
        .groupBy(*log, "lsn")
        .agg(F.min("segment").alias("segment"))
    )
    by_lsn = Window.partitionBy(*log).orderBy("lsn")
    lsns = lsns.withColumn("previous", F.lag("lsn").over(by_lsn)).withColumn(
        "previous_segment", F.lag("segment").over(by_lsn)
    )
    found.append(
        _anomaly(
            lsns.filter(F.col("lsn") > F.col("previous") + 1),
            F.lit("lsn_gap"),
            lsn_lo=F.col("previous") + 1,
            lsn_hi=F.col("lsn") - 1,
            segment=F.col("segment"),
            detail=F.when(
                F.col("segment") != F.col("previous_segment"), "across segments"
            ).otherwise("within a segment"),
        )
    )
    damage = records.filter(F.col("kind").isin("corrupt", "torn_tail"))
    found.append(
        _anomaly(
            damage,
            F.col("kind"),
            segment=F.col("segment"),
            offset_bytes=F.col("offset_bytes"),
            detail=F.col("error"),
        )
    )
    anomalies = found[0]
    for frame in found[1:]:
        anomalies = anomalies.unionByName(frame)
    anomalies = anomalies.orderBy(
        *[F.col(c).asc_nulls_first() for c in jobs.ANOMALY_ORDER]
    ).persist()  # collected for the summary, then written
    collected = [row.asDict() for row in anomalies.collect()]
    per_log = (
        records.groupBy(*log)
        .agg(
            F.max(F.when(F.col("kind") == "truncate", F.col("lsn"))).alias("truncated_lsn"),
            F.min(F.when(F.col("kind").isin(*RECORD_KINDS), F.col("lsn"))).alias("lsn_min"),
            F.max(F.when(F.col("kind").isin(*RECORD_KINDS), F.col("lsn"))).alias("lsn_max"),
        )
        .collect()
    )
    live_stats = {
        (r.replica, r.shard): r
        for r in copies.groupBy(*log)
        .agg(
            F.sum("n").alias("copies"),
            F.count("*").alias("distinct"),
            F.min("dsn").alias("lo"),
            F.max("dsn").alias("hi"),
        )
        .collect()
    }
    logs = []
    for r in sorted(per_log, key=lambda r: (r.replica, r.shard)):
        mine = [a for a in collected if (a["replica"], a["shard"]) == (r.replica, r.shard)]
        stats = live_stats.get((r.replica, r.shard))

        def count(kind: str, mine: list[dict[str, Any]] = mine) -> int:
            return sum(1 for a in mine if a["kind"] == kind)

        logs.append(
            {
                "replica": r.replica,
                "shard": r.shard,
                "entry_copies": int(stats.copies) if stats else 0,
                "distinct_dsns": int(stats.distinct) if stats else 0,
                "dsn_min": stats.lo if stats else None,
                "dsn_max": stats.hi if stats else None,
                "lsn_min": r.lsn_min,
                "lsn_max": r.lsn_max,
                "gaps": count("gap"),
                "duplicates": count("duplicate"),
                "conflicts": count("conflict"),
                "skipped_copies": count("skipped"),
                "lsn_gaps": count("lsn_gap"),
                "damaged": count("corrupt") + count("torn_tail"),
                "truncated_lsn": r.truncated_lsn or 0,
            }
        )
    result = JobResult(tables={"anomalies": anomalies})
    result.summary = {"logs": logs, "anomalies": len(collected)}
    result.lines = local.audit_lines(result.summary)
    return result


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
