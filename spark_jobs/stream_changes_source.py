"""`spark.readStream.format("logsvc_changes")`: the committed rows of an engine whose WAL is a
logsvc shard, as a change stream (the rules and the row shape: spark_jobs/stream_changes.py).

    spark.readStream.format("logsvc_changes")
         .option("clientConfig", "/srv/logsvc/client.toml")   # or nodes=host:port,... + token
         .option("shard", "1")                                 # the engine's WAL shard
         .load()   # table, op, key, columns, commit_ts, dsn, lsn, block_id, row_offset

One ordered stream per shard, so it is read by a simple stream reader in the driver's Python
process: each micro-batch reads from the offset's LSN with bounded calls until the log's end
(or availableNow's target), ends at the last point where nothing is pending, and holds at most
`STREAM_CHANGES_PER_BATCH_MAX` changes. Spark replays an uncommitted batch from its checkpoint
with `readBetweenOffsets`, which reads the same records again.

The catalog (each table's schema) at a batch's start is kept between batches; a query started
from a checkpoint rebuilds it once by reading the log's catalog commands from its first
retained LSN up to the checkpoint's offset. What this stream refuses, with the reason:
truncation past its offset (`DataLost`; `failOnDataLoss=false` is not offered: a change stream
with a silent gap would misstate every table it touches), and a table created below the log's
truncation point (`ChangesRefused`; checkpoints are not read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from logsvc.client import SyncClient
from spark_jobs.errors import BadInput, ChangesRefused, DataLost
from spark_jobs.limits import STREAM_CHANGES_PER_BATCH_MAX
from spark_jobs.stream_changes import CHANGES_DDL, Catalog, Change, ChangeReader, ChangesOffset
from spark_jobs.stream_source import check_client_options, client_of, flag, pages, shard_list


class _ChangesReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options  # case-insensitive as Spark gives it: keep it so
        shards = shard_list(self.options)
        if len(shards) != 1:
            raise BadInput(f"option shard: one shard (the engine's WAL shard), not {shards}")
        self.shard = shards[0]
        self._client: SyncClient | None = None
        self._target: int | None = None
        self._catalog: tuple[ChangesOffset, Catalog] | None = None

    def _cluster(self) -> SyncClient:
        if self._client is None:
            self._client = client_of(self.options)
        return self._client

    def _span(self) -> tuple[int, int]:
        status = self._cluster().leader_status(self.shard)
        return status.first_lsn, status.next_lsn

    def initialOffset(self) -> dict[str, Any]:
        first_lsn, _ = self._span()
        return ChangesOffset(first_lsn - 1, 0, False).to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._span()[1] - 1

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        begin = ChangesOffset.from_json(start)
        first_lsn, next_lsn = self._span()
        end_lsn = next_lsn - 1 if self._target is None else min(self._target, next_lsn - 1)
        rows, point = self._read(begin, first_lsn, end_lsn, STREAM_CHANGES_PER_BATCH_MAX)
        return iter(rows), point.to_json()

    def readBetweenOffsets(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[tuple[Any, ...]]:
        begin, stop = ChangesOffset.from_json(start), ChangesOffset.from_json(end)
        first_lsn, _ = self._span()
        rows, point = self._read(begin, first_lsn, stop.lsn, None)
        if point != stop:
            raise ChangesRefused(
                f"replaying the batch {begin.to_json()} .. {stop.to_json()} ended at "
                f"{point.to_json()}: the log changed under the checkpoint"
            )
        return iter(rows)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # logsvc keeps no reader state

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _read(
        self, begin: ChangesOffset, first_lsn: int, end_lsn: int, changes_max: int | None
    ) -> tuple[list[Change], ChangesOffset]:
        """The changes from `begin` up to the last resolved point at or below `end_lsn`
        (stopping at the first one past `changes_max` changes), and that point."""
        if begin.lsn + 1 < first_lsn:
            raise DataLost(
                self.shard,
                begin.lsn + 1,
                first_lsn - 1,
                f"the log now starts at LSN {first_lsn} (truncated by the engine's checkpoint) "
                "and this change stream was at that point",
            )
        catalog = self._catalog_at(begin, first_lsn)
        reader = ChangeReader(begin, catalog, first_lsn)
        rows: list[Change] = []
        self._feed(reader, first_lsn, end_lsn, lambda: _cut(reader, rows, changes_max))
        reader.abandon()
        self._catalog = (reader.point, catalog)
        return rows, reader.point

    def _catalog_at(self, at: ChangesOffset, first_lsn: int) -> Catalog:
        if self._catalog is not None and self._catalog[0] == at:
            return self._catalog[1]
        catalog = Catalog()
        start = ChangesOffset(first_lsn - 1, 0, False)
        if at.lsn <= start.lsn:
            return catalog
        reader = ChangeReader(start, catalog, first_lsn, rows=False)
        none: list[Change] = []
        self._feed(reader, first_lsn, at.lsn, lambda: _cut(reader, none, None))
        if reader.point != at:
            raise ChangesRefused(
                f"the catalog at offset {at.to_json()} cannot be rebuilt from the retained log "
                f"(it starts at LSN {first_lsn}; reading it to LSN {at.lsn} ends at "
                f"{reader.point.to_json()})"
            )
        return catalog

    def _feed(
        self, reader: ChangeReader, first_lsn: int, end_lsn: int, after: Callable[[], bool]
    ) -> None:
        """Offer `reader` the records after its point up to `end_lsn`; `after()` is called
        after each record and stops the feed when it returns true."""
        lo = reader.point.lsn + 1
        if lo > end_lsn:
            return
        for first, records in pages(self._cluster(), self.shard, lo, end_lsn):
            for index, payload in enumerate(records):
                reader.offer(first + index, payload)
                if after():
                    return


def _cut(reader: ChangeReader, rows: list[Change], changes_max: int | None) -> bool:
    """At a resolved point, keep the changes up to it; true once past `changes_max`."""
    if not reader.resolved:
        return False
    rows.extend(reader.cut())
    return changes_max is not None and len(rows) >= changes_max


class LogsvcChangesSource(DataSource):
    """An engine's committed changes, from its logsvc WAL shard."""

    @classmethod
    def name(cls) -> str:
        return "logsvc_changes"

    def schema(self) -> str:
        return CHANGES_DDL

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:
        check_client_options(self.options)
        if not flag(self.options, "failOnDataLoss", True):
            raise BadInput(
                "option failOnDataLoss=false: the change stream does not skip lost changes "
                "(a gap would misstate every table it touches); read from a new checkpoint"
            )
        return _ChangesReader(self.options)
