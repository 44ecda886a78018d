"""On Spark (the suite's shared local[1] session), replay_as_of over an engine whose objects
and checkpoints live in S3 (moto, tests/support/s3server.py), with its outputs written to
`s3://` by the executors (the replay's per-log tasks, spark_engine.per_log): the
tables read back from S3 equal the local engine's on the same S3 objects and the engine's own
scans. Every block object, dump and delta object the replay needs is read by an executor
through the engine's S3 store: the job is given only the WAL directory and `--objects s3://`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.inputs import file_input
from spark_jobs.jobs import JobParams
from spark_jobs.run import run_job
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from tests.unit.spark_jobs.logs import StorageHistory, storage_history
from tests.unit.spark_jobs.test_s3_jobs import (
    BUCKET,
    OUT_BUCKET,
    _placeless,
    read_run,
    upload_objects,
    wal_only,
)


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> StorageHistory:
    return storage_history(str(tmp_path_factory.mktemp("storage")))


@pytest.mark.timeout(600)  # a replay on Spark; two took 246 s on a loaded 2-core box
def test_replay_on_spark_reads_objects_from_s3_and_writes_to_s3(
    spark: Any, storage: StorageHistory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with MotoServer() as server:
        server.create_bucket(BUCKET)
        server.create_bucket(OUT_BUCKET)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        monkeypatch.setenv("AWS_REGION", REGION)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://{server.endpoint}")
        upload_objects(os.path.join(storage.path, "objects"), server.endpoint, "eng1")
        wal = wal_only(storage, tmp_path)
        objects = ((0, "s3://engine/eng1"),)
        ckp2 = storage.checkpoints[-1].ckp_ts
        # One replay (the newest state, on top of the second checkpoint): the local engine's S3
        # tests cover each timestamp; here what matters is the executors' S3 reads and writes.
        for index, ts in enumerate((storage.visible["final"],)):
            params = JobParams("replay_as_of", file_input(wal), as_of=ts, objects=objects)
            on_spark = run_job(
                params, engine="spark", out="s3://runs/spark", run_id=str(index), spark=spark
            )
            on_local = run_job(params, engine="local", out="s3://runs/local", run_id=str(index))
            spark_run, local_run = read_run(on_spark.run_dir), read_run(on_local.run_dir)
            assert on_spark.run_dir == f"s3://runs/spark/replay_as_of/{index}"
            assert _placeless(spark_run["tables"]) == _placeless(local_run["tables"])
            assert spark_run["manifest"]["summary"] == local_run["manifest"]["summary"]
            got = {
                name.split("/", 1)[1].replace("/", "."): rows
                for name, rows in spark_run["tables"].items()
            }
            assert sorted(got) == sorted(storage.scans[ts])
            for name, rows in storage.scans[ts].items():
                key = next(iter(rows[0])) if rows else ""
                assert sorted(got[name], key=lambda r: r[key]) == sorted(rows, key=lambda r: r[key])
            assert spark_run["manifest"]["summary"]["logs"][0]["base"]["ckp_ts"] == ckp2
