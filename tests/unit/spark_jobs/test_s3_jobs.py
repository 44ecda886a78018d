"""The jobs over an engine whose objects and checkpoints live in S3, writing their outputs to
`s3://` (issue 23, target 3), on the local engine, against the S3-protocol server the
engine's own tests use (moto in server mode, tests/support/s3server.py).

The engine is a real one (tests/unit/spark_jobs/logs.py `storage_history`: flushes, a merge,
deletes, checkpoints, a truncated WAL); its objects directory is copied object by object
into a bucket through the engine's S3 store, and the job is given only the WAL directory and
`--objects s3://...`, so every checkpoint and block object it reads comes from S3. Every
job's outputs, written to `s3://` and read back from there, equal the same job's outputs on
the local directories; replay equals the engine's own scans. tests/spark/test_spark_s3.py
does the same on Spark, where the executors read the objects.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.objects.s3 import S3ObjectStore
from engine.objects.store import LocalDirStore
from spark_jobs import __main__ as cli
from spark_jobs import output
from spark_jobs.jobs import JOBS
from spark_jobs.objectstores import open_objects
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from tests.unit.spark_jobs.logs import StorageHistory, storage_history

BUCKET = "engine"
OUT_BUCKET = "runs"


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    with MotoServer() as running:
        running.create_bucket(BUCKET)
        running.create_bucket(OUT_BUCKET)
        yield running


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> StorageHistory:
    return storage_history(str(tmp_path_factory.mktemp("storage")))


@pytest.fixture
def s3_env(server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return f"http://{server.endpoint}"


def upload_objects(objects_dir: str, endpoint: str, prefix: str) -> int:
    """Every object of an engine's objects directory, put under `prefix` in BUCKET."""
    local = LocalDirStore(objects_dir, read_only=True)
    remote = S3ObjectStore(endpoint, BUCKET, prefix, ACCESS_KEY, SECRET_KEY, REGION)
    found = local.list("")
    for info in found:
        remote.put(info.name, local.get(info.name))
    return len(found)


def wal_only(storage: StorageHistory, tmp_path: Path) -> str:
    """The engine's WAL without its objects directory beside it."""
    path = str(tmp_path / "wal-only")
    shutil.copytree(os.path.join(storage.path, "wal"), os.path.join(path, "wal"))
    return path


def read_run(location: str) -> dict[str, Any]:
    """A run's manifest and tables, from a directory or an s3:// location."""
    manifest = output.read_manifest(location)
    tables = {}
    for name, described in manifest["outputs"].items():
        if "rows" not in described:
            continue
        if location.startswith("s3://"):
            store = open_objects(location)
            parts = [info.name for info in store.list(f"{described['path']}/")]
            rows = []
            for part in sorted(parts):
                rows += pq.read_table(io.BytesIO(store.get(part))).to_pylist()
        else:
            rows = pq.read_table(os.path.join(location, described["path"])).to_pylist()
        assert len(rows) == described["rows"], name
        tables[name] = rows
    return {"manifest": manifest, "tables": tables}


