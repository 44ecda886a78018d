"""`python -m spark_jobs` on Spark as a user runs it (issue 23, target 5): with `--master`
the default `--engine auto` chooses Spark and says so, and Spark's logging is quiet: no log4j
banner, no "Setting default log level", no WARN lines, no pandas FutureWarning (before, a run
printed all of those). One new JVM (the quiet configuration applies when the driver JVM
starts, so the suite's shared session cannot show it); the one line left is the JVM's own
incubator-module notice, which Spark's launcher causes (spark_jobs/session.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs import output
from tests.unit.spark_jobs.logs import History, engine_history

RUN_S_MAX = 240
NOISE = ("log4j", "Setting default log level", "WARN", "FutureWarning", "setLogLevel")
JVM_NOTICE = "WARNING: Using incubator modules: jdk.incubator.vector"


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return engine_history(str(tmp_path_factory.mktemp("engine")), big_rows=20)


@pytest.mark.timeout(RUN_S_MAX + 60)
def test_a_spark_run_is_quiet_and_says_its_engine(history: History, tmp_path: Path) -> None:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    out = str(tmp_path / "out")
    argv = ["lsn_audit", "--file-wal", history.path, "--out", out, "--run-id", "q"]
    done = subprocess.run(
        [sys.executable, "-m", "spark_jobs", *argv, "--master", "local[1]"],
        env=env, capture_output=True, text=True, timeout=RUN_S_MAX, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "engine spark (auto: --master local[1]" in done.stderr
    lines = [line for line in done.stderr.splitlines() if line != JVM_NOTICE]
    noisy = [line for line in lines if any(n in line for n in NOISE)]
    assert noisy == [], done.stderr
    assert "lsn_audit: replica file shard 0: clean" in done.stdout
    manifest = output.read_manifest(os.path.join(out, "lsn_audit", "q"))
    assert manifest["engine"] == "spark" and manifest["spark_master"] == "local[1]"
