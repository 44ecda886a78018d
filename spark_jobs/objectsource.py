"""The Spark Python Data Source `engine_objects`: Parquet objects of an engine's object store
(block objects, checkpoint dumps, delta objects) read on the executors through the engine's
own store port (spark_jobs/objectstores.py: a directory or S3), and a run's output tables
written to a store the same way. Used for stores Spark's own Parquet reader cannot reach
(S3: pyspark ships no hadoop-aws); a local directory is read by Spark itself (spark_engine.py).

Reading:

    spark.read.format("engine_objects").schema(DDL)
         .option("location", "s3://bucket/engine").option("names", json.dumps([...]))
         .option("arrow_schema", <base64 of the Arrow schema the batches are cast to>).load()

gives, per object (one input partition each), every row of every row group with the
schema's columns (read by name and cast) plus `file_key` (spark_engine._file_key of the
object: its last two name components) and `row_index` (the row's index in the file, as
Spark's `_metadata.row_index`). Batches are one row group at a time: a worker holds one row
group, not the object.

Writing (`frame.write.format("engine_objects").mode("append").option("location", RUN)
.option("table", NAME).save()`): each task writes its rows as Parquet objects
`NAME/part-<partition>-<attempt>-<n>.parquet`, starting a new object every
`OUTPUT_PART_BYTES_MAX` of Arrow data (a task holds at most that much). Objects are
immutable and uniquely named per task attempt; the run's manifest (written by run.py after
the job) is what makes a run complete, as `_SUCCESS` does for Spark's own writers.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from spark_jobs.errors import BadInput
from spark_jobs.limits import OUTPUT_PART_BYTES_MAX

NAME = "engine_objects"
FILE_KEY = "file_key"
ROW_INDEX = "row_index"


def encode_arrow_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def decode_arrow_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def file_key(name: str) -> str:
    return "/".join(name.split("/")[-2:])


class EngineObjectsSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        raise BadInput("engine_objects: give the schema (.schema(DDL)) and arrow_schema")

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(self.options)

    def writer(self, schema: Any, overwrite: bool) -> _Writer:
        return _Writer(self.options)


class _Reader(DataSourceReader):
    def __init__(self, options: Any) -> None:
        self.location = str(options["location"])
        self.names = [str(n) for n in json.loads(options["names"])]
        self.arrow_schema = str(options["arrow_schema"])

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(name) for name in self.names]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from spark_jobs.checkpoints import open_store

        target = decode_arrow_schema(self.arrow_schema)
        wanted = [f.name for f in target if f.name not in (FILE_KEY, ROW_INDEX)]
        name = str(partition.value)
        store = open_store(self.location)
        source = store.open_input(name)
        try:
            parquet = pq.ParquetFile(source)
            at = 0
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group, columns=wanted)
                rows = table.num_rows
                table = table.append_column(FILE_KEY, pa.array([file_key(name)] * rows))
                table = table.append_column(ROW_INDEX, pa.array(range(at, at + rows), pa.int64()))
                at += rows
                yield from table.select(target.names).cast(target).to_batches()
        finally:
            source.close()


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
