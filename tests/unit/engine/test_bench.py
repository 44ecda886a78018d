"""`python -m engine.bench commit` runs end to end, briefly, in-process: one JSON line per
(system, writers, rows) with the documented fields and some commits, then a summary line.
Timings are never asserted (it is a benchmark); only shapes and that work happened."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from engine import bench

COMMON = {
    "bench",
    "system",
    "writers",
    "rows_per_txn",
    "seconds",
    "commits",
    "commits_per_s",
    "p50_ms",
    "p99_ms",
    "cpu_us_per_commit",
    "cpu_scope",
    "durable",
    "errors",
}
ENGINE_ONLY = {"wal_entries_per_record", "input"}


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_commit_bench_engine_and_sqlite_side_by_side(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["commit", "--wal", "memory,file", "--writers", "1,4", "--rows", "1"]
    argv += ["--seconds", "0.3", "--warmup", "0", "--dir", str(tmp_path)]
    assert bench.main(argv) == 0
    *measurements, last = _lines(capsys.readouterr().out)
    systems = ["engine-memory", "engine-file", "sqlite-full", "sqlite-normal"]
    assert [(m["system"], m["writers"]) for m in measurements] == [
        (s, w) for w in (1, 4) for s in systems
    ]
    for m in measurements:
        assert m.keys() >= COMMON, m
        assert m["rows_per_txn"] == 1
        assert m["commits"] > 0, m
        assert m["errors"] == 0, m
        assert m["p50_ms"] <= m["p99_ms"]
        if m["system"].startswith("engine-"):
            assert m.keys() >= ENGINE_ONLY, m
            assert m["wal_entries_per_record"] is None or m["wal_entries_per_record"] >= 1.0
        else:
            assert not m.keys() & ENGINE_ONLY, m
    assert last["summary"] is True
    assert last["measurements"] == len(measurements)
    assert [(c["writers"], c["rows_per_txn"]) for c in last["cases"]] == [(1, 1), (4, 1)]
    assert set(last["cases"][0]["vs_sqlite_full"]) == {"engine-memory", "engine-file"}
    assert list(tmp_path.iterdir()) == []  # every temporary directory removed


def test_ten_rows_per_txn_and_dict_input(tmp_path: Path) -> None:
    case = bench.Case(writers=2, rows=10, seconds=0.2, warmup=0.05, input="dicts")
    engine = asyncio.run(bench.measure_engine("memory", case, dir_path=str(tmp_path)))
    sqlite = bench.measure_sqlite("normal", case, dir_path=str(tmp_path))
    for result in (engine, sqlite):
        assert result["rows_per_txn"] == 10
        assert result["commits"] > 0
        assert result["rows_per_s"] == pytest.approx(result["commits_per_s"] * 10, rel=1e-3)
    assert engine["input"] == "dicts"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["commit", "--wal", "disk"],
        ["commit", "--sqlite", "off"],
        ["commit", "--writers", "0"],
        ["commit", "--writers", "a"],
        ["commit", "--rows", "100000"],
        ["commit", "--seconds", "0"],
        ["commit", "--wal", "none", "--sqlite", "none"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
