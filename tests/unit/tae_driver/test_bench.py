"""The benchmark entry point runs, prints one JSON object, and refuses the logsvc backend.

Runs `tae_driver.bench.main` in-process for a fraction of a second on each local backend and
checks the shape of the report (not the numbers: nothing here is timed); asks for the logsvc
backend and expects exit status 2 with a message.
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


def test_the_logsvc_backend_is_not_available_yet(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--backend", "logsvc", "--seconds", "0.1"]) == 2
    assert "not yet available" in capsys.readouterr().err
