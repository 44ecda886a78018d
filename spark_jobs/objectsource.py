"""The Spark Python Data Source `engine_objects`: a run's output tables written to a store
through the engine's own store port (spark_jobs/objectstores.py: S3, which Spark's own
writers cannot reach here: pyspark ships no hadoop-aws). (It read objects too, for the Spark
replay's persisted blocks; replay now reads them in its per-log task with the local engine's
code, spark_engine.py.)

Writing (`frame.write.format("engine_objects").mode("append").option("location", RUN)
.option("table", NAME).save()`): each task writes its rows as Parquet objects
`NAME/part-<partition>-<attempt>-<n>.parquet`, starting a new object every
`OUTPUT_PART_BYTES_MAX` of Arrow data (a task holds at most that much). Objects are
immutable and uniquely named per task attempt; the run's manifest (written by run.py after
the job) is what makes a run complete, as `_SUCCESS` does for Spark's own writers.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    WriterCommitMessage,
)

from spark_jobs.errors import BadInput
from spark_jobs.limits import OUTPUT_PART_BYTES_MAX

NAME = "engine_objects"


class EngineObjectsSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        raise BadInput("engine_objects is written to, not read")

    def writer(self, schema: Any, overwrite: bool) -> _Writer:
        return _Writer(self.options)


@dataclass
class _Written(WriterCommitMessage):
    names: tuple[str, ...]
    rows: int


class _Writer(DataSourceArrowWriter):
    def __init__(self, options: Any) -> None:
        self.location = str(options["location"])
        self.table = str(options["table"])

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Written:
        from pyspark import TaskContext

        from spark_jobs.objectstores import open_objects

        context = TaskContext.get()
        part = 0 if context is None else context.partitionId()
        attempt = 0 if context is None else context.attemptNumber()
        store = open_objects(self.location, read_only=False)
        names: list[str] = []
        pending: list[pa.RecordBatch] = []
        pending_bytes = rows = 0

        def flush() -> None:
            if not pending:
                return
            sink = io.BytesIO()
            pq.write_table(pa.Table.from_batches(pending), sink)
            name = f"{self.table}/part-{part:05d}-{attempt}-{len(names):04d}.parquet"
            store.put(name, sink.getvalue())
            names.append(name)
            pending.clear()

        for batch in iterator:
            pending.append(batch)
            pending_bytes += batch.nbytes
            rows += batch.num_rows
            if pending_bytes >= OUTPUT_PART_BYTES_MAX:
                flush()
                pending_bytes = 0
        flush()
        return _Written(tuple(names), rows)
