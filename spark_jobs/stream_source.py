"""`spark.readStream.format("logsvc")`: a live logsvc cluster's shards as a stream, read
through the client (logsvc/client.py), with per-shard LSN offsets (spark_jobs/stream_offsets.py).

    spark.readStream.format("logsvc")
         .option("clientConfig", "/srv/logsvc/client.toml")   # or nodes=host:port,... + token
         .option("shards", "1,2")
         .option("startingOffsets", "earliest")                # latest, or offsets JSON
         .option("failOnDataLoss", "true")
         .option("maxRecordsPerTrigger", "100000")             # optional
         .load()                                               # shard int, lsn long, payload binary

The driver asks each shard's leader for its retained range (`leader_status`) to plan a
micro-batch; executors read the batch's LSNs with bounded `read` calls (`STREAM_READ_BYTES_MAX`
each), any replica answering, the leader (`tail`) when a lagging one has nothing yet. An
offset is the last LSN consumed per shard, so a batch is (start, end] and replays the same
records from Spark's checkpoint. Truncation: `DataLost` (shard, range) unless
`failOnDataLoss=false`, which skips the range, logs a warning, and records it in the offset
(the query's progress shows it: `sources[0].endOffset.lost`). A range truncated after the
plan, while a task reads it, is handled the same way in the task (warning in the executor's
log; it cannot reach the offset, which Spark fixed before the task ran).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from logsvc.client import SyncClient, Truncated
from spark_jobs.errors import BadInput, DataLost
from spark_jobs.limits import (
    STREAM_PARTITION_LSNS_MAX,
    STREAM_READ_BYTES_MAX,
    STREAM_READ_WAIT_S_MAX,
)
from spark_jobs.stream_offsets import Offsets, Retained, plan_end, ranges

log = logging.getLogger("spark_jobs.stream")

RECORDS_DDL = "shard int not null, lsn long not null, payload binary not null"
RECORDS_SCHEMA = pa.schema(
    [
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
    ]
)
TAIL_WAIT_MS = 1000
"""How long one `tail` call waits at the leader for LSNs a lagging replica did not have."""


# --- options (shared with the change stream, spark_jobs/stream_changes_source.py) ---------


def client_of(options: Mapping[str, str]) -> SyncClient:
    """A client for the cluster the options name: `clientConfig` (a client config file, as
    `logsvc dev-cluster up` writes) or `nodes` (host:port,...) with `token`."""
    config = options.get("clientConfig")
    nodes = options.get("nodes")
    if config and nodes:
        raise BadInput("options clientConfig and nodes: give one, not both")
    if config:
        return SyncClient(config)
    if not nodes:
        raise BadInput("option clientConfig (a client.toml) or nodes (host:port,...) is required")
    token = options.get("token")
    if not token:
        raise BadInput("option nodes needs option token (the cluster's data-plane token)")
    return SyncClient([n.strip() for n in nodes.split(",") if n.strip()], token)


def check_client_options(options: Mapping[str, str]) -> None:
    """The client options' errors at `load()` time, before any connection."""
    if options.get("clientConfig") and options.get("nodes"):
        raise BadInput("options clientConfig and nodes: give one, not both")
    if not options.get("clientConfig") and not options.get("nodes"):
        raise BadInput("option clientConfig (a client.toml) or nodes (host:port,...) is required")
    if options.get("nodes") and not options.get("token"):
        raise BadInput("option nodes needs option token (the cluster's data-plane token)")


def flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadInput(f"option {name}={value!r}: true or false")


def positive(options: Mapping[str, str], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise BadInput(f"option {name}={value!r}: a whole number >= 1")
    return number


def shard_list(options: Mapping[str, str]) -> list[int]:
    text = options.get("shards") or options.get("shard")
    if not text:
        raise BadInput("option shards (comma-separated shard ids) is required")
    try:
        shards = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise BadInput(f"option shards={text!r}: comma-separated shard ids") from None
    if not shards or shards[0] < 1:
        raise BadInput(f"option shards={text!r}: shard ids are >= 1")
    return shards


# --- executor side --------------------------------------------------------------------------


def pages(
    client: SyncClient, shard: int, lo: int, hi: int, *, fail_on_data_loss: bool = True
) -> Iterator[tuple[int, tuple[bytes, ...]]]:
    """LSNs [lo, hi] of `shard` as (first LSN, records), one bounded read call each."""
    at = lo
    waited_since: float | None = None
    while at <= hi:
        want = STREAM_READ_BYTES_MAX
        try:
            page = client.read(shard, at, want)
            if not page.records:
                page = client.tail(shard, at, want, TAIL_WAIT_MS)
        except Truncated as exc:
            first = exc.first_lsn if exc.first_lsn is not None else hi + 1
            gone_hi = min(hi, first - 1)
            if fail_on_data_loss:
                raise DataLost(
                    shard, at, gone_hi, "truncated while this micro-batch read it"
                ) from None
            log.warning(
                "shard %d: LSNs %d..%d were truncated while a micro-batch read them: skipped "
                "(failOnDataLoss=false)",
                shard,
                at,
                gone_hi,
            )
            at = gone_hi + 1
            continue
        records = page.records[: hi - at + 1]
        if not records:
            now = time.monotonic()
            waited_since = waited_since or now
            if now - waited_since > STREAM_READ_WAIT_S_MAX:
                raise TimeoutError(
                    f"shard {shard}: LSN {at} (planned up to {hi}) not handed out by any "
                    f"replica within {STREAM_READ_WAIT_S_MAX:.0f} s"
                )
            continue  # the tail call above waited TAIL_WAIT_MS at the leader
        waited_since = None
        assert page.first_lsn == at, (page.first_lsn, at)
        yield at, records
        at += len(records)


def read_range(
    client: SyncClient, shard: int, lo: int, hi: int, *, fail_on_data_loss: bool
) -> Iterator[pa.RecordBatch]:
    """LSNs [lo, hi] of `shard`, one Arrow batch per bounded read call."""
    for first, records in pages(client, shard, lo, hi, fail_on_data_loss=fail_on_data_loss):
        count = len(records)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([shard] * count, pa.int32()),
                pa.array(range(first, first + count), pa.int64()),
                pa.array(records, pa.binary()),
            ],
            schema=RECORDS_SCHEMA,
        )


