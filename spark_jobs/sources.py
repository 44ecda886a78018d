"""The Spark Python Data Sources `tae_wal` and `logsvc_segments` (pyspark >= 4.1). Thin: the
reading is spark_jobs.walread's, the same code the local engine runs.

    spark.read.format("tae_wal").option("input", "file:/var/lib/engine")
         .option("level", "entry").option("verify", "report").load()
    spark.read.format("logsvc_segments").option("input", "logsvc:n1=/data/n1;n2=/data/n2").load()

Options (strings, as Spark passes them): `input` (spark_jobs/inputs.py), `level`
(`tae_wal`: segment, record, audit, entry, command, rows; `logsvc_segments`: raft, segment),
`verify` (true, false, report), `shards` and `replicas` (comma-separated), for level rows
`table_id` and `table_schema` (spark_jobs/schemas.py `schema_to_json`), and for level
command `batches=false` (leave `batch_ipc` and `cmd_bytes` null: no batch re-encoded), for
level audit `entry_checksums=false` (leave `entry_checksums` empty: no entry hashed).

One input partition per unit (inputs.py: a file WAL segment, or a logsvc shard replica).
Pushed filters: `shard` and `replica` (=, IN) prune units; `lsn` (lower bound) prunes file
WAL segments; `lsn`, `dsn`, `commit_ts` ranges (=, <, <=, >, >=) drop rows in the reader.
Every filter is recorded AND yielded back, so Spark still applies it to every row (a
filter only recorded was measured to return wrong rows: spark.md §4.1).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from spark_jobs.errors import BadInput
from spark_jobs.filters import RANGE_COLUMNS, Bounds
from spark_jobs.inputs import Unit, list_units, parse_inputs
from spark_jobs.schemas import schema_from_json, spark_ddl
from spark_jobs.verify import VERIFY_TRUE
from spark_jobs.walread import LEVEL_ENTRY, LEVEL_RAFT, LEVEL_SEGMENT, ReadOptions, read_unit

TAE_WAL_LEVELS = ("segment", "record", "audit", "entry", "command", "rows")
LOGSVC_SEGMENTS_LEVELS = (LEVEL_RAFT, LEVEL_SEGMENT)


def register(spark: Any) -> None:
    spark.dataSource.register(TaeWalSource)
    spark.dataSource.register(LogsvcSegmentsSource)
    # The streaming sources (issue 23 target 2): a live cluster through its client.
    from spark_jobs.stream_changes_source import LogsvcChangesSource
    from spark_jobs.stream_source import LogsvcStreamSource

    spark.dataSource.register(LogsvcStreamSource)
    spark.dataSource.register(LogsvcChangesSource)


def _read_options(
    options: Mapping[str, str], default_level: str, levels: Sequence[str]
) -> ReadOptions:
    level = options.get("level", default_level)
    if level not in levels:
        raise BadInput(f"level {level!r}: one of {', '.join(levels)}")
    table_id = options.get("table_id")
    table_schema = options.get("table_schema")
    return ReadOptions(
        level=level,
        verify=options.get("verify", VERIFY_TRUE),
        table_id=None if table_id is None else int(table_id),
        table_schema=None if table_schema is None else schema_from_json(table_schema),
        for_spark=True,
        batches=options.get("batches", "true") != "false",
        entry_checksums=options.get("entry_checksums", "true") != "false",
    )


def _bounds(options: Mapping[str, str]) -> Bounds:
    bounds = Bounds()
    if options.get("shards"):
        bounds = bounds.with_shards(frozenset(int(s) for s in options["shards"].split(",")))
    if options.get("replicas"):
        bounds = bounds.with_replicas(frozenset(options["replicas"].split(",")))
    return bounds


class _UnitPartition(InputPartition):
    def __init__(self, unit: Unit) -> None:
        super().__init__(unit)
        self.unit = unit


class _Reader(DataSourceReader):
    def __init__(
        self, options: Mapping[str, str], default_level: str, levels: Sequence[str]
    ) -> None:
        self.options = dict(options)
        self.read_options = _read_options(self.options, default_level, levels)
        self.bounds = _bounds(self.options)

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        columns = set(self.read_options.schema().names)
        for found in filters:
            self.bounds = _record(self.bounds, found, columns)
            yield found  # always: Spark re-checks every row (spark.md §4.1)

    def partitions(self) -> Sequence[InputPartition]:
        inputs = parse_inputs(self.options.get("input", ""))
        units = list_units(inputs, self.bounds.shards, self.bounds.replicas)
        return [_UnitPartition(unit) for unit in units if self.bounds.keeps_unit(unit)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _UnitPartition)
        options = ReadOptions(
            self.read_options.level,
            self.read_options.verify,
            self.bounds,
            self.read_options.table_id,
            self.read_options.table_schema,
            for_spark=True,
            batches=self.read_options.batches,
            entry_checksums=self.read_options.entry_checksums,
        )
        yield from read_unit(partition.unit, options)


def _record(bounds: Bounds, found: Filter, columns: set[str]) -> Bounds:
    """Bounds tightened by one pushed filter, when it is one the readers use."""
    attribute: tuple[str, ...] = tuple(getattr(found, "attribute", ()))
    if len(attribute) != 1 or attribute[0] not in columns:
        return bounds
    column = attribute[0]
    value: Any = getattr(found, "value", None)
    if column == "shard":
        if isinstance(found, EqualTo) and isinstance(value, int):
            return bounds.with_shards(frozenset({value}))
        if isinstance(found, In) and all(isinstance(v, int) for v in value):
            return bounds.with_shards(frozenset(value))
        return bounds
    if column == "replica":
        if isinstance(found, EqualTo) and isinstance(value, str):
            return bounds.with_replicas(frozenset({value}))
        if isinstance(found, In) and all(isinstance(v, str) for v in value):
            return bounds.with_replicas(frozenset(value))
        return bounds
    if column not in RANGE_COLUMNS or not isinstance(value, int) or isinstance(value, bool):
        return bounds
    if isinstance(found, EqualTo):
        return bounds.with_range(column, value, value)
    if isinstance(found, GreaterThan):
        return bounds.with_range(column, lo=value + 1)
    if isinstance(found, GreaterThanOrEqual):
        return bounds.with_range(column, lo=value)
    if isinstance(found, LessThan):
        return bounds.with_range(column, hi=value - 1)
    if isinstance(found, LessThanOrEqual):
        return bounds.with_range(column, hi=value)
    return bounds


class TaeWalSource(DataSource):
    """The engine's WAL (file backend or logsvc shard replicas) at a chosen level."""

    @classmethod
    def name(cls) -> str:
        return "tae_wal"

    def schema(self) -> str:
        return spark_ddl(_read_options(self.options, LEVEL_ENTRY, TAE_WAL_LEVELS).schema())

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(self.options, LEVEL_ENTRY, TAE_WAL_LEVELS)


class LogsvcSegmentsSource(DataSource):
    """logsvc replicas' shard stores read offline: one row per Raft entry (level raft), or
    per segment file (level segment)."""

    @classmethod
    def name(cls) -> str:
        return "logsvc_segments"

    def schema(self) -> str:
        return spark_ddl(_read_options(self.options, LEVEL_RAFT, LOGSVC_SEGMENTS_LEVELS).schema())

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(self.options, LEVEL_RAFT, LOGSVC_SEGMENTS_LEVELS)
