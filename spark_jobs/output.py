"""Where a run's outputs go: `OUT/<job>/<run-id>/`, one Parquet dataset per table, other
files beside them, and `_manifest.json` written last (in the role of Spark's `_SUCCESS`: a
run directory without it is incomplete). The manifest holds the job, its parameters and
inputs, the engine, every output with its row count, the summary, and the times.

OUT is a local directory or `s3://bucket/prefix` (objectstores.py says how S3 is
configured): there the run is the objects under `prefix/<job>/<run-id>/`, the manifest last.
A table's Parquet file is streamed up as it is written (a multipart upload a part at a time,
`S3ObjectStore.put_stream`: a worker holds one 10 MiB part, not the whole file, however large
the output; issue 23); the other files are small and put whole. Either way an object
appears complete or not at all.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
from collections.abc import Callable
from typing import Any

from engine.objects.errors import ObjectNotFound, ObjectsError
from spark_jobs.errors import BadInput, ObjectsUnreadable
from spark_jobs.objectstores import is_s3, open_objects

MANIFEST = "_manifest.json"


def new_run_id() -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{secrets.token_hex(3)}"


def run_dir(out: str, job: str, run_id: str) -> str:
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise BadInput(f"run id {run_id!r}: a plain name")
    if is_s3(out):
        location = f"{out.rstrip('/')}/{job}/{run_id}"
        try:
            open_objects(location, read_only=False).size(MANIFEST)
        except ObjectNotFound:
            return location
        except ObjectsError as exc:
            raise ObjectsUnreadable(location, str(exc)) from None
        raise BadInput(f"{location} holds a finished run already: choose another --run-id")
    path = os.path.join(os.path.abspath(out), job, run_id)
    if os.path.exists(os.path.join(path, MANIFEST)):
        raise BadInput(f"{path} holds a finished run already: choose another --run-id")
    os.makedirs(path, exist_ok=True)
    return path


def put(location: str, name: str, data: bytes) -> str:
    """An object `name` under an S3 run location, whole."""
    assert is_s3(location)
    try:
        open_objects(location, read_only=False).put(name, data)
    except ObjectsError as exc:
        raise ObjectsUnreadable(f"{location}/{name}", f"cannot write: {exc}") from None
    return f"{location}/{name}"


def put_stream(location: str, name: str, produce: Callable[[Any], None]) -> str:
    """An object `name` under an S3 run location, written by `produce(out)` as it goes."""
    assert is_s3(location)
    from engine.objects.s3 import S3ObjectStore  # pyarrow's S3 client: only for s3://

    store = open_objects(location, read_only=False)
    assert isinstance(store, S3ObjectStore)
    try:
        store.put_stream(name, produce)
    except ObjectsError as exc:
        raise ObjectsUnreadable(f"{location}/{name}", f"cannot write: {exc}") from None
    return f"{location}/{name}"


def write_file(directory: str, name: str, data: bytes) -> str:
    if is_s3(directory):
        return put(directory, name, data)
    path = os.path.join(directory, name)
    with open(path, "wb") as file:
        file.write(data)
    return path


def write_table(directory: str, name: str, table: Any, part: int = 0) -> int:
    """A pyarrow `table`, or a replay's spill.SpilledTable (written a batch at a time, then
    its file removed), as the Parquet file `name/part-<part>.parquet` of a run directory
    (local, or S3: streamed up a part at a time), by whichever process holds it: the local
    engine, or a Spark task writing its log's tables. Its row count."""
    import pyarrow.parquet as pq  # here: the CLI starts without pyarrow

    def write(where: Any) -> None:
        if not hasattr(table, "batches"):
            pq.write_table(table, where)
            return
        with pq.ParquetWriter(where, table.schema) as writer:
            for batch in table.batches():
                writer.write_batch(batch)
        table.close()

    file_name = f"{name}/part-{part:05d}.parquet"
    if is_s3(directory):
        put_stream(directory, file_name, write)
    else:
        os.makedirs(os.path.join(directory, name), exist_ok=True)
        write(os.path.join(directory, file_name))
    rows: int = table.num_rows
    return rows


def write_manifest(directory: str, manifest: dict[str, Any]) -> str:
    """Atomically (temp file, rename; or one S3 put): a reader never sees half a manifest."""
    if is_s3(directory):
        text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
        return put(directory, MANIFEST, text.encode())
    path = os.path.join(directory, MANIFEST)
    temp = path + ".tmp"
    with open(temp, "w") as file:
        json.dump(manifest, file, indent=2, sort_keys=True, default=str)
        file.write("\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)
    return path


def read_manifest(directory: str) -> dict[str, Any]:
    if is_s3(directory):
        loaded: dict[str, Any] = json.loads(open_objects(directory).get(MANIFEST))
        return loaded
    with open(os.path.join(directory, MANIFEST)) as file:
        loaded = json.load(file)
    return loaded
