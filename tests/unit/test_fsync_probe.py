"""`python -m logsvc.bench.fsync_probe` (zero-ahead's evidence) measures the three kinds of
write in one interleaved run, prints one JSON line each, leaves no file behind, and refuses
bad arguments with one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from logsvc.bench import fsync_probe


def test_probe_measures_every_kind_and_removes_its_files(tmp_path: Path) -> None:
    lines = fsync_probe.probe(str(tmp_path), rounds=20, record_bytes=100)
    assert [line["kind"] for line in lines] == list(fsync_probe.KINDS)
    for line in lines:
        assert line["rounds"] == 20
        p10, p50, p90 = line["p10_us"], line["p50_us"], line["p90_us"]
        assert isinstance(p10, int) and isinstance(p50, int) and isinstance(p90, int)
        assert 0 <= p10 <= p50 <= p90
    assert os.listdir(tmp_path) == []


def test_cli_prints_json_lines(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "logsvc.bench.fsync_probe", "--dir", str(tmp_path), "--rounds", "5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["kind"] for line in done.stdout.splitlines()] == [
        "grow",
        "fallocate",
        "zeros",
    ]


@pytest.mark.parametrize(
    ("args", "named"),
    [(["--rounds", "0"], "--rounds"), (["--record-bytes", "x"], "--record-bytes")],
)
def test_bad_arguments_exit_2_naming_them(tmp_path: Path, args: list[str], named: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "logsvc.bench.fsync_probe", "--dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert named in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    assert fsync_probe.main(["--dir", str(tmp_path / "absent")]) == 2
