"""Run one job on one engine and write its outputs: the shell around local.py and
spark_engine.py (they compute; this writes). The Spark session is built here (through
session.py) and always stopped (spark.md §5.12: an exited JVM otherwise lingers).

Outputs go to `OUT/<job>/<run-id>/` (output.py): each table as a Parquet dataset
(`<name>/part-*.parquet`), other files beside them, `_manifest.json` last.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

from logsvc.bench.measure import own_cpu_s
from spark_jobs import jvm_archive, local, output
from spark_jobs.engines import ENGINE_LOCAL, ENGINE_SPARK, ENGINES
from spark_jobs.jobs import JobParams, JobResult
from spark_jobs.objectstores import is_s3, open_objects
from spark_jobs.progress import LocalProgress
from spark_jobs.records import DECODES

__all__ = ["ENGINES", "ENGINE_LOCAL", "ENGINE_SPARK", "RunOutcome", "run_job"]


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run_dir: str
    manifest: dict[str, Any]
    lines: list[str]


def run_job(
    params: JobParams,
    *,
    engine: str,
    out: str,
    run_id: str | None = None,
    master: str | None = None,
    spark: Any = None,
    engine_reason: str | None = None,
    progress: bool = False,
    quiet: bool = True,
) -> RunOutcome:
    """`spark`: an existing session to use (tests share one); otherwise one is built and
    stopped here. `engine_reason`: why this engine (engines.choose_engine), kept in the
    manifest. `progress`: draw a progress display on stderr (the local engine's line, or
    Spark's console bar); `quiet`: Spark logs errors only (session.py)."""
    assert engine in ENGINES
    started = time.time()
    cpu_started = own_cpu_s()
    directory = output.run_dir(out, params.job, run_id or output.new_run_id())
    class_archive: str | None = None  # a per-log Spark job's driver JVM (jvm_archive.py)
    if engine == ENGINE_LOCAL:
        input_bytes = sum(unit.size_bytes for unit in params.units()) if progress else 0
        with LocalProgress(input_bytes) if progress else contextlib.nullcontext():
            decoded_before = DECODES.total
            result = local.run(params, directory)
            result.driver_records_decoded = DECODES.total - decoded_before
        rows = {**result.written, **_write_local(result, directory)}
    else:
        own = spark is None
        if own:
            from spark_jobs.session import (
                LEAN_JVM_OPTIONS,
                PER_LOG_JOBS,
                get_spark,
                launched_by_spark_submit,
                lean_jvm_conf,
            )

            per_log = params.job in PER_LOG_JOBS
            archived = per_log and not launched_by_spark_submit()  # else the JVM runs already
            archive = jvm_archive.use_option(LEAN_JVM_OPTIONS) if archived else None
            if archived:
                class_archive = "used" if archive else "none" if jvm_archive.enabled() else "off"
            spark = get_spark(
                f"spark_jobs {params.job}",
                master,
                lean_jvm_conf(archive) if per_log else None,
                quiet=quiet,
                progress=progress,
                data_sources=not per_log,
            )
        try:
            from spark_jobs import spark_engine
            from spark_jobs.session import export_s3_env

            export_s3_env(spark)

            result = spark_engine.run(spark, params, directory)
            rows = {**result.written, **_write_spark(spark, result, directory)}
            master_used = spark.sparkContext.master
        finally:
            if own:
                spark.stop()
        if class_archive == "none":  # for the next run (jvm_archive.py)
            started_build = jvm_archive.build_in_background(LEAN_JVM_OPTIONS)
            class_archive = "none (a build started)" if started_build else class_archive
    outputs = {name: {"path": name, "rows": count} for name, count in rows.items()}
    for name, data in result.files.items():
        output.write_file(directory, name, data)
        outputs[name] = {"path": name, "bytes": len(data)}
    manifest = {
        "job": params.job,
        "run_id": os.path.basename(directory),
        "engine": engine,
        "engine_reason": engine_reason or f"engine {engine} asked for",
        "spark_master": master_used if engine == ENGINE_SPARK else None,
        "params": params.describe(),
        "outputs": outputs,
        "summary": result.summary,
        "started_unix_s": round(started, 3),
        "wall_s": round(time.time() - started, 3),
        "driver_cpu_s": round(own_cpu_s() - cpu_started, 3),
    }
    if class_archive is not None:
        manifest["jvm_class_archive"] = class_archive
    if result.driver_records_decoded is not None:
        manifest["driver_records_decoded"] = result.driver_records_decoded
    output.write_manifest(directory, manifest)
    return RunOutcome(directory, manifest, result.lines)


def _write_local(result: JobResult, directory: str) -> dict[str, int]:
    return {
        name: output.write_table(directory, name, table) for name, table in result.tables.items()
    }


def _write_spark(spark: Any, result: JobResult, directory: str) -> dict[str, int]:
    rows = {}
    if is_s3(directory):  # the executors put the objects (objectsource.py)
        from spark_jobs import objectsource

        for name, frame in result.tables.items():
            writer = frame.write.format(objectsource.NAME).mode("append")
            writer.option("location", directory).option("table", name).save()
            rows[name] = _rows_in_objects(directory, name)
        return rows
    for name, frame in result.tables.items():
        path = os.path.join(directory, name)
        frame.write.mode("overwrite").parquet(path)
        rows[name] = spark.read.parquet(path).count()  # from the files' footers
    return rows


def _rows_in_objects(location: str, name: str) -> int:
    """Rows of the Parquet objects under `name/` (from their footers, as Spark's count of a
    written dataset reads them)."""
    import pyarrow.parquet as pq

    store = open_objects(location)
    total = 0
    for info in store.list(f"{name}/"):
        source = store.open_input(info.name)
        try:
            total += pq.read_metadata(source).num_rows
        finally:
            source.close()
    return total
