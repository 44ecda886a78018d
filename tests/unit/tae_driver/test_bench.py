"""The benchmark entry point runs and prints one JSON object; bad options exit 2.

Runs `tae_driver.bench.main` in-process for a fraction of a second on each local backend and
checks the shape of the report (not the numbers: nothing here is timed). Running it against
a real logsvc cluster is covered in tests/e2e/test_tae_driver_logsvc.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tae_driver import bench


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_bench_prints_one_json_report(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--backend", backend, "--window", "4", "--entry-bytes", "64", "--seconds", "0.1"]
    argv += ["--clients", "50", "--dir", str(tmp_path / "wal")]
    assert bench.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == backend
    assert report["window"] == 4
    assert report["entries"] > 0
    assert report["latency_ms_p50"] <= report["latency_ms_p99"] <= report["latency_ms_max"]
    assert ("fsyncs" in report) == (backend == "file")


def test_the_logsvc_backend_refuses_a_bad_shard() -> None:
    with pytest.raises(SystemExit) as raised:
        bench.main(["--backend", "logsvc", "--shard", "0"])
    assert raised.value.code == 2