class _Range(InputPartition):
    def __init__(self, shard: int, lo: int, hi: int) -> None:
        super().__init__((shard, lo, hi))
        self.shard = shard
        self.lo = lo
        self.hi = hi


# --- driver side ----------------------------------------------------------------------------


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options  # case-insensitive as Spark gives it: keep it so
        self.shards = shard_list(self.options)
        self.fail_on_data_loss = flag(self.options, "failOnDataLoss", True)
        self.records_max = positive(self.options, "maxRecordsPerTrigger")
        self.starting = self.options.get("startingOffsets", "earliest")
        self._client: SyncClient | None = None
        self._target: dict[int, int] | None = None
        self._latest: dict[int, int] | None = None

    def _cluster(self) -> SyncClient:
        if self._client is None:
            self._client = client_of(self.options)
        return self._client

    def _retained(self) -> dict[int, Retained]:
        client = self._cluster()
        spans = {}
        for shard in self.shards:
            status = client.leader_status(shard)
            spans[shard] = Retained(status.first_lsn, status.next_lsn)
        self._latest = {s: span.next_lsn - 1 for s, span in spans.items()}
        return spans

    def initialOffset(self) -> dict[str, Any]:
        if self.starting in ("earliest", "latest"):
            spans = self._retained()
            pick = (lambda s: s.first_lsn - 1) if self.starting == "earliest" else None
            lsns = {
                shard: pick(span) if pick else span.next_lsn - 1 for shard, span in spans.items()
            }
            return Offsets(lsns).to_json()
        given = Offsets.from_json(self.starting)
        if sorted(given.lsns) != self.shards:
            raise BadInput(
                f"option startingOffsets names shards {sorted(given.lsns)}, option shards "
                f"{self.shards}"
            )
        return given.to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.records_max is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.records_max)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {s: span.next_lsn - 1 for s, span in self._retained().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = Offsets.from_json(start)
        if sorted(begin.lsns) != self.shards:
            raise BadInput(
                f"the checkpoint's offsets name shards {sorted(begin.lsns)}, option shards "
                f"{self.shards}: a query keeps its shards (start a new checkpoint to change them)"
            )
        end, skips = plan_end(
            begin,
            self._retained(),
            fail_on_data_loss=self.fail_on_data_loss,
            target=self._target,
            records_max=limit.max_rows if isinstance(limit, ReadMaxRows) else None,
        )
        for skip in skips:
            log.warning(
                "shard %d: LSNs %d..%d were truncated before this query read them: skipped "
                "(failOnDataLoss=false; the offset's 'lost' counts them)",
                skip.shard,
                skip.lo,
                skip.hi,
            )
        return end.to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if self._latest is None:
            return None
        return Offsets(self._latest).to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        pieces = ranges(Offsets.from_json(start), Offsets.from_json(end), STREAM_PARTITION_LSNS_MAX)
        return [_Range(shard, lo, hi) for shard, lo, hi in pieces]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        client = client_of(self.options)
        try:
            yield from read_range(
                client,
                partition.shard,
                partition.lo,
                partition.hi,
                fail_on_data_loss=self.fail_on_data_loss,
            )
        finally:
            client.close()

    def commit(self, end: dict[str, Any]) -> None:
        pass  # nothing to release: logsvc keeps no reader state

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class LogsvcStreamSource(DataSource):
    """A logsvc cluster's shards, streamed: one row per record (shard, lsn, payload)."""

    @classmethod
    def name(cls) -> str:
        return "logsvc"

    def schema(self) -> str:
        return RECORDS_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        check_client_options(self.options)
        reader = _StreamReader(self.options)
        if reader.starting not in ("earliest", "latest"):
            Offsets.from_json(reader.starting)
        return reader
