"""`python -m engine.objects.bench` runs and prints every figure the report quotes.

How: the bench's `main` at tiny sizes (1,000 bloom keys, 5 blocks), without moto (test_s3.py
covers the S3 store), its JSON parsed and its keys checked. The figures themselves are not
asserted: timings on a shared machine are too noisy to be a test.
"""

from __future__ import annotations

import json

import pytest

from engine.objects.bench import main


def test_bench_runs_at_small_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rows-bloom", "1000", "--blocks", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bloom_build"]["keys"] == 1000
    assert report["prune"]["id_eq"]["kept"] == 1
    assert report["parquet"]["segment_rows"] == 65536
    assert set(report["put_get_local"]) == {"store", "4KiB", "1024KiB"}
