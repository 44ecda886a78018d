"""Spark streaming over a live logsvc cluster (issue 23 target 2): `logsvc` (records with
per-shard LSN offsets) and `logsvc_changes` (an engine's committed rows).

How: a real 3-node cluster on loopback (tests/e2e's `LocalCluster`, stopped by PID whatever
happens). While a thread appends records to shard 2 and an engine (in another thread, its WAL
on shard 1) commits inserts and deletes, both streams run with `availableNow` triggers into
Parquet, twice; between the runs the checkpoint and the sink lose their last batch's commit
(a crash after Spark logged the batch's offsets and before the sink committed it), so the
restart replays that batch from its checkpointed offsets. After the writers stop, a last run
catches up. Then every appended record is in the sink exactly once, and the changes are every
committed insert and delete exactly once, in DSN order with commit_ts never going back.

The truncation test: records read, then the shard truncated past the query's offset. The
next run fails with DataLost naming the shard and the lost LSNs; with failOnDataLoss=false
it skips them and the query's progress says so (`endOffset.lost`).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import Column, Engine, Schema
from tests.e2e.conftest import LocalCluster

ROWS = Schema([Column("id", "int64"), Column("note", "string", nullable=True)], ["id"])
QUERY_S_MAX = 120
WRITER_S_MAX = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = LocalCluster(tmp_path_factory.mktemp("cluster"), shards=3)
    try:
        yield started
    finally:
        started.close()


def _run(spark: Any, fmt: str, options: dict[str, str], out: Path, checkpoint: Path) -> Any:
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(QUERY_S_MAX), "the availableNow query did not finish"
    finally:
        query.stop()
    return query


def _forget_last_batch(checkpoint: Path, out: Path) -> int:
    """A crash after the offsets of the last batch were logged and before its commit: the
    checkpoint's commit and the sink's metadata entry of that batch removed."""
    commits = sorted(int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit())
    last = commits[-1]
    for folder in (checkpoint / "commits", out / "_spark_metadata"):
        (folder / str(last)).unlink()
        (folder / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's local checksum file
    return last


class Writers:
    """Appends to shard 2 and engine commits on shard 1, from two threads, until stopped."""

    def __init__(self, cluster: LocalCluster, engine_dir: Path) -> None:
        self.cluster = cluster
        self.engine_dir = engine_dir
        self.stop = threading.Event()
        self.appended: list[tuple[int, bytes]] = []
        self.inserted: list[int] = []
        self.deleted: list[int] = []
        self.errors: list[BaseException] = []
        self.engine_ready = threading.Event()
        self.threads = [
            threading.Thread(target=self._append, daemon=True),
            threading.Thread(target=self._commit, daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()
        assert self.engine_ready.wait(WRITER_S_MAX), self.errors

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(WRITER_S_MAX)
            assert not thread.is_alive()
        assert not self.errors, self.errors

    def _append(self) -> None:
        client = self.cluster.client()
        try:
            n = 0
            while not self.stop.is_set() or n < 40:
                payloads = [f"r{n + i}".encode() for i in range(5)]
                lsns = client.append(2, payloads)
                self.appended.extend(zip(lsns, payloads, strict=True))
                n += 5
                self.stop.wait(0.02)
        except BaseException as exc:  # reported by finish()
            self.errors.append(exc)
        finally:
            client.close()

    def _commit(self) -> None:
        async def main() -> None:
            eng = await Engine.open(
                str(self.engine_dir),
                wal="logsvc",
                client_config=f"{self.cluster.dir}/client.toml",
                shard=1,
                objects="none",
            )
            try:
                async with eng.transaction() as txn:
                    await txn.create_database("d")
                    await txn.create_table("d", "t", ROWS)
                self.engine_ready.set()
                n = 0
                while not self.stop.is_set() or n < 30:
                    async with eng.transaction() as txn:
                        rows = [{"id": n + i, "note": f"n{n + i}"} for i in range(3)]
                        await txn.table("d", "t").insert(rows)
                    self.inserted.extend(n + i for i in range(3))
                    if n % 9 == 0:
                        async with eng.transaction() as txn:
                            await txn.table("d", "t").delete([n])
                        self.deleted.append(n)
                    n += 3
                    await asyncio.sleep(0.01)
            finally:
                await eng.close()

        try:
            asyncio.run(main())
        except BaseException as exc:
            self.errors.append(exc)
            self.engine_ready.set()


def test_streams_exactly_once_across_a_restart(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    config = f"{cluster.dir}/client.toml"
    writers = Writers(cluster, tmp_path / "engine")
    records = {"clientConfig": config, "shards": "2"}
    changes = {"clientConfig": config, "shard": "1"}
    rec_out, rec_ckpt = tmp_path / "records", tmp_path / "records-ckpt"
    chg_out, chg_ckpt = tmp_path / "changes", tmp_path / "changes-ckpt"
    writers.start()
    try:
        for _ in range(2):  # while appends and commits go on
            _run(spark, "logsvc", records, rec_out, rec_ckpt)
            _run(spark, "logsvc_changes", changes, chg_out, chg_ckpt)
        _forget_last_batch(rec_ckpt, rec_out)
        _forget_last_batch(chg_ckpt, chg_out)
        _run(spark, "logsvc", records, rec_out, rec_ckpt)
        _run(spark, "logsvc_changes", changes, chg_out, chg_ckpt)
    finally:
        writers.finish()
    _run(spark, "logsvc", records, rec_out, rec_ckpt)  # catch up after the writers stop
    _run(spark, "logsvc_changes", changes, chg_out, chg_ckpt)

    got = [(r.shard, r.lsn, bytes(r.payload)) for r in spark.read.parquet(str(rec_out)).collect()]
    assert sorted(got) == sorted((2, lsn, payload) for lsn, payload in writers.appended)

    rows = spark.read.parquet(str(chg_out)).collect()
    rows.sort(key=lambda r: (r.dsn, r.op != "create_database", r.block_id or 0, r.row_offset or 0))
    first_two = [(r.op, r.table) for r in rows[:2]]
    assert first_two == [("create_database", "d"), ("create_table", "d.t")]
    inserts = [json.loads(r.key) for r in rows if r.op == "insert"]
    assert sorted(inserts) == sorted(writers.inserted)  # each exactly once
    assert [json.loads(r.columns)["note"] for r in rows if r.op == "insert"] == [
        f"n{k}" for k in inserts
    ]
    assert inserts == sorted(inserts)  # the writer inserts ascending ids: commit order
    # Each delete carries its row's key (the WAL's DeleteKeys, issue 23), in commit order.
    assert [json.loads(r.key) for r in rows if r.op == "delete"] == writers.deleted
    dsns = [r.dsn for r in rows]
    assert dsns == sorted(dsns)
    timestamps = [r.commit_ts for r in rows]
    assert timestamps == sorted(timestamps)


def test_truncation_fails_typed_or_skips_and_says_so(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    config = f"{cluster.dir}/client.toml"
    client = cluster.client()
    try:
        first = client.append(3, [b"a", b"b", b"c"])
        out, ckpt = tmp_path / "out", tmp_path / "ckpt"
        options = {"clientConfig": config, "shards": "3"}
        _run(spark, "logsvc", options, out, ckpt)
        more = client.append(3, [b"d", b"e", b"f", b"g"])
        client.truncate(3, more[2])  # d and e gone before the query read them
    finally:
        client.close()

    with pytest.raises(Exception, match=rf"DataLost.*shard 3: LSNs {more[0]}\.\.{more[1]}"):
        _run(spark, "logsvc", options, out, ckpt)

    query = _run(spark, "logsvc", {**options, "failOnDataLoss": "false"}, out, ckpt)
    got = sorted(r.lsn for r in spark.read.parquet(str(out)).collect())
    assert got == [*first, more[2], more[3]]
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    lost = json.loads(progress[-1]["sources"][0]["endOffset"])["lost"]
    assert lost == {"3": {"lsns": 2, "last": [more[0], more[1]]}}
