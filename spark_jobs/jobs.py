"""What a job is, independent of the engine that runs it: its parameters, its result, and the
pieces of logic both engines share (histogram buckets, percentiles, the audit's anomaly
schema). Pure; no pyspark. Percentiles are logsvc/bench/measure.py's rule, the one every
benchmark uses: linear interpolation between the closest ranks, which is Spark SQL's exact
`percentile`, so the local engine gives Spark's figures.

    replay_as_of   tables as of a commit timestamp (spark_jobs/replay.py)
    lsn_audit      DSN gaps, duplicate copies, conflicting copies, skipped copies, LSN gaps
                   (within and across segments), damage, the truncation point
    replica_diff   per shard, every pair of replicas compared LSN by LSN
    write_stats    per table and time bucket: transactions, rows appended/deleted, bytes
    txn_latency    commit_ts - start_ts (physical ms) histogram and percentiles, and a PNG
    inventory      segments with sizes and ranges, no payload decoded; checkpoints (ckp_ts,
                   kind, blocks, the objects they name and their sizes)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from logsvc.bench.measure import percentile
from spark_jobs.filters import Bounds
from spark_jobs.inputs import OBJECTS_DIR, WAL_DIR, LogInputs, Unit, list_units

JOBS = ("replay_as_of", "lsn_audit", "replica_diff", "write_stats", "txn_latency", "inventory")
BUCKET_MS_DEFAULT = 3_600_000
PERCENTILES = (0.5, 0.9, 0.99)
HLC_LOGICAL_BITS = 16  # engine/clock.py: commit_ts = physical ms << 16 | logical


@dataclass(frozen=True, slots=True)
class JobParams:
    job: str
    inputs: LogInputs
    shards: frozenset[int] | None = None
    replicas: frozenset[str] | None = None
    verify: str | None = None  # None: the job's default
    as_of: int | None = None
    bucket_ms: int = BUCKET_MS_DEFAULT
    objects: tuple[tuple[int, str], ...] = ()
    """(shard, objects directory) given explicitly; see `objects_dir`."""
    rows_held_bytes: int | None = None
    """replay_as_of: bytes of a table's rows (and, apart, of its deleted keys) held in memory
    before they are spilled to local disk (spark_jobs/spill.py); None: the default,
    limits.REPLAY_ROWS_HELD_BYTES_MAX."""

    def objects_dir(self, shard: int) -> str | None:
        """The engine's objects directory for `shard`'s log: the one given, else for a file
        WAL in `DIR/wal` the directory `DIR/objects` when it exists, else None (an engine
        without objects: no checkpoint, no persisted block)."""
        for given_shard, directory in self.objects:
            if given_shard == shard:
                return directory
        return default_objects_dir(self.inputs, shard)

    def units(self) -> list[Unit]:
        return list_units(self.inputs, self.shards, self.replicas)

    def bounds(self) -> Bounds:
        return Bounds(shards=self.shards, replicas=self.replicas)

    def describe(self) -> dict[str, object]:
        return {
            "job": self.job,
            "input": self.inputs.describe(),
            "shards": None if self.shards is None else sorted(self.shards),
            "replicas": None if self.replicas is None else sorted(self.replicas),
            "verify": self.verify,
            "as_of": self.as_of,
            "bucket_ms": self.bucket_ms if self.job == "write_stats" else None,
            "objects": {str(shard): d for shard, d in self.objects} or None,
            **({"rows_held_bytes": self.rows_held_bytes} if self.rows_held_bytes else {}),
        }


@dataclass(slots=True)
class JobResult:
    """`tables`: name -> a pyarrow Table (local) or a Spark DataFrame, each to be written as
    one Parquet dataset; `summary`: the manifest's numbers; `lines`: the stdout summary;
    `files`: other outputs (name -> bytes), e.g. the latency PNG."""

    tables: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    """Tables already in the run directory (written where they were computed: a Spark task
    writes its log's), name -> rows."""
    driver_records_decoded: int | None = None
    """Driver records the job decoded (spark_jobs/records.py `DECODES`), in every process
    (a clean log's replay or audit decodes each record once); None where not counted (the
    Spark jobs that read through the Data Sources)."""


def default_objects_dir(inputs: LogInputs, shard: int) -> str | None:
    if not 0 <= shard < len(inputs.file_wals):
        return None
    wal_dir = inputs.file_wals[shard]
    if os.path.basename(wal_dir) != WAL_DIR:
        return None
    candidate = os.path.join(os.path.dirname(wal_dir), OBJECTS_DIR)
    return candidate if os.path.isdir(candidate) else None


def physical_ms(ts: int) -> int:
    return ts >> HLC_LOGICAL_BITS


def log2_bucket(value: int) -> int:
    """The lower bound of `value`'s power-of-two bucket: 0 for 0, else 2**floor(log2 value)."""
    assert value >= 0
    return 0 if value == 0 else 1 << (value.bit_length() - 1)


ANOMALY = pa.schema(
    [
        ("replica", pa.string()),
        ("shard", pa.int32()),
        ("kind", pa.string()),
        ("dsn_lo", pa.int64()),
        ("dsn_hi", pa.int64()),
        ("lsn_lo", pa.int64()),
        ("lsn_hi", pa.int64()),
        ("copies", pa.int64()),
        ("segment", pa.string()),
        ("offset_bytes", pa.int64()),
        ("detail", pa.string()),
    ]
)
ANOMALY_ORDER = ["replica", "shard", "kind", "dsn_lo", "lsn_lo", "segment", "offset_bytes"]

DIFF = pa.schema(
    [
        ("shard", pa.int32()),
        ("replica_a", pa.string()),
        ("replica_b", pa.string()),
        ("lsn", pa.int64()),
        ("kind", pa.string()),  # diverged | hole
        ("missing_in", pa.string()),
        ("checksum_a", pa.int64()),
        ("checksum_b", pa.int64()),
    ]
)
DIFF_ORDER = ["shard", "replica_a", "replica_b", "lsn"]

STATS = pa.schema(
    [
        ("shard", pa.int32()),
        ("db_id", pa.int64()),
        ("table_id", pa.int64()),
        ("bucket_start_ms", pa.int64()),
        ("txns", pa.int64()),
        ("commands", pa.int64()),
        ("rows_appended", pa.int64()),
        ("rows_deleted", pa.int64()),
        ("bytes", pa.int64()),
        ("first_commit_ts", pa.int64()),
        ("last_commit_ts", pa.int64()),
    ]
)
STATS_ORDER = ["shard", "db_id", "table_id", "bucket_start_ms"]

CHECKPOINTS = pa.schema(
    [
        ("shard", pa.int32()),
        ("objects_dir", pa.string()),
        ("directory", pa.string()),
        ("state", pa.string()),  # complete | damaged | incomplete (no manifest: ignored)
        ("error", pa.string()),
        ("ckp_ts", pa.int64()),
        ("ckp_dsn", pa.int64()),
        ("kind", pa.string()),
        ("tables", pa.int64()),
        ("blocks", pa.int64()),
        ("live_rows", pa.int64()),
        ("objects", pa.int64()),  # objects the manifest names (lists, dumps, deltas, data/)
        ("objects_bytes", pa.int64()),
        ("objects_missing", pa.int64()),
        ("dir_objects", pa.int64()),  # objects stored under the checkpoint's own directory
        ("dir_bytes", pa.int64()),
    ]
)

HISTOGRAM = pa.schema(
    [("bucket_lo_ms", pa.int64()), ("bucket_hi_ms", pa.int64()), ("txns", pa.int64())]
)


def sort_table(table: pa.Table, order: list[str]) -> pa.Table:
    return table.sort_by([(name, "ascending", "at_start") for name in order])


def latency_summary(latencies_sorted: Sequence[int], without_start: int) -> dict[str, Any]:
    """`without_start`: transactions with start_ts 0 (begun before any commit: their
    commit_ts - start_ts is the time since 1970, not a latency), left out of the figures."""
    if not latencies_sorted:
        return {"txns": 0, "txns_without_start_ts": without_start}
    return {
        "txns": len(latencies_sorted),
        "txns_without_start_ts": without_start,
        "p50_ms": percentile(latencies_sorted, 0.5),
        "p90_ms": percentile(latencies_sorted, 0.9),
        "p99_ms": percentile(latencies_sorted, 0.99),
        "max_ms": latencies_sorted[-1],
        "min_ms": latencies_sorted[0],
    }


def latency_lines(summary: dict[str, Any]) -> list[str]:
    if not summary.get("txns"):
        return ["txn_latency: no transaction entries"]
    return [
        f"txn_latency: {summary['txns']} transactions; commit_ts - start_ts (physical ms): "
        f"p50 {summary['p50_ms']:g}, p90 {summary['p90_ms']:g}, p99 {summary['p99_ms']:g}, "
        f"max {summary['max_ms']} ({summary['txns_without_start_ts']} begun before any commit "
        "left out)"
    ]
