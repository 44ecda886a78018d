"""Measurements of the object layer, printed as one JSON object.

    python -m engine.objects.bench [--moto] [--rows-bloom 10000000]

Why a script and not a test: timings on a shared 2-core machine are too noisy to assert, but
the figures belong in the report (issue 14's targets rest on them). Each figure is the
minimum and the median of several runs. `--moto` also starts a moto S3 server (a dev
dependency) on a free loopback port, measures put/get through `S3ObjectStore`, and stops it
by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.objects import blockfile
from engine.objects.bloom import BloomFilter
from engine.objects.store import LocalDirStore, ObjectStore
from engine.objects.zonemap import Pruner, ZoneMap, prune
from engine.schema import Column, Schema
from logsvc.bench.measure import percentile

SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("customer", "int32"),
        Column("amount", "float64"),
        Column("note", "string", nullable=True),
    ],
    ["id"],
)


def _timed(run: Callable[[], object], repeat: int) -> dict[str, float]:
    assert repeat >= 1
    times_ms = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times_ms.append((time.perf_counter() - began) * 1e3)
    times_ms.sort()
    median_ms = percentile(times_ms, 0.5)
    assert median_ms is not None  # repeat >= 1
    return {"min_ms": round(times_ms[0], 3), "median_ms": median_ms}


def _rows(first_id: int, count: int, rng: np.random.Generator) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(np.arange(first_id, first_id + count, dtype=np.int64)),
            "customer": pa.array(rng.integers(0, 1000, count, dtype=np.int32)),
            "amount": pa.array(rng.random(count) * 100),
            "note": pa.array([f"note {i % 97}" for i in range(count)]),
            blockfile.COMMIT_TS_COLUMN: pa.array(np.full(count, 7, dtype=np.uint64)),
        },
        schema=blockfile.object_schema(SCHEMA),
    )


def bench_bloom(rows: int) -> dict[str, Any]:
    keys = pa.array(np.arange(rows, dtype=np.int64))
    result = _timed(lambda: BloomFilter.build([keys]), 3)
    bloom = BloomFilter.build([keys])
    absent = pa.array(np.arange(rows, rows + 1_000_000, dtype=np.int64))
    result["keys"] = rows
    result["size_bytes"] = bloom.size_bytes
    result["false_positive_rate"] = round(float(bloom.might_contain_many([absent]).mean()), 5)
    result["might_contain_one_key_us"] = round(
        _timed(lambda: [bloom.might_contain(k) for k in range(1000)], 3)["min_ms"], 3
    )
    return result


def bench_prune(block_count: int) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    block_rows = 8192
    zonemaps = [ZoneMap.build(_rows(i * block_rows, block_rows, rng)) for i in range(block_count)]
    middle = block_count // 2 * block_rows
    filters = {
        "id_range_10k": (pc.field("id") >= middle) & (pc.field("id") < middle + 10_000),
        "customer_eq_42": pc.field("customer") == 42,
        "id_eq": pc.field("id") == middle + 5,
    }
    result: dict[str, Any] = {"blocks": block_count}
    cold = [ZoneMap.from_bytes(z.to_bytes(), "b") for z in zonemaps]
    began = time.perf_counter()
    prune(cold, filters["id_eq"])
    result["first_call_with_guarantee_build_ms"] = round((time.perf_counter() - began) * 1e3, 3)
    pruner = Pruner(zonemaps)
    result["pruner_build"] = _timed(lambda: Pruner(zonemaps), 5)
    for name, expression in filters.items():

        def once(expression: pc.Expression = expression) -> object:
            return prune(zonemaps, expression)

        def built(expression: pc.Expression = expression) -> object:
            return pruner.prune(expression)

        entry: dict[str, Any] = {"prune": _timed(once, 5), "pruner_prune": _timed(built, 5)}
        entry["kept"] = len(pruner.prune(expression))
        result[name] = entry
    return result


def bench_parquet(root: str) -> dict[str, Any]:
    rng = np.random.default_rng(2)
    store = LocalDirStore(os.path.join(root, "parquet"))
    data = _rows(0, 8 * 8192, rng)
    began = time.perf_counter()
    meta = blockfile.write_object(
        store, "seg.parquet", schema=SCHEMA, table_id=1, level=2, data=data
    )
    write_ms = (time.perf_counter() - began) * 1e3
    reader = blockfile.BlockObjectReader(store, "seg.parquet")
    result: dict[str, Any] = {
        "segment_rows": data.num_rows,
        "segment_bytes": meta.size_bytes,
        "write_l2_segment_ms": round(write_ms, 3),
        "read_meta_footer_only": _timed(lambda: blockfile.read_meta(store, "seg.parquet"), 20),
        "key_column_of_one_block_open_reader": _timed(lambda: reader.read_keys(3), 50),
        "key_column_of_one_block_cold_open": _timed(
            lambda: blockfile.read_keys(store, "seg.parquet", 3), 20
        ),
        "whole_block_open_reader": _timed(lambda: reader.read_block(3), 20),
    }
    reader.close()
    store.close()
    return result


def bench_put_get(store: ObjectStore, label: str) -> dict[str, Any]:
    result: dict[str, Any] = {"store": label}
    for size in (4 * 1024, 1024 * 1024):
        payload = os.urandom(size)
        names = iter(f"bench/{size}/{index}" for index in range(10_000))
        first = f"bench/{size}/0"

        def put(payload: bytes = payload, names: Any = names) -> None:
            store.put(next(names), payload)

        def get(first: str = first) -> bytes:
            return store.get(first)

        def ranged(first: str = first, offset: int = size // 2) -> bytes:
            return store.get_range(first, offset, 1024)

        result[f"{size // 1024}KiB"] = {
            "put": _timed(put, 20),
            "get": _timed(get, 20),
            "get_range_1KiB": _timed(ranged, 20),
        }
    return result


def _with_moto(run: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "moto did not start"
                time.sleep(0.05)
        put = urllib.request.Request(f"http://127.0.0.1:{port}/bench", method="PUT")
        urllib.request.urlopen(put, timeout=5).close()
        return run(f"127.0.0.1:{port}")
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.objects.bench")
    parser.add_argument("--rows-bloom", type=int, default=10_000_000)
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--moto", action="store_true", help="also measure S3 put/get on moto")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "bloom_build": bench_bloom(args.rows_bloom),
        "prune": bench_prune(args.blocks),
    }
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as root:
        report["parquet"] = bench_parquet(root)
        local = LocalDirStore(os.path.join(root, "local"))
        report["put_get_local"] = bench_put_get(local, local.description)
        local.close()
    if args.moto:
        from engine.objects.s3 import S3ObjectStore

        def on_moto(endpoint: str) -> dict[str, Any]:
            store = S3ObjectStore(endpoint, "bench", "p", "k", "s")
            return bench_put_get(store, store.description)

        report["put_get_moto"] = _with_moto(on_moto)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
