"""`python -m engine.bench commit` runs end to end, briefly, in-process: one JSON line per
(system, writers, rows) with the documented fields and some commits, then a summary line.
Timings are never asserted (it is a benchmark); only shapes and that work happened."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from engine.bench import cli, commit

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
ENGINE_ONLY = {"wal_entries_per_record", "input", "gc_collections"}


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_commit_bench_engine_and_sqlite_side_by_side(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["commit", "--wal", "memory,file", "--writers", "1,4", "--rows", "1"]
    argv += ["--seconds", "0.3", "--warmup", "0", "--dir", str(tmp_path)]
    assert cli.main(argv) == 0
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
            gens = m["gc_collections"]
            assert len(gens) == 3 and all(type(n) is int and n >= 0 for n in gens), m
        else:
            assert not m.keys() & ENGINE_ONLY, m
    assert last["summary"] is True
    assert last["measurements"] == len(measurements)
    assert [(c["writers"], c["rows_per_txn"]) for c in last["cases"]] == [(1, 1), (4, 1)]
    assert set(last["cases"][0]["vs_sqlite_full"]) == {"engine-memory", "engine-file"}
    assert list(tmp_path.iterdir()) == []  # every temporary directory removed


def test_ten_rows_per_txn_and_dict_input(tmp_path: Path) -> None:
    case = commit.Case(writers=2, rows=10, seconds=0.2, warmup=0.05, input="dicts")
    engine = asyncio.run(commit.measure_engine("memory", case, dir_path=str(tmp_path)))
    sqlite = commit.measure_sqlite("normal", case, dir_path=str(tmp_path))
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
        cli.main(argv)
    assert exc.value.code == 2


def test_a_preloaded_unmerged_table_is_measured_against_the_empty_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 21's flatness shape: the same case on an empty table and on one preloaded with
    random keys whose blocks all hold the writers' keys in their ranges; the summary gives
    the preloaded rate over the empty one, and each line its first/last window rates."""
    argv = ["commit", "--wal", "memory", "--sqlite", "none", "--writers", "4", "--rows", "1"]
    argv += ["--seconds", "0.6", "--warmup", "0", "--dir", str(tmp_path)]
    argv += ["--preload-rows", "0,30000", "--unmerged"]
    assert cli.main(argv) == 0
    empty, loaded, last = _lines(capsys.readouterr().out)
    assert (empty["preload_rows"], loaded["preload_rows"]) == (0, 30_000)
    assert empty["persisted_blocks"] == 0
    # 30,000 rows in 8,192-row blocks, unmerged: 4 blocks, every range over the writers'.
    assert loaded["persisted_blocks"] == 4
    assert loaded["blocks_whose_range_holds_a_writer_key"] == 4
    assert loaded["key_index_blocks"] == 4
    assert loaded["key_index_bytes"] == 30_000 * 8
    for line in (empty, loaded):
        assert line["write_conflicts"] == 0
        assert line["rate_window_s"] == 0 or line["rate_window_s"] is None
    (case_empty, case_loaded) = last["cases"]
    assert case_empty["vs_empty_table"] == {}
    assert set(case_loaded["vs_empty_table"]) == {"engine-memory"}
    assert case_loaded["write_conflicts"] == {"engine-memory": 0}


def test_window_rates_compare_the_first_and_last_windows() -> None:
    recorder = commit._Recorder(started=100.0)
    for second in range(9):
        for _ in range(10 if second < 3 else 5):
            recorder.returned(100.0 + second + 0.5)
    rates = recorder.window_rates(9.0)
    assert rates == {
        "rate_window_s": 3,
        "rate_first_window": 10.0,
        "rate_last_window": 5.0,
        "last_over_first": 0.5,
    }


def test_a_measurement_takes_its_percentiles_by_the_shared_rule() -> None:
    """logsvc/bench/measure.py's linear interpolation (issue 21: one rule for every
    benchmark): p50 of 1, 2, 3, 4 ms is 2.5 ms (nearest rank said 3), p99 3.97 ms."""
    recorder = commit._Recorder()
    recorder.latencies_ms.extend([4.0, 1.0, 3.0, 2.0])  # in the order commits returned
    case = commit.Case(writers=1, rows=1, seconds=1.0, warmup=0.0, input="arrow")
    line = commit._result("engine-memory", case, 1.0, recorder, 0.004, "process")
    assert (line["p50_ms"], line["p99_ms"], line["max_ms"]) == (2.5, 3.97, 4.0)
    assert line["cpu_us_per_commit"] == 1000.0
