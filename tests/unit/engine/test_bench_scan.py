"""`python -m engine.bench scan` runs end to end, tiny, in-process: every system (the engine's
scan, `eng.sql`, DuckDB's tuple and Arrow point lookups) answers every query with the same
sums, then a summary line. Timings are never asserted (it is a benchmark)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.bench import cli


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_scan_bench_runs_every_system_with_the_same_answers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`engine.bench scan`, tiny: the engine's scan, eng.sql and DuckDB (both its point
    lookups: tuples and Arrow) each answer every query, the same sums."""
    argv = ["scan", "--rows", "20000", "--repeat", "1", "--lookups", "3", "--dir", str(tmp_path)]
    assert cli.main(argv) == 0
    *lines, last = _lines(capsys.readouterr().out)
    queries = {(line["query"], line["system"]) for line in lines if "query" in line}
    for system in ("engine", "engine_sql", "duckdb"):
        for query in ("point_lookup", "range_sum", "filter_sum", "group_by_sum"):
            assert (query, system) in queries
    assert ("point_lookup", "duckdb_arrow") in queries
    assert all(line.get("same_answer") is not False for line in lines)
    assert last["summary"] is True
    assert set(last["engine_sql_over_duckdb"]) == {
        "point",
        "range_sum",
        "filter_sum",
        "group_by_sum",
    }
    assert list(tmp_path.iterdir()) == []
