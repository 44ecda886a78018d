"""Where a run's outputs go: `OUT/<job>/<run-id>/`, one Parquet dataset per table, other
files beside them, and `_manifest.json` written last (in the role of Spark's `_SUCCESS`: a
run directory without it is incomplete). The manifest holds the job, its parameters and
inputs, the engine, every output with its row count, the summary, and the times.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
from typing import Any

from spark_jobs.errors import BadInput

MANIFEST = "_manifest.json"


def new_run_id() -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{secrets.token_hex(3)}"


def run_dir(out: str, job: str, run_id: str) -> str:
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise BadInput(f"run id {run_id!r}: a plain name")
    path = os.path.join(os.path.abspath(out), job, run_id)
    if os.path.exists(os.path.join(path, MANIFEST)):
        raise BadInput(f"{path} holds a finished run already: choose another --run-id")
    os.makedirs(path, exist_ok=True)
    return path


def write_file(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as file:
        file.write(data)
    return path


def write_manifest(directory: str, manifest: dict[str, Any]) -> str:
    """Atomically (temp file, rename): a reader never sees half a manifest."""
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
    with open(os.path.join(directory, MANIFEST)) as file:
        loaded: dict[str, Any] = json.load(file)
    return loaded