def test_every_job_reads_objects_from_s3_and_writes_to_s3(
    storage: StorageHistory, s3_env: str, tmp_path: Path, capsys: Any
) -> None:
    endpoint = s3_env.removeprefix("http://")
    assert upload_objects(os.path.join(storage.path, "objects"), endpoint, "eng1") > 10
    wal = wal_only(storage, tmp_path)
    ckp2 = storage.checkpoints[-1].ckp_ts
    for job in JOBS:
        if job == "replica_diff":
            continue  # one replica: nothing to compare (and no objects read)
        extra = ["--as-of", str(ckp2)] if job == "replay_as_of" else []
        on_s3 = [
            job, "--file-wal", wal, "--objects", "s3://engine/eng1", *extra,
            "--out", "s3://runs/out", "--run-id", "r1", "--s3-endpoint", s3_env,
        ]  # fmt: skip
        assert cli.main(on_s3) == cli.EXIT_OK, capsys.readouterr().err
        on_disk = [
            job,
            "--file-wal",
            storage.path,
            *extra,
            "--out",
            str(tmp_path),
            "--run-id",
            "r1",
        ]
        assert cli.main(on_disk) == cli.EXIT_OK, capsys.readouterr().err
        s3_run = read_run(f"s3://runs/out/{job}/r1")
        disk_run = read_run(os.path.join(tmp_path, job, "r1"))
        assert _placeless(s3_run["tables"]) == _placeless(disk_run["tables"]), job
        if job == "inventory":  # the same checkpoints, found in S3
            s3_ckps = s3_run["manifest"]["summary"]["checkpoints"]
            disk_ckps = disk_run["manifest"]["summary"]["checkpoints"]
            assert [c["objects_dir"] for c in s3_ckps] == ["s3://engine/eng1"] * len(s3_ckps)
            strip = [{k: v for k, v in c.items() if k != "objects_dir"} for c in s3_ckps]
            assert strip == [{k: v for k, v in c.items() if k != "objects_dir"} for c in disk_ckps]
            assert len(s3_ckps) >= 2
        else:
            assert s3_run["manifest"]["summary"] == disk_run["manifest"]["summary"], job
        if job == "replay_as_of":
            got = {
                name.split("/", 1)[1].replace("/", "."): rows
                for name, rows in s3_run["tables"].items()
            }
            assert sorted(got) == sorted(storage.scans[ckp2])
            for name, rows in storage.scans[ckp2].items():
                key = next(iter(rows[0])) if rows else ""
                assert sorted(got[name], key=lambda r: r[key]) == sorted(rows, key=lambda r: r[key])
            assert s3_run["manifest"]["summary"]["logs"][0]["base"]["ckp_ts"] == ckp2
    # A finished run on S3 is never overwritten.
    again = ["inventory", "--file-wal", wal, "--out", "s3://runs/out", "--run-id", "r1"]
    assert cli.main([*again, "--s3-endpoint", s3_env]) == cli.EXIT_FAILED
    assert "holds a finished run already" in capsys.readouterr().err


def _placeless(tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Rows without the columns that name where the inputs were (inventory's objects_dir
    and paths: the S3 location against the directory)."""
    return {
        name: [{k: v for k, v in row.items() if k not in ("objects_dir", "path")} for row in rows]
        for name, rows in tables.items()
    }


def test_s3_locations_fail_with_clear_errors(
    storage: StorageHistory,
    s3_env: str,
    tmp_path: Path,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wal = wal_only(storage, tmp_path)
    argv = ["inventory", "--file-wal", wal, "--out", str(tmp_path / "o"), "--s3-endpoint", s3_env]
    assert cli.main([*argv, "--objects", "s3://no-such-bucket/x"]) == cli.EXIT_FAILED
    assert "s3://no-such-bucket/x" in capsys.readouterr().err
    assert cli.main([*argv[:-2], "--s3-endpoint", "ftp://x", "--objects", "s3://engine"]) == 2
    assert "expected http(s)://HOST[:PORT]" in capsys.readouterr().err
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert cli.main([*argv, "--objects", "s3://engine/eng1"]) == cli.EXIT_USAGE
    assert "needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in capsys.readouterr().err


class _LargeOutput:
    """A replay's spilled table as `output.write_table` takes one (spill.SpilledTable's shape):
    `batches` of incompressible 1 KiB values made as they are read, 24 MiB in all."""

    schema = pa.schema([pa.field("n", pa.int64()), pa.field("blob", pa.binary())])
    batch_rows = 1024
    batch_count = 24
    num_rows = batch_rows * batch_count

    def __init__(self) -> None:
        self.closed = False

    def batches(self) -> Iterator[pa.RecordBatch]:
        for index in range(self.batch_count):
            first = index * self.batch_rows
            numbers = list(range(first, first + self.batch_rows))
            blobs = [hashlib.shake_256(str(n).encode()).digest(1024) for n in numbers]
            yield pa.record_batch([pa.array(numbers, pa.int64()), pa.array(blobs)], self.schema)

    def close(self) -> None:
        self.closed = True


def test_a_large_output_is_streamed_to_s3_not_held_whole(
    s3_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Parquet file goes up as it is written (issue 23): the Python heap never holds it
    (before, it was written whole into a BytesIO, then put), and it reads back whole."""
    location = f"s3://{OUT_BUCKET}/stream/run-1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_env)
    small = pa.table({"n": [1]})
    assert output.write_table(location, "small", small) == 1  # imports and clients made
    table = _LargeOutput()
    tracemalloc.start()
    try:
        rows = output.write_table(location, "big", table)
        _, python_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == table.num_rows and table.closed
    assert python_peak < 8 * 1024 * 1024  # the file is over 24 MiB
    store = open_objects(location)
    assert store.size("big/part-00000.parquet") > 24 * 1024 * 1024
    back = pq.read_table(store.open_input("big/part-00000.parquet"))
    assert back.num_rows == table.num_rows
    assert back.column("n").to_pylist() == list(range(table.num_rows))
