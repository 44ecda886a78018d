"""`python -m engine.bench distributed` runs end to end with tiny sizes: its own 3-node logsvc
dev-cluster, a TN pair and a cold-start TN as real processes, two compute nodes in the test's
process. Checks the JSON lines' shapes and that work happened and nothing acknowledged was
lost across the failover (every acknowledged key read back, once). Timings are never
asserted (it is a benchmark); the command stops every process it started by PID."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.bench import cli

pytestmark = pytest.mark.timeout(180)


def test_the_distributed_bench_measures_every_phase(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["distributed", "--writers", "4", "--seconds", "1", "--warmup", "0.2"]
    argv += ["--rows", "20000", "--load-batch-rows", "5000", "--probes", "20"]
    assert cli.main([*argv, "--dir", str(tmp_path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert all(line["bench"] == "distributed" for line in lines)
    *figures, summary = lines
    assert [f["figure"] for f in figures] == [
        "sqlite",
        "commits",
        "freshness",
        "failover",
        "read_back",
        "load",
        "cold_start",
        "cold_start",
    ]
    by: dict[str, dict[str, Any]] = {f["figure"]: f for f in figures}
    assert by["sqlite"]["system"] == "sqlite-full" and by["sqlite"]["writers"] == 8

    commits = by["commits"]
    assert commits["commits"] > 0 and commits["errors"] == 0, commits
    assert len(commits["commits_per_s_by_node"]) == 2
    assert commits["freshness_samples"] > 0 and commits["freshness_missing"] == 0, commits
    assert 0 <= commits["freshness_p50_ms"] <= commits["freshness_p99_ms"]

    freshness = by["freshness"]
    assert freshness["samples"] == 20 and freshness["missing"] == 0, freshness

    failover = by["failover"]
    assert failover["failover_s"] is not None and failover["failover_s"] > 0, failover
    assert failover["commits_before_kill"] > 0 and failover["commits_after_kill"] > 0

    read_back = by["read_back"]
    assert read_back["acknowledged"] > 0
    assert read_back["lost"] == 0 and read_back["duplicates"] == 0, read_back
    assert read_back["unexplained"] == 0, read_back

    assert by["load"]["rows"] == 20000 and by["load"]["seconds"] > 0
    as_answered, from_checkpoint = figures[-2:]
    for cold in (as_answered, from_checkpoint):
        assert cold["checkpoint_covers_load"] is True, cold
        assert cold["first_get_s"] > 0 and cold["range_rows"] == 10000, cold
    assert from_checkpoint["from_checkpoint_forced"] is True
    assert from_checkpoint["checkpoints_loaded"] == 1, from_checkpoint

    assert summary["summary"] is True
    for name in (
        "commits_per_s",
        "sqlite_full_commits_per_s",
        "vs_sqlite_full",
        "freshness_p99_ms",
        "freshness_under_load_p99_ms",
        "cold_start_s",
        "cold_start_checkpoint_s",
        "cold_start_tn_answer_s",
        "load_s",
        "failover_s",
    ):
        assert summary[name] is not None, name
    assert summary["lost"] == 0
    assert set(summary["met"]) <= {
        "vs_sqlite_full",
        "freshness_p99_ms",
        "freshness_under_load_p99_ms",
        "cold_start_s",
        "failover_s",
    }
